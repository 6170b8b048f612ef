#!/usr/bin/env bash
# B9 tokenizer: tokens per CPU-second (one core) of pdgw's in-process tokenizer (libpdtok,
# through tok-bench) against the JavaScript reference (@lenml/tokenizers in Node) on the same
# generated long prose and code prompts, four vocabularies, in the same run. The driver is
# b9_tokenizer.py; the reference packages come from npm (tests/integration/tokenizer/npm_refs.py).
# Usage: b9_tokenizer.sh [BIN_DIR]
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
need /usr/bin/python3 "$BIN_DIR/tok-bench"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "SKIP b9_tokenizer: node/npm not found (the reference tokenizer runs in Node)"
    exit 0
fi
csv=$RESULTS_DIR/b9_tokenizer.csv
rm -f "$csv" "$RESULTS_DIR/b9_tokenizer.png"
rc=0
/usr/bin/python3 "$BENCH_DIR/b9_tokenizer.py" "$BIN_DIR" "$RESULTS_DIR" "$BENCH_TMP" || rc=$?
((rc == 77)) && exit 0 # the driver printed one SKIP line: npm or its registry is not there
((rc == 0)) && [[ -s "$csv" ]] || { echo "B9: no results (exit $rc)" >&2; exit 1; }
column -s, -t "$csv"

if command -v gnuplot >/dev/null 2>&1; then
    awk -F, 'NR > 1 && $3 == "cold" { print $1 " " $2 "," $8 }' "$csv" >"$BENCH_TMP/cold.csv"
    awk -F, 'NR > 1 && $3 == "warm" { print $1 " " $2 "," $8 }' "$csv" >"$BENCH_TMP/warm.csv"
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$RESULTS_DIR/b9_tokenizer.png'
set datafile separator ','
set title 'B9: pdgw tokens per CPU-second / JavaScript reference (target 5x)'
set ylabel 'ratio (median of rounds)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set xtics rotate by -30
set yrange [0:*]
set grid ytics
set key below
plot '$BENCH_TMP/cold.csv' using 2:xtic(1) title 'cold word cache, unseen prompts', \
     '$BENCH_TMP/warm.csv' using 2 title 'warm word cache, same prompts', \
     5 with lines dashtype 2 lc rgb 'black' title 'target'
GP
fi

# Columns: vocab 1, kind 2, cache 3, pdgw tok/CPU-s 6, ratio 8. The target is on the cold
# pass (new prompts, empty cache): a warm cache flatters whichever side caches more.
summary_begin b9_tokenizer
while IFS=, read -r vocab kind cache _ _ pdgw _ ratio _; do
    if [[ "$cache" == cold ]]; then
        check_target b9 "pdgw/JS tok/CPU-s, $vocab $kind, cold" "$ratio" ge 5 x
    fi
done < <(tail -n +2 "$csv")
for kind in prose code; do
    info_row b9 "lowest pdgw/JS, $kind, warm cache" \
        "$(awk -F, -v k="$kind" 'NR > 1 && $2 == k && $3 == "warm" { print $8 }' "$csv" |
            sort -g | head -n 1)" x
    info_row b9 "lowest pdgw tokens/CPU-s, $kind, cold cache" \
        "$(awk -F, -v k="$kind" 'NR > 1 && $2 == k && $3 == "cold" { print $6 }' "$csv" |
            sort -g | head -n 1)" tok/s
done
