#!/usr/bin/python3
"""pdgw-sim under load behaves like a vLLM V1 engine (the step model of tests/sim/README.md),
measured from the client side; ratios, not absolute times, so a loaded machine passes.

* Continuous batching: a step advances every running request by one token, and costs
  step-ms-per-seq more per decoding sequence (base = tpot - step-ms-per-seq), so TPOT at
  batch 32 is (tpot + 31 x step-ms-per-seq) / tpot times TPOT at batch 1.
* Chunked prefill: vLLM V1 fills each step's token budget (--max-num-batched-tokens; vLLM's
  default 2048, vllm/config/scheduler.py SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)
  with the running decodes first, then a chunk of a waiting prompt
  (vllm/v1/core/sched/scheduler.py, schedule()): a decode keeps streaming while a 16k-token
  prompt prefills, one step at a time.
* Preemption: a running request that cannot get its next KV block preempts the most
  recently admitted one (scheduler.py: running.pop(), _preempt_request: blocks freed,
  num_computed_tokens = 0, back to the front of the waiting queue), counted in
  vllm:num_preemptions_total (vllm/v1/metrics/loggers.py, the counter
  "vllm:num_preemptions"); every request still completes with its tokens.
* Speed factors: --speed 0.5 doubles an idle request's TTFT and TPOT; --prefill-speed only
  the TTFT.
* SGLang's bootstrap server (python/sglang/srt/disaggregation/common/conn.py,
  CommonKVBootstrapServer): GET /health "OK"; GET /route needs prefill_dp_rank,
  prefill_cp_rank, target_tp_rank, target_pp_rank (400 without), all -1 answers the
  topology (dp_size, attn_tp_size, ...), a rank its rank_ip / rank_port, an unknown rank 404.
* vLLM's NIXL decode (nixl/pull_scheduler.py, update_state_after_alloc) tests the keys
  remote_engine_id, remote_request_id, remote_host, remote_port by presence (`p in params`):
  one present with null is not "invalid KVTransferParams" (no recompute); the pull it
  schedules cannot reach a null peer and vLLM's default kv_load_failure_policy "fail"
  (vllm/config/kv_transfer.py) fails the request.
"""

import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pdgwtest as T  # noqa: E402
from simtest import complete, metric, start_sim  # noqa: E402


def timed_stream(port, body):
    """Stream a completion; returns (arrival times of the token chunks, text)."""
    times, text = [], []
    for ev in T.sse_events(port, "/v1/completions", dict(body, stream=True), timeout=120):
        if ev == "[DONE]":
            break
        times.append(time.monotonic())
        obj = json.loads(ev)
        for ch in obj.get("choices", []):
            text.append(ch.get("text") or "")
    return times, "".join(text)


def gaps(times):
    return [b - a for a, b in zip(times, times[1:])]


