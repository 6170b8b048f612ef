#!/usr/bin/python3
"""Silent connections from one address cannot keep other peers off a libkvt data port.

A stranger on 127.0.0.2 opens 64 TCP connections to a pdgw-sim decode's data port (the TCP
transport's listener, docs/protocols/kvt-tcp.md) and never sends HELLO: the global cap on
lanes before their HELLO is 64, so before the per-address cap it held every slot and the
prefill's lanes were closed at accept until the HELLO deadline freed them. Now one address
holds at most transfer_max_pending_per_addr (8) such lanes, the rest are closed at once and
counted (kvt_data_lanes_refused_total{reason="cap"}), and a real LMCache-protocol transfer
from a pdgw-sim prefill on 127.0.0.1 lands meanwhile, every byte verified.

The data port is what the decode's init port answers to a TransportInit (libkvt's transport
handshake, kvtransfer/src/kvt_handshake.c): its TCP address blob (kvt_tl_tcp_addr.c,
"KVTA" | version | host_len | port u16 LE | token[36] | host).
"""
# ctest-timeout: 120

import os
import select
import socket
import struct
import sys
import threading
import time
import uuid

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sim"))
import pdgwtest as T  # noqa: E402
from pdlegs import Inst, Proxy, run_lmcache, wait_idle  # noqa: E402

PROMPT = ("Disaggregated serving splits the prompt phase from the token phase so that each "
          "runs on hardware sized for it, and the cache of keys and values moves between.")
BODY = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}
IDLE = 64


def tcp_blob(host, port, token):
    h = host.encode()
    return struct.pack("<IBBH", 0x4154564B, 1, len(h), port) + token.encode() + h


def data_port(init_port):
    """The decode's data port, from its answer to our TransportInit."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 10000)
    s.connect(f"tcp://127.0.0.1:{init_port}")
    try:
        s.send_multipart([b"", msgpack.packb({
            "type": "TransportInit", "node_id": f"probe-{os.getpid()}", "transport": "tcp",
            "lanes": [], "version": 1, "addr": tcp_blob("127.0.0.1", 9, str(uuid.uuid4()))})])
        reply = msgpack.unpackb(s.recv_multipart()[-1], raw=False)
        assert reply["type"] == "TransportInit", reply
        addr = reply["addr"]
        assert addr[:4] == b"KVTA", addr
        return struct.unpack_from("<H", addr, 6)[0]
    finally:
        s.close()
        ctx.term()


class Squatter:
    """IDLE silent connections from 127.0.0.2. One the target closes later than at accept
    (its HELLO deadline) is opened again, so the slots stay taken for the whole test; one
    closed at accept is counted as refused and left closed."""

    def __init__(self, port):
        self.port = port
        self.socks = {}  # socket -> time opened
        self.refused = 0
        self.stop = threading.Event()
        for _ in range(IDLE):
            self.open()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def open(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", self.port))
        self.socks[s] = time.monotonic()

    def sweep(self, wait):
        ready, _, _ = select.select(list(self.socks), [], [], wait)
        for s in ready:
            try:
                closed = s.recv(1) == b""
            except OSError:
                closed = True
            if not closed:
                continue
            opened = self.socks.pop(s)
            s.close()
            if time.monotonic() - opened < 1.0:
                self.refused += 1  # closed at accept: a cap
            elif not self.stop.is_set():
                self.open()  # the HELLO deadline: take the slot again

    def open_count(self):
        return len(self.socks)

    def run(self):
        while not self.stop.is_set():
            self.sweep(0.05)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for s in list(self.socks):
            s.close()


def test_idle_lanes_do_not_block_peer():
    proxy = Proxy()
    P = Inst("prefill", "--proxy-host", "127.0.0.1", "--proxy-port", proxy.port)
    D = Inst("decode")
    sq = None
    try:
        port = data_port(D.init_ports[0])
        # all 64 connected (in the listener's accept queue, ahead of any lane of the prefill)
        sq = Squatter(port)
        # the prefill's lanes (another address) get in while the squatter holds its share
        rid = "r-" + uuid.uuid4().hex[:12]
        status, text, raw = run_lmcache(P, D, BODY, rid, False, proxy=proxy)
        assert status == 200, raw
        rec = [r for r in D.records(rid) if r["path"] == "/v1/completions"][0]
        res = rec["kv_result"]
        assert res["ok"] and not res["recompute"] and res["verify_failures"] == 0, rec
        assert res["bytes"] > 0, res
        assert P.metric("sim_kv_transfers_total", {"result": "ok"}) >= 1
        assert sq.open_count() >= 8  # still squatting: the transfer did not wait it out
        # the target closed all but its per-address share at accept, and counted them
        deadline = time.monotonic() + 10
        while D.metric("kvt_data_lanes_refused_total", {"reason": "cap"}) < IDLE - 8:
            assert time.monotonic() < deadline, D.metric("kvt_data_lanes_refused_total",
                                                         {"reason": "cap"})
            time.sleep(0.05)
        assert D.metric("kvt_data_lanes_refused_total", {"reason": "cap"}) == IDLE - 8
        sq.close()
        sq = None
        wait_idle(P, D)
        P.stop()
        D.stop()
    finally:
        if sq is not None:
            sq.close()
        proxy.close()


if __name__ == "__main__":
    T.run([test_idle_lanes_do_not_block_peer])
