"""lmcache forwarder: what the gateway sends to an LMCache decode, and who may release it.

Upstream facts encoded here (LMCache/LMCache):
- examples/disagg_prefill/disagg_proxy_server.py: the proxy binds a ZMQ PULL on
  proxy_host:proxy_port, decodes every message as LMCache's PDMsg and counts
  ProxyNotif.req_id; it sends nothing to a decode's alloc port.
- lmcache/v1/storage_backend/pd_backend.py: a sender PUSHes ProxyNotif{req_id} (msgpack map,
  "type" first) to the proxy after its last chunk; a receiver's alloc port understands only
  LMCache's own message union (AllocRequest, AllocResponse, ProxyNotif; the async backend
  also CancelNotif), each after an empty delimiter frame (REQ/DEALER framing).
- examples/disagg_prefill/disagg_proxy_server.py (current flow): /tokenize, prefill with
  kv_transfer_params {ret_first_tok, disagg_spec} answering kv_transfer_params.first_tok
  (lmcache/integration/vllm/vllm_v1_adapter.py request_finished), decode with prompt
  ids + [first_tok] and max_tokens - 1; the client first gets a chunk with the prefill's
  text, id, created and model (chat: a role chunk, then a content chunk).
vLLM (vllm-project/vllm): vllm/entrypoints/openai/completion/protocol.py has return_token_ids
on CompletionRequest, and completion/serving.py answers it with choices[0].prompt_token_ids
(the prompt as the engine tokenized it, after truncation) and token_ids; an engine from before
the field ignores it (its answer has no prompt_token_ids).
ReserveRequest and delimiter-less frames are pdgw extensions: only for kv_engine: libkvt.
"""

import json
import os
import sys
import tempfile
import threading
import time
import uuid

import msgpack
import zmq

import pdgwtest as T
from fwdconf import Gateway, Sim, client_body, path_of

env = {}


def setup():
    env["proxy_port"] = T.free_port()
    env["dead_port"] = T.free_port()
    px = ["--proxy-host", "127.0.0.1", "--proxy-port"]
    # a slow prefill: its ProxyNotif comes ~1.5 s after the leg started
    env["slowP"] = Sim("prefill", "lmc-prefill-slow", *px, env["proxy_port"], "--ttft-ms", "1500")
    # a prefill whose ProxyNotifs go nowhere (an engine with pd_skip_proxy_notification)
    env["silentP"] = Sim("prefill", "lmc-prefill-silent", *px, env["dead_port"],
                         "--kv-hold-timeout-ms", "1500")
    env["D"] = Sim("decode", "lmc-decode", "--kv-wait-timeout-ms", "3000")
    env["P"] = Sim("prefill", "lmc-prefill", *px, env["proxy_port"])
    # a vLLM from before return_token_ids, its /tokenize calls recorded
    env["Pold"] = Sim("prefill", "lmc-prefill-old", *px, env["proxy_port"],
                      "--no-return-token-ids", "--record-tokenize")
    # the older flow's decoders look up the whole prompt (skip_last_n_tokens 0, the default of
    # LMCache's connector)
    env["D0"] = Sim("decode", "lmc-decode-noskip", "--kv-wait-timeout-ms", "3000",
                    "--skip-last-n-tokens", "0")
    env["both"] = Sim("both", "lmc-both")


