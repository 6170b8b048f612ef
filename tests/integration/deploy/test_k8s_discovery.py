"""Kubernetes EndpointSlice discovery end to end: pdgw with
discovery.kubernetes pointed at an in-test fake API server (threaded
http.server speaking EndpointSlice list + chunked watch streams and pod GETs),
and pdgw-sim engines. Instances join, drain and leave as the slices change
(GET /admin/instances), requests follow, and the client recovers from a
410 Gone, a dropped watch and a corrupt watch stream by re-listing.
"""

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pdgwtest
from pdgwtest import Proc, free_port, metric_value, post_json, request, wait_http

NAMESPACE = "pdgw-test"
TOKEN = "test-token-7f3a"
SELECTOR_LABELS = {"pdgw.io/pool": "kdisc"}


# ----------------------------------------------------------------- fake API


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


def slice_obj(name, role, port, ready=True, terminating=False, pod=None, extra_ports=()):
    labels = {"kubernetes.io/service-name": f"engine-{role}", "pdgw.io/role": role}
    labels.update(SELECTOR_LABELS)
    ep = {"addresses": ["127.0.0.1"],
          "conditions": {"ready": ready, "serving": ready or terminating,
                         "terminating": terminating},
          "zone": "zone-a", "nodeName": "node-1"}
    if pod:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": NAMESPACE}
    ports = [{"name": "http", "port": port, "protocol": "TCP"}]
    ports += [{"name": n, "port": p, "protocol": "TCP"} for n, p in extra_ports]
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "addressType": "IPv4", "endpoints": [ep], "ports": ports}


# ------------------------------------------------------------------ helpers


def instances(port):
    status, _, body = request("GET", port, "/admin/instances", timeout=5)
    assert status == 200, (status, body)
    data = json.loads(body)
    if isinstance(data, dict):
        data = data.get("instances", data.get("data", []))
    return {i["id"]: i for i in data}


def wait_for(what, fn, timeout=15.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def sim_count(port):
    status, _, body = request("GET", port, "/sim/requests", timeout=5)
    assert status == 200
    return json.loads(body)["total"]


def complete(port):
    status, _, obj, raw = post_json(port, "/v1/completions",
                                    {"model": "sim-model", "prompt": "hello k8s",
                                     "max_tokens": 4}, timeout=20)
    assert status == 200, (status, raw[:300])
    assert obj["choices"][0]["text"], obj
    return obj


def metrics(port):
    status, _, body = request("GET", port, "/metrics", timeout=5)
    assert status == 200
    return body.decode()


# -------------------------------------------------------------------- test


def test_k8s_discovery():
    kube = FakeKube()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(kube))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    tmp = tempfile.mkdtemp(prefix="pdgw-k8s.")
    try:
        _run(kube, server.server_address[1], tmp)
    finally:
        with kube.cond:
            kube.stopped = True
            kube.cond.notify_all()
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


