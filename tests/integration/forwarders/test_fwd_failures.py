"""PD forwarders under failure: a client that disconnects mid-prefill aborts both legs and
leaves nothing pinned (libkvt protocols also send CancelNotif); prefill and decode failures
produce the PD error taxonomy (status, error JSON type/code, X-PD-* headers, metric); the
lmcache path whose ProxyNotif never comes fails at its deadline with a clear 504 and
releases the KV the decode received."""

import json
import socket
import sys
import time
import traceback
import uuid

import pdgwtest as T
from fwdconf import Gateway, Sim, client_body, path_of, wait_idle

env = {}

DISCONNECT_CONFIGS = [
    ("vllm-nixl", "batch", {}),
    ("vllm-mooncake", "staged", {"mooncake_dispatch": "serial"}),
    ("vllm-mooncake", "batch", {}),
    ("vllm-kvt", "batch", {}),
    ("vllm-kvt", "staged", {}),
    ("sglang", "batch", {}),
    ("lmcache", "batch", {"proxy_host": "127.0.0.1"}),
]


def setup():
    env["proxy_port"] = T.free_port()
    env["dead_port"] = T.free_port()
    px = ["--proxy-host", "127.0.0.1", "--proxy-port"]
    env["slowP"] = Sim("prefill", "prefill-slow", *px, env["proxy_port"], "--ttft-ms", "4000")
    # Held KV nobody pulls (a decode failed, or a leg was aborted while the sim could not
    # notice) is freed by the engine's own timeout (vLLM: VLLM_NIXL_ABORT_REQUEST_TIMEOUT);
    # short ones here so "nothing stays pinned" is checked within the test.
    hold = ["--kv-hold-timeout-ms", "1500"]
    env["noproxyP"] = Sim("prefill", "prefill-noproxy", *px, env["dead_port"], *hold)
    env["P2"] = Sim("prefill", "prefill-b", *hold)
    env["failP"] = Sim("prefill", "prefill-fail", "--fail-rate", "1", "--fail-status", "500")
    env["D"] = Sim("decode", "decode-0", "--kv-wait-timeout-ms", "1500")
    env["failD"] = Sim("decode", "decode-fail", "--fail-rate", "1", "--fail-status", "500")
    # an overloaded decode behind a load balancer: 429 with Retry-After: 1
    env["busyD"] = Sim("decode", "decode-busy", "--fail-rate", "1", "--fail-status", "429",
                       "--fail-retry-after", "1", "--fail-in-front")
    # a refusing front of a decode (the engine behind never sees the request)
    env["frontD"] = Sim("decode", "decode-front", "--fail-rate", "1", "--fail-status", "503",
                        "--fail-in-front")


def sims():
    return [env[k] for k in ("slowP", "noproxyP", "P2", "failP", "D", "failD", "busyD",
                                         "frontD")]


def disconnect_mid_prefill(gw, rid):
    """Send a streaming request, hang up while the prefill is still computing."""
    body = json.dumps(client_body(False, True)).encode()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"X-Request-Id: {rid}\r\nX-Sim-Tag: {rid}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(0.3)
    s.close()


def poll(fn, what, timeout=5.0):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.time() < deadline, what
        time.sleep(0.05)


