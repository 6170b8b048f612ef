"""Admission control end to end: real pdgw (2 workers) in front of a slow pdgw-sim.

- max_concurrent_requests bounds what the engine holds at once (derived from the sim's own
  record of when each request arrived and was answered);
- waiters are served first come first served, and a more urgent priority overtakes: the
  body's `priority` as vLLM reads it (lower is served earlier; vllm/v1/core/sched/
  request_queue.py PriorityRequestQueue, vllm/entrypoints/openai/chat_completion/protocol.py)
  or the X-Priority header;
- a full queue (queue_size, SGLang's name: sgl-model-gateway/src/config/types.rs, a full
  queue is 429 in sgl-model-gateway/src/middleware.rs) and a wait past queue_timeout are 429
  with Retry-After and an OpenAI error body, each with its own code, counted by reason;
- a waiter whose client leaves frees its place at once (counted) and never reaches the engine;
- a token bucket per API key refuses a key over its rate while another key goes on;
- an instance's own capacity (`max_concurrent` in its config) is never exceeded: without a
  global limit the extra requests get 429 at once, with one they wait their turn;
- the slot is given back however a request ends: a stream the client leaves, a whole
  stream, a plain answer, an overloaded engine retried after backoff and failing again.
"""

import json
import signal
import os
import socket
import tempfile
import threading
import time

import pdgwtest as T
from test_gateway import assert_eq, comp_body, metrics, start_gw, stop_gw

SLOW_MS = 400  # the sim's TTFT for every request: admission decides, not the engine


def start_slow_sim(ttft_ms=SLOW_MS):
    port = T.free_port()
    p = T.Proc("sim", [T.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                       "--ttft-ms", str(ttft_ms), "--prefill-ms-per-token", "0", "--tpot-ms",
                       "1", "--max-tokens-default", "4"])
    T.wait_http(port, "/health", proc=p)
    return p, port


wait_for = T.wait_for


def metric(port, name, labels=None):
    return T.metric_value(metrics(port), name, labels) or 0.0


def queued(port, prio="normal"):
    return metric(port, "pdgw_admission_queue_depth", {"priority": prio})


def seen(port):
    """Requests admission has taken in so far: admitted (at once or after waiting) or
    waiting now. A grant lowers the depth before it counts the admission, so a scrape may
    undercount for a moment, never overcount."""
    text = metrics(port)
    v = lambda name, labels: T.metric_value(text, name, labels) or 0.0  # noqa: E731
    return (v("pdgw_admission_admitted_total", {"path": "direct"}) +
            v("pdgw_admission_admitted_total", {"path": "queued"}) +
            sum(v("pdgw_admission_queue_depth", {"priority": p})
                for p in ("high", "normal", "low")))


def sim_records(sport):
    _, _, body = T.request("GET", sport, "/sim/requests")
    return [r for r in json.loads(body)["requests"] if r.get("path") != "/health"]


def tag_of(rec):
    return rec.get("headers", {}).get("x-sim-tag")


class Client(threading.Thread):
    """One request in its own thread; result in .status / .headers / .body."""

    def __init__(self, port, tag, body=None, headers=None, timeout=60):
        super().__init__(daemon=True)
        self.port, self.tag, self.timeout = port, tag, timeout
        self.body = body or comp_body(False, max_tokens=4)
        self.headers = dict(headers or {})
        self.headers["X-Request-Id"] = tag
        self.status = None
        self.start()

    def run(self):
        try:
            self.status, self.headers_out, self.data = T.request(
                "POST", self.port, "/v1/completions", self.body, self.headers,
                timeout=self.timeout)
        except OSError as e:
            self.status = e


def max_overlap(recs):
    """Most requests the engine held at the same moment (arrival .. answer)."""
    events = []
    for r in recs:
        events.append((r["t_recv_us"], 1))
        events.append((r.get("t_done_us", 1 << 62), -1))
    events.sort(key=lambda e: (e[0], e[1]))
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def error_of(data):
    return json.loads(data)["error"]


# ---------------------------------------------------------------- tests