class AllocPortRecorder:
    """Stands in for a decode's alloc port (ZMQ ROUTER): records every multipart message
    with the sender's routing id, answers AllocRequest with a failed AllocResponse (so a
    sender never hangs) and ReserveRequest with a grant."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.frames = []  # (routing id, [frames after it])
        self.stop = False
        self.th = threading.Thread(target=self.serve, daemon=True)
        self.th.start()

    def serve(self):
        while not self.stop:
            if not self.sock.poll(50):
                continue
            parts = self.sock.recv_multipart()
            ident, rest = parts[0], parts[1:]
            self.frames.append((ident, rest))
            try:
                m = msgpack.unpackb(rest[-1], raw=False)
            except Exception:
                continue
            if not isinstance(m, dict):
                continue
            head = [b""] if len(rest) == 2 and rest[0] == b"" else []
            if m.get("type") == "AllocRequest":
                self.sock.send_multipart([ident, *head, msgpack.packb(
                    {"type": "AllocResponse", "already_sent_indexes": [],
                     "remote_indexes": [-1] * len(m.get("keys", []))})])
            elif m.get("type") == "ReserveRequest":
                self.sock.send_multipart([ident, *head, msgpack.packb(
                    {"type": "ReserveResponse", "req_id": m["req_id"], "granted": True,
                     "free_chunks": 100})])

    def messages(self):
        """[(routing id, has LMCache's empty delimiter, decoded type or None)]"""
        out = []
        for ident, rest in list(self.frames):
            try:
                m = msgpack.unpackb(rest[-1], raw=False)
                typ = m.get("type") if isinstance(m, dict) else None
            except Exception:
                typ = None
            out.append((ident, len(rest) == 2 and rest[0] == b"", typ))
        return out

    def close(self):
        self.stop = True
        self.th.join()
        self.sock.close(0)
        self.ctx.term()


def run_failing_request(gw):
    """A request whose ProxyNotif never comes: 504 at the deadline, attempt cleanup runs
    (the path that releases a libkvt decode with CancelNotif)."""
    rid = "lu-" + uuid.uuid4().hex[:12]
    st, _, data = T.request("POST", gw.port, path_of(False), client_body(False, False),
                            {"X-Request-Id": rid})
    assert st == 504, (st, data)


def gateway_messages(rec):
    """Messages from the gateway (libkvt's proxy client names its DEALERs proxy-<pid>-<n>);
    the prefill's own sender is not the gateway's business."""
    return [m for m in rec.messages() if m[0].startswith(b"proxy-")]


def test_upstream_decode_gets_only_upstream_messages():
    """A decode not declared libkvt (kv_engine default: lmcache) gets no ReserveRequest and
    no delimiter-less CancelNotif; the same decode declared libkvt does (control: the
    recorder sees pdgw's extensions, so the check can fail)."""
    P, D = env["silentP"], env["D"]
    for kv_engine in ("lmcache", "libkvt"):
        rec = AllocPortRecorder()
        inst = dict(D.instance(), alloc_ports=[rec.port])
        if kv_engine == "lmcache":
            del inst["kv_engine"]  # the default: an upstream LMCache receiver
        gw = Gateway("lmcache", "batch", [P.instance(), inst],
                     {"proxy_host": "127.0.0.1", "proxy_port": T.free_port(),
                      "notif_timeout_ms": 500, "reserve_timeout_ms": 500}, retries=0)
        try:
            run_failing_request(gw)
            time.sleep(0.3)  # a CancelNotif is sent after the reply (nothing to wait on)
            msgs = rec.messages()
            mine = gateway_messages(rec)
            if kv_engine == "lmcache":
                assert mine == [], mine
                # the port was live: the prefill's sender reached it
                assert any(t == "AllocRequest" for _, _, t in msgs), msgs
            else:
                types = [t for _, _, t in mine]
                assert "ReserveRequest" in types and "CancelNotif" in types, mine
        finally:
            gw.stop()
            rec.close()


def push_notif(req_id, source=None, port=None):
    """A ProxyNotif as LMCache's sender sends it (PUSH, msgpack map, "type" first),
    optionally from another loopback source address."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 2000)
    dest = f"127.0.0.1:{port or env['proxy_port']}"
    s.connect(f"tcp://{source}:0;{dest}" if source else f"tcp://{dest}")
    s.send(msgpack.packb({"type": "ProxyNotif", "req_id": req_id}))
    s.close()
    ctx.term()


def rejected(gw, reason):
    return gw.metric("pdgw_fwd_proxy_notifs_rejected_total",
                     {"protocol": "lmcache", "reason": reason})


def wait_for(cond, timeout=5.0, what="condition"):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_forged_notifs_never_release_the_decode():
    """During a slow prefill, forged ProxyNotifs (guessed ids from the prefill's address, the
    right id from another address) are counted by reason and ignored: the decode waits for
    the real one and uses the transferred KV (no recompute). A replay after the end is late."""
    P, D = env["slowP"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"],
                  "notif_timeout_ms": 10000}, retries=0)
    try:
        rid = "fg-" + uuid.uuid4().hex[:12]
        out = {}

        def client():
            out["r"] = T.post_json(gw.port, path_of(False), client_body(False, False),
                                   {"X-Request-Id": rid}, timeout=30)
        th = threading.Thread(target=client)
        th.start()
        wait_for(lambda: P.records(rid), what="the prefill leg")
        prec = P.records(rid)[0]
        req_id = prec["body"]["kv_transfer_params"]["disagg_spec"]["req_id"]
        assert req_id != rid
        # guessed names: the client's id, a counter (LMCache's proxy uses str(counter)), noise
        for guess in (rid, "1", str(uuid.uuid4())):
            push_notif(guess)
        push_notif(req_id, source="127.0.0.2")  # right name, not the prefill's address
        wait_for(lambda: rejected(gw, "unknown") >= 3 and rejected(gw, "peer") >= 1,
                 what="the forged notices to be counted")
        assert P.records(rid)[0]["status"] is None, "the prefill must still be running"
        assert not D.records(rid), "a forged ProxyNotif released the decode"
        th.join(30)
        st, _, obj, raw = out["r"]
        assert st == 200, raw
        drec = D.records(rid)
        assert len(drec) == 1, drec
        kvr = drec[0]["kv_result"]
        assert kvr["ok"] and not kvr["recompute"], kvr
        assert rejected(gw, "unknown") == 3 and rejected(gw, "peer") == 1
        assert gw.metric("pdgw_fwd_proxy_notifs_total", {"protocol": "lmcache"}) == 1
        push_notif(req_id)  # a replay after the request ended
        wait_for(lambda: rejected(gw, "late") == 1, what="the late notice")
    finally:
        gw.stop()


def relay_frames(req_id, sender="127.0.0.1"):
    return [b"pdgw-notif-relay/1", req_id.encode(), sender.encode()]


def test_notif_relay_between_replicas():
    """Two replicas behind one Service: the prefill's ProxyNotif (LMCache sends it to the one
    pd_proxy_host:pd_proxy_port it is configured with; lmcache/v1/storage_backend/pd_backend.py)
    reaches replica A while replica B owns the request. A hands it to B with the engine's
    address, B checks that address against the request's prefill and releases the decode,
    which uses the transferred KV. Relays come only from peers; a relayed notice is never
    relayed again."""
    P, D = env["P"], env["D"]
    ra, rb = T.free_port(), T.free_port()
    common = {"proxy_host": "127.0.0.1", "notif_timeout_ms": 10000}
    gw_a = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                   dict(common, proxy_port=env["proxy_port"], notif_relay_port=ra,
                        notif_relay_peers=f"127.0.0.1:{rb}, 127.0.0.1:{ra}"), retries=0)
    gw_b = None
    try:
        gw_b = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                       dict(common, proxy_port=T.free_port(), notif_relay_port=rb,
                            notif_relay_peers=f"localhost:{ra}"), retries=0)
        lab = {"protocol": "lmcache"}
        for gw, name in ((gw_b, "via B (relayed)"), (gw_a, "via A (direct)")):
            rid = "relay-" + uuid.uuid4().hex[:12]
            st, _, obj, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                          {"X-Request-Id": rid}, timeout=30)
            assert st == 200, (name, raw)
            drec = D.records(rid)
            assert len(drec) == 1, (name, drec)
            kvr = drec[0]["kv_result"]
            assert kvr["ok"] and not kvr["recompute"], (name, kvr)
        assert gw_a.metric("pdgw_fwd_proxy_notifs_relayed_out_total", lab) == 1
        assert gw_b.metric("pdgw_fwd_proxy_notifs_relayed_in_total", lab) == 1
        assert gw_b.metric("pdgw_fwd_proxy_notifs_total", lab) == 1
        assert gw_a.metric("pdgw_fwd_proxy_notifs_total", lab) == 1
        assert not rejected(gw_a, "unknown") and not rejected(gw_b, "unknown")

        # A notice nobody owns: A relays it once, B counts it unknown and does not send it back.
        push_notif(str(uuid.uuid4()))
        wait_for(lambda: rejected(gw_b, "unknown") == 1, what="B to count the unknown notice")
        assert gw_a.metric("pdgw_fwd_proxy_notifs_relayed_out_total", lab) == 2
        assert not gw_b.metric("pdgw_fwd_proxy_notifs_relayed_out_total", lab)
        assert not rejected(gw_a, "unknown")

        # A relay from an address that is no peer is refused; garbage on the relay port too.
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect(f"tcp://127.0.0.2:0;127.0.0.1:{rb}")
        s.send_multipart(relay_frames(str(uuid.uuid4())))
        s.close()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect(f"tcp://127.0.0.1:{rb}")
        s.send_multipart([b"not-a-relay", b"x"])
        s.close()
        ctx.term()
        wait_for(lambda: rejected(gw_b, "relay_not_peer") == 1 and
                 rejected(gw_b, "malformed") == 1, what="the forged relays to be counted")
    finally:
        if gw_b:
            gw_b.stop()
        gw_a.stop()


def test_fallback_decode_and_skip_notification():
    """An engine that sends no ProxyNotif: with notif_fallback: decode the decode goes at the
    deadline (counted); with skip_proxy_notification it goes at once."""
    P, D = env["silentP"], env["D"]
    for opts, slow in (({"notif_fallback": "decode", "notif_timeout_ms": 600}, True),
                       ({"skip_proxy_notification": True, "notif_timeout_ms": 60000}, False)):
        gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                     dict(opts, proxy_host="127.0.0.1", proxy_port=T.free_port()), retries=0)
        try:
            rid = "fb-" + uuid.uuid4().hex[:12]
            t0 = time.time()
            st, _, obj, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                          {"X-Request-Id": rid})
            took = time.time() - t0
            assert st == 200, raw
            assert len(D.records(rid)) == 1
            fb = gw.metric("pdgw_fwd_notif_fallback_decodes_total", {"protocol": "lmcache"})
            if slow:
                assert took >= 0.55, took
                assert fb == 1, fb
            else:
                assert took < 5, took
                assert fb == 0, fb
        finally:
            gw.stop()


def test_live_kv_options_on_reload():
    """A reload applies the KV service's timing options live (gateway/src/kvctl/pdgw_kvctl_reload.c):
    a shorter notif_timeout_ms holds for the next request at once; a new proxy_port needs a
    restart and the running listener stays."""
    P, D = env["silentP"], env["D"]
    notif_port = T.free_port()
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"notif_fallback": "decode", "notif_timeout_ms": 60000,
                  "proxy_host": "127.0.0.1", "proxy_port": notif_port}, retries=0)
    try:
        with open(gw.cfg) as f:
            text = f.read()
        with open(gw.cfg, "w") as f:
            f.write(text.replace("notif_timeout_ms: 60000", "notif_timeout_ms: 600"))
        st, _, parsed, raw = T.post_json(gw.port, "/admin/reload", {})
        assert st == 200 and parsed["result"] == "ok", raw
        assert "protocol_options" in parsed["applied"], parsed
        assert "protocol_options" not in parsed["needs_restart"], parsed
        rid = "live-" + uuid.uuid4().hex[:12]
        t0 = time.time()
        st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                    {"X-Request-Id": rid})
        took = time.time() - t0
        assert st == 200, raw
        # the silent prefill sends no ProxyNotif: the decode went at the new deadline (600 ms),
        # not the old one (60 s)
        assert gw.metric("pdgw_fwd_notif_fallback_decodes_total", {"protocol": "lmcache"}) == 1
        assert took < 30, took

        with open(gw.cfg, "w") as f:
            f.write(text.replace(f"proxy_port: {notif_port}", f"proxy_port: {T.free_port()}"))
        st, _, parsed, raw = T.post_json(gw.port, "/admin/reload", {})
        # a change that needs a restart is named, and the reload is not reported as whole
        assert st == 200 and parsed["result"] == "partial", raw
        assert "protocol_options" in parsed["needs_restart"], parsed
        assert listening(notif_port), "the running ProxyNotif listener went away"
    finally:
        gw.stop()


def listening(port):
    """Local addresses (hex, as in /proc/net/tcp) listening on <port>."""
    out = []
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            cols = ln.split()
            addr, p = cols[1].rsplit(":", 1)
            if int(p, 16) == port and cols[3] == "0A":
                out.append(addr)
    return out


def test_default_bind_is_the_pod_address():
    """Without proxy_host the PULL binds the pod's address, never every interface; '*'
    widens it on purpose."""
    D = env["D"]
    for host, envv, want in ((None, {"POD_IP": "127.0.0.1"}, "0100007F"),
                             ("*", {}, "00000000")):
        port = T.free_port()
        opts = {"proxy_port": port}
        if host:
            opts["proxy_host"] = host
        gw = Gateway("lmcache", "batch", [env["slowP"].instance(), D.instance()], opts,
                     env=envv)
        try:
            assert listening(port) == [want], (host, listening(port))
        finally:
            gw.stop()


def test_curve_only_listed_clients():
    """notif_curve_secret_key_file makes the listener a CURVE server; with
    notif_curve_client_keys_file only listed client keys get through (others are refused and
    counted); a plain-TCP sender never reaches the decoder."""
    server_pub, server_sec = zmq.curve_keypair()
    good_pub, good_sec = zmq.curve_keypair()
    bad_pub, bad_sec = zmq.curve_keypair()
    tmp = tempfile.mkdtemp(prefix="pdgw-curve-")
    sk, ck = os.path.join(tmp, "server.key_secret"), os.path.join(tmp, "clients")
    with open(sk, "w") as f:
        f.write(f'# server\nsecret-key = "{server_sec.decode()}"\n')
    with open(ck, "w") as f:
        f.write(good_pub.decode() + "\n")
    port = T.free_port()
    gw = Gateway("lmcache", "batch", [env["slowP"].instance(), env["D"].instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": port,
                  "notif_curve_secret_key_file": sk, "notif_curve_client_keys_file": ck})

    def send(pub, sec, rid):
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        if pub:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_pub, pub, sec
        s.connect(f"tcp://127.0.0.1:{port}")
        s.send(msgpack.packb({"type": "ProxyNotif", "req_id": rid}))
        time.sleep(0.3)  # give the handshake time; an unauthorised one never completes
        s.close()
        ctx.term()
    try:
        send(good_pub, good_sec, "curve-good")
        wait_for(lambda: rejected(gw, "unknown") == 1, what="the listed client's notice")
        send(bad_pub, bad_sec, "curve-bad")
        wait_for(lambda: rejected(gw, "refused_peer") >= 1, what="the refusal")
        send(None, None, "plain")
        time.sleep(0.2)
        assert rejected(gw, "unknown") == 1  # neither the unlisted nor the plain one got in
    finally:
        gw.stop()
        for p in (sk, ck):
            os.unlink(p)
        os.rmdir(tmp)


LONG = ("Disaggregated serving splits the prompt phase from the token phase so that each runs "
        "on hardware sized for it, and the cache of keys and values moves between. ") * 6


def body_of(chat, stream, max_tokens=10):
    b = {"model": "sim-model", "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if chat:
        b["messages"] = [{"role": "user", "content": LONG}]
    else:
        b["prompt"] = LONG
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def reference(chat, max_tokens=10):
    st, _, obj, raw = T.post_json(env["both"].port, path_of(chat), body_of(chat, False, max_tokens))
    assert st == 200, raw
    ch = obj["choices"][0]
    return (ch["message"]["content"] if chat else ch["text"]), obj["usage"]


def test_first_tok_stream_shape():
    """Streams start the way LMCache's proxy starts them: the prefill's first token in a chunk
    with the prefill answer's id (chat: a role chunk first), then the decode's chunks (chat:
    chat.completion.chunk); text and usage equal a single engine's; the decode used the
    transferred KV."""
    P, D = env["P"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    try:
        for chat in (False, True):
            rid = "fs-" + uuid.uuid4().hex[:12]
            evs = list(T.sse_events(gw.port, path_of(chat), body_of(chat, True),
                                    {"X-Request-Id": rid}))
            assert evs[-1] == "[DONE]", evs[-3:]
            objs = [json.loads(e) for e in evs[:-1]]
            prec = [r for r in P.records(rid) if r["path"] == "/v1/completions"][0]
            drec = [r for r in D.records(rid) if r["path"] == "/v1/completions"][0]
            head = objs[0]
            if chat:
                assert head["object"] == "chat.completion.chunk", head
                assert head["choices"][0]["delta"] == {"role": "assistant", "content": ""}, head
                head = objs[1]
                first_text = head["choices"][0]["delta"]["content"]
                rest = objs[2:]
                assert all(o["object"] == "chat.completion.chunk" for o in rest), rest
            else:
                assert head["object"] == "text_completion", head
                first_text = head["choices"][0]["text"]
                rest = objs[1:]
            assert head["id"].endswith(prec["request_id"]) or prec["request_id"] in head["id"], \
                (head["id"], prec["request_id"])
            assert head["choices"][0]["finish_reason"] is None, head
            want, want_usage = reference(chat)
            assert first_text and want.startswith(first_text), (first_text, want)
            assert T.stream_text(evs) == want, (T.stream_text(evs), want)
            usage = [o["usage"] for o in objs if o.get("usage")]
            assert usage and {k: usage[-1][k] for k in ("prompt_tokens", "completion_tokens")} \
                == {k: want_usage[k] for k in ("prompt_tokens", "completion_tokens")}, \
                (usage, want_usage)
            assert drec["body"]["stream"] is True
            kvr = drec["kv_result"]
            assert kvr["ok"] and not kvr["recompute"] and kvr["verify_failures"] == 0, kvr
        # only the chat request asked /tokenize: the completions prefill answered its ids
        assert gw.metric("pdgw_fwd_tokenize_calls_total", {"protocol": "lmcache"}) == 1
    finally:
        gw.stop()


def tokenize(sim, text):
    st, _, obj, raw = T.post_json(sim.port, "/tokenize", {"prompt": text})
    assert st == 200, raw
    return obj["tokens"]


def test_prompt_ids_from_the_prefill_answer():
    """A completions prompt of text goes to the prefill as it is, with return_token_ids; the
    decode gets the ids the prefill answered + [first_tok], without the client's
    truncate_prompt_tokens (those ids are already cut), and no /tokenize call is made."""
    P, D = env["P"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    try:
        rid = "pi-" + uuid.uuid4().hex[:12]
        body = dict(body_of(False, False), truncate_prompt_tokens=4000)
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body, {"X-Request-Id": rid})
        assert st == 200, raw
        assert obj["choices"][0]["text"] == reference(False)[0], obj
        prec = [r for r in P.records(rid) if r["path"] == "/v1/completions"][0]
        drec = D.records(rid)[0]
        assert prec["body"]["prompt"] == LONG, prec["body"]
        assert prec["body"]["return_token_ids"] is True, prec["body"]
        assert prec["body"]["truncate_prompt_tokens"] == 4000, prec["body"]
        first = prec["response_kv_transfer_params"]["first_tok"]
        assert drec["body"]["prompt"] == tokenize(P, LONG) + [first], drec["body"]["prompt"]
        assert "truncate_prompt_tokens" not in drec["body"], drec["body"]
        assert "return_token_ids" not in drec["body"], drec["body"]
        assert drec["kv_result"]["ok"] and not drec["kv_result"]["recompute"], drec["kv_result"]
        assert not gw.metric("pdgw_fwd_tokenize_calls_total", {"protocol": "lmcache"})
        assert not gw.metric("pdgw_fwd_prompt_ids_fallback_total", {"protocol": "lmcache"})
    finally:
        gw.stop()


def test_chat_tokenize_carries_the_template_options():
    """A chat request's /tokenize carries the chat-template options the client set (vLLM
    vllm/entrypoints/serve/tokenize/protocol.py TokenizeChatRequest takes the same ones as
    its chat completions), so the ids are the ones the request itself runs on; LMCache's
    proxy sends the messages alone."""
    P, D = env["Pold"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    opts = {"tools": tools, "chat_template_kwargs": {"enable_thinking": False},
            "add_generation_prompt": True, "add_special_tokens": False}
    try:
        rid = "ct-" + uuid.uuid4().hex[:12]
        # tool_choice none: the tools shape the prompt, no tool call is parsed (with one the
        # request would run client_body, test_answers_first_tok_cannot_put_together_...)
        body = dict(body_of(True, False), truncate_prompt_tokens=4000, tool_choice="none",
                    **opts)
        st, _, obj, raw = T.post_json(gw.port, "/v1/chat/completions", body,
                                      {"X-Request-Id": rid})
        assert st == 200, raw
        trec = [r for r in P.records(rid) if r["path"] == "/tokenize"]
        assert len(trec) == 1, trec
        tb = trec[0]["body"]
        assert tb["messages"] == body["messages"] and tb["model"] == "sim-model", tb
        for k, v in opts.items():
            assert tb[k] == v, (k, tb)
        assert "max_tokens" not in tb and "stream" not in tb, tb
        # ids from /tokenize are not cut: with an engine that answers no ids of its own the
        # decode keeps the client's truncation (test_truncated_prompt_keeps_the_kv_window)
        assert D.records(rid)[0]["body"]["truncate_prompt_tokens"] == 4000
    finally:
        gw.stop()


def test_truncated_prompt_keeps_the_kv_window():
    """A prompt the engine truncates (truncate_prompt_tokens; vLLM vllm/renderers/params.py
    keeps the last N tokens, the side vllm/tokenizers/registry.py gives a generation model's
    tokenizer) that reaches the prefill as ids (chat, and prompt_ids: tokenize): the prefill
    is asked return_token_ids as well, and the decode gets the N ids it kept + [first_tok]
    without truncate_prompt_tokens. Cutting ids + [first_tok] to N again would start the
    decode's prompt one token later than the prefill's KV, and it would recompute."""
    P, D = env["P"], env["D"]
    keep = 40
    for chat, opts in ((True, {}), (False, {"prompt_ids": "tokenize"})):
        gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                     dict(proxy_host="127.0.0.1", proxy_port=env["proxy_port"], **opts),
                     retries=0)
        try:
            rid = "tr-" + uuid.uuid4().hex[:12]
            body = dict(body_of(chat, False), truncate_prompt_tokens=keep)
            st, _, obj, raw = T.post_json(gw.port, path_of(chat), body, {"X-Request-Id": rid})
            assert st == 200, raw
            st, _, ref, rraw = T.post_json(env["both"].port, path_of(chat), body)
            assert st == 200, rraw
            ch, rch = obj["choices"][0], ref["choices"][0]
            assert (ch["message"]["content"] == rch["message"]["content"] if chat
                    else ch["text"] == rch["text"]), (obj, ref)
            prec = [r for r in P.records(rid) if r["path"] == "/v1/completions"][0]
            drec = D.records(rid)[0]
            ids = prec["body"]["prompt"]
            assert isinstance(ids, list) and len(ids) > keep, prec["body"]
            assert prec["body"]["return_token_ids"] is True, prec["body"]
            assert prec["body"]["truncate_prompt_tokens"] == keep, prec["body"]
            first = prec["response_kv_transfer_params"]["first_tok"]
            assert drec["body"]["prompt"] == ids[-keep:] + [first], (chat, drec["body"])
            assert "truncate_prompt_tokens" not in drec["body"], drec["body"]
            assert drec["kv_result"]["ok"] and not drec["kv_result"]["recompute"], \
                (chat, drec["kv_result"])
            assert not gw.metric("pdgw_fwd_prompt_ids_fallback_total", {"protocol": "lmcache"})
        finally:
            gw.stop()
    # an engine from before return_token_ids answers no ids: the /tokenize ids and the
    # client's truncation go to the decode as they are (counted as a fallback)
    gw = Gateway("lmcache", "batch", [env["Pold"].instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    try:
        rid = "to-" + uuid.uuid4().hex[:12]
        body = dict(body_of(True, False), truncate_prompt_tokens=keep)
        st, _, obj, raw = T.post_json(gw.port, path_of(True), body, {"X-Request-Id": rid})
        assert st == 200, raw
        assert D.records(rid)[0]["body"]["truncate_prompt_tokens"] == keep
        assert gw.metric("pdgw_fwd_prompt_ids_fallback_total", {"protocol": "lmcache"}) == 1
    finally:
        gw.stop()


def test_prompt_ids_fallback_to_tokenize():
    """A prefill whose answer has no prompt_token_ids (a vLLM from before return_token_ids):
    the ids come from its /tokenize, asked after its answer (while its KV is on the way), and
    the decode still finds the KV; counted as a fallback."""
    P, D = env["Pold"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    try:
        rid = "pf-" + uuid.uuid4().hex[:12]
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body_of(False, False),
                                      {"X-Request-Id": rid})
        assert st == 200, raw
        assert obj["choices"][0]["text"] == reference(False)[0], obj
        recs = P.records(rid)
        prec = [r for r in recs if r["path"] == "/v1/completions"][0]
        trec = [r for r in recs if r["path"] == "/tokenize"]
        assert prec["body"]["prompt"] == LONG, prec["body"]
        assert len(trec) == 1 and trec[0]["t_recv_us"] >= prec["t_done_us"], (trec, prec)
        drec = D.records(rid)[0]
        first = prec["response_kv_transfer_params"]["first_tok"]
        assert drec["body"]["prompt"] == tokenize(P, LONG) + [first], drec["body"]["prompt"]
        assert drec["kv_result"]["ok"] and not drec["kv_result"]["recompute"], drec["kv_result"]
        assert gw.metric("pdgw_fwd_tokenize_calls_total", {"protocol": "lmcache"}) == 1
        assert gw.metric("pdgw_fwd_prompt_ids_fallback_total", {"protocol": "lmcache"}) == 1
    finally:
        gw.stop()


def test_client_body_flow_option():
    """flow: client_body is the older proxy: no /tokenize, no ret_first_tok, the decode gets
    the client's body (skip_last_n_tokens 0 decoders find the prompt's KV)."""
    P, D = env["P"], env["D0"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"],
                  "flow": "client_body"}, retries=0)
    try:
        rid = "cb-" + uuid.uuid4().hex[:12]
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body_of(False, False),
                                      {"X-Request-Id": rid})
        assert st == 200, raw
        assert obj["choices"][0]["text"] == reference(False)[0]
        pb = P.records(rid)[0]["body"]
        db = D.records(rid)[0]
        assert "ret_first_tok" not in pb["kv_transfer_params"], pb
        assert db["body"]["prompt"] == LONG and db["body"]["max_tokens"] == 10, db["body"]
        assert db["kv_result"]["ok"] and not db["kv_result"]["recompute"], db["kv_result"]
        assert gw.metric("pdgw_fwd_tokenize_calls_total", {"protocol": "lmcache"}) == 0
    finally:
        gw.stop()


def test_min_tokens_split_between_the_legs():
    """min_tokens (vLLM vllm/sampling_params.py: no EOS or stop token ids before that many
    tokens; more than max_tokens is refused) counts the whole answer: the prefill, which makes
    the first token, gets min_tokens 1 (EOS cannot end the answer at its first token, as on
    one engine) and the decode min_tokens - 1 next to its max_tokens - 1, so a client asking
    min_tokens == max_tokens (a fixed answer length) is served."""
    P, D = env["P"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    try:
        for chat in (False, True):
            rid = "mt-" + uuid.uuid4().hex[:12]
            body = dict(body_of(chat, False), min_tokens=10)
            st, _, obj, raw = T.post_json(gw.port, path_of(chat), body, {"X-Request-Id": rid})
            assert st == 200, raw
            assert obj["usage"]["completion_tokens"] == 10, obj
            pb = [r for r in P.records(rid) if r["path"] == "/v1/completions"][0]["body"]
            db = D.records(rid)[0]["body"]
            assert pb["max_tokens"] == 1 and pb["min_tokens"] == 1, pb
            assert db["max_tokens"] == 9 and db["min_tokens"] == 9, db
    finally:
        gw.stop()


def test_answers_first_tok_cannot_put_together_run_client_body():
    """The first_tok flow writes the prefill's one token as text in front of the decode's
    answer. An answer that also holds the prompt (echo), per-token logprobs or prompt logprobs
    (vLLM vllm/entrypoints/openai/completion/protocol.py and chat_completion/protocol.py:
    echo, logprobs, prompt_logprobs, n, use_beam_search) would come out wrong that way (the
    prompt twice, no logprobs for the first token), and so would a grammar the engine applies
    from the first token (response_format, structured_outputs; a chat tool_choice "required"
    or naming a function becomes a JSON schema, vllm/tool_parsers/utils.py), which the decode
    would start again after it. A chat request with tools (tool_choice "auto" when absent,
    chat_completion/protocol.py) or media in its messages needs the chat endpoint, which the
    flow's completions legs never reach (the engine's tool parser; ids from /tokenize carry no
    image). So such a request runs client_body: the
    decode gets the client's body and answers it whole. Counted. (Decoders that look up the
    whole prompt, skip_last_n_tokens 0, find its KV then.)"""
    P, D = env["P"], env["D0"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"]}, retries=0)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    cases = [(False, {"echo": True}), (False, {"logprobs": 0}),
             (False, {"prompt_logprobs": 1}), (True, {"logprobs": True}),
             (False, {"response_format": {"type": "json_object"}}),
             (True, {"tools": tools, "tool_choice": "required"}),
             (True, {"tools": tools, "tool_choice": {"type": "function",
                                                     "function": {"name": "f"}}}),
             (True, {"tools": tools}),
             (True, {"messages": [{"role": "user", "content": [
                 {"type": "text", "text": LONG},
                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})]
    try:
        for n, (chat, extra) in enumerate(cases, 1):
            rid = "wa-" + uuid.uuid4().hex[:12]
            body = dict(body_of(chat, False), **extra)
            st, _, obj, raw = T.post_json(gw.port, path_of(chat), body, {"X-Request-Id": rid})
            assert st == 200, (extra, raw)
            pb = P.records(rid)[0]["body"]
            db = D.records(rid)[0]["body"]
            assert "ret_first_tok" not in pb["kv_transfer_params"], (extra, pb)
            for k, v in extra.items():
                assert db[k] == v, (extra, db)
            assert db["max_tokens"] == 10 and "kv_transfer_params" not in db, (extra, db)
            assert db.get("messages" if chat else "prompt") == body.get(
                "messages" if chat else "prompt"), (extra, db)
            rec = D.records(rid)[0]
            assert rec["kv_result"]["ok"] and not rec["kv_result"]["recompute"], rec["kv_result"]
            assert gw.metric("pdgw_fwd_client_body_answers_total", {"protocol": "lmcache"}) == n
        # what the flow can answer whole still runs it: echo false, logprobs null, a text
        # response_format and tool_choice auto are off (chat: tools with tool_choice none, and
        # text parts)
        rid = "wa-" + uuid.uuid4().hex[:12]
        body = dict(body_of(False, False), echo=False, logprobs=None, n=1,
                    response_format={"type": "text"}, tool_choice="auto")
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body, {"X-Request-Id": rid})
        assert st == 200, raw
        assert [r for r in P.records(rid) if r["path"] == "/v1/completions"][0]["body"][
            "kv_transfer_params"]["ret_first_tok"] is True
        rid = "wa-" + uuid.uuid4().hex[:12]
        body = dict(body_of(True, False), tools=tools, tool_choice="none",
                    messages=[{"role": "user", "content": [{"type": "text", "text": LONG}]}])
        st, _, obj, raw = T.post_json(gw.port, "/v1/chat/completions", body,
                                      {"X-Request-Id": rid})
        assert st == 200, raw
        assert [r for r in P.records(rid) if r["path"] == "/v1/completions"][0]["body"][
            "kv_transfer_params"]["ret_first_tok"] is True
        assert gw.metric("pdgw_fwd_client_body_answers_total",
                         {"protocol": "lmcache"}) == len(cases)
    finally:
        gw.stop()


class BrokenTokenizer:
    """An engine whose /tokenize fails (GET answers 200 so it passes health checks), or with
    <hang> never answers it."""

    def __init__(self, hang=False):
        import http.server
        release = self.release = threading.Event()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                if hang:
                    release.wait(60)
                    return
                body = b'{"error":{"message":"tokenizer down"}}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        self.th = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.th.start()

    def close(self):
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()


def test_tokenize_failure_is_a_prefill_error():
    """A prefill whose /tokenize fails: 502 phase prefill, counted, no leg sent."""
    bt = BrokenTokenizer()
    D = env["D"]
    gw = Gateway("lmcache", "batch",
                 [{"id": "broken-p", "url": f"http://127.0.0.1:{bt.port}", "role": "prefill"},
                  D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": T.free_port(),
                  "prompt_ids": "tokenize"}, retries=0)
    try:
        rid = "tk-" + uuid.uuid4().hex[:12]
        st, hdrs, data = T.request("POST", gw.port, "/v1/completions", body_of(False, False),
                                   {"X-Request-Id": rid})
        assert st == 502, (st, data)
        assert b"tokenize answered HTTP 500" in data, data
        assert hdrs.get("x-pd-failure-phase", "prefill") == "prefill", hdrs
        assert gw.metric("pdgw_fwd_tokenize_errors_total", {"protocol": "lmcache"}) == 1
        assert not D.records(rid)
    finally:
        gw.stop()
        bt.close()


def test_tokenize_timeout_is_a_prefill_error():
    """A prefill whose /tokenize never answers: at tokenize_timeout_ms the request fails 502
    phase prefill (the call runs on the request's worker, bounded by its own timer), counted,
    and no leg is sent."""
    bt = BrokenTokenizer(hang=True)
    D = env["D"]
    gw = Gateway("lmcache", "batch",
                 [{"id": "hung-p", "url": f"http://127.0.0.1:{bt.port}", "role": "prefill"},
                  D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": T.free_port(),
                  "tokenize_timeout_ms": 300, "prompt_ids": "tokenize"}, retries=0)
    try:
        rid = "tt-" + uuid.uuid4().hex[:12]
        st, hdrs, data = T.request("POST", gw.port, "/v1/completions", body_of(False, False),
                                   {"X-Request-Id": rid})
        assert st == 502, (st, data)
        assert b"no answer within 300 ms" in data, data
        assert gw.metric("pdgw_fwd_tokenize_errors_total", {"protocol": "lmcache"}) == 1
        assert not D.records(rid)
    finally:
        gw.stop()
        bt.close()


def test_bidirectional_mode_refused_at_config_check():
    """LMCache's bidirectional PD mode (pd_bidirectional in its engine config; the sender
    probes the decode's cache over receiver_query_port / pd_peer_query_port, one port per TP
    rank, with CacheQueryRequest / CacheQueryResponse; lmcache/integration/vllm/
    vllm_v1_adapter.py _probe_decoder_cache, DisaggSpec.receiver_query_port) is not
    supported: pdgw says so at --check-config, naming what is missing, instead of sending a
    disagg_spec whose query ports the sender would index by its TP rank."""
    import subprocess
    cfg = "\n".join([
        'listen: "127.0.0.1:1"', "protocol: lmcache", "scheduling: batch",
        "protocol_options:", "  pd_bidirectional: true", "instances:",
        '  - id: p0', '    url: "http://127.0.0.1:2"', "    role: prefill",
        '  - id: d0', '    url: "http://127.0.0.1:3"', "    role: decode",
        '    kv_host: "127.0.0.1"', "    alloc_ports: [4]", "    init_ports: [5]", ""])
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(cfg)
    try:
        envx = {k: v for k, v in os.environ.items() if not k.startswith("PDGW_")}
        for flag in ("--check-config", "--config"):
            proc = subprocess.run([T.binary("pdgw"), flag, path], capture_output=True,
                                  text=True, timeout=30, env=envx)
            out = proc.stdout + proc.stderr
            assert proc.returncode != 0, out
            assert "pd_bidirectional" in out and "CacheQueryRequest" in out, out
        # false (LMCache's default) is accepted
        with open(path, "w") as f:
            f.write(cfg.replace("pd_bidirectional: true", "pd_bidirectional: false"))
        proc = subprocess.run([T.binary("pdgw"), "--check-config", path], capture_output=True,
                              text=True, timeout=30, env=envx)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        os.unlink(path)


def main():
    setup()
    tests = [test_first_tok_stream_shape, test_prompt_ids_from_the_prefill_answer,
             test_prompt_ids_fallback_to_tokenize, test_truncated_prompt_keeps_the_kv_window,
             test_chat_tokenize_carries_the_template_options, test_client_body_flow_option,
             test_answers_first_tok_cannot_put_together_run_client_body,
             test_min_tokens_split_between_the_legs,
             test_tokenize_failure_is_a_prefill_error, test_tokenize_timeout_is_a_prefill_error,
             test_upstream_decode_gets_only_upstream_messages,
             test_forged_notifs_never_release_the_decode,
             test_notif_relay_between_replicas,
             test_fallback_decode_and_skip_notification,
             test_live_kv_options_on_reload,
             test_default_bind_is_the_pod_address,
             test_curve_only_listed_clients,
             test_bidirectional_mode_refused_at_config_check]
    passed = failed = 0
    import traceback
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
                if p.name.startswith("pdgw") or not p.alive():
                    print(f"---- log of {p.name} (alive={p.alive()}) ----")
                    print(p.output()[-4000:])
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
