"""sglang forwarder against pdgw-sim SGLang engines: bootstrap_port null when the prefill has
none configured (the engines use their own bootstrap port), bootstrap_room aligned to the
prefill's DP rank with routed_dp_rank / disagg_prefill_dp_rank, routed_dp_rank for a decode DP
rank, and the KV verified byte by byte in each case.

Upstream facts (sgl-project/sglang):
- python/sglang/srt/disaggregation/mini_lb.py: the same body goes to prefill and decode at
  once with bootstrap_host, bootstrap_port (None when no --prefill-bootstrap-ports is given)
  and bootstrap_room = random integer in [0, 2^63 - 1].
- sgl-model-gateway/src/routers/http/pd_router.rs: bootstrap_port null for a worker without
  one; for a pinned prefill DP rank the prefill body gets routed_dp_rank and the decode body
  disagg_prefill_dp_rank; for a pinned decode DP rank the decode body gets routed_dp_rank.
- A PD prefill with DP runs a request on routed_dp_rank, else follows the room
  (room % dp_size); the decode fetches the KV from disagg_prefill_dp_rank, else from
  room % prefill dp_size.
- Native /generate (mini_lb.py handle_generate_request; python/sglang/srt/managers/io_struct.py
  GenerateReqInput; python/sglang/srt/entrypoints/http_server.py generate_request): the
  client's body with bootstrap_host/port/room added (lists, one entry and room per item, for a
  batch "text" list), the decode's answer returned: {"text", "meta_info"} or, streamed,
  "data: {...}" events with the cumulative text and "data: [DONE]"
  (test/srt/test_httpserver_decode_stream.py reads "text" as cumulative).
"""

import json
import uuid

import pdgwtest as T
from fwdconf import Gateway, Sim, client_body, path_of, wait_idle


def run(gw, P, D, chat=False, stream=False):
    rid = "sg-" + uuid.uuid4().hex[:12]
    body = client_body(chat, stream)
    if stream:
        evs = list(T.sse_events(gw.port, path_of(chat), body, {"X-Request-Id": rid}))
        assert evs[-1] == "[DONE]", evs[-3:]
    else:
        st, _, _, raw = T.post_json(gw.port, path_of(chat), body, {"X-Request-Id": rid})
        assert st == 200, raw
    [prec] = [r for r in P.records(rid) if r["path"] == path_of(chat)]
    [drec] = [r for r in D.records(rid) if r["path"] == path_of(chat)]
    res = drec["kv_result"]
    assert res["ok"] and res["pages"] > 0 and res["verify_failures"] == 0, res
    assert res["recompute"] is False, res
    return prec, drec


def test_null_bootstrap_port():
    """No bootstrap_port configured: both legs carry bootstrap_port null and the engines use
    their own (--disaggregation-bootstrap-port; the sim decode is given the prefill's)."""
    P = Sim("prefill", "prefill-np")
    D = Sim("decode", "decode-np", "--bootstrap-port", str(P.boot_port))
    inst = P.instance()
    del inst["bootstrap_port"]
    gw = Gateway("sglang", "batch", [inst, D.instance()])
    try:
        rooms = set()
        for chat in (False, True):
            for stream in (False, True):
                prec, drec = run(gw, P, D, chat, stream)
                for b in (prec["body"], drec["body"]):
                    assert b["bootstrap_host"] == "127.0.0.1", b
                    assert "bootstrap_port" in b and b["bootstrap_port"] is None, b
                    assert "routed_dp_rank" not in b and "disagg_prefill_dp_rank" not in b, b
                room = drec["body"]["bootstrap_room"]
                assert prec["body"]["bootstrap_room"] == room
                assert isinstance(room, int) and 0 <= room <= 2 ** 63 - 1, room
                rooms.add(room)
        assert len(rooms) == 4, rooms
        wait_idle([P, D])
    finally:
        gw.stop()


def test_prefill_dp_alignment():
    """Prefill DP rank r of 2: room % 2 == r, routed_dp_rank r on the prefill leg,
    disagg_prefill_dp_rank r on the decode leg; the prefill ran it on rank r."""
    P = Sim("prefill", "prefill-dp", "--dp-size", "2")
    D = Sim("decode", "decode-dp")
    for rank in (1, 0):
        inst = P.instance()
        inst.update(id=f"prefill-dp{rank}", dp_rank=rank, dp_size=2)
        gw = Gateway("sglang", "batch", [inst, D.instance()])
        try:
            for _ in range(3):
                prec, drec = run(gw, P, D)
                room = drec["body"]["bootstrap_room"]
                assert room % 2 == rank, (room, rank)
                assert prec["body"]["routed_dp_rank"] == rank, prec["body"]
                assert "disagg_prefill_dp_rank" not in prec["body"], prec["body"]
                assert drec["body"]["disagg_prefill_dp_rank"] == rank, drec["body"]
                assert "routed_dp_rank" not in drec["body"], drec["body"]
                assert prec["kv"]["dp_rank"] == rank, prec["kv"]
            wait_idle([P, D])
        finally:
            gw.stop()