def test_at_most_n_at_the_engine_and_fifo():
    sim, sport = start_slow_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-concurrent-requests", "2", "--queue-size", "16"])
    clients = []
    for i in range(8):
        clients.append(Client(gport, f"fifo-{i}"))
        # The next one leaves only once pdgw has this one (admitted or queued), so the
        # arrival order is the order of the list.
        wait_for(lambda: seen(gport) >= i + 1, 10, f"request {i} at the gateway")
    for c in clients:
        c.join(60)
        assert_eq(c.status, 200, f"{c.tag} status")
    recs = [r for r in sim_records(sport) if (tag_of(r) or "").startswith("fifo-")]
    assert_eq(len(recs), 8, "requests that reached the engine")
    peak = max_overlap(recs)
    assert peak <= 2, f"the engine held {peak} requests at once (limit 2)"
    assert peak == 2, f"the limit was never reached ({peak}): the test proves nothing"
    order = [tag_of(r) for r in sorted(recs, key=lambda r: r["seq"])]
    # The first two were admitted at once; waiters leave the queue in arrival order, two
    # slots freeing together may reach the engine from two workers in either order (the
    # strict order is checked with one slot in the priority test).
    assert_eq(sorted(order[:2]), ["fifo-0", "fifo-1"], "admitted at once")
    for pos, tag in enumerate(order):
        i = int(tag.split("-")[1])
        assert abs(pos - i) <= 1, f"{tag} reached the engine at position {pos}: {order}"
    assert_eq(metric(gport, "pdgw_admission_admitted_total", {"path": "queued"}), 6.0,
              "admitted after waiting")
    assert metric(gport, "pdgw_admission_wait_seconds_count", {"outcome": "admitted"}) == 6
    assert_eq(metric(gport, "pdgw_admission_inflight"), 0.0, "slots after the burst")
    stop_gw(gw)


def test_priority_overtakes_the_queue():
    # The first request must still hold the only slot while five more are queued one by
    # one (each waited for): 1.5 s leaves room on a loaded machine.
    sim, sport = start_slow_sim(ttft_ms=1500)
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-concurrent-requests", "1", "--queue-size", "16"])
    first = Client(gport, "prio-first")
    wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 1, 10, "first admitted")
    plan = [("prio-a", None, None), ("prio-b", None, None),
            ("prio-c", -5, None),          # body priority, as vLLM reads it
            ("prio-d", None, "-10"),       # header for clients that cannot change bodies
            ("prio-e", 7, None)]           # less urgent than the default
    clients = []
    for n, (tag, body_prio, hdr) in enumerate(plan, start=1):
        body = comp_body(False, max_tokens=4)
        if body_prio is not None:
            body["priority"] = body_prio
        headers = {"X-Priority": hdr} if hdr else None
        clients.append(Client(gport, tag, body, headers))
        wait_for(lambda: sum(queued(gport, p) for p in ("high", "normal", "low")) >= n, 10,
                 f"{tag} queued")
    assert_eq(queued(gport, "high"), 2.0, "high-priority depth")
    assert_eq(queued(gport, "low"), 1.0, "low-priority depth")
    for c in [first] + clients:
        c.join(60)
        assert_eq(c.status, 200, f"{c.tag} status")
    order = [tag_of(r) for r in sorted(sim_records(sport), key=lambda r: r["seq"])
             if (tag_of(r) or "").startswith("prio-")]
    assert_eq(order, ["prio-first", "prio-d", "prio-c", "prio-a", "prio-b", "prio-e"],
              "engine order (lower priority value first, FIFO within one)")
    # The body's priority reaches the engine untouched (the engine may schedule by it too).
    body_c = next(r for r in sim_records(sport) if tag_of(r) == "prio-c")["body"]
    assert_eq(json.loads(body_c).get("priority") if isinstance(body_c, str)
              else body_c.get("priority"), -5, "priority forwarded")
    st, _, data = T.request("POST", gport, "/v1/completions",
                            dict(comp_body(False), priority="urgent"))
    assert_eq(st, 400, "non-integer priority")
    assert_eq(error_of(data)["param"], "priority", "param of the 400")
    stop_gw(gw)


