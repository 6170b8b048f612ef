"""vllm-mooncake against pdgw-sim prefills that follow upstream vLLM's MooncakeConnector
(--kv-connector mooncake): the exact fields of both legs, KV moved and verified byte by byte
(no recompute), the engine id learnt from the prefill's bootstrap server and refreshed after a
restart, the DP header with the engine id of that rank, and the explicit serial shape.

Upstream facts (vllm-project/vllm):
- vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py: a prefill
  (do_remote_decode) without transfer_id logs "Missing transfer_id" and sends nothing; the
  decode needs remote_engine_id, remote_bootstrap_addr and transfer_id, asks
  <remote_bootstrap_addr>/query and fails the load when the engine id is not listed there;
  request_finished returns no kv_transfer_params.
- vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py: the bootstrap
  server's GET /query answers {dp_rank: {engine_id, worker_addr}}.
- examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py: both legs at once,
  transfer_id "xfer-<uuid>", X-data-parallel-rank on the prefill leg, remote_engine_id of that
  rank from /query, bootstrap port 8998 when none is given.
"""

import http.server
import json
import threading
import time
import uuid

import pdgwtest as T
from fwdconf import Gateway, Sim, client_body, path_of, wait_idle

MC = ["--kv-connector", "mooncake"]


def query(P):
    st, _, body = T.request("GET", P.boot_port, "/query")
    assert st == 200, body
    return json.loads(body)


def one(gw, rid, chat=False, stream=False, headers=None):
    body = client_body(chat, stream)
    hdr = dict(headers or {}, **{"X-Request-Id": rid})
    if stream:
        evs = list(T.sse_events(gw.port, path_of(chat), body, hdr))
        assert evs[-1] == "[DONE]", evs[-3:]
        return T.stream_text(evs)
    st, _, obj, raw = T.post_json(gw.port, path_of(chat), body, hdr)
    assert st == 200, raw
    ch = obj["choices"][0]
    return ch["message"]["content"] if chat else ch["text"]


def legs(sim, rid, chat=False):
    return [r for r in sim.records(rid) if r["path"] == path_of(chat)]


def check_kv_ok(drec):
    res = drec["kv_result"]
    assert res["ok"] and res["pages"] > 0 and res["verify_failures"] == 0, res
    assert res["recompute"] is False, res


def test_legs_exact_kv_verified():
    """Default shape: prefill {do_remote_decode, do_remote_prefill, transfer_id}, no params
    back; decode {do_remote_prefill, do_remote_decode, remote_bootstrap_addr,
    remote_engine_id (from /query), transfer_id}; the KV arrives and verifies."""
    both = Sim("both", "both-mc")
    P, D = Sim("prefill", "prefill-mc", *MC), Sim("decode", "decode-mc")
    gw = Gateway("vllm-mooncake", "batch", [P.instance(), D.instance()])
    try:
        eid = query(P)["0"]["engine_id"]
        tids = set()
        for chat in (False, True):
            for stream in (False, True):
                rid = "mc-" + uuid.uuid4().hex[:12]
                text = one(gw, rid, chat, stream)
                st, _, ref, raw = T.post_json(both.port, path_of(chat), client_body(chat, False))
                ch = ref["choices"][0]
                assert text == (ch["message"]["content"] if chat else ch["text"]), (text, ref)
                [prec], [drec] = legs(P, rid, chat), legs(D, rid, chat)
                leg_id = drec["request_id"]
                tid = f"xfer-{leg_id}"
                assert prec["request_id"] == leg_id, (prec["request_id"], leg_id)
                assert prec["body"]["kv_transfer_params"] == {
                    "do_remote_decode": True, "do_remote_prefill": False,
                    "transfer_id": tid}, prec["body"]
                assert "x-data-parallel-rank" not in prec["headers"], prec["headers"]
                assert not prec.get("response_kv_transfer_params"), prec
                assert drec["body"]["kv_transfer_params"] == {
                    "do_remote_prefill": True, "do_remote_decode": False,
                    "remote_bootstrap_addr": f"http://127.0.0.1:{P.boot_port}",
                    "remote_engine_id": eid, "transfer_id": tid}, drec["body"]
                check_kv_ok(drec)
                tids.add(tid)
        assert len(tids) == 4, tids
        assert not gw.metric("pdgw_prefill_missing_kv_params_total",
                             {"protocol": "vllm-mooncake"})
        wait_idle([P, D])
    finally:
        gw.stop()


