#!/usr/bin/env bash
# B2 streams at scale: 1,000 / 5,000 / 10,000 concurrent SSE streams of 256 tokens
# through one pdgw. Reports pdgw RSS per stream, CPU seconds per 1,000 tokens
# relayed and the per-token relay delay (sim emit stamp vs client receipt, same
# clock), with the same measurement taken directly against the sim as baseline.
# Usage: b2_streams.sh [BIN_DIR]   env: LEVELS ("1000 5000 10000"), TOKENS (256), TPOT_MS (100)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
LEVELS=${LEVELS:-"1000 5000 10000"}
TOKENS=${TOKENS:-256}
TPOT_MS=${TPOT_MS:-100}
WORKERS=${WORKERS:-2}
need "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim" "$BIN_DIR/sse-flood"
ulimit -n 200000 || ulimit -n 65536
sysctl -qw net.ipv4.ip_local_port_range="10000 65000" 2>/dev/null || true
sysctl -qw net.core.somaxconn=65535 2>/dev/null || true

sim_port=$(free_port)
pdgw_port=$(free_port)
bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" --emit-timestamps \
    --ttft-ms 0 --tpot-ms "$TPOT_MS" --max-batch 100000 --kv-capacity-tokens 100000000
sim_pid=$LAST_PID
wait_http "$sim_port" /health
bench_start pdgw "$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgw_port" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --access-log false \
    --request-timeout 600s --idle-timeout 120s
pdgw_pid=$LAST_PID
wait_http "$pdgw_port" /ready

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

csv=$RESULTS_DIR/b2_streams.csv
echo "streams,completed,peak_concurrent,rss_kib_per_stream,cpu_s_per_1k_tokens,relay_p50_us,relay_p99_us,direct_p50_us,direct_p99_us" >"$csv"
timeout_s=$(((TOKENS * TPOT_MS) / 1000 + 120))
for n in $LEVELS; do
    direct=$("$BIN_DIR/sse-flood" --port "$sim_port" --streams "$n" --tokens "$TOKENS" \
        --timeout "$timeout_s" | grep '^RESULT' || true)
    via=$("$BIN_DIR/sse-flood" --port "$pdgw_port" --streams "$n" --tokens "$TOKENS" \
        --timeout "$timeout_s" --pid "$pdgw_pid" | grep '^RESULT' || true)
    completed=$(field completed "$via")
    peak=$(field peak_concurrent "$via")
    rss_per=$(awk -v a="$(field rss_peak_kib "$via")" -v b="$(field rss_base_kib "$via")" -v n="$n" \
        'BEGIN { printf "%.1f", (a - b) / n }')
    cpu_per=$(awk -v c="$(field cpu_s "$via")" -v t="$(field tokens "$via")" \
        'BEGIN { printf "%.4f", t > 0 ? c / t * 1000 : 0 }')
    line="$n,$completed,$peak,$rss_per,$cpu_per,$(field delay_p50_us "$via"),$(field delay_p99_us "$via"),$(field delay_p50_us "$direct"),$(field delay_p99_us "$direct")"
    echo "$line" >>"$csv"
    echo "B2 streams=$n completed=$completed peak=$peak rss/stream=${rss_per}KiB cpu/1k tok=${cpu_per}s relay p50/p99=$(field delay_p50_us "$via")/$(field delay_p99_us "$via")us direct p50/p99=$(field delay_p50_us "$direct")/$(field delay_p99_us "$direct")us"
done
plot_bars "$csv" "$RESULTS_DIR/b2_streams.png" "B2: pdgw RSS per SSE stream" "KiB per stream" 1 4
echo "machine: $(machine_line)" | tee "$RESULTS_DIR/b2_streams.summary"