def make_disconnect_test(protocol, mode, opts):
    def t():
        o = dict(opts)
        if protocol == "lmcache":
            o["proxy_port"] = env["proxy_port"]
        P, D = env["slowP"], env["D"]
        gw = Gateway(protocol, mode, [P.instance(), D.instance()], o, retries=0)
        try:
            # the leg in flight: the decode's for single-stage vllm-kvt, else the prefill's
            watch = D if (protocol == "vllm-kvt" and mode == "batch") else P
            before = watch.metric("sim_client_disconnects_total")
            t0 = time.time()
            rid = "dc-" + uuid.uuid4().hex[:12]
            disconnect_mid_prefill(gw, rid)
            # ... is aborted: the engine saw its client go before it answered, long before the
            # 4 s prefill would end (the margin absorbs a loaded machine)
            poll(lambda: watch.metric("sim_client_disconnects_total") > before,
                 "the in-flight leg was not aborted", timeout=3.0)
            # pdgw noticed and ended the attempt (legs aborted, bookings cancelled)
            poll(lambda: gw.metric("pdgw_client_disconnects_total", {"protocol": protocol}) >= 1,
                 "pdgw did not count the disconnect", timeout=3.0)
            assert time.time() - t0 < 3.5, time.time() - t0
            if protocol in ("vllm-kvt", "lmcache") and mode == "batch":
                poll(lambda: gw.metric("pdgw_pd_cancel_notifs_total",
                                       {"protocol": protocol}) >= 1, "no CancelNotif counted")
            # the decode leg never started for serial protocols
            if protocol in ("vllm-nixl", "lmcache") or (protocol == "vllm-mooncake" and
                                                        opts.get("mooncake_dispatch") == "serial"):
                assert not D.records(rid), D.records(rid)
            wait_idle(sims(), timeout=1.0)  # released by the aborts, not by a timeout
        finally:
            gw.stop()
    t.__name__ = f"test_disconnect_{protocol}_{opts.get('mooncake_dispatch', '')}{mode}"
    t.__name__ = t.__name__.replace("-", "_")
    return t


def check_taxonomy(gw, protocol, phase, stream, want_status=502):
    rid = "tx-" + uuid.uuid4().hex[:12]
    body = client_body(False, stream)
    st, hdrs, data = T.request("POST", gw.port, path_of(False), body, {"X-Request-Id": rid})
    assert st == want_status, (st, data)
    err = json.loads(data)["error"]
    assert err["type"] == f"pd_{phase}_error", err
    assert err["code"] in ("retryable", "not_retryable"), err
    assert hdrs.get("x-pd-failure-phase") == phase, hdrs
    assert hdrs.get("x-pd-retryable") in ("true", "false"), hdrs
    assert (hdrs["x-pd-retryable"] == "true") == (err["code"] == "retryable"), (hdrs, err)
    poll(lambda: gw.metric("pdgw_pd_failures_total", {"protocol": protocol, "phase": phase}) >= 1,
         f"pdgw_pd_failures_total{{{protocol},{phase}}} not counted")
    return err, hdrs


def test_prefill_failure_taxonomy():
    for protocol, opts in (("vllm-nixl", {}), ("sglang", {})):
        gw = Gateway(protocol, "batch", [env["failP"].instance(), env["D"].instance()], opts,
                     retries=0)
        try:
            err, hdrs = check_taxonomy(gw, protocol, "prefill", False)
            assert hdrs["x-pd-retryable"] == "true", hdrs  # a 5xx may succeed elsewhere
            check_taxonomy(gw, protocol, "prefill", True)
            wait_idle(sims(), timeout=8.0)
        finally:
            gw.stop()


def test_decode_failure_taxonomy():
    for protocol, mode, opts in (("vllm-nixl", "staged", {}), ("vllm-kvt", "batch", {})):
        gw = Gateway(protocol, mode, [env["noproxyP"].instance(), env["failD"].instance()], opts,
                     retries=0)
        try:
            check_taxonomy(gw, protocol, "decode", False)
            check_taxonomy(gw, protocol, "decode", True)
            wait_idle(sims(), timeout=8.0)
        finally:
            gw.stop()


