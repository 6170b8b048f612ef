"""Selective PD through a real pdgw (vllm-nixl) and pdgw-sim: a request goes decode-only when
its prompt is short or when the chosen decode already holds most of it.

Upstream semantics:
- llm-d-inference-scheduler pkg/plugins/profile/prefix_based_pd_decider.go: parameter
  nonCachedTokens; input shorter than it, or a non-cached suffix (input minus the decode
  endpoint's prefix-cache hit) shorter than it, runs the decode profile only (no prefill).
  pdgw: pd_min_prompt_tokens (same rule) and pd_skip_cached_percent (share held).
- A decode-only request is a plain request to the decode engine: no kv_transfer_params, so
  vLLM's connector loads nothing and the engine computes the prompt itself.

- short prompt -> decode-only (no prefill leg, no kv_transfer_params), counted {reason=short};
- long prompt -> both legs, the decode pulls the prefill's KV;
- a prompt the decode holds (warmed directly, seen through its KV events) -> decode-only,
  counted {reason=cached}; the same length uncached -> both legs;
- pd_skip_predicted: behind a slow prefill, once the latency models have seen a few PD
  requests, a short prompt goes decode-only, counted {reason=predicted}; a long one stays PD
  (its prompt would hold up the decode's running requests longer than a token gap);
- a one-leg protocol (neutral) with selective PD set: pdgw says at start that it has no effect.
"""

import json
import time
import uuid

import pdgwtest as T
import fwdconf
from fwdconf import Gateway, Sim, wait_idle

MODEL = fwdconf.MODEL


def words(tag, n):
    return " ".join(f"{tag}{i}" for i in range(n))


def send(gw, prompt):
    rid = "spd-" + uuid.uuid4().hex[:12]
    st, _, obj, raw = T.post_json(gw.port, "/v1/completions",
                                  {"model": MODEL, "prompt": prompt, "max_tokens": 3},
                                  {"X-Request-Id": rid})
    assert st == 200, (st, raw[:300])
    assert obj["choices"][0]["text"], obj
    return rid


def send_stream(gw, prompt):
    """A streamed request: the relayed stream's first token and token gaps are what teach
    pdgw's latency models (a whole answer tells no first-token time)."""
    rid = "spd-" + uuid.uuid4().hex[:12]
    events = list(T.sse_events(gw.port, "/v1/completions",
                               {"model": MODEL, "prompt": prompt, "max_tokens": 4,
                                "stream": True, "ignore_eos": True},
                               {"X-Request-Id": rid}))
    assert events and events[-1] == "[DONE]", events
    return rid


def legs(P, D, rid):
    prec = [r for r in P.records(rid) if r["path"] == "/v1/completions"]
    drec = [r for r in D.records(rid) if r["path"] == "/v1/completions"]
    return prec, drec


def test_short_and_long_prompts():
    P, D = Sim("prefill", "sp-P"), Sim("decode", "sp-D")
    gw = Gateway("vllm-nixl", "batch", [P.instance(), D.instance()], {},
                 top={"pd_min_prompt_tokens": 40, "tokenize_timeout": "5s"})
    try:
        rid = send(gw, words("s", 10))
        prec, drec = legs(P, D, rid)
        assert prec == [] and len(drec) == 1, (prec, drec)
        assert "kv_transfer_params" not in drec[0]["body"], drec[0]["body"]
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "short"}) == 1

        rid = send(gw, words("l", 80))
        prec, drec = legs(P, D, rid)
        assert len(prec) == 1 and len(drec) == 1, (prec, drec)
        assert drec[0]["body"]["kv_transfer_params"]["do_remote_prefill"] is True
        assert drec[0]["kv_result"]["ok"], drec[0]["kv_result"]
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "short"}) == 1
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "cached"}) == 0
        # the prompt was counted by the engine's tokenizer, not estimated
        assert gw.metric("pdgw_tokenize_total", {"result": "ok"}) == 2
        wait_idle([P, D])
    finally:
        gw.stop()
        P.proc.kill()
        D.proc.kill()