def test_decode_routed_dp_rank():
    """Decode DP rank 1 of 2: routed_dp_rank 1 on the decode leg only (the room stays the
    prefill's business)."""
    P = Sim("prefill", "prefill-ddp")
    D = Sim("decode", "decode-ddp", "--dp-size", "2")
    inst = D.instance()
    inst.update(dp_rank=1, dp_size=2)
    gw = Gateway("sglang", "staged", [P.instance(), inst])
    try:
        for _ in range(4):
            prec, drec = run(gw, P, D)
            assert drec["body"]["routed_dp_rank"] == 1, drec["body"]
            assert "routed_dp_rank" not in prec["body"], prec["body"]
            assert "disagg_prefill_dp_rank" not in drec["body"], drec["body"]
        wait_idle([P, D])
    finally:
        gw.stop()


def test_sim_refuses_misrouted_kv():
    """The sim decode fetches from disagg_prefill_dp_rank; a decode naming another rank
    than the one the prefill ran the request on does not get the KV (a router that pins the
    prefill rank must tell the decode)."""
    P = Sim("prefill", "prefill-mis", "--dp-size", "2")
    D = Sim("decode", "decode-mis", "--kv-wait-timeout-ms", "2000")
    body = client_body(False, False)
    room = 2 * 12345  # room % 2 == 0
    common = dict(bootstrap_host="127.0.0.1", bootstrap_port=P.boot_port, bootstrap_room=room)
    pb = dict(body, max_tokens=1, routed_dp_rank=1, **common)
    db = dict(body, **common)  # no disagg_prefill_dp_rank: the decode expects rank 0
    st, _, _, raw = T.post_json(P.port, "/v1/completions", pb)
    assert st == 200, raw
    rid = "mis-" + uuid.uuid4().hex[:12]
    st, _, _, raw = T.post_json(D.port, "/v1/completions", db, {"X-Request-Id": rid})
    assert st >= 500, raw
    [drec] = D.records(rid)
    assert "DP rank 1" in drec["kv_result"]["error"], drec["kv_result"]
    wait_idle([P, D])


GEN_BODY = {"text": "The capital of France is a city that", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0}}


def gen_legs(P, D, rid):
    [prec] = [r for r in P.records(rid) if r["path"] == "/generate"]
    [drec] = [r for r in D.records(rid) if r["path"] == "/generate"]
    return prec, drec