def test_lmcache_proxynotif_never_comes():
    """The prefill pushes its KV but sends ProxyNotif elsewhere: 504 at the notif deadline,
    phase kv_transfer, and the KV the decode received is released (CancelNotif)."""
    P, D = env["noproxyP"], env["D"]
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": env["proxy_port"],
                  "notif_timeout_ms": 400}, retries=0)
    try:
        rid = "nn-" + uuid.uuid4().hex[:12]
        t0 = time.time()
        st, hdrs, data = T.request("POST", gw.port, path_of(False), client_body(False, False),
                                   {"X-Request-Id": rid})
        took = time.time() - t0
        assert st == 504, (st, data)
        assert 0.35 < took < 3.0, took
        err = json.loads(data)["error"]
        assert "arrived from 0 of 1 TP ranks" in err["message"], err
        assert hdrs.get("x-pd-failure-phase", "kv_transfer") == "kv_transfer", hdrs
        assert not D.records(rid), "the decode leg must not be sent"
        assert gw.metric("pdgw_fwd_notif_timeouts_total", {"protocol": "lmcache"}) == 1
        assert gw.metric("pdgw_pd_cancel_notifs_total", {"protocol": "lmcache"}) >= 1
        wait_idle(sims(), timeout=8.0)
    finally:
        gw.stop()



class FakeAllocPort:
    """A libkvt receiver's alloc port that answers ReserveRequest as told (ZMQ ROUTER,
    msgpack maps with "type" first) and records every message."""

    def __init__(self, grant_after, silent=False, answer_when=None):
        import threading
        import msgpack
        import zmq
        self.msgpack, self.zmq = msgpack, zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.grant_after = grant_after  # refuse this many ReserveRequests first (None = never)
        self.silent = silent  # record, never answer
        # answer_when(n): whether the n-th ReserveRequest may be answered yet (polled, 10 s)
        self.answer_when = answer_when
        self.msgs = []
        self.stop = False
        self.th = threading.Thread(target=self.serve, daemon=True)
        self.th.start()

    def serve(self):
        while not self.stop:
            if not self.sock.poll(50):
                continue
            # [ident, b"", payload] from a DEALER (the delimiter LMCache's
            # async receiver also skips: pd_backend_async.py takes frames[-1])
            frames = self.sock.recv_multipart()
            ident, payload = frames[0], frames[-1]
            m = self.msgpack.unpackb(payload, raw=False)
            self.msgs.append(m)
            if m.get("type") == "ReserveRequest" and not self.silent:
                n = sum(1 for x in self.msgs if x.get("type") == "ReserveRequest")
                ok = self.grant_after is not None and n > self.grant_after
                until = time.time() + 10
                while self.answer_when and not self.answer_when(n) and time.time() < until:
                    time.sleep(0.005)
                self.sock.send_multipart([ident, b"", self.msgpack.packb(
                    {"type": "ReserveResponse", "req_id": m["req_id"], "granted": ok,
                     "free_chunks": 100 if ok else 0})])

    def of(self, typ):
        return [m for m in self.msgs if m.get("type") == typ]

    def close(self):
        self.stop = True
        self.th.join()
        self.sock.close(0)
        self.ctx.term()


def test_reservation_queue_then_granted():
    """vllm-kvt batch: a refused ReserveRequest is asked again until granted (queue); the
    request then runs (named by its X-Request-Id, like the decode's transfer)."""
    fake = FakeAllocPort(grant_after=3)
    P = env["noproxyP"]
    D = dict(env["D"].instance(), alloc_ports=[fake.port])
    gw = Gateway("vllm-kvt", "batch", [P.instance(), D], {"reserve_retry_ms": 20}, retries=0)
    try:
        rid = "rq-" + uuid.uuid4().hex[:12]
        st, _, obj, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                      {"X-Request-Id": rid})
        assert st == 200, raw
        reqs = fake.of("ReserveRequest")
        assert len(reqs) == 4, reqs
        assert list(reqs[0].keys())[0] == "type", reqs[0]
        leg_id = env["D"].records(rid)[0]["request_id"]
        assert reqs[0]["req_id"] == leg_id != rid and reqs[0]["total_chunks"] >= 1, reqs[0]
        assert reqs[0]["ttl_ms"] == 30000, reqs[0]
        # a completed transfer releases its reservation on the receiver: no CancelNotif
        time.sleep(0.2)
        assert not fake.of("CancelNotif"), fake.msgs
        assert gw.metric("pdgw_fwd_reserve_refused_total", {"protocol": "vllm-kvt"}) == 3
        assert gw.metric("pdgw_fwd_reserve_granted_total", {"protocol": "vllm-kvt"}) == 1
        wait_idle(sims())
    finally:
        gw.stop()
        fake.close()


