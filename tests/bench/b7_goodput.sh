#!/usr/bin/env bash
# B7 goodput under SLO: a heterogeneous PD fleet (4 prefill sims of speeds 1, 1, 0.6, 0.6;
# 4 decode sims of 16k..2k KV tokens) behind pdgw vllm-nixl; ShareGPT-like lengths, Poisson
# arrivals with bursts, a rate sweep around the measured capacity, the same stream under
# round-robin, least-load, precise-prefix and slo (slo_policy reject). The load client is
# b7_goodput.py. Runs the quick size unless FULL=1.
# Usage: b7_goodput.sh [BIN_DIR]   env: FULL=1, B7_FULL_POINT=0 (no full-size 1.2x point beside
# the quick sweep)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
need /usr/bin/python3 "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
raise_nofile >/dev/null
echo "B7 load before: $(load_avg)"
size=--quick
[[ "${FULL:-0}" == 1 ]] && size=
csv=$RESULTS_DIR/b7_goodput.csv
rm -f "$csv" "$RESULTS_DIR"/b7_goodput_*.png # a failed run leaves no stale figures
RESULTS_DIR=$RESULTS_DIR /usr/bin/python3 "$BENCH_DIR/b7_goodput.py" "$BIN_DIR" $size 2>&1 |
    tee "$RESULTS_DIR/b7_goodput.txt"
rc=${PIPESTATUS[0]}
[[ -s "$csv" ]] || { echo "B7: no results" >&2; exit 1; }
column -s, -t "$csv"

# The targets are at 1.2x capacity, where a queue needs time to build: beside the quick sweep
# (10 s per rate) one full-size point, 30 s of arrivals at 1.2x C (B7_FULL_POINT=0: not).
full=$RESULTS_DIR/b7_goodput_full_1.2x.csv
if [[ "$size" == --quick && "${B7_FULL_POINT:-1}" != 0 ]]; then
    rm -f "$full"
    B7_RATES=1.2 B7_CSV=$(basename "$full") RESULTS_DIR=$RESULTS_DIR \
        /usr/bin/python3 "$BENCH_DIR/b7_goodput.py" "$BIN_DIR" 2>&1 |
        tee "$RESULTS_DIR/b7_goodput_full_1.2x.txt"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
    [[ -s "$full" ]] && column -s, -t "$full"
fi
[[ -s "$full" ]] || full=$csv

# One line per policy against the offered rate (x capacity). Columns of the CSV: policy 1,
# rate_x 2, attainment 6, goodput 7, ttft_p90 9, refused_pct 12, preemptions 14.
plot_lines() {
    local png=$1 title=$2 ylabel=$3 col=$4 scale=$5
    command -v gnuplot >/dev/null 2>&1 || return 0
    local plots="" p
    for p in round-robin least-load precise-prefix slo; do
        awk -F, -v p="$p" 'NR > 1 && $1 == p' "$csv" >"$BENCH_TMP/b7_$p.csv"
        plots+="${plots:+, }'$BENCH_TMP/b7_$p.csv' using 2:(\$$col*$scale) with linespoints title '$p'"
    done
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$png'
set datafile separator ','
set title '$title'
set xlabel 'offered rate (x measured capacity)'
set ylabel '$ylabel'
set yrange [0:*]
set grid
set key top left
plot $plots
GP
}
plot_lines "$RESULTS_DIR/b7_goodput_goodput.png" 'B7: goodput (requests/s meeting both SLOs)' \
    'requests/s' 7 1
plot_lines "$RESULTS_DIR/b7_goodput_attainment.png" 'B7: SLO attainment (of offered requests)' \
    '%' 6 100
plot_lines "$RESULTS_DIR/b7_goodput_ttft.png" 'B7: TTFT p90 of served requests' 'ms' 9 1000
plot_lines "$RESULTS_DIR/b7_goodput_preemptions.png" 'B7: decode preemptions per run' \
    'preemptions' 14 1

# Summary rows: the issue's targets at 1.2x capacity (slo's goodput against the best other
# policy's, the share of slo's admitted requests meeting both targets, its prefill prediction's
# median relative error), then each policy's goodput and preemptions at 1.2x and 1.5x.
summary_begin b7_goodput
at() { awk -F, -v p="$1" -v r="$2" -v c="$3" 'NR > 1 && $1 == p && $2 == r { print $c }' "${4:-$csv}"; }
# the target rows read the full-size 1.2x point when it ran
best_other=$(awk -F, 'NR > 1 && $1 != "slo" && $2 == 1.2 && $7 > b { b = $7 } END { print b + 0 }' "$full")
slo_good=$(at slo 1.2 7 "$full")
ratio=-
[[ -n "$slo_good" ]] && awk -v b="$best_other" 'BEGIN { exit !(b > 0) }' &&
    ratio=$(awk -v s="$slo_good" -v b="$best_other" 'BEGIN { printf "%.2f", s / b }')
check_target b7 "slo goodput / best other's at 1.2x C" "$ratio" ge 1.5 x
admitted=$(awk -F, 'NR > 1 && $1 == "slo" && $2 == 1.2 && $12 < 100 {
    printf "%.1f", 100 * $6 / (1 - $12 / 100) }' "$full")
check_target b7 "slo admitted meeting both SLOs at 1.2x C" "$admitted" ge 90 %
check_target b7 "slo prefill prediction median rel. err, 1.2x" "$(at slo 1.2 16 "$full")" le 0.20 ""
[[ "$full" != "$csv" ]] && for p in round-robin least-load precise-prefix slo; do
    info_row b7 "$p goodput at 1.2x C, 30 s" "$(at "$p" 1.2 7 "$full")" req/s
done
for r in 1.2 1.5; do
    for p in round-robin least-load precise-prefix slo; do
        info_row b7 "$p goodput at ${r}x C" "$(at "$p" "$r" 7)" req/s
    done
done
for p in round-robin least-load slo; do
    info_row b7 "$p decode preemptions at 1.5x C" "$(at "$p" 1.5 14)" ""
done
# slo+pd (B7_POLICIES=...,slo+pd): selective PD by prediction beside slo alone
if [[ -n "$(at slo+pd 1.2 7)" ]]; then
    for r in 1.2 1.5; do
        info_row b7 "slo+pd goodput at ${r}x C" "$(at slo+pd "$r" 7)" req/s
        info_row b7 "slo+pd TTFT p90 at ${r}x C (slo: $(at slo "$r" 9))" "$(at slo+pd "$r" 9)" s
        info_row b7 "slo+pd decode-only share at ${r}x C" "$(at slo+pd "$r" 19)" %
    done
fi
echo "machine: $(machine_line)"
exit $rc
