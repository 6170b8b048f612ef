"""No stranded KV: when the prefill answered and the decode leg never reached an engine,
pdgw hands the prefill's KV to a decode engine at once instead of leaving it to the
prefill's lease/abort timeout.

Upstream facts (vllm-project/vllm):
- vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py and
  mooncake/mooncake_connector.py request_finished(): a decode request that still carries
  do_remote_prefill when it ends (aborted before it was scheduled, or rejected by the
  serving layer) queues an empty read, and the worker notifies the prefill to free its
  blocks; a scheduled decode reads them, which frees them too. Until then the prefill holds
  them (kv_lease_duration / VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
  VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT). pdgw-sim's prefill holds the same way
  (--kv-hold-timeout-ms, here 10 minutes) and frees when a decode takes the KV.

- vllm-nixl (serial): one decode instance cannot be connected to; vllm-mooncake (both legs
  at once): one decode answers 503 only after the prefill answered (a refusing front of a
  decode). Retries off: the client gets its error, pdgw sends the decode request to the
  other decode cut to one token, and the prefill sim's held pages are back to 0 long before
  its hold timeout (waited on as a condition); counted
  pdgw_kv_release_total{reason=decode_refused,result=ok}; no hold timeout fired.
- vllm-nixl, the decode engine itself refuses (an error answer from vLLM's serving layer,
  vllm/entrypoints/openai/engine/serving.py _with_kv_transfer_rejection_cleanup, which calls
  vllm/engine/protocol.py notify_kv_transfer_request_rejected): the engine has the prefill
  free the blocks itself (pdgw-sim's decode sends the release; sim_kv_rejected_releases_total),
  the pages are back to 0 at once, and pdgw sends no release of its own (the blocks are gone).
"""

import http.server
import threading

import time
import uuid

import pdgwtest as T
from fwdconf import Gateway, Sim, client_body, path_of, wait_idle

HOLD = ["--kv-hold-timeout-ms", "600000"]


def wait_until(what, cond, timeout=20.0):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def refusing_decode():
    """A decode front that answers 503 after 300 ms (the prefill has answered by then)."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status, body):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            self.reply(200, b"{}")

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", "0")))
            time.sleep(0.3)
            self.reply(503, b'{"error": {"message": "overloaded"}}')

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def run(protocol, pextra, refusing):
    P = Sim("prefill", f"rel-P-{protocol}", *HOLD, *pextra)
    D = Sim("decode", f"rel-D-{protocol}")
    fake = refusing_decode() if refusing else None
    port = fake.server_address[1] if fake else T.free_port()
    dead = {"id": "dead-decode", "url": f"http://127.0.0.1:{port}", "role": "decode",
            "engine_id": "dead"}
    # the unreachable decode stays bookable (probes rare, many failures to go down)
    gw = Gateway(protocol, "batch", [P.instance(), dead, D.instance()], {}, retries=0,
                 top={"decode_policy": "round-robin", "health_interval": "1h",
                      "unhealthy_threshold": 100})
    try:
        failed = 0
        for i in range(4):
            st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                        {"X-Request-Id": f"rel-{uuid.uuid4().hex[:8]}"})
            assert st in (200, 502, 503, 504), (st, raw[:200])
            failed += st != 200
        assert failed == 2, failed  # round-robin over the two decodes
        wait_until("the release answers",
                   lambda: gw.metric("pdgw_kv_release_total",
                                     {"reason": "decode_refused", "result": "ok"}) == failed)
        wait_until("the prefill's held pages back to 0",
                   lambda: P.metric("sim_kv_pages_pinned") == 0)
        assert P.metric("sim_kv_hold_timeouts_total") == 0
        assert gw.metric("pdgw_kv_release_total", {"reason": "decode_refused",
                                                   "result": "failed"}) == 0
        wait_idle([P, D])
    finally:
        gw.stop()
        P.proc.kill()
        D.proc.kill()
        if fake:
            fake.shutdown()
            fake.server_close()


def test_nixl_decode_unreachable():
    run("vllm-nixl", [], refusing=False)


def test_mooncake_decode_refuses():
    run("vllm-mooncake", ["--kv-connector", "mooncake"], refusing=True)


def test_nixl_decode_engine_refuses():
    P = Sim("prefill", "rel-P-engine", *HOLD)
    bad = Sim("decode", "rel-D-refuses", "--fail-rate", "1", "--fail-status", "500")
    D = Sim("decode", "rel-D-ok")
    gw = Gateway("vllm-nixl", "batch", [P.instance(), bad.instance(), D.instance()], {},
                 retries=0, top={"decode_policy": "round-robin"})
    try:
        failed = 0
        for i in range(4):
            st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                        {"X-Request-Id": f"rel-{uuid.uuid4().hex[:8]}"})
            assert st in (200, 500, 502), (st, raw[:200])
            failed += st != 200
        assert failed == 2, failed  # round-robin over the two decodes
        wait_until("the prefill's held pages back to 0",
                   lambda: P.metric("sim_kv_pages_pinned") == 0)
        assert P.metric("sim_kv_rejected_releases_total") == failed
        assert P.metric("sim_kv_hold_timeouts_total") == 0
        for result in ("ok", "failed"):
            assert gw.metric("pdgw_kv_release_total", {"reason": "decode_refused",
                                                       "result": result}) == 0, result
        wait_idle([P, D])
    finally:
        gw.stop()
        for s in (P, bad, D):
            s.proc.kill()


if __name__ == "__main__":
    T.run([test_nixl_decode_unreachable, test_mooncake_decode_refuses,
           test_nixl_decode_engine_refuses])
