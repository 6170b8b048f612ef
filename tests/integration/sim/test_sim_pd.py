"""pdgw-sim prefill/decode roles: every protocol of docs/protocols/ and
every KV mode it allows, real KV bytes through libkvt, verified on decode;
output equal to a `both` instance's; nothing left pinned or used; faults."""

import copy
import json
import threading
import time
import uuid

import pdgwtest as T
from pdlegs import (NIXL_PREFILL_KVP, Inst, Proxy, decode_leg, hardened, path_of, post,
                    run_kvt_batch, run_kvt_staged, run_lmcache, run_mooncake_parallel,
                    run_mooncake_serial, run_nixl, run_sglang, wait_idle)

PROMPT = ("Disaggregated serving splits the prompt phase from the token phase so that each "
          "runs on hardware sized for it, and the cache of keys and values moves between.")
COMPLETION = {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True}
CHAT_STREAM = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 9,
               "stream": True, "stream_options": {"include_usage": True}, "seed": 3,
               "temperature": 0.7}
KV_BYTES_PER_TOKEN = 1024  # the sim's default


def both_text(B, body, chat):
    b = dict(body, stream=False)
    b.pop("stream_options", None)
    st, _, obj, raw = T.post_json(B.port, path_of(chat), b)
    assert st == 200, raw
    ch = obj["choices"][0]
    return (ch["message"]["content"] if chat else ch["text"]), obj["usage"]["prompt_tokens"]


def check(P, D, B, runner, mode, body=COMPLETION, chat=False, **kw):
    rid = "r-" + uuid.uuid4().hex[:12]
    status, text, raw = runner(P, D, body, rid, chat, **kw)
    assert status == 200, (runner.__name__, status, raw)
    want, ntok = both_text(B, body, chat)
    assert text == want, (runner.__name__, mode, text, want)
    recs = [r for r in D.records(rid) if r["path"] == path_of(chat)]
    assert len(recs) == 1, recs
    res = recs[0].get("kv_result")
    assert res and res["ok"] and not res["recompute"], (runner.__name__, recs[0])
    assert res["verify_failures"] == 0, res
    if runner is run_lmcache:  # the sender chooses; the receiver only knows about delay
        sender = "push" if mode == "push" else "pull-eager"  # pull-delay is the receiver's
        assert P.records(rid)[0]["kv"]["mode"] == sender, P.records(rid)
        assert res["mode"] == ("pull-delay" if mode == "pull-delay" else "auto"), res
    else:
        assert res["mode"] == mode, res
    assert res["bytes"] == ntok * KV_BYTES_PER_TOKEN, (res, ntok)
    return rid


