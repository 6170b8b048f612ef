"""pdgw against peers that do not play fair, and failures that say what they are.

Real pdgw on 127.0.0.1 with ephemeral ports, in front of pdgw-sim or a tiny Python engine:
- clients trickling request headers (or a body) are closed at their deadline, however
  steadily they trickle, while a normal client is served meanwhile;
- once a deadline has closed a connection, the idle gateway blocks (it does not poll);
- connections above the per-client-address cap, or above the limit derived from the
  descriptor limit, are refused and counted;
- a body framed by both Content-Length and Transfer-Encoding is refused (400, closed);
- a stream the engine cuts after the 200 went out ends with an error event that says which
  instance did what and that it cannot be retried transparently, counted and logged as 502;
- a client leaving mid-stream is counted and logged as 499.
"""

import http.client
import json
import os
import re
import selectors
import socket
import sys
import time

import pdgwtest as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "forwarders"))
import fwdconf as F  # noqa: E402
from test_gateway import (SlowUpstream, assert_eq, comp_body, metrics, start_gw, start_sim,
                          stop_gw)


wait_for = T.wait_for


def metric(port, name, labels=None):
    return T.metric_value(metrics(port), name, labels) or 0.0


def closed_count(port, reason):
    return metric(port, "pdgw_client_connections_closed_total", {"reason": reason})


def access_lines(proc):
    """The JSON access log lines pdgw printed so far."""
    out = []
    for line in proc.output().splitlines():
        line = line.strip()
        if line.startswith("{") and '"type":"access"' in line:
            out.append(json.loads(line))
    return out


def is_closed(sock):
    """True when the peer closed (EOF or reset); never blocks."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def connect_from(src, port):
    """A connection to pdgw from source address src (another loopback address is another
    client as far as the per-address cap is concerned)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


# ---------------------------------------------------------------- tests


def test_slow_headers_closed_at_deadline():
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--client-header-timeout", "1500ms"])
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 4000
    n = 300
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", gport))
        s.setblocking(False)
        socks.append(s)
        sel.register(s, selectors.EVENT_READ)
    t0 = time.time()
    sent = {s: 0 for s in socks}
    open_ = set(socks)
    closed_at = {}
    served = False
    # Trickle one byte to every connection every 100 ms: each byte restarts an idle timer,
    # none may extend the header deadline.
    while open_ and time.time() - t0 < 10:
        for s in list(open_):
            try:
                s.send(head[sent[s]:sent[s] + 1])
                sent[s] += 1
            except (BrokenPipeError, ConnectionResetError):
                pass
        for key, _ in sel.select(timeout=0.1):
            if is_closed(key.fileobj):
                closed_at[key.fileobj] = time.time() - t0
                open_.discard(key.fileobj)
                sel.unregister(key.fileobj)
        if not served and time.time() - t0 > 0.5:
            # Meanwhile a normal client is served at once.
            t1 = time.time()
            status, _, obj, _ = T.post_json(gport, "/v1/completions", comp_body(False))
            assert_eq(status, 200, "normal client served while 300 connections trickle")
            assert time.time() - t1 < 1.0, "normal client delayed"
            served = True
    for s in socks:
        s.close()
    assert served
    assert_eq(len(open_), 0, "trickling connections still open after 10 s")
    first, last = min(closed_at.values()), max(closed_at.values())
    assert first >= 1.0, f"closed before the deadline ({first:.2f}s)"
    assert last < 4.0, f"closed long after the 1.5 s deadline ({last:.2f}s)"
    assert max(sent.values()) < len(head), "headers were never complete"
    got = wait_for(lambda: closed_count(gport, "header_timeout") >= n and
                   closed_count(gport, "header_timeout"), 5, "header_timeout count")
    assert_eq(got, float(n), "header timeouts counted")
    stop_gw(gw)