def test_queue_timeout_and_queue_full_are_429():
    sim, sport = start_slow_sim(ttft_ms=2500)
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-concurrent-requests", "1", "--queue-size", "1",
                                "--queue-timeout", "600ms"])
    first = Client(gport, "to-first")
    wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 1, 10, "first admitted")
    waiter = Client(gport, "to-waiter")
    wait_for(lambda: queued(gport) == 1, 10, "waiter queued")
    # The queue (size 1) is full now: refused at once.
    st, hdrs, data = T.request("POST", gport, "/v1/completions", comp_body(False),
                               {"X-Request-Id": "to-full"})
    assert_eq(st, 429, "queue full status")
    assert_eq(error_of(data)["code"], "queue_full", "queue full code")
    assert error_of(data)["message"], "queue full message"
    assert int(hdrs["retry-after"]) >= 1, "Retry-After on queue full"
    waiter.join(30)
    assert_eq(waiter.status, 429, "queue timeout status")
    err = error_of(waiter.data)
    assert_eq(err["code"], "queue_timeout", "queue timeout code")
    assert_eq(err["type"], "rate_limit_error", "OpenAI type of a 429")
    assert int(waiter.headers_out["retry-after"]) >= 1, "Retry-After on queue timeout"
    first.join(30)
    assert_eq(first.status, 200, "the admitted request")
    assert_eq(metric(gport, "pdgw_admission_refused_total", {"reason": "queue_timeout"}), 1.0,
              "timeouts counted")
    assert_eq(metric(gport, "pdgw_admission_refused_total", {"reason": "queue_full"}), 1.0,
              "queue full counted")
    tags = [tag_of(r) for r in sim_records(sport)]
    assert "to-waiter" not in tags and "to-full" not in tags, f"refused reached the engine: {tags}"
    stop_gw(gw)


def test_cancelled_waiter_frees_its_place():
    sim, sport = start_slow_sim(ttft_ms=2500)
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-concurrent-requests", "1", "--queue-size", "1"])
    first = Client(gport, "cx-first")
    wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 1, 10, "first admitted")
    body = json.dumps(comp_body(False)).encode()
    s = socket.create_connection(("127.0.0.1", gport))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"X-Sim-Tag: cx-gone\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: queued(gport) == 1, 10, "waiter queued")
    s.close()
    wait_for(lambda: metric(gport, "pdgw_admission_cancelled_total") == 1, 10,
             "the cancelled waiter counted")
    assert_eq(queued(gport), 0.0, "its place freed while the first still runs")
    assert_eq(metric(gport, "pdgw_admission_inflight"), 1.0, "the first still holds its slot")
    # The place is free: the next request waits instead of being refused as queue_full.
    nxt = Client(gport, "cx-next")
    wait_for(lambda: queued(gport) == 1, 10, "next queued")
    for c in (first, nxt):
        c.join(30)
        assert_eq(c.status, 200, f"{c.tag} status")
    tags = [tag_of(r) for r in sim_records(sport)]
    assert "cx-gone" not in tags, "a cancelled waiter reached the engine"
    assert_eq(metric(gport, "pdgw_admission_refused_total", {"reason": "queue_full"}), 0.0,
              "nobody refused")
    assert_eq(metric(gport, "pdgw_admission_inflight"), 0.0, "no slot leaked")
    stop_gw(gw)


def test_rate_limit_per_key():
    sim, sport = start_slow_sim(ttft_ms=1)
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--api-key", "k-slow", "--api-key", "k-fast",
                                "--rate-limit", "0.2:2", "--rate-limit-key", "k-fast=1000:1000"])
    slow = {"Authorization": "Bearer k-slow"}
    fast = {"Authorization": "Bearer k-fast"}
    for i in range(2):  # the burst
        st, _, _ = T.request("POST", gport, "/v1/completions", comp_body(False), slow)
        assert_eq(st, 200, f"k-slow request {i} within its burst")
    st, hdrs, data = T.request("POST", gport, "/v1/completions", comp_body(False), slow)
    assert_eq(st, 429, "k-slow over its rate")
    assert_eq(error_of(data)["code"], "rate_limited", "rate limit code")
    # 0.2 requests per second: the next token is about 5 s away.
    assert 1 <= int(hdrs["retry-after"]) <= 5, f"Retry-After {hdrs['retry-after']}"
    for i in range(6):
        st, _, _ = T.request("POST", gport, "/v1/completions", comp_body(False), fast)
        assert_eq(st, 200, f"k-fast request {i} (its own bucket)")
    assert_eq(metric(gport, "pdgw_admission_refused_total", {"reason": "rate_limited"}), 1.0,
              "rate limited counted")
    stop_gw(gw)


