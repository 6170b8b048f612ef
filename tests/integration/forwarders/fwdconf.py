"""Shared pieces of the PD forwarder conformance tests: pdgw-sim instances, a pdgw per
protocol/mode (YAML config with every instance field), the expected kv_transfer_params of
each leg (docs/protocols/) and the checks every case makes."""

import json
import os
import tempfile
import time
import uuid

import pdgwtest as T

MODEL = "sim-model"
PROMPT = ("Disaggregated serving splits the prompt phase from the token phase so that each "
          "runs on hardware sized for it, and the cache of keys and values moves between.")
SIM_TIMING = ["--ttft-ms", "5", "--tpot-ms", "1"]

NIXL_PREFILL_KVP = {"do_remote_decode": True, "do_remote_prefill": False,
                    "remote_engine_id": None, "remote_block_ids": None,
                    "remote_host": None, "remote_port": None}


class Sim:
    """One pdgw-sim and the ports it was given."""

    def __init__(self, role, name, *extra, tp=1, timeout=10):
        for attempt in range(4):
            self.role, self.name = role, name
            self.port = T.free_port()
            self.kv_port = T.free_port() if role == "prefill" else 0
            self.boot_port = T.free_port() if role == "prefill" else 0
            self.alloc_ports = [T.free_port() for _ in range(tp)] if role == "decode" else []
            self.init_ports = [T.free_port() for _ in range(tp)] if role == "decode" else []
            self.engine_id = f"{name}-{self.port}"
            argv = [T.binary("pdgw-sim"), "--role", role, "--port", str(self.port),
                    "--engine-id", self.engine_id, *SIM_TIMING]
            if role == "prefill":
                argv += ["--kv-port", str(self.kv_port), "--bootstrap-port", str(self.boot_port)]
            if role == "decode":
                # LMCache's example decoders run with skip_last_n_tokens: 1 (its proxy appends
                # the prefill's first token to the prompt; LMCache examples/disagg_prefill/
                # */disagg_vllm_launcher.sh)
                argv += ["--alloc-port", ",".join(map(str, self.alloc_ports)),
                         "--init-port", ",".join(map(str, self.init_ports)),
                         "--skip-last-n-tokens", "1"]
            argv += [str(a) for a in extra]
            self.proc = T.Proc(name, argv)
            try:
                T.wait_http(self.port, "/health", timeout=timeout, proc=self.proc)
                return
            except RuntimeError as e:
                self.proc.kill()
                if "in use" not in str(e) or attempt == 3:
                    raise

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def instance(self):
        inst = {"id": self.name, "url": self.url(), "role": self.role,
                "engine_id": self.engine_id}
        if self.role == "prefill":
            inst.update(kv_port=self.kv_port, bootstrap_port=self.boot_port)
        if self.role == "decode":
            # pdgw-sim embeds libkvt: pdgw's extensions (ReserveRequest) are allowed
            inst.update(alloc_ports=self.alloc_ports, init_ports=self.init_ports,
                        tp_size=len(self.alloc_ports), kv_engine="libkvt")
        return inst

    def metrics(self):
        st, _, body = T.request("GET", self.port, "/metrics")
        assert st == 200
        return body.decode()

    def metric(self, name, labels=None):
        return T.metric_value(self.metrics(), name, labels) or 0.0

    def records(self, rid):
        st, _, body = T.request("GET", self.port, f"/sim/requests?request_id={rid}")
        assert st == 200
        return json.loads(body)["requests"]


def yaml_scalar(v):
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return json.dumps(v)  # a flow mapping
    return json.dumps(str(v))


