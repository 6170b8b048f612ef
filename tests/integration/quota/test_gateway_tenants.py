# ctest-timeout: 300
"""Tenants through the gateway: budgets shared by two pdgw replicas on a real redis-server,
token budgets reconciled with the engines' usage, the store lost and back, fair shares under
a flood, bad input.

Wire facts (not pdgw's):
- OpenAI's rate-limit headers are x-ratelimit-limit-requests, x-ratelimit-limit-tokens,
  x-ratelimit-remaining-requests, x-ratelimit-remaining-tokens, x-ratelimit-reset-requests,
  x-ratelimit-reset-tokens (OpenAI API reference, "Rate limits" guide); a refusal is 429 with
  error code rate_limited / tokens_exhausted and a Retry-After.
- vLLM reports usage.prompt_tokens_details.cached_tokens only when started with
  --enable-prompt-tokens-details and the count is non-zero (vllm/entrypoints/openai/
  serving_chat.py and serving_completion.py: `if self.enable_prompt_tokens_details and
  num_cached_tokens`); a stream carries usage only with stream_options.include_usage, in a
  last chunk whose choices are empty (the same files: `if include_usage: ... choices=[]`).
"""

import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import pdgwtest as t  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import quotadrive as qd  # noqa: E402

t.skip_unless_tools("redis-server", why="the quota store tests need a real Redis")

MODEL = "sim-model"