def test_reservation_goes_ahead_with_room():
    """vllm-kvt batch: once the decode's last answer left room for a request twice over, the
    next request's decode leg goes without waiting for its reservation's answer (the
    ReserveRequest is still sent first); that answer then only counts. ReserveRequest and its
    answer are libkvt's own messages between the gateway and libkvt's receiver
    (kvtransfer/src/kvt_ctrl_proxy.c), no engine's wire."""
    D, rid2 = env["D"], "ra-" + uuid.uuid4().hex[:12]
    # the second ReserveRequest is answered only once its decode leg reached the engine
    fake = FakeAllocPort(grant_after=0, answer_when=lambda n: n != 2 or bool(D.records(rid2)))
    gw = Gateway("vllm-kvt", "batch", [env["noproxyP"].instance(),
                                       dict(D.instance(), alloc_ports=[fake.port])], {},
                 retries=0)
    try:
        for rid in ("ra-" + uuid.uuid4().hex[:12], rid2):
            st, _, obj, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                          {"X-Request-Id": rid})
            assert st == 200, raw
        assert len(fake.of("ReserveRequest")) == 2, fake.msgs
        # the first waited (nothing known of the decode), the second went ahead
        assert gw.metric("pdgw_fwd_reserve_ahead_total", {"protocol": "vllm-kvt"}) == 1
        poll(lambda: gw.metric("pdgw_fwd_reserve_granted_total", {"protocol": "vllm-kvt"}) == 2,
             "the held answer was not counted")
        assert gw.metric("pdgw_fwd_reserve_errors_total", {"protocol": "vllm-kvt"}) == 0
        assert not fake.of("CancelNotif"), fake.msgs  # both completed: nothing to release
        wait_idle(sims())
    finally:
        gw.stop()
        fake.close()


def test_reservation_refused_repicks_decode():
    """reserve_on_refusal=repick: a decode without room is replaced by another decode."""
    fake = FakeAllocPort(grant_after=None)
    P = env["noproxyP"]
    full = dict(env["failD"].instance(), alloc_ports=[fake.port])  # never reached by a leg
    gw = Gateway("vllm-kvt", "batch", [P.instance(), full, env["D"].instance()],
                 {"reserve_on_refusal": "repick"}, retries=1,
                 top={"decode_policy": "round-robin"})
    try:
        for _ in range(2):  # round-robin: one of the two starts on the full decode
            rid = "rp-" + uuid.uuid4().hex[:12]
            st, _, obj, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                          {"X-Request-Id": rid})
            assert st == 200, raw
            assert env["D"].records(rid), "served by the decode with room"
            assert not env["failD"].records(rid)
        n = len(fake.of("ReserveRequest"))
        assert n in (1, 2), fake.msgs
        assert gw.metric("pdgw_fwd_reserve_refused_total", {"protocol": "vllm-kvt"}) == n
        # each refusal's (empty) reservation is released too
        poll(lambda: len(fake.of("CancelNotif")) == n, "refused reservations not released")
        wait_idle(sims())
    finally:
        gw.stop()
        fake.close()