def test_default_modes():
    proxy = Proxy()
    P = Inst("prefill", "--proxy-host", "127.0.0.1", "--proxy-port", proxy.port)
    D = Inst("decode", alloc_ports=2)  # lmcache with TP 2
    B = Inst("both", name="both", kv=False)
    try:
        sent0 = D.metric("sim_kv_bytes_received_total")
        rid = check(P, D, B, run_nixl, "pull-eager")
        # what each leg received, as the forwarder conformance suite reads it
        prec = [r for r in P.records(rid)][0]
        assert prec["body"]["kv_transfer_params"] == NIXL_PREFILL_KVP
        assert prec["body"]["max_tokens"] == 1 and prec["body"]["stream"] is False
        assert prec["kv"]["kind"] == "hold"
        rkvp = prec["response_kv_transfer_params"]
        drec = D.records(rid)[0]
        assert drec["body"]["kv_transfer_params"] == rkvp
        assert drec["kv"] == {"side": "decode", "kind": "pull-params", "mode": "pull-eager",
                              "endpoint": f"tcp://127.0.0.1:{P.kv_port}",
                              "xfer": drec["kv"]["xfer"]}
        check(P, D, B, run_nixl, "pull-eager", CHAT_STREAM, chat=True)
        check(P, D, B, run_mooncake_serial, "pull-eager", CHAT_STREAM, chat=True)
        check(P, D, B, run_mooncake_parallel, "push")
        check(P, D, B, run_mooncake_parallel, "push", CHAT_STREAM, chat=True)
        rid = check(P, D, B, run_kvt_batch, "push")
        assert [r["path"] for r in P.records(rid)] == ["kvt:compute"]
        check(P, D, B, run_kvt_batch, "push", CHAT_STREAM, chat=True)
        check(P, D, B, run_kvt_staged, "pull-eager")
        check(P, D, B, run_kvt_staged, "pull-eager", CHAT_STREAM, chat=True)
        rid = check(P, D, B, run_sglang, "push")
        assert P.records(rid)[0]["kv"]["kind"] == "rendezvous"
        check(P, D, B, run_sglang, "push", CHAT_STREAM, chat=True)
        rid = check(P, D, B, run_lmcache, "push", proxy=proxy)
        assert D.records(rid)[0]["kv"]["kind"] == "lmcache-receive"
        check(P, D, B, run_lmcache, "push", CHAT_STREAM, chat=True, proxy=proxy)
        rid = check(P, D, B, run_lmcache, "push", proxy=proxy, decode_spec=True)
        assert D.records(rid)[0]["kv"]["req_id"] == rid
        assert D.metric("sim_kv_bytes_received_total") > sent0
        assert D.metric("sim_kv_verify_failures_total") == 0
        assert P.metric("sim_kv_transfers_total", {"result": "ok"}) >= 14
        wait_idle(P, D)
        # a decode leg whose KV is not on this receiver recomputes (LMCache's behaviour)
        st, text, _ = decode_leg(D, dict(COMPLETION, prompt="never prefilled"), "r-miss", False)
        assert st == 200 and text == both_text(B, dict(COMPLETION, prompt="never prefilled"),
                                               False)[0]
        assert D.records("r-miss")[0]["kv_result"]["recompute"] is True
        wait_idle(P, D)
        P.stop()
        D.stop()
    finally:
        proxy.close()


def test_pull_delay_and_lmcache_pull():
    proxy = Proxy()
    P = Inst("prefill", "--kv-mode", "pull-eager", "--proxy-host", "127.0.0.1",
             "--proxy-port", proxy.port)
    D = Inst("decode", "--kv-mode", "pull-delay")
    B = Inst("both", name="both", kv=False)
    try:
        check(P, D, B, run_nixl, "pull-delay")
        check(P, D, B, run_mooncake_serial, "pull-delay", CHAT_STREAM, chat=True)
        check(P, D, B, run_kvt_staged, "pull-delay", CHAT_STREAM, chat=True)
        check(P, D, B, run_lmcache, "pull-delay", proxy=proxy)
        wait_idle(P, D)
        D.stop()
        D2 = Inst("decode", name="decode2")
        check(P, D2, B, run_lmcache, "pull-eager", CHAT_STREAM, chat=True, proxy=proxy)
        wait_idle(P, D2)
        P.stop()
        D2.stop()
    finally:
        proxy.close()