def test_engine_id_refreshed_after_restart():
    """A restarted prefill has new engine ids: the decode of the first request names the
    stale id and fails (upstream: "remote engine_id ... not found from bootstrap server",
    kv_load_failure_policy fail); pdgw asks /query again and the retry (on the other decode:
    a failed instance is not re-used within a request) carries the new id."""
    # the first attempt's prefill KV is never claimed: like vLLM (its abort timeout) the sim
    # frees it after its hold timeout, short here so the test can wait for idle
    P = Sim("prefill", "prefill-rs", *MC, "--kv-hold-timeout-ms", "1000")
    Ds = [Sim("decode", "decode-rs1"), Sim("decode", "decode-rs2")]
    gw = Gateway("vllm-mooncake", "batch", [P.instance()] + [d.instance() for d in Ds],
                 retries=1)

    def decode_legs(rid):
        return sorted((r for d in Ds for r in legs(d, rid)), key=lambda r: r["time_ns"])

    try:
        old = query(P)["0"]["engine_id"]
        rid = "rs-" + uuid.uuid4().hex[:12]
        one(gw, rid)
        assert decode_legs(rid)[0]["body"]["kv_transfer_params"]["remote_engine_id"] == old
        st, _, body = T.request("POST", P.port, "/sim/restart")
        assert st == 200, body
        new = query(P)["0"]["engine_id"]
        assert new != old, (old, new)
        rid = "rs-" + uuid.uuid4().hex[:12]
        one(gw, rid)  # succeeds for the client
        drecs = decode_legs(rid)
        assert [r["body"]["kv_transfer_params"]["remote_engine_id"] for r in drecs] == \
            [old, new], drecs
        assert "not found" in drecs[0]["kv_result"]["error"], drecs[0]
        check_kv_ok(drecs[1])
        assert gw.metric("pdgw_fwd_mooncake_engine_id_changes_total",
                         {"protocol": "vllm-mooncake"}) >= 1
        # the next request uses the new id at once
        rid = "rs-" + uuid.uuid4().hex[:12]
        one(gw, rid)
        [drec] = decode_legs(rid)
        assert drec["body"]["kv_transfer_params"]["remote_engine_id"] == new
        check_kv_ok(drec)
        wait_idle([P] + Ds)
    finally:
        gw.stop()


def test_dp_rank_header_and_engine_id():
    """A prefill with DP > 1: the prefill leg carries X-data-parallel-rank and the decode
    names the engine id /query lists for that rank; the KV comes from that rank."""
    P = Sim("prefill", "prefill-dp", *MC, "--dp-size", "2")
    D = Sim("decode", "decode-dp")
    q = query(P)
    assert set(q) == {"0", "1"} and q["0"]["engine_id"] != q["1"]["engine_id"], q
    for rank in (1, 0):
        inst = P.instance()
        inst.update(id=f"prefill-dp-r{rank}", dp_rank=rank, dp_size=2)
        gw = Gateway("vllm-mooncake", "batch", [inst, D.instance()])
        try:
            rid = "dp-" + uuid.uuid4().hex[:12]
            # a client's own DP header is not forwarded: the gateway picked the rank
            one(gw, rid, headers={"X-data-parallel-rank": str(1 - rank)})
            [prec], [drec] = legs(P, rid), legs(D, rid)
            assert prec["headers"].get("x-data-parallel-rank") == str(rank), prec["headers"]
            assert "x-data-parallel-rank" not in drec["headers"], drec["headers"]
            assert prec["kv"]["dp_rank"] == rank, prec["kv"]
            assert drec["body"]["kv_transfer_params"]["remote_engine_id"] == \
                q[str(rank)]["engine_id"], drec["body"]
            check_kv_ok(drec)
        finally:
            gw.stop()
    # the prefill refuses a decode that names another rank's engine for the transfer
    rid = "dpx-" + uuid.uuid4().hex[:12]
    tid = "xfer-" + rid
    body = client_body(False, False)
    pb = dict(body, max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid})
    st, _, _, raw = T.post_json(P.port, "/v1/completions", pb, {"X-data-parallel-rank": "1"})
    assert st == 200, raw
    db = dict(body, kv_transfer_params={
        "do_remote_prefill": True, "do_remote_decode": False,
        "remote_bootstrap_addr": f"http://127.0.0.1:{P.boot_port}",
        "remote_engine_id": q["0"]["engine_id"], "transfer_id": tid})
    st, _, _, raw = T.post_json(D.port, "/v1/completions", db, {"X-Request-Id": rid})
    assert st >= 500, raw
    wait_idle([P, D])