def sim(*flags):
    port = t.free_port()
    p = t.Proc(f"sim{port}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                              *[str(f) for f in flags]])
    t.wait_http(port, "/health", proc=p)
    return port


def gateway(sim_port, yaml_text, name="pdgw"):
    port = t.free_port()
    f = tempfile.NamedTemporaryFile("w", prefix="pdgwtest-tenants-", suffix=".yaml",
                                    delete=False)
    f.write(f"listen: 127.0.0.1:{port}\nprotocol: neutral\naccess_log: false\n"
            f"instances:\n  - {{id: e1, url: \"http://127.0.0.1:{sim_port}\", role: both}}\n"
            + yaml_text)
    f.close()
    p = t.Proc(name, [t.binary("pdgw"), "--config", f.name])
    t.wait_http(port, "/health", proc=p)
    return port, p


def complete(port, key, max_tokens=2, prompt="hello", extra=None):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    body.update(extra or {})
    return t.post_json(port, "/v1/completions", body,
                       headers={"Authorization": f"Bearer {key}"} if key else None)


def usage(port, key, query=""):
    st, _, body = t.request("GET", port, "/admin/usage" + query,
                            headers={"Authorization": f"Bearer {key}"})
    assert st == 200, (st, body)
    return json.loads(body)


def ideal_admitted(times, budget, per_s):
    """What one token bucket of <budget> refilled at <per_s>/s admits of requests at <times>."""
    level, last, n = float(budget), times[0], 0
    for at in times:
        level = min(budget, level + (at - last) * per_s)
        last = at
        if level >= 1:
            level -= 1
            n += 1
    return n


def test_two_replicas_enforce_one_budget():
    r = qd.Redis()
    s = sim("--zero-delay")
    tenants = ("tenants:\n  - {name: acme, api_keys: [k-acme], requests_per_minute: 100}\n"
               f"quota_store: {r.url}\nquota:\n  expected_replicas: 2\n"
               "  lease_fraction: \"0.01\"\n  sync_interval: 20ms\n")
    a, _ = gateway(s, tenants, "pdgw-a")
    b, _ = gateway(s, tenants, "pdgw-b")
    qd.wait_for(lambda: all(t.metric_value(t.request("GET", p, "/metrics")[2].decode(),
                                           "pdgw_quota_store_connected") == 1 for p in (a, b)),
                10, "both replicas connected to the store")
    times, ok = [], 0
    # 8 requests a second per replica for 9 s: past the budget of 100 within ~6 s, and slow
    # enough that every lease top-up keeps up (admission never waits for the store).
    start = time.time()
    for i in range(144):
        at = start + i / 16.0
        time.sleep(max(0.0, at - time.time()))
        times.append(time.time())
        st, hdrs, body, raw = complete(a if i % 2 == 0 else b, "k-acme")
        if st == 200:
            ok += 1
        else:
            assert st == 429 and body["error"]["code"] == "rate_limited", (st, raw)
            assert int(hdrs["retry-after"]) >= 1
            assert hdrs["x-ratelimit-limit-requests"] == "100"
    want = ideal_admitted(times, 100, 100 / 60.0)
    print(f"admitted {ok} of {len(times)}; one bucket would admit {want}")
    assert abs(ok - want) <= 2, (ok, want)


def test_token_budget_reconciles_with_usage():
    s = sim("--enable-prompt-tokens-details", "--tpot-ms", "1", "--ttft-ms", "1")
    g, _ = gateway(s, "tenants:\n  - {name: t1, api_keys: [k1], tokens_per_minute: 100000}\n"
                      "quota:\n  output_estimate: 64\n")
    prompt = "the same long prompt that repeats " * 20  # several KV blocks: cached next time
    seen = {"prompt": 0, "completion": 0, "cached": 0}
    for i in range(3):
        st, hdrs, body, raw = complete(g, "k1", max_tokens=7, prompt=prompt)
        assert st == 200, raw
        u = body["usage"]
        seen["prompt"] += u["prompt_tokens"]
        seen["completion"] += u["completion_tokens"]
        seen["cached"] += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        assert hdrs["x-ratelimit-limit-tokens"] == "100000"
    assert seen["cached"] > 0, "the sim reported no cached tokens on repeats"
    # A stream whose client did not ask for usage: its usage is asked for, and kept from it.
    events = list(t.sse_events(g, "/v1/completions", {"model": MODEL, "prompt": "stream me",
                                                      "max_tokens": 5, "stream": True},
                               headers={"Authorization": "Bearer k1"}))
    assert events[-1] == "[DONE]"
    assert not any('"usage"' in e and '"choices":[]' in e for e in events), events
    seen["prompt"] += 2  # "stream me": the sim's whitespace tokenizer
    seen["completion"] += 5
    # ... and one that asked gets it.
    events = list(t.sse_events(g, "/v1/completions",
                               {"model": MODEL, "prompt": "stream me", "max_tokens": 4,
                                "stream": True, "stream_options": {"include_usage": True}},
                               headers={"Authorization": "Bearer k1"}))
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4, events[-2]
    seen["prompt"] += last["usage"]["prompt_tokens"]
    seen["completion"] += 4
    tot = usage(g, "k1")["tenants"]["t1"]["total"]
    assert tot["requests"] == 5, tot
    # computed on the prefill = prompt - cached; the engines' own counts, not the estimates
    assert tot["prompt_tokens"] + tot["cached_prompt_tokens"] == seen["prompt"], (tot, seen)
    assert tot["cached_prompt_tokens"] == seen["cached"], (tot, seen)
    assert tot["completion_tokens"] == seen["completion"], (tot, seen)
    # the budget was charged the real counts: remaining = limit - what the engines reported
    _, hdrs, _, _ = complete(g, "k1", max_tokens=1, prompt="x")
    left = int(hdrs["x-ratelimit-remaining-tokens"])
    spent = seen["prompt"] + seen["completion"]
    # the request itself is charged its estimate (1 prompt + 1 output) when headers are made;
    # what refilled meanwhile (100000/min) is at most a few hundred tokens
    assert 100000 - spent - 2 <= left <= 100000 - spent + 400, (left, spent)
    m = t.request("GET", g, "/metrics")[2].decode()
    assert t.metric_value(m, "pdgw_quota_completion_tokens_total",
                          {"tenant": "t1"}) == seen["completion"] + 1


def test_token_budget_refuses_when_exhausted():
    s = sim("--zero-delay")
    g, _ = gateway(s, "tenants:\n  - {name: small, api_keys: [ks], tokens_per_minute: 30}\n")
    codes = []
    for _ in range(6):
        st, hdrs, body, raw = complete(g, "ks", max_tokens=8, prompt="a b c d")
        codes.append(st)
        if st == 429:
            assert body["error"]["code"] == "tokens_exhausted", raw
            assert int(hdrs["retry-after"]) >= 1 and "x-ratelimit-reset-tokens" in hdrs
    assert 200 in codes and 429 in codes, codes


def test_store_lost_and_back():
    r = qd.Redis()
    s = sim("--zero-delay")
    g, p = gateway(s, "tenants:\n  - {name: acme, api_keys: [k], requests_per_second: 1000}\n"
                      f"quota_store: {r.url}\nquota:\n  timeout: 100ms\n")
    metric = lambda: t.metric_value(t.request("GET", g, "/metrics")[2].decode(),
                                    "pdgw_quota_store_connected")
    qd.wait_for(lambda: metric() == 1, 10, "connected")
    r.kill()
    qd.wait_for(lambda: metric() == 0, 10, "the loss noticed")
    t0 = time.time()
    for _ in range(20):  # fail open: served on local limits, never waiting on the store
        st, _, _, raw = complete(g, "k")
        assert st == 200, raw
    assert time.time() - t0 < 5
    r.start()
    qd.wait_for(lambda: metric() == 1, 15, "reconnected")
    out = p.output()
    assert out.count("unreachable") == 1, out[-3000:]
    assert "back" in out, out[-3000:]


def test_store_down_fail_closed():
    r = qd.Redis()
    s = sim("--zero-delay")
    g, _ = gateway(s, "tenants:\n  - {name: acme, api_keys: [k]}\n"
                      f"quota_store: {r.url}\nquota:\n  fail_mode: closed\n  timeout: 100ms\n")
    qd.wait_for(lambda: complete(g, "k")[0] == 200, 10, "served while the store is up")
    r.stop()  # hangs: accepts, never answers
    qd.wait_for(lambda: complete(g, "k")[0] == 503, 10, "refused while it hangs")
    st, _, body, _ = complete(g, "k")
    assert body["error"]["code"] == "quota_store_unavailable", body
    r.cont()
    qd.wait_for(lambda: complete(g, "k")[0] == 200, 15, "served again")


def test_flooding_tenant_does_not_starve_another():
    s = sim("--ttft-ms", "5", "--tpot-ms", "20")
    g, _ = gateway(s, "max_concurrent_requests: 2\nqueue_timeout: 60s\n"
                      "tenants:\n  - {name: flood, api_keys: [ka], weight: 1}\n"
                      "  - {name: polite, api_keys: [kb], weight: 1}\n")
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            complete(g, "ka", max_tokens=10)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(12)]
    for th in threads:
        th.start()
    time.sleep(0.5)  # the flood's backlog builds up: 12 clients for 2 slots
    lat = []
    try:
        for _ in range(5):
            t0 = time.time()
            st, _, _, raw = complete(g, "kb", max_tokens=10)
            lat.append(time.time() - t0)
            assert st == 200, raw
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    # one request takes ~0.2 s; FIFO behind 12 waiters would be ~1.2 s; a fair share is at
    # most one flood request ahead per slot
    print("polite latencies", [round(x, 3) for x in lat])
    assert max(lat) < 0.9, lat
    u = usage(g, "kb", "?tenant=polite")["tenants"]["polite"]["total"]
    assert u["requests"] == 5 and u["phase_seconds"]["queue"] < 3, u


