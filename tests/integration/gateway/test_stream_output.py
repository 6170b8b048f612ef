"""Streams pdgw writes to the client socket itself (stream_output: direct, the default) against
the same streams written by libmicrohttpd (stream_output: library), on raw sockets so the
framing itself is checked:
- HTTP/1.1: a strictly parsed chunked body (RFC 9112 section 7.1), its SSE events the same as
  the library writer's, and two streams in a row on one kept-alive connection;
- HTTP/1.0: no chunked framing (the body ends with the connection, RFC 9112 section 6.3), so
  libmicrohttpd keeps writing it;
- a client that reads slowly through a small receive buffer gets every byte in order (the
  socket fills, pdgw keeps the rest and sends it on the socket's next writable edge);
- a client that leaves mid-stream is counted as a disconnect, the gateway stays usable.
pdgw_client_streams_total{writer} says which writer served each stream. The choice exists
under libmicrohttpd only (frontend: mhd); the native front end always writes streams itself
(test_frontend_native.py).
"""

import json
import os
import socket
import sys
import time

import pdgwtest as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gateway import (MODEL, assert_eq, comp_body, metrics, start_gw, start_sim,  # noqa: E402
                          stop_gw, wait_metrics)

MHD = ["--frontend", "mhd"]


def send_request(sock, body, version="HTTP/1.1"):
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions %s\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (version.encode(), len(data), data))


class Reader:
    """Buffered reads from a socket, with an optional pause per read (a slow client)."""

    def __init__(self, sock, pause=0.0, size=65536):
        self.sock, self.pause, self.size, self.buf = sock, pause, size, b""

    def fill(self):
        if self.pause:
            time.sleep(self.pause)
        d = self.sock.recv(self.size)
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        ln, _, self.buf = self.buf.partition(b"\r\n")
        return ln

    def exact(self, n):
        while len(self.buf) < n:
            self.fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self):
        while True:
            try:
                self.fill()
            except EOFError:
                return self.buf


def read_head(rd):
    status = rd.line().decode()
    headers = {}
    while True:
        ln = rd.line().decode()
        if not ln:
            break
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(status.split()[1]), headers


def read_chunked(rd):
    """The body of a chunked response, checked strictly: hex sizes, CRLF after every chunk, the
    zero chunk and the empty trailer section."""
    body = b""
    while True:
        size_line = rd.line()
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            assert_eq(rd.line(), b"", "empty trailer section after the last chunk")
            return body
        body += rd.exact(size)
        assert_eq(rd.exact(2), b"\r\n", "CRLF after chunk data")


def events_of(body):
    """The data payloads of an SSE body, in order."""
    out = []
    for ev in body.split(b"\n\n"):
        for ln in ev.split(b"\n"):
            if ln.startswith(b"data:"):
                out.append(ln[5:].strip().decode())
    return out


def texts(events):
    return T.stream_text(events), events[-1]


def writer_count(port, writer):
    return T.metric_value(metrics(port), "pdgw_client_streams_total", {"writer": writer}) or 0


def stream_once(port, body, version="HTTP/1.1"):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        send_request(s, body, version)
        rd = Reader(s)
        status, headers = read_head(rd)
        assert_eq(status, 200, "stream status")
        if version == "HTTP/1.1":
            assert_eq(headers.get("transfer-encoding"), "chunked", "HTTP/1.1 stream framing")
            return events_of(read_chunked(rd))
        assert "transfer-encoding" not in headers, headers
        return events_of(rd.rest())
    finally:
        s.close()


def test_direct_and_library_write_the_same_stream():
    sim, sport = start_sim()
    direct, dport = start_gw([f"http://127.0.0.1:{sport}"], MHD)
    library, lport = start_gw([f"http://127.0.0.1:{sport}"], MHD + ["--stream-output", "library"])
    try:
        body = comp_body(True, max_tokens=16, text="one two three four")
        ev_d = stream_once(dport, body)
        ev_l = stream_once(lport, body)
        assert_eq(ev_d[-1], "[DONE]", "direct stream ends with [DONE]")
        assert_eq(len(ev_d), len(ev_l), "events, direct vs library")
        assert_eq(T.stream_text(ev_d), T.stream_text(ev_l), "text, direct vs library")
        assert T.stream_text(ev_d), "the stream carried text"
        assert_eq(writer_count(dport, "direct"), 1, "direct writer used")
        assert_eq(writer_count(dport, "library"), 0, "library writer not used")
        assert_eq(writer_count(lport, "library"), 1, "stream_output: library honoured")
        assert_eq(writer_count(lport, "direct"), 0, "no direct stream with library")
        stop_gw(direct)
        stop_gw(library)
    finally:
        direct.kill()
        library.kill()
        sim.kill()


