"""Clients cannot steer KV: on every protocol, PD control fields in a client body
(kv_transfer_params, bootstrap_*, remote_*, DP ranks, vllm_xargs.kv_transfer_params, ...)
are refused with a 400 naming the field (client_pd_fields: reject, the default) or removed
from every leg (strip), and no engine ever connects to the address the client named. Two
concurrent requests carrying the same client X-Request-Id get different transfer names and
each its own answer.

Why these fields: vLLM reads kv_transfer_params from the body and also through vllm_xargs
(vllm/entrypoints/openai/completion/protocol.py, to_sampling_params: extra_args starts from
vllm_xargs); SGLang reads bootstrap_host/port/room, bootstrap_pair_key, decode_tp_size,
routed_dp_rank, disagg_prefill_dp_rank, data_parallel_rank (python/sglang/srt/managers/
io_struct.py GenerateReqInput). The simulator, like those engines, connects to whatever the
fields name, so a leak would show as a connection on the listener."""

import json
import socket
import threading
import time
import uuid

import pdgwtest as T
import fwdconf
from fwdconf import Gateway, Sim, wait_idle

env = {}


class Listener:
    """A TCP port standing for an address inside the cluster that a client picks: it
    counts every connection made to it."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            c.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def injected(L):
    """Each PD control field a client might send, aimed at the listener / another request."""
    addr = f"http://127.0.0.1:{L}"
    kvp = {"do_remote_prefill": True, "do_remote_decode": False,
           "remote_host": "127.0.0.1", "remote_port": L,
           "remote_engine_id": "client-chosen-engine", "remote_request_id": "client-chosen-req",
           "remote_block_ids": [1, 2], "transfer_id": "client-chosen-xfer",
           "remote_bootstrap_addr": addr,
           "disagg_spec": {"req_id": "client-chosen-req", "receiver_host": "127.0.0.1",
                           "receiver_init_port": [L], "receiver_alloc_port": [L]}}
    return {
        "kv_transfer_params": kvp,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": L,
        "bootstrap_room": 4242424242,
        "bootstrap_pair_key": "client-chosen-pair",
        "decode_tp_size": 1,
        "routed_dp_rank": 0,
        "disagg_prefill_dp_rank": 0,
        "data_parallel_rank": 0,
        "transfer_id": "client-chosen-xfer",
        "disagg_spec": kvp["disagg_spec"],
        "remote_host": "127.0.0.1",
        "remote_port": L,
        "vllm_xargs": {"kv_transfer_params": "client-chosen-xargs"},
    }


CONFIGS = [
    ("neutral", "batch", {}),
    ("vllm-nixl", "batch", {}),
    ("vllm-mooncake", "batch", {}),
    ("vllm-mooncake", "batch", {"mooncake_dispatch": "parallel"}),
    ("vllm-kvt", "batch", {}),
    ("vllm-kvt", "staged", {}),
    ("sglang", "batch", {}),
    ("lmcache", "batch", {"proxy_host": "127.0.0.1"}),
]


def setup():
    env["proxy_port"] = T.free_port()
    px = ["--proxy-host", "127.0.0.1", "--proxy-port", env["proxy_port"]]
    env["both"] = Sim("both", "both")
    env["P"] = Sim("prefill", "prefill-0", *px)
    env["D"] = Sim("decode", "decode-0")
    env["L"] = Listener()


def sims():
    return [env["both"], env["P"], env["D"]]


def gateway(protocol, mode, opts, action):
    opts = dict(opts)
    if protocol == "lmcache":
        opts["proxy_port"] = env["proxy_port"]
    insts = ([env["both"].instance()] if protocol == "neutral"
             else [env["P"].instance(), env["D"].instance()])
    top = {"client_pd_fields": action} if action else None
    return Gateway(protocol, mode, insts, opts, top=top)


def body(prompt=fwdconf.PROMPT, **extra):
    b = {"model": fwdconf.MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
    b.update(extra)
    return b


def reference(prompt):
    st, _, obj, raw = T.post_json(env["both"].port, "/v1/completions", body(prompt))
    assert st == 200, raw
    return obj["choices"][0]["text"]


def legs(rid):
    """Every leg the sims recorded for client request <rid> (matched by X-Sim-Tag)."""
    out = []
    for s in sims():
        for r in s.records(rid):
            if r["path"] in ("/v1/completions", "kvt:compute"):
                out.append((s, r))
    return out


def is_prompt(leg_body, prompt):
    """A leg carries <prompt>: as text, or (lmcache's first_tok flow, LMCache's proxy) as its
    token ids from the engine's /tokenize, the decode with the first token appended."""
    got = leg_body.get("prompt")
    if got == prompt:
        return True
    if not isinstance(got, list):
        return False
    st, _, obj, raw = T.post_json(env["P"].port, "/tokenize", {"prompt": prompt})
    assert st == 200, raw
    return got[:len(obj["tokens"])] == obj["tokens"] and len(got) - len(obj["tokens"]) <= 1


