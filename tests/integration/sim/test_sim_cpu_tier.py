"""pdgw-sim's CPU offload tier, end to end over HTTP, /metrics and KV events.

Upstream facts (vllm-project/vllm):
- vllm/config/cache.py: --kv-offloading-size (GiB) turns CPU offloading on,
  --kv-offloading-backend native;
- vllm/v1/simple_kv_offload/manager.py (SimpleCPUOffloadConnector's
  scheduler): a computed request's blocks are stored to the CPU tier; a new
  request looks up the CPU tier for what follows its GPU prefix hits (the
  last prompt token is always computed); CPU blocks sit in an LRU queue of
  unreferenced blocks; a lookup touches the blocks it loads;
- vllm/v1/metrics/loggers.py: vllm:external_prefix_cache_queries / _hits
  (tokens) count what the KV connector was asked for and supplied, apart
  from the GPU's vllm:prefix_cache_queries / _hits;
  vllm/v1/core/sched/scheduler.py (_update_connector_prefix_cache_stats):
  queries are the request's tokens, hits its externally computed ones;
- vllm/distributed/kv_events.py, vllm/v1/kv_offload/mediums.py: BlockStored /
  BlockRemoved carry a medium, "GPU" for the block pool, "CPU" for the
  offload tier.
"""

import json
import threading
import time

import msgpack
import zmq

from simtest import T, complete, metric, metrics, records, start_sim, stop_clean

BLOCK = 16


def tokens(family, n):
    return [2000 + family * 7919 + i for i in range(n)]


def replay(ctx, port):
    """Every batch published so far, asked of the replay ROUTER."""
    d = ctx.socket(zmq.DEALER)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send_multipart([b"", (0).to_bytes(8, "big")])
    out = []
    while True:
        assert d.poll(5000), "replay answer missing"
        frames = d.recv_multipart()
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq == -1:
            d.close(linger=0)
            return out
        out.extend(msgpack.unpackb(frames[2], raw=False)[1])  # [ts, events, dp_rank]


def test_offload_tier():
    ev_port, rp_port = T.free_port(), T.free_port()
    kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{ev_port}", "replay_endpoint": f"tcp://*:{rp_port}"}
    # 4 GPU blocks (one 53-token prompt fills them), 6 CPU blocks
    p, port = start_sim("--ttft-ms", 5, "--tpot-ms", 0, "--prefill-ms-per-token", 0.5,
                        "--block-size", BLOCK, "--kv-capacity-tokens", 4 * BLOCK,
                        "--kv-offloading-blocks", 6, "--kv-offloading-load-cost", 0.25,
                        "--kv-events-config", json.dumps(kv_cfg))
    a, b, c = tokens(1, 3 * BLOCK + 5), tokens(2, 3 * BLOCK + 5), tokens(3, 3 * BLOCK + 5)

    def run(prompt):
        complete(port, {"prompt": prompt, "max_tokens": 1})

    run(a)  # computed; 3 blocks stored to CPU
    run(b)  # evicts A from the GPU; 3 more CPU blocks
    assert metric(port, "sim_kv_offload_blocks_stored_total") == 6
    assert metric(port, "sim_kv_offload_blocks", {"state": "cached"}) == 6
    run(a)  # GPU miss, CPU hit: 3 blocks loaded
    assert metric(port, "vllm:prefix_cache_hits_total") == 0
    assert metric(port, "vllm:external_prefix_cache_hits_total") == 3 * BLOCK
    assert metric(port, "vllm:external_prefix_cache_queries_total") == 3 * len(a)
    assert metric(port, "sim_kv_offload_blocks_loaded_total") == 3
    run(a)  # now a GPU hit
    assert metric(port, "vllm:prefix_cache_hits_total") == 3 * BLOCK
    assert metric(port, "vllm:external_prefix_cache_hits_total") == 3 * BLOCK
    # the modelled prefill: 5 ms + 0.5 ms per computed token, a CPU-hit token a quarter of
    # that, a GPU hit nothing: computed 31.5 ms > CPU hit 13.5 ms > GPU hit 7.5 ms
    recs = records(port)
    modelled = [r["prefill_model_us"] for r in recs]
    assert modelled == [31500, 31500, 13500, 7500], modelled
    assert [(r["cached_tokens"], r["cpu_hit_tokens"]) for r in recs] == \
        [(0, 0), (0, 0), (48, 48), (48, 0)], recs

    # LRU of unreferenced blocks: A's were used last, so C's store evicts B's
    run(c)
    assert metric(port, "sim_kv_offload_blocks_evicted_total") == 3
    run(a)  # C took the GPU; the CPU tier still has A
    assert metric(port, "vllm:external_prefix_cache_hits_total") == 6 * BLOCK
    run(b)  # neither tier holds B's first block any more; storing it evicts C's
    assert metric(port, "vllm:external_prefix_cache_hits_total") == 6 * BLOCK
    assert metric(port, "sim_kv_offload_blocks_evicted_total") == 6
    assert metric(port, "sim_kv_offload_verify_failures_total") == 0
    assert metric(port, "sim_kv_offload_blocks", {"state": "in_use"}) == 0

    ctx = zmq.Context()
    try:
        events = replay(ctx, rp_port)
    finally:
        ctx.term()
    stored = {"GPU": [], "CPU": []}
    removed = {"GPU": [], "CPU": []}
    for ev in events:
        if ev["type"] == "BlockStored":
            stored[ev["medium"]].append(ev)
        elif ev["type"] == "BlockRemoved":
            removed[ev["medium"]] += ev["block_hashes"]
    # the CPU tier names blocks with the engine's hashes, as the GPU does
    cpu_a, cpu_b, cpu_c = stored["CPU"][0], stored["CPU"][1], stored["CPU"][2]
    assert len(stored["CPU"]) == 4, stored["CPU"]  # A, B, C, then B again after eviction
    assert cpu_a["block_hashes"] == stored["GPU"][0]["block_hashes"]
    assert cpu_a["parent_block_hash"] is None and cpu_a["block_size"] == BLOCK
    assert cpu_a["token_ids"] == a[:3 * BLOCK]
    assert cpu_b["token_ids"] == b[:3 * BLOCK] and cpu_c["token_ids"] == c[:3 * BLOCK]
    assert removed["CPU"] == cpu_b["block_hashes"] + cpu_c["block_hashes"], removed["CPU"]
    assert set(cpu_a["block_hashes"]) <= set(removed["GPU"])  # A left the GPU, twice
    stop_clean(p)  # the tier's pages and bytes freed (a sanitizer build reports leaks)


