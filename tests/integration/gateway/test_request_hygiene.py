"""Request hygiene, end to end (real pdgw in front of a recording engine on this host):

- Paths: an escaped CR LF cannot smuggle a second request to the engine (400), nor change
  what the next client on the pooled upstream connection gets; "%2F.." and a raw "..", an
  escaped space are refused; "%2F" and "%3F" reach the engine as they came; a path longer
  than the routing buffer gets 414 and is never cut and forwarded.
- Credentials before the body: an unauthenticated request with `Expect: 100-continue` gets
  401 without a 100 Continue, and thirty unauthenticated 16 MiB bodies leave the gateway's
  RSS flat; request bodies held at once are bounded (max_buffered_body_bytes: 503 with
  Retry-After).
- Deadlines: X-Request-Timeout cannot extend request_timeout.
- Headers: a repeated Authorization or a Host with white space is 400; the response headers
  an engine names in its Connection header are dropped on pass-through (RFC 9110 7.6.1).
- An engine's 204 to a stream request is an upstream error (502), not 200 and [DONE].
- Options: metrics_need_key puts /metrics behind the API keys; admin_trust_loopback: false
  refuses admin writes from loopback peers without the admin key.

Run for both front ends (PDGW_FRONTEND=mhd in the environment picks libmicrohttpd).
"""

import json
import socket
import threading
import time

import pdgwtest as T

MODEL = "sim-model"
KEY = "k-hygiene"


class RecordingEngine(T.RawServer):
    """An OpenAI-style engine that records every request line it reads, on every
    connection, and answers each with a body that names the line (keep-alive)."""

    def __init__(self):
        self.lines = []
        self.lock = threading.Lock()
        self.listen()

    def seen(self):
        with self.lock:
            return list(self.lines)

    def _serve(self, conn):
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                with self.lock:
                    self.lines.append(lines[0].decode("latin-1"))
                length = 0
                for h in lines[1:]:
                    k, _, v = h.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                target = lines[0].split(b" ")[1].decode("latin-1")
                if target == "/v1/chat/completions":  # an engine with nothing to say
                    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                    continue
                if target.startswith("/health"):
                    body = b'{"status":"ok"}'
                elif target.startswith("/v1/models"):
                    body = json.dumps({"object": "list", "data": [
                        {"id": MODEL, "object": "model"}]}).encode()
                else:
                    body = json.dumps({"line": lines[0].decode("latin-1")}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Connection: X-Hop, keep-alive\r\nX-Hop: secret\r\n"
                             b"X-Kept: yes\r\nContent-Length: " + str(len(body)).encode() +
                             b"\r\n\r\n" + body)


def start_gw(engine_port, extra=()):
    port = T.free_port()
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--workers", "1",
                         "--both", f"http://127.0.0.1:{engine_port}", *extra])
    T.wait_http(port, "/ready", proc=gw)
    return gw, port


