#!/usr/bin/env bash
# B2 streams at scale: 1,000 / 5,000 / 10,000 concurrent SSE streams of 256 tokens
# through one pdgw. Reports pdgw RSS per stream (highest RSS while the streams are
# open minus RSS before, over the stream count), pdgw CPU seconds per 1,000 tokens
# relayed, and the per-token delay (sim emit stamp vs client receipt, same clock),
# measured against the sim directly (baseline) and through pdgw in the same run.
# pdgw is restarted for every level so that memory kept by an earlier level does
# not hide the cost of the next one. Its connect timeout is nginx's default (60 s, where
# pdgw's own default is 3 s): thousands of streams opened at once overflow the sim's accept
# queue, and a refused SYN is only retried after 1 s, then 3 s.
# pdgw holds two descriptors per stream (client + upstream): when the hard fd
# limit cannot hold a level, the level is still run and the shortfall is printed.
# Usage: b2_streams.sh [BIN_DIR]
# CPU per relayed token is also taken for nginx (proxy_buffering off, upstream keep-alive, the
# same number of worker processes) on the same streams at NGINX_LEVELS, measured from /proc
# around the run for both proxies so the two figures are taken the same way.
#   env: LEVELS ("1000 5000 10000"), TOKENS (256), TPOT_MS (100), WORKERS (2),
#        NGINX_LEVELS ("1000"; "" skips nginx)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
LEVELS=${LEVELS:-"1000 5000 10000"}
TOKENS=${TOKENS:-256}
TPOT_MS=${TPOT_MS:-100}
WORKERS=${WORKERS:-2}
NGINX_LEVELS=${NGINX_LEVELS-1000}
need curl "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim" "$BIN_DIR/sse-flood"
max_level=$(tr ' ' '\n' <<<"$LEVELS" | sort -n | tail -n 1)
nofile=$(raise_nofile $((2 * max_level + 256)))
echo "B2 fd limit $nofile (hard $(ulimit -Hn)); pdgw needs about $((2 * max_level + 64)) at $max_level streams"
sysctl -qw net.ipv4.ip_local_port_range="10000 65000" 2>/dev/null || true
sysctl -qw net.core.somaxconn=65535 2>/dev/null || true

sim_port=$(free_port)
kv_tokens=$(((TOKENS + 64) * max_level * 2))
bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" --emit-timestamps \
    --ttft-ms 0 --tpot-ms "$TPOT_MS" --max-batch $((max_level * 2)) --eos-period 0 \
    --kv-capacity-tokens "$kv_tokens" --record-capacity 0
sim_pid=$LAST_PID
wait_http "$sim_port" /health

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

nginx_pids=""
if [[ -n "$NGINX_LEVELS" ]] && command -v nginx >/dev/null 2>&1; then
    nginx_port=$(free_port)
    nginx_start "$WORKERS" $((2 * max_level + 256)) \
        "$(nginx_proxy_block "$sim_port" "$nginx_port" 1024 backlog=65535 'proxy_read_timeout 600s;')" \
        "worker_rlimit_nofile $nofile;"
    nginx_master=$LAST_PID
    wait_http "$nginx_port" /health
    nginx_pids="$nginx_master $(pgrep -P "$nginx_master" | tr '\n' ' ')"
fi
# proxy_cpu_per_1k PORT STREAMS PIDS: runs sse-flood through PORT and prints "cpu_s_per_1k tokens"
# with the CPU of PIDS taken from /proc around the run.
proxy_cpu_per_1k() {
    local port=$1 n=$2 pids=$3 c0 c1 out
    c0=$(proc_cpu_s $pids)
    out=$("$BIN_DIR/sse-flood" --port "$port" --streams "$n" --tokens "$TOKENS" \
        --timeout "$timeout_s" 2>/dev/null | grep '^RESULT' || true)
    c1=$(proc_cpu_s $pids)
    awk -v a="$c0" -v b="$c1" -v t="$(field tokens "$out")" \
        'BEGIN { if (t > 0) printf "%.4f %d\n", (b - a) / t * 1000, t; else print "- 0" }'
}

