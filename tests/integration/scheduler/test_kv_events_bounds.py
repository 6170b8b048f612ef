"""KV-event sockets are bounded: a publisher (or anyone who can reach the port pdgw's SUB
connects to) sending a 64 MiB frame does not make pdgw allocate it, and events still arrive
once the subscriber has reconnected; the dropped connection shows in
pdgw_kv_event_reconnects_total.

Upstream facts (vllm-project/vllm vllm/distributed/kv_events.py, ZmqEventPublisher): a
message is [topic, seq as 8-byte big-endian, msgpack batch]; a batch is a map {ts, events,
data_parallel_rank} with {"type": "BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium} events. The publisher here is the test's own PUB socket
(python3-zmq), so that it can send what no engine would.
"""

import os
import tempfile
import time

import msgpack
import zmq

import pdgwtest as t

MODEL = "sim-model"
BLOCK = 16


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def metric(port, name):
    _, _, body = t.request("GET", port, "/metrics", timeout=5)
    return t.metric_value(body.decode(), name) or 0.0


def events_seen(port):
    return metric(port, "pdgw_kv_events_total")


def batch(n):
    toks = [5000 + n * 101 + i for i in range(BLOCK)]
    return msgpack.packb({"ts": time.time(), "events": [{
        "type": "BlockStored", "block_hashes": [n + 1], "parent_block_hash": None,
        "token_ids": toks, "block_size": BLOCK, "lora_id": None, "medium": "GPU"}],
        "data_parallel_rank": 0})


def test_huge_frame_is_not_buffered():
    sim_port = t.free_port()
    sim = t.Proc("sim", [t.binary("pdgw-sim"), "--role", "both", "--port", str(sim_port),
                         "--model", MODEL, "--block-size", str(BLOCK)])
    t.wait_http(sim_port, "/health", proc=sim)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    ev_port = pub.bind_to_random_port("tcp://127.0.0.1")
    gw_port = t.free_port()
    cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-kvb-", suffix=".yaml", delete=False)
    cfg.write("\n".join([
        f'listen: "127.0.0.1:{gw_port}"', "workers: 1", "protocol: neutral",
        "prefill_policy: precise-prefix", "decode_policy: precise-prefix", "access_log: false",
        "instances:", "  - id: s0", f"    url: http://127.0.0.1:{sim_port}", "    role: both",
        f'    kv_events_endpoint: "tcp://127.0.0.1:{ev_port}"']) + "\n")
    cfg.close()
    try:
        gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg.name])
        t.wait_http(gw_port, "/ready", timeout=15, proc=gw)
        seq = 0

        def publish_until_seen(than):
            nonlocal seq
            deadline = time.time() + 20
            while events_seen(gw_port) <= than:
                assert time.time() < deadline, f"no KV event after {seq} sent"
                pub.send_multipart([b"kv", seq.to_bytes(8, "big"), batch(seq)])
                seq += 1
                time.sleep(0.05)  # the SUB joins asynchronously; resend until it has

        publish_until_seen(0)
        before = events_seen(gw_port)
        peak0 = peak_rss_kib(gw.pid)
        huge = b"\x00" * (64 << 20)
        for _ in range(3):
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), huge])
            seq += 1
        # Events still arrive afterwards (ZeroMQ dropped the connection; the SUB reconnects).
        publish_until_seen(before)
        grown = peak_rss_kib(gw.pid) - peak0
        assert grown < 32 * 1024, f"peak RSS grew by {grown} KiB: a 64 MiB frame was buffered"
        assert metric(gw_port, "pdgw_kv_event_reconnects_total") >= 1
        assert gw.alive()
    finally:
        pub.close(linger=0)
        ctx.term()
        os.unlink(cfg.name)


if __name__ == "__main__":
    t.run([test_huge_frame_is_not_buffered])
