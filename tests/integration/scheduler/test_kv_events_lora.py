"""A request for a LoRA adapter matches only blocks cached under that adapter: a real pdgw
and two stand-in vLLM engines (pdgw-sim serves no adapter), each an HTTP server plus a KV
event publisher binding its endpoint.

Upstream facts (vllm-project/vllm):
- vllm/entrypoints/openai/models/serving.py show_available_models: /v1/models lists the
  base model (parent null) and each loaded LoRA adapter with parent = its base model; a
  request whose `model` names an adapter runs under it;
- vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys: the adapter's name is an
  extra key of every block of such a request;
- vllm/v1/core/block_pool.py: BlockStored then carries lora_name and extra_keys per block;
  tests/v1/core/test_kv_events_contract.py: the batch [ts, [map events], dp_rank].

e0 caches the prompt under the adapter, e1 the same prompt under the base model: the
adapter's follow-up goes to e0, the base model's to e1.
"""

import json
import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import zmq

import pdgwtest as t

BASE, LORA, BLOCK = "base-model", "sql-lora", 16
PROMPT = [4000 + i for i in range(4 * BLOCK)]


class Engine:
    def __init__(self, name):
        self.name, self.completions = name, 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def reply(self, obj, ctype="application/json"):
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path.startswith("/v1/models"):
                    self.reply({"object": "list", "data": [
                        {"id": BASE, "object": "model", "owned_by": "vllm", "root": "/m",
                         "parent": None},
                        {"id": LORA, "object": "model", "owned_by": "vllm",
                         "root": "/loras/sql", "parent": BASE}]})
                elif self.path.startswith("/metrics"):
                    self.reply(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n",
                               "text/plain")
                else:
                    self.reply(b"", "text/plain")

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n))
                engine.completions += 1
                self.reply({"id": "cmpl-1", "object": "text_completion", "created": 1,
                            "model": req.get("model"),
                            "choices": [{"index": 0, "text": "x", "finish_reason": "length",
                                         "logprobs": None}],
                            "usage": {"prompt_tokens": len(req["prompt"]),
                                      "completion_tokens": 1,
                                      "total_tokens": len(req["prompt"]) + 1}})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


def stored(lora):
    """The prompt's 4 blocks as vLLM announces them, under <lora> or the base model."""
    ev = {"type": "BlockStored", "block_hashes": [11, 12, 13, 14], "parent_block_hash": None,
          "token_ids": PROMPT, "block_size": BLOCK, "lora_id": 1 if lora else None,
          "medium": "GPU", "lora_name": lora,
          "extra_keys": [[lora] if lora else None] * 4, "group_idx": 0,
          "kv_cache_spec_kind": "full_attention"}
    return msgpack.packb([time.time(), [ev], 0], use_bin_type=True)


def test_adapter_request_matches_adapter_blocks():
    engines = [Engine("e0"), Engine("e1")]
    ctx = zmq.Context()
    pubs, ev_ports = [], []
    gw = cfg = None
    try:
        for _ in engines:
            pub = ctx.socket(zmq.PUB)
            ev_ports.append(pub.bind_to_random_port("tcp://127.0.0.1"))
            pubs.append(pub)
        gw_port = t.free_port()
        cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-kvlora-", suffix=".yaml",
                                          delete=False)
        lines = [f'listen: "127.0.0.1:{gw_port}"', "workers: 1", "protocol: neutral",
                 "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
                 "health_interval: 200ms", "health_timeout: 200ms", "access_log: false",
                 "instances:"]
        for i, e in enumerate(engines):
            lines += [f"  - id: e{i}", f"    url: http://127.0.0.1:{e.port}", "    role: both",
                      f'    kv_events_endpoint: "tcp://127.0.0.1:{ev_ports[i]}"']
        cfg.write("\n".join(lines) + "\n")
        cfg.close()
        gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg.name])
        t.wait_http(gw_port, "/ready", timeout=15, proc=gw)

        def metric(name):
            _, _, body = t.request("GET", gw_port, "/metrics", timeout=5)
            return t.metric_value(body.decode(), name) or 0.0

        # e0 cached the prompt under the adapter, e1 under the base model; a SUB misses
        # what came before it joined, so each publishes until pdgw holds both sets
        seq = 0
        deadline = time.time() + 15
        while metric("pdgw_kv_index_blocks") < 8:
            assert time.time() < deadline, metric("pdgw_kv_index_blocks")
            for pub, lora in zip(pubs, (LORA, None)):
                pub.send_multipart([b"", seq.to_bytes(8, "big"), stored(lora)])
            seq += 1
            time.sleep(0.05)
        # both engines' model lists learnt (the adapter is known as one)
        deadline = time.time() + 15
        while "serves 2 model(s)" not in gw.output() or gw.output().count("serves 2") < 2:
            assert time.time() < deadline, gw.output()[-2000:]
            time.sleep(0.05)

        follow = PROMPT + [9000 + i for i in range(5)]
        for model, home in ((LORA, 0), (BASE, 1), (LORA, 0), (BASE, 1)):
            before = [e.completions for e in engines]
            status, _, _, raw = t.post_json(gw_port, "/v1/completions",
                                            {"model": model, "prompt": follow,
                                             "max_tokens": 1}, timeout=30)
            assert status == 200, (status, raw[:300])
            got = [i for i, e in enumerate(engines) if e.completions > before[i]]
            assert got == [home], (model, got)
    finally:
        if gw:
            gw.kill()
        if cfg:
            os.unlink(cfg.name)
        for pub in pubs:
            pub.close(linger=0)
        ctx.destroy(linger=0)
        for e in engines:
            e.close()


if __name__ == "__main__":
    t.run([test_adapter_request_matches_adapter_blocks])
