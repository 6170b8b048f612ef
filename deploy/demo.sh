#!/usr/bin/env bash
# The demo stack on loopback: pdgw-sim (one simulated engine doing prefill and decode)
# behind pdgw with the neutral forwarder. Streams one chat completion so the tokens appear
# as they arrive, prints a command to try next, and keeps serving until Ctrl-C.
#   usage: deploy/demo.sh <bindir>          (make demo passes build/bin)
set -euo pipefail

BIN=${1:-build/bin}
for b in pdgw pdgw-sim; do
    if [[ ! -x "$BIN/$b" ]]; then
        echo "demo: $BIN/$b not found; run 'make build' first" >&2
        exit 1
    fi
done

# Port <want> if it is free on 127.0.0.1, else an ephemeral one.
pick_port() {
    python3 - "$1" <<'PY'
import socket, sys
want = int(sys.argv[1])
for port in (want, 0):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(s.getsockname()[1])
        break
    except OSError:
        continue
    finally:
        s.close()
PY
}

SIM_PORT=$(pick_port 8100)
GW_PORT=$(pick_port 8000)
LOGDIR=$(mktemp -d /tmp/pdgw-demo.XXXXXX)
PIDS=()

cleanup() {
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    echo
    echo "demo: stopped (logs in $LOGDIR)"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

wait_ready() { # url what pid
    local i
    for i in $(seq 1 100); do
        if curl -fsS -o /dev/null "$1" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$3" 2>/dev/null; then
            echo "demo: $2 exited; its log:" >&2
            cat "$LOGDIR/$2.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "demo: $2 not ready at $1" >&2
    exit 1
}

"$BIN/pdgw-sim" --role both --port "$SIM_PORT" --ttft-ms 200 --tpot-ms 40 \
    --max-tokens-default 64 >"$LOGDIR/pdgw-sim.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$SIM_PORT/health" pdgw-sim "${PIDS[-1]}"

"$BIN/pdgw" --listen "127.0.0.1:$GW_PORT" --protocol neutral \
    --both "http://127.0.0.1:$SIM_PORT" >"$LOGDIR/pdgw.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$GW_PORT/ready" pdgw "${PIDS[-1]}"

MODEL=$(curl -fsS "http://127.0.0.1:$GW_PORT/v1/models" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

echo "pdgw     http://127.0.0.1:$GW_PORT  (neutral forwarder)"
echo "pdgw-sim http://127.0.0.1:$SIM_PORT (simulated engine, model $MODEL)"
echo
echo "Streaming a chat completion through pdgw:"
echo
REQ=$(printf '{"model":"%s","stream":true,"max_tokens":48,"messages":[{"role":"user","content":"Explain prefill/decode disaggregation in one paragraph."}]}' "$MODEL")
# Print each token's text the moment its SSE event arrives.
curl -sN "http://127.0.0.1:$GW_PORT/v1/chat/completions" \
    -H 'Content-Type: application/json' -d "$REQ" |
    python3 -u -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data:"):
        continue
    data = line[5:].strip()
    if data == "[DONE]":
        break
    obj = json.loads(data)
    if "error" in obj:
        print("\n[error] " + obj["error"]["message"])
        break
    for ch in obj.get("choices", []):
        sys.stdout.write((ch.get("delta") or {}).get("content") or ch.get("text") or "")
    sys.stdout.flush()
print()
'
echo
echo "Try it yourself:"
echo "  curl -N http://127.0.0.1:$GW_PORT/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "    -d '{\"model\":\"$MODEL\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'"
echo "  curl http://127.0.0.1:$GW_PORT/metrics"
echo
echo "Serving until Ctrl-C (logs in $LOGDIR)."
wait -n "${PIDS[@]}" || true
