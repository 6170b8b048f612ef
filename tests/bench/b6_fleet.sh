#!/usr/bin/env bash
# B6 fleet: routing to where the KV cache is, on a simulated fleet (8 role-both sims
# behind pdgw neutral with 1 and 2 gateway replicas, then 4 prefill + 4 decode sims
# behind pdgw vllm-nixl); the same multi-turn shared-prefix stream under each policy.
# The load client is b6_fleet.py. Runs the quick size unless FULL=1 (the figures in
# RESULTS.md are the full size).
# Usage: b6_fleet.sh [BIN_DIR]   env: FULL=1, PD_PROTOCOL (vllm-nixl)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
need /usr/bin/python3 "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
raise_nofile >/dev/null
echo "B6 load before: $(load_avg)"
size=--quick
[[ "${FULL:-0}" == 1 ]] && size=
csv=$RESULTS_DIR/b6_fleet.csv
ratios=$RESULTS_DIR/b6_fleet_ratios.csv
rm -f "$csv" "$ratios" "$RESULTS_DIR"/b6_fleet_*.png # a failed run leaves no stale figures
# The run's own output (load, per-policy lines, ratios) is kept in b6_fleet.txt.
RESULTS_DIR=$RESULTS_DIR /usr/bin/python3 "$BENCH_DIR/b6_fleet.py" "$BIN_DIR" $size 2>&1 |
    tee "$RESULTS_DIR/b6_fleet.txt"
rc=${PIPESTATUS[0]}
[[ -s "$csv" && -s "$ratios" ]] || { echo "B6: no results" >&2; exit 1; }
column -s, -t "$csv"

# One bar per (setup, gateways, policy); column 1 is the label.
awk -F, 'NR == 1 { print "label,ttft_p90_ms,hit_pct,req_per_s"; next }
    { printf "%s,%.1f,%.1f,%s\n", $1, $8 * 1000, $10 * 100, $9 }' "$csv" >"$BENCH_TMP/b6.csv"
plot_bars "$BENCH_TMP/b6.csv" "$RESULTS_DIR/b6_fleet_ttft.png" \
    'B6: TTFT p90 per setup and policy (lower is better)' 'ms' 1 2
plot_bars "$BENCH_TMP/b6.csv" "$RESULTS_DIR/b6_fleet_hit.png" \
    'B6: prefix-cache hit rate (engines; PD: prefill instances)' '%' 1 3
plot_bars "$BENCH_TMP/b6.csv" "$RESULTS_DIR/b6_fleet_rps.png" \
    'B6: throughput per setup and policy' 'requests/s' 1 4

summary_begin b6_fleet
while IFS=, read -r setup gateways baseline figure ratio op limit; do
    [[ "$setup" == setup ]] && continue
    check_target b6 "$setup ${gateways}gw precise/$baseline $figure" "$ratio" "$op" "$limit" x
done <"$ratios"
echo "machine: $(machine_line)"
exit $rc