class Gateway:
    """pdgw with a YAML config naming every instance field the forwarders read."""

    def __init__(self, protocol, mode, instances, opts=None, extra=(), retries=1, top=None,
                 env=None, timeout=10):
        self.protocol, self.mode = protocol, mode
        self.port = T.free_port()
        lines = [f'listen: "127.0.0.1:{self.port}"', "workers: 2",
                 f"protocol: {protocol}", f"scheduling: {mode}", f"retries: {retries}",
                 "health_interval: 500ms", "health_timeout: 500ms", "metrics_scrape_interval: 200ms",
                 "log_level: warn"]
        for k, v in (top or {}).items():
            lines = [ln for ln in lines if not ln.startswith(f"{k}:")]  # top overrides
            lines.append(f"{k}: {yaml_scalar(v)}")
        lines.append("protocol_options:")
        for k, v in (opts or {}).items():
            lines.append(f"  {k}: {yaml_scalar(v)}")
        if not opts:
            lines[-1] = "protocol_options: {}"
        lines.append("instances:")
        for inst in instances:
            first = True
            for k, v in inst.items():
                lines.append(("  - " if first else "    ") + f"{k}: {yaml_scalar(v)}")
                first = False
        fd, self.cfg = tempfile.mkstemp(prefix="pdgw-fwd-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = T.Proc(f"pdgw-{protocol}-{mode}",
                           [T.binary("pdgw"), "--config", self.cfg, *extra], env=env)
        try:
            T.wait_http(self.port, "/health", timeout=timeout, proc=self.proc)
            T.wait_http(self.port, "/ready", timeout=timeout, proc=self.proc)
        except Exception:
            print(self.proc.output()[-3000:])
            self.proc.kill()
            os.unlink(self.cfg)
            raise

    def metrics(self):
        st, _, body = T.request("GET", self.port, "/metrics")
        assert st == 200
        return body.decode()

    def metric(self, name, labels=None):
        return T.metric_value(self.metrics(), name, labels) or 0.0

    def stop(self):
        try:
            self.proc.signal(15)
            rc = self.proc.wait(timeout=20)
            out = self.proc.output()
            assert rc == 0, f"pdgw exited {rc}:\n{out[-3000:]}"
            assert "LeakSanitizer" not in out and "AddressSanitizer" not in out, out[-3000:]
        finally:
            self.proc.kill()
            os.unlink(self.cfg)


def path_of(chat):
    return "/v1/chat/completions" if chat else "/v1/completions"


def client_body(chat, stream):
    if chat:
        b = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
             "max_tokens": 9, "seed": 3, "temperature": 0.7}
    else:
        b = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True,
             "stop": ["never-in-output"]}
    b["stream"] = stream
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def reference(both, chat):
    """Text and usage a `both` instance produces for the same request."""
    b = client_body(chat, False)
    st, _, obj, raw = T.post_json(both.port, path_of(chat), b)
    assert st == 200, raw
    ch = obj["choices"][0]
    return (ch["message"]["content"] if chat else ch["text"]), obj["usage"]


def send(gw, chat, stream, rid):
    """One request through pdgw; returns (text, usage, response headers)."""
    body = client_body(chat, stream)
    hdr = {"X-Request-Id": rid}
    if stream:
        evs = list(T.sse_events(gw.port, path_of(chat), body, hdr))
        assert evs[-1] == "[DONE]", evs[-3:]
        usage = None
        for ev in evs[:-1]:
            obj = json.loads(ev)
            assert "error" not in obj, obj
            if obj.get("usage"):
                usage = obj["usage"]
        return T.stream_text(evs), usage, {}
    st, hdrs, obj, raw = T.post_json(gw.port, path_of(chat), body, hdr)
    assert st == 200, (st, raw)
    ch = obj["choices"][0]
    return (ch["message"]["content"] if chat else ch["text"]), obj.get("usage"), hdrs


def check_hardened(body, client):
    """docs/protocols/README.md, hardened prefill leg on a recorded prefill body."""
    assert body["max_tokens"] == 1, body
    assert body["stream"] is False, body
    assert body.get("ignore_eos") is True, body
    for k in ("stream_options", "min_tokens", "min_completion_tokens", "stop", "stop_token_ids"):
        assert k not in body, (k, body)
    for k, v in client.items():
        if k not in ("max_tokens", "stream", "stream_options", "stop", "kv_transfer_params"):
            assert body.get(k) == v, (k, body.get(k), v)


def leg_records(sim, rid, chat):
    # lmcache's first_tok flow sends chat requests to /v1/completions as token ids
    return [r for r in sim.records(rid)
            if r["path"] in (path_of(chat), "/v1/completions", "kvt:compute")]