def test_prefill_without_kv_params_counted():
    """A prefill that still answers without kv_transfer_params (an engine ending on EOS or a
    stop despite the hardening): counted in pdgw_prefill_missing_kv_params_total; by default
    the decode leg goes without params and recomputes, so the answer is still right."""
    import http.server
    import threading

    seen = []

    class Prefill(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.headers.get("X-Request-Id"), body))
            out = json.dumps({"id": "x", "object": "text_completion", "choices": [
                {"index": 0, "text": "", "finish_reason": "stop"}],
                "kv_transfer_params": None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Prefill)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    both = Sim("both", "both-ref")
    P = {"id": "fake-prefill", "url": f"http://127.0.0.1:{srv.server_address[1]}",
         "role": "prefill"}
    gw = Gateway("vllm-nixl", "batch", [P, env["D"].instance()], {}, retries=0)
    try:
        rid = "mp-" + uuid.uuid4().hex[:12]
        body = client_body(False, False)
        st, _, obj, raw = T.post_json(gw.port, path_of(False), body, {"X-Request-Id": rid})
        assert st == 200, raw
        st, _, ref, _ = T.post_json(both.port, path_of(False), body)
        assert obj["choices"][0]["text"] == ref["choices"][0]["text"], (obj, ref)
        assert seen and seen[0][0] == env["D"].records(rid)[0]["request_id"] and seen[0][1]["kv_transfer_params"]["do_remote_decode"]
        drec = env["D"].records(rid)[0]
        assert "kv_transfer_params" not in drec["body"], drec["body"]
        assert gw.metric("pdgw_prefill_missing_kv_params_total", {"protocol": "vllm-nixl"}) == 1
        wait_idle(sims())
    finally:
        gw.stop()
        both.proc.kill()
        srv.shutdown()
        srv.server_close()


def test_reservation_engines_without_libkvt():
    """A decode without alloc ports is never asked; one whose alloc port does not answer costs
    one reserve_timeout_ms, then is not asked again for a while (5 s): requests go on
    unreserved."""
    P, D = env["noproxyP"], env["D"]
    plain = {k: v for k, v in D.instance().items() if k not in ("alloc_ports", "init_ports")}
    gw = Gateway("vllm-kvt", "batch", [P.instance(), plain], {}, retries=0)
    try:
        st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False))
        assert st == 200, raw
        text = gw.metrics()
        for name in ("pdgw_fwd_reserve_granted_total", "pdgw_fwd_reserve_errors_total"):
            assert not T.metric_value(text, name, {"protocol": "vllm-kvt"}), name
    finally:
        gw.stop()
    dead = dict(D.instance(), alloc_ports=[env["dead_port"]])
    gw = Gateway("vllm-kvt", "batch", [P.instance(), dead], {"reserve_timeout_ms": 4000},
                 retries=0)
    try:
        took = []
        for _ in range(2):
            t0 = time.time()
            st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False))
            took.append(time.time() - t0)
            assert st == 200, raw
        # The first request waits out the 4 s reserve timeout; the second is not asked at
        # all (anything well short of that timeout shows it, however loaded the machine).
        assert took[0] >= 4.0 and took[1] < 3.5, took
        assert gw.metric("pdgw_fwd_reserve_errors_total", {"protocol": "vllm-kvt"}) == 2
        wait_idle(sims())
    finally:
        gw.stop()


def test_silent_alloc_port_holds_up_no_other_reservation():
    """Reservations wait for their answers side by side: while one waits out
    reserve_timeout_ms on an alloc port that never answers, another decode's reservation is
    answered and its request served at once. (Asked one at a time, every request of the
    protocol would wait behind the silent port.)"""
    import threading
    silent, ok = FakeAllocPort(None, silent=True), FakeAllocPort(grant_after=0)
    P, D = env["noproxyP"], env["D"]
    mute = dict(D.instance(), id="decode-mute", alloc_ports=[silent.port])
    good = dict(D.instance(), alloc_ports=[ok.port])
    gw = Gateway("vllm-kvt", "batch", [P.instance(), mute, good], {"reserve_timeout_ms": 4000},
                 retries=0, top={"decode_policy": "round-robin"})
    done, threads = {}, []

    def send(rid):
        t0 = time.time()
        st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                    {"X-Request-Id": rid})
        done[rid] = (st, time.time() - t0, raw)

    try:
        # round-robin starts on either decode: send until one request waits on the silent port
        for k in range(2):
            rid = f"sl-{k}-" + uuid.uuid4().hex[:8]
            th = threading.Thread(target=send, args=(rid,))
            th.start()
            threads.append(th)
            poll(lambda: rid in done or silent.of("ReserveRequest"), "no reservation asked")
            if silent.of("ReserveRequest"):
                break
        assert len(silent.of("ReserveRequest")) == 1 and len(done) == len(threads) - 1, done
        rid = "sl-next-" + uuid.uuid4().hex[:8]
        send(rid)  # the good decode's turn
        st, took, raw = done[rid]
        assert st == 200, raw
        assert ok.of("ReserveRequest")[-1]["req_id"] == D.records(rid)[0]["request_id"]
        # well short of the 4 s the silent port's reservation waits, however loaded the machine
        assert took < 2.0, took
        assert len(done) == len(threads), "the silent port's request ended early"
        for th in threads:
            th.join(10)
        assert all(v[0] == 200 for v in done.values()), done  # it went on unreserved
        assert gw.metric("pdgw_fwd_reserve_errors_total", {"protocol": "vllm-kvt"}) == 1
        wait_idle(sims())
    finally:
        gw.stop()
        silent.close()
        ok.close()


