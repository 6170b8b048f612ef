"""Text prompts routed by the engines' KV events: pdgw tokenizes them through an engine's
POST /tokenize before routing, and routes without tokens when that is slow.

Upstream facts:
- vLLM's tokenize endpoint (vllm-project/vllm vllm/entrypoints/serve/tokenize/protocol.py,
  formerly vllm/entrypoints/openai/protocol.py): TokenizeCompletionRequest {model, prompt,
  add_special_tokens}, TokenizeChatRequest {model, messages, add_generation_prompt (default
  true), continue_final_message, add_special_tokens, chat_template, chat_template_kwargs,
  tools} -> TokenizeResponse {count, max_model_len, tokens}. pdgw-sim serves it with the
  same ids its completions compute (tests/sim/sim_tokenize.c).
- KV events carry the stored blocks' token ids (vllm/distributed/kv_events.py BlockStored),
  which pdgw rehashes; a text prompt therefore matches only once tokenized.

- three sims warmed directly (pdgw never saw those requests) with three text families and
  one chat system prompt: every text and chat follow-up through pdgw lands on the sim that
  holds its blocks; the same prompt again is answered from pdgw's tokenize cache;
- an engine whose /tokenize never answers: the request is routed without tokens after
  tokenize_timeout, answered, and the fallback is counted.
"""

import http.server
import json
import os
import tempfile
import threading
import time

import pdgwtest as t

MODEL = "sim-model"
BLOCK = 16


def family_text(fam, n_words):
    return " ".join(f"f{fam}w{i}" for i in range(n_words))


def successes(port):
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200, status
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm:request_success_total"))


def post(port, path, body):
    status, _, obj, raw = t.post_json(port, path, body, timeout=30)
    assert status == 200, (status, raw[:300])
    return obj


def complete(port, prompt):
    return post(port, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})


def chat(port, system, question):
    return post(port, "/v1/chat/completions",
                {"model": MODEL, "max_tokens": 1,
                 "messages": [{"role": "system", "content": system},
                              {"role": "user", "content": question}]})


