"""A fake Kubernetes API server for tests: EndpointSlices of one namespace
with a resourceVersion history, served as list responses and chunked watch
streams (threaded http.server), plus pod GETs for annotations. The test
changes the state (put/delete, optionally "silent" = not in the watch
history) and can end every open watch with a 410 Gone, a cut connection or a
corrupt line (kick)."""

import json
import os
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAMESPACE = "pdgw-test"
TOKEN = "test-token-7f3a"


class FakeKube:
    """EndpointSlices of one namespace with a resourceVersion history."""

    def __init__(self):
        self.cond = threading.Condition()
        self.rv = 100
        self.slices = {}  # name -> object
        self.events = []  # (rv, type, object)
        self.compacted = 0  # watches from an older resourceVersion get 410
        self.pods = {}  # name -> annotations
        self.log = []  # (kind, selector, resourceVersion)
        self.kick_gen = 0
        self.kick_action = None
        self.stopped = False
        self.open_watches = 0

    # -- state changes (the test's side) --
    def _bump(self):
        self.rv += 1
        return self.rv

    def put(self, obj, silent=False):
        """Add or modify a slice; silent = the change is not in the watch history."""
        with self.cond:
            rv = self._bump()
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(rv)
            kind = "MODIFIED" if obj["metadata"]["name"] in self.slices else "ADDED"
            self.slices[obj["metadata"]["name"]] = obj
            if not silent:
                self.events.append((rv, kind, obj))
            self.cond.notify_all()

    def delete(self, name, silent=False):
        with self.cond:
            rv = self._bump()
            obj = self.slices.pop(name)
            obj = dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(rv)))
            if not silent:
                self.events.append((rv, "DELETED", obj))
            self.cond.notify_all()

    def kick(self, action):
        """End every open watch: 'gone' (ERROR 410 event, history compacted),
        'drop' (connection cut mid-stream), 'garbage' (a line that is not JSON)."""
        with self.cond:
            if action == "gone":
                self.compacted = self.rv  # older resourceVersions are gone
            self.kick_gen += 1
            self.kick_action = action
            self.cond.notify_all()

    def count(self, kind):
        with self.cond:
            return sum(1 for k, _, _ in self.log if k == kind)

    def watching(self):
        with self.cond:
            return self.open_watches > 0

    # -- queries (the server's side) --
    @staticmethod
    def matches(selector, labels):
        for term in filter(None, selector.split(",")):
            k, _, v = term.partition("=")
            if labels.get(k) != v:
                return False
        return True

    def list(self, selector):
        with self.cond:
            self.log.append(("list", selector, None))
            items = [o for o in self.slices.values()
                     if self.matches(selector, o["metadata"].get("labels", {}))]
            return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self.rv)}, "items": items}


def make_handler(kube):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def log_message(self, fmt, *args):
            if os.environ.get("FAKE_KUBE_DEBUG"):
                print("%.3f fake-kube: %s" % (time.time(), fmt % args), flush=True)

        def _json(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code, reason):
            self._json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "reason": reason, "code": code})

        def _chunk(self, data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_GET(self):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._status(401, "Unauthorized")
            url = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(url.query))
            parts = url.path.strip("/").split("/")
            if parts[:5] == ["apis", "discovery.k8s.io", "v1", "namespaces", NAMESPACE] and \
                    parts[5:] == ["endpointslices"]:
                selector = q.get("labelSelector", "")
                if q.get("watch") in ("1", "true"):
                    return self._watch(selector, q)
                return self._json(200, kube.list(selector))
            if parts[:4] == ["api", "v1", "namespaces", NAMESPACE] and len(parts) == 6 and \
                    parts[4] == "pods":
                with kube.cond:
                    kube.log.append(("pod", parts[5], None))
                    ann = kube.pods.get(parts[5])
                if ann is None:
                    return self._status(404, "NotFound")
                return self._json(200, {"kind": "Pod", "apiVersion": "v1",
                                        "metadata": {"name": parts[5], "namespace": NAMESPACE,
                                                     "annotations": ann}})
            return self._status(404, "NotFound")

        def _watch(self, selector, q):
            rv = int(q.get("resourceVersion", "0") or 0)
            timeout = min(int(q.get("timeoutSeconds", "30")), 30)
            with kube.cond:
                kube.log.append(("watch", selector, rv))
                gen = kube.kick_gen
                gone = rv < kube.compacted
                kube.open_watches += 1
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if gone:
                    return self._gone()
                deadline = time.time() + timeout
                pos = rv
                while True:
                    with kube.cond:
                        while True:
                            pending = [e for e in kube.events if e[0] > pos and kube.matches(
                                selector, e[2]["metadata"].get("labels", {}))]
                            action = kube.kick_action if kube.kick_gen != gen else None
                            left = deadline - time.time()
                            if pending or action or kube.stopped or left <= 0:
                                break
                            kube.cond.wait(min(left, 0.5))
                    for erv, etype, obj in pending:
                        self._chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                        pos = erv
                    if action == "gone":
                        return self._gone()
                    if action == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if action == "garbage":
                        self._chunk(b'{"type": "MODIFIED", "object": {not json\n')
                        gen = kube.kick_gen  # keep serving until the client hangs up
                        continue
                    if kube.stopped or time.time() >= deadline:
                        self.wfile.write(b"0\r\n\r\n")
                        return
            except OSError:
                self.close_connection = True
            finally:
                with kube.cond:
                    kube.open_watches -= 1

        def _gone(self):
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "message": "too old resource version", "reason": "Expired", "code": 410}
            self._chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def start(kube, tls=None):
    """Serve <kube> on an ephemeral loopback port; returns (server, port).
    tls: (certfile, keyfile) to serve https instead of http."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(kube))
    server.daemon_threads = True
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def stop(kube, server):
    with kube.cond:
        kube.stopped = True
        kube.cond.notify_all()
    server.shutdown()
    server.server_close()


def write_service_account(directory):
    """token and namespace files as a pod's service-account mount has them."""
    with open(os.path.join(directory, "token"), "w") as f:
        f.write(TOKEN + "\n")
    with open(os.path.join(directory, "namespace"), "w") as f:
        f.write(NAMESPACE)


def make_cert(directory, name):
    """A self-signed certificate for 127.0.0.1 (openssl CLI); returns (cert, key)."""
    cert = os.path.join(directory, f"{name}.crt")
    key = os.path.join(directory, f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    return cert, key
