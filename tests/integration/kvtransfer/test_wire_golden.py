#!/usr/bin/python3
"""Wire compatibility of libkvt's control messages with Python msgpack.

Both directions, for every message of docs/protocols/lmcache-wire.md (plus the
TransportInit extension):
  * golden byte vectors (fixed hex below, and re-checked against
    msgpack.packb of a dict in field order) decoded by libkvt through
    kvt-msgtool, which prints the decoded fields as JSON;
  * libkvt's encoding of the same message compared byte for byte with the
    golden vector and decoded by msgpack.unpackb ("type" first, every field
    in table order).
Plus the lenient decoder rules seen from a Python peer: reordered fields,
unknown keys with nested values of any type, missing defaulted fields; and
rejections naming the bad field.
"""

import json
import os
import random
import subprocess

import msgpack

import pdgwtest

TOOL = None

# Field order of every message (the table of docs/protocols/lmcache-wire.md).
FIELDS = {
    "AllocRequest": ["keys", "fmt", "shape", "dtype", "last_chunk_toks", "req_id",
                     "is_last_batch", "total_chunks"],
    "AllocResponse": ["already_sent_indexes", "remote_indexes"],
    "AscendAllocResponse": ["already_sent_indexes", "remote_indexes", "remote_buffer_uuids",
                            "alloc_failed"],
    "ProxyNotif": ["req_id"],
    "PullReadyNotif": ["pull_id", "keys", "sender_buffer_uuids", "sender_mem_indexes",
                       "sender_id", "sender_done_url", "fmt", "shape", "dtype",
                       "last_chunk_toks"],
    "PullReadyDoneAck": ["already_sent_indexes", "alloc_failed"],
    "PullDoneSignal": ["pull_id"],
    "CancelNotif": ["req_id", "keys"],
    "ReserveRequest": ["req_id", "total_chunks", "ttl_ms"],
    "ReserveResponse": ["req_id", "granted", "free_chunks"],
    "TransportInit": ["node_id", "transport", "lanes", "regions", "version", "epoch"],
}

UUID = "3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f"

MESSAGES = {
    "AllocRequest": {"type": "AllocRequest", "keys": ["vllm@m@1@0@0a1b", "vllm@m@1@0@2c3d"],
                     "fmt": 1, "shape": [2, 32, 256, 1024], "dtype": "bfloat16",
                     "last_chunk_toks": 100, "req_id": "cmpl-1", "is_last_batch": True,
                     "total_chunks": 2},
    "AllocResponse": {"type": "AllocResponse", "already_sent_indexes": [0],
                      "remote_indexes": [17, -1]},
    "AscendAllocResponse": {"type": "AscendAllocResponse", "already_sent_indexes": [],
                            "remote_indexes": [3, 4], "remote_buffer_uuids": [UUID, UUID],
                            "alloc_failed": False},
    "ProxyNotif": {"type": "ProxyNotif", "req_id": "cmpl-1"},
    "PullReadyNotif": {"type": "PullReadyNotif", "pull_id": "pull-7", "keys": ["k0"],
                       "sender_buffer_uuids": ["00000000-0000-4000-8000-000000000001"],
                       "sender_mem_indexes": [300], "sender_id": "prefill-0",
                       "sender_done_url": "tcp://127.0.0.1:7500", "fmt": 2,
                       "shape": [256, 2, 512], "dtype": "half", "last_chunk_toks": 256},
    "PullReadyDoneAck": {"type": "PullReadyDoneAck", "already_sent_indexes": [1, 2],
                         "alloc_failed": True},
    "PullDoneSignal": {"type": "PullDoneSignal", "pull_id": "pull-7"},
    "CancelNotif": {"type": "CancelNotif", "req_id": "cmpl-1", "keys": ["k0", "k1"]},
    "ReserveRequest": {"type": "ReserveRequest", "req_id": "cmpl-2", "total_chunks": 70000,
                       "ttl_ms": 30000},
    "ReserveResponse": {"type": "ReserveResponse", "req_id": "cmpl-2", "granted": True,
                        "free_chunks": 65535},
    "TransportInit": {"type": "TransportInit", "node_id": "decode-1", "transport": "tcp",
                      "lanes": [{"type": "TransportLane", "host": "127.0.0.1", "port": 40001,
                                 "qp_num": 0, "lid": 0, "gid": "", "psn": 0, "mtu": 0}],
                      "regions": [{"type": "TransportRegion", "uuid": UUID,
                                   "addr": 140737488355328, "length": 1073741824, "rkey": 0}],
                      "version": 1, "epoch": 12345},
}

