#!/usr/bin/python3
"""pdgw-sim against upstream facts that a pdgw-sim pair alone would not catch.

* A NIXL prefill that stopped (EOS or a stop string). vLLM's current NixlConnector
  (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py, request_finished)
  delays the free of the blocks and returns kv_transfer_params for FINISHED_STOPPED exactly
  as for FINISHED_LENGTH_CAPPED; the older connector (the single-file nixl_connector.py and
  nixl/scheduler.py) did that only for FINISHED_LENGTH_CAPPED, freed the KV and returned
  none. --nixl-stopped-prefill null (the default with --nixl-shape older) keeps the latter.
* LMCache's chunk_size is LMCache's own setting, 256 tokens by default
  (lmcache/v1/config.py _CONFIG_DEFINITIONS), not vLLM's block size. An LMCache sender with
  that geometry (AllocRequest of lmcache/v1/storage_backend/pd_backend_async.py: fmt 1 =
  KV_2LTD, shape [2, layers, chunk_size, hidden], last_chunk_toks; msgspec encodes
  req_id / is_last_batch / total_chunks) must be served by a decode started with defaults.
* --lmcache-receiver ascend: the receiver answers as LMCache-Ascend's
  (lmcache_ascend/v1/storage_backend/pd/receiver_mixin.py _allocate_and_put, messages.py):
  a push AllocRequest (the sync one of pd_backend.py, on a REQ socket) gets an
  AscendAllocResponse whose remote_buffer_uuids name the buffer of each remote index, and
  an allocation that cannot be served answers alloc_failed=true with empty lists (LMCache's
  sync receiver: a plain AllocResponse).
"""

import copy
import uuid

import msgpack
import zmq

import pdgwtest as T
from pdlegs import NIXL_PREFILL_KVP, Inst, Proxy, decode_leg, post, run_lmcache, wait_idle

PROMPT = ("Disaggregated serving splits the prompt phase from the token phase so that each "
          "runs on hardware sized for it, and the cache of keys and values moves between.")
LONG = " ".join(f"w{i}" for i in range(700))  # a few LMCache chunks
LAYERS, HIDDEN = 4, 64  # the sim's defaults: 1024 KV bytes per token over 4 layers, bf16 K|V
LMC_CHUNK = 256  # LMCache's default chunk_size


def first_token_text(P, body):
    """What the first generated token of <body> is (the sim's output is a function of the
    prompt and the sampling parameters only, whatever the role)."""
    st, _, obj, raw = post(P, dict(body, max_tokens=1), "probe-" + uuid.uuid4().hex[:8], False)
    assert st == 200, raw
    return obj["choices"][0]["text"]


def stopped_prefill_leg(P, rid):
    """A prefill leg whose single token matches a stop string: finish_reason stop."""
    body = {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True}
    stop = first_token_text(P, body)
    assert stop, "the first token has no text"
    pb = dict(body, max_tokens=1, stop=[stop], kv_transfer_params=dict(NIXL_PREFILL_KVP))
    st, _, obj, raw = post(P, pb, rid, False)
    assert st == 200, raw
    assert obj["choices"][0]["finish_reason"] == "stop", obj
    return body, obj


