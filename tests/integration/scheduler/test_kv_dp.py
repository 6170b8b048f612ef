"""precise-prefix with a data-parallel engine: one vLLM API server in front of two engine
cores (ranks), each with its own prefix cache and its own KV-event publisher. pdgw knows the
engine as two instances (same URL, dp_rank 0 and 1, dp_size 2) configured with the engine's
one --kv-events-config endpoint, listens to each rank where that rank publishes, and sends a
prompt to the rank that holds it with X-data-parallel-rank.

Upstream facts (vllm-project/vllm):
- vllm/distributed/kv_events.py ZmqEventPublisher: a DP rank publishes on the configured
  endpoint and replay endpoint offset by its rank (offset_endpoint_port: tcp port + rank),
  batches carry data_parallel_rank;
- vllm/entrypoints/openai/engine/serving.py _get_data_parallel_rank: the API server sends a
  request to the engine core the X-data-parallel-rank header names.

The engine is a small fake here (HTTP + one PUB and one replay ROUTER per rank, python3-zmq
and msgpack, map layout), since pdgw-sim models one prefix cache per process.
"""

import http.server
import json
import os
import tempfile
import threading
import time

import msgpack
import zmq

import pdgwtest as t

BLOCK = 16
MODEL = "sim-model"


def family(rank, n_blocks=8):
    return [5000 + rank * 7919 + i for i in range(n_blocks * BLOCK)]


class DPEngine:
    """Two ranks behind one HTTP port; rank r holds family(r) and publishes it."""

    def __init__(self, ev_base, rp_base):
        self.ranks_seen = []
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        self.threads = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def reply(self, body):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                self.reply(b"{}")

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", "0")))
                outer.ranks_seen.append(self.headers.get("X-data-parallel-rank"))
                self.reply(json.dumps({
                    "id": "cmpl-1", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                              "total_tokens": 2}}).encode())

            def log_message(self, *a):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        self.threads.append(threading.Thread(target=self.http.serve_forever, daemon=True))
        self.socks = []
        try:
            for rank in (0, 1):  # rank r on base + r, as vLLM binds them
                pub = self.ctx.socket(zmq.PUB)
                router = self.ctx.socket(zmq.ROUTER)
                self.socks += [pub, router]
                pub.bind(f"tcp://127.0.0.1:{ev_base + rank}")
                router.bind(f"tcp://127.0.0.1:{rp_base + rank}")
                self.threads.append(threading.Thread(target=self.publish,
                                                     args=(rank, pub, router), daemon=True))
        except zmq.ZMQError:
            for sock in self.socks:
                sock.close(linger=0)
            self.http.server_close()
            self.ctx.term()
            raise
        for th in self.threads:
            th.start()

    def publish(self, rank, pub, router):
        toks = family(rank)
        # vLLM's engine hashes are opaque to pdgw (it rehashes token_ids): any distinct ints
        hashes = [rank * 1000 + i + 1 for i in range(len(toks) // BLOCK)]
        sent, seq = [], 0
        while not self.stop.is_set():
            batch = msgpack.packb({"ts": time.time(), "events": [{
                "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                "token_ids": toks, "block_size": BLOCK, "lora_id": None, "medium": "GPU",
                "lora_name": None}], "data_parallel_rank": rank})
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), batch])
            sent = (sent + [(seq, batch)])[-50:]
            seq += 1
            deadline = time.time() + 0.1
            while time.time() < deadline:
                if router.poll(20):
                    ident, _, start = router.recv_multipart()
                    first = int.from_bytes(start, "big")
                    for s, b in sent:
                        if s >= first:
                            router.send_multipart([ident, b"", s.to_bytes(8, "big"), b])
                    router.send_multipart([ident, b"", b"\xff" * 8, b""])
        pub.close(linger=0)
        router.close(linger=0)

    def close(self):
        self.stop.set()
        self.http.shutdown()
        self.http.server_close()
        for th in self.threads[1:]:
            th.join(5)
        self.ctx.term()


def test_prompt_goes_to_the_rank_holding_it():
    for attempt in range(20):  # base and base + 1 must both be free
        ev_base, rp_base = t.free_port(), t.free_port()
        try:
            eng = DPEngine(ev_base, rp_base)
            break
        except zmq.ZMQError:
            if attempt == 19:
                raise
    port = t.free_port()
    cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-dp-", suffix=".yaml", delete=False)
    lines = [f'listen: "127.0.0.1:{port}"', "workers: 1", "protocol: neutral",
             "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
             "health_interval: 500ms", "health_timeout: 500ms",
             "metrics_scrape_interval: 500ms", "access_log: false", "instances:"]
    for rank in (0, 1):
        lines += [f"  - id: dp-r{rank}", f"    url: http://127.0.0.1:{eng.port}",
                  "    role: both", f"    dp_rank: {rank}", "    dp_size: 2",
                  # the engine's own config, as given to vLLM; pdgw offsets it per rank
                  f'    kv_events_endpoint: "tcp://127.0.0.1:{ev_base}"',
                  f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{rp_base}"']
    cfg.write("\n".join(lines) + "\n")
    cfg.close()
    gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg.name])
    try:
        t.wait_http(port, "/ready", timeout=15, proc=gw)
        deadline = time.time() + 15
        while True:
            _, _, body = t.request("GET", port, "/metrics", timeout=5)
            if (t.metric_value(body.decode(), "pdgw_kv_index_blocks") or 0) >= 16:
                break
            assert time.time() < deadline, body.decode()[-2000:]
            time.sleep(0.05)
        for rnd in range(3):
            for rank in (1, 0):
                before = len(eng.ranks_seen)
                st, _, obj, raw = t.post_json(port, "/v1/completions", {
                    "model": MODEL, "max_tokens": 1,
                    "prompt": family(rank) + [900000 + rnd * 10 + rank] * 5})
                assert st == 200, raw
                assert eng.ranks_seen[before:] == [str(rank)], (rnd, rank, eng.ranks_seen)
    finally:
        gw.kill()
        eng.close()
        os.unlink(cfg.name)


if __name__ == "__main__":
    t.run([test_prompt_goes_to_the_rank_holding_it])
