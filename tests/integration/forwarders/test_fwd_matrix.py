"""Conformance matrix of the PD forwarders: every protocol x {batch, staged} x {stream,
non-stream} x {completions, chat}, through a real pdgw to pdgw-sim, 1P1D and 2P2D.

The sims start once; each protocol/mode gets its own pdgw (1P1D, then 2P2D with round-robin
selection) and runs every request shape. Each case asserts the text (and usage) equals a
`both` instance's, the decode verified its KV, each leg's fields per docs/protocols/, the same
X-Request-Id on both legs, and afterwards nothing pinned or used on any sim."""

import subprocess
import uuid

import pdgwtest as T
import fwdconf
from fwdconf import Gateway, Sim, reference, run_case, wait_idle

SHAPES = [(chat, stream) for chat in (False, True) for stream in (False, True)]
CONFIGS = [
    ("vllm-nixl", "batch", {}),
    ("vllm-nixl", "staged", {}),
    ("vllm-mooncake", "batch", {}),
    ("vllm-mooncake", "staged", {}),
    ("vllm-mooncake", "batch", {"mooncake_dispatch": "serial"}),
    ("vllm-mooncake", "staged", {"mooncake_dispatch": "serial"}),
    ("vllm-kvt", "batch", {}),
    ("vllm-kvt", "staged", {}),
    ("sglang", "batch", {}),
    ("sglang", "staged", {}),
    ("lmcache", "batch", {"proxy_host": "127.0.0.1"}),
    # LMCache's own proxy: the ids from /tokenize before the prefill
    ("lmcache", "batch", {"proxy_host": "127.0.0.1", "prompt_ids": "tokenize"}),
]

counts = {"cases": 0}
env = {}


def setup():
    env["proxy_port"] = T.free_port()
    px = ["--proxy-host", "127.0.0.1", "--proxy-port", env["proxy_port"]]
    env["both"] = Sim("both", "both")
    env["P"] = [Sim("prefill", "prefill-0", *px), Sim("prefill", "prefill-1", *px)]
    env["D"] = [Sim("decode", "decode-0"), Sim("decode", "decode-1", tp=2)]
    env["refs"] = {chat: reference(env["both"], chat) for chat in (False, True)}


def all_sims():
    return [env["both"], *env["P"], *env["D"]]


def run_config(protocol, mode, opts, n):
    opts = dict(opts)
    if protocol == "lmcache":
        opts["proxy_port"] = env["proxy_port"]
    if protocol in ("vllm-kvt", "lmcache") and mode == "batch":
        # A reservation answered after reserve_timeout_ms mutes that decode for 5 s and the
        # requests go on unreserved (by design); a loaded machine must not turn that into a
        # failed count below.
        opts = dict(opts, reserve_timeout_ms=15000)
    prefills, decodes = env["P"][:n], env["D"][:n]
    gw = Gateway(protocol, mode, [s.instance() for s in prefills + decodes], opts,
                 top={"prefill_policy": "round-robin", "decode_policy": "round-robin"})
    used = set()
    try:
        for chat, stream in SHAPES * (2 if n > 1 else 1):
            P, D = run_case(gw, opts, chat, stream, prefills, decodes, env["both"], env["refs"])
            used.update((P.name, D.name))
            counts["cases"] += 1
        wait_idle(all_sims())
        text = gw.metrics()
        missing = T.metric_value(text, "pdgw_prefill_missing_kv_params_total",
                                 {"protocol": protocol})
        assert not missing, ("prefill without kv_transfer_params", missing)
        cancels = T.metric_value(text, "pdgw_pd_cancel_notifs_total", {"protocol": protocol})
        assert not cancels, ("CancelNotif on the success path", cancels)
        # phase metrics, per protocol, as the gateway saw them
        ncases = len(SHAPES) * (2 if n > 1 else 1)
        lab = {"protocol": protocol}
        dec = T.metric_value(text, "pdgw_decode_seconds_count", lab)
        pre = T.metric_value(text, "pdgw_prefill_seconds_count", lab) or 0
        kvw = T.metric_value(text, "pdgw_kv_wait_seconds_count", lab) or 0
        assert dec == ncases, ("pdgw_decode_seconds", dec, ncases)
        serial = (protocol in ("vllm-nixl", "lmcache") or
                  (protocol == "vllm-mooncake" and opts.get("mooncake_dispatch") == "serial") or
                  (protocol == "vllm-kvt" and mode == "staged"))
        if serial:
            assert pre == ncases and kvw == ncases, ("prefill/kv_wait", pre, kvw, ncases)
        elif protocol == "vllm-kvt":
            assert pre == 0, ("single-stage has no prefill leg", pre)
        else:
            assert pre <= ncases and kvw <= ncases, (pre, kvw, ncases)
        if n > 1:
            assert used == {"prefill-0", "prefill-1", "decode-0", "decode-1"}, used
        if protocol in ("vllm-kvt", "lmcache") and mode == "batch":
            granted = T.metric_value(text, "pdgw_fwd_reserve_granted_total",
                                     {"protocol": protocol})
            assert granted == len(SHAPES) * (2 if n > 1 else 1), ("reservations", granted)
    finally:
        gw.stop()


