"""vllm-nixl through a real pdgw and pdgw-sim, checked against upstream vLLM's NixlConnector.

- Both answer shapes of a NIXL prefill (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
  pull_scheduler.py request_finished): the newest (remote_block_ids one list per KV-cache
  group, tp/dcp/pp sizes, remote_num_tokens, remote_blocks_expiry_time, transfer_mode, and
  the engine's randomized request id, vllm/v1/engine/input_processor.py assign_request_id)
  and the older flat one; pdgw copies either verbatim and the decode pulls and verifies.
- A prefill whose params the decode cannot use (update_state_after_alloc) makes the decode
  recompute: pdgw counts it and warns once per window; the sim counts the recompute.
- X-data-parallel-rank goes to a prefill instance with DP (vllm/entrypoints/openai/
  serving_engine.py _get_data_parallel_rank).
- The lease (nixl/base_scheduler.py kv_lease_duration, 30 s): a decode that fails within it
  is replaced without re-running the prefill; after it the prefill runs again."""

import http.server
import json
import re
import threading
import time
import uuid

import pdgwtest as T
import fwdconf
from fwdconf import Gateway, Sim, client_body, path_of, wait_idle

env = {}


def setup():
    env["both"] = Sim("both", "both")
    # the sims' hold timeout stands for the lease: KV no decode read is freed after it
    hold = ["--kv-hold-timeout-ms", "1500"]
    env["Pnew"] = Sim("prefill", "prefill-newest", *hold)
    env["Pold"] = Sim("prefill", "prefill-older", "--nixl-shape", "older", *hold)
    env["D"] = Sim("decode", "decode-0")
    env["refs"] = {chat: fwdconf.reference(env["both"], chat) for chat in (False, True)}


def sims():
    return [env["both"], env["Pnew"], env["Pold"], env["D"]]


def one(gw, chat, P):
    rid = "nx-" + uuid.uuid4().hex[:12]
    text, _, _ = fwdconf.send(gw, chat, False, rid)
    assert text == env["refs"][chat][0], (text, env["refs"][chat][0])
    prec = [r for r in P.records(rid) if r["path"] == path_of(chat)]
    drec = [r for r in env["D"].records(rid) if r["path"] == path_of(chat)]
    assert len(prec) == 1 and len(drec) == 1, (prec, drec)
    return prec[0], drec[0]


def test_newest_and_older_shapes():
    for name, newest in (("Pnew", True), ("Pold", False)):
        P = env[name]
        gw = Gateway("vllm-nixl", "batch", [P.instance(), env["D"].instance()], {})
        try:
            for chat in (False, True):
                prec, drec = one(gw, chat, P)
                back = prec["response_kv_transfer_params"]
                leg_id = prec["request_id"]
                wrap = f"chatcmpl-{leg_id}" if chat else f"cmpl-{leg_id}-0"
                ids = back["remote_block_ids"]
                if newest:
                    assert re.fullmatch(re.escape(wrap) + "-[0-9a-f]{8}",
                                        back["remote_request_id"]), back
                    assert isinstance(ids, list) and len(ids) == 1 and ids[0] and \
                        all(isinstance(b, int) for b in ids[0]), ids
                    for k in ("dcp_size", "pp_size", "remote_num_tokens", "transfer_mode"):
                        assert k in back, (k, back)
                    assert back["remote_blocks_expiry_time"] is None, back
                    assert back["transfer_mode"] == "pull", back
                    # the prefill computed the whole prompt
                    assert back["remote_num_tokens"] == env["refs"][chat][1]["prompt_tokens"], back
                else:
                    assert back["remote_request_id"] == wrap, back
                    assert ids and all(isinstance(b, int) for b in ids), ids
                    assert "dcp_size" not in back and "transfer_mode" not in back, back
                assert back["tp_size"] == 1, back
                assert drec["body"]["kv_transfer_params"] == back, (drec["body"], back)
                res = drec["kv_result"]
                assert res["ok"] and not res["recompute"] and res["verify_failures"] == 0, res
            assert not gw.metric("pdgw_prefill_missing_kv_params_total",
                                 {"protocol": "vllm-nixl"})
            wait_idle(sims())
        finally:
            gw.stop()