def test_generate_pd():
    """SGLang's native /generate through pdgw in PD: the client's body on both legs plus the
    bootstrap fields (the prefill's not streamed), the KV verified on the decode, the decode's
    native answer relayed, streamed and not."""
    P = Sim("prefill", "prefill-gen")
    D = Sim("decode", "decode-gen")
    gw = Gateway("sglang", "batch", [P.instance(), D.instance()])
    try:
        rid = "gen-" + uuid.uuid4().hex[:12]
        st, hdrs, out, raw = T.post_json(gw.port, "/generate", GEN_BODY, {"X-Request-Id": rid})
        assert st == 200, raw
        assert hdrs["content-type"].startswith("application/json"), hdrs
        assert isinstance(out["text"], str) and out["text"], out
        meta = out["meta_info"]
        assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] > 0, meta
        assert meta["finish_reason"]["type"] == "length", meta
        assert len(meta["output_token_logprobs"]) == 6, meta
        prec, drec = gen_legs(P, D, rid)
        for rec in (prec, drec):
            b = rec["body"]
            assert b["text"] == GEN_BODY["text"], b
            assert b["sampling_params"] == GEN_BODY["sampling_params"], b
            assert b["return_logprob"] is True, b
            assert b["bootstrap_host"] == "127.0.0.1" and b["bootstrap_port"] == P.boot_port, b
            assert "max_tokens" not in b, b
        assert prec["body"]["bootstrap_room"] == drec["body"]["bootstrap_room"]
        assert prec["body"]["stream"] is False, prec["body"]
        kv = drec["kv_result"]
        assert kv["ok"] and kv["pages"] > 0 and kv["verify_failures"] == 0, kv

        rid = "gens-" + uuid.uuid4().hex[:12]
        evs = list(T.sse_events(gw.port, "/generate", dict(GEN_BODY, stream=True),
                                {"X-Request-Id": rid}))
        assert evs[-1] == "[DONE]" and evs.count("[DONE]") == 1, evs[-3:]
        objs = [json.loads(e) for e in evs[:-1]]
        assert len(objs) >= 2, evs
        texts = [o["text"] for o in objs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts  # cumulative
        assert texts[-1] == out["text"], (texts[-1], out["text"])
        assert objs[-1]["meta_info"]["completion_tokens"] == 6, objs[-1]
        prec, drec = gen_legs(P, D, rid)
        assert drec["body"]["stream"] is True and prec["body"]["stream"] is False
        kv = drec["kv_result"]
        assert kv["ok"] and kv["pages"] > 0 and kv["verify_failures"] == 0, kv
        wait_idle([P, D])
    finally:
        gw.stop()


def test_generate_batch_bootstrap_arrays():
    """A batch ("text" a list) gets bootstrap_host/port/room as lists, one entry per item, the
    rooms distinct and the same on both legs (mini_lb.py). pdgw-sim serves one prompt per
    /generate, so the engines' refusal (400) is what the client sees."""
    P = Sim("prefill", "prefill-genb")
    D = Sim("decode", "decode-genb")
    inst = P.instance()
    del inst["bootstrap_port"]
    gw = Gateway("sglang", "batch", [inst, D.instance()])
    try:
        rid = "genb-" + uuid.uuid4().hex[:12]
        body = dict(GEN_BODY, text=["first prompt", "second prompt", "third prompt"])
        st, _, _, raw = T.post_json(gw.port, "/generate", body, {"X-Request-Id": rid})
        assert st == 400, raw
        prec, drec = gen_legs(P, D, rid)
        for rec in (prec, drec):
            b = rec["body"]
            assert b["bootstrap_host"] == ["127.0.0.1"] * 3, b
            assert b["bootstrap_port"] == [None] * 3, b
            assert len(set(b["bootstrap_room"])) == 3, b
            assert all(0 <= r <= 2 ** 63 - 1 for r in b["bootstrap_room"]), b
        assert prec["body"]["bootstrap_room"] == drec["body"]["bootstrap_room"]
        wait_idle([P, D])
    finally:
        gw.stop()


def test_generate_gateway_rules():
    """/generate is served only by a protocol that lists it (404 otherwise); a body without
    "text" / "input_ids" or with a client bootstrap_room is refused with 400 before any leg."""
    P = Sim("prefill", "prefill-genr")
    D = Sim("decode", "decode-genr")
    gw = Gateway("sglang", "batch", [P.instance(), D.instance()])
    other = Gateway("vllm-nixl", "batch", [P.instance(), D.instance()])
    try:
        st, _, out, raw = T.post_json(gw.port, "/generate", {"sampling_params": {}})
        assert st == 400 and out["error"]["param"] == "text", raw
        st, _, out, raw = T.post_json(gw.port, "/generate", {"text": "a", "input_ids": [1]})
        assert st == 400 and out["error"]["param"] == "input_ids", raw
        st, _, out, raw = T.post_json(gw.port, "/generate", dict(GEN_BODY, bootstrap_room=7))
        assert st == 400, raw
        st, _, _, raw = T.post_json(other.port, "/generate", GEN_BODY)
        assert st == 404, raw
    finally:
        gw.stop()
        other.stop()


def test_generate_logprob_merge():
    """return_logprob on /generate: the client gets the prefill's
    meta_info.input_token_logprobs followed by the decode's (mini_lb.py generate /
    generate_stream: non-streamed in the answer, streamed in every data event); the prefill's
    list covers the prompt, the sim decode's is empty. A non-streamed decode answer that is
    complete before the prefill's waits for it, so the merge always happens (run it a few
    times: the order of the two answers varies)."""
    P = Sim("prefill", "prefill-genm")
    D = Sim("decode", "decode-genm")
    B = Sim("both", "both-genm")
    gw = Gateway("sglang", "batch", [P.instance(), D.instance()])
    try:
        body = {"input_ids": [21, 22, 23, 24, 25, 26, 27], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 4}}
        st, _, ref, raw = T.post_json(B.port, "/generate", body)  # one engine, no PD
        assert st == 200, raw
        want = ref["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in want] == body["input_ids"], want
        for _ in range(5):
            rid = "genm-" + uuid.uuid4().hex[:12]
            st, _, out, raw = T.post_json(gw.port, "/generate", body, {"X-Request-Id": rid})
            assert st == 200, raw
            assert out["meta_info"]["input_token_logprobs"] == want, out["meta_info"]
            _, drec = gen_legs(P, D, rid)
            assert drec["kv_result"]["ok"], drec["kv_result"]
        evs = list(T.sse_events(gw.port, "/generate", dict(body, stream=True)))
        objs = [json.loads(e) for e in evs[:-1]]
        assert objs and evs[-1] == "[DONE]", evs
        for o in objs:
            # Events relayed before the prefill answered cannot carry its list yet.
            assert o["meta_info"]["input_token_logprobs"] in (want, []), o["meta_info"]
        st, _, out, raw = T.post_json(gw.port, "/generate", dict(body, return_logprob=False))
        assert st == 200 and "input_token_logprobs" not in out["meta_info"], raw
        wait_idle([P, D, B])
    finally:
        gw.stop()


def test_sim_generate_logprobs():
    """pdgw-sim's /generate in SGLang's shape per role: with return_logprob a prefill (and a
    'both' engine) reports one input_token_logprobs entry per prompt token, a PD decode none;
    without it meta_info has no logprob lists."""
    B = Sim("both", "both-gen")
    P = Sim("prefill", "prefill-genl")
    body = {"input_ids": [11, 12, 13, 14, 15], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 3}}
    st, _, out, raw = T.post_json(B.port, "/generate", body)
    assert st == 200, raw
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 3, meta
    assert [e[1] for e in meta["input_token_logprobs"]] == [11, 12, 13, 14, 15], meta
    assert all(isinstance(e[0], float) and e[2] is None for e in meta["input_token_logprobs"])
    assert len(meta["output_token_logprobs"]) == 3, meta
    st, _, out, raw = T.post_json(B.port, "/generate", dict(body, return_logprob=False))
    assert st == 200 and "input_token_logprobs" not in out["meta_info"], raw
    room = dict(bootstrap_host="127.0.0.1", bootstrap_port=P.boot_port, bootstrap_room=99)
    st, _, out, raw = T.post_json(P.port, "/generate", dict(body, **room))
    assert st == 200 and len(out["meta_info"]["input_token_logprobs"]) == 5, raw
    wait_idle([B])  # the prefill holds its KV for a decode that never comes


