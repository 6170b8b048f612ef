#!/usr/bin/env bash
# Profiles pdgw under a benchmark's load, the way RESULTS.md's profiles were taken:
#   passthrough: wrk keep-alive non-stream completions through pdgw neutral (B1's load)
#   streams:     sse-flood SSE streams through pdgw neutral (B2's load)
# with perf (call graphs, whole pdgw process) or valgrind --tool=callgrind (one worker,
# light load: callgrind runs the gateway ~50x slower). Prints the top symbols; the raw
# profile is kept in $OUT_DIR.
# Usage: profile_pdgw.sh [BIN_DIR] passthrough|streams [perf|callgrind]
#   env: SECONDS_PROFILED (perf: 4), CONNS (passthrough: 64), STREAMS (streams: 1000),
#        TPOT_MS (streams: 50), OUT_DIR (/tmp), PERF_EVENT (perf: its default; cycles:u for
#        user time alone; cpu-clock:u on a VM without hardware counters), PERF_FREQ (perf:
#        samples per second, 999), PDGW_ARGS (more pdgw options, e.g. --frontend mhd)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
load=${2:-passthrough}
tool=${3:-perf}
SECONDS_PROFILED=${SECONDS_PROFILED:-4}
CONNS=${CONNS:-64}
STREAMS=${STREAMS:-1000}
TPOT_MS=${TPOT_MS:-50}
OUT_DIR=${OUT_DIR:-/tmp}
need curl "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
case $load in
passthrough) need wrk ;;
streams) need "$BIN_DIR/sse-flood" ;;
*)
    echo "profile_pdgw: load is passthrough or streams" >&2
    exit 2
    ;;
esac
case $tool in
perf) need perf ;;
callgrind) need valgrind callgrind_annotate ;;
*)
    echo "profile_pdgw: tool is perf or callgrind" >&2
    exit 2
    ;;
esac
raise_nofile >/dev/null

sim_port=$(free_port)
pdgw_port=$(free_port)
bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" --record-capacity 0 \
    --max-batch 20000 --eos-period 0 --kv-capacity-tokens 8000000 \
    $([[ $load == passthrough ]] && echo --zero-delay || echo "--emit-timestamps --ttft-ms 0 --tpot-ms $TPOT_MS")
wait_http "$sim_port" /health

pdgw_cmd=("$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgw_port" --protocol neutral
    --both "http://127.0.0.1:$sim_port" --log-level warn --no-access-log ${PDGW_ARGS:-})
if [[ $tool == callgrind ]]; then
    out=$OUT_DIR/callgrind.pdgw.$load.out
    bench_start pdgw valgrind --tool=callgrind --callgrind-out-file="$out" "${pdgw_cmd[@]}" --workers 1
    wait_http "$pdgw_port" /ready 60
else
    out=$OUT_DIR/perf.pdgw.$load.data
    bench_start pdgw "${pdgw_cmd[@]}" --workers 2
    wait_http "$pdgw_port" /ready
fi
pdgw_pid=$LAST_PID

cat >"$BENCH_TMP/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":16}'
LUA
run_load() { # run_load SECONDS
    if [[ $load == passthrough ]]; then
        local c=$CONNS
        [[ $tool == callgrind ]] && c=4
        wrk -t 2 -c "$c" -d "${1}s" -s "$BENCH_TMP/post.lua" "http://127.0.0.1:$pdgw_port/v1/completions" |
            grep -E 'requests in|Requests/sec'
    else
        local tokens=$((${1} * 1000 / TPOT_MS))
        "$BIN_DIR/sse-flood" --port "$pdgw_port" --streams "$STREAMS" --tokens "$tokens" \
            --timeout $((${1} * 4 + 30)) --pid "$pdgw_pid" | grep '^RESULT'
    fi
}

if [[ $tool == callgrind ]]; then
    run_load 8
    kill -INT "$pdgw_pid" 2>/dev/null || true
    for _ in $(seq 100); do proc_alive "$pdgw_pid" || break; sleep 0.1; done
    callgrind_annotate --inclusive=yes "$out" 2>/dev/null | grep -E '^ *[0-9,]+ \(' | grep -v '???:0x' | head -40
    echo "--- exclusive"
    callgrind_annotate "$out" 2>/dev/null | grep -E '^ *[0-9,]+ \(' | grep -v '???:0x' | head -25
else
    run_load $((SECONDS_PROFILED + 3)) &
    loadpid=$!
    sleep 1.5
    perf record ${PERF_EVENT:+-e $PERF_EVENT} -F ${PERF_FREQ:-999} --call-graph dwarf,16384 -p "$pdgw_pid" -o "$out" -- sleep "$SECONDS_PROFILED" 2>/dev/null
    wait "$loadpid" || true
    echo "--- by shared object"
    perf report -i "$out" --no-children --sort dso --stdio -g none 2>/dev/null | grep -E '^ +[0-9]' | head -8
    echo "--- inclusive, user space"
    perf report -i "$out" --children --sort sym --stdio -g none 2>/dev/null | grep -E '^ +[0-9]' |
        grep -v '\[k\]' | grep -v ' 0x0000' | head -30
fi
echo "profile: $out"
