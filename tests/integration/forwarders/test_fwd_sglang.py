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
"""

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


if __name__ == "__main__":
    T.run([test_null_bootstrap_port, test_prefill_dp_alignment, test_decode_routed_dp_rank,
           test_sim_refuses_misrouted_kv])
