"""pdgw end to end on 127.0.0.1 with ephemeral ports.

Real pdgw in front of pdgw-sim (the simulated engine) or of tiny Python upstreams that
record what happened to their connections: exact text through the gateway equals the
engine's own text (stream and not, completions and chat), a table of bad inputs with exact
status and error JSON, client disconnect closing the upstream within 1 s, SIGTERM drain,
retry on a refused instance, deadlines, and promtool on /metrics.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pdgwtest as T

MODEL = "sim-model"


def start_sim(extra=()):
    port = T.free_port()
    p = T.Proc("sim", [T.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                       "--ttft-ms", "5", "--tpot-ms", "2", "--max-tokens-default", "16",
                       *extra])
    T.wait_http(port, "/health", proc=p)
    return p, port


def start_gw(instances, extra=(), env=None, ready=True):
    port = T.free_port()
    argv = [T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--protocol", "neutral",
            "--workers", "2"]
    for url in instances:
        argv += ["--both", url]
    argv += list(extra)
    p = T.Proc("pdgw", argv, env=env)
    T.wait_http(port, "/health", proc=p)
    if ready:
        T.wait_http(port, "/ready", proc=p)
    return p, port


def stop_gw(gw):
    """SIGTERM and expect a clean exit 0 (under the sanitizer build this also fails on
    leaks or memory errors found at exit)."""
    gw.signal(signal.SIGTERM)
    rc = gw.wait(timeout=20)
    assert_eq(rc, 0, "pdgw exit status after SIGTERM")


def chat_body(stream, max_tokens=12, text="tell me about prefill and decode"):
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "stream": stream}


def comp_body(stream, max_tokens=12, text="the quick brown fox"):
    return {"model": MODEL, "prompt": text, "max_tokens": max_tokens, "stream": stream}


def plain_text(obj):
    ch = obj["choices"][0]
    if "text" in ch:
        return ch["text"]
    return ch["message"]["content"]


def assert_eq(a, b, what=""):
    if a != b:
        raise AssertionError(f"{what}: {a!r} != {b!r}")


def assert_error(status, body, want_status, want_type, want_param=None):
    assert_eq(status, want_status, "status")
    obj = json.loads(body)
    err = obj["error"]
    assert_eq(sorted(err.keys()), ["code", "message", "param", "type"], "error keys")
    assert_eq(err["type"], want_type, "error type")
    if want_param is not None:
        assert_eq(err["param"], want_param, "error param")
    assert isinstance(err["message"], str) and err["message"], "error message"
    return err


def metrics(port):
    status, _, body = T.request("GET", port, "/metrics")
    assert_eq(status, 200, "/metrics")
    return body.decode()


def wait_metrics(port, cond, timeout=10.0):
    """Scrape /metrics until cond(text) holds; return that text (or fail after timeout)."""
    deadline = time.time() + timeout
    while True:
        m = metrics(port)
        if cond(m):
            return m
        if time.time() >= deadline:
            raise AssertionError("metrics condition not met within %.1fs:\n%s" % (timeout, m))
        time.sleep(0.02)


# ---------------------------------------------------------------- tests


def test_text_matches_engine():
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"])
    for path, mk in (("/v1/chat/completions", chat_body), ("/v1/completions", comp_body)):
        # Non-stream: same text as asking the engine directly.
        s1, _, direct, _ = T.post_json(sport, path, mk(False))
        s2, hdrs, via, _ = T.post_json(gport, path, mk(False), headers={"X-Request-Id": "rid-1"})
        assert_eq((s1, s2), (200, 200), path)
        assert plain_text(direct), "engine produced text"
        assert_eq(plain_text(via), plain_text(direct), path + " text")
        assert_eq(hdrs.get("x-request-id"), "rid-1", "request id echoed")
        # Stream: same text, ends with [DONE].
        ev_direct = list(T.sse_events(sport, path, mk(True)))
        ev_via = list(T.sse_events(gport, path, mk(True)))
        assert_eq(ev_via[-1], "[DONE]", "stream ends with [DONE]")
        assert_eq(ev_via.count("[DONE]"), 1, "one [DONE]")
        assert_eq(T.stream_text(ev_via), T.stream_text(ev_direct), path + " stream text")
        assert_eq(T.stream_text(ev_via), plain_text(via), path + " stream == plain")
    # A generated request id is a UUID and is echoed.
    _, hdrs, _, _ = T.post_json(gport, "/v1/completions", comp_body(False))
    rid = hdrs.get("x-request-id", "")
    assert_eq(len(rid), 36, "generated request id")
    # /v1/models from the instance.
    status, _, body = T.request("GET", gport, "/v1/models")
    assert_eq(status, 200, "/v1/models")
    assert MODEL in [m["id"] for m in json.loads(body)["data"]]
    # A request is counted when its connection completes, which may be just after the
    # client read the last byte: wait for the counts instead of reading them once.
    m = wait_metrics(gport, lambda m: (T.metric_value(m, "pdgw_requests_total",
                                                      {"protocol": "neutral", "status": "200"})
                                       or 0) >= 6 and
                     T.metric_value(m, "pdgw_inflight_requests") == 0.0)
    assert_eq(T.metric_value(m, "pdgw_requests_total", {"protocol": "neutral", "status": "200"}),
              6.0, "requests counted")
    assert T.metric_value(m, "pdgw_ttft_seconds_count", {"protocol": "neutral"}) >= 2
    assert T.metric_value(m, "pdgw_tpot_seconds_count", {"protocol": "neutral"}) >= 2
    assert_eq(T.metric_value(m, "pdgw_inflight_requests"), 0.0, "inflight")
    stop_gw(gw)


def test_models_aggregated_or_configured():
    a, aport = start_sim()
    b, bport = start_sim(["--model", "other-model"])
    dead = T.free_port()
    gw, gport = start_gw([f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{bport}",
                          f"http://127.0.0.1:{dead}"], extra=["--health-interval", "1h"])
    status, _, body = T.request("GET", gport, "/v1/models")
    assert_eq(status, 200, "/v1/models")
    obj = json.loads(body)
    assert_eq(obj["object"], "list", "object")
    assert_eq(sorted(m["id"] for m in obj["data"]), ["other-model", MODEL], "union of models")
    stop_gw(gw)
    gw, gport = start_gw([f"http://127.0.0.1:{aport}"], extra=["--model", "served-a",
                                                               "--model", "served-b"])
    status, _, body = T.request("GET", gport, "/v1/models")
    assert_eq([m["id"] for m in json.loads(body)["data"]], ["served-a", "served-b"], "config")
    stop_gw(gw)


def test_plugin_forwarder_pd():
    """The ABI 3 out-of-tree plugin (tests/unit/forwarders/fwd_example_abi3.c) loaded with
    --plugin drives a prefill and a decode simulator; output equals one `both` engine's."""
    plugin = os.path.join(os.environ.get("PDGW_BUILD_DIR", os.path.dirname(T.BIN_DIR)),
                          "tests", "plugins", "fwd_example_ok.so")
    assert os.path.exists(plugin), plugin
    both, bport = start_sim()
    pport, dport, kvport = T.free_port(), T.free_port(), T.free_port()
    pre = T.Proc("sim-prefill", [T.binary("pdgw-sim"), "--role", "prefill", "--port", str(pport),
                                 "--kv-port", str(kvport), "--ttft-ms", "5", "--tpot-ms", "2"])
    dec = T.Proc("sim-decode", [T.binary("pdgw-sim"), "--role", "decode", "--port", str(dport),
                                "--ttft-ms", "5", "--tpot-ms", "2"])
    T.wait_http(pport, "/health", proc=pre)
    T.wait_http(dport, "/health", proc=dec)
    for mode in ("batch", "staged"):
        port = T.free_port()
        gw = T.Proc("pdgw", [T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--workers", "2",
                             "--plugin", plugin, "--protocol", "example-serial",
                             "--scheduling", mode, "--prefill", f"http://127.0.0.1:{pport}",
                             "--decode", f"http://127.0.0.1:{dport}"])
        T.wait_http(port, "/ready", proc=gw)
        for path, mk in (("/v1/completions", comp_body), ("/v1/chat/completions", chat_body)):
            s1, _, ref, _ = T.post_json(bport, path, mk(False))
            s2, _, via, _ = T.post_json(port, path, mk(False))
            assert_eq((s1, s2), (200, 200), f"{mode} {path}")
            assert_eq(plain_text(via), plain_text(ref), f"{mode} {path} PD text")
            events = list(T.sse_events(port, path, mk(True)))
            assert_eq(T.stream_text(events), plain_text(ref), f"{mode} {path} PD stream")
        stop_gw(gw)


