"""pdgw-sim: a client that goes away while its request is held before the
response started (prefill computing, queued for admission, decode waiting for
KV) is noticed within a second, its work stops and no KV stays pinned or used;
vllm-kvt transfers are named by the decode leg's X-Request-Id."""

import copy
import json
import socket
import threading
import time
import uuid

import pdgwtest as T
from pdlegs import Inst, hardened, post, run_kvt_staged, wait_idle

PROMPT = ("A client that hangs up while its prompt is still being computed must not leave "
          "the engine computing for nobody, nor keep cache pages pinned for a reader that "
          "will never come.")
BODY = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}


def open_request(port, body, rid):
    """Send a request on a raw socket and return the socket without reading."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nX-Request-Id: {rid}\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    return s


def wait_metric(inst, name, want, timeout, labels=None):
    deadline = time.time() + timeout
    while True:
        v = T.metric_value(inst.metrics(), name, labels)
        if v == want:
            return time.time()
        if time.time() > deadline:
            raise AssertionError(f"{inst.proc.name}: {name} = {v}, want {want}")
        time.sleep(0.01)


def test_prefill_disconnect_mid_compute():
    P = Inst("prefill", "--ttft-ms", 1500, "--kv-hold-timeout-ms", 60000)
    try:
        base = P.metric("sim_client_disconnects_total")
        blocks0 = P.metric("sim_kv_blocks_used")
        pb = hardened(BODY)
        pb["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
        s = open_request(P.port, pb, "gone-1")
        wait_metric(P, "vllm:num_requests_running", 1, 2)
        assert P.metric("sim_kv_blocks_used") > blocks0
        time.sleep(0.3)
        t_close = time.time()
        s.close()
        seen = wait_metric(P, "sim_client_disconnects_total", base + 1, 1.0)
        assert seen - t_close < 1.0
        # the compute stopped: it ends as an abort (a prefill left to finish at 1.5 s would
        # count under another reason), so the wait can be wide for a loaded machine
        wait_metric(P, "vllm:num_requests_running", 0, 5.0)
        assert P.metric("vllm:request_success_total", {"finished_reason": "abort"}) == 1
        assert P.metric("sim_kv_pages_pinned") == 0
        assert P.metric("sim_kv_blocks_used") == blocks0
        # still nothing held after the prefill would have finished
        time.sleep(1.4)
        assert P.metric("sim_kv_pages_pinned") == 0
        assert P.metric("sim_kv_blocks_used") == blocks0
        assert P.metric("sim_client_disconnects_total") == base + 1
        rec = P.records("gone-1")
        assert len(rec) == 1 and rec[0]["status"] is None, rec
        assert "response_kv_transfer_params" not in rec[0], rec

        # a close late in the prefill, before the KV would be held (0.5 s before the end of
        # the 1.5 s prefill: a loaded machine let a 0.2 s margin run out, and a close after
        # the end rightly leaves the KV held for the decode)
        s = open_request(P.port, pb, "gone-late")
        wait_metric(P, "vllm:num_requests_running", 1, 2)
        time.sleep(1.0)
        s.close()
        wait_metric(P, "vllm:num_requests_running", 0, 1.0)
        wait_metric(P, "sim_kv_pages_pinned", 0, 1.0)
        wait_metric(P, "sim_kv_blocks_used", blocks0, 1.0)
        assert P.metric("sim_client_disconnects_total") == base + 2
        # a client that stays gets its KV held as before
        st, _, obj, raw = post(P, pb, "stays", False)
        assert st == 200 and obj["kv_transfer_params"]["remote_request_id"].startswith(
            "cmpl-stays-0-"), raw
        assert P.metric("sim_kv_pages_pinned") > 0
    finally:
        P.stop()


def test_queued_disconnect():
    P = Inst("both", "--ttft-ms", 800, "--max-batch", 1, kv=False)
    try:
        first = open_request(P.port, BODY, "runs")
        wait_metric(P, "vllm:num_requests_running", 1, 2)
        s = open_request(P.port, dict(BODY, prompt="queued " + PROMPT), "queued")
        wait_metric(P, "vllm:num_requests_waiting", 1, 2)
        prompt_tokens = P.metric("vllm:prompt_tokens_total")
        s.close()
        wait_metric(P, "vllm:num_requests_waiting", 0, 1.0)
        assert P.metric("sim_client_disconnects_total") == 1
        first.settimeout(10)
        got = b""
        while b"\r\n\r\n" not in got:
            got += first.recv(65536)
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        first.close()
        wait_metric(P, "vllm:num_requests_running", 0, 2)
        # the queued request never ran
        assert P.metric("vllm:prompt_tokens_total") == prompt_tokens
        assert P.metric("sim_kv_blocks_used") == 0
    finally:
        P.stop()


def test_decode_disconnect_waiting_for_kv_batch():
    """vllm-kvt batch: the decode waits while the prefill computes the prompt;
    the decode's client hangs up. Also: the transfer is named by the decode
    leg's X-Request-Id on both sides, and a duplicate in-flight id is refused."""
    P = Inst("prefill", "--ttft-ms", 1500)
    D = Inst("decode", "--kv-wait-timeout-ms", 10000)
    try:
        rid = "kvt-" + uuid.uuid4().hex[:10]
        db = copy.deepcopy(BODY)
        db["kv_transfer_params"] = {"remote_host": "127.0.0.1", "remote_port": P.kv_port}
        base = D.metric("sim_client_disconnects_total")
        s = open_request(D.port, db, rid)
        wait_metric(P, "vllm:num_requests_running", 1, 2)
        assert D.metric("vllm:num_requests_waiting") == 1
        # the same X-Request-Id while that transfer is in flight: refused
        st, _, obj, raw = post(D, db, rid, False)
        assert st == 409 and rid in obj["error"]["message"], (st, raw)
        time.sleep(0.3)
        t_close = time.time()
        s.close()
        # bounds well under the decode's 10 s KV wait, which is what an unnoticed hang-up
        # would take; wide enough for a loaded sanitizer build
        seen = wait_metric(D, "sim_client_disconnects_total", base + 1, 5.0)
        assert seen - t_close < 5.0
        wait_metric(D, "vllm:num_requests_waiting", 0, 5.0)
        # the prefill was told (cancel): its compute ends as an abort, not as a finished
        # prefill at the end of its 1.5 s (that would count under another reason)
        wait_metric(P, "vllm:num_requests_running", 0, 5.0)
        assert P.metric("vllm:request_success_total", {"finished_reason": "abort"}) == 1
        wait_idle(P, D, timeout=2.0)
        drec = [r for r in D.records(rid) if r["status"] is None]
        assert len(drec) == 1 and drec[0]["kv"]["req_id"] == rid, D.records(rid)
        assert drec[0]["kv_result"]["ok"] is False, drec[0]
        prec = P.records(rid)
        assert len(prec) == 1 and prec[0]["path"] == "kvt:compute", prec
        assert prec[0]["kv"]["req_id"] == rid, prec

        # a full batch transfer: named by its X-Request-Id on both sides (a
        # cancelled id is refused by libkvt's receiver for a while, so a new one)
        rid2 = rid + "-b"
        st, _, obj, raw = post(D, db, rid2, False)
        assert st == 200, raw
        done = D.records(rid2)
        assert len(done) == 1 and done[0]["kv"]["req_id"] == rid2, done
        assert done[0]["kv"]["xfer"] == rid2, done
        assert done[0]["kv_result"]["ok"] and done[0]["kv_result"]["verify_failures"] == 0
        prec = P.records(rid2)
        assert len(prec) == 1 and prec[0]["kv"]["req_id"] == rid2, prec
        # the id is free again once its transfer ended: a second use is not refused
        st, _, obj, raw = post(D, db, rid2, False)
        assert st != 409, raw
        wait_idle(P, D, timeout=4.0)
    finally:
        D.stop()
        P.stop()