# msgpack.packb(MESSAGES[name]) frozen as text: a change in either encoder shows up here.
GOLDEN = {
    "AllocRequest": "89a474797065ac416c6c6f6352657175657374a46b65797392af766c6c6d406d403140304030613162af766c6c6d406d403140304032633364a3666d7401a57368617065940220cd0100cd0400a56474797065a862666c6f61743136af6c6173745f6368756e6b5f746f6b7364a67265715f6964a6636d706c2d31ad69735f6c6173745f6261746368c3ac746f74616c5f6368756e6b7302",
    "AllocResponse": "83a474797065ad416c6c6f63526573706f6e7365b4616c72656164795f73656e745f696e64657865739100ae72656d6f74655f696e64657865739211ff",
    "AscendAllocResponse": "85a474797065b3417363656e64416c6c6f63526573706f6e7365b4616c72656164795f73656e745f696e646578657390ae72656d6f74655f696e6465786573920304b372656d6f74655f6275666665725f757569647392d92433663262366331652d306434612d346538622d396331662d356136623763386439653066d92433663262366331652d306434612d346538622d396331662d356136623763386439653066ac616c6c6f635f6661696c6564c2",
    "ProxyNotif": "82a474797065aa50726f78794e6f746966a67265715f6964a6636d706c2d31",
    "PullReadyNotif": "8ba474797065ae50756c6c52656164794e6f746966a770756c6c5f6964a670756c6c2d37a46b65797391a26b30b373656e6465725f6275666665725f757569647391d92430303030303030302d303030302d343030302d383030302d303030303030303030303031b273656e6465725f6d656d5f696e646578657391cd012ca973656e6465725f6964a970726566696c6c2d30af73656e6465725f646f6e655f75726cb47463703a2f2f3132372e302e302e313a37353030a3666d7402a5736861706593cd010002cd0200a56474797065a468616c66af6c6173745f6368756e6b5f746f6b73cd0100",
    "PullReadyDoneAck": "83a474797065b050756c6c5265616479446f6e6541636bb4616c72656164795f73656e745f696e6465786573920102ac616c6c6f635f6661696c6564c3",
    "PullDoneSignal": "82a474797065ae50756c6c446f6e655369676e616ca770756c6c5f6964a670756c6c2d37",
    "CancelNotif": "83a474797065ab43616e63656c4e6f746966a67265715f6964a6636d706c2d31a46b65797392a26b30a26b31",
    "ReserveRequest": "84a474797065ae5265736572766552657175657374a67265715f6964a6636d706c2d32ac746f74616c5f6368756e6b73ce00011170a674746c5f6d73cd7530",
    "ReserveResponse": "84a474797065af52657365727665526573706f6e7365a67265715f6964a6636d706c2d32a76772616e746564c3ab667265655f6368756e6b73cdffff",
    "TransportInit": "87a474797065ad5472616e73706f7274496e6974a76e6f64655f6964a86465636f64652d31a97472616e73706f7274a3746370a56c616e65739188a474797065ad5472616e73706f72744c616e65a4686f7374a93132372e302e302e31a4706f7274cd9c41a671705f6e756d00a36c696400a3676964a0a370736e00a36d747500a7726567696f6e739185a474797065af5472616e73706f7274526567696f6ea475756964d92433663262366331652d306434612d346538622d396331662d356136623763386439653066a461646472cf0000800000000000a66c656e677468ce40000000a4726b657900a776657273696f6e01a565706f6368cd3039",
}

# Defaults applied by the decoder to fields a peer may omit.
DEFAULTS = {
    "AllocRequest": {"req_id": "", "is_last_batch": False, "total_chunks": 0},
    # LMCache pd_backend_async.py declares already_sent_indexes = [] (the sync
    # pd_backend.py requires it): a libkvt sender accepts either reply.
    "AllocResponse": {"already_sent_indexes": []},
    "AscendAllocResponse": {"alloc_failed": False},
    "PullReadyDoneAck": {"alloc_failed": False},
    "TransportInit": {"regions": [], "version": 1, "epoch": 0},
}


def tool(mode, data):
    """Run kvt-msgtool; returns (exit code, stdout text)."""
    p = subprocess.run([TOOL, mode], input=data, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=30)
    return p.returncode, p.stdout.decode()