def test_decode_retry_repicks_decode_only():
    """A decode whose front refuses the request (503, the engine never saw it) is replaced by
    another decode; the prefill is neither re-picked nor re-run (vllm-nixl / mooncake serial /
    kvt staged: the KV lives on that prefill and its params stay valid), the failed decode is
    not used again, and the answer is verified KV."""
    Ps, bad, good = [env["noproxyP"], env["P2"]], env["frontD"], env["D"]
    for protocol, mode in (("vllm-nixl", "batch"), ("vllm-nixl", "staged"),
                           ("vllm-mooncake", "batch"), ("vllm-kvt", "staged")):
        gw = Gateway(protocol, mode,
                     [Ps[0].instance(), Ps[1].instance(), bad.instance(), good.instance()],
                     {"mooncake_dispatch": "serial"} if protocol == "vllm-mooncake" else {},
                     retries=1, top={"decode_policy": "round-robin",
                                     "prefill_policy": "round-robin"})
        try:
            retried = 0
            for _ in range(2):  # round-robin: at least one starts on the failing decode
                rid = "rr-" + uuid.uuid4().hex[:12]
                st, hdrs, obj, raw = T.post_json(gw.port, path_of(False),
                                                 client_body(False, False), {"X-Request-Id": rid})
                assert st == 200, (protocol, mode, raw)
                used = [p.name for p in Ps if p.records(rid)]
                assert len(used) == 1, (protocol, mode, "prefill re-picked", used)
                prefill_legs = sum(len(p.records(rid)) for p in Ps)
                assert prefill_legs == 1, (protocol, mode, "prefill leg re-run", prefill_legs)
                brecs, grecs = bad.records(rid), good.records(rid)
                assert len(grecs) == 1 and grecs[0]["kv_result"]["ok"], grecs
                assert len(brecs) <= 1, brecs
                retried += len(brecs)
            assert retried >= 1, (protocol, mode, retried)
            assert gw.metric("pdgw_retries_total", {"protocol": protocol}) == retried
            wait_idle(sims(), timeout=8.0)
        finally:
            gw.stop()