def make_test(protocol, mode, opts, n):
    def t():
        run_config(protocol, mode, opts, n)
    shape = opts.get("mooncake_dispatch", opts.get("prompt_ids", ""))
    t.__name__ = f"test_{protocol}_{shape + '_' if shape else ''}{mode}_{n}p{n}d".replace("-", "_")
    return t


def test_lmcache_staged_refused():
    """lmcache's prefill leg names the decode's receiver: staged scheduling is refused."""
    port = T.free_port()
    r = subprocess.run([T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--protocol",
                        "lmcache", "--scheduling", "staged", "--protocol-opt",
                        "proxy_host=127.0.0.1", "--protocol-opt", "proxy_port=0",
                        "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0, r
    out = r.stderr + r.stdout
    assert ("lmcache needs --scheduling batch" in out or
            "protocol lmcache does not support staged scheduling" in out), out



def test_stop_on_first_token():
    """docs/protocols/README.md, hardened prefill leg: the client's stop string matches the very first token. The prefill
    leg goes without `stop` and with ignore_eos, so it still returns kv_transfer_params; the
    decode applies the stop: the answer equals the `both` instance's."""
    both, P, D = env["both"], env["P"][0], env["D"][0]
    first = env["refs"][False][0].split()[0]
    body = {"model": "sim-model", "prompt": fwdconf.PROMPT, "max_tokens": 12,
            "stop": [first]}
    st, _, ref, raw = T.post_json(both.port, "/v1/completions", body)
    assert st == 200, raw
    for protocol in ("vllm-nixl", "vllm-mooncake"):
        gw = Gateway(protocol, "batch", [P.instance(), D.instance()],
                     {"mooncake_dispatch": "serial"} if protocol == "vllm-mooncake" else {})
        try:
            rid = "stop-" + uuid.uuid4().hex[:12]
            st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body, {"X-Request-Id": rid})
            assert st == 200, raw
            assert obj["choices"][0]["text"] == ref["choices"][0]["text"], (obj, ref)
            assert obj["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
            prec = P.records(rid)[0]
            assert "stop" not in prec["body"] and prec["body"]["ignore_eos"] is True, prec
            assert prec["response_kv_transfer_params"], prec
            assert D.records(rid)[0]["kv_result"]["ok"], D.records(rid)
            assert not gw.metric("pdgw_prefill_missing_kv_params_total",
                                 {"protocol": protocol})
            wait_idle(all_sims())
        finally:
            gw.stop()

def test_matrix_count():
    want = sum(len(SHAPES) * (1 + 2) for _ in CONFIGS)
    assert counts["cases"] == want, (counts, want)
    print(f"conformance matrix: {counts['cases']} cases passed "
          f"({len(CONFIGS)} protocol/mode configs x {len(SHAPES)} shapes, 1P1D + 2P2D x2)")


def main():
    setup()
    tests = []
    for protocol, mode, opts in CONFIGS:
        tests.append(make_test(protocol, mode, opts, 1))
        tests.append(make_test(protocol, mode, opts, 2))
    tests += [test_lmcache_staged_refused, test_stop_on_first_token, test_matrix_count]
    # the sims live across tests: T.run cleans processes up after each test, so run here
    run(tests)


def run(tests):
    import sys
    import time
    import traceback
    passed = failed = 0
    try:
        for t in tests:
            start = time.time()
            try:
                t()
                passed += 1
                print(f"[ PASS ] {t.__name__} ({time.time() - start:.2f}s)", flush=True)
            except Exception:
                failed += 1
                print(f"[ FAIL ] {t.__name__}", flush=True)
                traceback.print_exc()
                for p in list(T._live):
                    if p.name.startswith("pdgw") or failed < 2:
                        print(f"---- log of {p.name} ----")
                        print(p.output()[-4000:])
    finally:
        T._cleanup()
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
