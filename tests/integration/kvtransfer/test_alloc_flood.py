#!/usr/bin/python3
"""Receiver pages cannot be pinned by strangers: a flood of AllocRequests against a
pdgw-sim decode started with --kv-alloc-ttl-ms 2000.

The strangers speak LMCache's alloc-port wire as PDBackendAsync does (lmcache/v1/
storage_backend/pd_backend_async.py: a DEALER sending [b"", msgpack AllocRequest] with
req_id / is_last_batch / total_chunks, reading the last frame; one remote index per key,
-1 = refused) and never write a byte. From two source addresses (127.0.0.2, 127.0.0.3: one
address holds at most pd_alloc_quota, half the pool, unclaimed) they take every page; the
sim's /metrics (kvt_free_pages, kvt_used_pages) show the pool full. After the TTL -- not
before -- every page is free again and counted in kvt_alloc_expired_total, and a real
LMCache-protocol transfer from a pdgw-sim prefill then lands on that decode, every byte
verified, with nothing left held. (The quota itself: tests/unit/kvtransfer/
test_alloc_guard.c.)
"""
# ctest-timeout: 120

import os
import sys
import time
import uuid

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sim"))
import pdgwtest as T  # noqa: E402
from pdlegs import Inst, Proxy, run_lmcache, wait_idle  # noqa: E402

TTL_MS = 2000
PROMPT = ("Disaggregated serving splits the prompt phase from the token phase so that each "
          "runs on hardware sized for it, and the cache of keys and values moves between.")
BODY = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}


def alloc_request(keys):
    # msgspec's field order of LMCache's AllocRequest (defaults encoded); a tiny chunk
    # geometry: any page holds it
    return msgpack.packb({"type": "AllocRequest", "keys": keys, "fmt": 1, "shape": [2, 1, 1, 1],
                          "dtype": "half", "last_chunk_toks": 1, "req_id": "",
                          "is_last_batch": False, "total_chunks": 0})


def flood(ctx, port, src, tag, pages, per_request=8):
    """AllocRequests from <src> for <pages> pages at most, each granted whole at once (the
    address's quota covers them); returns the pages granted."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 10000)
    s.connect(f"tcp://{src}:0;127.0.0.1:{port}")  # libzmq: source address;destination
    granted = 0
    try:
        for n in range(pages // per_request):
            keys = [f"flood-{tag}-{n}-{i}" for i in range(per_request)]
            s.send_multipart([b"", alloc_request(keys)])
            reply = msgpack.unpackb(s.recv_multipart()[-1], raw=False)
            assert reply["type"] == "AllocResponse", reply
            idx = reply["remote_indexes"]
            assert len(idx) == per_request and min(idx) >= 0, reply
            granted += per_request
        return granted
    finally:
        s.close()


def kv(D, name):
    return D.metric(name)


def test_flood_expires_then_transfer():
    proxy = Proxy()
    P = Inst("prefill", "--proxy-host", "127.0.0.1", "--proxy-port", proxy.port)
    D = Inst("decode", "--kv-alloc-ttl-ms", TTL_MS, "--kv-buffer-mb", 1)
    ctx = zmq.Context()
    try:
        total = kv(D, "kvt_free_pages") + kv(D, "kvt_used_pages")
        assert total >= 8 and kv(D, "kvt_used_pages") == 0, total
        share = int(total * 0.5)  # pd_alloc_quota (0.5): what one address may hold unclaimed
        t0 = time.monotonic()
        held = flood(ctx, D.alloc_ports[0], "127.0.0.2", "a", share)
        held += flood(ctx, D.alloc_ports[0], "127.0.0.3", "b", share)
        flooded = time.monotonic()
        # the pool is the strangers' now (each address its half, less what a last request
        # of 8 did not fit)
        assert held > total - 2 * 8, (held, total)
        assert kv(D, "kvt_used_pages") == held
        assert kv(D, "kvt_free_pages") == total - held
        assert kv(D, "kvt_alloc_expired_total") == 0
        # held until the TTL, then all free: waited for as a condition, never a sleep
        deadline = time.monotonic() + 15
        while kv(D, "kvt_used_pages") != 0:
            assert time.monotonic() < deadline, "flooded pages never freed"
            time.sleep(0.05)
        freed = time.monotonic()
        assert freed - t0 >= TTL_MS / 1000.0 * 0.95, (freed - t0, flooded - t0)
        assert kv(D, "kvt_alloc_expired_total") == held
        assert kv(D, "kvt_free_pages") == total
        # a real LMCache-protocol transfer lands, every byte verified
        rid = "r-" + uuid.uuid4().hex[:12]
        status, text, raw = run_lmcache(P, D, BODY, rid, False, proxy=proxy)
        assert status == 200, raw
        rec = [r for r in D.records(rid) if r["path"] == "/v1/completions"][0]
        res = rec["kv_result"]
        assert res["ok"] and not res["recompute"] and res["verify_failures"] == 0, rec
        assert res["bytes"] > 0, res
        wait_idle(P, D)
        P.stop()
        D.stop()
    finally:
        ctx.term()
        proxy.close()


if __name__ == "__main__":
    T.run([test_flood_expires_then_transfer])