def test_serial_shape_against_upstream_prefill_transfers_nothing():
    """mooncake_dispatch serial (Llumnix's fork) against an upstream prefill: no transfer_id,
    so the prefill sends nothing and returns no params; pdgw counts it and the decode
    recomputes (why serial is opt-in)."""
    P, D = Sim("prefill", "prefill-se", *MC), Sim("decode", "decode-se")
    gw = Gateway("vllm-mooncake", "batch", [P.instance(), D.instance()],
                 {"mooncake_dispatch": "serial"})
    try:
        rid = "se-" + uuid.uuid4().hex[:12]
        one(gw, rid)
        [prec], [drec] = legs(P, rid), legs(D, rid)
        assert "transfer_id" not in prec["body"]["kv_transfer_params"], prec["body"]
        assert prec.get("kv_warning") == "missing transfer_id in kv_transfer_params", prec
        assert not prec.get("response_kv_transfer_params"), prec
        assert "kv_transfer_params" not in drec["body"], drec["body"]
        assert gw.metric("pdgw_prefill_missing_kv_params_total",
                         {"protocol": "vllm-mooncake"}) == 1
        wait_idle([P, D])
    finally:
        gw.stop()


def test_static_engine_id_override():
    """mooncake_engine_id: config uses the instance's engine_id without asking /query."""
    P, D = Sim("prefill", "prefill-st", *MC), Sim("decode", "decode-st")
    gw = Gateway("vllm-mooncake", "batch", [P.instance(), D.instance()],
                 {"mooncake_engine_id": "config"})
    try:
        rid = "st-" + uuid.uuid4().hex[:12]
        one(gw, rid)
        [drec] = legs(D, rid)
        assert drec["body"]["kv_transfer_params"]["remote_engine_id"] == P.engine_id
        check_kv_ok(drec)
        assert not gw.metric("pdgw_fwd_mooncake_bootstrap_queries_total",
                             {"protocol": "vllm-mooncake"})
    finally:
        gw.stop()


def test_unreachable_bootstrap_is_a_clear_error():
    """No bootstrap server answers: a 502 naming the engine id lookup, no decode leg sent."""
    P, D = Sim("prefill", "prefill-nb", *MC), Sim("decode", "decode-nb")
    inst = P.instance()
    inst["bootstrap_port"] = T.free_port()  # nothing listens there
    gw = Gateway("vllm-mooncake", "batch", [inst, D.instance()], retries=0)
    try:
        rid = "nb-" + uuid.uuid4().hex[:12]
        st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                    {"X-Request-Id": rid})
        assert st == 502 and b"engine id" in raw, (st, raw)
        assert not legs(D, rid) and not legs(P, rid)
        assert gw.metric("pdgw_fwd_mooncake_bootstrap_query_failures_total",
                         {"protocol": "vllm-mooncake"}) >= 1
    finally:
        gw.stop()


def test_garbage_bootstrap_answer_is_a_clear_error():
    """A bootstrap port that answers something else than a /query map (not JSON, wrong
    types, an error status): 502 naming the problem, counted, no leg sent, pdgw stays up."""
    answers = [(200, b"not json"), (200, b'{"0": {"engine_id": 5}}'), (200, b"[]"),
               (500, b'{"detail": "boom"}')]

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            st, body = answers[0]
            self.send_response(st)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    P, D = Sim("prefill", "prefill-gb", *MC), Sim("decode", "decode-gb")
    inst = P.instance()
    inst["bootstrap_port"] = srv.server_address[1]
    gw = Gateway("vllm-mooncake", "batch", [inst, D.instance()], retries=0,
                 opts={"mooncake_bootstrap_ttl_ms": 100, "mooncake_bootstrap_timeout_ms": 10000})
    try:
        lab = {"protocol": "vllm-mooncake"}
        while answers:
            want = b"HTTP 500" if answers[0][0] == 500 else b"not a Mooncake bootstrap answer"
            before = gw.metric("pdgw_fwd_mooncake_bootstrap_query_failures_total", lab)
            deadline = time.monotonic() + 15
            while True:  # the previous failure is served from the cache for 500 ms
                rid = "gb-" + uuid.uuid4().hex[:12]
                st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                            {"X-Request-Id": rid})
                assert st == 502, (st, raw)
                fresh = gw.metric("pdgw_fwd_mooncake_bootstrap_query_failures_total", lab) > before
                if (fresh and want in raw) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert fresh and want in raw, (answers[0], raw)
            assert not legs(D, rid) and not legs(P, rid)
            answers.pop(0)
    finally:
        gw.stop()
        srv.shutdown()