def _run(kube, kport, tmp):
    # Service-account files: token, namespace (discovery reads the namespace
    # beside the token when the config leaves it empty), CA (unused over http).
    with open(os.path.join(tmp, "token"), "w") as f:
        f.write(TOKEN + "\n")
    with open(os.path.join(tmp, "namespace"), "w") as f:
        f.write(NAMESPACE)
    sims = {}
    for name, role in (("sim-a", "both"), ("sim-b", "both"), ("sim-c", "both"),
                       ("sim-p", "both")):  # listed as prefill by its slice
        port = free_port()
        sims[name] = (Proc(name, [pdgwtest.binary("pdgw-sim"), "--role", role, "--port",
                                  str(port), "--zero-delay"]), port)
    for name, (proc, port) in sims.items():
        wait_http(port, "/health", proc=proc)
    pa, pb, pc, pp = (sims[n][1] for n in ("sim-a", "sim-b", "sim-c", "sim-p"))

    kube.pods["sim-a"] = {"pdgw.io/engine-id": "engine-a"}
    kube.pods["sim-p"] = {"pdgw.io/kv-port": "28001", "sglang.ai/bootstrap-port": "8998",
                          "pdgw.io/engine-id": "engine-p", "pdgw.io/init-ports": "7300,7301",
                          "pdgw.io/alloc-ports": "7400,7401", "pdgw.io/tp-size": "2",
                          "pdgw.io/dp-size": "not-a-number"}
    kube.pods["sim-b"] = {}
    kube.pods["sim-c"] = {}
    kube.put(slice_obj("engine-both-a", "both", pa, pod="sim-a",
                       extra_ports=(("kv", 28100), ("bootstrap", 29100))))
    kube.put(slice_obj("engine-prefill-p", "prefill", pp, pod="sim-p"))
    # A slice of another pool: the selector must keep it out.
    other = slice_obj("other-pool", "both", pc, pod="sim-c")
    other["metadata"]["labels"]["pdgw.io/pool"] = "elsewhere"
    kube.put(other)

    gport = free_port()
    cfg = os.path.join(tmp, "pdgw.yaml")
    with open(cfg, "w") as f:
        f.write(f"""listen: "127.0.0.1:{gport}"
protocol: neutral
workers: 1
drain_timeout: 1s
health_interval: 500ms
health_timeout: 400ms
discovery:
  kubernetes:
    prefill_selector: "pdgw.io/role=prefill,pdgw.io/pool=kdisc"
    both_selector: "pdgw.io/role=both,pdgw.io/pool=kdisc"
    port_name: http
    api_server: "http://127.0.0.1:{kport}"
    token_file: "{tmp}/token"
    ca_file: "{tmp}/ca.crt"
""")
    env = {k: "" for k in os.environ if k.startswith("PDGW_") and k not in
           ("PDGW_BIN_DIR", "PDGW_SOURCE_DIR", "PDGW_BUILD_DIR")}
    gw = Proc("pdgw", [pdgwtest.binary("pdgw"), "--config", cfg], env=env)
    wait_http(gport, "/health", proc=gw)

    # 1. The initial list: sim-a (both) and sim-p (prefill) join with their KV fields.
    insts = wait_for("sim-a and sim-p", lambda: (lambda i: i if {"sim-a", "sim-p"} <= set(i)
                                                 else None)(instances(gport)))
    assert set(insts) == {"sim-a", "sim-p"}, insts.keys()
    a, p = insts["sim-a"], insts["sim-p"]
    assert a["role"] == "both" and a["state"] == "up" and a["source"] == "kubernetes", a
    assert a["url"] == f"http://127.0.0.1:{pa}", a
    assert (a["kv_port"], a["bootstrap_port"], a["engine_id"]) == (28100, 29100, "engine-a"), a
    assert a["zone"] == "zone-a" and a["labels"].get("node") == "node-1", a
    assert a["labels"].get("service") == "engine-both", a
    assert p["role"] == "prefill", p
    assert (p["kv_port"], p["bootstrap_port"], p["engine_id"]) == (28001, 8998, "engine-p"), p
    assert p["init_ports"] == [7300, 7301] and p["alloc_ports"] == [7400, 7401], p
    assert p["tp_size"] == 2 and p["dp_size"] == 1, p  # the bad dp-size was ignored
    # The back-end fetched each pod once.
    assert kube.count("pod") == 2, kube.log
    wait_http(gport, "/ready", proc=gw)
    before = sim_count(pa)
    complete(gport)
    assert sim_count(pa) == before + 1

    # 2. A watch event adds sim-b.
    wait_for("an open watch", kube.watching)
    kube.put(slice_obj("engine-both-b", "both", pb, pod="sim-b"))
    wait_for("sim-b up", lambda: instances(gport).get("sim-b", {}).get("state") == "up")

    # 3. sim-a terminates: drained at once, requests go to sim-b only.
    kube.put(slice_obj("engine-both-a", "both", pa, ready=False, terminating=True, pod="sim-a"))
    wait_for("sim-a draining",
             lambda: instances(gport).get("sim-a", {}).get("state") == "draining")
    a_before, b_before = sim_count(pa), sim_count(pb)
    for _ in range(4):
        complete(gport)
    assert sim_count(pa) == a_before, "a draining instance got new requests"
    assert sim_count(pb) == b_before + 4

    # 4. The slice goes: sim-a leaves the pool.
    kube.delete("engine-both-a")
    wait_for("sim-a gone", lambda: "sim-a" not in instances(gport))

    # 5. 410 Gone: the history is compacted and sim-c appeared meanwhile without
    #    a watch event; only a re-list can find it.
    lists = kube.count("list")
    kube.put(slice_obj("engine-both-c", "both", pc, pod="sim-c"), silent=True)
    kube.kick("gone")
    wait_for("sim-c up after 410", lambda: instances(gport).get("sim-c", {}).get("state") == "up")
    assert kube.count("list") >= lists + 1
    m = metrics(gport)
    assert metric_value(m, "pdgw_discovery_k8s_lists_total",
                        {"role": "both", "cause": "gone"}) >= 1, m

    # 6. Dropped watch: sim-b vanished without an event; the re-list (after
    #    backoff) retires it.
    wait_for("an open watch", kube.watching)
    lists = kube.count("list")
    kube.delete("engine-both-b", silent=True)
    kube.kick("drop")
    wait_for("sim-b gone after a dropped watch", lambda: "sim-b" not in instances(gport))
    assert kube.count("list") >= lists + 1
    m = metrics(gport)
    assert metric_value(m, "pdgw_discovery_k8s_lists_total",
                        {"role": "both", "cause": "dropped"}) >= 1, m
    assert metric_value(m, "pdgw_discovery_k8s_errors_total", {"reason": "watch"}) >= 1, m

    # 7. A corrupt watch stream: error counted, last good state kept, re-list.
    wait_for("an open watch", kube.watching)
    lists = kube.count("list")
    kube.kick("garbage")
    wait_for("re-list after a corrupt stream", lambda: kube.count("list") >= lists + 1)
    m = metrics(gport)
    assert metric_value(m, "pdgw_discovery_k8s_errors_total", {"reason": "bad_json"}) >= 1, m
    insts = instances(gport)
    assert set(insts) == {"sim-c", "sim-p"}, insts.keys()
    assert insts["sim-c"]["state"] == "up"

    # 8. Requests follow the pool: everything goes to sim-c now.
    c_before = sim_count(pc)
    for _ in range(3):
        complete(gport)
    assert sim_count(pc) == c_before + 3
    assert gw.alive()

    # 9. Clean shutdown with the watches open: the discovery thread stops,
    #    everything is freed (sanitizer builds report leaks here).
    gw.signal(signal.SIGTERM)
    rc = gw.wait(15)
    out = gw.output()
    assert rc == 0, f"pdgw exited {rc}:\n{out[-3000:]}"
    assert "Sanitizer" not in out, out[-5000:]


if __name__ == "__main__":
    pdgwtest.run([test_k8s_discovery])