def test_keep_alive_after_a_direct_stream():
    """The last chunk MHD writes after the direct body must leave the connection in step: a
    second stream and a plain request follow on the same socket."""
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], MHD)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        rd = Reader(s)
        for i in range(2):
            send_request(s, comp_body(True, max_tokens=8, text=f"round {i}"))
            status, headers = read_head(rd)
            assert_eq(status, 200, f"stream {i} status")
            assert headers.get("connection", "").lower() != "close", headers
            ev = events_of(read_chunked(rd))
            assert_eq(ev[-1], "[DONE]", f"stream {i} complete")
        send_request(s, comp_body(False, max_tokens=4))
        status, headers = read_head(rd)
        assert_eq(status, 200, "plain request after two streams")
        obj = json.loads(rd.exact(int(headers["content-length"])))
        assert_eq(obj["model"], MODEL, "plain answer")
        s.close()
        assert_eq(writer_count(port, "direct"), 2, "both streams written directly")
        stop_gw(gw)
    finally:
        gw.kill()
        sim.kill()


def test_http10_stream_stays_with_the_library():
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], MHD)
    try:
        ev = stream_once(port, comp_body(True, max_tokens=8), version="HTTP/1.0")
        assert_eq(ev[-1], "[DONE]", "HTTP/1.0 stream complete")
        assert_eq(writer_count(port, "library"), 1, "HTTP/1.0 written by libmicrohttpd")
        assert_eq(writer_count(port, "direct"), 0, "not taken over")
        stop_gw(gw)
    finally:
        gw.kill()
        sim.kill()


def test_slow_reader_gets_every_byte():
    """30,000 events (6.6 MB) as fast as the engine makes them, to a client that reads 4 KiB
    every 2 ms through a 4 KiB receive buffer: the kernel's buffers fill, sends come back
    short, and pdgw keeps the rest of a chunk for the socket's next writable edge."""
    sim, sport = start_sim(["--tpot-ms", "0", "--ttft-ms", "0", "--eos-period", "0",
                            "--max-model-len", "100000"])
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], MHD)
    try:
        body = comp_body(True, max_tokens=30000, text="slow reader")
        want = stream_once(port, body)
        assert_eq(len(want), 30001, "reference events (30,000 tokens + [DONE])")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(60)
        s.connect(("127.0.0.1", port))
        send_request(s, body)
        rd = Reader(s, pause=0.002, size=4096)
        status, _ = read_head(rd)
        assert_eq(status, 200, "slow stream status")
        got = events_of(read_chunked(rd))
        s.close()
        assert_eq(len(got), len(want), "events to the slow reader")
        assert_eq(T.stream_text(got), T.stream_text(want), "text to the slow reader")
        assert_eq(writer_count(port, "direct"), 2, "both streams written directly")
        stop_gw(gw)
    finally:
        gw.kill()
        sim.kill()


def test_client_leaving_a_direct_stream():
    sim, sport = start_sim(["--tpot-ms", "20", "--eos-period", "0"])
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], MHD)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        send_request(s, comp_body(True, max_tokens=500))
        rd = Reader(s)
        status, _ = read_head(rd)
        assert_eq(status, 200, "stream status")
        read_chunked_first = rd.line()  # the first chunk's size: the stream is flowing
        assert int(read_chunked_first, 16) > 0
        s.close()
        wait_metrics(port, lambda m: (T.metric_value(m, "pdgw_client_disconnects_total") or 0)
                     >= 1 and T.metric_value(m, "pdgw_inflight_requests") == 0, timeout=20)
        ev = stream_once(port, comp_body(True, max_tokens=4))
        assert_eq(ev[-1], "[DONE]", "the next stream is served")
        stop_gw(gw)
    finally:
        gw.kill()
        sim.kill()


if __name__ == "__main__":
    T.run([test_direct_and_library_write_the_same_stream, test_keep_alive_after_a_direct_stream,
           test_http10_stream_stays_with_the_library, test_slow_reader_gets_every_byte,
           test_client_leaving_a_direct_stream])