def test_one_query_for_many_waiters_and_a_background_refresh():
    """Eight requests that find the cache cold wait for one GET /query (not one each); once
    the answer is older than mooncake_bootstrap_ttl_ms, the request that finds it so goes on
    with the answer in hand while its refresh is still unanswered."""
    P, D = Sim("prefill", "prefill-sf", *MC), Sim("decode", "decode-sf")
    hits, release = [], threading.Event()

    class H(http.server.BaseHTTPRequestHandler):  # the prefill's /query, held until released
        def do_GET(self):
            if self.headers.get("X-Request-Id"):  # the gateway's (the decodes ask too)
                hits.append(self.path)
                release.wait(20)
            st, _, body = T.request("GET", P.boot_port, "/query")
            try:
                self.send_response(st)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a refresh dropped when its request ended

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    inst = P.instance()
    inst["bootstrap_port"] = srv.server_address[1]
    gw = Gateway("vllm-mooncake", "batch", [inst, D.instance()], retries=0,
                 opts={"mooncake_bootstrap_ttl_ms": 300, "mooncake_bootstrap_timeout_ms": 20000})
    lab = {"protocol": "vllm-mooncake"}
    try:
        eid = query(P)["0"]["engine_id"]
        done = []
        ts = [threading.Thread(target=lambda i=i: done.append(one(gw, f"sf-{i}-{uuid.uuid4().hex[:8]}")))
              for i in range(8)]
        for t in ts:
            t.start()
        T.wait_for(lambda: gw.metric("pdgw_inflight_requests") == 8, 10, "8 requests waiting")
        assert hits == ["/query"] and not done, (hits, done)
        release.set()
        for t in ts:
            t.join(20)
        assert len(done) == 8, done
        assert hits == ["/query"], hits
        assert gw.metric("pdgw_fwd_mooncake_bootstrap_queries_total", lab) == 1
        # past the TTL: the refresh is held, yet requests are answered with the id in hand
        release.clear()
        deadline = time.monotonic() + 10
        while len(hits) < 2 and time.monotonic() < deadline:
            rid = "sf-" + uuid.uuid4().hex[:12]
            one(gw, rid)
            [drec] = legs(D, rid)
            assert drec["body"]["kv_transfer_params"]["remote_engine_id"] == eid
            check_kv_ok(drec)
        assert len(hits) == 2, hits
        for _ in range(3):  # while the refresh is still held (and perhaps asked again)
            one(gw, "sf-" + uuid.uuid4().hex[:12])
        release.set()
        assert not gw.metric("pdgw_fwd_mooncake_bootstrap_query_failures_total", lab)
        wait_idle([P, D])
    finally:
        release.set()
        gw.stop()
        srv.shutdown()


def test_stop_on_first_token_still_moves_kv():
    """The MooncakeConnector sends KV only for a length-capped prefill
    (mooncake_connector.py, request_finished). A client stop string that matches the first
    token would make the prefill stop: pdgw's prefill leg drops stop and sets ignore_eos, so
    the KV still moves; the same request sent raw to the prefill sends nothing."""
    both = Sim("both", "both-st")
    P, D = Sim("prefill", "prefill-sf", *MC), Sim("decode", "decode-sf",
                                                  "--kv-wait-timeout-ms", "1500")
    body = client_body(False, False)
    st, _, ref, raw = T.post_json(both.port, "/v1/completions", dict(body, stop=None))
    assert st == 200, raw
    first = ref["choices"][0]["text"].split()[0]
    body = dict(body, stop=[first], ignore_eos=False)
    st, _, ref, raw = T.post_json(both.port, "/v1/completions", body)
    assert st == 200 and ref["choices"][0]["finish_reason"] == "stop", raw
    gw = Gateway("vllm-mooncake", "batch", [P.instance(), D.instance()])
    try:
        rid = "sf-" + uuid.uuid4().hex[:12]
        st, _, obj, raw = T.post_json(gw.port, "/v1/completions", body, {"X-Request-Id": rid})
        assert st == 200, raw
        assert obj["choices"][0]["text"] == ref["choices"][0]["text"], (obj, ref)
        check_kv_ok(legs(D, rid)[0])
    finally:
        gw.stop()
    # the raw request on the prefill: stops on the first token, sends nothing
    tid = "xfer-raw-" + uuid.uuid4().hex[:8]
    pb = dict(body, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                        "transfer_id": tid})
    rid = "sfr-" + uuid.uuid4().hex[:12]
    st, _, obj, raw = T.post_json(P.port, "/v1/completions", pb, {"X-Request-Id": rid})
    assert st == 200 and obj["choices"][0]["finish_reason"] == "stop", raw
    assert "not 'length'" in legs(P, rid)[0]["kv_warning"], legs(P, rid)[0]
    db = dict(body, kv_transfer_params={
        "do_remote_prefill": True, "do_remote_decode": False,
        "remote_bootstrap_addr": f"http://127.0.0.1:{P.boot_port}",
        "remote_engine_id": query(P)["0"]["engine_id"], "transfer_id": tid})
    st, _, _, raw = T.post_json(D.port, "/v1/completions", db, {"X-Request-Id": rid + "d"})
    assert st >= 500, raw
    wait_idle([P, D])