def kvt_decode(raw):
    rc, out = tool("decode", raw.hex().encode())
    return rc, json.loads(out)


def kvt_encode(msg):
    rc, out = tool("encode", json.dumps(msg).encode())
    assert rc == 0, f"encode failed: {out}"
    return bytes.fromhex(out.strip())


def test_golden_vectors_are_python_msgpack():
    """The frozen vectors are exactly what python3-msgpack produces today."""
    for name, msg in MESSAGES.items():
        assert list(msg)[0] == "type" and list(msg)[1:] == FIELDS[name], name
        assert msgpack.packb(msg).hex() == GOLDEN[name], name
    assert set(GOLDEN) == set(FIELDS)


def test_python_to_libkvt():
    """libkvt decodes every golden vector to exactly the fields Python packed."""
    for name, hexstr in GOLDEN.items():
        rc, got = kvt_decode(bytes.fromhex(hexstr))
        assert rc == 0, f"{name}: {got}"
        assert got == MESSAGES[name], f"{name}: {got} != {MESSAGES[name]}"


def test_libkvt_to_python():
    """libkvt's encodings are byte-identical to the golden vectors and Python reads them."""
    for name, msg in MESSAGES.items():
        raw = kvt_encode(msg)
        assert raw.hex() == GOLDEN[name], f"{name}: {raw.hex()}"
        back = msgpack.unpackb(raw)
        assert list(back) == ["type"] + FIELDS[name], name
        assert back == msg, name


def test_reordered_fields_and_unknown_keys():
    rnd = random.Random(1234)
    unknown_values = [None, 1.5, -7, b"\x00\xffbin", [1, [2, [3, {"x": None}]]],
                      {"nested": {"deep": [True, False, "s"]}}, msgpack.ExtType(5, b"ext"),
                      "x" * 300, 2 ** 64 - 1]
    for name, msg in MESSAGES.items():
        for trial in range(5):
            items = list(msg.items())
            rnd.shuffle(items)
            for i, v in enumerate(unknown_values[: 2 + trial]):
                items.insert(rnd.randrange(len(items) + 1), (f"future_{i}", v))
            raw = msgpack.packb(dict(items))
            rc, got = kvt_decode(raw)
            assert rc == 0, f"{name}: {got}"
            assert got == msg, f"{name} trial {trial}: {got}"


def test_missing_defaulted_fields():
    for name, defaults in DEFAULTS.items():
        msg = {k: v for k, v in MESSAGES[name].items() if k not in defaults}
        rc, got = kvt_decode(msgpack.packb(msg))
        assert rc == 0, f"{name}: {got}"
        expect = dict(MESSAGES[name])
        expect.update(defaults)
        assert got == expect, f"{name}: {got}"
    # nested lane with only a port: other lane fields default
    ti = dict(MESSAGES["TransportInit"])
    ti["lanes"] = [{"port": 9}]
    rc, got = kvt_decode(msgpack.packb(ti))
    assert rc == 0, got
    assert got["lanes"] == [{"type": "TransportLane", "host": "", "port": 9, "qp_num": 0,
                             "lid": 0, "gid": "", "psn": 0, "mtu": 0}]


def expect_reject(raw, status, field=None):
    rc, got = kvt_decode(raw)
    assert rc == 1, f"accepted: {got}"
    assert got["error"] == status, got
    if field is not None:
        assert got["field"] == field, got


