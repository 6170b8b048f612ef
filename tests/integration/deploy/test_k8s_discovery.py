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
import tempfile
import time

import fakekube
import pdgwtest
from fakekube import NAMESPACE, FakeKube
from pdgwtest import Proc, free_port, metric_value, post_json, request, wait_http

SELECTOR_LABELS = {"pdgw.io/pool": "kdisc"}


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
    server, kport = fakekube.start(kube)
    tmp = tempfile.mkdtemp(prefix="pdgw-k8s.")
    try:
        _run(kube, kport, tmp)
    finally:
        fakekube.stop(kube, server)
        shutil.rmtree(tmp, ignore_errors=True)


def _run(kube, kport, tmp):
    # Service-account files: token, namespace (discovery reads the namespace
    # beside the token when the config leaves it empty), CA (unused over http).
    fakekube.write_service_account(tmp)
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


def test_k8s_discovery_tls():
    """https API server: the CA file is used, and a wrong CA keeps every
    instance out (the list fails and is counted) until the right one is there."""
    kube = FakeKube()
    tmp = tempfile.mkdtemp(prefix="pdgw-k8s-tls.")
    server = None
    try:
        cert, key = fakekube.make_cert(tmp, "apiserver")
        other, _ = fakekube.make_cert(tmp, "other")
        server, kport = fakekube.start(kube, tls=(cert, key))
        fakekube.write_service_account(tmp)
        sport = free_port()
        sim = Proc("sim-tls", [pdgwtest.binary("pdgw-sim"), "--role", "both", "--port",
                               str(sport), "--zero-delay"])
        wait_http(sport, "/health", proc=sim)
        kube.pods["sim-tls"] = {}
        kube.put(slice_obj("engine-both-tls", "both", sport, pod="sim-tls"))
        ca = os.path.join(tmp, "ca.crt")
        shutil.copy(other, ca)  # wrong CA first

        gport = free_port()
        cfg = os.path.join(tmp, "pdgw.yaml")
        with open(cfg, "w") as f:
            f.write(f"""listen: "127.0.0.1:{gport}"
protocol: neutral
workers: 1
discovery:
  kubernetes:
    namespace: {NAMESPACE}
    both_selector: "pdgw.io/role=both,pdgw.io/pool=kdisc"
    api_server: "https://127.0.0.1:{kport}"
    token_file: "{tmp}/token"
    ca_file: "{ca}"
""")
        gw = Proc("pdgw", [pdgwtest.binary("pdgw"), "--config", cfg])
        wait_http(gport, "/health", proc=gw)
        wait_for("a failed list", lambda: (metric_value(metrics(gport),
                                                        "pdgw_discovery_k8s_errors_total",
                                                        {"reason": "list"}) or 0) >= 1)
        assert instances(gport) == {}
        assert kube.count("list") == 0  # the TLS handshake failed before any request

        # The CA is read per request: the right one lets the next re-list in.
        shutil.copy(cert, ca + ".new")
        os.rename(ca + ".new", ca)
        wait_for("sim-tls up over https",
                 lambda: instances(gport).get("sim-tls", {}).get("state") == "up", timeout=40)
        complete(gport)
        gw.signal(signal.SIGTERM)
        assert gw.wait(15) == 0, gw.output()[-3000:]
    finally:
        if server is not None:
            fakekube.stop(kube, server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    pdgwtest.run([test_k8s_discovery, test_k8s_discovery_tls])