def raw_exchange(port, data, timeout=10):
    """Send raw bytes, return (status, body bytes) of the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                hl = head.decode().lower()
                for line in hl.split("\r\n"):
                    if line.startswith("content-length:"):
                        n = int(line.split(":")[1])
                        if len(rest) >= n:
                            return int(head.split()[1]), rest[:n]
    head, _, rest = buf.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def test_bad_inputs_table():
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"], extra=["--api-key", "sk-test-1"])
    auth = {"Authorization": "Bearer sk-test-1"}
    cases = [
        # (method, path, body, headers, status, type, param)
        ("POST", "/v1/completions", comp_body(False), {}, 401, "authentication_error", None),
        ("POST", "/v1/completions", comp_body(False), {"Authorization": "Bearer nope"}, 401,
         "authentication_error", None),
        ("POST", "/v1/completions", comp_body(False), {"Authorization": "Basic abc"}, 401,
         "authentication_error", None),
        ("POST", "/v1/chat/completions", b'{"model": "x", "messages": [', auth, 400,
         "invalid_request_error", None),
        ("POST", "/v1/completions", b"not json at all", auth, 400, "invalid_request_error", None),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": 5}, auth, 400,
         "invalid_request_error", "prompt"),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, auth, 400,
         "invalid_request_error", "stream"),
        ("POST", "/v1/chat/completions", {"model": MODEL, "messages": "hi"}, auth, 400,
         "invalid_request_error", "messages"),
        ("POST", "/v1/completions", {"prompt": "x"}, auth, 400, "invalid_request_error",
         "model"),
        ("GET", "/admin/instances", None, {}, 401, "authentication_error", None),
        ("GET", "/v1/models", None, {"Authorization": "Bearer sk-wrong"}, 401,
         "authentication_error", None),
        # (other /v1/ paths go to an engine: the pass-through tests cover them)
        ("POST", "/nope", comp_body(False), auth, 404, "not_found_error", None),
        ("GET", "/v1/completions", None, auth, 405, "invalid_request_error", None),
        ("DELETE", "/v1/chat/completions", None, auth, 405, "invalid_request_error", None),
    ]
    for method, path, body, hdrs, st, typ, param in cases:
        status, rh, data = T.request(method, gport, path, body, hdrs)
        assert_error(status, data, st, typ, param)
        if st == 401:
            assert_eq(rh.get("www-authenticate"), "Bearer", "401 challenge")
    # 20 MiB body: refused from its Content-Length, before reading it.
    big = 20 * 1024 * 1024
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {big}\r\n\r\n").encode()
    status, body = raw_exchange(gport, head)
    assert_error(status, body, 413, "invalid_request_error")
    # 20 MiB chunked (no length): read, discarded, then refused.
    conn = http.client.HTTPConnection("127.0.0.1", gport, timeout=30)
    chunk = b"x" * (1024 * 1024)
    conn.request("POST", "/v1/completions", body=(chunk for _ in range(20)),
                 headers={**auth, "Content-Type": "application/json"}, encode_chunked=True)
    resp = conn.getresponse()
    assert_error(resp.status, resp.read(), 413, "invalid_request_error")
    conn.close()
    # /health and /ready stay open without a key; /metrics is open too.
    assert_eq(T.request("GET", gport, "/health")[0], 200, "/health")
    assert_eq(T.request("GET", gport, "/ready")[0], 200, "/ready")
    assert_eq(T.request("GET", gport, "/admin/instances", headers=auth)[0], 200, "admin w/ key")
    # Still serving correctly afterwards.
    status, _, obj, _ = T.post_json(gport, "/v1/completions", comp_body(False), headers=auth)
    assert_eq(status, 200, "valid request after bad ones")
    assert plain_text(obj)
    m = metrics(gport)
    assert T.metric_value(m, "pdgw_rejected_requests_total", {"reason": "auth"}) >= 3
    assert T.metric_value(m, "pdgw_rejected_requests_total", {"reason": "body_too_large"}) >= 2
    assert gw.alive(), "gateway still running"
    stop_gw(gw)


class SlowUpstream(T.RawServer):
    """An engine that streams one SSE event every `gap` seconds and records when the
    gateway closed the connection; optionally refuses to answer at all (never responds)."""

    def __init__(self, gap=0.05, events=400, die_after=None):
        self.gap = gap
        self.events = events
        self.die_after = die_after
        self.closed_at = None
        self.requests = 0
        self.listen(16)

    def _serve(self, c):
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        if head.startswith(b"GET"):
            body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            c.close()
            return
        n = 0
        for line in head.decode().split("\r\n"):
            if line.lower().startswith("content-length:"):
                n = int(line.split(":")[1])
        while len(rest) < n:
            rest += c.recv(65536)
        self.requests += 1
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        c.setblocking(False)
        try:
            for i in range(self.events):
                if self.die_after is not None and i == self.die_after:
                    c.close()  # the engine dies mid-stream (no terminating chunk)
                    return
                ev = b'data: {"choices":[{"index":0,"text":"t%d "}]}\n\n' % i
                c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
                deadline = time.time() + self.gap
                while time.time() < deadline:
                    try:
                        if c.recv(1) == b"":
                            raise ConnectionResetError
                    except BlockingIOError:
                        time.sleep(0.005)
            ev = b"data: [DONE]\n\n"
            c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))
        except (ConnectionResetError, BrokenPipeError, OSError):
            self.closed_at = time.time()
        finally:
            c.close()

    def close(self):
        self.sock.close()


def test_client_disconnect_closes_upstream():
    up = SlowUpstream()
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{up.port}"])
        conn = http.client.HTTPConnection("127.0.0.1", gport, timeout=10)
        conn.request("POST", "/v1/completions", body=json.dumps(comp_body(True, 1000)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert_eq(resp.status, 200, "stream status")
        first = resp.read1(4096)
        assert first.startswith(b"data: "), first
        left_at = time.time()
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = left_at + 3
        while up.closed_at is None and time.time() < deadline:
            time.sleep(0.01)
        assert up.closed_at is not None, "upstream connection not closed"
        took = up.closed_at - left_at
        assert took < 1.0, f"upstream closed after {took:.3f}s"
        # The disconnect is counted and the request no longer in flight (both change in
        # the request's final bookkeeping, on another worker than the scrape maybe: wait
        # for both).
        m = wait_metrics(gport, lambda m: T.metric_value(
            m, "pdgw_client_disconnects_total", {"protocol": "neutral"}) and
            T.metric_value(m, "pdgw_inflight_requests") == 0.0, timeout=5)
        assert_eq(T.metric_value(m, "pdgw_client_disconnects_total", {"protocol": "neutral"}),
                  1.0, "disconnect counted")
        assert_eq(T.metric_value(m, "pdgw_inflight_requests"), 0.0, "inflight")
        stop_gw(gw)
    finally:
        up.close()


def test_upstream_failure_after_first_byte():
    # The engine dies after two events: the client gets both, one error event, [DONE].
    up = SlowUpstream(gap=0.01, die_after=2)
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{up.port}"])
        events = list(T.sse_events(gport, "/v1/completions", comp_body(True, 100)))
        assert_eq(events[-1], "[DONE]", "ends with [DONE]")
        assert_eq(len(events), 4, f"events {events}")
        assert_eq(T.stream_text(events[:2]), "t0 t1 ", "relayed text")
        err = json.loads(events[2])["error"]
        assert_eq(sorted(err.keys()), ["code", "message", "param", "type"], "error keys")
        assert_eq(err["type"], "upstream_error", "error type")
        m = metrics(gport)
        assert T.metric_value(m, "pdgw_upstream_errors_total",
                              {"protocol": "neutral", "kind": "reset"}) >= 1
        stop_gw(gw)
    finally:
        up.close()
    # The engine stalls mid-stream: the idle timeout ends it the same way (504 kind).
    up = SlowUpstream(gap=30)
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{up.port}"], extra=["--idle-timeout", "300ms"])
        t0 = time.time()
        events = list(T.sse_events(gport, "/v1/completions", comp_body(True, 100)))
        assert time.time() - t0 < 3, "idle timeout applied"
        assert_eq(events[-1], "[DONE]", "ends with [DONE]")
        assert_eq(json.loads(events[0])["choices"][0]["text"], "t0 ", "first event relayed")
        err = json.loads(events[-2])["error"]
        assert_eq(err["type"], "timeout_error", "idle timeout error type")
        stop_gw(gw)
    finally:
        up.close()


def test_sigterm_drains_inflight_stream():
    sim, sport = start_sim(["--tpot-ms", "60"])
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"], extra=["--drain-timeout", "20s"])
    # Reference text straight from the engine.
    ref = T.stream_text(T.sse_events(sport, "/v1/completions", comp_body(True, 20)))
    # A keep-alive connection opened before the signal, to ask /ready while draining.
    probe = http.client.HTTPConnection("127.0.0.1", gport, timeout=10)
    probe.request("GET", "/ready")
    r = probe.getresponse()
    r.read()
    assert_eq(r.status, 200, "ready before")
    events = []
    gen = T.sse_events(gport, "/v1/completions", comp_body(True, 20))
    events.append(next(gen))
    t0 = time.time()
    gw.signal(signal.SIGTERM)
    time.sleep(0.2)
    probe.request("GET", "/ready")
    r = probe.getresponse()
    r.read()
    assert_eq(r.status, 503, "ready while draining")
    probe.close()
    for ev in gen:
        events.append(ev)
    assert_eq(events[-1], "[DONE]", "stream finished")
    assert_eq(T.stream_text(events), ref, "drained stream text")
    assert_eq(gw.wait(timeout=10), 0, "exit status")
    assert time.time() - t0 < 10


def test_retry_on_refused_instance_and_errors():
    sim, sport = start_sim()
    dead = T.free_port()  # nothing listens there: connections are refused
    gw, gport = start_gw([f"http://127.0.0.1:{dead}", f"http://127.0.0.1:{sport}"],
                         extra=["--decode-policy", "round-robin", "--breaker-failures", "100",
                                "--health-interval", "1h"])
    for i in range(6):
        status, _, obj, _ = T.post_json(gport, "/v1/completions", comp_body(False))
        assert_eq(status, 200, f"request {i}")
        events = list(T.sse_events(gport, "/v1/chat/completions", chat_body(True)))
        assert_eq(events[-1], "[DONE]", "stream through retry")
    m = metrics(gport)
    assert T.metric_value(m, "pdgw_retries_total", {"protocol": "neutral"}) >= 1
    assert T.metric_value(m, "pdgw_upstream_errors_total",
                          {"protocol": "neutral", "kind": "connect"}) >= 1
    stop_gw(gw)
    # Only refused instances: no retry can succeed -> 502 with an error body.
    dead2 = T.free_port()
    gw, gport = start_gw([f"http://127.0.0.1:{dead}", f"http://127.0.0.1:{dead2}"],
                         extra=["--health-interval", "1h"])
    status, _, data = T.request("POST", gport, "/v1/completions", comp_body(False))
    err = assert_error(status, data, 502, "upstream_error")
    try:
        list(T.sse_events(gport, "/v1/completions", comp_body(True)))
        raise AssertionError("stream should have failed")
    except T.HTTPError as e:
        assert e.status in (502, 503), e.status
        json.loads(e.body)["error"]
    stop_gw(gw)
    # No instance left at all (removed through the admin API): 503, and /ready says so.
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"])
    status, _, data = T.request("GET", gport, "/admin/instances")
    assert_eq(status, 200, "admin list")
    ids = [i["id"] for i in json.loads(data)]
    assert_eq(len(ids), 1, "one instance")
    assert_eq(T.request("POST", gport, f"/admin/instances/{ids[0]}/drain")[0], 200, "drain")
    assert_eq(T.request("GET", gport, "/ready")[0], 503, "/ready with the instance drained")
    status, _, data = T.request("POST", gport, "/v1/completions", comp_body(False))
    assert_error(status, data, 503, "service_unavailable_error")
    assert_eq(T.request("POST", gport, f"/admin/instances/{ids[0]}/undrain")[0], 200, "undrain")
    assert_eq(T.request("GET", gport, "/ready")[0], 200, "/ready again")
    assert_eq(T.request("DELETE", gport, f"/admin/instances/{ids[0]}")[0], 200, "remove")
    assert_eq(T.request("DELETE", gport, f"/admin/instances/{ids[0]}")[0], 404, "gone")
    status, _, data = T.request("POST", gport, "/v1/completions", comp_body(False))
    assert_error(status, data, 503, "service_unavailable_error")
    # Add it back through the API: served again.
    status, _, data = T.request("POST", gport, "/admin/instances",
                                {"url": f"http://127.0.0.1:{sport}", "role": "both"})
    assert_eq(status, 201, "admin add")
    status, _, obj, _ = T.post_json(gport, "/v1/completions", comp_body(False))
    assert_eq(status, 200, "served after re-adding")
    stop_gw(gw)


def test_request_deadline():
    sim, sport = start_sim(["--ttft-ms", "3000"])
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"])
    t0 = time.time()
    status, _, data = T.request("POST", gport, "/v1/completions", comp_body(False),
                                headers={"X-Request-Timeout": "0.4"})
    took = time.time() - t0
    assert_error(status, data, 504, "timeout_error")
    assert took < 2.0, took
    stop_gw(gw)


def test_metrics_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        raise AssertionError("promtool not installed (Debian package prometheus)")
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"])
    T.post_json(gport, "/v1/completions", comp_body(False))
    list(T.sse_events(gport, "/v1/completions", comp_body(True)))
    T.request("GET", gport, "/nope")
    text = metrics(gport)
    for name in ("pdgw_requests_total", "pdgw_request_duration_seconds", "pdgw_ttft_seconds",
                 "pdgw_tpot_seconds", "pdgw_inflight_requests", "pdgw_upstream_errors_total",
                 "pdgw_client_disconnects_total", "pdgw_retries_total"):
        assert f"# TYPE {name} " in text, name
    r = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_fd_shortage_is_not_the_instance_fault():
    """When pdgw itself runs out of descriptors, the client gets 503 + Retry-After, the
    shortage is counted as the gateway's own, and the healthy instance keeps its breaker
    closed and serves again once descriptors are free."""
    sim, sport = start_sim()
    port = T.free_port()
    limit = 40  # an idle single-worker pdgw holds ~15 descriptors
    argv = ["prlimit", f"--nofile={limit}:{limit}", "--", T.binary("pdgw"),
            "--listen", f"127.0.0.1:{port}", "--protocol", "neutral", "--workers", "1",
            "--both", f"http://127.0.0.1:{sport}", "--health-interval", "1h",
            "--metrics-scrape-interval", "1h", "--breaker-failures", "1",
            # lift the connection limit derived from the descriptor limit, which would
            # otherwise refuse the idle connections before the descriptors run out
            "--max-connections", "1000"]
    gw = T.Proc("pdgw", argv)
    T.wait_http(port, "/ready", proc=gw)
    body = json.dumps(comp_body(False)).encode()
    held = socket.create_connection(("127.0.0.1", port))
    held.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
    time.sleep(0.3)  # the held request is accepted before the descriptors run out
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(limit)]
    time.sleep(0.5)
    held.sendall(body[5:])
    held.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) == 0:
        chunk = held.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.decode().partition(":") for line in head.split(b"\r\n")[1:])}
    assert_eq(status, 503, "status while out of descriptors")
    assert_eq(headers.get("retry-after"), "1", "Retry-After")
    assert_eq(json.loads(payload)["error"]["type"], "service_unavailable_error", "error type")
    held.close()
    for c in idle:
        c.close()
    time.sleep(0.3)
    m = metrics(port)
    assert T.metric_value(m, "pdgw_local_resource_errors_total", {"kind": "fd"}) >= 1, m
    assert (T.metric_value(m, "pdgw_upstream_errors_total", {"kind": "connect"}) or 0) == 0
    status, _, obj, _ = T.post_json(port, "/v1/completions", comp_body(False))
    assert_eq(status, 200, "served again: the breaker did not open on the healthy instance")
    stop_gw(gw)


if __name__ == "__main__":
    T.run([
        test_text_matches_engine,
        test_models_aggregated_or_configured,
        test_plugin_forwarder_pd,
        test_bad_inputs_table,
        test_client_disconnect_closes_upstream,
        test_upstream_failure_after_first_byte,
        test_sigterm_drains_inflight_stream,
        test_retry_on_refused_instance_and_errors,
        test_request_deadline,
        test_metrics_pass_promtool,
        test_fd_shortage_is_not_the_instance_fault,
    ])