def runnable_s(pid):
    """Seconds the threads of <pid> have been running or waiting to run (schedstat): a thread
    that never blocks accrues wall time here however loaded the machine is."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu, waiting, _ = f.read().split()
        except FileNotFoundError:
            continue  # the thread ended
        total += int(on_cpu) + int(waiting)
    return total / 1e9


def test_idle_after_header_deadline():
    # A connection the header deadline closed leaves the worker blocking in epoll_wait, not
    # polling it (the deadline's wake-up for libmicrohttpd once outlived it on the native
    # front end, and every later epoll_wait returned at once).
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--client-header-timeout", "300ms"])
    s = socket.create_connection(("127.0.0.1", gport))
    wait_for(lambda: closed_count(gport, "header_timeout") >= 1, 10, "header_timeout count")
    wait_for(lambda: is_closed(s), 10, "the idle connection closed")
    s.close()
    # Idle now: its threads block. Over a window, a spinning worker is runnable throughout.
    r0, t0 = runnable_s(gw.pid), time.monotonic()
    time.sleep(1.0)
    busy = (runnable_s(gw.pid) - r0) / (time.monotonic() - t0)
    assert busy < 0.3, f"idle gateway runnable {busy:.0%} of the time"
    stop_gw(gw)


def test_slow_body_closed_at_request_deadline():
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"], extra=["--log-format", "json"])
    body = json.dumps(comp_body(False)).encode()
    s = socket.create_connection(("127.0.0.1", gport))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"X-Request-Timeout: 1\r\nX-Request-Id: slow-body\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    t0 = time.time()
    i = 0
    while not is_closed(s) and time.time() - t0 < 8:
        try:
            s.setblocking(True)
            s.send(body[i:i + 1])
            i += 1
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.05)
    took = time.time() - t0
    s.close()
    assert i < len(body), "body was complete"
    assert 0.9 <= took < 3.0, f"closed after {took:.2f}s (deadline 1 s)"
    wait_for(lambda: closed_count(gport, "body_timeout") == 1, 5, "body_timeout count")
    wait_for(lambda: metric(gport, "pdgw_requests_total", {"status": "408"}) == 1, 5, "408")
    line = wait_for(lambda: [a for a in access_lines(gw) if a.get("request_id") == "slow-body"],
                    5, "access log line")[0]
    assert_eq(line["status"], 408, "access log status")
    stop_gw(gw)


def test_per_client_address_cap():
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"],
                         extra=["--max-connections-per-client", "5"])
    # Six connections from one address: the workers accept them in no fixed order, so
    # exactly one of the six (any) is refused, closed before any request.
    conns = [connect_from("127.0.0.2", gport) for _ in range(6)]
    refused = wait_for(lambda: [c for c in conns if is_closed(c)], 5, "a refused connection")
    assert_eq(len(refused), 1, "connections refused")
    hogs = [c for c in conns if c not in refused]
    refused[0].close()
    for h in hogs:
        h.setblocking(True)
        h.settimeout(5)
        h.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert h.recv(4096).startswith(b"HTTP/1.1 200"), "one of the five not served"
    # Another address is not affected (the metrics below come from 127.0.0.1).
    assert_eq(T.request("GET", gport, "/health")[0], 200, "other client")
    wait_for(lambda: closed_count(gport, "per_client_limit") == 1, 5, "per_client_limit count")
    # A slot frees when one of the five closes.
    hogs.pop().close()

    def fresh_ok():
        c = connect_from("127.0.0.2", gport)
        c.settimeout(5)
        try:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return c.recv(4096).startswith(b"HTTP/1.1 200")
        except (ConnectionResetError, BrokenPipeError):
            return False
        finally:
            c.close()

    wait_for(fresh_ok, 5, "a connection after one of the five closed")
    for h in hogs:
        h.close()
    stop_gw(gw)


def test_connection_limit_from_descriptor_limit():
    """Under a descriptor limit of 256, neutral (one upstream leg per request: two
    descriptors per client) takes (256 - 68) / 2 = 94 clients; the 95th is refused and
    counted, and the 94 still get their upstream legs (no descriptor shortage)."""
    sim, sport = start_sim()
    port = T.free_port()
    gw = T.Proc("pdgw", ["prlimit", "--nofile=256:256", "--", T.binary("pdgw"),
                         "--listen", f"127.0.0.1:{port}", "--protocol", "neutral",
                         "--workers", "1", "--both", f"http://127.0.0.1:{sport}",
                         "--health-interval", "1h", "--metrics-scrape-interval", "1h"])
    T.wait_http(port, "/ready", proc=gw)
    wait_for(lambda: "up to 94 in all workers" in gw.output(), 5, "derived limit in the log")
    held = [connect_from("127.0.0.3", port) for _ in range(94)]
    refused = connect_from("127.0.0.3", port)
    refused.settimeout(5)
    try:
        refused.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = refused.recv(4096)
    except (ConnectionResetError, BrokenPipeError):
        got = b""
    refused.close()
    assert_eq(got, b"", "connection above the limit answered")
    # The held connections are served, each with an upstream leg.
    body = json.dumps(comp_body(False)).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    for h in held[:60]:
        h.sendall(req)
    for h in held[:60]:
        h.settimeout(10)
        data = b""
        while True:
            chunk = h.recv(65536)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
    for h in held:
        h.close()
    wait_for(lambda: closed_count(port, "connection_limit") >= 1, 5, "connection_limit count")
    assert_eq(metric(port, "pdgw_local_resource_errors_total", {"kind": "fd"}), 0.0,
              "no descriptor shortage")
    stop_gw(gw)


def test_content_length_with_chunked_refused():
    sim, sport = start_sim()
    gw, gport = start_gw([f"http://127.0.0.1:{sport}"])
    body = json.dumps(comp_body(False)).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    for name, head in (
            ("CL+TE", b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(chunked)),
            ("TE+CL", b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % len(chunked)),
            ("CL twice", b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(body),
                                                                             len(body)))):
        payload = chunked if b"chunked" in head else body
        s = socket.create_connection(("127.0.0.1", gport), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: smuggle\r\n"
                  b"Content-Type: application/json\r\n" + head + b"\r\n" + payload +
                  # a second request on the same connection must never be read
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        s.close()
        headers, _, rest = data.partition(b"\r\n\r\n")
        assert headers.startswith(b"HTTP/1.1 400"), (name, data[:300])
        assert b"connection: close" in headers.lower(), (name, headers)
        assert_eq(data.count(b"HTTP/1.1 "), 1, f"{name}: one response only, then closed")
        err = json.loads(rest.split(b"\n")[0])["error"]
        assert_eq(err["code"], "ambiguous_request_length", name)
    assert_eq(metric(gport, "pdgw_rejected_requests_total", {"reason": "ambiguous_length"}),
              3.0, "refusals counted")
    # Nothing reached the engine.
    status, _, raw = T.request("GET", sport, "/sim/requests")
    assert_eq(json.loads(raw)["total"], 0, "requests the engine saw")
    stop_gw(gw)


def instance_id(gport):
    status, _, data = T.request("GET", gport, "/admin/instances")
    assert_eq(status, 200, "admin list")
    return json.loads(data)[0]["id"]


def test_midstream_engine_failure_is_502():
    up = SlowUpstream(gap=0.01, die_after=2)
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{up.port}"], extra=["--log-format", "json"])
        iid = instance_id(gport)
        conn = http.client.HTTPConnection("127.0.0.1", gport, timeout=10)
        conn.request("POST", "/v1/completions", body=json.dumps(comp_body(True, 100)),
                     headers={"Content-Type": "application/json", "X-Request-Id": "cut-1"})
        resp = conn.getresponse()
        assert_eq(resp.status, 200, "the stream had started")
        raw = resp.read().decode()
        conn.close()
        events = [line[5:].strip() for line in raw.split("\n") if line.startswith("data:")]
        assert_eq(events[-1], "[DONE]", "ends with [DONE]")
        assert_eq(T.stream_text(events[:2]), "t0 t1 ", "relayed text")
        err = json.loads(events[2])["error"]
        assert_eq(err["code"], "stream_interrupted_not_retryable", "error code")
        assert_eq(err["type"], "upstream_error", "error type")
        want = re.compile(r"^decode instance (\S+) closed the stream after (\d+) bytes$")
        m = want.match(err["message"])
        assert m, err["message"]
        assert_eq(m.group(1), iid, "instance named")
        assert int(m.group(2)) > 0, "bytes counted"
        assert "partial" not in err["message"].lower(), "libcurl's wording"
        wait_for(lambda: metric(gport, "pdgw_requests_total",
                                {"protocol": "neutral", "status": "502"}) == 1, 5, "502 counted")
        assert_eq(metric(gport, "pdgw_requests_total", {"protocol": "neutral", "status": "200"}),
                  0.0, "not counted as 200")
        line = wait_for(lambda: [a for a in access_lines(gw) if a.get("request_id") == "cut-1"],
                        5, "access log line")[0]
        assert_eq(line["status"], 502, "access log status")
        assert "closed the stream" in line.get("error", ""), line
        stop_gw(gw)
    finally:
        up.close()


def test_deadline_midstream_is_504():
    """The request deadline passes while the stream is relayed: the same non-retryable
    error event (timeout type), counted and logged as 504."""
    up = SlowUpstream(gap=0.2)
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{up.port}"], extra=["--log-format", "json"])
        events = list(T.sse_events(gport, "/v1/completions", comp_body(True, 100),
                                   headers={"X-Request-Timeout": "1", "X-Request-Id": "late"}))
        assert_eq(events[-1], "[DONE]", "ends with [DONE]")
        assert json.loads(events[0])["choices"][0]["text"] == "t0 ", events[0]
        err = json.loads(events[-2])["error"]
        assert_eq((err["type"], err["code"]), ("timeout_error", "stream_interrupted_not_retryable"),
                  "error event")
        assert re.match(r"^request deadline passed after \d+ bytes of the response were sent$",
                        err["message"]), err["message"]
        wait_for(lambda: metric(gport, "pdgw_requests_total", {"status": "504"}) == 1, 5, "504")
        line = wait_for(lambda: [a for a in access_lines(gw) if a.get("request_id") == "late"],
                        5, "access log line")[0]
        assert_eq(line["status"], 504, "access log status")
        stop_gw(gw)
    finally:
        up.close()


def test_pd_decode_dies_midstream():
    """vllm-nixl 1P1D: the decode engine is killed while its stream is relayed. The client
    gets the PD-typed error event, not retryable; 502 in the metrics, the access log names
    the decode phase and says it was not retryable."""
    pre = F.Sim("prefill", "prefill-0")
    dec = F.Sim("decode", "decode-0", "--tpot-ms", "50")
    gw = F.Gateway("vllm-nixl", "batch", [pre.instance(), dec.instance()], retries=1,
                   extra=["--log-level", "info", "--log-format", "json"])
    try:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"model": F.MODEL, "prompt": F.PROMPT, "max_tokens": 200,
                                      "ignore_eos": True, "stream": True}),
                     headers={"Content-Type": "application/json", "X-Request-Id": "pd-cut"})
        resp = conn.getresponse()
        assert_eq(resp.status, 200, "the stream had started")
        buf = b""
        while b"\n\n" not in buf:
            buf += resp.read1(4096)
        dec.proc.kill()  # the decode engine dies mid-stream
        buf += resp.read()
        conn.close()
        events = [ln[5:].strip() for ln in buf.decode().split("\n") if ln.startswith("data:")]
        assert_eq(events[-1], "[DONE]", "ends with [DONE]")
        err = json.loads(events[-2])["error"]
        assert_eq(err["type"], "pd_decode_error", "error type")
        assert_eq(err["code"], "stream_interrupted_not_retryable", "error code")
        assert re.match(r"^decode instance decode-0 closed the stream after \d+ bytes$",
                        err["message"]), err["message"]
        wait_for(lambda: gw.metric("pdgw_requests_total", {"status": "502"}) == 1, 5, "502")
        assert_eq(gw.metric("pdgw_requests_total", {"status": "200"}), 0.0, "counted as 200")
        line = wait_for(lambda: [a for a in access_lines(gw.proc)
                                 if a.get("request_id") == "pd-cut"], 5, "access log line")[0]
        assert_eq((line["status"], line.get("pd_phase"), line.get("pd_retryable")),
                  (502, "decode", False), "access log")
    finally:
        gw.stop()


def test_client_disconnect_midstream_is_499():
    up = SlowUpstream()
    try:
        gw, gport = start_gw([f"http://127.0.0.1:{up.port}"], extra=["--log-format", "json"])
        conn = http.client.HTTPConnection("127.0.0.1", gport, timeout=10)
        conn.request("POST", "/v1/completions", body=json.dumps(comp_body(True, 1000)),
                     headers={"Content-Type": "application/json", "X-Request-Id": "gone-1"})
        resp = conn.getresponse()
        assert_eq(resp.status, 200, "stream status")
        assert resp.read1(4096).startswith(b"data: ")
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        wait_for(lambda: metric(gport, "pdgw_requests_total",
                                {"protocol": "neutral", "status": "499"}) == 1, 5, "499 counted")
        assert_eq(metric(gport, "pdgw_requests_total", {"protocol": "neutral", "status": "200"}),
                  0.0, "not counted as 200")
        line = wait_for(lambda: [a for a in access_lines(gw) if a.get("request_id") == "gone-1"],
                        5, "access log line")[0]
        assert_eq(line["status"], 499, "access log status")
        assert_eq(line.get("disconnected"), True, "access log disconnected")
        assert_eq(line.get("client"), "127.0.0.1", "access log client address")
        stop_gw(gw)
    finally:
        up.close()


def test_client_buffer_size_bounds_the_request_head():
    """client_buffer_size is each connection's memory for its request: a head that fits is
    served, a larger one gets 431 (RFC 6585 section 5) and the gateway goes on serving."""
    sim, sport = start_sim()
    gw, port = start_gw([f"http://127.0.0.1:{sport}"], ["--client-buffer-size", "4KiB"])
    try:
        def get_with_header(n):
            # No body: a refused head leaves nothing unread that would turn the close into a
            # reset before the answer is read.
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                      b"Connection: close\r\n\r\n" % (b"a" * n))
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            s.close()
            return int(data.split(b" ", 2)[1]) if data else 0

        assert_eq(get_with_header(2500), 200, "a 2.5 KB header within 4 KiB")
        # Just beyond: the whole head is read (so the close after the 431 is orderly) but does
        # not fit. libmicrohttpd's buffer also holds the parsed headers; the native front end
        # (frontend: native) bounds the head's own bytes.
        native = os.environ.get("PDGW_FRONTEND", "auto") != "mhd"
        if native:
            assert_eq(get_with_header(3900), 200, "a 3.9 KB header: a 4.0 KB head fits 4 KiB")
        assert_eq(get_with_header(4100 if native else 3900), 431, "a header beyond 4 KiB")
        assert_eq(get_with_header(100), 200, "served after the refusal")
        status, _, _ = T.request("POST", port, "/v1/completions", comp_body(False, max_tokens=2))
        assert_eq(status, 200, "a request with a body through the 4 KiB buffer")
        stop_gw(gw)
    finally:
        gw.kill()
        sim.kill()


if __name__ == "__main__":
    T.run([
        test_slow_headers_closed_at_deadline,
        test_idle_after_header_deadline,
        test_slow_body_closed_at_request_deadline,
        test_per_client_address_cap,
        test_connection_limit_from_descriptor_limit,
        test_content_length_with_chunked_refused,
        test_midstream_engine_failure_is_502,
        test_deadline_midstream_is_504,
        test_pd_decode_dies_midstream,
        test_client_disconnect_midstream_is_499,
        test_client_buffer_size_bounds_the_request_head,
    ])
