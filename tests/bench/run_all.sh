#!/usr/bin/env bash
# Runs every benchmark in order, prints one summary table of figures against the
# targets, and appends that table (date, machine, load, command) to RESULTS.md.
# Each bN_*.sh can also run alone. Results: tests/bench/results/<name>.csv, .png
# and .summary (the rows of the table).
# Usage: run_all.sh [BIN_DIR]
#   env: ONLY="b1 b4" (subset), BENCH_TIMEOUT (s per benchmark, default 900),
#        RESULTS_MD=0 (do not append to RESULTS.md)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:-$here/../../build/bin}" 2>/dev/null && pwd) || {
    echo "run_all: binary directory ${1:-$here/../../build/bin} does not exist (build first)" >&2
    exit 1
}
only=${ONLY:-"b1 b2 b3 b4 b5 b6 b7 b8 b9"}
results=${RESULTS_DIR:-$here/results}
mkdir -p "$results"
status=0
started=$(date -u +%Y-%m-%dT%H:%MZ)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
ran=()
for b in $only; do
    script=$(ls "$here/${b}"_*.sh 2>/dev/null | head -n 1)
    if [[ -z "$script" ]]; then
        echo "== $b: no script" >&2
        status=1
        continue
    fi
    name=$(basename "$script" .sh)
    rm -f "$results/$name.summary"
    echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
    timeout -k 20 "${BENCH_TIMEOUT:-900}" "$script" "$bin"
    rc=$?
    if ((rc != 0)); then
        ((rc == 124)) && echo "== $name timed out after ${BENCH_TIMEOUT:-900}s" >&2
        echo "== $name FAILED (exit $rc)" >&2
        echo "| ${b^^}  | $name failed (exit $rc), see its output        |            - | | | n/a    | |" \
            >>"$results/$name.summary"
        status=1
    fi
    ran+=("$name")
done

machine="$(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), kernel $(uname -r)"
table=$(
    echo "| B   | figure                                         | value                 | target          | verdict | load1 |"
    echo "|-----|------------------------------------------------|-----------------------|-----------------|---------|-------|"
    for name in "${ran[@]}"; do
        cat "$results/$name.summary" 2>/dev/null
    done
)
echo
echo "================ summary ($started, $machine) ================"
echo "$table"

if [[ "${RESULTS_MD:-1}" == 1 && ${#ran[@]} -gt 0 ]]; then
    {
        echo
        echo "### $started — ${ran[*]}"
        echo
        echo "Machine: $machine. Load average at start: $load_start; at end: $(cut -d' ' -f1-3 /proc/loadavg)."
        echo "Command: \`${BENCH_CMD:-tests/bench/run_all.sh $bin}\`${ONLY:+ (ONLY=\"$ONLY\")}"
        echo
        echo "$table"
    } >>"$here/RESULTS.md"
    echo "(appended to tests/bench/RESULTS.md)"
fi
exit $status
