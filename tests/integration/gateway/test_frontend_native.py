"""The native front end (frontend: native) on raw sockets, where libmicrohttpd's behaviour
is not there to lean on:
- pipelined requests on one connection are answered in order (RFC 9112 section 9.3.2), a
  stream among them included;
- a chunked request body (extensions, a trailer) reads as the same body sent with
  Content-Length (RFC 9112 section 7.1); Expect: 100-continue gets its interim answer
  before the client sends the body (RFC 9110 section 10.1.1);
- heads a proxy in front could read differently are refused with the right status and the
  connection closed, and counted (RFC 9112 sections 2.2, 3, 5.2, 6.1, 6.3); a body refused
  on its length is answered and the rest of it read and dropped before the close (9.6);
- HTTP/1.0: keep-alive only when asked, a stream without chunks ended by the close;
- HEAD answers with the length and no body, and the connection goes on;
- a client too slow to send its head is cut off at the header deadline; one that leaves
  while its answer is pending is counted as a disconnect.
"""

import json
import os
import socket
import sys
import time

import pdgwtest as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gateway import (assert_eq, comp_body, metrics, start_gw, start_sim,  # noqa: E402
                          stop_gw, wait_metrics)
from test_stream_output import Reader, events_of, read_chunked, read_head  # noqa: E402

NATIVE = ["--frontend", "native"]


def post(body, rid, extra=b""):
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nX-Request-Id: %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (rid.encode(), len(data), extra, data))


def read_response(rd):
    """Status, headers and body of one response (Content-Length or chunked)."""
    status, headers = read_head(rd)
    if headers.get("transfer-encoding") == "chunked":
        return status, headers, read_chunked(rd)
    return status, headers, rd.exact(int(headers.get("content-length", "0")))


def expect_refusal(rd, status, code, what):
    """The next answer on <rd> refuses with <status> and error <code> (any code: None), and the
    gateway closes the connection after it, with nothing more written. Its headers."""
    got, headers, body = read_response(rd)
    assert_eq(got, status, what)
    err = json.loads(body)["error"]
    if code is not None:
        assert_eq(err["code"], code, what + ": error code")
    assert_eq(headers.get("connection"), "close", what + ": closed after it")
    assert_eq(rd.rest(), b"", what + ": nothing after the close")
    return headers


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=20)


def closed_count(port, reason):
    return T.metric_value(metrics(port), "pdgw_client_connections_closed_total",
                          {"reason": reason}) or 0


def test_pipelined_requests_in_order():
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], NATIVE)
    s = connect(port)
    try:
        # Three requests in one write: a reply, a stream, a local answer.
        s.sendall(post(comp_body(False, 3), "first") + post(comp_body(True, 4), "second") +
                  b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Request-Id: third\r\n\r\n")
        rd = Reader(s)
        got = []
        for _ in range(3):
            status, headers, body = read_response(rd)
            assert_eq(status, 200, "pipelined status")
            got.append((headers.get("x-request-id"), body))
        assert_eq([g[0] for g in got], ["first", "second", "third"], "answered in order")
        assert_eq(json.loads(got[0][1])["usage"]["completion_tokens"], 3, "first answer")
        assert_eq(events_of(got[1][1])[-1], "[DONE]", "the stream in the middle ended")
        assert_eq(json.loads(got[2][1])["status"], "ok", "third answer")
        # The connection is still open for more.
        s.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert_eq(read_response(rd)[0], 200, "after the pipeline")
        # A request that closes the connection, waiting behind an upstream answer and answered
        # at once when its turn comes: the connection ends after it, what follows is dropped.
        s.sendall(post(comp_body(False, 2), "fourth") +
                  b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n" +
                  b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert_eq(read_response(rd)[1].get("x-request-id"), "fourth", "before the last")
        status, headers, _ = read_response(rd)
        assert_eq((status, headers.get("connection")), (200, "close"), "the last one")
        assert_eq(rd.rest(), b"", "closed after it")
    finally:
        s.close()
    stop_gw(gw)


def test_chunked_body_and_100_continue():
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], NATIVE)
    body = json.dumps(comp_body(False, 5, text="chunked bodies read the same")).encode()
    s = connect(port)
    try:
        rd = Reader(s)
        s.sendall(post(comp_body(False, 5, text="chunked bodies read the same"), "cl"))
        ref_status, _, ref = read_response(rd)
        assert_eq(ref_status, 200, "Content-Length body")
        # The same body in three chunks, one with an extension, and a trailer field.
        a, b, c = body[:7], body[7:20], body[20:]
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n"
                  b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                  b"%x\r\n%s\r\n%x;ext=1\r\n%s\r\n" % (len(a), a, len(b), b) +
                  b"%x\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (len(c), c))
        status, _, got = read_response(rd)
        assert_eq(status, 200, "chunked body")
        assert_eq(json.loads(got)["usage"], json.loads(ref)["usage"], "same request read")
        # Expect: 100-continue: the interim answer comes before the body is sent.
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert_eq(rd.line(), b"HTTP/1.1 100 Continue", "interim answer")
        assert_eq(rd.line(), b"", "interim answer ends")
        s.sendall(body)
        status, _, got = read_response(rd)
        assert_eq(status, 200, "body after 100 Continue")
        assert_eq(json.loads(got)["usage"], json.loads(ref)["usage"], "same request read")
        # A chunk size that is not hex: 400, and the connection is closed after it.
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
        expect_refusal(rd, 400, "malformed_body", "malformed chunked body")
    finally:
        s.close()
    stop_gw(gw)


