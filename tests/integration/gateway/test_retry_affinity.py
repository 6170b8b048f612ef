"""Retries with backoff on an overloaded engine, and sticky sessions; real pdgw on loopback.

- An engine answering 429 or 503 with Retry-After (what an overloaded engine or the load
  balancer in front of it says) is retried before the first byte, after waiting at least
  what Retry-After asked, on the same instance when it is the only one, and the client gets
  the 200; a Retry-After beyond the request's deadline is not waited for: the client gets
  the engine's 429 at once. pdgw-sim does not answer overload (vLLM itself sends no
  Retry-After), so a small Python engine plays that part.
- session_affinity header:X-Session-Id: every request of a session reaches the same
  pdgw-sim while it is up; when it goes down only its sessions move (to one other instance
  each, again the same for every request), the others stay; moves are counted.
"""

import json
import signal
import threading
import time

import pdgwtest as T
from test_gateway import assert_eq, comp_body, metrics, start_gw, start_sim, stop_gw

MODEL = "sim-model"


class OverloadedEngine(T.RawServer):
    """Answers the first `refusals` completions with (status, Retry-After) in turn, then
    200s; records when each completion arrived."""

    def __init__(self, refusals):
        self.refusals = list(refusals)
        self.arrivals = []
        self.lock = threading.Lock()
        self.listen(16)

    def _serve(self, c):
        f = c.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            method = line.split(b" ")[0]
            length = 0
            while True:
                h = f.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode().partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if length:
                f.read(length)
            if method == b"GET":
                body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                status, extra = 200, b""
            else:
                with self.lock:
                    self.arrivals.append(time.monotonic())
                    refusal = self.refusals.pop(0) if self.refusals else None
                if refusal:
                    status, ra = refusal
                    extra = b"Retry-After: %d\r\n" % ra
                    body = json.dumps({"error": {"message": "overloaded", "type": "overloaded",
                                                 "code": status}}).encode()
                else:
                    status, extra = 200, b""
                    body = json.dumps({"id": "cmpl-1", "object": "text_completion",
                                       "model": MODEL,
                                       "choices": [{"index": 0, "text": "fine",
                                                    "finish_reason": "stop"}],
                                       "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                 "total_tokens": 4}}).encode()
            reason = {200: b"OK", 429: b"Too Many Requests", 503: b"Service Unavailable"}
            c.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%s"
                      b"Content-Length: %d\r\n\r\n%s" % (status, reason[status], extra,
                                                         len(body), body))


def metric(port, name, labels=None):
    return T.metric_value(metrics(port), name, labels) or 0.0


def test_backoff_honours_retry_after_then_succeeds():
    eng = OverloadedEngine([(429, 1), (503, 1)])
    gw, gport = start_gw([f"http://127.0.0.1:{eng.port}"],
                         extra=["--retries", "3", "--retry-backoff-base", "20ms",
                                "--retry-backoff-max", "200ms"])
    st, _, data = T.request("POST", gport, "/v1/completions", comp_body(False))
    assert_eq(st, 200, f"status after two overload answers: {data!r}")
    assert_eq(json.loads(data)["choices"][0]["text"], "fine", "the engine's answer")
    assert_eq(len(eng.arrivals), 3, "attempts that reached the only engine")
    for i in (1, 2):
        gap = eng.arrivals[i] - eng.arrivals[i - 1]
        assert gap >= 0.95, f"attempt {i + 1} came {gap:.3f}s after a Retry-After of 1 s"
    assert_eq(metric(gport, "pdgw_retries_total", {"protocol": "neutral"}), 2.0, "retries")
    stop_gw(gw)


def test_retry_after_past_the_deadline_is_not_waited_for():
    eng = OverloadedEngine([(429, 30)])
    gw, gport = start_gw([f"http://127.0.0.1:{eng.port}"], extra=["--retries", "3"])
    t0 = time.monotonic()
    st, hdrs, data = T.request("POST", gport, "/v1/completions", comp_body(False),
                               {"X-Request-Timeout": "3s"})
    took = time.monotonic() - t0
    assert_eq(st, 429, "the engine's verdict, relayed")
    assert_eq(hdrs.get("retry-after"), "30", "the engine's Retry-After, relayed")
    assert took < 2.5, f"waited {took:.2f}s for a retry that could not fit the deadline"
    assert_eq(len(eng.arrivals), 1, "no second attempt")
    stop_gw(gw)


def served_by(sims):
    """tag -> index of the sim that answered it."""
    out = {}
    for i, (_, sport) in enumerate(sims):
        _, _, body = T.request("GET", sport, "/sim/requests")
        for r in json.loads(body)["requests"]:
            tag = r.get("headers", {}).get("x-sim-tag")
            if tag:
                out[tag] = i
    return out


def send_sessions(gport, sessions, rounds, prefix):
    for r in range(rounds):
        for s in sessions:
            st, _, _ = T.request("POST", gport, "/v1/completions", comp_body(False, max_tokens=2),
                                 {"X-Session-Id": s, "X-Request-Id": f"{prefix}-{s}-{r}"})
            assert_eq(st, 200, f"{prefix} session {s} round {r}")


def test_sticky_sessions_stay_and_move_when_down():
    sims = [start_sim() for _ in range(3)]
    gw, gport = start_gw([f"http://127.0.0.1:{p}" for _, p in sims],
                         extra=["--session-affinity", "header:X-Session-Id",
                                "--health-interval", "500ms", "--health-timeout", "500ms",
                                "--prefill-policy", "round-robin",
                                "--decode-policy", "round-robin"])
    sessions = [f"s{i}" for i in range(12)]
    send_sessions(gport, sessions, 3, "a")
    by = served_by(sims)
    home = {}
    for s in sessions:
        where = {by[f"a-{s}-{r}"] for r in range(3)}
        assert_eq(len(where), 1, f"session {s} served by {where}")
        home[s] = where.pop()
    assert len(set(home.values())) >= 2, f"all sessions on one instance: {home}"
    assert_eq(metric(gport, "pdgw_session_affinity_total", {"role": "decode", "result": "moved"}),
              0.0, "nothing moved while every instance was up")
    # Take down the instance with the most sessions.
    victim = max(range(3), key=lambda i: sum(1 for s in sessions if home[s] == i))
    moved_sessions = [s for s in sessions if home[s] == victim]
    sims[victim][0].signal(signal.SIGKILL)
    sims[victim][0].wait(10)
    deadline = time.time() + 15
    while time.time() < deadline:
        _, _, body = T.request("GET", gport, "/admin/instances")
        states = {i["url"]: i["state"] for i in json.loads(body)}
        if states.get(f"http://127.0.0.1:{sims[victim][1]}") != "up":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the killed instance never left the up state")
    send_sessions(gport, sessions, 3, "b")
    by = served_by([s for i, s in enumerate(sims) if i != victim])
    alive = [i for i in range(3) if i != victim]
    for s in sessions:
        where = {alive[by[f"b-{s}-{r}"]] for r in range(3)}
        assert_eq(len(where), 1, f"session {s} after the failure served by {where}")
        now = where.pop()
        if s in moved_sessions:
            assert now != victim
        else:
            assert_eq(now, home[s], f"session {s} stayed on its instance")
    assert metric(gport, "pdgw_session_affinity_total",
                  {"role": "decode", "result": "moved"}) >= 3 * len(moved_sessions), \
        "moves counted"
    stop_gw(gw)


if __name__ == "__main__":
    T.run([
        test_backoff_honours_retry_after_then_succeeds,
        test_retry_after_past_the_deadline_is_not_waited_for,
        test_sticky_sessions_stay_and_move_when_down,
    ])