def test_slot_released_however_the_request_ends():
    """One slot: after each kind of ending the next request is admitted at once."""
    sim, sport = start_slow_sim(ttft_ms=50)
    bad = T.free_port()
    badsim = T.Proc("sim-failing", [T.binary("pdgw-sim"), "--role", "both", "--port", str(bad),
                                    "--fail-rate", "1", "--fail-status", "503"])
    T.wait_http(bad, "/health", proc=badsim)
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-concurrent-requests", "1", "--queue-size", "0"])

    def free():
        wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 0, 10, "slot released")

    # a stream the client leaves after its first event
    body = comp_body(True, max_tokens=200)
    events = T.sse_events(gport, "/v1/completions", body)
    next(events)
    events.close()
    free()
    # success, stream and not
    assert_eq(len(list(T.sse_events(gport, "/v1/completions", comp_body(True)))) > 1, True,
              "a whole stream")
    free()
    st, _, _ = T.request("POST", gport, "/v1/completions", comp_body(False))
    assert_eq(st, 200, "plain answer")
    free()
    stop_gw(gw)
    # an engine overloaded (503): backed off, retried, failed again (one slot throughout)
    gw, gport = start_gw([f"http://127.0.0.1:{bad}"],
                         extra=["--max-concurrent-requests", "1", "--queue-size", "0",
                                "--retries", "1"])
    st, _, _ = T.request("POST", gport, "/v1/completions", comp_body(False))
    assert st >= 500, f"failing engine gave {st}"
    assert_eq(metric(gport, "pdgw_retries_total", {"protocol": "neutral"}), 1.0, "retried")
    free()
    st, _, _ = T.request("POST", gport, "/v1/completions", comp_body(False))
    assert st >= 500 and st != 429, f"second request refused by admission ({st}): a slot leaked"
    assert_eq(metric(gport, "pdgw_admission_refused_total", {"reason": "queue_full"}), 0.0,
              "never refused")
    stop_gw(gw)


def gw_with_capped_instance(sport, extra=()):
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f"instances:\n  - url: http://127.0.0.1:{sport}\n    role: both\n"
              f"    max_concurrent: 1\n")
    cfg.close()
    try:
        return start_gw([], extra=["--config", cfg.name, *extra])
    finally:
        os.unlink(cfg.name)


def test_instance_capacity():
    sim, sport = start_slow_sim(ttft_ms=1500)
    gw, gport = gw_with_capped_instance(sport)
    _, _, body = T.request("GET", gport, "/admin/instances")
    assert_eq(json.loads(body)[0]["max_concurrent"], 1, "capacity shown by the admin API")
    first = Client(gport, "cap-first")
    wait_for(lambda: len(sim_records(sport)) == 1, 10, "first at the engine")
    st, hdrs, data = T.request("POST", gport, "/v1/completions", comp_body(False),
                               {"X-Request-Id": "cap-second"})
    assert_eq(st, 429, "second request while the only instance is at capacity")
    assert "max_concurrent" in error_of(data)["message"], data
    assert int(hdrs["retry-after"]) >= 1, "Retry-After"
    first.join(30)
    assert_eq(first.status, 200, "first")
    assert "cap-second" not in [tag_of(r) for r in sim_records(sport)], "over capacity sent"
    stop_gw(gw)
    # With a global limit the extra requests wait instead.
    gw, gport = gw_with_capped_instance(sport, ["--max-concurrent-requests", "1"])
    clients = [Client(gport, f"capq-{i}") for i in range(3)]
    for c in clients:
        c.join(60)
        assert_eq(c.status, 200, f"{c.tag} status")
    recs = [r for r in sim_records(sport) if (tag_of(r) or "").startswith("capq-")]
    assert_eq(len(recs), 3, "all reached the engine")
    assert_eq(max_overlap(recs), 1, "one at a time")
    stop_gw(gw)


def test_limits_change_on_reload():
    """Admission limits are applied live by SIGHUP: with max_concurrent_requests 1 and no
    queue a second request is refused; after the file says 2 (and the reload is counted ok)
    two run at once, and the request already in flight keeps its slot throughout."""
    sim, sport = start_slow_sim(ttft_ms=2500)
    fd, path = tempfile.mkstemp(prefix="pdgw-admit-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write("max_concurrent_requests: 1\nqueue_size: 0\n")
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"], extra=["--config", path])
    try:
        first = Client(gport, "rl-first")
        wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 1, 10, "first admitted")
        st, _, data = T.request("POST", gport, "/v1/completions", comp_body(False),
                                {"X-Request-Id": "rl-refused"})
        assert_eq(st, 429, "over the limit before the reload")
        with open(path, "w") as f:
            f.write("max_concurrent_requests: 2\nqueue_size: 0\n")
        gw.signal(signal.SIGHUP)
        wait_for(lambda: metric(gport, "pdgw_config_reloads_total", {"result": "ok"}) == 1, 10,
                 "the reload")
        second = Client(gport, "rl-second")
        wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 2, 10,
                 "two admitted after the reload")
        first.join(30)
        second.join(30)
        assert_eq(first.status, 200, "the request in flight during the reload")
        assert_eq(second.status, 200, "the request the new limit admitted")
        stop_gw(gw)
    finally:
        gw.kill()
        os.unlink(path)


