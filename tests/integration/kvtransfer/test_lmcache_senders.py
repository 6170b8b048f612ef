#!/usr/bin/python3
"""A libkvt receiver against scripted upstream LMCache senders.

The control plane below is written from upstream's source, message by
message and frame by frame; nothing of libkvt's own sender is used for it:
  * async: LMCache lmcache/v1/storage_backend/pd_backend_async.py
    (PDBackendAsync) -- a DEALER with identity "<local_id>-to-<receiver_id>",
    sends [b"", msgpack] and reads frames[-1]; its AllocRequest always
    carries req_id / is_last_batch / total_chunks (msgspec encodes defaults);
    the reply has one remote index per key (-1 = failed, no dedup) and
    CancelNotif is answered with AllocResponse{remote_indexes: []}.
  * sync: LMCache lmcache/v1/storage_backend/pd_backend.py (PDBackend) -- a
    REQ socket; AllocRequest without the async fields; AllocResponse
    {already_sent_indexes, remote_indexes} with dedup.
  * Ascend: LMCache-Ascend lmcache_ascend/v1/storage_backend/pd/
    sender_mixin.py, receiver_mixin.py, messages.py -- a REQ socket; push
    answered with AscendAllocResponse (remote_buffer_uuids, alloc_failed),
    pull with PullReadyNotif (sender_done_url "host:port", no scheme) ->
    PullReadyDoneAck, then PullDoneSignal PUSHed to the sender's PULL.
Chunk geometry as LMCache sizes it (lmcache/v1/gpu_connector.py get_shape,
lmcache/v1/memory_management.py MemoryFormat): fmt 1 = KV_2LTD, shape
[2, num_layers, chunk_tokens, hidden], the last chunk last_chunk_toks long;
one receiver page holds one whole chunk. Keys are CacheEngineKey strings
(lmcache/utils.py: model@world_size@worker_id@chunk_hash_hex@dtype).

The bytes move through libkvt's TCP transport, written (push) or served
(pull) by kvt-lmc-peer, which does the transport handshake a real sender's
channel would; every chunk is loaded back and compared.
"""
# ctest-timeout: 120

import json
import os
import subprocess
import uuid

import msgpack
import zmq

import pdgwtest

LAYERS, TOKS, HIDDEN, ELEM = 4, 16, 8, 2  # dtype "half"
SHAPE = [2, LAYERS, TOKS, HIDDEN]
PAGE = 2 * LAYERS * TOKS * HIDDEN * ELEM  # one whole chunk: all layers x chunk tokens
LAST = 5  # tokens of the last chunk


def chunk_bytes(toks):
    return 2 * LAYERS * toks * HIDDEN * ELEM


def key(h):
    # lmcache/utils.py CacheEngineKey.to_string(): hex hash, torch dtype name
    return f"Qwen/Qwen3-8B@1@0@{h:x}@half"


def content(k, n):
    seed = sum(k.encode())
    return bytes((seed + i * 7) & 0xFF for i in range(n))


def pack(d):
    return msgpack.packb(d)


class Peer:
    """kvt-lmc-peer as a line-oriented JSON subprocess."""

    def __init__(self, args):
        self.p = subprocess.Popen([pdgwtest.binary("kvt-lmc-peer")] + args, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.hello = self.read()

    def read(self):
        line = self.p.stdout.readline()
        assert line, "kvt-lmc-peer exited"
        return json.loads(line)

    def cmd(self, text):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()
        return self.read()

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.stdin.close()
            self.p.wait(10)
        except Exception:
            self.p.kill()
            self.p.wait(10)


class Rig:
    """A receiver, the data half of a sender, a ZeroMQ context; all closed at the end."""

    def __init__(self, flavour="auto", pages=8):
        self.recv = Peer(["recv", "--layers", str(LAYERS), "--chunk-tokens", str(TOKS),
                          "--hidden", str(HIDDEN), "--dtype", "half", "--pages", str(pages),
                          "--flavour", flavour, "--backoff", "0.2"])
        # the receiver sized its pages from LMCache's chunk geometry itself
        assert self.recv.hello["page_size"] == PAGE, self.recv.hello
        self.alloc = self.recv.hello["alloc_port"]
        self.init = self.recv.hello["init_port"]
        self.data = Peer(["write", "--init-port", str(self.init), "--page-size", str(PAGE),
                          "--node-id", f"lmc-data-{os.getpid()}", "--pages", "4"])
        assert self.data.hello["ready"] and self.data.hello["regions"] >= 1, self.data.hello
        self.ctx = zmq.Context()
        self.socks = []

    def sock(self, kind, identity=None):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10000)
        if identity is not None:
            s.setsockopt(zmq.IDENTITY, identity)
        s.connect(f"tcp://127.0.0.1:{self.alloc}")
        self.socks.append(s)
        return s

    def write(self, index, data):
        r = self.data.cmd(f"{index} {data.hex()}")
        assert r["ok"], r

    def load(self, k):
        return self.recv.cmd(f"load {k} {PAGE}")

    def stats(self):
        return self.recv.cmd("stats")

    def close(self):
        for s in self.socks:
            s.close()
        self.ctx.term()
        self.data.close()
        self.recv.close()


