"""Helpers for pdgw integration tests: real processes on 127.0.0.1.

Every process started through a Stack is killed when the test ends, passes
or fails (atexit + signal handlers), and its log is printed on failure.
Only the standard library is used here; tests that need msgpack or zmq
import them themselves (Debian's python3-msgpack / python3-zmq).
"""

import atexit
import fcntl
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

BIN_DIR = os.environ.get("PDGW_BIN_DIR", os.path.join(os.getcwd(), "bin"))
SOURCE_DIR = os.environ.get("PDGW_SOURCE_DIR", os.getcwd())

_live = []


def _cleanup(*_):
    for p in list(_live):
        p.kill()


atexit.register(_cleanup)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, lambda s, f: (_cleanup(), sys.exit(128 + s)))


_handed_out = set()


def _pick_range():
    """Ports below the kernel's ephemeral range, when it leaves room: the kernel gives ports of
    that range to every outgoing connection, and one could take a picked port between the pick
    and the child's bind. None: pick with bind(0)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, _ = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return (2048, lo - 1) if lo - 1 - 2048 >= 2000 else None


_rng = random.Random(os.getpid() ^ time.time_ns())
_range = _pick_range()
# Ports handed out by every test process of this machine in the last _LEASE_S seconds: tests
# run side by side, and a port one test names but never binds (an engine meant to be dead)
# must not become another test's listener.
_LEASES = os.path.join(tempfile.gettempdir(), "pdgwtest-ports")
_LEASE_S = 900


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return 0  # in use, or lingering from an earlier test
        return s.getsockname()[1]


def free_port():
    """A port that was free a moment ago and that no test on this machine was given in the last
    quarter of an hour: a test picks several ports before anything binds them. Picked at
    random below the ephemeral range where there is one (see _pick_range), else by the kernel
    (bind to 0)."""
    with open(_LEASES, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now = time.time()
        leased = {}
        for line in f.read().split("\n"):
            try:
                port, t = line.split()
                if now - float(t) < _LEASE_S:
                    leased[int(port)] = t
            except ValueError:
                continue
        for attempt in range(1000):
            want = _rng.randint(*_range) if _range and attempt < 900 else 0
            if want in leased or want in _handed_out:
                continue
            port = _bindable(want)
            if port and port not in leased and port not in _handed_out:
                break
        else:
            raise RuntimeError("no free port")
        _handed_out.add(port)
        leased[port] = f"{now:.0f}"
        f.seek(0)
        f.truncate()
        f.write("".join(f"{p} {t}\n" for p, t in leased.items()))
    return port


class RawServer:
    """A TCP listener on 127.0.0.1 (ephemeral port) for fake engines that speak raw HTTP:
    every accepted connection is handed to the subclass's _serve(conn) on its own thread."""

    def listen(self, backlog=16):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, conn):
        raise NotImplementedError


def binary(name):
    path = os.path.join(BIN_DIR, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not built")
    return path


class Proc:
    """One child process with its output captured to a temporary log file."""

    def __init__(self, name, argv, env=None):
        self.name = name
        self.argv = argv
        self.log = tempfile.NamedTemporaryFile(prefix=f"pdgwtest-{name}-", suffix=".log",
                                               delete=False)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.popen = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                      env=full_env, start_new_session=True)
        _live.append(self)

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def signal(self, sig):
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def wait(self, timeout):
        return self.popen.wait(timeout=timeout)

    def kill(self):
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait()
        if self in _live:
            _live.remove(self)

    def output(self):
        self.log.flush()
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()


def wait_http(port, path="/health", timeout=10.0, proc=None, expect=200):
    """Poll GET path on 127.0.0.1:port until it answers expect (or raise)."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited early:\n{proc.output()}")
        try:
            status, _, _ = request("GET", port, path, timeout=1.0)
            if status == expect:
                return
            last = status
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"127.0.0.1:{port}{path} not ready: {last}")


def wait_for(cond, timeout, what):
    """Poll cond() until it returns something true (returned) or <timeout> s pass (raise)."""
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.time() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def with_tag(headers):
    """Headers plus X-Sim-Tag = the client's X-Request-Id: pdgw mints its own id for
    the engines, so the simulator's record is searched by this forwarded tag."""
    hdrs = dict(headers or {})
    rid = next((v for k, v in hdrs.items() if k.lower() == "x-request-id"), None)
    if rid is not None and not any(k.lower() == "x-sim-tag" for k in hdrs):
        hdrs["X-Sim-Tag"] = rid
    return hdrs


def request(method, port, path, body=None, headers=None, timeout=30.0):
    """One HTTP request. body: dict (sent as JSON), bytes or str.
    Returns (status, headers as a lower-cased dict, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdrs = with_tag(headers)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def post_json(port, path, body, headers=None, timeout=30.0):
    status, hdrs, data = request("POST", port, path, body, headers, timeout)
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = None
    return status, hdrs, parsed, data


def sse_events(port, path, body, headers=None, timeout=30.0):
    """POST body and yield the `data:` payloads of the SSE response as strings,
    in order, including the final "[DONE]". Also yields nothing more once the
    server closes. Raises on a non-200 status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    hdrs.update(with_tag(headers))
    conn.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
    resp = conn.getresponse()
    if resp.status != 200:
        data = resp.read()
        conn.close()
        raise HTTPError(resp.status, data)
    buf = b""
    try:
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield line[5:].strip().decode()
    finally:
        conn.close()


class HTTPError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


def stream_text(events):
    """Concatenate the content of OpenAI completion / chat chunks."""
    out = []
    for ev in events:
        if ev == "[DONE]":
            break
        obj = json.loads(ev)
        for ch in obj.get("choices", []):
            if "text" in ch:
                out.append(ch["text"] or "")
            delta = ch.get("delta") or {}
            out.append(delta.get("content") or "")
    return "".join(out)


def metric_value(text, name, labels=None):
    """The value of one Prometheus sample in exposition text (None if absent).
    labels: dict that must be a subset of the sample's labels."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        if labels:
            have = {}
            for part in rest.rstrip("}").split(","):
                if "=" in part:
                    k, v = part.split("=", 1)
                    have[k.strip()] = v.strip().strip('"')
            if any(have.get(k) != str(v) for k, v in labels.items()):
                continue
        return float(value)
    return None


def run(tests):
    """Run test functions in order, print each result and the closing count line,
    and exit non-zero if any failed. On failure every live process log is shown."""
    passed = failed = 0
    only = os.environ.get("PDGW_TEST_ONLY")  # run just these (comma-separated names)
    if only:
        tests = [t for t in tests if t.__name__ in only.split(",")]
    for t in tests:
        start = time.time()
        try:
            t()
            passed += 1
            print(f"[ PASS ] {t.__name__} ({time.time() - start:.2f}s)", flush=True)
        except Exception:
            failed += 1
            print(f"[ FAIL ] {t.__name__}", flush=True)
            traceback.print_exc()
            for p in list(_live):
                print(f"---- log of {p.name} ({' '.join(p.argv)}) ----")
                print(p.output()[-8000:])
        finally:
            _cleanup()
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


def skip_unless_tools(*tools, why=""):
    """Exit 0 after printing one `SKIP <why>` line when a command is not in PATH.
    For tools Debian 12 does not ship (deploy/install-deps.sh installs only Debian
    packages), so a fresh install passes the suite with that check skipped."""
    import shutil

    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        print(f"SKIP {', '.join(missing)} not found in PATH{': ' + why if why else ''}",
              flush=True)
        sys.exit(0)