def expect_legs(protocol, opts, mode, rid, chat, P, D, prec, drec):
    """The fields each leg received, field by field (docs/protocols/)."""
    pb = prec["body"] if prec and prec["path"] != "kvt:compute" else None
    db = drec["body"]
    client = client_body(chat, False)
    leg_id = drec["request_id"]  # transfer names derive from the gateway-minted id
    first_tok = protocol == "lmcache" and opts.get("flow", "first_tok") == "first_tok"
    if pb is not None and first_tok:
        # LMCache's proxy: the client's request with max_tokens 1 and stream false; its one
        # token is the answer's first, so ignore_eos and stop stay as the client sent them
        assert pb["max_tokens"] == 1 and pb["stream"] is False, pb
        for k in ("stream_options", "min_tokens", "min_completion_tokens", "messages"):
            assert k not in pb, (k, pb)
        for k, v in client.items():
            if k not in ("max_tokens", "stream", "prompt", "messages"):
                assert pb.get(k) == v, (k, pb.get(k), v)
    elif pb is not None and protocol == "sglang":
        # sgl-project/sglang python/sglang/srt/disaggregation/mini_lb.py sends both legs the
        # same body: SGLang's prefill samples the answer's first token with the client's
        # settings (decode_schedule_batch_mixin.py: the decode appends it); pdgw only turns
        # off streaming of the drained prefill answer
        assert pb["stream"] is False and "stream_options" not in pb, pb
        for k, v in client.items():
            if k != "stream":
                assert pb.get(k) == v, (k, pb.get(k), v)
    elif pb is not None:
        check_hardened(pb, client)
    if protocol == "vllm-nixl" or (protocol == "vllm-mooncake" and
                                   opts.get("mooncake_dispatch") == "serial"):
        assert pb["kv_transfer_params"] == NIXL_PREFILL_KVP, pb
        back = prec["response_kv_transfer_params"]
        for k in ("do_remote_prefill", "do_remote_decode", "remote_block_ids",
                  "remote_engine_id", "remote_request_id", "remote_host", "remote_port",
                  "tp_size"):
            assert k in back, (k, back)
        assert db["kv_transfer_params"] == back, (db, back)
    elif protocol == "vllm-mooncake":
        # upstream vLLM examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py:
        # transfer_id "xfer-<request uuid>", engine id from the prefill's bootstrap /query
        tid = pb["kv_transfer_params"]["transfer_id"]
        assert tid == f"xfer-{leg_id}", tid
        assert pb["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                            "transfer_id": tid}, pb
        assert db["kv_transfer_params"] == {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_bootstrap_addr": f"http://127.0.0.1:{P.boot_port}",
            "remote_engine_id": P.engine_id, "transfer_id": tid}, db
    elif protocol == "vllm-kvt" and mode == "batch":
        assert prec["path"] == "kvt:compute", prec
        assert db["kv_transfer_params"] == {"remote_host": "127.0.0.1",
                                            "remote_port": P.kv_port}, db
    elif protocol == "vllm-kvt":
        assert pb["kv_transfer_params"] == {"do_remote_decode": True}, pb
        assert db["kv_transfer_params"] == {"do_remote_prefill": True,
                                            "remote_host": "127.0.0.1",
                                            "remote_port": P.kv_port}, db
    elif protocol == "sglang":
        for b in (pb, db):
            assert b["bootstrap_host"] == "127.0.0.1", b
            assert b["bootstrap_port"] == P.boot_port, b
            assert "kv_transfer_params" not in b, b
        room = db["bootstrap_room"]
        assert isinstance(room, int) and 0 <= room < 2 ** 63, room
        assert pb["bootstrap_room"] == room, (pb, db)
    elif protocol == "lmcache":
        spec = {"req_id": leg_id, "receiver_host": "127.0.0.1",
                "receiver_init_port": D.init_ports, "receiver_alloc_port": D.alloc_ports}
        assert "kv_transfer_params" not in db, db
        if first_tok:
            # LMCache examples/disagg_prefill/disagg_proxy_server.py: both legs to
            # /v1/completions with the prompt's token ids (from /tokenize); the prefill asks
            # ret_first_tok, the decode gets ids + [first_tok] and max_tokens - 1
            assert pb["kv_transfer_params"] == {"ret_first_tok": True, "disagg_spec": spec}, pb
            assert prec["path"] == drec["path"] == "/v1/completions", (prec["path"], drec["path"])
            if not chat and opts.get("prompt_ids", "prefill") == "prefill":
                # vLLM vllm/entrypoints/openai/completion/protocol.py (return_token_ids) and
                # completion/serving.py (the answer's choices[0].prompt_token_ids): a text
                # prompt goes to the prefill as it is and its answer gives the ids, no /tokenize
                assert pb["prompt"] == client["prompt"] and pb["return_token_ids"] is True, pb
                st, _, tok, raw = T.post_json(P.port, "/tokenize", {"prompt": client["prompt"]})
                assert st == 200, raw
                ids = tok["tokens"]
            else:
                ids = pb["prompt"]
                assert "return_token_ids" not in pb, pb
            assert ids and all(isinstance(i, int) for i in ids), pb
            assert "messages" not in pb and "messages" not in db, (pb, db)
            first = prec["response_kv_transfer_params"]["first_tok"]
            assert db["prompt"] == ids + [first], (db["prompt"], ids, first)
            # the first token ended the answer (pdgw-sim's EOS id 2): one token is enough
            ended = first == 2
            assert db["max_tokens"] == (1 if ended else client["max_tokens"] - 1), db
            client = {k: v for k, v in client.items()
                      if k not in ("prompt", "messages", "max_tokens")}
        else:
            assert pb["kv_transfer_params"] == {"disagg_spec": spec}, pb
    else:
        raise AssertionError(protocol)
    # the decode got the client's request otherwise unchanged
    for k, v in client.items():
        if k not in ("stream", "stream_options"):
            assert db.get(k) == v, (k, db.get(k), v)


def wait_idle(sims, timeout=5.0):
    """Nothing pinned, used, running or waiting on any sim (releases are asynchronous)."""
    deadline = time.time() + timeout
    while True:
        bad = []
        for s in sims:
            text = s.metrics()
            for name in ("sim_kv_pages_pinned", "sim_kv_pages_used", "sim_kv_blocks_used",
                         "vllm:num_requests_running", "vllm:num_requests_waiting"):
                v = T.metric_value(text, name)
                if v:
                    bad.append((s.name, name, v))
        if not bad:
            return
        if time.time() > deadline:
            raise AssertionError(f"not idle: {bad}")
        time.sleep(0.05)


def run_case(gw, opts, chat, stream, prefills, decodes, both, refs):
    """One request shape through pdgw; every check of the conformance matrix."""
    rid = "fc-" + uuid.uuid4().hex[:16]
    text, usage, hdrs = send(gw, chat, stream, rid)
    want, want_usage = refs[chat]
    assert text == want, (gw.protocol, gw.mode, chat, stream, text, want)
    assert usage == want_usage, (usage, want_usage)  # as the decode reported it
    if hdrs:
        assert hdrs.get("x-request-id") == rid, hdrs
    # which instances served it
    dl = [(d, leg_records(d, rid, chat)) for d in decodes]
    dl = [(d, r) for d, r in dl if r]
    # a prefill driven by the decode (vllm-kvt batch) knows only the minted id
    minted = {r["request_id"] for _, recs in dl for r in recs}
    pl = [(p, list({r["seq"]: r for key in (rid, *minted)
                    for r in leg_records(p, key, chat)}.values()))
          for p in prefills]
    pl = [(p, r) for p, r in pl if r]
    assert len(pl) == 1 and len(pl[0][1]) == 1, ("prefill legs", pl)
    assert len(dl) == 1 and len(dl[0][1]) == 1, ("decode legs", dl)
    P, prec = pl[0][0], pl[0][1][0]
    D, drec = dl[0][0], dl[0][1][0]
    # both legs carried the same gateway-minted X-Request-Id, never the client's
    assert prec["request_id"] == drec["request_id"] != rid, (prec, drec)
    assert uuid.UUID(drec["request_id"]).version == 4, drec["request_id"]
    # the decode verified its KV
    res = drec.get("kv_result")
    assert res and res["ok"] and not res["recompute"], drec
    assert res["verify_failures"] == 0 and res["bytes"] > 0, res
    expect_legs(gw.protocol, opts, gw.mode, rid, chat, P, D, prec, drec)
    return P, D