def metric_sum(text, name, labels):
    """Sum of every sample of <name> whose labels include <labels>."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
    return total


CLIENT_ONLY = ("routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank",
               "bootstrap_pair_key", "decode_tp_size", "transfer_id", "disagg_spec",
               "remote_host", "remote_port")


def assert_clean_leg(b, L, where):
    """A leg body: no field only a client would have added, nothing client-chosen inside."""
    for k in CLIENT_ONLY:
        assert k not in b, (where, k, b)
    assert "kv_transfer_params" not in b.get("vllm_xargs", {}), (where, b)
    assert_clean(b, L, where)


def assert_clean(value, L, where):
    """No client-chosen value anywhere in a leg body."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert_clean(v, L, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            assert_clean(v, L, f"{where}[{i}]")
    elif isinstance(value, str):
        assert "client-chosen" not in value and f":{L}" not in value, (where, value)
    elif isinstance(value, int) and not isinstance(value, bool):
        assert value not in (L, 4242424242), (where, value)


def run_reject(protocol, mode, opts):
    """Default config: each field alone gives a 400 naming it; nothing reaches an engine."""
    L = env["L"]
    before = L.accepted
    gw = gateway(protocol, mode, opts, None)
    try:
        fields = injected(L.port)
        for name, value in fields.items():
            rid = "rej-" + uuid.uuid4().hex[:12]
            st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body(**{name: value}),
                                          {"X-Request-Id": rid})
            assert st == 400, (protocol, name, st, raw)
            err = obj["error"]
            want = "vllm_xargs.kv_transfer_params" if name == "vllm_xargs" else name
            assert err["param"] == want, (protocol, name, err)
            assert err["type"] == "invalid_request_error", err
            assert want in err["message"], err
            assert not legs(rid), (protocol, name, legs(rid))
        n = metric_sum(gw.metrics(), "pdgw_client_pd_fields_total",
                       {"protocol": protocol, "action": "rejected"})
        assert n == len(fields), (protocol, n)
        rej = gw.metric("pdgw_rejected_requests_total", {"reason": "client_pd_field"})
        assert rej == len(fields), rej
    finally:
        gw.stop()
    assert L.accepted == before, ("the client-chosen address saw a connection", protocol)


def run_strip(protocol, mode, opts):
    """strip: the request succeeds with the right answer and no leg carries a client value;
    the engines never connect to the client's address."""
    L = env["L"]
    before = L.accepted
    want = env["ref"][fwdconf.PROMPT]
    gw = gateway(protocol, mode, opts, "strip")
    try:
        rid = "strip-" + uuid.uuid4().hex[:12]
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions",
                                      body(**injected(L.port)), {"X-Request-Id": rid})
        assert st == 200, (protocol, st, raw)
        assert obj["choices"][0]["text"] == want, (protocol, obj)
        got = legs(rid)
        assert got, (protocol, "no legs recorded")
        for s, r in got:
            assert_clean_leg(r["body"], L.port, f"{protocol}:{s.name}")
            if r.get("kv_result"):
                assert r["kv_result"]["ok"] and not r["kv_result"]["recompute"], r
        n = metric_sum(gw.metrics(), "pdgw_client_pd_fields_total",
                       {"protocol": protocol, "action": "stripped"})
        assert n == len(injected(L.port)), (protocol, n)
        wait_idle(sims())
    finally:
        gw.stop()
    assert L.accepted == before, ("the client-chosen address saw a connection", protocol)


def transfer_name(protocol, P_legs, D_legs):
    """The name the gateway gave the KV transfer of one request, from what the sims saw."""
    pb = P_legs[0]["body"] if P_legs else None
    db = D_legs[0]["body"]
    if protocol == "vllm-mooncake" and "transfer_id" in pb["kv_transfer_params"]:
        return pb["kv_transfer_params"]["transfer_id"]
    if protocol in ("vllm-nixl", "vllm-mooncake"):  # mooncake serial: NIXL-style params
        return db["kv_transfer_params"]["remote_request_id"]
    if protocol == "vllm-kvt":
        return D_legs[0]["request_id"]
    if protocol == "sglang":
        return db["bootstrap_room"]
    if protocol == "lmcache":
        return pb["kv_transfer_params"]["disagg_spec"]["req_id"]
    return D_legs[0]["request_id"]  # neutral: the X-Request-Id the engine saw


