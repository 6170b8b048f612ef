"""The demo overlays really run: sim-1p1d and sim-2p2d are rendered with
`kubectl kustomize` and emulated on 127.0.0.1 — every engine pod of the
rendered Deployments is started with its rendered pdgw-sim arguments (ports
remapped to free ones, $(POD_IP) = 127.0.0.1), every rendered Service becomes
the EndpointSlices Kubernetes would publish for it (labels copied, named
ports), the pods' annotations are served by the fake API server, and pdgw
runs with the overlay's own ConfigMap (only listen and the API server
location changed). Requests through pdgw must give the same text as a single
`both` simulator, and the KV side channel named by the pod annotations must
be the one the decode leg is told to use.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile

import fakekube
import pdgwtest
from fakekube import NAMESPACE, FakeKube
from pdgwtest import Proc, free_port, post_json, request, sse_events, stream_text, wait_http

try:
    import yaml
except ImportError as e:  # python3-yaml (deploy/install-deps.sh)
    raise SystemExit(f"python3-yaml is required: {e}")

K8S_DIR = os.path.join(pdgwtest.SOURCE_DIR, "deploy", "k8s")
PROMPT = "The overlays of pdgw run on a laptop too"


def render(overlay):
    proc = subprocess.run(["kubectl", "kustomize", os.path.join(K8S_DIR, "overlays", overlay)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class Pod:
    def __init__(self, name, workload, remap):
        self.name = name
        self.workload = workload
        self.remap = remap  # rendered containerPort -> local port
        tmpl = workload["spec"]["template"]
        self.labels = tmpl["metadata"].get("labels", {})
        self.annotations = {k: self._map_value(v) for k, v in
                            tmpl["metadata"].get("annotations", {}).items()}
        c = tmpl["spec"]["containers"][0]
        self.port_names = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        self.args = [self._map_arg(a) for a in c.get("args", [])]
        self.proc = None

    def _map_value(self, v):
        parts = str(v).split(",")
        if all(p.strip().isdigit() for p in parts):
            return ",".join(str(self.remap.get(int(p), int(p))) for p in parts)
        return v

    def _map_arg(self, a):
        a = str(a)
        if a in ("$(POD_IP)", "0.0.0.0"):
            return "127.0.0.1"
        if a.isdigit():
            return str(self.remap.get(int(a), int(a)))
        return a

    def port(self, name):
        return self.remap[self.port_names[name]]


def emulate(overlay, kube, tmp):
    """Start the overlay's engine pods; fill <kube>; return (pods, pdgw config path)."""
    objects = render(overlay)
    pods = []
    for w in objects:
        if w["kind"] != "Deployment" or w["metadata"]["name"] == "pdgw":
            continue
        c = w["spec"]["template"]["spec"]["containers"][0]
        for i in range(w["spec"].get("replicas", 1)):
            remap = {p["containerPort"]: free_port() for p in c.get("ports", [])}
            pod = Pod(f"{w['metadata']['name']}-{i}", w, remap)
            assert pod.args[0] == "pdgw-sim", pod.args
            pod.proc = Proc(pod.name, [pdgwtest.binary("pdgw-sim")] + pod.args[1:])
            kube.pods[pod.name] = pod.annotations
            pods.append(pod)
    for pod in pods:
        wait_http(pod.port("http"), "/health", proc=pod.proc)
    # EndpointSlices as the endpoint-slice controller would publish them: one
    # per pod here, since every emulated pod listens on its own ports.
    for svc in (o for o in objects if o["kind"] == "Service"):
        selected = [p for p in pods if matches(svc["spec"].get("selector", {}), p.labels)]
        for pod in selected:
            labels = dict(svc["metadata"].get("labels", {}))
            labels["kubernetes.io/service-name"] = svc["metadata"]["name"]
            kube.put({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": f"{svc['metadata']['name']}-{pod.name}",
                             "namespace": NAMESPACE, "labels": labels},
                "addressType": "IPv4",
                "ports": [{"name": sp["name"], "protocol": "TCP",
                           "port": pod.port(sp["targetPort"])}
                          for sp in svc["spec"]["ports"]],
                "endpoints": [{"addresses": ["127.0.0.1"],
                               "conditions": {"ready": True, "serving": True,
                                              "terminating": False},
                               "targetRef": {"kind": "Pod", "name": pod.name,
                                             "namespace": NAMESPACE}}],
            })
    # The overlay's own gateway config, pointed at this machine.
    cm = next(o for o in objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("pdgw-config"))
    cfg = yaml.safe_load(cm["data"]["pdgw.yaml"])
    return pods, cfg


