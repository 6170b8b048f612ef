#!/usr/bin/python3
"""Golden KV-event payloads, encoded with python3-msgpack independently of
the C decoder. Shapes follow vLLM's structs (vllm-project/vllm,
vllm/distributed/kv_events.py: EventBatch, BlockStored, BlockRemoved,
AllBlocksCleared, all msgspec Structs with tag=True, omit_defaults=True).
Older vLLM declared them array_like=True: a batch is [ts, events, dp_rank]
and an event is ["ClassName", field, ...] in declaration order. Current vLLM
does not: a batch is a map and an event a map whose "type" key holds the
class name (msgspec's default tag field). Prints "<name> <hex>" lines."""
import msgpack

H1, H2, H3 = 0x1111, 0xFFFFFFFFFFFFFFF0, 0x0123456789ABCDEF
TOK = list(range(100, 108))  # two blocks of 4


def array_layout():
    stored = ["BlockStored", [H1, H2], None, TOK, 4, None, "GPU", None]
    stored_cpu = ["BlockStored", [H3], H2, [7, 8, 9, 10], 4, None, "CPU", "adapter-a",
                  None, 3]
    removed = ["BlockRemoved", [H1], "GPU"]
    cleared = ["AllBlocksCleared"]
    return [1700000000.5, [stored, stored_cpu, removed, cleared], 2]


def map_layout():
    stored = {"type": "BlockStored", "block_hashes": [H1, H2], "parent_block_hash": None,
              "token_ids": TOK, "block_size": 4, "lora_id": None, "medium": "GPU",
              "lora_name": None}
    stored_cpu = {"type": "BlockStored", "block_hashes": [H3], "parent_block_hash": H2,
                  "token_ids": [7, 8, 9, 10], "block_size": 4, "lora_id": None,
                  "medium": "CPU", "lora_name": "adapter-a", "group_idx": 3,
                  "kv_cache_spec_kind": "full_attention"}
    removed = {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU"}
    cleared = {"type": "AllBlocksCleared"}
    return {"ts": 1700000000.5, "events": [stored, stored_cpu, removed, cleared],
            "data_parallel_rank": 2}


def bytes_hashes():
    # ExternalBlockHash may be bytes (a digest); the consumer keeps 8 bytes.
    digest = bytes(range(32))
    return {"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": [digest],
                                   "medium": None}]}


def unknown_event():
    return [2.0, [["SomethingNew", 1], ["AllBlocksCleared"]]]


for name, obj in [("array", array_layout()), ("map", map_layout()),
                  ("bytes", bytes_hashes()), ("unknown", unknown_event())]:
    print(name, msgpack.packb(obj, use_bin_type=True).hex())
