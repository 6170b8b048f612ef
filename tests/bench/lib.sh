# Shared helpers for the benchmark scripts (sourced, not run).
# Every process started with bench_start is killed on exit, however the script ends.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS_DIR=${RESULTS_DIR:-$BENCH_DIR/results}
BIN_DIR=${BIN_DIR:-$(cd "$BENCH_DIR/../.." && pwd)/build/bin}
mkdir -p "$RESULTS_DIR"
BENCH_TMP=$(mktemp -d /tmp/pdgw-bench.XXXXXX)
BENCH_PIDS=()

bench_cleanup() {
    local pid
    for pid in "${BENCH_PIDS[@]:-}"; do
        [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
    done
    sleep 0.2
    for pid in "${BENCH_PIDS[@]:-}"; do
        [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$BENCH_TMP"
}
trap bench_cleanup EXIT INT TERM

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
    echo "$(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r)"
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
set grid ytics
set key off
plot '$csv' every ::1 using 0:$ycol:xtic($xcol) with boxes
GP
}