def test_decode_overload_backs_off_keeping_the_prefill():
    """A decode's 429 with Retry-After after the prefill answered: the new decode is tried
    with the same backoff as a first-leg retry (never before the Retry-After), the prefill is
    kept (one prefill leg), and the KV it holds is pulled by the new decode. vLLM's
    NixlConnector keeps the prefill's blocks for a decode until it reads them or
    VLLM_NIXL_ABORT_REQUEST_TIMEOUT passes (vllm-project/vllm vllm/envs.py,
    vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py), far beyond 1 s."""
    P, busy, good = env["P2"], env["busyD"], env["D"]
    gw = Gateway("vllm-nixl", "batch", [P.instance(), busy.instance(), good.instance()], {},
                 retries=1, top={"decode_policy": "round-robin", "retry_backoff_base": "20ms",
                                 "retry_backoff_max": "100ms"})
    try:
        backed_off = 0
        for _ in range(2):  # round-robin: at least one starts on the busy decode
            rid = "bo-" + uuid.uuid4().hex[:12]
            st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                        {"X-Request-Id": rid})
            assert st == 200, raw
            assert len(P.records(rid)) == 1, ("prefill leg re-run", P.records(rid))
            grecs, brecs = good.records(rid), busy.records(rid)
            assert len(grecs) == 1 and grecs[0]["kv_result"]["ok"], grecs
            if brecs:
                assert len(brecs) == 1 and brecs[0]["status"] == 429, brecs
                gap_us = grecs[0]["t_recv_us"] - brecs[0]["t_recv_us"]
                assert gap_us >= 950_000, f"new decode tried {gap_us} us after Retry-After: 1"
                backed_off += 1
        assert backed_off >= 1, backed_off
        assert gw.metric("pdgw_retries_total", {"protocol": "vllm-nixl"}) == backed_off
        wait_idle(sims(), timeout=8.0)
    finally:
        gw.stop()


def test_decode_engine_refusal_reruns_prefill():
    """A vLLM decode engine that answers an error to a request naming a prefill's KV has that
    prefill free the blocks at once (vllm-project/vllm
    vllm/entrypoints/openai/engine/serving.py _with_kv_transfer_rejection_cleanup ->
    vllm/engine/protocol.py notify_kv_transfer_request_rejected -> a pre-aborted request whose
    vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py request_finished
    queues an empty read, and the worker notifies the prefill). So a retry cannot keep that
    prefill: pdgw runs the prefill again (on the same instance) and the new decode reads the
    new KV; the refused request's blocks are gone at once (no hold timeout)."""
    P = Sim("prefill", "prefill-rerun", "--kv-hold-timeout-ms", "600000")
    bad, good = env["failD"], env["D"]
    gw = Gateway("vllm-nixl", "batch", [P.instance(), bad.instance(), good.instance()], {},
                 retries=1, top={"decode_policy": "round-robin"})
    try:
        refused = 0
        for _ in range(2):  # round-robin: at least one starts on the refusing decode
            rid = "rp-" + uuid.uuid4().hex[:12]
            st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                        {"X-Request-Id": rid})
            assert st == 200, raw
            brecs, grecs = bad.records(rid), good.records(rid)
            assert len(grecs) == 1 and grecs[0]["kv_result"]["ok"], grecs
            prefill_legs = len(P.records(rid))
            assert prefill_legs == 1 + len(brecs), ("prefill runs", prefill_legs, len(brecs))
            refused += len(brecs)
        assert refused >= 1, refused
        poll(lambda: P.metric("sim_kv_pages_pinned") == 0, "the prefill's pages held", 10.0)
        assert P.metric("sim_kv_rejected_releases_total") == refused
        assert P.metric("sim_kv_hold_timeouts_total") == 0
        assert gw.metric("pdgw_retries_total", {"protocol": "vllm-nixl"}) == refused
    finally:
        gw.stop()
        P.proc.kill()


def main():
    setup()
    tests = [make_disconnect_test(*c) for c in DISCONNECT_CONFIGS]
    tests += [test_lmcache_proxynotif_never_comes, test_reservation_queue_then_granted,
              test_reservation_goes_ahead_with_room,
              test_reservation_refused_repicks_decode, test_reservation_engines_without_libkvt,
              test_silent_alloc_port_holds_up_no_other_reservation,
              test_prefill_without_kv_params_counted, test_decode_retry_repicks_decode_only,
              test_decode_overload_backs_off_keeping_the_prefill,
              test_decode_engine_refusal_reruns_prefill,
              test_prefill_failure_taxonomy,
              test_decode_failure_taxonomy]
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
                    out = p.output()
                    if p.name.startswith("pdgw") or "Sanitizer" in out or not p.alive():
                        print(f"---- log of {p.name} (alive={p.alive()}) ----")
                        print(out[-4000:])
    finally:
        T._cleanup()
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