def test_bad_pd_fields():
    P = Inst("prefill")
    D = Inst("decode")
    bad_prefill = [
        {"kv_transfer_params": "yes"},
        {"kv_transfer_params": {"do_remote_decode": "true"}},
        {"kv_transfer_params": {"disagg_spec": {"req_id": "x", "receiver_host": "h",
                                                "receiver_init_port": [1],
                                                "receiver_alloc_port": []}}},
        {"kv_transfer_params": {"do_remote_decode": True, "transfer_id": [1]}},
        {"bootstrap_room": 5, "bootstrap_host": "127.0.0.1"},
    ]
    for extra in bad_prefill:
        st, _, raw = T.request("POST", P.port, "/v1/completions", dict(COMPLETION, **extra))
        assert st == 400, (extra, st, raw)
        assert json.loads(raw)["error"]["code"] == 400
    base = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0],
            "remote_engine_id": P.engine_id, "remote_request_id": "x",
            "remote_host": "127.0.0.1", "remote_port": P.kv_port}
    # vLLM nixl/pull_scheduler.py update_state_after_alloc: params without non-empty
    # remote_block_ids, remote_engine_id, remote_request_id, remote_host or remote_port are
    # "invalid KVTransferParams": the decode warns and computes the prompt itself
    for drop in ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
                 "remote_port"):
        before = T.metric_value(D.metrics(), "sim_kv_invalid_params_total") or 0
        kvp = {k: v for k, v in base.items() if k != drop}
        st, _, raw = T.request("POST", D.port, "/v1/completions",
                               dict(COMPLETION, kv_transfer_params=kvp), {"X-Request-Id": "inv-" + drop})
        assert st == 200, (drop, raw)
        rec = D.records("inv-" + drop)[0]
        assert rec["kv_result"]["recompute"] and not rec["kv_result"]["ok"], rec
        assert rec["kv"]["invalid"] == drop, rec
        assert T.metric_value(D.metrics(), "sim_kv_invalid_params_total") == before + 1
    st, _, raw = T.request("POST", D.port, "/v1/completions",
                           dict(COMPLETION, kv_transfer_params=dict(base, remote_block_ids=[])))
    assert st == 200, raw
    st, _, raw = T.request("POST", D.port, "/v1/completions", dict(
        COMPLETION, kv_transfer_params={"do_remote_prefill": True, "transfer_id": "t",
                                        "remote_bootstrap_addr": "nonsense"}))
    assert st == 400, raw
    # params that name KV the prefill does not hold: clean error, nothing leaks
    st, _, raw = T.request("POST", D.port, "/v1/completions",
                           dict(COMPLETION, kv_transfer_params=base))
    assert st == 500 and "no KV held" in json.loads(raw)["error"]["message"], raw
    # remote_block_ids must be copied verbatim
    pb = hardened(COMPLETION)
    pb["kv_transfer_params"] = dict(NIXL_PREFILL_KVP)
    st, _, pobj, raw = post(P, pb, "r-blocks", False)
    kvp = dict(pobj["kv_transfer_params"], remote_block_ids=[999])
    st, _, raw = T.request("POST", D.port, "/v1/completions",
                           dict(COMPLETION, kv_transfer_params=kvp))
    assert st == 500 and "remote_block_ids" in raw.decode(), raw
    # ... and the held KV is still there for the right params
    st, text, _ = decode_leg(D, dict(COMPLETION, kv_transfer_params=pobj["kv_transfer_params"]),
                             "r-blocks", False)
    assert st == 200
    # A.1: an older vLLM's prefill whose only token is EOS returns no kv_transfer_params
    # (the current one returns them: test_sim_fidelity.py)
    E = Inst("prefill", "--eos-period", "1", "--nixl-stopped-prefill", "null", name="prefill-eos")
    b = dict(COMPLETION, max_tokens=1, ignore_eos=False,
             kv_transfer_params=dict(NIXL_PREFILL_KVP))
    st, _, obj, raw = post(E, b, "r-eos", False)
    assert st == 200 and obj["choices"][0]["finish_reason"] == "stop"
    assert obj["kv_transfer_params"] is None
    wait_idle(P, D, E)
    assert D.metric("sim_kv_ctl_bad_messages_total") == 0