def test_loading_blocks_are_not_evicted():
    """While a prefill loads blocks from the tier they are not evicted, though the LRU
    queue holds them first: a store in the meantime takes the next unreferenced ones."""
    ev_port, rp_port = T.free_port(), T.free_port()
    kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{ev_port}", "replay_endpoint": f"tcp://*:{rp_port}"}
    # 32 GPU blocks; the tier holds W's 3 blocks and E's 31 exactly. Each request on its
    # own clock (--timing per-request): in engine steps Y would wait for the step of X's
    # prompt to end, and nothing would overlap
    p, port = start_sim("--timing", "per-request", "--ttft-ms", 5, "--tpot-ms", 0,
                        "--prefill-ms-per-token", 5,
                        "--block-size", BLOCK, "--kv-capacity-tokens", 32 * BLOCK,
                        "--kv-offloading-blocks", 34, "--kv-events-config", json.dumps(kv_cfg))
    w = tokens(1, 3 * BLOCK + 5)
    e = tokens(2, 31 * BLOCK)
    x = w[:3 * BLOCK] + tokens(3, 400)  # W's blocks, then 400 tokens to compute (~2 s)
    y = tokens(4, 2 * BLOCK + 1)  # computed in ~0.2 s
    complete(port, {"prompt": w, "max_tokens": 1})
    complete(port, {"prompt": e, "max_tokens": 1})  # W leaves the GPU; the tier is full
    assert metric(port, "sim_kv_offload_blocks", {"state": "cached"}) == 34
    done = []
    th = threading.Thread(target=lambda: done.append(
        complete(port, {"prompt": x, "max_tokens": 1})))
    th.start()
    deadline = time.time() + 10
    while metric(port, "sim_kv_offload_blocks", {"state": "in_use"}) != 3:
        assert time.time() < deadline, "X never started loading"
        time.sleep(0.01)
    complete(port, {"prompt": y, "max_tokens": 1})
    # X still loading (else this run proves nothing): W's pages held, Y's 2 stores
    # evicted E's two oldest blocks instead of W's
    assert metric(port, "sim_kv_offload_blocks", {"state": "in_use"}) == 3, \
        "X's prefill ended before Y's store: no overlap to test"
    ctx = zmq.Context()
    try:
        events = replay(ctx, rp_port)
    finally:
        ctx.term()
    cpu_stored = [ev for ev in events if ev["type"] == "BlockStored" and ev["medium"] == "CPU"]
    cpu_removed = [h for ev in events if ev["type"] == "BlockRemoved" and ev["medium"] == "CPU"
                   for h in ev["block_hashes"]]
    w_hashes, e_hashes = cpu_stored[0]["block_hashes"], cpu_stored[1]["block_hashes"]
    assert cpu_removed == e_hashes[:2], (cpu_removed, w_hashes)
    th.join(timeout=30)
    assert done and metric(port, "sim_kv_offload_blocks", {"state": "in_use"}) == 0
    assert metric(port, "vllm:external_prefix_cache_hits_total") == 3 * BLOCK
    stop_clean(p)


def test_off_by_default():
    p, port = start_sim("--ttft-ms", 1, "--tpot-ms", 0)
    complete(port, {"prompt": tokens(1, 40), "max_tokens": 1})
    text = metrics(port)
    assert "vllm:external_prefix_cache_hits_total" not in text
    assert "sim_kv_offload_blocks" not in text
    stop_clean(p)


if __name__ == "__main__":
    T.run([test_offload_tier, test_loading_blocks_are_not_evicted, test_off_by_default])
