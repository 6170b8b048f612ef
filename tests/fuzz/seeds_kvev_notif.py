#!/usr/bin/python3
"""Seeds of fuzz_kvev_decode and fuzz_notif_relay (written to corpus/<target>/<sha1>).

KV-event batches have the shapes of vLLM's structs (vllm-project/vllm,
vllm/distributed/kv_events.py: EventBatch/KVEventBatch, BlockStored, BlockRemoved,
AllBlocksCleared; msgspec Structs, tag=True, omit_defaults=True), as the golden vectors of
tests/unit/scheduler/kvev_vectors.py: the array layout of older vLLM (array_like=True) and the
map layout of current vLLM, int and bytes hashes, the CPU copies of the offloading connector
(block_size 0, no tokens). Relay inputs follow fuzz_notif_relay.c's framing: byte 0 the mode,
byte 1 the buffer sizes, then 2-byte-length frames (raw) or "id 0xff sender" (round trip).
Run it from anywhere; it rewrites only the seeds it makes."""
import hashlib
import os
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 16


def stored_map(hashes, parent, tokens, block_size=BLOCK, medium="GPU", lora_name=None,
               **extra):
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": medium,
          "lora_name": lora_name}
    ev.update(extra)
    return ev


def kv_seeds():
    toks = [128000 + i * 37 for i in range(3 * BLOCK)]  # ids past 65535: uint32 on the wire
    chain = [stored_map([0x1000 + b], 0x1000 + b - 1 if b else None,
                        toks[b * BLOCK:(b + 1) * BLOCK]) for b in range(3)]
    digest = [bytes(range(i, i + 32)) for i in range(3)]
    yield {"ts": 1717000000.25, "events": chain, "data_parallel_rank": 0}
    yield {"ts": 1717000000.5, "events": chain[:1] + [
        {"type": "BlockRemoved", "block_hashes": [0x1000], "medium": "GPU"}]}
    yield {"ts": 1717000001.0, "events": [{"type": "AllBlocksCleared"}],
           "data_parallel_rank": None}
    # bytes digests as hashes (ExternalBlockHash), parent as bytes too
    yield {"ts": 2.0, "events": [stored_map(digest[:2], None, toks[:2 * BLOCK]),
                                 stored_map(digest[2:], digest[1], toks[2 * BLOCK:])]}
    # the offloading connector's CPU copies: block_size 0, no tokens
    yield {"ts": 3.0, "events": [stored_map([0x1000, 0x1001], None, [], 0, "CPU"),
                                 {"type": "BlockRemoved", "block_hashes": [0x1001],
                                  "medium": "CPU"}]}
    # LoRA, KV-cache groups, a spec kind, a DP rank
    yield {"ts": 4.0, "events": [stored_map([7, 8], None, list(range(2 * BLOCK)),
                                            lora_name="adapter-a", group_idx=1,
                                            kv_cache_spec_kind="sliding_window",
                                            kv_cache_spec_sliding_window=4096)],
           "data_parallel_rank": 3}
    # older vLLM: array layout, every field of BlockStored in declaration order
    yield [5.0, [["BlockStored", [1, 2], None, list(range(2 * BLOCK)), BLOCK, None, "GPU",
                  None, None, 0, "full_attention", None],
                 ["BlockRemoved", [1], "GPU", 0], ["AllBlocksCleared"]], 1]
    yield [6.0, [["BlockStored", [9], 8, list(range(BLOCK)), BLOCK]]]  # defaults omitted
    yield [7, [["SomethingNew", 1, 2], ["AllBlocksCleared"]]]  # an int ts, an unknown event
    yield {"ts": 8.0, "events": [stored_map([-5], None, list(range(BLOCK)))]}  # negative hash
    yield {"ts": 9.0, "events": [stored_map([0x2000 + i], 0x2000 + i - 1 if i else None,
                                            list(range(i * 4, i * 4 + 4)), 4)
                                 for i in range(20)]}


def relay_seeds():
    tag = b"pdgw-notif-relay/1"

    def raw(frames, sizes=0):
        return bytes([0, sizes]) + b"".join(struct.pack(">H", len(f)) + f for f in frames)

    yield raw([tag, b"cmpl-8f1c2e6a-0", b"10.0.0.7"])
    yield raw([tag, b"cmpl-8f1c2e6a-0", b"2001:db8::7"])
    yield raw([tag, b"chatcmpl-" + b"x" * 200, b"10.0.0.7"])  # id past the gateway's 160
    yield raw([tag, b"abc", b"10.0.0.7"], 0x21)  # small buffers: id 6, sender 9
    yield raw([tag, b"", b"10.0.0.7"])  # empty id
    yield raw([tag, b"id\x00with-nul", b""])
    yield raw([tag, b"one"])  # two frames
    yield raw([tag, b"one", b"10.0.0.7", b"extra"])  # four frames
    yield raw([b"pdgw-notif-relay/2", b"one", b"10.0.0.7"])  # another version's tag
    yield bytes([1, 0]) + b"cmpl-8f1c2e6a-0\xff10.0.0.7"
    yield bytes([1, 0]) + b"cmpl-only-id"
    yield bytes([1, 0x33]) + b"cmpl-longer-than-small\xff10.0.0.7"


def write(target, blobs):
    out = os.path.join(HERE, "corpus", target)
    os.makedirs(out, exist_ok=True)
    for b in blobs:
        with open(os.path.join(out, hashlib.sha1(b).hexdigest()), "wb") as f:
            f.write(b)


write("fuzz_kvev_decode", [msgpack.packb(o, use_bin_type=True) for o in kv_seeds()] +
      [msgpack.packb([1.5, []], use_single_float=True)])  # a float32 ts, no events
write("fuzz_notif_relay", list(relay_seeds()))
