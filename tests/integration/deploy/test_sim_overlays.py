"""Every overlay really runs, emulated on 127.0.0.1: it is rendered with
`kubectl kustomize`; every engine pod of the rendered Deployments is started
as a local pdgw-sim (ports remapped to free ones, $(POD_IP) = 127.0.0.1) —
with its rendered arguments for the sim overlays, and for vllm-nixl, sglang
and lmcache as a stand-in whose flags are read from the rendered engine
(vLLM/SGLang arguments, NIXL side-channel env, the LMCache config file in its
ConfigMap); every rendered Service becomes the EndpointSlices Kubernetes
would publish for it (labels copied, named ports); the pods' annotations are
served by the fake API server; pdgw runs with the overlay's own ConfigMap
(only listen and the API server location changed). Requests through pdgw
must give the same text as a single `both` simulator, and the KV endpoints
the legs carry must be the ones the overlay's annotations / configs name —
so a port that disagrees between engine config, annotation and gateway
config breaks the request.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

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
    def __init__(self, name, workload, remap, args):
        self.name = name
        self.workload = workload
        self.remap = remap  # rendered port number -> local port
        tmpl = workload["spec"]["template"]
        self.labels = tmpl["metadata"].get("labels", {})
        self.role = self.labels.get("app.kubernetes.io/component")
        self.annotations = {k: self._map_value(v) for k, v in
                            tmpl["metadata"].get("annotations", {}).items()}
        c = tmpl["spec"]["containers"][0]
        self.port_names = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        self.args = [self._map_arg(a) for a in args]
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


def _flag(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def _lmcache_config(workload, objects):
    """The LMCache config file of an engine pod, read from its ConfigMap."""
    c = workload["spec"]["template"]["spec"]["containers"][0]
    path = next(e["value"] for e in c["env"] if e["name"] == "LMCACHE_CONFIG_FILE")
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    vol = next(v for v in workload["spec"]["template"]["spec"]["volumes"]
               if v["name"] == mount["name"])
    cm = next(o for o in objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == vol["configMap"]["name"])
    return yaml.safe_load(cm["data"][path.rsplit("/", 1)[1]])


def served_model(overlay, workload):
    """The model name the engine serves (what clients put in "model")."""
    c = workload["spec"]["template"]["spec"]["containers"][0]
    args = [str(a) for a in c.get("args") or []]
    if overlay.startswith("sim-"):
        return _flag(args, "--model") or "sim-model"
    if overlay == "sglang":
        return _flag(args, "--model-path")
    return args[0]  # vllm serve <model>


def sim_args(overlay, workload, objects, gw_remap):
    """pdgw-sim arguments for one engine pod (rendered port numbers)."""
    c = workload["spec"]["template"]["spec"]["containers"][0]
    role = workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    args = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
    if overlay.startswith("sim-"):
        return [str(a) for a in c["args"]]
    out = ["pdgw-sim", "--role", role, "--host", "0.0.0.0", "--kv-host", "$(POD_IP)",
           "--model", served_model(overlay, workload), "--port", _flag(args, "--port")]
    if overlay == "vllm-nixl":
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        out += ["--kv-port", env["VLLM_NIXL_SIDE_CHANNEL_PORT"]]
    elif overlay == "sglang":
        if role == "prefill":
            out += ["--bootstrap-port", _flag(args, "--disaggregation-bootstrap-port")]
    elif overlay == "lmcache":
        lc = _lmcache_config(workload, objects)
        if lc["pd_role"] == "receiver":
            out += ["--init-port", ",".join(map(str, lc["pd_peer_init_port"])),
                    "--alloc-port", ",".join(map(str, lc["pd_peer_alloc_port"]))]
        else:
            # pd_proxy_host names the gateway Service: here, the local pdgw.
            out += ["--proxy-host", "127.0.0.1",
                    "--proxy-port", str(gw_remap[int(lc["pd_proxy_port"])])]
    return out


def emulate(overlay, kube, tmp):
    """Start the overlay's engine pods; fill <kube>; return (pods, gateway config)."""
    objects = render(overlay)
    cm = next(o for o in objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("pdgw-config"))
    cfg = yaml.safe_load(cm["data"]["pdgw.yaml"])
    # Ports the gateway itself listens on besides HTTP (lmcache ProxyNotif).
    gw = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "pdgw")
    gw_remap = {p["containerPort"]: free_port()
                for p in gw["spec"]["template"]["spec"]["containers"][0]["ports"]
                if p["name"] != "http"}
    opts = cfg.get("protocol_options") or {}
    if "proxy_port" in opts:
        opts["proxy_port"] = gw_remap[int(opts["proxy_port"])]
        opts["proxy_host"] = "127.0.0.1"
    if "notif_relay_port" in opts:
        # one emulated replica: its relay port remapped, its peer Service resolves to nobody
        opts["notif_relay_port"] = gw_remap[int(opts["notif_relay_port"])]
    pods = []
    for w in objects:
        if w["kind"] != "Deployment" or w["metadata"]["name"] == "pdgw":
            continue
        c = w["spec"]["template"]["spec"]["containers"][0]
        for i in range(w["spec"].get("replicas", 1)):
            remap = {p["containerPort"]: free_port() for p in c.get("ports", [])}
            pod = Pod(f"{w['metadata']['name']}-{i}", w, remap,
                      sim_args(overlay, w, objects, gw_remap))
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
    models = {served_model(overlay, p.workload) for p in pods}
    assert len(models) == 1, f"prefill and decode serve different models: {models}"
    return pods, cfg, models.pop()


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