def fake_prefill(drop):
    """A prefill that answers vLLM's newest params minus <drop> (no KV behind them)."""
    seen = []

    class Prefill(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append(body)
            kvp = {"do_remote_prefill": True, "do_remote_decode": False,
                   "remote_block_ids": [[1, 2]], "remote_engine_id": "fake",
                   "remote_request_id": "cmpl-x-0-00000000", "remote_host": "127.0.0.1",
                   "remote_port": 1, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
                   "remote_num_tokens": 30, "remote_blocks_expiry_time": None,
                   "transfer_mode": "pull"}
            del kvp[drop]
            out = json.dumps({"id": "cmpl-x", "object": "text_completion",
                              "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                              "kv_transfer_params": kvp}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self):  # noqa: N802  (health probes: an engine that answers them)
            out = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Prefill)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_unusable_params_recompute():
    """Params without remote_request_id: the decode recomputes (as vLLM), pdgw counts every
    one and warns once for the two."""
    srv, seen = fake_prefill("remote_request_id")
    D = env["D"]
    P = {"id": "fake-prefill", "url": f"http://127.0.0.1:{srv.server_address[1]}",
         "role": "prefill"}
    gw = Gateway("vllm-nixl", "batch", [P, D.instance()], {}, retries=0)
    try:
        before = D.metric("sim_kv_invalid_params_total")
        for _ in range(2):
            rid = "inc-" + uuid.uuid4().hex[:12]
            text, _, _ = fwdconf.send(gw, False, False, rid)
            assert text == env["refs"][False][0], text
            drec = D.records(rid)[0]
            assert drec["kv_result"]["recompute"] and drec["kv"]["invalid"] == "remote_request_id"
            assert "remote_request_id" not in drec["body"]["kv_transfer_params"], drec
        assert len(seen) == 2
        assert D.metric("sim_kv_invalid_params_total") == before + 2
        assert gw.metric("pdgw_prefill_missing_kv_params_total", {"protocol": "vllm-nixl"}) == 2
        assert gw.metric("pdgw_fwd_incomplete_kv_params_total", {"protocol": "vllm-nixl"}) == 2
        wait_idle(sims())
    finally:
        gw.stop()
        srv.shutdown()
        srv.server_close()
    log = gw.proc.output()
    assert log.count("lack a usable remote_request_id") == 1, log[-3000:]


def test_dp_rank_header():
    P, D = env["Pnew"], env["D"]
    inst = dict(P.instance(), dp_rank=1, dp_size=2)
    gw = Gateway("vllm-nixl", "batch", [inst, D.instance()], {})
    try:
        prec, drec = one(gw, False, P)
        hdrs = {k.lower(): v for k, v in prec["headers"].items()}
        assert hdrs.get("x-data-parallel-rank") == "1", hdrs
        dh = {k.lower(): v for k, v in drec["headers"].items()}
        assert "x-data-parallel-rank" not in dh, dh
        wait_idle(sims())
    finally:
        gw.stop()


def slow_failing_decode(delay_s):
    """A decode that answers 503 after <delay_s>: the failure lands after a short lease."""
    hits = []

    class Decode(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["content-length"]))
            hits.append(time.time())
            time.sleep(delay_s)
            out = b'{"error":{"message":"overloaded","type":"server_error","code":503}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self):  # noqa: N802
            out = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Decode)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, hits


def test_lease_decides_decode_only_retry():
    """Within the lease a failed decode is replaced and the prefill kept (one prefill leg);
    past it the prefill runs again (two prefill legs), as the KV may be gone. (A retry that
    re-picks the prefill avoids the one already used, hence two prefill instances.)"""
    Ps, D = [env["Pnew"], env["Pold"]], env["D"]
    srv, hits = slow_failing_decode(0.3)
    bad = {"id": "bad-decode", "url": f"http://127.0.0.1:{srv.server_address[1]}",
           "role": "decode"}
    try:
        for lease_ms, want_prefill_legs in ((30000, 1), (100, 2)):
            gw = Gateway("vllm-nixl", "batch", [Ps[0].instance(), Ps[1].instance(), bad,
                                                D.instance()],
                         {"kv_lease_ms": lease_ms}, retries=1,
                         top={"decode_policy": "round-robin"})
            try:
                retried = 0
                for _ in range(2):  # round-robin: one of the two starts on the bad decode
                    n_bad = len(hits)
                    rid = "ls-" + uuid.uuid4().hex[:12]
                    text, _, _ = fwdconf.send(gw, False, False, rid)
                    assert text == env["refs"][False][0], text
                    drec = D.records(rid)
                    assert len(drec) == 1 and drec[0]["kv_result"]["ok"], drec
                    legs = [r for P in Ps for r in P.records(rid) if r["path"] == path_of(False)]
                    if len(hits) > n_bad:
                        retried += 1
                        assert len(legs) == want_prefill_legs, (lease_ms, legs)
                    else:
                        assert len(legs) == 1, legs
                assert retried >= 1, retried
                # the abandoned first prefill's KV is freed when its lease (hold) ends
                wait_idle(sims(), timeout=8.0)
            finally:
                gw.stop()
    finally:
        srv.shutdown()
        srv.server_close()


def main():
    setup()
    from test_fwd_matrix import run
    run([test_newest_and_older_shapes, test_unusable_params_recompute, test_dp_rank_header,
         test_lease_decides_decode_only_retry])


if __name__ == "__main__":
    main()