def run_gateway(cfg, kport, tmp):
    gport = free_port()
    cfg = json.loads(json.dumps(cfg))
    cfg["listen"] = f"127.0.0.1:{gport}"
    cfg["workers"] = 1
    k = cfg["discovery"]["kubernetes"]
    k["api_server"] = f"http://127.0.0.1:{kport}"
    k["token_file"] = os.path.join(tmp, "token")
    k["ca_file"] = os.path.join(tmp, "ca.crt")
    path = os.path.join(tmp, "pdgw.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    env = {k: "" for k in os.environ if k.startswith("PDGW_") and k not in
           ("PDGW_BIN_DIR", "PDGW_SOURCE_DIR", "PDGW_BUILD_DIR")}
    gw = Proc("pdgw", [pdgwtest.binary("pdgw"), "--config", path], env=env)
    wait_http(gport, "/ready", proc=gw, timeout=20)
    return gw, gport


def reference_text(max_tokens, stream=False):
    port = free_port()
    ref = Proc("reference", [pdgwtest.binary("pdgw-sim"), "--role", "both", "--port", str(port)])
    try:
        wait_http(port, "/health", proc=ref)
        body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens}
        status, _, obj, raw = post_json(port, "/v1/completions", body)
        assert status == 200, raw
        return obj["choices"][0]["text"]
    finally:
        ref.kill()


def decode_params(pods):
    """kv_transfer_params of every completion the decode pods received."""
    out = []
    for pod in pods:
        if pod.labels.get("app.kubernetes.io/component") != "decode":
            continue
        status, _, body = request("GET", pod.port("http"), "/sim/requests")
        assert status == 200
        for r in json.loads(body)["requests"]:
            if r["path"] == "/v1/completions":
                out.append((pod.name, (r.get("body") or {}).get("kv_transfer_params") or {}))
    return out


def prefill_requests(pods):
    n = 0
    for pod in pods:
        if pod.labels.get("app.kubernetes.io/component") == "prefill":
            status, _, body = request("GET", pod.port("http"), "/sim/requests")
            n += sum(1 for r in json.loads(body)["requests"] if r["path"] == "/v1/completions")
    return n


def check_overlay(overlay, n_requests):
    kube = FakeKube()
    server, kport = fakekube.start(kube)
    tmp = tempfile.mkdtemp(prefix=f"pdgw-{overlay}.")
    try:
        fakekube.write_service_account(tmp)
        pods, cfg = emulate(overlay, kube, tmp)
        gw, gport = run_gateway(cfg, kport, tmp)
        insts = json.loads(request("GET", gport, "/admin/instances")[2])
        assert sorted(i["id"] for i in insts) == sorted(p.name for p in pods), insts
        kv_ports = {p.name: int(p.annotations["pdgw.io/kv-port"]) for p in pods
                    if p.labels.get("app.kubernetes.io/component") == "prefill"}
        for i in insts:
            if i["role"] == "prefill":
                assert i["kv_port"] == kv_ports[i["id"]], i

        want = reference_text(8)
        for _ in range(n_requests):
            status, _, obj, raw = post_json(gport, "/v1/completions",
                                            {"model": "sim-model", "prompt": PROMPT,
                                             "max_tokens": 8})
            assert status == 200, raw[:400]
            assert obj["choices"][0]["text"] == want, (obj, want)
        events = list(sse_events(gport, "/v1/completions",
                                 {"model": "sim-model", "prompt": PROMPT, "max_tokens": 8,
                                  "stream": True}))
        assert events[-1] == "[DONE]", events[-3:]
        assert stream_text(events) == want

        # Each decode leg was pointed at a prefill KV side channel from the
        # pod annotations (remapped ports), at the pod's address.
        params = decode_params(pods)
        assert len(params) == n_requests + 1, params
        for name, p in params:
            assert p.get("remote_host") == "127.0.0.1", p
            assert p.get("remote_port") in kv_ports.values(), (p, kv_ports)
        if cfg.get("scheduling") == "staged":
            assert prefill_requests(pods) == n_requests + 1
        gw.signal(signal.SIGTERM)
        assert gw.wait(20) == 0, gw.output()[-3000:]
    finally:
        fakekube.stop(kube, server)
        shutil.rmtree(tmp, ignore_errors=True)


def test_sim_1p1d():
    check_overlay("sim-1p1d", 3)


def test_sim_2p2d():
    check_overlay("sim-2p2d", 6)


if __name__ == "__main__":
    pdgwtest.run([test_sim_1p1d, test_sim_2p2d])
