"""pdgw's native HTTP/1.1 upstream client (upstream_client: native, the default) against a
scripted engine on a raw socket, end to end:
- sequential requests share one kept-alive connection, and the request carries what pdgw
  sends today (Host, X-Request-Id, Content-Type, Content-Length, Accept, the client's own
  headers; no Expect);
- an engine that closes every connection after answering (without saying so) costs no error;
- malformed responses (conflicting lengths, folded headers, a bad chunk, a cut body) give the
  client a 502 and count pdgw_upstream_errors_total{kind="reset"}, as libcurl's errors do,
  and the next good request is served.
Framing rules: RFC 9112 sections 5.2 (obs-fold), 6.3 (message body length), 7.1 (chunked).
"""

import http.client
import json
import os
import sys
import threading
import time

import pdgwtest as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gateway import MODEL, assert_eq, comp_body, metrics, start_gw, stop_gw  # noqa: E402

ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                     "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 4, "completion_tokens": 1,
                               "total_tokens": 5}}).encode()
GOOD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(ANSWER), ANSWER))


class ScriptedEngine(T.RawServer):
    """Answers GETs (health, models) and closes; answers each POST with self.reply (bytes),
    keeping the connection unless self.close_after; records POST heads and how many
    connections carried POSTs."""

    def __init__(self):
        self.reply = GOOD
        self.close_after = False
        self.heads = []
        self.post_conns = 0
        self.lock = threading.Lock()
        self.listen(64)

    def _serve(self, c):
        buf = b""
        counted = False
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, buf = buf.partition(b"\r\n\r\n")
                if head.startswith(b"GET"):
                    body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                              % (len(body), body))
                    return
                n = 0
                for line in head.decode().split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        n = int(line.split(":")[1])
                while len(buf) < n:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                buf = buf[n:]
                with self.lock:
                    self.heads.append(head.decode())
                    if not counted:
                        self.post_conns += 1
                        counted = True
                    reply, close_after = self.reply, self.close_after
                c.sendall(reply)
                if close_after:
                    return
        except OSError:
            return
        finally:
            c.close()

    def close(self):
        self.sock.close()


def post(port, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = json.dumps(body)
    conn.request("POST", "/v1/completions", body=data, headers=h)
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out, len(data)


def header(head, name):
    for line in head.split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == name.lower():
            return v.strip()
    return None


def resets(port):
    return T.metric_value(metrics(port), "pdgw_upstream_errors_total", {"kind": "reset"}) or 0.0


def test_keepalive_and_request_headers():
    eng = ScriptedEngine()
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{eng.port}"], extra=["--workers", "1"])
        for i in range(5):
            (status, body), sent = post(gport, comp_body(False), {"X-Client-Tag": f"t{i}"})
            assert_eq(status, 200, f"request {i}")
            assert_eq(json.loads(body)["choices"][0]["text"], "hi", "relayed answer")
        with eng.lock:
            heads, conns = list(eng.heads), eng.post_conns
        assert_eq(len(heads), 5, "requests the engine saw")
        assert_eq(conns, 1, "connections that carried them (kept alive)")
        h = heads[-1]
        assert h.startswith("POST /v1/completions HTTP/1.1\r\n"), h
        assert_eq(header(h, "Host"), f"127.0.0.1:{eng.port}", "Host")
        assert_eq(header(h, "Content-Type"), "application/json", "Content-Type")
        assert_eq(header(h, "Accept"), "*/*", "Accept")
        assert_eq(header(h, "X-Client-Tag"), "t4", "the client's own header")
        assert_eq(header(h, "Expect"), None, "no Expect: 100-continue")
        assert_eq(header(h, "Transfer-Encoding"), None, "not chunked")
        rid = header(h, "X-Request-Id")
        assert rid and len(rid) == 36 and rid.count("-") == 4, rid
        assert int(header(h, "Content-Length")) > 0, h
        stop_gw(gw)
    finally:
        eng.close()


def test_engine_closing_kept_connections():
    eng = ScriptedEngine()
    eng.close_after = True
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{eng.port}"], extra=["--workers", "1"])
        before = resets(gport)
        for i in range(6):
            (status, _), _ = post(gport, comp_body(False))
            assert_eq(status, 200, f"request {i}")
            if i % 2 == 1:
                time.sleep(0.05)  # let the FIN reach the idle connection too
        with eng.lock:
            assert_eq(len(eng.heads), 6, "each request reached the engine once")
            assert_eq(eng.post_conns, 6, "a new connection each time")
        assert_eq(resets(gport), before, "no upstream error counted")
        stop_gw(gw)
    finally:
        eng.close()


def test_malformed_responses_are_502():
    eng = ScriptedEngine()
    bad = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n{\"cut\":",  # closed inside the body
        b"NOT HTTP AT ALL\r\n\r\n",
    ]
    try:
        # no retry, no breaker: every answer is judged on its own and the engine stays in use
        gw, gport = start_gw([f"http://127.0.0.1:{eng.port}"],
                             extra=["--workers", "1", "--retries", "0", "--breaker-failures", "1000"])
        for i, raw in enumerate(bad):
            with eng.lock:
                eng.reply = raw
                eng.close_after = True
            before = resets(gport)
            (status, body), _ = post(gport, comp_body(False))
            assert_eq(status, 502, f"malformed answer {i}: {raw[:40]!r}")
            err = json.loads(body)["error"]
            assert err.get("message"), err
            deadline = time.time() + 5
            while resets(gport) != before + 1:
                assert time.time() < deadline, f"reset counted for answer {i}"
                time.sleep(0.02)
        with eng.lock:
            eng.reply, eng.close_after = GOOD, False
        (status, _), _ = post(gport, comp_body(False))
        assert_eq(status, 200, "a good answer afterwards")
        stop_gw(gw)
    finally:
        eng.close()


if __name__ == "__main__":
    T.run([test_keepalive_and_request_headers, test_engine_closing_kept_connections,
           test_malformed_responses_are_502])