class Fleet:
    """Three sims publishing KV events, pdgw with precise-prefix over them."""

    def __init__(self, n=3, top=()):
        self.ports = [t.free_port() for _ in range(n)]
        self.ev_ports = [t.free_port() for _ in range(n)]
        self.rp_ports = [t.free_port() for _ in range(n)]
        self.sims = []
        for i, port in enumerate(self.ports):
            kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": f"tcp://*:{self.ev_ports[i]}",
                      "replay_endpoint": f"tcp://*:{self.rp_ports[i]}", "topic": "kv"}
            p = t.Proc(f"sim{i}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                                   "--ttft-ms", "1", "--tpot-ms", "1", "--model", MODEL,
                                   "--block-size", str(BLOCK),
                                   "--kv-events-config", json.dumps(kv_cfg)])
            self.sims.append(p)
            t.wait_http(port, "/health", timeout=10, proc=p)
        self.gw_port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-tok-", suffix=".yaml",
                                               delete=False)
        lines = [f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: neutral",
                 "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
                 "health_interval: 500ms", "health_timeout: 500ms",
                 "metrics_scrape_interval: 500ms", "access_log: false",
                 # generous: a loaded sanitizer build must still get its answers in time
                 "tokenize_timeout: 5s", *top, "instances:"]
        for i, port in enumerate(self.ports):
            lines += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both",
                      f'    kv_events_endpoint: "tcp://127.0.0.1:{self.ev_ports[i]}"',
                      f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{self.rp_ports[i]}"']
        self.cfg.write("\n".join(lines) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        t.wait_http(self.gw_port, "/ready", timeout=15, proc=self.gw)

    def close(self):
        for p in self.sims + [self.gw]:
            p.kill()
        os.unlink(self.cfg.name)

    def gw_metric(self, name, labels=None):
        _, _, body = t.request("GET", self.gw_port, "/metrics", timeout=5)
        return t.metric_value(body.decode(), name, labels) or 0.0

    def wait_events(self, at_least, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.gw_metric("pdgw_kv_events_total") >= at_least:
                return
            time.sleep(0.05)
        raise TimeoutError(f"pdgw saw {self.gw_metric('pdgw_kv_events_total')} KV events")

    def wait_indexed(self, blocks, timeout=30):
        """Until pdgw's index holds at least <blocks> residencies: a count of events alone can
        be reached while another engine's batch is still on its way."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.gw_metric("pdgw_kv_index_blocks") >= blocks:
                return
            time.sleep(0.05)
        raise TimeoutError(f"pdgw indexed {self.gw_metric('pdgw_kv_index_blocks')} of {blocks}")

    def routed_to(self, send):
        before = [successes(p) for p in self.ports]
        send(self.gw_port)
        after = [successes(p) for p in self.ports]
        got = [i for i in range(len(self.ports)) if after[i] > before[i]]
        assert len(got) == 1, (before, after)
        return got[0]


def test_text_prompts_land_where_their_blocks_are():
    fleet = Fleet()
    try:
        systems = [family_text(10 + i, 12 * BLOCK) for i in range(3)]
        for i, port in enumerate(fleet.ports):
            complete(port, family_text(i, 12 * BLOCK))
            chat(port, systems[i], "warm up")
        fleet.wait_events(6)
        # every warm-up prompt's full blocks, counted with the engines' own tokenizer
        full = 0
        for i in range(3):
            full += post(fleet.ports[0], "/tokenize",
                         {"model": MODEL, "prompt": family_text(i, 12 * BLOCK)})["count"] // BLOCK
            full += post(fleet.ports[0], "/tokenize",
                         {"model": MODEL, "messages": [
                             {"role": "system", "content": systems[i]},
                             {"role": "user", "content": "warm up"}]})["count"] // BLOCK
        fleet.wait_indexed(full)
        for rnd in range(2):
            for fam in range(3):
                follow = family_text(fam, 12 * BLOCK) + f" then round {rnd} asks more"
                assert fleet.routed_to(lambda p: complete(p, follow)) == fam, (rnd, fam)
                assert fleet.routed_to(
                    lambda p: chat(p, systems[fam], f"question {rnd}")) == fam, ("chat", rnd)
        ok = fleet.gw_metric("pdgw_tokenize_total", {"result": "ok"})
        assert ok == 12, ok
        # the same prompt again: pdgw's cache answers, the route is the same
        follow = family_text(1, 12 * BLOCK) + " then round 0 asks more"
        assert fleet.routed_to(lambda p: complete(p, follow)) == 1
        assert fleet.gw_metric("pdgw_tokenize_total", {"result": "cache_hit"}) == 1
        assert fleet.gw_metric("pdgw_tokenize_total", {"result": "ok"}) == ok
        assert fleet.gw_metric("pdgw_tokenize_total", {"result": "timeout"}) == 0
    finally:
        fleet.close()


class SlowTokenizer:
    """A vLLM-shaped engine whose /tokenize never answers in time (or, with <answers>,
    answers each of them in turn); completions answer."""

    def __init__(self, answers=None):
        self.release = threading.Event()
        self.answers = list(answers or [])
        self.completions = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def reply(self, obj, status=200):
                out = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass  # pdgw gave up on a slow /tokenize and closed: that is the point

            def do_GET(self):  # noqa: N802
                self.reply({})

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/tokenize" and outer.answers:
                    status, body = outer.answers.pop(0)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.path == "/tokenize":
                    outer.release.wait(60)
                    self.reply({"count": 1, "max_model_len": 8192, "tokens": [1]})
                    return
                outer.completions += 1
                self.reply({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                            "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                      "total_tokens": 4}})

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()


def test_slow_tokenize_falls_back(answers=None):
    eng = SlowTokenizer(answers)
    n = len(answers) if answers else 2
    port = t.free_port()
    cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-tok-", suffix=".yaml", delete=False)
    cfg.write("\n".join([f'listen: "127.0.0.1:{port}"', "workers: 1", "protocol: neutral",
                         "decode_policy: precise-prefix", "prefill_policy: precise-prefix",
                         "tokenize_timeout: 300ms", "health_interval: 500ms",
                         "health_timeout: 500ms", "metrics_scrape_interval: 0s",
                         "access_log: false", "instances:", "  - id: slow",
                         f"    url: http://127.0.0.1:{eng.port}", "    role: both"]) + "\n")
    cfg.close()
    gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg.name])
    try:
        t.wait_http(port, "/ready", timeout=15, proc=gw)
        for i in range(n):
            obj = complete(port, f"a prompt that the engine never tokenizes {i}")
            assert obj["choices"][0]["text"] == "ok", obj
        assert eng.completions == n
        _, _, body = t.request("GET", port, "/metrics", timeout=5)
        text = body.decode()
        result = "error" if answers else "timeout"
        assert t.metric_value(text, "pdgw_tokenize_total", {"result": result}) == n, text
        assert not t.metric_value(text, "pdgw_tokenize_total", {"result": "ok"})
        assert t.metric_value(text, "pdgw_requests_total", {"status": "200"}) == n
    finally:
        gw.kill()
        eng.close()
        os.unlink(cfg.name)


def test_garbage_tokenize_falls_back():
    """Answers that are not vLLM's TokenizeResponse are not believed: routed without tokens,
    counted as errors, the request answered."""
    test_slow_tokenize_falls_back([
        (200, b"not json"),
        (200, b'{"count": 2, "max_model_len": 8192, "tokens": [1, -5]}'),
        (200, b'{"count": 3, "max_model_len": 8192, "tokens": [1, 2]}'),
        (200, b'{"count": 1, "tokens": [4294967296]}'),
        (200, b'{"count": 1, "tokens": ["a"]}'),
        (500, b'{"error": "boom"}'),
    ])


if __name__ == "__main__":
    t.run([test_text_prompts_land_where_their_blocks_are, test_slow_tokenize_falls_back,
           test_garbage_tokenize_falls_back])