csv=$RESULTS_DIR/b2_streams.csv
echo "streams,completed,failed,peak_concurrent,rss_kib_per_stream,cpu_s_per_1k_tokens,relay_p50_us,relay_p99_us,direct_p50_us,direct_p99_us,added_p50_us,added_p99_us,load1" >"$csv"
timeout_s=$(((TOKENS * TPOT_MS * 3) / 1000 + 60))
summary_begin b2_streams
for n in $LEVELS; do
    pdgw_port=$(free_port)
    bench_start "pdgw-$n" "$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgw_port" --protocol neutral \
        --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --no-access-log \
        --request-timeout 600s --idle-timeout 120s --health-interval 30s \
        --max-connections-per-client 0 --connect-timeout 60s
    pdgw_pid=$LAST_PID
    wait_http "$pdgw_port" /ready
    direct=$("$BIN_DIR/sse-flood" --port "$sim_port" --streams "$n" --tokens "$TOKENS" \
        --timeout "$timeout_s" 2>"$BENCH_TMP/direct-$n.err" | grep '^RESULT' || true)
    via=$("$BIN_DIR/sse-flood" --port "$pdgw_port" --streams "$n" --tokens "$TOKENS" \
        --timeout "$timeout_s" --pid "$pdgw_pid" 2>"$BENCH_TMP/via-$n.err" | grep '^RESULT' || true)
    load1=$(load_avg | cut -d' ' -f1)
    if [[ -n "$nginx_pids" && " $NGINX_LEVELS " == *" $n "* ]]; then
        # Same streams through nginx and through pdgw (pdgw's CPU taken the same way).
        read -r ng_cpu ng_tok < <(proxy_cpu_per_1k "$nginx_port" "$n" "$nginx_pids")
        read -r pg_cpu pg_tok < <(proxy_cpu_per_1k "$pdgw_port" "$n" "$pdgw_pid")
        ratio=$(awk -v a="$pg_cpu" -v b="$ng_cpu" 'BEGIN { if (b + 0 > 0 && a != "-") printf "%.2f", a / b; else print "-" }')
        echo "B2 streams=$n CPU s per 1,000 tokens: pdgw $pg_cpu ($pg_tok tokens), nginx $ng_cpu ($ng_tok tokens): $ratio x"
        check_target b2 "$n streams: CPU per token pdgw/nginx" "$ratio" le 1.0 x
    fi
    kill "$pdgw_pid" 2>/dev/null || true
    wait "$pdgw_pid" 2>/dev/null || true
    if [[ -z "$via" || -z "$direct" ]]; then
        echo "B2 streams=$n: sse-flood gave no result" >&2
        cat "$BENCH_TMP/direct-$n.err" "$BENCH_TMP/via-$n.err" >&2
        continue
    fi
    completed=$(field completed "$via")
    failed=$(field failed "$via")
    peak=$(field peak_concurrent "$via")
    rss_per=$(awk -v a="$(field rss_peak_kib "$via")" -v b="$(field rss_base_kib "$via")" -v n="$n" \
        'BEGIN { printf "%.1f", (a - b) / n }')
    cpu_per=$(awk -v c="$(field cpu_s "$via")" -v t="$(field tokens "$via")" \
        'BEGIN { printf "%.4f", (t > 0 ? c / t * 1000 : 0) }')
    v50=$(field delay_p50_us "$via")
    v99=$(field delay_p99_us "$via")
    d50=$(field delay_p50_us "$direct")
    d99=$(field delay_p99_us "$direct")
    a50=$(awk -v a="$v50" -v b="$d50" 'BEGIN { printf "%.1f", a - b }')
    a99=$(awk -v a="$v99" -v b="$d99" 'BEGIN { printf "%.1f", a - b }')
    echo "$n,$completed,$failed,$peak,$rss_per,$cpu_per,$v50,$v99,$d50,$d99,$a50,$a99,$load1" >>"$csv"
    echo "B2 streams=$n completed=$completed failed=$failed peak=$peak rss/stream=${rss_per}KiB" \
        "cpu/1k tokens=${cpu_per}s delay via pdgw p50/p99=$v50/${v99}us direct p50/p99=$d50/${d99}us" \
        "(direct completed $(field completed "$direct")/$n) load $load1"
    sed 's/^/  via pdgw: /' "$BENCH_TMP/via-$n.err"
    if [[ "$failed" != 0 ]]; then
        echo "  pdgw log (last lines):"
        tail -n 5 "$BENCH_TMP/pdgw-$n.log" | sed 's/^/    /'
    fi
    info_row b2 "$n streams: pdgw CPU s per 1,000 tokens" "$cpu_per" s
    info_row b2 "$n streams: relay delay p50 via pdgw / direct" "$(awk -v a="$v50" -v b="$d50" 'BEGIN { printf "%.2f/%.2f", a / 1000, b / 1000 }')" ms
    # Targets (issue "Gateway core v2"): every stream the descriptor limit allows held (two
    # descriptors per stream plus a small reserve), <= 16 KiB RSS per stream, relay p99 added
    # over direct <= 5 ms at 1,000 streams.
    if [[ "$n" == 1000 ]]; then
        check_target b2 "relay p99 added over direct at 1000" \
            "$(awk -v a="$a99" 'BEGIN { printf "%.3f", a / 1000 }')" le 5 ms
    fi
    if [[ "$n" == "$max_level" ]]; then
        allowed=$(((nofile - 100) / 2))
        ((allowed > n)) && allowed=$n
        check_target b2 "$n streams held through pdgw (fd limit allows $allowed)" "$completed" ge "$allowed" streams
        check_target b2 "RSS per stream at $n" "$rss_per" le 16 KiB
        info_row b2 "relay delay p99 at $n (via pdgw, absolute)" \
            "$(awk -v a="$v99" 'BEGIN { printf "%.3f", a / 1000 }')" ms
        info_row b2 "relay delay p99 added over direct at $n" \
            "$(awk -v a="$a99" 'BEGIN { printf "%.3f", a / 1000 }')" ms
    fi
done
if command -v gnuplot >/dev/null 2>&1 && (($(wc -l <"$csv") > 1)); then
    gnuplot <<GP
set terminal pngcairo size 1200,500 noenhanced
set output '$RESULTS_DIR/b2_streams.png'
set datafile separator ','
set multiplot layout 1,2 title 'B2: concurrent SSE streams of $TOKENS tokens, one every $TPOT_MS ms, through one pdgw'
set style fill solid 0.8
set grid ytics
set xlabel 'concurrent streams'
set title 'pdgw RSS per stream'
set ylabel 'KiB'
set boxwidth 0.5
set yrange [0:*]
plot '$csv' every ::1 using 0:5:xtic(1) with boxes notitle
set title 'per-token delay, sim emit -> client receive'
set ylabel 'ms'
set logscale y
set yrange [*:*]
set style data histograms
set style histogram clustered gap 1
set key top left
plot '$csv' every ::1 using (\$7/1000):xtic(1) title 'p50 via pdgw', '' every ::1 using (\$8/1000) title 'p99 via pdgw', \
     '' every ::1 using (\$9/1000) title 'p50 direct', '' every ::1 using (\$10/1000) title 'p99 direct'
unset multiplot
GP
fi
echo "machine: $(machine_line)"