def test_nixl_stopped_prefill():
    P = Inst("prefill", name="prefill-newest")
    Pold = Inst("prefill", "--nixl-stopped-prefill", "null", name="prefill-stop-null")
    Polder = Inst("prefill", "--nixl-shape", "older", name="prefill-older")
    D = Inst("decode")
    try:
        # current vLLM: the KV is held and named, and a decode pulls it like any other
        rid = "stop-" + uuid.uuid4().hex[:10]
        body, pobj = stopped_prefill_leg(P, rid)
        kvp = pobj["kv_transfer_params"]
        assert kvp is not None, "a stopped prefill returned no kv_transfer_params"
        assert kvp["do_remote_prefill"] is True and kvp["remote_engine_id"] == P.engine_id
        assert kvp["remote_block_ids"] and kvp["remote_block_ids"][0], kvp
        assert kvp["remote_num_tokens"] == pobj["usage"]["prompt_tokens"], kvp
        assert P.metric("sim_kv_pages_pinned") > 0
        st, text, raw = decode_leg(D, dict(body, kv_transfer_params=kvp), rid, False)
        assert st == 200, raw
        rec = [r for r in D.records(rid) if r["path"] == "/v1/completions"][0]
        res = rec["kv_result"]
        assert res["ok"] and not res["recompute"] and res["verify_failures"] == 0, res
        # the same text a plain engine gives
        st, _, ref, raw = post(P, body, "ref-" + rid, False)
        assert st == 200 and text == ref["choices"][0]["text"], (text, ref)
        wait_idle(P, D)
        # older vLLM: nothing returned, nothing held; a length-capped leg still is
        for inst in (Pold, Polder):
            rid = "stop-old-" + uuid.uuid4().hex[:10]
            _, pobj = stopped_prefill_leg(inst, rid)
            assert pobj["kv_transfer_params"] is None, pobj["kv_transfer_params"]
            wait_idle(inst)
            capped = {"prompt": PROMPT, "max_tokens": 1, "ignore_eos": True,
                      "kv_transfer_params": dict(NIXL_PREFILL_KVP)}
            st, _, cobj, raw = post(inst, capped, rid + "-len", False)
            assert st == 200 and cobj["choices"][0]["finish_reason"] == "length", raw
            assert cobj["kv_transfer_params"]["remote_block_ids"], cobj
        for inst in (P, Pold, Polder, D):
            inst.stop()
    finally:
        for inst in (P, Pold, Polder, D):
            inst.proc.kill()


def lmc_key(i):
    # lmcache/utils.py CacheEngineKey.to_string(): model@world_size@worker_id@hash_hex@dtype
    return f"sim-model@1@0@{0xfeed00 + i:x}@bfloat16"


def alloc_request(keys, last, async_fields=True):
    """LMCache's AllocRequest with its default chunk geometry, msgspec's field order."""
    m = {"type": "AllocRequest", "keys": keys, "fmt": 1, "shape": [2, LAYERS, LMC_CHUNK, HIDDEN],
         "dtype": "bfloat16", "last_chunk_toks": last}
    if async_fields:
        m.update(req_id="lmc-" + uuid.uuid4().hex[:8], is_last_batch=True, total_chunks=len(keys))
    return m


