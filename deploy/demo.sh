#!/usr/bin/env bash
# The demo stack on loopback: one prefill and one decode pdgw-sim behind pdgw speaking a PD
# protocol (default vllm-nixl), real KV bytes moved between the two sims through libkvt.
# Streams one chat completion so the tokens appear as they arrive, prints what moved where
# (KV bytes sent / received / verified, from the sims' /metrics), and keeps serving until
# Ctrl-C.
#   usage: deploy/demo.sh <bindir>          (make demo passes build/bin)
#   pick another protocol / scheduling mode:
#     PROTOCOL=sglang make demo       (vllm-nixl | vllm-mooncake | vllm-kvt | sglang | lmcache | neutral)
#     SCHEDULING=staged make demo     (batch | staged; lmcache is batch only)
#     MOONCAKE_DISPATCH=serial PROTOCOL=vllm-mooncake make demo   (Llumnix's fork; default: upstream vLLM)
#   PDGW_DEMO_ONCE=1: stop after the first answer instead of serving until Ctrl-C.
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

PROTOCOL=${PROTOCOL:-vllm-nixl}
SCHEDULING=${SCHEDULING:-batch}
case "$PROTOCOL" in
neutral | vllm-nixl | vllm-mooncake | vllm-kvt | sglang | lmcache) ;;
*)
    echo "demo: unknown PROTOCOL '$PROTOCOL' (vllm-nixl, vllm-mooncake, vllm-kvt, sglang, lmcache, neutral)" >&2
    exit 1
    ;;
esac
if [[ "$PROTOCOL" == lmcache && "$SCHEDULING" != batch ]]; then
    echo "demo: lmcache needs SCHEDULING=batch (its prefill leg names the decode's receiver)" >&2
    exit 1
fi
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

SIM_TIMING=(--ttft-ms 200 --tpot-ms 40 --max-tokens-default 64)
CONFIG="$LOGDIR/pdgw.yaml"

if [[ "$PROTOCOL" == neutral ]]; then
    "$BIN/pdgw-sim" --role both --port "$SIM_PORT" "${SIM_TIMING[@]}" >"$LOGDIR/pdgw-sim.log" 2>&1 &
    PIDS+=($!)
    wait_ready "http://127.0.0.1:$SIM_PORT/health" pdgw-sim "${PIDS[-1]}"
    SIMS=("$SIM_PORT")
    cat >"$CONFIG" <<YAML
listen: "127.0.0.1:$GW_PORT"
protocol: neutral
instances:
  - {id: both-0, url: "http://127.0.0.1:$SIM_PORT", role: both}
YAML
else
    DEC_PORT=$(pick_port 8200)
    KV_PORT=$(pick_port 28000)
    BOOT_PORT=$(pick_port 8998)
    ALLOC_PORT=$(pick_port 7400)
    INIT_PORT=$(pick_port 7300)
    PROXY_PORT=$(pick_port 7500)
    # Engines configured as upstream runs them: a Mooncake prefill of upstream vLLM
    # (serial is Llumnix's fork), LMCache decoders that skip the last prompt token.
    PREFILL_EXTRA=() DECODE_EXTRA=()
    if [[ "$PROTOCOL" == vllm-mooncake && "${MOONCAKE_DISPATCH:-parallel}" == parallel ]]; then
        PREFILL_EXTRA=(--kv-connector mooncake)
    fi
    if [[ "$PROTOCOL" == lmcache ]]; then
        DECODE_EXTRA=(--skip-last-n-tokens 1)
    fi
    "$BIN/pdgw-sim" --role prefill --port "$SIM_PORT" --engine-id demo-prefill \
        --kv-port "$KV_PORT" --bootstrap-port "$BOOT_PORT" "${PREFILL_EXTRA[@]}" \
        --proxy-host 127.0.0.1 --proxy-port "$PROXY_PORT" "${SIM_TIMING[@]}" \
        >"$LOGDIR/pdgw-sim-prefill.log" 2>&1 &
    PIDS+=($!)
    wait_ready "http://127.0.0.1:$SIM_PORT/health" pdgw-sim-prefill "${PIDS[-1]}"
    "$BIN/pdgw-sim" --role decode --port "$DEC_PORT" --engine-id demo-decode \
        --alloc-port "$ALLOC_PORT" --init-port "$INIT_PORT" "${DECODE_EXTRA[@]}" "${SIM_TIMING[@]}" \
        >"$LOGDIR/pdgw-sim-decode.log" 2>&1 &
    PIDS+=($!)
    wait_ready "http://127.0.0.1:$DEC_PORT/health" pdgw-sim-decode "${PIDS[-1]}"
    SIMS=("$SIM_PORT" "$DEC_PORT")
    {
        echo "listen: \"127.0.0.1:$GW_PORT\""
        echo "protocol: $PROTOCOL"
        echo "scheduling: $SCHEDULING"
        case "$PROTOCOL" in
        vllm-mooncake) echo "protocol_options: {mooncake_dispatch: ${MOONCAKE_DISPATCH:-parallel}}" ;;
        lmcache) echo "protocol_options: {proxy_host: 127.0.0.1, proxy_port: $PROXY_PORT}" ;;
        esac
        echo "instances:"
        echo "  - {id: prefill-0, url: \"http://127.0.0.1:$SIM_PORT\", role: prefill, engine_id: demo-prefill,"
        echo "     kv_port: $KV_PORT, bootstrap_port: $BOOT_PORT}"
        echo "  - {id: decode-0, url: \"http://127.0.0.1:$DEC_PORT\", role: decode, engine_id: demo-decode,"
        echo "     alloc_ports: [$ALLOC_PORT], init_ports: [$INIT_PORT]}"
    } >"$CONFIG"
