"""The slo policy chooses a PD request's prefill together with its decode, by the KV handoff
each (prefill, decode) pair has been seen to take.

Two pdgw-sim prefills and one decode behind a real pdgw (vllm-mooncake, both legs sent at
once). The first prefill computes a prompt in half the other's time, but its link is slow
(`--prefill-ms-per-token`, `--kv-link-gbps`: the test's own numbers; pdgw never reads them).
Its prefill legs still answer sooner, because a vLLM prefill answers before its KV is sent
(`vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py`: the
scheduler's request_finished keeps the blocks of a length-capped prefill and the sender
threads push them after); the decode's first token comes some 400 ms after it. Only the
pair's handoff says so: a prefill chosen on its own time takes the fast one every time (the
control, checked by hand against a build without the pair choice). Once both prefills were
tried, every request must go through the other one.
"""

import time

import pdgwtest as T
import fwdconf as F

COMMON = ["--kv-bytes-per-token", "8192", "--no-prefix-cache"]
WORDS = " ".join(f"w{i}" for i in range(1000))


def served(sim):
    return sim.metric("vllm:request_success_total")


def test_slow_pair_is_avoided():
    sims = []
    gw = None
    try:
        slow = F.Sim("prefill", "p-slowlink", *COMMON, "--prefill-ms-per-token", "0.02",
                     "--kv-link-gbps", "0.2")
        sims.append(slow)
        fast = F.Sim("prefill", "p-2", *COMMON, "--prefill-ms-per-token", "0.06")
        sims.append(fast)
        dec = F.Sim("decode", "d-1", *COMMON)
        sims.append(dec)
        gw = F.Gateway("vllm-mooncake", "batch", [s.instance() for s in sims],
                       top={"prefill_policy": "slo", "decode_policy": "slo"})
        took = []
        for i in range(30):
            body = {"model": F.MODEL, "prompt": f"r{i} {WORDS}", "max_tokens": 4,
                    "ignore_eos": True, "stream": True}
            t0 = time.monotonic()
            evs = list(T.sse_events(gw.port, "/v1/completions", body, {"X-Request-Id": f"pr{i}"}))
            assert evs[-1] == "[DONE]", evs[-3:]
            took.append(time.monotonic() - t0)
            if i == 17:
                before = served(slow), served(fast)
        after = served(slow), served(fast)
        print(f"slow-link prefill served {after[0]:.0f}, the other {after[1]:.0f}; "
              f"last 12 requests {min(took[18:]) * 1000:.0f}-{max(took[18:]) * 1000:.0f} ms, "
              f"first {took[0] * 1000:.0f} ms", flush=True)
        # each prefill is tried (a cold instance is tried first while idle), then the pair
        # through the slow link is passed over: the last 12 all through the other
        assert after[0] - before[0] == 0, (before, after)
        assert after[1] - before[1] == 12, (before, after)
        assert after[0] >= 1, after
        handoff = gw.metric("pdgw_predict_observations_total",
                            {"instance": "d-1", "phase": "kv_handoff"})
        assert handoff == 30, handoff
        gw.stop()
        gw = None
    finally:
        if gw:
            gw.proc.kill()
        for s in sims:
            s.proc.kill()


if __name__ == "__main__":
    T.run([test_slow_pair_is_avoided])
