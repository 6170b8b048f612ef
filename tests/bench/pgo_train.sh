#!/usr/bin/env bash
# The training load of a profile-guided build (make build-pgo): runs the pdgw in BIN_DIR,
# built with -fprofile-generate, in front of pdgw-sim under the requests a fleet sends most:
# completions and chat, whole and streamed, through a single engine (neutral) and through a
# prefill/decode pair (vllm-nixl, KV moved by the simulators). Each pdgw is stopped with
# SIGINT so it exits normally and writes its profile. Fails when a request does not succeed:
# a profile of error paths would teach the compiler the wrong branches.
# Usage: pgo_train.sh [BIN_DIR]
#   env: PGO_REQUESTS (whole completions through neutral, default 20000; the other loads
#        are fractions of it), PGO_PARALLEL (connections, default 32)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
PGO_REQUESTS=${PGO_REQUESTS:-20000}
PGO_PARALLEL=${PGO_PARALLEL:-32}
need curl "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"

# drive PORT PATH COUNT BODY: COUNT POSTs of BODY over PGO_PARALLEL keep-alive connections;
# fails unless every one answered 2xx.
drive() {
    local port=$1 path=$2 count=$3 body=$4 cfg=$BENCH_TMP/curl.cfg i codes
    body=${body//\\/\\\\}
    body=${body//\"/\\\"}
    {
        for ((i = 0; i < count; i++)); do
            ((i > 0)) && echo next
            printf 'url = "http://127.0.0.1:%s%s"\n' "$port" "$path"
            echo 'header = "Content-Type: application/json"'
            printf 'data = "%s"\n' "$body"
            echo 'output = "/dev/null"'
            echo 'write-out = "%{http_code}\n"'
        done
    } >"$cfg"
    codes=$(curl -s --parallel --parallel-max "$PGO_PARALLEL" --config "$cfg")
    if grep -qv '^2' <<<"$codes"; then
        echo "pgo_train: $path: $(grep -cv '^2' <<<"$codes") of $count requests failed" >&2
        return 1
    fi
    echo "pgo_train: $count x $path ok"
}

# stop_pdgw PID: SIGINT, then wait until it has exited (its profile is written at exit).
stop_pdgw() {
    local i
    kill -INT "$1"
    for ((i = 0; i < 200; i++)); do
        proc_alive "$1" || return 0
        sleep 0.05
    done
    echo "pgo_train: pdgw $1 did not exit" >&2
    return 1
}

# Every simulator answers at once (the proxy is what is being profiled).
sim_flags=(--zero-delay --max-tokens-default 16 --record-capacity 0 --max-batch 4096)
cmpl='{"model":"sim-model","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":16}'
cmpl_stream='{"model":"sim-model","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":16,"stream":true}'
chat='{"model":"sim-model","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}'
chat_stream='{"model":"sim-model","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}'

# A single engine (neutral): B1's and B2's paths.
sim_port=$(free_port)
gw_port=$(free_port)
bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" "${sim_flags[@]}"
wait_http "$sim_port" /health
bench_start pdgw "$BIN_DIR/pdgw" --listen "127.0.0.1:$gw_port" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers 2 --log-level warn --no-access-log
gw=$LAST_PID
wait_http "$gw_port" /ready
drive "$gw_port" /v1/completions "$PGO_REQUESTS" "$cmpl"
drive "$gw_port" /v1/completions $((PGO_REQUESTS / 2)) "$cmpl_stream"
drive "$gw_port" /v1/chat/completions $((PGO_REQUESTS / 4)) "$chat"
drive "$gw_port" /v1/chat/completions $((PGO_REQUESTS / 4)) "$chat_stream"
stop_pdgw "$gw"

# A prefill/decode pair (vllm-nixl): the two-stage workflow and its KV hand-over.
pre_port=$(free_port)
dec_port=$(free_port)
kv_port=$(free_port)
boot_port=$(free_port)
alloc_port=$(free_port)
init_port=$(free_port)
gw_port=$(free_port)
bench_start prefill "$BIN_DIR/pdgw-sim" --role prefill --port "$pre_port" "${sim_flags[@]}" \
    --engine-id pgo-prefill --kv-port "$kv_port" --bootstrap-port "$boot_port"
bench_start decode "$BIN_DIR/pdgw-sim" --role decode --port "$dec_port" "${sim_flags[@]}" \
    --engine-id pgo-decode --alloc-port "$alloc_port" --init-port "$init_port"
wait_http "$pre_port" /health
wait_http "$dec_port" /health
cat >"$BENCH_TMP/pd.yaml" <<YAML
listen: "127.0.0.1:$gw_port"
protocol: vllm-nixl
log_level: warn
access_log: false
instances:
  - {id: prefill-0, url: "http://127.0.0.1:$pre_port", role: prefill, engine_id: pgo-prefill,
     kv_port: $kv_port, bootstrap_port: $boot_port}
  - {id: decode-0, url: "http://127.0.0.1:$dec_port", role: decode, engine_id: pgo-decode,
     alloc_ports: [$alloc_port], init_ports: [$init_port]}
YAML
bench_start pdgw-pd "$BIN_DIR/pdgw" --config "$BENCH_TMP/pd.yaml"
gw=$LAST_PID
wait_http "$gw_port" /ready
drive "$gw_port" /v1/completions $((PGO_REQUESTS / 4)) "$cmpl"
drive "$gw_port" /v1/chat/completions $((PGO_REQUESTS / 8)) "$chat_stream"
stop_pdgw "$gw"