def reference_text(model, max_tokens):
    port = free_port()
    ref = Proc("reference", [pdgwtest.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                             "--model", model])
    try:
        wait_http(port, "/health", proc=ref)
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens}
        status, _, obj, raw = post_json(port, "/v1/completions", body)
        assert status == 200, raw
        return obj["choices"][0]["text"]
    finally:
        ref.kill()


def leg_bodies(pods, role):
    """(pod, body) of every completion the pods of <role> received."""
    out = []
    for pod in pods:
        if pod.role != role:
            continue
        status, _, body = request("GET", pod.port("http"), "/sim/requests")
        assert status == 200
        for r in json.loads(body)["requests"]:
            if r["path"] == "/v1/completions":
                out.append((pod, r.get("body") or {}))
    return out


def _ports(value):
    return [int(p) for p in str(value).split(",")]


def check_wiring(protocol, pods, n):
    """The KV endpoints on the legs are the ones the overlay names."""
    prefills = [p for p in pods if p.role == "prefill"]
    decodes = [p for p in pods if p.role == "decode"]
    dlegs, plegs = leg_bodies(pods, "decode"), leg_bodies(pods, "prefill")
    assert len(dlegs) == n, dlegs
    if protocol == "vllm-kvt":
        # Side channel from the pdgw.io/kv-port annotation of a prefill pod.
        kv = {int(p.annotations["pdgw.io/kv-port"]) for p in prefills}
        for _, b in dlegs:
            params = b.get("kv_transfer_params") or {}
            assert params.get("remote_host") == "127.0.0.1", params
            assert params.get("remote_port") in kv, (params, kv)
    elif protocol == "vllm-nixl":
        # Prefill returns its NIXL side channel; decode is sent there.
        side = {p.port("nixl") for p in prefills}
        assert len(plegs) == n, plegs
        for _, b in plegs:
            assert (b.get("kv_transfer_params") or {}).get("do_remote_decode") is True, b
        for _, b in dlegs:
            params = b.get("kv_transfer_params") or {}
            assert params.get("do_remote_prefill") is True, params
            assert params.get("remote_port") in side, (params, side)
    elif protocol == "sglang":
        # Bootstrap port from the sglang.ai/bootstrap-port annotation.
        boot = {int(p.annotations["sglang.ai/bootstrap-port"]) for p in prefills}
        assert len(plegs) == n, plegs
        for _, b in dlegs + plegs:
            assert b.get("bootstrap_host") == "127.0.0.1", b
            assert b.get("bootstrap_port") in boot, (b, boot)
            assert isinstance(b.get("bootstrap_room"), int), b
    elif protocol == "lmcache":
        # Receiver ports from the decode pods' pdgw.io/init-ports / alloc-ports.
        recv = {(tuple(_ports(p.annotations["pdgw.io/init-ports"])),
                 tuple(_ports(p.annotations["pdgw.io/alloc-ports"]))) for p in decodes}
        assert len(plegs) == n, plegs
        for _, b in plegs:
            spec = (b.get("kv_transfer_params") or {}).get("disagg_spec") or {}
            assert spec.get("receiver_host") == "127.0.0.1", spec
            got = (tuple(spec.get("receiver_init_port", [])),
                   tuple(spec.get("receiver_alloc_port", [])))
            assert got in recv, (spec, recv)
    else:
        raise AssertionError(f"no wiring check for protocol {protocol}")