def test_decode_disconnect_waiting_for_kv_rendezvous():
    """mooncake parallel: the decode registered for a transfer whose prefill
    leg never comes; its client hangs up; the registration and the wait go."""
    P = Inst("prefill")
    D = Inst("decode", "--kv-wait-timeout-ms", 10000)
    try:
        rid = "mc-" + uuid.uuid4().hex[:10]
        db = copy.deepcopy(BODY)
        db["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                    "remote_bootstrap_addr": f"http://127.0.0.1:{P.boot_port}",
                                    "remote_engine_id": P.engine_id, "transfer_id": rid}
        s = open_request(D.port, db, rid)
        wait_metric(D, "vllm:num_requests_waiting", 1, 2)
        time.sleep(0.3)
        s.close()
        wait_metric(D, "sim_client_disconnects_total", 1, 1.0)
        wait_idle(P, D, timeout=2.0)
        assert D.metric("sim_kv_bytes_received_total") == 0
    finally:
        D.stop()
        P.stop()


def test_kvt_staged_req_id():
    P = Inst("prefill")
    D = Inst("decode")
    try:
        rid = "stg-" + uuid.uuid4().hex[:10]
        st, text, raw = run_kvt_staged(P, D, BODY, rid)
        assert st == 200, raw
        drec = D.records(rid)
        assert len(drec) == 1 and drec[0]["kv"]["kind"] == "kvt-staged", drec
        assert drec[0]["kv"]["req_id"] == rid and drec[0]["kv"]["xfer"] == rid, drec
        assert drec[0]["kv_result"]["ok"], drec
        prec = P.records(rid)
        assert len(prec) == 1 and prec[0]["kv"]["kind"] == "hold", prec
        assert prec[0]["kv"]["req_id"] == rid, prec
        wait_idle(P, D)
    finally:
        D.stop()
        P.stop()


if __name__ == "__main__":
    T.run([test_prefill_disconnect_mid_compute, test_queued_disconnect,
           test_decode_disconnect_waiting_for_kv_batch,
           test_decode_disconnect_waiting_for_kv_rendezvous, test_kvt_staged_req_id])