def test_rejections_name_the_field():
    for name, msg in MESSAGES.items():
        required = [f for f in FIELDS[name] if f not in DEFAULTS.get(name, {})]
        for f in required:
            bad = {k: v for k, v in msg.items() if k != f}
            expect_reject(msgpack.packb(bad), "KVT_ERR_MSG_FIELD", f)
        for f in FIELDS[name]:
            wrong = dict(msg)
            v = msg[f]
            wrong[f] = 1.25 if not isinstance(v, float) else "x"
            expect_reject(msgpack.packb(wrong), "KVT_ERR_MSG_FIELD", f)
    expect_reject(msgpack.packb({"type": "AllocRequestV9", "keys": []}), "KVT_ERR_MSG_TYPE",
                  "type")
    expect_reject(msgpack.packb({"req_id": "x"}), "KVT_ERR_MSG_TYPE", "type")
    expect_reject(msgpack.packb(["ProxyNotif", "x"]), "KVT_ERR_PROTO")
    expect_reject(bytes.fromhex(GOLDEN["CancelNotif"])[:-3], "KVT_ERR_PROTO")
    expect_reject(bytes.fromhex(GOLDEN["CancelNotif"]) + b"\x00", "KVT_ERR_PROTO")
    # a string in an int list, a bool as int, an int beyond int64
    m = dict(MESSAGES["AllocResponse"], remote_indexes=[1, "2"])
    expect_reject(msgpack.packb(m), "KVT_ERR_MSG_FIELD", "remote_indexes")
    m = dict(MESSAGES["ReserveResponse"], granted=1)
    expect_reject(msgpack.packb(m), "KVT_ERR_MSG_FIELD", "granted")
    m = dict(MESSAGES["ReserveRequest"], total_chunks=2 ** 64 - 1)
    expect_reject(msgpack.packb(m), "KVT_ERR_MSG_FIELD", "total_chunks")
    # hostile sizes
    expect_reject(b"\xdd\xff\xff\xff\xff", "KVT_ERR_LIMIT")
    m = dict(MESSAGES["ProxyNotif"], req_id="r" * 5000)
    expect_reject(msgpack.packb(m), "KVT_ERR_LIMIT", "req_id")


def test_big_request_roundtrip():
    keys = [f"vllm@model@4@{i % 4}@{i:064x}" for i in range(20000)]
    msg = dict(MESSAGES["AllocRequest"], keys=keys, total_chunks=20000)
    raw = msgpack.packb(msg)
    rc, got = kvt_decode(raw)
    assert rc == 0 and got == msg
    assert kvt_encode(msg) == raw


