#!/usr/bin/python3
"""Golden KV-event payloads of the shapes current vLLM emits, encoded with
python3-msgpack independently of the C decoder. Prints "<name> <hex>" lines.

Facts, from vllm-project/vllm:
- tests/v1/core/test_kv_events_contract.py: the batch is an array
  [ts, [events], data_parallel_rank] whose events are maps with a "type" key;
  optional fields (extra_keys, group_idx, kv_cache_spec_kind,
  kv_cache_spec_sliding_window, locality, ownership, session_id) are left out
  when unset; a decoder ignores unknown fields and elements appended to the
  batch (a 4th element, such as a publisher id).
- vllm/distributed/kv_events.py: BlockRemoved.remaining_copy_counts (one count
  per hash, the physical copies left after the removal) and locality
  ("LOCAL" / "REMOTE") on BlockStored and BlockRemoved (tests of
  wire-compatibility of both fields in tests/distributed/).
- vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys: a block's
  extra keys are (LoRA name, (mm hash, offset)..., cache salt on the first
  block only, prompt-embedding digests), None when empty.
- vllm/v1/kv_cache_interface.py KVCacheSpecKind: "full_attention",
  "sliding_window", "mamba", ...
"""
import msgpack

TOK = list(range(200, 208))  # two blocks of 4


def stored(hashes, parent, tokens, **extra):
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": 4, "lora_id": None, "medium": "GPU",
          "lora_name": None}
    ev.update(extra)
    return ev


def removed(hashes, **extra):
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
    ev.update(extra)
    return ev


def arraymap():
    # The contract test's batch, our hashes.
    return [1.5, [stored([11, 2**64 - 1], 10, [1, 2, 3, 4, 5, 6, 7, 8],
                         lora_name="adapter",
                         extra_keys=[["adapter"], ["adapter", ["mm-id", 0]]],
                         group_idx=0, kv_cache_spec_kind="full_attention",
                         locality="LOCAL", session_id="session"),
                  removed([11], medium="CPU", group_idx=0, ownership="kvcr"),
                  {"type": "AllBlocksCleared"}], 1]


def trailing():
    # A newer batch appends an element (e.g. the publisher's id): ignored.
    return [2.5, [removed([11], new=1)], 0, bytes(range(16))]


def copies():
    # Hash 21 still has a copy, 22 had its last one removed.
    return [3.0, [stored([21, 22], None, TOK),
                  removed([21, 22], remaining_copy_counts=[1, 0])], 0]


def locality():
    # 31 lives in storage remote to the instance, 32 in local storage.
    return [4.0, [stored([31], None, TOK[:4], medium="STORAGE", locality="REMOTE"),
                  stored([32], None, TOK[4:], locality="LOCAL"),
                  removed([32], locality="REMOTE")], 0]


def extra():
    # LoRA on both blocks, the cache salt on the first; a second chain whose first
    # block carries a multimodal hash.
    return [5.0, [stored([41, 42], None, TOK, lora_name="adapter-a",
                         extra_keys=[["adapter-a", "salt-1"], ["adapter-a"]]),
                  stored([43], None, TOK[:4], extra_keys=[[["mm-hash", 1]]]),
                  stored([44], None, TOK[4:], extra_keys=[None])], 0]


def hybrid():
    # Group 0 full attention, group 1 a sliding window of 8 tokens; the window group
    # evicts the chain's first block.
    return [6.0, [stored([51, 52], None, TOK, group_idx=0,
                         kv_cache_spec_kind="full_attention"),
                  stored([51, 52], None, TOK, group_idx=1,
                         kv_cache_spec_kind="sliding_window",
                         kv_cache_spec_sliding_window=8),
                  removed([51], group_idx=1)], 0]


for name, obj in [("arraymap", arraymap()), ("trailing", trailing()), ("copies", copies()),
                  ("locality", locality()), ("extra", extra()), ("hybrid", hybrid())]:
    print(name, msgpack.packb(obj, use_bin_type=True).hex())