def test_decode_only_retry_reuses_the_pending_transfer():
    """A decode that refuses (503) after the prefill answered never reached vLLM's scheduler
    with the transfer: the prefill still holds the KV under its transfer_id (upstream
    vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py:
    request_finished keeps the blocks (delay_free_blocks) in reqs_need_send keyed by
    transfer_id until a decode asks for that transfer_id in send_kv_to_decode, or until
    VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, vllm/envs.py). The retry therefore sends the decode
    only, to another decode, with the same transfer_id: one prefill leg, the KV lands on the
    second decode and verifies, counted as pdgw_fwd_mooncake_transfer_reuses_total. Before,
    the retry ran the prefill again under a new transfer_id and the first one stayed pinned."""
    P = Sim("prefill", "prefill-ru", *MC)
    D2 = Sim("decode", "decode-ru")
    state = {"rid": None, "hits": []}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # health probes and metric scrapes
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(n) or b"{}")
            state["hits"].append(body)
            # refuse only once the prefill has answered, so the prefill's KV is held for
            # this transfer_id when the decode fails (a condition with a deadline)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if any(r.get("status") == 200 for r in P.records(state["rid"])):
                    break
                time.sleep(0.01)
            msg = b'{"error":{"message":"overloaded"}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    d1 = {"id": "decode-refuses", "url": f"http://127.0.0.1:{srv.server_address[1]}",
          "role": "decode", "engine_id": "decode-refuses"}
    gw = Gateway("vllm-mooncake", "batch", [P.instance(), d1, D2.instance()], retries=2,
                 top={"decode_policy": "round-robin"})
    lab = {"protocol": "vllm-mooncake"}
    try:
        for _ in range(4):  # round robin: one of the first two requests meets the refusal
            rid = state["rid"] = "ru-" + uuid.uuid4().hex[:12]
            before = len(state["hits"])
            one(gw, rid)
            if len(state["hits"]) > before:
                break
        assert len(state["hits"]) > before, "the refusing decode was never picked"
        refused = state["hits"][-1]["kv_transfer_params"]
        precs, [drec] = legs(P, rid), legs(D2, rid)
        assert len(precs) == 1, precs  # the prefill ran once
        tid = precs[0]["body"]["kv_transfer_params"]["transfer_id"]
        assert refused["transfer_id"] == tid, (refused, tid)
        assert drec["body"]["kv_transfer_params"] == refused, (drec["body"], refused)
        check_kv_ok(drec)
        assert gw.metric("pdgw_fwd_mooncake_transfer_reuses_total", lab) == 1
        wait_idle([P, D2])
    finally:
        gw.stop()
        srv.shutdown()


if __name__ == "__main__":
    T.run([test_legs_exact_kv_verified, test_engine_id_refreshed_after_restart,
           test_dp_rank_header_and_engine_id,
           test_serial_shape_against_upstream_prefill_transfers_nothing,
           test_static_engine_id_override, test_unreachable_bootstrap_is_a_clear_error,
           test_garbage_bootstrap_answer_is_a_clear_error,
           test_one_query_for_many_waiters_and_a_background_refresh,
           test_stop_on_first_token_still_moves_kv,
           test_decode_only_retry_reuses_the_pending_transfer])