# ---- each LMCache flavour, as upstream writes it ---------------------------
# Vectors of what upstream's own code puts on the wire (msgspec tagged
# structs, every field in declaration order, defaults included), frozen as
# python3-msgpack produced them:
#   async_*   LMCache lmcache/v1/storage_backend/pd_backend_async.py
#             (AllocRequest with req_id / is_last_batch / total_chunks;
#             AllocResponse with remote_indexes FIRST and already_sent_indexes
#             = [] -- one index per key, -1 = failed, no dedup; CancelNotif and
#             its answer AllocResponse{remote_indexes: []})
#   sync_*    LMCache lmcache/v1/storage_backend/pd_backend.py (AllocRequest
#             of five fields; AllocResponse already_sent_indexes first)
#   ascend_*  LMCache-Ascend lmcache_ascend/v1/storage_backend/pd/messages.py
#             (AscendAllocResponse = the sync AllocResponse + remote_buffer_uuids
#             + alloc_failed; failure = empty lists; PullReadyNotif's
#             sender_done_url is "host:port", sender_mixin.py); its push
#             AllocRequest is the sync one
#   libkvt_*  pdgw: a libkvt peer adds kvt_ext (never sent to upstream as 0)
U = "3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f"
K = ["Qwen/Qwen3-8B@2@0@1f3a9c@bfloat16", "Qwen/Qwen3-8B@2@0@77e0b2@bfloat16"]
UPSTREAM = {
    "async_AllocRequest": {"type":"AllocRequest","keys":K,"fmt":1,"shape":[2,36,256,1024],"dtype":"bfloat16","last_chunk_toks":37,"req_id":"cmpl-7","is_last_batch":True,"total_chunks":0},
    "sync_AllocRequest": {"type":"AllocRequest","keys":K,"fmt":1,"shape":[2,36,256,1024],"dtype":"bfloat16","last_chunk_toks":37},
    "libkvt_AllocRequest": {"type":"AllocRequest","keys":K,"fmt":1,"shape":[2,36,256,1024],"dtype":"bfloat16","last_chunk_toks":37,"req_id":"cmpl-7","is_last_batch":True,"total_chunks":2,"kvt_ext":1},
    "async_AllocResponse": {"type":"AllocResponse","remote_indexes":[12,40],"already_sent_indexes":[]},
    "async_AllocResponse_failed": {"type":"AllocResponse","remote_indexes":[-1,-1],"already_sent_indexes":[]},
    "async_CancelNotif": {"type":"CancelNotif","req_id":"cmpl-7","keys":K},
    "async_CancelNotif_reply": {"type":"AllocResponse","remote_indexes":[],"already_sent_indexes":[]},
    "sync_AllocResponse": {"type":"AllocResponse","already_sent_indexes":[0],"remote_indexes":[40]},
    "ascend_AscendAllocResponse": {"type":"AscendAllocResponse","already_sent_indexes":[0],"remote_indexes":[40],"remote_buffer_uuids":[U],"alloc_failed":False},
    "ascend_AscendAllocResponse_failed": {"type":"AscendAllocResponse","already_sent_indexes":[],"remote_indexes":[],"remote_buffer_uuids":[],"alloc_failed":True},
    "libkvt_AscendAllocResponse": {"type":"AscendAllocResponse","already_sent_indexes":[],"remote_indexes":[3,4],"remote_buffer_uuids":[U,U],"alloc_failed":False,"kvt_ext":1},
    "ascend_PullReadyNotif": {"type":"PullReadyNotif","pull_id":"9b1c0e6f2a4d4f7e8c3b5a1d2e4f6a8b","keys":K,"sender_buffer_uuids":[U,U],"sender_mem_indexes":[5,6],"sender_id":"10.0.0.5:7600","sender_done_url":"10.0.0.5:7600","fmt":1,"shape":[2,36,256,1024],"dtype":"bfloat16","last_chunk_toks":37},
    "ascend_PullReadyDoneAck": {"type":"PullReadyDoneAck","already_sent_indexes":[1],"alloc_failed":False},
    "ascend_PullDoneSignal": {"type":"PullDoneSignal","pull_id":"9b1c0e6f2a4d4f7e8c3b5a1d2e4f6a8b"},
}
UPSTREAM_GOLDEN = {
    "async_AllocRequest": "89a474797065ac416c6c6f6352657175657374a46b65797392d9215177656e2f5177656e332d384240324030403166336139634062666c6f61743136d9215177656e2f5177656e332d384240324030403737653062324062666c6f61743136a3666d7401a57368617065940224cd0100cd0400a56474797065a862666c6f61743136af6c6173745f6368756e6b5f746f6b7325a67265715f6964a6636d706c2d37ad69735f6c6173745f6261746368c3ac746f74616c5f6368756e6b7300",
    "sync_AllocRequest": "86a474797065ac416c6c6f6352657175657374a46b65797392d9215177656e2f5177656e332d384240324030403166336139634062666c6f61743136d9215177656e2f5177656e332d384240324030403737653062324062666c6f61743136a3666d7401a57368617065940224cd0100cd0400a56474797065a862666c6f61743136af6c6173745f6368756e6b5f746f6b7325",
    "libkvt_AllocRequest": "8aa474797065ac416c6c6f6352657175657374a46b65797392d9215177656e2f5177656e332d384240324030403166336139634062666c6f61743136d9215177656e2f5177656e332d384240324030403737653062324062666c6f61743136a3666d7401a57368617065940224cd0100cd0400a56474797065a862666c6f61743136af6c6173745f6368756e6b5f746f6b7325a67265715f6964a6636d706c2d37ad69735f6c6173745f6261746368c3ac746f74616c5f6368756e6b7302a76b76745f65787401",
    "async_AllocResponse": "83a474797065ad416c6c6f63526573706f6e7365ae72656d6f74655f696e6465786573920c28b4616c72656164795f73656e745f696e646578657390",
    "async_AllocResponse_failed": "83a474797065ad416c6c6f63526573706f6e7365ae72656d6f74655f696e646578657392ffffb4616c72656164795f73656e745f696e646578657390",
    "async_CancelNotif": "83a474797065ab43616e63656c4e6f746966a67265715f6964a6636d706c2d37a46b65797392d9215177656e2f5177656e332d384240324030403166336139634062666c6f61743136d9215177656e2f5177656e332d384240324030403737653062324062666c6f61743136",
    "async_CancelNotif_reply": "83a474797065ad416c6c6f63526573706f6e7365ae72656d6f74655f696e646578657390b4616c72656164795f73656e745f696e646578657390",
    "sync_AllocResponse": "83a474797065ad416c6c6f63526573706f6e7365b4616c72656164795f73656e745f696e64657865739100ae72656d6f74655f696e64657865739128",
    "ascend_AscendAllocResponse": "85a474797065b3417363656e64416c6c6f63526573706f6e7365b4616c72656164795f73656e745f696e64657865739100ae72656d6f74655f696e64657865739128b372656d6f74655f6275666665725f757569647391d92433663262366331652d306434612d346538622d396331662d356136623763386439653066ac616c6c6f635f6661696c6564c2",
    "ascend_AscendAllocResponse_failed": "85a474797065b3417363656e64416c6c6f63526573706f6e7365b4616c72656164795f73656e745f696e646578657390ae72656d6f74655f696e646578657390b372656d6f74655f6275666665725f757569647390ac616c6c6f635f6661696c6564c3",
    "libkvt_AscendAllocResponse": "86a474797065b3417363656e64416c6c6f63526573706f6e7365b4616c72656164795f73656e745f696e646578657390ae72656d6f74655f696e6465786573920304b372656d6f74655f6275666665725f757569647392d92433663262366331652d306434612d346538622d396331662d356136623763386439653066d92433663262366331652d306434612d346538622d396331662d356136623763386439653066ac616c6c6f635f6661696c6564c2a76b76745f65787401",
    "ascend_PullReadyNotif": "8ba474797065ae50756c6c52656164794e6f746966a770756c6c5f6964d9203962316330653666326134643466376538633362356131643265346636613862a46b65797392d9215177656e2f5177656e332d384240324030403166336139634062666c6f61743136d9215177656e2f5177656e332d384240324030403737653062324062666c6f61743136b373656e6465725f6275666665725f757569647392d92433663262366331652d306434612d346538622d396331662d356136623763386439653066d92433663262366331652d306434612d346538622d396331662d356136623763386439653066b273656e6465725f6d656d5f696e6465786573920506a973656e6465725f6964ad31302e302e302e353a37363030af73656e6465725f646f6e655f75726cad31302e302e302e353a37363030a3666d7401a57368617065940224cd0100cd0400a56474797065a862666c6f61743136af6c6173745f6368756e6b5f746f6b7325",
    "ascend_PullReadyDoneAck": "83a474797065b050756c6c5265616479446f6e6541636bb4616c72656164795f73656e745f696e64657865739101ac616c6c6f635f6661696c6564c2",
    "ascend_PullDoneSignal": "82a474797065ae50756c6c446f6e655369676e616ca770756c6c5f6964d9203962316330653666326134643466376538633362356131643265346636613862",
}

