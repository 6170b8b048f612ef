#!/usr/bin/env bash
# B3 PD overhead: for every PD protocol this pdgw has, 1 prefill + 1 decode
# pdgw-sim (--zero-delay) behind pdgw; the time pdgw adds per request (client total
# minus the engine time of both legs, minus the same client's overhead measured
# directly against a sim), p50/p99 at 1 and 64 concurrent clients. `neutral`
# through pdgw is the single-leg reference row. Protocols this pdgw does not have
# are skipped with one SKIP line. The load client is b3_pd.py.
# Usage: b3_pd.sh [BIN_DIR]   env: DURATION (s per point, default 4), ROUNDS (the one-client
#   point in that many slices, each after a slice of the direct baseline; 4), CONCURRENCY ("1 64"),
#   ROWS (only these rows, e.g. "neutral lmcache"; default all), RATE (req/s: one more point
#   per row, the most clients offering that fixed rate; b3_pd_rate.csv; default 600, below
#   every row's closed-loop rate here; 0 skips it), PROMPT_WORDS (a long prompt of that many
#   words), MAX_TOKENS (answer length, 16): long-prompt runs compare pdgw's CPU per request
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
need /usr/bin/python3 "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
raise_nofile >/dev/null
echo "B3 load before: $(load_avg)"
rm -f "$RESULTS_DIR/b3_pd_rate.csv"
DURATION=${DURATION:-4} RATE=${RATE-600} /usr/bin/python3 "$BENCH_DIR/b3_pd.py" "$BIN_DIR" "$RESULTS_DIR"
csv=$RESULTS_DIR/b3_pd.csv
[[ -s "$csv" ]] || { echo "B3: no results" >&2; exit 1; }
column -s, -t "$csv"

if command -v gnuplot >/dev/null 2>&1; then
    awk -F, 'NR > 1 { v[$1, $2] = $6 / 1000; if (!($1 in seen)) { seen[$1] = 1; o[++n] = $1 } }
        END { for (i = 1; i <= n; i++) { p = o[i]; printf "%s %s %s\n", p,
            (((p, 1) in v) ? v[p, 1] : "NaN"), (((p, 64) in v) ? v[p, 64] : "NaN") } }' "$csv" \
        >"$BENCH_TMP/b3.dat"
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$RESULTS_DIR/b3_pd.png'
set title 'B3: time pdgw adds per request at 1P1D (sim zero-delay), p50'
set ylabel 'ms (log scale; values <= 0 not drawn)'
set logscale y
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set xtics rotate by -30
set grid ytics
set key top left
plot '$BENCH_TMP/b3.dat' using 2:xtic(1) title '1 client', '' using 3 title '64 clients'
GP
fi

# Targets (issue "Gateway core v2"): <= 0.3 ms added p50 at one client for every protocol;
# at 64 clients lmcache (its FIFO admission gate) within 2 x the slowest of the others.
summary_begin b3_pd
others64=0
while IFS=, read -r proto clients _ _ _ a50 _ _ _ _ _ _ _ cpu _ ecpu; do
    [[ "$proto" == protocol ]] && continue
    ms=$(awk -v a="$a50" 'BEGIN { printf "%.3f", a / 1000 }')
    info_row b3 "$proto c=$clients pdgw CPU per request" "$cpu" us
    [[ -n "$ecpu" ]] && info_row b3 "$proto c=$clients engines CPU per request" "$ecpu" us
    if [[ "$clients" == 1 && "$proto" == lmcache/tokenize* ]]; then
        # LMCache's own proxy flow (a /tokenize call first), beside the default: for comparison
        info_row b3 "$proto c=1 added p50" "$ms" ms
    elif [[ "$clients" == 1 ]]; then
        check_target b3 "$proto c=1 added p50" "$ms" le 0.3 ms
    else
        info_row b3 "$proto c=$clients added p50" "$ms" ms
        [[ "$proto" != lmcache* ]] && others64=$(awk -v a="$ms" -v b="$others64" 'BEGIN { print (a > b ? a : b) }')
    fi
done <"$csv"
# A real vocabulary on the engines: pdgw's own ids (tokenizers) against LMCache's /tokenize call.
read -r tok1 loc1 < <(awk -F, '$2 == 1 && $1 == "lmcache/tokenize-qwen3" { t = $6 }
    $2 == 1 && $1 == "lmcache/local-qwen3" { l = $6 } END { printf "%s %s\n", t, l }' "$csv")
if [[ -n "$tok1" && -n "$loc1" ]] && awk -v b="$tok1" 'BEGIN { exit !(b > 0) }'; then
    check_target b3 "lmcache c=1 added p50, pdgw's tokenizer / engine's /tokenize" \
        "$(awk -v a="$loc1" -v b="$tok1" 'BEGIN { printf "%.2f", a / b }')" le 1.0 x
fi
lm64=$(awk -F, '$1 == "lmcache" && $2 != 1 { printf "%.3f", $6 / 1000 }' "$csv")
if [[ -n "$lm64" ]] && awk -v b="$others64" 'BEGIN { exit !(b > 0) }'; then
    check_target b3 "lmcache c=64 added p50 / slowest other" \
        "$(awk -v a="$lm64" -v b="$others64" 'BEGIN { printf "%.2f", a / b }')" le 2.0 x
fi
# The same comparison with every row offered one rate: in the closed loop a row whose engines
# cost less (lmcache's here) runs at a higher rate, and its queue is counted where it waits,
# in the gateway, where the other rows' queue waits in their engines (engine time).
rate_csv=$RESULTS_DIR/b3_pd_rate.csv
if [[ -s "$rate_csv" ]]; then
    read -r lm_r others_r < <(awk -F, 'NR > 1 { if ($1 == "lmcache") l = $6; else if ($1 !~ /^lmcache/ && $6 > o) o = $6 }
        END { printf "%s %s\n", l, o }' "$rate_csv")
    if [[ -n "$lm_r" ]] && awk -v b="$others_r" 'BEGIN { exit !(b > 0) }'; then
        info_row b3 "lmcache c=64 at ${RATE-600} req/s added p50 / slowest other" \
            "$(awk -v a="$lm_r" -v b="$others_r" 'BEGIN { printf "%.2f", a / b }')" x
    fi
fi
echo "machine: $(machine_line)"
