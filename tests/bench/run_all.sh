#!/usr/bin/env bash
# Runs every benchmark in order and prints one summary table at the end.
# Each bN_*.sh can also run alone. Results: tests/bench/results/<name>.csv and .png.
# Usage: run_all.sh [BIN_DIR]   env: ONLY="b1 b4" to run a subset.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../build/bin}
only=${ONLY:-"b1 b2 b3 b4 b5"}
status=0
for b in $only; do
    script=$(ls "$here/${b}"_*.sh 2>/dev/null | head -n 1)
    if [[ -z "$script" ]]; then
        echo "== $b: no script" >&2
        status=1
        continue
    fi
    echo "== $(basename "$script")"
    if ! "$script" "$bin"; then
        echo "== $(basename "$script") FAILED" >&2
        status=1
    fi
done
echo
echo "================ summary ================"
cat "$here"/results/*.summary 2>/dev/null
exit $status
