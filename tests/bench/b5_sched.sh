#!/usr/bin/env bash
# B5 scheduler: median and p99 of one decode pick (choice + booking) per policy at
# 10 / 100 / 1,000 / 10,000 instances (sched-pick), one prefill pick (least-load against
# slo's queue replay) at 10 / 100 / 1,000 instances with 4 open prefill legs each, one PD
# booking (both legs; slo weighs its best prefills with the decodes' pair handoffs) at 10 /
# 100 / 1,000 instances per role, plus the prefix-aware match of a 4,096-token prompt.
# Usage: b5_sched.sh [BIN_DIR]   env: QUICK=1 (fewer iterations per point)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
need "$BIN_DIR/sched-pick"
args=()
[[ "${QUICK:-0}" == 1 ]] && args+=(--quick)

echo "B5 load before: $(load_avg)"
out=$("$BIN_DIR/sched-pick" "${args[@]}")
echo "$out"
load1=$(load_avg | cut -d' ' -f1)

csv=$RESULTS_DIR/b5_sched.csv
echo "policy,instances,median_us,p99_us,load1" >"$csv"
awk -v l="$load1" '/^one prefill pick/ || /^prefix-aware match/ { exit }
    NF == 4 && $2 ~ /^[0-9]+$/ { printf "%s,%s,%s,%s,%s\n", $1, $2, $3, $4, l }' <<<"$out" >>"$csv"
pf_csv=$RESULTS_DIR/b5_prefill_pick.csv
echo "policy,instances,median_us,p99_us,load1" >"$pf_csv"
awk -v l="$load1" '/^one PD booking/ || /^prefix-aware match/ { exit }
    f && NF == 4 && $2 ~ /^[0-9]+$/ { printf "%s,%s,%s,%s,%s\n", $1, $2, $3, $4, l }
    /^one prefill pick/ { f = 1 }' <<<"$out" >>"$pf_csv"
pd_csv=$RESULTS_DIR/b5_pd_pick.csv
echo "policy,instances_per_role,median_us,p99_us,load1" >"$pd_csv"
awk -v l="$load1" '/^prefix-aware match/ { exit }
    f && NF == 4 && $2 ~ /^[0-9]+$/ { printf "%s,%s,%s,%s,%s\n", $1, $2, $3, $4, l }
    /^one PD booking/ { f = 1 }' <<<"$out" >>"$pd_csv"
match_csv=$RESULTS_DIR/b5_prefix_match.csv
echo "case,blocks,median_us,p99_us,load1" >"$match_csv"
awk -v l="$load1" 'f && NF == 4 && $2 ~ /^[0-9]+$/ { printf "%s,%s,%s,%s,%s\n", $1, $2, $3, $4, l }
    /^prefix-aware match/ { f = 1 }' <<<"$out" >>"$match_csv"

if command -v gnuplot >/dev/null 2>&1; then
    policies=$(awk -F, 'NR > 1 { print $1 }' "$csv" | awk '!seen[$0]++' | tr '\n' ' ')
    plot=""
    for p in $policies; do
        awk -F, -v p="$p" '$1 == p { print $2, $3 }' "$csv" >"$BENCH_TMP/b5-$p.dat"
        plot+="'$BENCH_TMP/b5-$p.dat' using 1:2 with linespoints title '$p', "
    done
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$RESULTS_DIR/b5_sched.png'
set title 'B5: one decode pick (choice + booking), median'
set xlabel 'instances'
set ylabel 'microseconds'
set logscale xy
set grid
set key top left
plot ${plot%, }
GP
fi

summary_begin b5_sched
worst=$(awk -F, '$2 == 1000 && $3 + 0 > m { m = $3 + 0; p = $1 } END { printf "%s %.2f", p, m }' "$csv")
check_target b5 "slowest policy median at 1000 inst (${worst% *})" "${worst#* }" le 5 us
pf_slo=$(awk -F, '$1 == "slo" && $2 == 1000 { print $3 }' "$pf_csv")
pf_ll=$(awk -F, '$1 == "least-load" && $2 == 1000 { print $3 }' "$pf_csv")
check_target b5 "slo prefill pick (queue replay) median at 1000 inst" "$pf_slo" le 5 us
info_row b5 "least-load prefill pick median at 1000 inst" "$pf_ll" us
pd_slo=$(awk -F, '$1 == "slo" && $2 == 1000 { print $3 }' "$pd_csv")
pd_ll=$(awk -F, '$1 == "least-load" && $2 == 1000 { print $3 }' "$pd_csv")
info_row b5 "slo PD booking (pair weighed) median at 1000 per role" "$pd_slo" us
info_row b5 "least-load PD booking median at 1000 per role" "$pd_ll" us
full=$(awk -F, '$1 == "full-hit" { print $3 }' "$match_csv")
check_target b5 "prefix-aware match, 4096-token prompt (full hit)" "$full" le 5 us
echo "machine: $(machine_line)"