def test_slo_deadline_orders_a_tenants_waiters():
    """admission_order: slo_deadline with tenants: a tenant's queued requests get its turns by
    arrival + TTFT target (llm-d's SLO deadline ordering), those without a target last; without
    the order they would go first come first served (B before C)."""
    s = sim("--ttft-ms", "400", "--tpot-ms", "1")
    g, _ = gateway(s, "max_concurrent_requests: 1\nqueue_timeout: 60s\n"
                      "admission_order: slo_deadline\n"
                      "tenants:\n  - {name: a, api_keys: [ka]}\n")
    done, lock = [], threading.Lock()

    def send(name, ttft_ms):
        extra = {"x-llm-d-slo-ttft-ms": str(ttft_ms)} if ttft_ms else {}
        st, _, _, raw = t.post_json(g, "/v1/completions",
                                    {"model": MODEL, "prompt": name, "max_tokens": 1},
                                    headers={"Authorization": "Bearer ka", **extra}, timeout=60)
        with lock:
            done.append((name, st))

    def queued():  # admitted + waiting
        m = t.request("GET", g, "/metrics")[2].decode()
        return sum(t.metric_value(m, f, {"tenant": "a"}) or 0
                   for f in ("pdgw_quota_inflight", "pdgw_quota_waiting"))

    threads = []
    for i, (name, ttft) in enumerate([("A", 0), ("B", 60000), ("C", 30000), ("D", 0)]):
        th = threading.Thread(target=send, args=(name, ttft), daemon=True)
        th.start()
        threads.append(th)
        # A holds the one slot; each later one is queued before the next is sent
        qd.wait_for(lambda: queued() >= i + 1, 10, f"{name} in")
    for th in threads:
        th.join(60)
    assert [x[1] for x in done] == [200] * 4, done
    assert [x[0] for x in done] == ["A", "C", "B", "D"], done