def test_tpot_grows_with_batch():
    tpot, per_seq = 40.0, 2.0
    p, port = start_sim("--ttft-ms", 5, "--tpot-ms", tpot, "--step-ms-per-seq", per_seq,
                        "--eos-period", 0)
    body = {"max_tokens": 30, "ignore_eos": True}
    # batch 1
    t1, _ = timed_stream(port, dict(body, prompt="alone"))
    one = statistics.median(gaps(t1)[5:])
    # batch 32: every stream is in the same steps once all prefilled
    res = [None] * 32

    def go(i):
        res[i] = timed_stream(port, dict(body, prompt=f"batch {i}"))[0]

    ths = [threading.Thread(target=go, args=(i,)) for i in range(32)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert all(r and len(r) == 30 for r in res), [len(r or []) for r in res]
    many = statistics.median(g for r in res for g in gaps(r)[8:25])
    expect = (tpot - per_seq + 32 * per_seq) / tpot  # 2.55
    ratio = many / one
    print(f"TPOT batch 1 {one * 1000:.1f} ms, batch 32 {many * 1000:.1f} ms, ratio {ratio:.2f} "
          f"(model {expect:.2f})", flush=True)
    assert expect * 0.8 < ratio < expect * 1.25, (one, many, ratio)
    # the idle engine keeps --tpot-ms
    assert tpot * 0.9 / 1000 < one < tpot * 1.5 / 1000, one
    p.kill()


def test_long_prompt_is_chunked():
    a, tpot, budget = 0.05, 10.0, 2048
    p, port = start_sim("--ttft-ms", 10, "--tpot-ms", tpot, "--prefill-ms-per-token", a,
                        "--max-model-len", 40000, "--kv-capacity-tokens", 100000,
                        "--eos-period", 0)
    step = tpot + budget * a  # a decode plus a full chunk: 112 ms
    decode = {}

    def go():
        decode["times"] = timed_stream(port, {"prompt": "steady", "max_tokens": 150,
                                              "ignore_eos": True})[0]

    th = threading.Thread(target=go)
    th.start()
    deadline = time.time() + 10
    while metric(port, "vllm:generation_tokens_total") < 5:
        assert time.time() < deadline, "the decode never started"
        time.sleep(0.01)
    long_prompt = " ".join(f"w{i}" for i in range(16383))  # + "x": 16384 tokens
    t0 = time.monotonic()
    lt, _ = timed_stream(port, {"prompt": long_prompt + " x", "max_tokens": 1})
    t_first = lt[0]
    th.join()
    during = [b for b in decode["times"] if t0 <= b <= t_first]
    during += [b for b in decode["times"] if b > t_first][:1]  # the gap that ends the window
    g = gaps(during)
    prefill = t_first - t0
    print(f"16k prefill {prefill * 1000:.0f} ms; decode tokens meanwhile {len(during)}, "
          f"largest gap {max(g) * 1000:.0f} ms (one step {step:.0f} ms)", flush=True)
    # 8 chunks of at most 2048 tokens, each in a step with the decode
    assert prefill >= 16384 * a / 1000, prefill
    assert len(during) >= 6, len(during)
    assert max(g) < 2.5 * step / 1000, max(g)
    # one unchunked step would hold the decode for the whole prefill
    assert max(g) < prefill / 3, (max(g), prefill)
    p.kill()


def test_preemption_keeps_every_request_whole():
    args = ["--ttft-ms", 2, "--tpot-ms", 2, "--block-size", 16, "--eos-period", 0]
    roomy, rport = start_sim(*args, name="roomy")
    # 32 blocks; 4 requests of 200 tokens each need 13-14 blocks at their end
    tight, tport = start_sim(*args, "--kv-capacity-tokens", 512, name="tight")
    bodies = [{"prompt": f"preempt me {i} " + "pad " * 10, "max_tokens": 200, "ignore_eos": True}
              for i in range(4)]
    want = [complete(rport, b)[0]["choices"][0]["text"] for b in bodies]
    got = [None] * 4
    usage = []

    def go(i):
        obj, _ = complete(tport, bodies[i])
        got[i] = (obj["choices"][0]["text"], obj["usage"]["completion_tokens"])

    ths = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in ths:
        t.start()
    while any(t.is_alive() for t in ths):
        usage.append(metric(tport, "vllm:kv_cache_usage_perc"))
        time.sleep(0.01)
    for t in ths:
        t.join()
    pre = metric(tport, "vllm:num_preemptions_total")
    print(f"preemptions {pre:.0f}, peak KV usage {max(usage or [0]):.2f}", flush=True)
    assert pre > 0
    assert [g[0] for g in got] == want
    assert all(g[1] == 200 for g in got), got
    assert max(usage) <= 1.0
    assert metric(tport, "vllm:num_requests_running") == 0
    assert metric(tport, "vllm:num_requests_waiting") == 0
    assert metric(tport, "vllm:kv_cache_usage_perc") == 0
    # the roomy engine never preempts
    assert metric(rport, "vllm:num_preemptions_total") == 0
    roomy.kill()
    tight.kill()


def idle_ttft_tpot(*args):
    """Best of three lone streams: (TTFT, median TPOT) in seconds."""
    p, port = start_sim("--ttft-ms", 100, "--tpot-ms", 20, "--prefill-ms-per-token", 0,
                        "--eos-period", 0, *args)
    best = None
    for i in range(3):
        t0 = time.monotonic()
        times, _ = timed_stream(port, {"prompt": f"idle {i}", "max_tokens": 12,
                                       "ignore_eos": True})
        cur = (times[0] - t0, statistics.median(gaps(times)))
        best = cur if best is None else (min(best[0], cur[0]), min(best[1], cur[1]))
    p.kill()
    return best


def test_speed_factors():
    base = idle_ttft_tpot()
    slow = idle_ttft_tpot("--speed", 0.5)
    slow_prefill = idle_ttft_tpot("--prefill-speed", 0.5)
    print(f"TTFT/TPOT ms: speed 1 {base[0] * 1000:.0f}/{base[1] * 1000:.1f}, speed 0.5 "
          f"{slow[0] * 1000:.0f}/{slow[1] * 1000:.1f}, prefill-speed 0.5 "
          f"{slow_prefill[0] * 1000:.0f}/{slow_prefill[1] * 1000:.1f}", flush=True)
    assert 1.7 < slow[0] / base[0] < 2.3, (base, slow)
    assert 1.7 < slow[1] / base[1] < 2.3, (base, slow)
    assert 1.7 < slow_prefill[0] / base[0] < 2.3, (base, slow_prefill)
    assert 0.8 < slow_prefill[1] / base[1] < 1.25, (base, slow_prefill)
    # idle numbers are the flags' own
    assert 0.1 <= base[0] < 0.2 and 0.02 <= base[1] < 0.035, base
    # a wrong setting is refused with the reason
    p, port = start_sim("--speed", 0, wait=False)
    assert p.wait(timeout=10) != 0 and "--speed" in p.output(), p.output()
    p, port = start_sim("--timing", "sometimes", wait=False)
    assert p.wait(timeout=10) != 0 and "--timing" in p.output(), p.output()


def test_per_request_timing_is_kept():
    """--timing per-request: every request its own clock, so a batch does not slow TPOT."""
    p, port = start_sim("--ttft-ms", 5, "--tpot-ms", 40, "--step-ms-per-seq", 2,
                        "--eos-period", 0, "--timing", "per-request")
    res = [None] * 16

    def go(i):
        res[i] = timed_stream(port, {"prompt": f"own clock {i}", "max_tokens": 12,
                                     "ignore_eos": True})[0]

    ths = [threading.Thread(target=go, args=(i,)) for i in range(16)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    med = statistics.median(g for r in res for g in gaps(r))
    assert 0.036 < med < 0.06, med
    p.kill()


def test_sglang_bootstrap_server():
    from pdlegs import Inst
    P = Inst("prefill", "--dp-size", 2)
    st, _, body = T.request("GET", P.boot_port, "/health")
    assert st == 200 and body == b"OK", (st, body)
    st, _, body = T.request("GET", P.boot_port, "/route")
    assert st == 400 and b"Missing inputs" in body, (st, body)
    st, _, body = T.request("GET", P.boot_port, "/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                            "&target_tp_rank=-1")
    assert st == 400, (st, body)
    st, _, body = T.request("GET", P.boot_port, "/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                            "&target_tp_rank=-1&target_pp_rank=-1")
    topo = json.loads(body)
    assert st == 200 and topo["dp_size"] == 2 and topo["attn_tp_size"] == 1, topo
    assert topo["pp_size"] == 1 and topo["attn_cp_size"] == 1 and "prefill_dp_size" not in topo
    for rank in (0, 1):
        st, _, body = T.request("GET", P.boot_port, f"/route?prefill_dp_rank={rank}"
                                "&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
        info = json.loads(body)
        assert st == 200 and info == {"rank_ip": "127.0.0.1", "rank_port": P.kv_port}, info
    st, _, body = T.request("GET", P.boot_port, "/route?prefill_dp_rank=2&prefill_cp_rank=0"
                            "&target_tp_rank=0&target_pp_rank=0")
    assert st == 404, (st, body)
    P.stop()


def test_nixl_null_param_is_present():
    from pdlegs import Inst
    D = Inst("decode")
    base = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0],
            "remote_engine_id": "p", "remote_request_id": "x", "remote_host": "127.0.0.1",
            "remote_port": 1}
    for key in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port"):
        before = T.metric_value(D.metrics(), "sim_kv_invalid_params_total") or 0
        kvp = dict(base, **{key: None})
        st, _, raw = T.request("POST", D.port, "/v1/completions",
                               {"prompt": "null peer", "max_tokens": 2, "kv_transfer_params": kvp},
                               {"X-Request-Id": "null-" + key})
        assert st == 500 and key.encode() in raw, (key, st, raw)
        assert T.metric_value(D.metrics(), "sim_kv_invalid_params_total") == before, key
        rec = D.records("null-" + key)[0]
        assert rec["kv_result"]["recompute"] is False, rec
    # absent (not null) is still vLLM's invalid params: the prompt is computed here
    kvp = {k: v for k, v in base.items() if k != "remote_host"}
    st, _, raw = T.request("POST", D.port, "/v1/completions",
                           {"prompt": "no host", "max_tokens": 2, "kv_transfer_params": kvp})
    assert st == 200, raw
    D.stop()


if __name__ == "__main__":
    tests = [test_tpot_grows_with_batch, test_long_prompt_is_chunked,
             test_preemption_keeps_every_request_whole, test_speed_factors,
             test_per_request_timing_is_kept]
    if "--pd" in sys.argv:  # the PD roles need libkvt (CMakeLists.txt passes --pd with it)
        tests += [test_sglang_bootstrap_server, test_nixl_null_param_is_present]
    T.run(tests)
