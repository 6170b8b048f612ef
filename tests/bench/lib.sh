# Shared helpers for the benchmark scripts (sourced, not run).
# Every process started with bench_start is killed on exit, however the script ends.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS_DIR=${RESULTS_DIR:-$BENCH_DIR/results}
BIN_DIR=${BIN_DIR:-$(cd "$BENCH_DIR/../.." && pwd)/build/bin}
mkdir -p "$RESULTS_DIR"
BENCH_TMP=$(mktemp -d /tmp/pdgw-bench.XXXXXX)
BENCH_PIDS=()

# proc_alive PID: true while PID runs (a zombie waiting to be reaped does not count).
proc_alive() {
    local line
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    line=${line##*) }
    [[ -n "$line" && "${line%% *}" != Z ]]
}

bench_cleanup() {
    local pid i alive
    trap - EXIT INT TERM
    for pid in "${BENCH_PIDS[@]:-}"; do
        [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
    done
    for ((i = 0; i < 40; i++)); do
        alive=0
        for pid in "${BENCH_PIDS[@]:-}"; do
            [[ -n "$pid" ]] && proc_alive "$pid" && alive=1
        done
        ((alive)) || break
        sleep 0.05
    done
    for pid in "${BENCH_PIDS[@]:-}"; do
        [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null || true
    done
    { wait; } 2>/dev/null || true
    rm -rf "$BENCH_TMP"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# free_port: prints a TCP port on 127.0.0.1 that was free a moment ago.
free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# bench_start NAME CMD...: starts CMD in the background, logging to $BENCH_TMP/NAME.log;
# sets LAST_PID.
bench_start() {
    local name=$1
    shift
    "$@" >"$BENCH_TMP/$name.log" 2>&1 &
    LAST_PID=$!
    BENCH_PIDS+=("$LAST_PID")
}

# wait_http PORT PATH [SECONDS]: polls until GET answers 200.
wait_http() {
    local port=$1 path=$2 limit=${3:-15} i
    for ((i = 0; i < limit * 20; i++)); do
        if curl -fs -o /dev/null "http://127.0.0.1:$port$path"; then
            return 0
        fi
        sleep 0.05
    done
    echo "bench: 127.0.0.1:$port$path did not come up" >&2
    return 1
}

# nginx_start WORKERS CONNECTIONS HTTP_BLOCKS [MAIN_LINES]: writes $BENCH_TMP/nginx/nginx.conf
# (what every benchmark's nginx shares, HTTP_BLOCKS inside http {}) and starts nginx; sets
# LAST_PID to its master.
nginx_start() {
    local workers=$1 conns=$2 blocks=$3 main=${4:-} d=$BENCH_TMP/nginx
    mkdir -p "$d"
    cat >"$d/nginx.conf" <<NGINX
worker_processes $workers;
$main
daemon off;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections $conns; }
http {
    access_log off;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
$blocks
}
NGINX
    bench_start nginx nginx -c "$d/nginx.conf" -p "$d" -e stderr
}

# nginx_proxy_block SIM_PORT LISTEN_PORT KEEPALIVE [LISTEN_OPTIONS] [LOCATION_LINES]: the
# baseline proxy every benchmark compares pdgw with: proxy_pass to the sim, HTTP/1.1 with
# upstream keep-alive, no buffering.
nginx_proxy_block() {
    cat <<BLOCK
    upstream sim { server 127.0.0.1:$1; keepalive $3; }
    server {
        listen 127.0.0.1:$2${4:+ $4};
        location / {
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            ${5:-}
        }
    }
BLOCK
}

# need TOOL...: fails with a clear message when a tool is missing.
need() {
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 || [[ -x "$t" ]] || {
            echo "bench: '$t' not found (run 'make bench', which installs the bench packages)" >&2
            exit 1
        }
    done
}

# machine_line: one line describing where the figures were taken.
machine_line() {
    echo "$(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r), load $(load_avg)"
}

# load_avg: the 1/5/15-minute load averages (the machine may be shared).
load_avg() {
    cut -d' ' -f1-3 /proc/loadavg
}

# raise_nofile [WANT]: lifts the soft fd limit to the hard one; prints the limit in force.
raise_nofile() {
    local want=${1:-0} hard
    hard=$(ulimit -Hn)
    if [[ "$hard" == unlimited ]]; then
        hard=1048576
    fi
    ulimit -n "$hard" 2>/dev/null || true
    if ((want > 0)) && [[ "$(ulimit -n)" != unlimited ]] && (($(ulimit -n) < want)); then
        ulimit -n "$want" 2>/dev/null || true
    fi
    ulimit -n
}

# proc_cpu_s PID...: utime + stime of the processes, in seconds (missing pids count 0).
proc_cpu_s() {
    local pid total=0 t
    for pid in "$@"; do
        t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + ${t:-0}))
    done
    awk -v t="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", t / hz }'
}

# check_target BENCH METRIC VALUE OP LIMIT UNIT: appends one row of the summary table
# to the file summary_begin named and prints it. OP is ge or le. VALUE "-" = not measured.
check_target() {
    local bench=$1 metric=$2 value=$3 op=$4 limit=$5 unit=$6 verdict
    if [[ -z "$value" || "$value" == - ]]; then
        verdict=n/a
        value=-
    else
        verdict=$(awk -v v="$value" -v l="$limit" -v op="$op" 'BEGIN {
            ok = (op == "ge") ? (v + 0 >= l + 0) : (v + 0 <= l + 0); print ok ? "met" : "MISSED" }')
    fi
    local sym=">="
    [[ "$op" == le ]] && sym="<="
    printf '| %-3s | %-46s | %12s %-8s | %-15s | %-7s | %-5s |\n' "${bench^^}" "$metric" "$value" \
        "$unit" "$sym $limit $unit" "$verdict" "$(load_avg | cut -d' ' -f1)" |
        tee -a "${BENCH_SUMMARY:-/dev/null}"
}

# info_row BENCH METRIC VALUE UNIT: a summary row without a target (context for the others).
info_row() {
    printf '| %-3s | %-46s | %12s %-8s | %-15s | %-7s | %-5s |\n' "${1^^}" "$2" "${3:--}" "$4" "(no target)" \
        info "$(load_avg | cut -d' ' -f1)" | tee -a "${BENCH_SUMMARY:-/dev/null}"
}

# summary_begin NAME: starts a fresh $RESULTS_DIR/NAME.summary for check_target rows.
summary_begin() {
    BENCH_SUMMARY=$RESULTS_DIR/$1.summary
    : >"$BENCH_SUMMARY"
}

# pct FILE P: P-th percentile (0..100) of the numbers in FILE (one per line).
pct() {
    sort -g "$1" | awk -v p="$2" '{ a[NR] = $1 } END {
        if (NR == 0) { print "-"; exit }
        i = int(p / 100 * (NR - 1) + 0.5) + 1; if (i > NR) i = NR; printf "%.3f", a[i] }'
}

# plot_bars CSV PNG TITLE YLABEL XCOL YCOL: bar chart of column YCOL labelled by XCOL.
plot_bars() {
    local csv=$1 png=$2 title=$3 ylabel=$4 xcol=$5 ycol=$6
    command -v gnuplot >/dev/null 2>&1 || return 0
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$png'
set datafile separator ','
set title '$title'
set ylabel '$ylabel'
set style fill solid 0.8
set boxwidth 0.6
set xtics rotate by -30
set yrange [0:*]
set rmargin 16
set grid ytics
set key off
plot '$csv' every ::1 using 0:$ycol:xtic($xcol) with boxes
GP
}