def test_prefill_gets_the_clients_sampling_settings():
    """SGLang's prefill samples the answer's first token and the decode appends it
    (python/sglang/srt/disaggregation/decode_schedule_batch_mixin.py,
    process_prebuilt_extend: the decode's first output id is the one the prefill sent), and
    mini_lb.py sends both legs the same body: min_tokens, stop, stop_token_ids, max_tokens
    and ignore_eos reach the prefill as the client set them; only stream is off (its answer
    is drained) and stream_options goes with it."""
    P = Sim("prefill", "prefill-ss")
    D = Sim("decode", "decode-ss")
    gw = Gateway("sglang", "batch", [P.instance(), D.instance()])
    try:
        for stream in (False, True):
            rid = "ss-" + uuid.uuid4().hex[:12]
            body = dict(client_body(False, stream), min_tokens=3, stop_token_ids=[7],
                        stop=["never-in-output"], ignore_eos=False)
            if stream:
                evs = list(T.sse_events(gw.port, "/v1/completions", body, {"X-Request-Id": rid}))
                assert evs[-1] == "[DONE]", evs[-3:]
            else:
                st, _, _, raw = T.post_json(gw.port, "/v1/completions", body,
                                            {"X-Request-Id": rid})
                assert st == 200, raw
            [prec] = [r for r in P.records(rid) if r["path"] == "/v1/completions"]
            [drec] = [r for r in D.records(rid) if r["path"] == "/v1/completions"]
            pb = prec["body"]
            for k in ("min_tokens", "stop", "stop_token_ids", "max_tokens", "ignore_eos",
                      "prompt", "model"):
                assert pb.get(k) == body[k], (k, pb.get(k), body[k])
            assert pb["stream"] is False and "stream_options" not in pb, pb
            assert drec["body"]["min_tokens"] == 3, drec["body"]
            assert pb["bootstrap_room"] == drec["body"]["bootstrap_room"], (pb, drec["body"])
            res = drec["kv_result"]
            assert res["ok"] and res["verify_failures"] == 0 and res["recompute"] is False, res
        wait_idle([P, D])
    finally:
        gw.stop()


if __name__ == "__main__":
    T.run([test_null_bootstrap_port, test_prefill_dp_alignment, test_decode_routed_dp_rank,
           test_sim_refuses_misrouted_kv, test_generate_pd, test_generate_batch_bootstrap_arrays,
           test_generate_gateway_rules, test_generate_logprob_merge, test_sim_generate_logprobs,
           test_prefill_gets_the_clients_sampling_settings])