def test_lmcache_default_geometry():
    proxy = Proxy()
    D = Inst("decode")  # every LMCache-related setting at its default
    ctx = zmq.Context()
    try:
        # an async LMCache sender (pd_backend_async.py: a DEALER "<local>-to-<receiver>",
        # [b"", payload], the last frame is the reply) with 256-token chunks
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.RCVTIMEO, 10000)
        d.setsockopt(zmq.IDENTITY, f"sender-pid1-{uuid.uuid4().hex[:8]}-to-127.0.0.1"
                     f"{D.init_ports[0]}".encode())
        d.connect(f"tcp://127.0.0.1:{D.alloc_ports[0]}")
        keys = [lmc_key(i) for i in range(3)]
        req = alloc_request(keys, 100)
        d.send_multipart([b"", msgpack.packb(req)])
        reply = msgpack.unpackb(d.recv_multipart()[-1])
        assert reply["type"] == "AllocResponse", reply
        idx = reply["remote_indexes"]
        assert len(idx) == 3 and min(idx) >= 0, ("LMCache's default chunk refused", reply)
        assert D.metric("kvt_used_pages") == 3
        # the sender aborts: CancelNotif releases, and is answered
        d.send_multipart([b"", msgpack.packb({"type": "CancelNotif", "req_id": req["req_id"],
                                              "keys": keys})])
        assert msgpack.unpackb(d.recv_multipart()[-1])["remote_indexes"] == []
        d.close()
        wait_idle(D)
        # a pdgw-sim prefill with defaults moves LMCache chunks, not vLLM blocks; a decode
        # with another vLLM block size still finds them (the chunk is LMCache's setting)
        D32 = Inst("decode", "--block-size", 32, name="decode-block32")
        P = Inst("prefill", "--proxy-host", "127.0.0.1", "--proxy-port", proxy.port)
        body = {"prompt": LONG, "max_tokens": 4, "ignore_eos": True}
        for dec in (D, D32):
            rid = "lmc-" + uuid.uuid4().hex[:10]
            st, text, raw = run_lmcache(P, dec, copy.deepcopy(body), rid, proxy=proxy)
            assert st == 200, raw
            rec = [r for r in dec.records(rid) if r["path"] == "/v1/completions"][0]
            res = rec["kv_result"]
            assert res["ok"] and not res["recompute"] and res["verify_failures"] == 0, res
            ntok = raw["usage"]["prompt_tokens"]
            assert res["pages"] == -(-ntok // LMC_CHUNK), (res, ntok)
            assert res["bytes"] == ntok * 1024, res
        wait_idle(P, D, D32)
        for inst in (P, D, D32):
            inst.stop()
    finally:
        ctx.destroy(linger=0)  # closes a socket an assertion left open
        proxy.close()


def req_socket(ctx, port):
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 10000)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def test_lmcache_ascend_receiver():
    proxy = Proxy()
    A = Inst("decode", "--lmcache-receiver", "ascend", "--kv-buffer-mb", 1, name="decode-ascend")
    L = Inst("decode", "--kv-buffer-mb", 1, name="decode-lmcache")
    ctx = zmq.Context()
    try:
        # 1 MiB x 4 layers of 256 KiB pages: 16 pages each
        assert A.metric("kvt_free_pages") == 16 and L.metric("kvt_free_pages") == 16
        keys = [lmc_key(10 + i) for i in range(2)]
        q = req_socket(ctx, A.alloc_ports[0])
        q.send(msgpack.packb(alloc_request(keys, 7, async_fields=False)))
        r = msgpack.unpackb(q.recv())
        assert r["type"] == "AscendAllocResponse", r
        assert r["already_sent_indexes"] == [] and len(r["remote_indexes"]) == 2, r
        assert len(r["remote_buffer_uuids"]) == 2 and all(r["remote_buffer_uuids"]), r
        assert r["alloc_failed"] is False, r
        # more chunks than the buffer: all or nothing, told with alloc_failed
        big = [lmc_key(100 + i) for i in range(20)]
        q.send(msgpack.packb(alloc_request(big, 7, async_fields=False)))
        r = msgpack.unpackb(q.recv())
        assert r["type"] == "AscendAllocResponse" and r["alloc_failed"] is True, r
        assert r["remote_indexes"] == [] and r["remote_buffer_uuids"] == [], r
        q.close()
        # LMCache's own receiver answers the same REQ sender in the sync layout
        q = req_socket(ctx, L.alloc_ports[0])
        q.send(msgpack.packb(alloc_request(keys, 7, async_fields=False)))
        r = msgpack.unpackb(q.recv())
        assert r["type"] == "AllocResponse" and "remote_buffer_uuids" not in r, r
        assert len(r["remote_indexes"]) == 2 and min(r["remote_indexes"]) >= 0, r
        q.close()
        # a pdgw-sim prefill still lands its KV on the Ascend receiver, every byte checked
        P = Inst("prefill", "--proxy-host", "127.0.0.1", "--proxy-port", proxy.port,
                 "--kv-buffer-mb", 1)
        rid = "asc-" + uuid.uuid4().hex[:10]
        st, text, raw = run_lmcache(P, A, {"prompt": PROMPT, "max_tokens": 4,
                                           "ignore_eos": True}, rid, proxy=proxy)
        assert st == 200, raw
        res = [r for r in A.records(rid) if r["path"] == "/v1/completions"][0]["kv_result"]
        assert res["ok"] and not res["recompute"] and res["verify_failures"] == 0, res
        P.stop()
        A.stop()
        L.stop()
    finally:
        ctx.destroy(linger=0)  # closes a socket an assertion left open
        proxy.close()


if __name__ == "__main__":
    T.run([test_nixl_stopped_prefill, test_lmcache_default_geometry,
           test_lmcache_ascend_receiver])
