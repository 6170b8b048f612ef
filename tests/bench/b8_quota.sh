#!/usr/bin/env bash
# B8 tenants: pdgw's CPU and latency per request with Redis-backed tenant budgets against the
# same gateway without them (same run, alternating slices), and the tokens each of two
# tenants of weights 1:3 is served under backlog (plotted over time). The client is
# b8_quota.py. Needs redis-server (Debian's redis-server package; `make bench` installs it).
# Usage: b8_quota.sh [BIN_DIR]
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
need /usr/bin/python3 "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
if ! command -v redis-server >/dev/null 2>&1; then
    echo "SKIP b8_quota: redis-server is not installed (apt-get install redis-server)"
    exit 0
fi
raise_nofile >/dev/null
echo "B8 load before: $(load_avg)"
csv=$RESULTS_DIR/b8_quota.csv
fair=$RESULTS_DIR/b8_quota_fair.csv
rm -f "$csv" "$fair" "$RESULTS_DIR/b8_quota_fair.png"
/usr/bin/python3 "$BENCH_DIR/b8_quota.py" "$BIN_DIR" "$RESULTS_DIR" 2>&1 |
    tee "$RESULTS_DIR/b8_quota.txt"
[[ -s "$csv" && -s "$fair" ]] || { echo "B8: no results" >&2; exit 1; }
column -s, -t "$csv"

if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$RESULTS_DIR/b8_quota_fair.png'
set datafile separator ','
set title 'B8: tokens served per second, tenants of weight 1 and 3 both flooding (2 slots)'
set xlabel 'second of the run'
set ylabel 'tokens per second'
set yrange [0:*]
set grid
set key top left
plot '$fair' using 1:2 with linespoints title 'light (weight 1)', \
     '$fair' using 1:3 with linespoints title 'heavy (weight 3)'
GP
fi

# Columns: concurrency 1 (1, 16 closed loop; 16r fixed rate), cpu_ratio 6, p50_added_us 9.
summary_begin b8_quota
col() { awk -F, -v c="$1" -v k="$2" 'NR > 1 && $1 == c { print $k }' "$csv"; }
# Targets at one connection and at 16 below saturation ("16r", fixed rate); the closed loop
# at 16 saturates both cores, where a CPU difference shows as queueing: reported, not judged.
for c in 1 16r; do
    check_target b8 "CPU/request with tenants+Redis, c=$c (x off)" "$(col "$c" 6)" le 1.05 x
    check_target b8 "added p50 with tenants+Redis, c=$c" "$(col "$c" 9)" le 50 us
done
info_row b8 "CPU/request with tenants+Redis, c=16 closed loop (x off)" "$(col 16 6)" x
info_row b8 "added p50 with tenants+Redis, c=16 closed loop" "$(col 16 9)" us
info_row b8 "weight-3 tenant's share of tokens (1:3)" "$(cat "$RESULTS_DIR/b8_quota_share.txt")" share