def run_same_client_id(protocol, mode, opts):
    """Two concurrent requests with one client X-Request-Id and different prompts: each gets
    its own answer, and the sims saw two different transfer names."""
    prompts = [fwdconf.PROMPT, "A different prompt, so a swapped cache would show in the text."]
    gw = gateway(protocol, mode, opts, None)
    try:
        rid = "same-" + uuid.uuid4().hex[:12]
        results = [None, None]

        def go(i):
            results[i] = T.post_json(gw.port, "/v1/completions", body(prompts[i]),
                                     {"X-Request-Id": rid})

        ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i in range(2):
            st, hdrs, obj, raw = results[i]
            assert st == 200, (protocol, raw)
            assert obj["choices"][0]["text"] == env["ref"][prompts[i]], (protocol, i, obj)
            assert hdrs.get("x-request-id") == rid, hdrs
        names = set()
        ids = set()
        for prompt in prompts:
            D_side = "both" if protocol == "neutral" else "decode-0"
            dl = [r for s, r in legs(rid) if s.name == D_side and is_prompt(r["body"], prompt)]
            pl = [r for s, r in legs(rid) if s.name == "prefill-0" and
                  is_prompt(r["body"], prompt)]
            if protocol == "vllm-kvt" and mode == "batch":
                pl = []  # the prefill computes on the decode's request: no leg of its own
            assert len(dl) == 1, (protocol, prompt, dl)
            if dl[0].get("kv_result"):
                assert dl[0]["kv_result"]["ok"] and not dl[0]["kv_result"]["recompute"], dl[0]
            names.add(json.dumps(transfer_name(protocol, pl, dl)))
            ids.add(dl[0]["request_id"])
        assert len(names) == 2, (protocol, names)
        assert len(ids) == 2 and rid not in ids, (protocol, ids)
        wait_idle(sims())
    finally:
        gw.stop()


def test_pass_only_for_plain_proxy():
    """client_pd_fields: pass is an operator opt-in for neutral; a PD protocol refuses it."""
    L = env["L"]
    gw = gateway("neutral", "batch", {}, "pass")
    try:
        rid = "pass-" + uuid.uuid4().hex[:12]
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions",
                                      body(bootstrap_room=7, routed_dp_rank=0),
                                      {"X-Request-Id": rid})
        assert st == 200, raw
        (s, r), = legs(rid)
        assert r["body"]["bootstrap_room"] == 7 and r["body"]["routed_dp_rank"] == 0, r
        n = metric_sum(gw.metrics(), "pdgw_client_pd_fields_total",
                       {"protocol": "neutral", "action": "passed"})
        assert n == 2, n
    finally:
        gw.stop()
    import subprocess
    port = T.free_port()
    r = subprocess.run([T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--protocol",
                        "vllm-nixl", "--client-pd-fields", "pass",
                        "--prefill", env["P"].url(), "--decode", env["D"].url()],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0, r
    assert "client_pd_fields" in r.stderr + r.stdout, r
    assert L.accepted == 0


def test_forwarder_declared_fields():
    """A forwarder's own PD fields (descriptor client_fields, here the example plugin's
    example_peer and example_route_*) are refused like the built-in ones."""
    import os
    plugin = os.path.join(os.path.dirname(T.binary("pdgw")), "..", "tests", "plugins",
                          "fwd_example_ok.so")
    if not os.path.exists(plugin):
        raise FileNotFoundError(plugin)
    gw = Gateway("example-serial", "batch", [env["P"].instance(), env["D"].instance()], {},
                 extra=("--plugin", plugin))
    try:
        for name in ("example_peer", "example_route_to"):
            st, _, obj, raw = T.post_json(gw.port, "/v1/completions",
                                          body(**{name: f"127.0.0.1:{env['L'].port}"}))
            assert st == 400 and obj["error"]["param"] == name, (name, raw)
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body(example_other=1))
        assert st == 200, raw
    finally:
        gw.stop()


def make(kind, protocol, mode, opts):
    fn = {"reject": run_reject, "strip": run_strip, "same_id": run_same_client_id}[kind]

    def t():
        fn(protocol, mode, opts)
    shape = opts.get("mooncake_dispatch", "")
    t.__name__ = f"test_{kind}_{protocol}_{shape + '_' if shape else ''}{mode}".replace("-", "_")
    return t


def main():
    setup()
    env["ref"] = {p: reference(p) for p in (
        fwdconf.PROMPT, "A different prompt, so a swapped cache would show in the text.")}
    tests = []
    for protocol, mode, opts in CONFIGS:
        for kind in ("reject", "strip", "same_id"):
            tests.append(make(kind, protocol, mode, opts))
    tests.append(test_pass_only_for_plain_proxy)
    tests.append(test_forwarder_declared_fields)
    from test_fwd_matrix import run
    try:
        run(tests)
    finally:
        env["L"].close()


if __name__ == "__main__":
    main()