def test_heads_refused():
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], NATIVE)
    cases = [
        (b"GET /health HTTP/1.1\r\nHost: gw\r\nX-A: 1\r\n folded\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nHost : gw\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET /health HTTP/2.0\r\nHost: gw\r\n\r\n", 505),
        (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n"
         b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"GET /health HTTP/1.1\r\nHost: gw\r\n" +
         b"".join(b"X-%d: v\r\n" % i for i in range(120)) + b"\r\n", 431),
    ]
    before = closed_count(port, "malformed_request")
    for raw, want in cases:
        s = connect(port)
        try:
            s.sendall(raw)
            expect_refusal(Reader(s), want, None, repr(raw[:40]))
        finally:
            s.close()
    after = closed_count(port, "malformed_request")
    assert_eq(after - before, len(cases) - 1, "refusals counted (431 apart)")
    assert closed_count(port, "head_too_large") >= 1
    # Both lengths: refused by the request path as with libmicrohttpd, then closed.
    s = connect(port)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        expect_refusal(Reader(s), 400, "ambiguous_request_length",
                       "Content-Length with Transfer-Encoding")
    finally:
        s.close()
    assert_eq(T.request("GET", port, "/health")[0], 200, "still serving")
    stop_gw(gw)


def test_refused_upload_read_to_its_end():
    """A body refused on its Content-Length (413) is answered at once; the gateway then reads
    and drops what the client still sends before closing, so the close is not a reset that
    destroys the answer in the client's socket (RFC 9112 section 9.6)."""
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], NATIVE + ["--max-body-bytes", "64KiB"])
    s = connect(port)
    try:
        body = b"x" * (4 << 20)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.sendall(body)  # a reset would fail this, or the reads below
        expect_refusal(Reader(s), 413, "request_too_large", "refused on its length")
    finally:
        s.close()
    stop_gw(gw)


def test_http10_and_head():
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], NATIVE)
    s = connect(port)
    try:
        rd = Reader(s)
        s.sendall(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, body = read_response(rd)
        assert_eq((status, headers.get("connection")), (200, "keep-alive"), "1.0 keep-alive")
        # HEAD: the length of the answer, no body; the next answer follows at once.
        s.sendall(b"HEAD /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        status, headers = read_head(rd)
        assert_eq(status, 200, "HEAD")
        assert_eq(headers.get("content-length"), str(len(body)), "HEAD length")
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        status, headers, _ = read_response(rd)
        assert_eq((status, headers.get("connection")), (200, "close"), "1.0 without keep-alive")
        assert_eq(rd.rest(), b"", "1.0 closes")
    finally:
        s.close()
    # An HTTP/1.0 stream: no chunks, the close ends it.
    s = connect(port)
    try:
        data = json.dumps(comp_body(True, 4)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        rd = Reader(s)
        status, headers = read_head(rd)
        assert_eq(status, 200, "1.0 stream")
        assert "transfer-encoding" not in headers, headers
        assert_eq(events_of(rd.rest())[-1], "[DONE]", "1.0 stream complete")
    finally:
        s.close()
    stop_gw(gw)


def test_slow_and_vanishing_clients():
    sim, sport = start_sim(["--ttft-ms", "3000"])
    gw, port = start_gw([f"http://127.0.0.1:{sport}"],
                        NATIVE + ["--client-header-timeout", "300ms"])
    # A head that never completes: shut at the deadline.
    s = connect(port)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n")
        t0 = time.time()
        s.settimeout(5)
        assert_eq(s.recv(100), b"", "closed at the header deadline")
        assert time.time() - t0 < 3, "the deadline, not an idle timeout"
    finally:
        s.close()
    wait_metrics(port, lambda m: (T.metric_value(m, "pdgw_client_connections_closed_total",
                                                 {"reason": "header_timeout"}) or 0) >= 1)
    # A client that leaves while its answer is pending: counted, nothing left in flight.
    s = connect(port)
    s.sendall(post(comp_body(False, 3), "leaver"))
    wait_metrics(port, lambda m: T.metric_value(m, "pdgw_inflight_requests") == 1)
    s.close()
    wait_metrics(port, lambda m: (T.metric_value(m, "pdgw_client_disconnects_total") or 0) >= 1
                 and T.metric_value(m, "pdgw_inflight_requests") == 0, timeout=10)
    stop_gw(gw)


if __name__ == "__main__":
    T.run([test_pipelined_requests_in_order, test_chunked_body_and_100_continue,
           test_heads_refused, test_refused_upload_read_to_its_end, test_http10_and_head,
           test_slow_and_vanishing_clients])