# libkvt's encoder writes AllocResponse in the sync order and every
# AllocRequest field; the async-order replies a libkvt receiver sends are
# compared byte for byte in test_lmcache_senders.py instead.
UPSTREAM_ENCODED_BY_LIBKVT = [n for n in UPSTREAM if n not in (
    "async_AllocResponse", "async_AllocResponse_failed", "async_CancelNotif_reply",
    "sync_AllocRequest")]


def decoded_view(msg):
    """What libkvt's JSON view shows for <msg>: defaults filled, kvt_ext hidden when 0."""
    out = dict(msg)
    for k, v in DEFAULTS.get(msg["type"], {}).items():
        out.setdefault(k, v)
    return out


def test_upstream_vectors_are_python_msgpack():
    for name, msg in UPSTREAM.items():
        assert msgpack.packb(msg).hex() == UPSTREAM_GOLDEN[name], name
    assert set(UPSTREAM) == set(UPSTREAM_GOLDEN)


def test_upstream_python_to_libkvt():
    """libkvt decodes what every flavour sends and answers."""
    for name, hexstr in UPSTREAM_GOLDEN.items():
        rc, got = kvt_decode(bytes.fromhex(hexstr))
        assert rc == 0, f"{name}: {got}"
        assert got == decoded_view(UPSTREAM[name]), f"{name}: {got}"


def test_upstream_libkvt_to_python():
    """What libkvt sends in each flavour's terms is upstream's exact bytes."""
    for name in UPSTREAM_ENCODED_BY_LIBKVT:
        raw = kvt_encode(UPSTREAM[name])
        assert raw.hex() == UPSTREAM_GOLDEN[name], f"{name}: {raw.hex()}"
        assert msgpack.unpackb(raw) == UPSTREAM[name], name


def main():
    global TOOL
    TOOL = pdgwtest.binary("kvt-msgtool")
    pdgwtest.run([
        test_golden_vectors_are_python_msgpack,
        test_python_to_libkvt,
        test_libkvt_to_python,
        test_reordered_fields_and_unknown_keys,
        test_missing_defaulted_fields,
        test_rejections_name_the_field,
        test_big_request_roundtrip,
        test_upstream_vectors_are_python_msgpack,
        test_upstream_python_to_libkvt,
        test_upstream_libkvt_to_python,
    ])


if __name__ == "__main__":
    main()