def test_cached_prompt_goes_decode_only():
    ev, rp = T.free_port(), T.free_port()
    kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}", "topic": "kv"}
    P = Sim("prefill", "sc-P")
    D = Sim("decode", "sc-D", "--kv-events-config", json.dumps(kv_cfg))
    dinst = D.instance()
    dinst.update(kv_events_endpoint=f"tcp://127.0.0.1:{ev}",
                 kv_events_replay_endpoint=f"tcp://127.0.0.1:{rp}")
    gw = Gateway("vllm-nixl", "batch", [P.instance(), dinst], {},
                 top={"decode_policy": "precise-prefix", "pd_skip_cached_percent": 80,
                      "tokenize_timeout": "5s"})
    try:
        held = words("h", 16 * 16)
        st, _, _, raw = T.post_json(D.port, "/v1/completions",
                                    {"model": MODEL, "prompt": held, "max_tokens": 1})
        assert st == 200, raw
        deadline = time.time() + 15
        while gw.metric("pdgw_kv_index_blocks") < 16:
            assert time.time() < deadline, gw.metrics()
            time.sleep(0.05)
        rid = send(gw, held + " and a short question")
        prec, drec = legs(P, D, rid)
        assert prec == [] and len(drec) == 1, (prec, drec)
        assert "kv_transfer_params" not in drec[0]["body"], drec[0]["body"]
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "cached"}) == 1

        rid = send(gw, words("u", 16 * 16) + " and a short question")
        prec, drec = legs(P, D, rid)
        assert len(prec) == 1 and len(drec) == 1, (prec, drec)
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "cached"}) == 1
        wait_idle([P, D])
    finally:
        gw.stop()
        P.proc.kill()
        D.proc.kill()


def test_predicted_decode_only():
    # The engines' speeds are theirs alone; pdgw learns them from the legs it runs.
    P = Sim("prefill", "sx-P", "--ttft-ms", "150", "--prefill-ms-per-token", "0.5")
    D = Sim("decode", "sx-D", "--tpot-ms", "20")
    gw = Gateway("vllm-nixl", "batch", [P.instance(), D.instance()], {},
                 top={"pd_skip_predicted": True, "tokenize_timeout": "5s"})
    try:
        # cold: nothing is skipped while the models learn the PD path (8 legs each)
        for i in range(8):
            rid = send_stream(gw, words(f"w{i}x", 8 if i % 2 else 150))
            prec, drec = legs(P, D, rid)
            assert len(prec) == 1 and len(drec) == 1, (i, prec, drec)
        skipped = 0
        for i in range(10):
            rid = send_stream(gw, words(f"q{i}x", 8))
            prec, drec = legs(P, D, rid)
            if prec == []:
                assert len(drec) == 1 and "kv_transfer_params" not in drec[0]["body"], drec
                skipped += 1
        assert skipped >= 8, (skipped, gw.metrics())
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "predicted"}) == skipped
        rid = send_stream(gw, words("long", 600))
        prec, drec = legs(P, D, rid)
        assert len(prec) == 1 and len(drec) == 1, (prec, drec)
        assert gw.metric("pdgw_pd_skipped_total", {"reason": "predicted"}) == skipped
        assert gw.metric("pdgw_predict_observations_total",
                         {"instance": "sx-D", "phase": "kv_handoff"}) >= 8
        wait_idle([P, D])
    finally:
        gw.stop()
        P.proc.kill()
        D.proc.kill()


def test_one_leg_protocol_warns():
    B = Sim("both", "sw-B")
    gw = Gateway("neutral", "batch", [B.instance()], {},
                 top={"pd_min_prompt_tokens": 40, "pd_skip_predicted": True})
    try:
        out = gw.proc.output()
        assert "selective PD" in out and "no effect" in out and "neutral" in out, out[-2000:]
    finally:
        gw.stop()
        B.proc.kill()


if __name__ == "__main__":
    T.run([test_short_and_long_prompts, test_cached_prompt_goes_decode_only,
           test_predicted_decode_only, test_one_leg_protocol_warns])