def alloc_request(keys, req=None):
    """AllocRequest in msgspec's field order; <req> adds the async backend's fields."""
    m = {"type": "AllocRequest", "keys": keys, "fmt": 1, "shape": SHAPE, "dtype": "half",
         "last_chunk_toks": LAST}
    if req is not None:
        m.update(req)
    return m


def push_and_verify(rig, keys, indexes):
    for i, (k, idx) in enumerate(zip(keys, indexes)):
        n = chunk_bytes(LAST if i == len(keys) - 1 else TOKS)
        rig.write(idx, content(k, n))
    for i, k in enumerate(keys):
        n = chunk_bytes(LAST if i == len(keys) - 1 else TOKS)
        got = rig.load(k)
        assert got["ok"] and got["len"] == n, (k, got)
        assert bytes.fromhex(got["hex"]) == content(k, n), k


def test_async_dealer():
    rig = Rig()
    try:
        ident = f"sender-pid{os.getpid()}-{uuid.uuid4().hex[:8]}-to-127.0.0.1{rig.init}"
        d = rig.sock(zmq.DEALER, ident.encode())
        keys = [key(0xA0 + i) for i in range(3)]
        req = {"req_id": "cmpl-a1", "is_last_batch": True, "total_chunks": 0}
        d.send_multipart([b"", pack(alloc_request(keys, req))])
        frames = d.recv_multipart()
        assert frames[0] == b"" and len(frames) == 2, frames
        r = msgpack.unpackb(frames[-1])
        idx = r["remote_indexes"]
        # PDBackendAsync.AllocResponse: remote_indexes first, one per key
        assert frames[-1] == pack({"type": "AllocResponse", "remote_indexes": idx,
                                   "already_sent_indexes": []}), r
        assert len(idx) == 3 and len(set(idx)) == 3 and min(idx) >= 0, idx
        push_and_verify(rig, keys, idx)
        # the same keys again: no dedup, a fresh index per key, old pages freed
        d.send_multipart([b"", pack(alloc_request(keys, req))])
        r2 = msgpack.unpackb(d.recv_multipart()[-1])
        assert len(r2["remote_indexes"]) == 3 and min(r2["remote_indexes"]) >= 0, r2
        assert r2["already_sent_indexes"] == [], r2
        assert rig.stats()["used_pages"] == 3
        push_and_verify(rig, keys, r2["remote_indexes"])
        # CancelNotif: released, and answered (the sender holds its lock until then)
        d.send_multipart([b"", pack({"type": "CancelNotif", "req_id": "cmpl-a1", "keys": keys})])
        frames = d.recv_multipart()
        assert frames[-1] == pack({"type": "AllocResponse", "remote_indexes": [],
                                   "already_sent_indexes": []}), frames
        st = rig.stats()
        assert st["used_pages"] == 0 and st["pinned_pages"] == 0, st
        # more chunks than the whole buffer: one -1 per key, refused with a reason
        big = [key(0x100 + i) for i in range(9)]
        d.send_multipart([b"", pack(alloc_request(big, dict(req, req_id="cmpl-a2")))])
        r3 = msgpack.unpackb(d.recv_multipart()[-1])
        assert r3["remote_indexes"] == [-1] * 9, r3
        st = rig.stats()
        assert st["refusals"] >= 1 and st["used_pages"] == 0, st
    finally:
        rig.close()