def raw(port, data, timeout=10.0, read_all=True):
    """Send <data> on a new connection; what came back until the peer closed (or timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
            if not read_all and b"\r\n\r\n" in out:
                break
        return out
    finally:
        s.close()


def status_of(resp):
    return int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/") else None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_paths():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port)
    # A pass-through request first, so that a pooled upstream connection exists.
    status, _, data = T.request("GET", port, "/v1/files/first")
    assert status == 200, (status, data)
    before = eng.seen()

    smuggle = (b"POST /v1/x%20HTTP/1.1%0d%0aHost:%20x%0d%0aContent-Length:%200%0d%0a%0d%0a"
               b"POST%20/v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
               b"\r\nContent-Length: 2\r\n\r\n{}")
    bad = [
        (smuggle, 400),
        (b"GET /v1/a%2F..%2Fadmin HTTP/1.1\r\nHost: gw\r\n\r\n", 400),
        (b"GET /v1/../admin/reload HTTP/1.1\r\nHost: gw\r\n\r\n", 400),
        (b"GET /v1/a%20b HTTP/1.1\r\nHost: gw\r\n\r\n", 400),
        (b"GET /v1/" + b"a" * 300 + b" HTTP/1.1\r\nHost: gw\r\n\r\n", 414),
    ]
    for req, want in bad:
        resp = raw(port, req)
        assert status_of(resp) == want, (req[:60], resp[:300])
    # Nothing of those reached the engine, and the next client gets its own answer.
    status, _, data = T.request("GET", port, "/v1/files/second")
    assert status == 200, (status, data)
    assert json.loads(data)["line"] == "GET /v1/files/second HTTP/1.1", data
    probes = ("GET /health ", "GET /v1/models ", "GET /metrics ")  # the gateway's own
    after = [line for line in eng.seen()[len(before):] if not line.startswith(probes)]
    assert after == ["GET /v1/files/second HTTP/1.1"], after

    # Escapes that change a path's meaning reach the engine as they came.
    status, _, data = T.request("GET", port, "/v1/files/a%2Fb%3Fc?x=%2F")
    assert status == 200, (status, data)
    assert json.loads(data)["line"] == "GET /v1/files/a%2Fb%3Fc?x=%2F HTTP/1.1", data
    status, _, data = T.request("GET", port, "/v1/files/%61%22")
    assert json.loads(data)["line"] == "GET /v1/files/a%22 HTTP/1.1", data
    # The refusals are counted (the native front end refuses escaped control bytes while
    # parsing the head, counted with the malformed heads; the ".." paths go by the request).
    status, _, data = T.request("GET", port, "/metrics")
    text = data.decode()
    assert T.metric_value(text, "pdgw_rejected_requests_total", {"reason": "bad_path"}) >= 2
    assert T.metric_value(text, "pdgw_rejected_requests_total", {"reason": "uri_too_long"}) == 1


def test_auth_before_body():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port, ["--api-key", KEY])
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            b"Content-Type: application/json\r\nContent-Length: 16777216\r\n")
    # With Expect: the 401 comes first, and no 100 Continue before it.
    resp = raw(port, head + b"Expect: 100-continue\r\n\r\n", read_all=False)
    assert resp.startswith(b"HTTP/1.1 401"), resp[:200]
    # Bodies sent anyway are not held: thirty 16 MiB uploads leave RSS flat.
    rss0 = rss_kib(gw.pid)
    chunk = b"x" * (1 << 20)
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(head + b"\r\n")
        try:
            for _ in range(16):
                s.sendall(chunk)
        except OSError:
            pass  # the gateway answered and closed: the rest is not read
        s.settimeout(10)
        try:
            got = s.recv(4096)
        except OSError:
            got = b""
        s.close()
        assert got == b"" or got.startswith(b"HTTP/1.1 401"), got[:200]
    grown = rss_kib(gw.pid) - rss0
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB"
    # A repeated Authorization is refused, not read as one of its values.
    resp = raw(port, b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " +
               KEY.encode() + b"\r\nAuthorization: Bearer other\r\n\r\n", read_all=False)
    assert status_of(resp) == 400 and b"Authorization" in resp, resp[:300]
    resp = raw(port, b"GET /v1/models HTTP/1.1\r\nHost: g w\r\nAuthorization: Bearer " +
               KEY.encode() + b"\r\n\r\n", read_all=False)
    assert status_of(resp) == 400 and b"Host" in resp, resp[:300]
    # A request without a body keeps its connection after a 401.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n")
    first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 401"), first[:200]
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\n\r\n")
    second = s.recv(65536)
    s.close()
    assert second.startswith(b"HTTP/1.1 200"), second[:200]


def test_body_budget():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port, ["--max-buffered-body-bytes", "1MiB"])
    head = (b"POST /v1/files/up HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: 800000\r\n\r\n")
    holder = socket.create_connection(("127.0.0.1", port), timeout=10)
    holder.sendall(head + b"x" * 1000)  # holds 800,000 bytes of the budget, unfinished
    # The gateway has read the first request's head once a request behind it is refused.
    deadline = time.time() + 10
    while True:
        resp = raw(port, head, read_all=False)
        if status_of(resp) == 503 or time.time() > deadline:
            break
    assert status_of(resp) == 503, resp[:300]
    assert b"Retry-After" in resp.split(b"\r\n\r\n")[0], resp[:300]
    assert b"body_budget_exhausted" in resp, resp[:300]
    holder.sendall(b"x" * (800000 - 1000))
    holder.settimeout(10)
    got = holder.recv(65536)
    holder.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    # The budget came back: the same request passes now.
    status, _, _ = T.request("POST", port, "/v1/files/up", body=b"x" * 800000)
    assert status == 200, status


def test_request_timeout_is_a_ceiling():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port, ["--request-timeout", "3s", "--client-header-timeout", "0"])
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"POST /v1/files/slow HTTP/1.1\r\nHost: gw\r\nX-Request-Timeout: 3600\r\n"
              b"Content-Length: 100\r\n\r\nx")
    start = time.time()
    got = b""
    try:
        while True:  # a trickled body the request deadline ends, not the header
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    took = time.time() - start
    s.close()
    assert took < 10, f"still open after {took:.1f}s (X-Request-Timeout extended the deadline)"
    assert took > 2, f"cut after {took:.1f}s, before request_timeout"
    # A shorter X-Request-Timeout still shortens it.
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"POST /v1/files/slow HTTP/1.1\r\nHost: gw\r\nX-Request-Timeout: 1\r\n"
              b"Content-Length: 100\r\n\r\nx")
    start = time.time()
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass
    s.close()
    assert time.time() - start < 2.5, time.time() - start


def test_connection_named_headers_dropped():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port)
    status, hdrs, data = T.request("GET", port, "/v1/files/x")
    assert status == 200, (status, data)
    assert hdrs.get("x-kept") == "yes", hdrs
    assert "x-hop" not in hdrs, hdrs


def test_no_content_to_a_stream_is_an_error():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port, ["--retries", "0"])
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    status, _, data = T.request("POST", port, "/v1/chat/completions", body=body)
    assert status == 502, (status, data)
    assert b"no content" in data and b"[DONE]" not in data, data


def test_metrics_key_and_loopback_admin():
    eng = RecordingEngine()
    gw, port = start_gw(eng.port, ["--api-key", KEY, "--metrics-need-key",
                                   "--no-admin-trust-loopback"])
    status, _, _ = T.request("GET", port, "/metrics")
    assert status == 401, status
    status, _, _ = T.request("GET", port, "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, status
    status, _, _ = T.request("GET", port, "/health")
    assert status == 200, status
    body = {"id": "x1", "url": "http://127.0.0.1:9", "role": "both"}
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _, data = T.request("POST", port, "/admin/instances", body=body, headers=auth)
    assert status == 403, (status, data)
    gw.kill()
    # By default /metrics needs no key and loopback admin writes are accepted.
    gw, port = start_gw(eng.port, ["--api-key", KEY])
    status, _, _ = T.request("GET", port, "/metrics")
    assert status == 200, status
    status, _, data = T.request("POST", port, "/admin/instances", body=body, headers=auth)
    assert status in (200, 201), (status, data)


if __name__ == "__main__":
    T.run([test_paths, test_auth_before_body, test_body_budget, test_request_timeout_is_a_ceiling,
           test_connection_named_headers_dropped, test_no_content_to_a_stream_is_an_error,
           test_metrics_key_and_loopback_admin])