fi

"$BIN/pdgw" --config "$CONFIG" >"$LOGDIR/pdgw.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$GW_PORT/ready" pdgw "${PIDS[-1]}"

MODEL=$(curl -fsS "http://127.0.0.1:$GW_PORT/v1/models" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

if [[ "$PROTOCOL" == neutral ]]; then
    echo "pdgw     http://127.0.0.1:$GW_PORT  (neutral forwarder)"
    echo "pdgw-sim http://127.0.0.1:$SIM_PORT (simulated engine, model $MODEL)"
else
    echo "pdgw     http://127.0.0.1:$GW_PORT  (protocol $PROTOCOL, scheduling $SCHEDULING)"
    echo "prefill  http://127.0.0.1:$SIM_PORT (pdgw-sim, model $MODEL)"
    echo "decode   http://127.0.0.1:$DEC_PORT (pdgw-sim)"
fi
echo
echo "Question: Explain prefill/decode disaggregation in one paragraph."
echo "Answer (streamed through pdgw, printed as each token arrives):"
echo "----------------------------------------------------------------"
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
echo "----------------------------------------------------------------"
# What moved: the sims count every KV byte sent, received and checked.
python3 - "${SIMS[@]}" <<'PY'
import sys, urllib.request
def scrape(port):
    out = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out
ports = sys.argv[1:]
if len(ports) < 2:
    print("KV transfer: none (neutral: one engine does prefill and decode)")
    sys.exit(0)
p, d = scrape(ports[0]), scrape(ports[1])
ok = sum(v for k, v in d.items() if k.startswith("sim_kv_transfers_total") and 'result="ok"' in k)
print(f"KV transfer: prefill sent {int(p.get('sim_kv_bytes_sent_total', 0))} bytes, "
      f"decode received {int(d.get('sim_kv_bytes_received_total', 0))} bytes in {int(ok)} "
      f"transfer(s), verify failures {int(d.get('sim_kv_verify_failures_total', 0))}, "
      f"pages still pinned {int(p.get('sim_kv_pages_pinned', 0) + d.get('sim_kv_pages_pinned', 0))}")
PY
echo
echo "Try it yourself:"
echo "  curl -N http://127.0.0.1:$GW_PORT/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "    -d '{\"model\":\"$MODEL\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'"
echo "  curl http://127.0.0.1:$GW_PORT/metrics"
echo
# PDGW_DEMO_ONCE=1 stops here instead of serving (tests).
if [[ "${PDGW_DEMO_ONCE:-0}" == 1 ]]; then
    exit 0
fi
echo "Serving until Ctrl-C (logs in $LOGDIR)."
wait -n "${PIDS[@]}" || true