class PtClient(threading.Thread):
    """A pass-through request (vLLM's POST /tokenize) in its own thread."""

    def __init__(self, port, headers=None):
        super().__init__(daemon=True)
        self.port, self.headers, self.status = port, dict(headers or {}), None
        self.start()

    def run(self):
        try:
            self.status, self.headers_out, self.data = T.request(
                "POST", self.port, "/tokenize", {"prompt": "hello world"}, self.headers,
                timeout=60)
        except OSError as e:
            self.status = e


def test_passthrough_admitted_like_chat():
    """A pass-through request (here /tokenize) takes a slot like chat: with one slot it waits
    behind a chat request and reaches the engine only after that one was answered; with the
    queue full it gets 429 queue_full at once; a waiter that leaves frees its place; and an
    instance's own max_concurrent holds for it too (429, never sent)."""
    sim, sport = start_slow_sim(ttft_ms=1500)
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-concurrent-requests", "1", "--queue-size", "1"])
    chat = Client(gport, "ptq-chat")
    wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 1, 10, "chat admitted")
    # a waiter that leaves: its place is freed at once, it never reaches the engine
    body = b'{"prompt": "gone"}'
    s = socket.create_connection(("127.0.0.1", gport))
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: queued(gport) == 1, 10, "pass-through waiter queued")
    s.close()
    wait_for(lambda: metric(gport, "pdgw_admission_cancelled_total") == 1, 10,
             "the cancelled pass-through counted")
    assert_eq(queued(gport), 0.0, "its place freed while the chat still runs")
    pt = PtClient(gport)
    wait_for(lambda: queued(gport) == 1, 10, "pass-through queued behind the chat")
    # /tokenize is answered at once by the engine: unanswered while the chat (1.5 s) still
    # holds the only slot means it waits for admission, not for the engine.
    assert chat.status is None, "the chat ended early"
    assert_eq(pt.status, None, "pass-through answered while the chat held the only slot")
    st, hdrs, data = T.request("POST", gport, "/tokenize", {"prompt": "one too many"})
    assert_eq(st, 429, "pass-through with the queue full")
    assert_eq(error_of(data)["code"], "queue_full", "code")
    assert int(hdrs["retry-after"]) >= 1, "Retry-After"
    chat.join(30)
    pt.join(30)
    assert_eq(chat.status, 200, "chat")
    assert_eq(pt.status, 200, "queued pass-through")
    assert "tokens" in json.loads(pt.data), pt.data
    assert_eq(metric(gport, "pdgw_admission_admitted_total", {"path": "queued"}), 1.0,
              "admitted from the queue")
    assert_eq(metric(gport, "pdgw_admission_refused_total", {"reason": "queue_full"}), 1.0,
              "refusal counted")
    wait_for(lambda: metric(gport, "pdgw_admission_inflight") == 0, 10, "no slot leaked")
    stop_gw(gw)
    # An instance at its own max_concurrent: a pass-through is refused like chat.
    gw, gport = gw_with_capped_instance(sport)
    first = Client(gport, "ptcap-first")
    wait_for(lambda: any(tag_of(r) == "ptcap-first" for r in sim_records(sport)), 10,
             "chat at the engine")
    st, hdrs, data = T.request("POST", gport, "/tokenize", {"prompt": "over capacity"})
    assert_eq(st, 429, "pass-through while the only instance is at capacity")
    assert "max_concurrent" in error_of(data)["message"], data
    assert int(hdrs["retry-after"]) >= 1, "Retry-After"
    first.join(30)
    assert_eq(first.status, 200, "chat")
    st, _, _ = T.request("POST", gport, "/tokenize", {"prompt": "capacity free again"})
    assert_eq(st, 200, "pass-through once the instance is free")
    stop_gw(gw)


if __name__ == "__main__":
    T.run([
        test_at_most_n_at_the_engine_and_fifo,
        test_priority_overtakes_the_queue,
        test_queue_timeout_and_queue_full_are_429,
        test_cancelled_waiter_frees_its_place,
        test_rate_limit_per_key,
        test_instance_capacity,
        test_slot_released_however_the_request_ends,
        test_limits_change_on_reload,
        test_passthrough_admitted_like_chat,
    ])