def test_reload_applies_limits_and_keys():
    """SIGHUP / POST /admin/reload applies a tenant's new budget (what was spent stays spent)
    and a key added to it (it counts against that tenant, not as "other"); tenants added and
    removed apply live; an invalid tenant refuses the reload."""
    s = sim("--zero-delay")
    port = t.free_port()
    f = tempfile.NamedTemporaryFile("w", prefix="pdgwtest-tenants-", suffix=".yaml",
                                    delete=False)
    base = (f"listen: 127.0.0.1:{port}\nprotocol: neutral\naccess_log: false\n"
            f"instances:\n  - {{id: e1, url: \"http://127.0.0.1:{s}\", role: both}}\n")

    def write(tenants):
        with open(f.name, "w") as out:
            out.write(base + "tenants:\n" + tenants)

    def reload():
        st, _, body, raw = t.post_json(port, "/admin/reload", {},
                                       headers={"Authorization": "Bearer ka"})
        return st, body, raw

    f.close()
    write("  - {name: a, api_keys: [ka], requests_per_minute: 3}\n"
          "  - {name: b, api_keys: [kb]}\n")
    p = t.Proc("pdgw-reload", [t.binary("pdgw"), "--config", f.name])
    t.wait_http(port, "/health", proc=p)
    assert [complete(port, "ka")[0] for _ in range(4)] == [200, 200, 200, 429]
    assert complete(port, "ka2")[0] == 401  # not a key yet

    write("  - {name: a, api_keys: [ka, ka2], requests_per_minute: 6}\n"
          "  - {name: b, api_keys: [kb]}\n")
    st, body, raw = reload()
    assert st == 200 and body["result"] == "ok" and "tenants" in body["applied"], raw
    # 3 of the 6 are spent: 3 more, whichever of a's keys asks; then both are refused
    codes = [complete(port, k)[0] for k in ("ka", "ka2", "ka", "ka2")]
    assert codes == [200, 200, 200, 429], codes
    st, hdrs, _, raw = complete(port, "ka")
    assert st == 429 and hdrs["x-ratelimit-limit-requests"] == "6", (st, hdrs, raw)
    assert complete(port, "kb")[0] == 200

    # a tenant added and one removed by the same reload: the new one is served on its own
    # budget at once, the removed one's key stops working, the others keep what they spent
    assert complete(port, "kc")[0] == 401
    write("  - {name: a, api_keys: [ka, ka2], requests_per_minute: 6}\n"
          "  - {name: c, api_keys: [kc], requests_per_minute: 2}\n")
    st, body, raw = reload()
    assert st == 200 and body["result"] == "ok" and "tenants" in body["applied"], raw
    assert 'added "c", removed "b"' in p.output(), p.output()[-2000:]
    assert [complete(port, "kc")[0] for _ in range(3)] == [200, 200, 429]
    assert complete(port, "kb")[0] == 401
    assert complete(port, "ka")[1]["x-ratelimit-limit-requests"] == "6"
    u = usage(port, "ka")
    assert u["tenants"]["b"]["removed"] is True, u
    assert u["tenants"]["c"]["total"]["requests"] == 2 and "removed" not in u["tenants"]["c"], u

    # b comes back: its key works again
    write("  - {name: a, api_keys: [ka, ka2], requests_per_minute: 6}\n"
          "  - {name: b, api_keys: [kb]}\n  - {name: c, api_keys: [kc], requests_per_minute: 2}\n")
    st, body, raw = reload()
    assert st == 200 and body["result"] == "ok", raw
    assert 'back "b"' in p.output(), p.output()[-2000:]
    assert complete(port, "kb")[0] == 200

    write("  - {name: a, api_keys: [ka], requests_per_minute: 6, weight: -1}\n"
          "  - {name: b, api_keys: [kb]}\n")
    st, body, raw = reload()
    assert st == 400 and "weight" in body["error"]["message"], raw
    assert complete(port, "kb")[0] == 200
    p.kill()
    os.unlink(f.name)