def readme_requests(overlay):
    """The (path, JSON body) of every `curl ... localhost:8000/v1/... -d '{...}'` in the
    overlay's README: what a reader pastes must work against the emulated overlay."""
    with open(os.path.join(K8S_DIR, "overlays", overlay, "README.md")) as f:
        text = f.read().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        m = re.search(r"curl\s.*localhost:\d+(/v1/\S+).*-d\s+'(\{.*\})'", line)
        if m:
            out.append((m.group(1), json.loads(m.group(2))))
    return out


def check_overlay(overlay, n_requests):
    kube = FakeKube()
    server, kport = fakekube.start(kube)
    tmp = tempfile.mkdtemp(prefix=f"pdgw-{overlay}.")
    try:
        fakekube.write_service_account(tmp)
        pods, cfg, model = emulate(overlay, kube, tmp)
        gw, gport = run_gateway(cfg, kport, tmp)
        # /ready needs one instance per role; wait for every pod to join.
        want_ids = sorted(p.name for p in pods)
        deadline = time.time() + 15
        while True:
            insts = json.loads(request("GET", gport, "/admin/instances")[2])
            if sorted(i["id"] for i in insts) == want_ids or time.time() > deadline:
                break
            time.sleep(0.05)
        assert sorted(i["id"] for i in insts) == want_ids, insts
        assert all(i["state"] == "up" and i["source"] == "kubernetes" for i in insts), insts

        want = reference_text(model, 8)
        body = {"model": model, "prompt": PROMPT, "max_tokens": 8}
        for _ in range(n_requests):
            status, _, obj, raw = post_json(gport, "/v1/completions", body)
            assert status == 200, raw[:400]
            assert obj["choices"][0]["text"] == want, (obj, want)
        events = list(sse_events(gport, "/v1/completions", dict(body, stream=True)))
        assert events[-1] == "[DONE]", events[-3:]
        assert stream_text(events) == want
        for path, rbody in readme_requests(overlay):
            status, _, _, raw = post_json(gport, path, rbody)
            assert status == 200, f"README curl of {overlay} ({path} {rbody}): {raw[:300]}"
            n_requests += 1
        check_wiring(cfg["protocol"], pods, n_requests + 1)
        gw.signal(signal.SIGTERM)
        assert gw.wait(20) == 0, gw.output()[-3000:]
    finally:
        fakekube.stop(kube, server)
        shutil.rmtree(tmp, ignore_errors=True)


def test_sim_1p1d():
    assert readme_requests("sim-1p1d"), "the sim-1p1d README shows no request"
    check_overlay("sim-1p1d", 3)


def test_sim_2p2d():
    check_overlay("sim-2p2d", 6)


def test_vllm_nixl():
    check_overlay("vllm-nixl", 3)


def test_sglang():
    check_overlay("sglang", 3)


def test_lmcache():
    check_overlay("lmcache", 3)


if __name__ == "__main__":
    pdgwtest.skip_unless_tools(
        "kubectl", why="the overlays are rendered with `kubectl kustomize` and Debian 12 has no "
        "recent kubectl (install it from the Kubernetes project to run this test)")
    pdgwtest.run([test_sim_1p1d, test_sim_2p2d, test_vllm_nixl, test_sglang, test_lmcache])
