"""precise-prefix with engines that offload KV to CPU: a block an engine
holds only in its CPU tier counts less than one in GPU memory, more than
none (kv_events_other_tier_weight, default 0.5).

Upstream facts: vllm-project/vllm vllm/distributed/kv_events.py (BlockStored /
BlockRemoved carry `medium`), vllm/v1/kv_offload/mediums.py ("GPU", "CPU");
llm-d/llm-d-kv-cache pkg/kvcache/kvblock_scorer.go and pkg/kvcache/backend.go
(the router weighs each block by the best tier holding it, CPU below GPU).
pdgw-sim publishes its CPU-tier stores and evictions with medium "CPU".
"""

from test_kv_events import BLOCK, Fleet, complete, tokens

import pdgwtest as t


def sim_metric(port, name):
    _, _, body = t.request("GET", port, "/metrics", timeout=5)
    return t.metric_value(body.decode(), name) or 0.0


def test_cpu_copies_count_less():
    fleet = Fleet(layouts=("map", "map", "map"), sim_args=("--kv-offloading-blocks", "512"))
    try:
        # sim0: family 0's first 8 blocks in GPU memory
        complete(fleet.ports[0], tokens(0, 8 * BLOCK + 3))
        # sim1: families 0 and 1 (12 blocks each), then two prompts that fill its 64 GPU
        # blocks: both families leave the GPU (BlockRemoved GPU) and stay in its CPU tier
        complete(fleet.ports[1], tokens(0, 12 * BLOCK + 3))
        complete(fleet.ports[1], tokens(1, 12 * BLOCK + 3))
        for k in range(2):
            complete(fleet.ports[1], tokens(20 + k, 60 * BLOCK))
        fleet.wait_synced()
        assert sim_metric(fleet.ports[1], "sim_kv_offload_blocks_stored_total") == 24 + 120

        # family 0: 8 GPU blocks on sim0 beat 12 CPU-only blocks on sim1 (8 > 12 x 0.5);
        # counted as GPU blocks, sim1's 12 would have won
        follow = tokens(0, 12 * BLOCK) + tokens(9, 20, salt=1)
        got = fleet.routed_to(follow)
        assert got == 0, (got, fleet.gw_metric("pdgw_kv_event_batches_total"))
        # family 1: only sim1 holds it, in CPU: it goes there and is loaded from the tier
        hits = sim_metric(fleet.ports[1], "vllm:external_prefix_cache_hits_total")
        follow = tokens(1, 12 * BLOCK) + tokens(9, 20, salt=2)
        assert fleet.routed_to(follow) == 1
        assert sim_metric(fleet.ports[1], "vllm:external_prefix_cache_hits_total") == \
            hits + 12 * BLOCK
        assert fleet.gw_metric("pdgw_kv_event_bad_total") == 0
    finally:
        fleet.close()


if __name__ == "__main__":
    t.run([test_cpu_copies_count_less])