def test_bad_input():
    s = sim("--zero-delay")
    keys = tempfile.NamedTemporaryFile("w", delete=False, suffix=".keys")
    keys.write("k1 nosuch\n")
    keys.close()
    port = t.free_port()
    for text, says in [
        ("tenants:\n  - {name: a, wieght: 2}\n", "tenants[0].wieght: unknown key"),
        ("tenants:\n  - {name: a}\n  - {name: b, requests_per_minute: -1}\n",
         "tenants[1].requests_per_minute"),
        (f"api_key_file: {keys.name}\ntenants:\n  - {{name: a}}\n", "tenant 'nosuch'"),
        ("quota_store: redis://127.0.0.1:1/0\n", "no tenants are configured"),
        ("tenants: [{name: a}]\nquota_store: rediss://127.0.0.1:1/0\n"
         "quota: {tls_ca_file: /nonexistent/ca.pem}\n", "/nonexistent/ca.pem"),
        ("tenants: [{name: a}]\nquota_store: redis://127.0.0.1:1/0\n"
         "quota: {tls_ca_file: /nonexistent/ca.pem}\n", "TLS needs rediss://"),
        ("tenants: [{name: a}]\nquota: {tls_server_name: redis.internal}\n",
         "quota.tls_server_name is set but quota_store is not"),
    ]:
        f = tempfile.NamedTemporaryFile("w", delete=False, suffix=".yaml")
        f.write(f"listen: 127.0.0.1:{port}\nprotocol: neutral\ninstances:\n"
                f"  - {{id: e1, url: \"http://127.0.0.1:{s}\", role: both}}\n" + text)
        f.close()
        p = t.Proc("check", [t.binary("pdgw"), "--check-config", f.name])
        assert p.wait(10) != 0
        assert says in p.output(), (says, p.output())
    # settings that would do nothing are accepted, and said so
    for text, says in [
        (f"kv_bytes_per_token: {{{MODEL}: 100}}\n", "without `tenants:` it has no effect"),
    ]:
        f = tempfile.NamedTemporaryFile("w", delete=False, suffix=".yaml")
        f.write(f"listen: 127.0.0.1:{port}\nprotocol: neutral\ninstances:\n"
                f"  - {{id: e1, url: \"http://127.0.0.1:{s}\", role: both}}\n" + text)
        f.close()
        p = t.Proc("check", [t.binary("pdgw"), "--check-config", f.name])
        assert p.wait(10) == 0, p.output()
        assert says in p.output(), (says, p.output())
    # A "store" that answers garbage: the gateway serves on local limits and says so.
    class Junk(t.RawServer):
        def _serve(self, conn):
            try:
                conn.recv(4096)
                conn.sendall(b"%%%garbage\r\n")
            finally:
                conn.close()

    junk = Junk()
    junk.listen()
    g, proc = gateway(s, "tenants:\n  - {name: a, api_keys: [k]}\n"
                         f"quota_store: redis://127.0.0.1:{junk.port}/0\n"
                         "quota:\n  timeout: 100ms\n")
    t0 = time.time()
    st, _, _, raw = complete(g, "k")
    assert st == 200 and time.time() - t0 < 2, raw
    qd.wait_for(lambda: "unreachable" in proc.output(), 10, "the bad store reported")