def test_faults():
    B = Inst("both", name="both", kv=False)
    # decode never arrives: the held pages are freed by the timeout
    P = Inst("prefill", "--kv-hold-timeout-ms", 400)
    pb = hardened(COMPLETION)
    pb["kv_transfer_params"] = dict(NIXL_PREFILL_KVP)
    st, _, obj, raw = post(P, pb, "r-orphan", False)
    assert st == 200 and obj["kv_transfer_params"]["remote_block_ids"]
    assert P.metric("sim_kv_pages_pinned") > 0 and P.metric("vllm:kv_cache_usage_perc") > 0
    t0 = time.time()
    wait_idle(P, timeout=3)
    assert 0.2 < time.time() - t0 < 2.0
    assert P.metric("sim_kv_hold_timeouts_total") == 1
    assert P.metric("vllm:kv_cache_usage_perc") == 0
    P.stop()

    # corrupted KV is detected by the decode's byte check
    P = Inst("prefill", "--kv-corrupt-rate", 1, name="prefill-corrupt")
    D = Inst("decode")
    st, text, raw = run_nixl(P, D, COMPLETION, "r-corrupt")
    assert st == 500 and b"KV verification failed" in raw, raw
    assert D.metric("sim_kv_verify_failures_total") > 0
    assert P.metric("sim_kv_corruptions_injected_total") > 0
    assert D.records("r-corrupt")[0]["kv_result"]["ok"] is False
    wait_idle(P, D)
    P.stop()

    # the prefill dies mid-transfer: the decode fails within its deadline
    P = Inst("prefill", "--prefill-ms-per-token", 20, "--layers", 8, "--crash-after-ms", 300,
             name="prefill-crash")
    D = Inst("decode", "--kv-wait-timeout-ms", 1500, name="decode-deadline")
    t0 = time.time()
    st, text, raw = run_kvt_batch(P, D, COMPLETION, "r-crash")
    took = time.time() - t0
    assert st in (500, 502, 504), (st, raw)
    assert took < 1.5 + 1.0, took
    P.proc.wait(timeout=5)
    assert not P.proc.alive()
    assert D.metric("sim_kv_transfers_total", {"result": "failed"}) == 1
    wait_idle(D)
    # the decode still serves
    st, text, _ = decode_leg(D, COMPLETION, "r-after", False)
    assert st == 200 and text == both_text(B, COMPLETION, False)[0]
    D.stop()

    # sglang decode leg whose prefill never comes: counted as waiting, then 504
    P = Inst("prefill", name="prefill-idle")
    D = Inst("decode", "--kv-wait-timeout-ms", 800, name="decode-waits")
    b = dict(COMPLETION, bootstrap_host="127.0.0.1", bootstrap_port=P.boot_port,
             bootstrap_room=12345)
    out = []
    th = threading.Thread(target=lambda: out.append(decode_leg(D, b, "r-alone", False)))
    t0 = time.time()
    th.start()
    seen = False
    while th.is_alive() and not seen:
        text = D.metrics()
        seen = (T.metric_value(text, "vllm:num_requests_waiting") == 1 and
                T.metric_value(text, "vllm:num_requests_running") == 0)
        time.sleep(0.02)
    th.join()
    assert seen and out[0][0] == 504, out
    assert 0.7 < time.time() - t0 < 3.5
    wait_idle(P, D)
    P.stop()
    D.stop()


def test_layerwise_overlap():
    """A push protocol's TTFT at the decode: with layer-wise pushes the transfer
    hides behind the compute of later layers; --no-layerwise sends after the
    last layer. The link is modelled at 0.25 Gbit/s (--kv-link-gbps) so the
    transfer time dominates noise; the bytes still move through libkvt."""
    prompt = " ".join(f"t{i}" for i in range(1500))
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    # 1500 tokens x 8 KiB = 12 MB: 393 ms on the link, 49 ms per layer;
    # compute 20 + 1500 x 0.3 = 470 ms
    args = ["--kv-bytes-per-token", 8192, "--layers", 8, "--prefill-ms-per-token", 0.3,
            "--kv-link-gbps", 0.25, "--no-prefix-cache"]
    res = {}
    for name, extra in (("layerwise", []), ("no-layerwise", ["--no-layerwise"])):
        P = Inst("prefill", *args, *extra, name="prefill-" + name)
        D = Inst("decode", *args, name="decode-" + name)
        for i in range(2):  # best of two: the machine is shared
            rid = f"r-lw-{name}-{i}"
            t0 = time.time()
            st, text, raw = run_kvt_batch(P, D, dict(body, prompt=f"v{i} {prompt}"), rid)
            assert st == 200, raw
            took = time.time() - t0
            res[name] = min(res.get(name, took), took)
            assert D.records(rid)[0]["kv_result"]["bytes"] == 1501 * 8192
        wait_idle(P, D, timeout=10)
        P.proc.kill()
        D.proc.kill()
    print(f"TTFT layer-wise {res['layerwise'] * 1000:.0f} ms, "
          f"after the last layer {res['no-layerwise'] * 1000:.0f} ms", flush=True)
    # The modelled compute bounds TTFT from below in both modes. Whether layer-wise
    # pushes hide the transfer is a speed property: measured by the benchmarks, not
    # asserted here on a shared machine.
    assert res["layerwise"] > 0.47 and res["no-layerwise"] > 0.47, res


if __name__ == "__main__":
    T.run([test_default_modes, test_pull_delay_and_lmcache_pull, test_bad_pd_fields,
           test_faults, test_layerwise_overlap])