def test_sync_req():
    rig = Rig()
    try:
        q = rig.sock(zmq.REQ)
        keys = [key(0xB0 + i) for i in range(2)]
        q.send(pack(alloc_request(keys)))
        raw = q.recv()
        r = msgpack.unpackb(raw)
        # PDBackend.AllocResponse: already_sent_indexes first, both lists present
        assert raw == pack({"type": "AllocResponse", "already_sent_indexes": [],
                            "remote_indexes": r["remote_indexes"]}), r
        assert len(r["remote_indexes"]) == 2 and min(r["remote_indexes"]) >= 0, r
        push_and_verify(rig, keys, r["remote_indexes"])
        # again, plus one new key: the held ones are "already sent"
        keys2 = keys + [key(0xB7)]
        q.send(pack(alloc_request(keys2)))
        r2 = msgpack.unpackb(q.recv())
        assert r2["already_sent_indexes"] == [0, 1] and len(r2["remote_indexes"]) == 1, r2
        st = rig.stats()
        assert st["used_pages"] == 3 and st["pinned_pages"] == 0, st
        # garbage on a REQ: answered (empty frame), so the socket stays usable
        q.send(b"\xc1not msgpack")
        assert q.recv() == b""
        q.send(pack(alloc_request([key(0xB9)])))
        assert len(msgpack.unpackb(q.recv())["remote_indexes"]) == 1
    finally:
        rig.close()


def test_ascend_push_and_pull():
    rig = Rig(flavour="ascend")
    pull = None
    try:
        q = rig.sock(zmq.REQ)
        keys = [key(0xC0 + i) for i in range(3)]
        q.send(pack(alloc_request(keys)))
        raw = q.recv()
        r = msgpack.unpackb(raw)
        assert raw == pack({"type": "AscendAllocResponse", "already_sent_indexes": [],
                            "remote_indexes": r["remote_indexes"],
                            "remote_buffer_uuids": r["remote_buffer_uuids"],
                            "alloc_failed": False}), r
        assert len(r["remote_buffer_uuids"]) == 3 and all(
            len(u) == 36 for u in r["remote_buffer_uuids"]), r
        push_and_verify(rig, keys, r["remote_indexes"])  # one region: page index = index
        # too much for the buffer: the LMCache-Ascend failure answer
        q.send(pack(alloc_request([key(0x200 + i) for i in range(9)])))
        assert q.recv() == pack({"type": "AscendAllocResponse", "already_sent_indexes": [],
                                 "remote_indexes": [], "remote_buffer_uuids": [],
                                 "alloc_failed": True})
        # pull: the receiver reads our pages and signals the done URL we gave
        pull = rig.ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.RCVTIMEO, 10000)
        done_port = pull.bind_to_random_port("tcp://127.0.0.1")
        pkeys = [key(0xD0), key(0xD1)]
        refs = []
        for i, k in enumerate(pkeys):
            n = chunk_bytes(LAST if i == 1 else TOKS)
            refs.append(rig.data.cmd(f"put {i + 1} {content(k, n).hex()}"))
        pull_id = uuid.uuid4().hex
        q.send(pack({"type": "PullReadyNotif", "pull_id": pull_id, "keys": pkeys,
                     "sender_buffer_uuids": [x["uuid"] for x in refs],
                     "sender_mem_indexes": [x["index"] for x in refs],
                     "sender_id": rig.data.hello.get("node_id", f"lmc-data-{os.getpid()}"),
                     "sender_done_url": f"127.0.0.1:{done_port}",
                     "fmt": 1, "shape": SHAPE, "dtype": "half", "last_chunk_toks": LAST}))
        assert q.recv() == pack({"type": "PullReadyDoneAck", "already_sent_indexes": [],
                                 "alloc_failed": False})
        assert pull.recv() == pack({"type": "PullDoneSignal", "pull_id": pull_id})
        for i, k in enumerate(pkeys):
            n = chunk_bytes(LAST if i == 1 else TOKS)
            got = rig.load(k)
            assert got["ok"] and bytes.fromhex(got["hex"]) == content(k, n), (k, got)
        st = rig.stats()
        assert st["pinned_pages"] == 0 and st["used_pages"] == 5, st
    finally:
        if pull is not None:
            pull.close()
        rig.close()


def main():
    pdgwtest.run([test_async_dealer, test_sync_req, test_ascend_push_and_pull])


if __name__ == "__main__":
    main()