def test_pd_kv_bytes_by_tenant():
    """A PD fleet (vllm-nixl: a prefill and a decode sim): with kv_bytes_per_token for the
    model, each tenant's usage counts the KV of its requests' prompts (the engines' own
    prompt_tokens times the figure), on /admin/usage and /metrics."""
    pp, dp, kvp, boot = t.free_port(), t.free_port(), t.free_port(), t.free_port()
    pre = t.Proc("sim-prefill", [t.binary("pdgw-sim"), "--role", "prefill", "--port", str(pp),
                                 "--engine-id", "e-pre", "--kv-port", str(kvp),
                                 "--bootstrap-port", str(boot)])
    dec = t.Proc("sim-decode", [t.binary("pdgw-sim"), "--role", "decode", "--port", str(dp),
                                "--engine-id", "e-dec"])
    t.wait_http(pp, "/health", proc=pre)
    t.wait_http(dp, "/health", proc=dec)
    port = t.free_port()
    f = tempfile.NamedTemporaryFile("w", prefix="pdgwtest-tenants-", suffix=".yaml",
                                    delete=False)
    f.write(f"listen: 127.0.0.1:{port}\nprotocol: vllm-nixl\naccess_log: false\n"
            "instances:\n"
            f"  - {{id: p0, url: \"http://127.0.0.1:{pp}\", role: prefill, engine_id: e-pre,"
            f" kv_port: {kvp}, bootstrap_port: {boot}}}\n"
            f"  - {{id: d0, url: \"http://127.0.0.1:{dp}\", role: decode, engine_id: e-dec}}\n"
            "tenants:\n  - {name: team, api_keys: [kt]}\n"
            f"kv_bytes_per_token: {{{MODEL}: 1000}}\n")
    f.close()
    gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", f.name])
    t.wait_http(port, "/health", proc=gw)
    prompts = 0
    for i in range(3):
        st, _, body, raw = complete(port, "kt", max_tokens=3, prompt="one two three " * (i + 1))
        assert st == 200, raw
        prompts += body["usage"]["prompt_tokens"]
    tot = usage(port, "kt")["tenants"]["team"]["total"]
    assert tot["kv_bytes"] == prompts * 1000, (tot, prompts)
    m = t.request("GET", port, "/metrics")[2].decode()
    assert t.metric_value(m, "pdgw_quota_kv_bytes_total", {"tenant": "team"}) == prompts * 1000
    gw.kill()
    os.unlink(f.name)


if __name__ == "__main__":
    t.run([test_two_replicas_enforce_one_budget, test_token_budget_reconciles_with_usage,
           test_token_budget_refuses_when_exhausted, test_store_lost_and_back,
           test_store_down_fail_closed, test_flooding_tenant_does_not_starve_another,
           test_slo_deadline_orders_a_tenants_waiters, test_reload_applies_limits_and_keys,
           test_bad_input, test_pd_kv_bytes_by_tenant])
