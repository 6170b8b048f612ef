"""Offline validation of deploy/k8s: every overlay renders with
`kubectl kustomize`, every rendered object validates against the Kubernetes
schemas (npm package kubernetes-models, installed by this test into the build
directory), the deployment rules hold (probes, security context, drain timing,
RBAC, selectors that really select), and the pdgw config of every ConfigMap
passes `pdgw --check-config`. A broken copy of an overlay, made in a temp
dir, proves each layer rejects what it should.

Needs: kubectl (without it: one SKIP line, pass), node + npm (the npm registry is contacted once; the install
is cached in <build>/node-validate), python3-yaml, the pdgw binary.
"""

import copy
import json
import os
import re
import shutil
import subprocess
import tempfile

import pdgwtest

try:
    import yaml
except ImportError as e:  # python3-yaml (deploy/install-deps.sh)
    raise SystemExit(f"python3-yaml is required: {e}")

SRC = pdgwtest.SOURCE_DIR
K8S_DIR = os.path.join(SRC, "deploy", "k8s")
BUILD_DIR = os.environ.get("PDGW_BUILD_DIR", os.getcwd())
NODE_DIR = os.path.join(BUILD_DIR, "node-validate")
VALIDATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_validate.js")
KUBERNETES_MODELS = "kubernetes-models@4.5.1"
OVERLAYS = ["sim-1p1d", "sim-2p2d", "vllm-nixl", "sglang", "lmcache"]

# What each overlay must configure (protocol of the gateway; engine flavour).
EXPECT = {
    "sim-1p1d": {"protocol": "vllm-kvt", "engines": 2},
    "sim-2p2d": {"protocol": "vllm-kvt", "engines": 4},
    "vllm-nixl": {"protocol": "vllm-nixl", "engines": 2},
    "sglang": {"protocol": "sglang", "engines": 2},
    "lmcache": {"protocol": "lmcache", "engines": 2},
}


class ValidationError(AssertionError):
    pass


# ---------------------------------------------------------------- tooling


def _need(cmd):
    path = shutil.which(cmd)
    if path is None:
        raise AssertionError(f"{cmd} not found in PATH (deploy/install-deps.sh installs it)")
    return path


def node_modules():
    """Install kubernetes-models once per build dir; fail clearly without npm access."""
    marker = os.path.join(NODE_DIR, "node_modules", "kubernetes-models", "package.json")
    if os.path.exists(marker):
        return os.path.join(NODE_DIR, "node_modules")
    _need("node")
    npm = _need("npm")
    os.makedirs(BUILD_DIR, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="node-validate.", dir=BUILD_DIR)
    try:
        proc = subprocess.run([npm, "install", "--prefix", staging, "--no-audit", "--no-fund",
                               "--no-save", "--loglevel=error", KUBERNETES_MODELS],
                              capture_output=True, text=True, timeout=240)
        if proc.returncode != 0 or not os.path.exists(
                os.path.join(staging, "node_modules", "kubernetes-models", "package.json")):
            raise AssertionError(
                f"cannot install {KUBERNETES_MODELS} from the npm registry (needed to validate "
                f"manifests; is the registry reachable?):\n{proc.stdout}\n{proc.stderr}")
        if os.path.exists(NODE_DIR):
            shutil.rmtree(NODE_DIR)
        os.rename(staging, NODE_DIR)
        staging = None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return os.path.join(NODE_DIR, "node_modules")


def render(overlay_dir):
    """kubectl kustomize → list of objects (raises ValidationError on failure)."""
    proc = subprocess.run([_need("kubectl"), "kustomize", overlay_dir], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        raise ValidationError(f"kubectl kustomize {overlay_dir} failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d is not None]


def schema_errors(objects):
    """Errors of kubernetes-models validation (schema + unknown fields)."""
    proc = subprocess.run([_need("node"), VALIDATOR, node_modules()], input=json.dumps(objects),
                          capture_output=True, text=True, timeout=120)
    if proc.returncode not in (0, 1):
        raise AssertionError(f"validator failed to run: {proc.stderr}")
    result = json.loads(proc.stdout)
    assert result["checked"] == len(objects), result
    return [f"{e['kind']}/{e['name']}: {e['message']}" for e in result["errors"]]


def check_config(text):
    """Run pdgw --check-config on a config text; returns (ok, output)."""
    pdgw = pdgwtest.binary("pdgw")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        proc = subprocess.run([pdgw, "--check-config", path], capture_output=True, text=True,
                              timeout=30, env={k: v for k, v in os.environ.items()
                                               if not k.startswith("PDGW_")})
        return proc.returncode == 0, (proc.stdout + proc.stderr).strip()
    finally:
        os.unlink(path)


# ------------------------------------------------------- deployment rules


def duration_s(v):
    if isinstance(v, (int, float)):
        return float(v)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(v))
    if not m:
        raise ValidationError(f"bad duration {v!r}")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    return float(m.group(1)) * scale


def parse_selector(sel):
    out = {}
    for part in sel.split(","):
        k, eq, v = part.strip().partition("=")
        if not eq:
            raise ValidationError(f"selector {sel!r}: only key=value terms are used here")
        out[k.strip()] = v.strip()
    return out


def by_kind(objects, kind):
    return [o for o in objects if o.get("kind") == kind]


def pod_templates(objects):
    return [o for o in objects if o.get("kind") in ("Deployment", "StatefulSet", "DaemonSet")]


def is_engine(w):
    """Neither the gateway nor a store it uses (components/quota-redis's Redis)."""
    labels = w["spec"]["template"]["metadata"].get("labels", {})
    return (w["metadata"]["name"] != "pdgw" and
            labels.get("app.kubernetes.io/component") != "quota-store")


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def semantic_errors(name, objects):
    """The rules of the issue and of common sense, as a list of messages."""
    errs = []
    cms = {o["metadata"]["name"]: o for o in by_kind(objects, "ConfigMap")}
    services = by_kind(objects, "Service")
    workloads = pod_templates(objects)
    sas = {o["metadata"]["name"] for o in by_kind(objects, "ServiceAccount")}

    for w in workloads:
        wname = w["metadata"]["name"]
        tmpl = w["spec"]["template"]
        labels = tmpl["metadata"].get("labels", {})
        if not matches(w["spec"]["selector"].get("matchLabels", {}), labels):
            errs.append(f"{wname}: selector does not match its pod template labels")
        pod = tmpl["spec"]
        sa = pod.get("serviceAccountName")
        if sa and sa not in sas:
            errs.append(f"{wname}: serviceAccountName {sa} not defined")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for v in vols.values():
            ref = (v.get("configMap") or {}).get("name")
            if ref and ref not in cms:
                errs.append(f"{wname}: volume {v['name']} refers to missing ConfigMap {ref}")
        for c in pod.get("containers", []):
            ports = {p.get("name") for p in c.get("ports", []) if p.get("name")}
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    errs.append(f"{wname}/{c.get('name')}: mount of undefined volume {m['name']}")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    errs.append(f"{wname}/{c.get('name')}: {probe} uses unknown port {port}")
            if "resources" not in c or not c["resources"].get("requests") \
                    or not c["resources"].get("limits"):
                errs.append(f"{wname}/{c.get('name')}: resources requests and limits required")

    for s in services:
        sel = s["spec"].get("selector", {})
        pods = [w for w in workloads if matches(sel, w["spec"]["template"]["metadata"]
                                                .get("labels", {}))]
        if not pods:
            errs.append(f"Service {s['metadata']['name']}: selector matches no workload")
            continue
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort")
            if isinstance(tp, str):
                names = {cp.get("name") for w in pods
                         for c in w["spec"]["template"]["spec"]["containers"]
                         for cp in c.get("ports", [])}
                if tp not in names:
                    errs.append(f"Service {s['metadata']['name']}: targetPort {tp} not a "
                                f"container port name")

    # RBAC: read-only, endpointslices (+ pods) only.
    for r in by_kind(objects, "Role") + by_kind(objects, "ClusterRole"):
        for rule in r.get("rules", []):
            if set(rule.get("verbs", [])) - {"get", "list", "watch"}:
                errs.append(f"Role {r['metadata']['name']}: verbs beyond get/list/watch")
            allowed = {("discovery.k8s.io", "endpointslices"), ("", "pods")}
            for g in rule.get("apiGroups", []):
                for res in rule.get("resources", []):
                    if (g, res) not in allowed:
                        errs.append(f"Role {r['metadata']['name']}: access to {g}/{res}")

    # The gateway.
    gws = [w for w in workloads if w["metadata"]["name"] == "pdgw"]
    if len(gws) != 1:
        return errs + ["exactly one gateway Deployment 'pdgw' expected"]
    gw = gws[0]
    pod = gw["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    ann = gw["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/path") != "/metrics":
        errs.append("gateway: Prometheus scrape annotations missing")
    if (ctr.get("readinessProbe") or {}).get("httpGet", {}).get("path") != "/ready":
        errs.append("gateway: readiness probe must GET /ready")
    if (ctr.get("livenessProbe") or {}).get("httpGet", {}).get("path") != "/health":
        errs.append("gateway: liveness probe must GET /health")
    psc, csc = pod.get("securityContext", {}), ctr.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        errs.append("gateway: runAsNonRoot not set")
    if not csc.get("readOnlyRootFilesystem"):
        errs.append("gateway: readOnlyRootFilesystem not set")
    if csc.get("allowPrivilegeEscalation") is not False:
        errs.append("gateway: allowPrivilegeEscalation must be false")
    if not pod.get("serviceAccountName"):
        errs.append("gateway: no serviceAccountName (discovery needs the token)")
    pre = ((ctr.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
    if len(pre) != 2 or pre[0] != "sleep":
        errs.append("gateway: preStop must be ['sleep', N]")
        pre_s = 0.0
    else:
        pre_s = float(pre[1])
    cfg_vol = next((v for v in pod.get("volumes", []) if v.get("configMap")), None)
    cfg_cm = cms.get((cfg_vol or {}).get("configMap", {}).get("name"))
    if cfg_cm is None or "pdgw.yaml" not in cfg_cm.get("data", {}):
        return errs + ["gateway: no ConfigMap with pdgw.yaml mounted"]
    args = ctr.get("args", [])
    if "--config" not in args or args[args.index("--config") + 1] != "/etc/pdgw/pdgw.yaml":
        errs.append("gateway: must run with --config /etc/pdgw/pdgw.yaml")
    cfg = yaml.safe_load(cfg_cm["data"]["pdgw.yaml"])
    drain = duration_s(cfg.get("drain_timeout", "30s"))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < pre_s + drain:
        errs.append(f"gateway: terminationGracePeriodSeconds {grace} < preStop {pre_s} + "
                    f"drain_timeout {drain}")
    if grace > pre_s + drain + 30:
        errs.append(f"gateway: terminationGracePeriodSeconds {grace} far above the drain")
    pdbs = [p for p in by_kind(objects, "PodDisruptionBudget")
            if matches(p["spec"]["selector"]["matchLabels"],
                       gw["spec"]["template"]["metadata"]["labels"])]
    if not pdbs:
        errs.append("gateway: no PodDisruptionBudget selects it")
    for pdb in pdbs:
        # An engine outage makes every gateway pod unready (/ready): such pods must stay
        # evictable or the budget blocks node drains.
        if pdb["spec"].get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
            errs.append("gateway PodDisruptionBudget: unhealthyPodEvictionPolicy must be "
                        "AlwaysAllow (unready gateways must not block drains)")
        if "minAvailable" in pdb["spec"]:
            errs.append("gateway PodDisruptionBudget: use maxUnavailable (minAvailable blocks "
                        "the only replica of a single-replica gateway forever)")
    for hpa in by_kind(objects, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        if ref.get("kind") != "Deployment" or ref.get("name") != "pdgw":
            errs.append(f"HPA {hpa['metadata']['name']}: must scale Deployment pdgw")
        if cfg.get("protocol") == "lmcache" and not (cfg.get("protocol_options") or {}).get(
                "notif_relay_peers"):
            errs.append("HPA on an lmcache gateway without notif_relay_peers: ProxyNotif "
                        "reaches one replica only")
        if hpa["spec"].get("minReplicas", 1) < 2:
            errs.append("HPA: minReplicas < 2 leaves no replica during a voluntary eviction")
        if any(m.get("type") == "Resource" for m in hpa["spec"].get("metrics", [])) and \
                not (ctr.get("resources") or {}).get("requests", {}).get("cpu"):
            errs.append("HPA on CPU utilization needs a CPU request on the gateway")
    if name == "base" and gw["spec"].get("replicas") != 2:
        errs.append("gateway: base runs 2 replicas")

    # Discovery selectors must select engine Services that name the port.
    k8s = (cfg.get("discovery") or {}).get("kubernetes") or {}
    port_name = k8s.get("port_name", "http")
    if name in EXPECT:
        exp = EXPECT[name]
        if cfg.get("protocol") != exp["protocol"]:
            errs.append(f"gateway protocol {cfg.get('protocol')} != {exp['protocol']}")
        engines = sum(w["spec"].get("replicas", 1) for w in workloads if is_engine(w))
        if engines != exp["engines"]:
            errs.append(f"{engines} engine replicas, expected {exp['engines']}")
        for role in ("prefill", "decode"):
            sel = k8s.get(f"{role}_selector")
            if not sel:
                errs.append(f"discovery.kubernetes.{role}_selector empty")
                continue
            want = parse_selector(sel)
            hits = [s for s in services if matches(want, s["metadata"].get("labels", {}))]
            if not hits:
                errs.append(f"{role}_selector {sel!r} selects no Service")
            for s in hits:
                if port_name not in {p.get("name") for p in s["spec"].get("ports", [])}:
                    errs.append(f"Service {s['metadata']['name']} has no port {port_name}")
                if s["spec"].get("clusterIP") != "None":
                    errs.append(f"Service {s['metadata']['name']}: engines use headless "
                                f"Services")
    errs += engine_errors(name, objects, cfg, cms)
    return errs


def _args(c):
    return [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]


def _flag(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def engine_errors(name, objects, cfg, cms):
    """Protocol-specific wiring of the engine pods."""
    errs = []
    for w in pod_templates(objects):
        if not is_engine(w):
            continue
        wname = w["metadata"]["name"]
        meta = w["spec"]["template"]["metadata"]
        pod = w["spec"]["template"]["spec"]
        c = pod["containers"][0]
        args = _args(c)
        ann = meta.get("annotations", {})
        role = meta.get("labels", {}).get("app.kubernetes.io/component")
        env = {e["name"]: e for e in c.get("env", [])}
        res = c.get("resources", {}).get("limits", {})
        gpu = name in ("vllm-nixl", "sglang", "lmcache")
        if gpu:
            if "nvidia.com/gpu" not in res or not any(k.startswith("rdma/") for k in res):
                errs.append(f"{wname}: GPU and RDMA resources required")
            ib = [v for v in pod.get("volumes", [])
                  if (v.get("hostPath") or {}).get("path") == "/dev/infiniband"]
            if not ib:
                errs.append(f"{wname}: /dev/infiniband hostPath missing")
            if "IPC_LOCK" not in (c.get("securityContext", {}).get("capabilities", {})
                                  .get("add", [])):
                errs.append(f"{wname}: IPC_LOCK capability needed to register memory")
        if name in ("vllm-nixl", "lmcache"):
            raw = _flag(args, "--kv-transfer-config")
            try:
                ktc = json.loads(raw or "")
            except ValueError:
                errs.append(f"{wname}: --kv-transfer-config is not JSON: {raw!r}")
                continue
            want = "NixlConnector" if name == "vllm-nixl" else "LMCacheConnectorV1"
            if ktc.get("kv_connector") != want:
                errs.append(f"{wname}: kv_connector {ktc.get('kv_connector')} != {want}")
            if name == "vllm-nixl":
                if ktc.get("kv_role") != "kv_both":
                    errs.append(f"{wname}: NixlConnector kv_role must be kv_both")
                for var in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
                    if var not in env:
                        errs.append(f"{wname}: {var} missing")
            else:
                want_role = "kv_producer" if role == "prefill" else "kv_consumer"
                if ktc.get("kv_role") != want_role:
                    errs.append(f"{wname}: kv_role {ktc.get('kv_role')} != {want_role}")
                errs += lmcache_errors(wname, role, pod, c, env, ann, cfg, cms)
        kvev = _flag(args, "--kv-events-config")
        if kvev is not None:
            errs += kv_events_errors(wname, kvev, ann, c)
        if name == "sglang":
            if _flag(args, "--disaggregation-mode") != role:
                errs.append(f"{wname}: --disaggregation-mode must be {role}")
            if role == "prefill":
                bp = _flag(args, "--disaggregation-bootstrap-port")
                if bp is None or ann.get("sglang.ai/bootstrap-port") != bp:
                    errs.append(f"{wname}: sglang.ai/bootstrap-port annotation must equal "
                                f"--disaggregation-bootstrap-port ({bp})")
        if name.startswith("sim-"):
            if args[:1] != ["pdgw-sim"] or _flag(args, "--role") != role:
                errs.append(f"{wname}: must run pdgw-sim --role {role}")
            if cfg.get("protocol") == "vllm-kvt" and role == "prefill" and \
                    "pdgw.io/kv-port" not in ann:
                errs.append(f"{wname}: vllm-kvt prefill needs the pdgw.io/kv-port annotation")
    return errs


def lmcache_errors(wname, role, pod, c, env, ann, cfg, cms):
    errs = []
    path = (env.get("LMCACHE_CONFIG_FILE") or {}).get("value")
    if not path:
        return [f"{wname}: LMCACHE_CONFIG_FILE not set"]
    mount = next((m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"] + "/")),
                 None)
    vol = next((v for v in pod.get("volumes", []) if mount and v["name"] == mount["name"]), None)
    cm = cms.get(((vol or {}).get("configMap") or {}).get("name"))
    key = path.rsplit("/", 1)[1]
    if cm is None or key not in cm.get("data", {}):
        return [f"{wname}: LMCache config {path} is not backed by a ConfigMap key"]
    lc = yaml.safe_load(cm["data"][key])
    if lc.get("enable_pd") is not True:
        errs.append(f"{wname}: enable_pd must be true")
    want = "sender" if role == "prefill" else "receiver"
    if lc.get("pd_role") != want:
        errs.append(f"{wname}: pd_role {lc.get('pd_role')} != {want}")
    for k in ("pd_buffer_size", "pd_buffer_device"):
        if k not in lc:
            errs.append(f"{wname}: {k} missing")
    opts = cfg.get("protocol_options") or {}
    if want == "sender":
        if str(lc.get("pd_proxy_port")) != str(opts.get("proxy_port")):
            errs.append(f"{wname}: pd_proxy_port {lc.get('pd_proxy_port')} != gateway "
                        f"proxy_port {opts.get('proxy_port')}")
        if not lc.get("pd_proxy_host"):
            errs.append(f"{wname}: pd_proxy_host missing")
    else:
        init, alloc = lc.get("pd_peer_init_port"), lc.get("pd_peer_alloc_port")
        if not lc.get("pd_peer_host") or not isinstance(init, list) or \
                not isinstance(alloc, list) or len(init) != len(alloc) or not init:
            errs.append(f"{wname}: receiver needs pd_peer_host and equal-length "
                        f"pd_peer_init_port / pd_peer_alloc_port lists")
        else:
            if ann.get("pdgw.io/init-ports") != ",".join(map(str, init)) or \
                    ann.get("pdgw.io/alloc-ports") != ",".join(map(str, alloc)):
                errs.append(f"{wname}: pdgw.io/init-ports / alloc-ports annotations must list "
                            f"the LMCache receiver ports")
    return errs


_HELP = {}


def binary_flags(name):
    """The --flags a binary of this build documents in its --help."""
    if name not in _HELP:
        proc = subprocess.run([pdgwtest.binary(name), "--help"], capture_output=True, text=True,
                              timeout=10)
        _HELP[name] = set(re.findall(r"(--[a-z][a-z0-9-]*)", proc.stdout + proc.stderr))
        assert _HELP[name], f"{name} --help lists no flags"
    return _HELP[name]


def flag_errors(objects):
    """Containers of our image may only pass flags the binaries know."""
    errs = []
    for w in pod_templates(objects):
        for c in w["spec"]["template"]["spec"]["containers"]:
            if not str(c.get("image", "")).startswith("pdgw"):
                continue
            args = _args(c)
            prog = args[0] if args and args[0] in ("pdgw", "pdgw-sim", "kvt-bench") else "pdgw"
            known = binary_flags(prog)
            for a in args:
                if a.startswith("--") and a.split("=", 1)[0] not in known:
                    errs.append(f"{w['metadata']['name']}: {prog} has no flag {a}")
    return errs


# ServiceMonitor fields (prometheus-operator, pkg/apis/monitoring/v1/servicemonitor_types.go
# and the Endpoint type of types.go); the CRD is not in kubernetes-models, so its few fields
# are checked here.
SM_SPEC_FIELDS = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
                  "podTargetLabels", "sampleLimit"}
SM_ENDPOINT_FIELDS = {"port", "targetPort", "path", "scheme", "params", "interval",
                      "scrapeTimeout", "honorLabels", "honorTimestamps", "metricRelabelings",
                      "relabelings", "tlsConfig", "authorization", "followRedirects"}


def servicemonitor_errors(objects, crds):
    errs = []
    services = by_kind(objects, "Service")
    for sm in crds:
        n = sm["metadata"]["name"]
        if sm.get("apiVersion") != "monitoring.coreos.com/v1" or sm.get("kind") != "ServiceMonitor":
            errs.append(f"{sm.get('apiVersion')}/{sm.get('kind')} {n}: unknown custom resource")
            continue
        spec = sm.get("spec") or {}
        errs += [f"ServiceMonitor {n}: unknown field spec.{k}" for k in set(spec) - SM_SPEC_FIELDS]
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        hits = [s for s in services if matches(sel, s["metadata"].get("labels", {}))]
        if not hits:
            errs.append(f"ServiceMonitor {n}: selector selects no Service")
        for ep in spec.get("endpoints") or [{}]:
            errs += [f"ServiceMonitor {n}: unknown field endpoints[].{k}"
                     for k in set(ep) - SM_ENDPOINT_FIELDS]
            for s in hits:
                if ep.get("port") not in {p.get("name") for p in s["spec"].get("ports", [])}:
                    errs.append(f"ServiceMonitor {n}: Service {s['metadata']['name']} has no "
                                f"port named {ep.get('port')}")
            if ep.get("path", "/metrics") != "/metrics":
                errs.append(f"ServiceMonitor {n}: pdgw serves /metrics, not {ep.get('path')}")
            if ep.get("honorLabels") is not True:
                errs.append(f"ServiceMonitor {n}: honorLabels must be true (pdgw's instance "
                            f"label names the engine)")
    return errs


# KEDA ScaledObject fields (kedacore/keda apis/keda/v1alpha1/scaledobject_types.go) and the
# prometheus scaler's trigger metadata (pkg/scalers/prometheus_scaler.go); the CRD is not in
# kubernetes-models either. The queries must read what pdgw exports (scheduler/src/
# sched_autoscale.c) and scale an engine Deployment, never the gateway.
SO_SPEC_FIELDS = {"scaleTargetRef", "pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
                  "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback",
                  "advanced", "triggers"}
SO_PROMETHEUS_METADATA = {"serverAddress", "query", "threshold", "activationThreshold",
                          "namespace", "customHeaders", "ignoreNullValues", "unsafeSsl",
                          "queryParameters"}
PDGW_AUTOSCALE_METRICS = {"pdgw_autoscale_desired_replicas", "pdgw_autoscale_utilization_ratio"}


def scaledobject_errors(objects, keda):
    errs = []
    deployments = {d["metadata"]["name"] for d in by_kind(objects, "Deployment")}
    for so in keda:
        n = so["metadata"]["name"]
        if so.get("apiVersion") != "keda.sh/v1alpha1" or so.get("kind") != "ScaledObject":
            errs.append(f"{so.get('apiVersion')}/{so.get('kind')} {n}: unknown custom resource")
            continue
        spec = so.get("spec") or {}
        errs += [f"ScaledObject {n}: unknown field spec.{k}" for k in set(spec) - SO_SPEC_FIELDS]
        ref = spec.get("scaleTargetRef") or {}
        if ref.get("kind", "Deployment") != "Deployment" or ref.get("name") not in deployments:
            errs.append(f"ScaledObject {n}: scaleTargetRef {ref.get('name')!r} scales no "
                        f"rendered Deployment")
        if ref.get("name") == "pdgw":
            errs.append(f"ScaledObject {n}: scales the gateway (the hpa component does that)")
        if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
            errs.append(f"ScaledObject {n}: minReplicaCount > maxReplicaCount")
        if not spec.get("triggers"):
            errs.append(f"ScaledObject {n}: no triggers")
        for tr in spec.get("triggers") or []:
            md = tr.get("metadata") or {}
            if tr.get("type") != "prometheus":
                errs.append(f"ScaledObject {n}: trigger type {tr.get('type')!r} is not prometheus")
                continue
            errs += [f"ScaledObject {n}: unknown prometheus metadata {k}"
                     for k in set(md) - SO_PROMETHEUS_METADATA]
            for k in ("serverAddress", "query", "threshold"):
                if not isinstance(md.get(k), str) or not md.get(k):
                    errs.append(f"ScaledObject {n}: metadata.{k} must be a non-empty string")
            names = set(re.findall(r"pdgw_[a-z_]+", md.get("query") or ""))
            if not names or not names <= PDGW_AUTOSCALE_METRICS:
                errs.append(f"ScaledObject {n}: query {md.get('query')!r} reads no pdgw "
                            f"autoscaling metric (or an unknown one)")
    return errs


def validate_overlay(name, path):
    """Every layer; returns the list of problems (empty = valid)."""
    objects = render(path)
    crds = [o for o in objects if str(o.get("apiVersion", "")).startswith("monitoring.coreos.com/")]
    keda = [o for o in objects if str(o.get("apiVersion", "")).startswith("keda.sh/")]
    objects = [o for o in objects if o not in crds and o not in keda]
    problems = schema_errors(objects) + servicemonitor_errors(objects, crds)
    problems += scaledobject_errors(objects, keda)
    try:
        problems += semantic_errors(name, objects)
        problems += flag_errors(objects)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        problems.append(f"deployment rules cannot be checked: {type(e).__name__} {e}")
    for cm in by_kind(objects, "ConfigMap"):
        if cm["metadata"]["name"].startswith("pdgw-config"):
            ok, out = check_config(cm["data"]["pdgw.yaml"])
            if not ok:
                problems.append(f"pdgw --check-config rejects {cm['metadata']['name']}: {out}")
    return objects, problems


# ------------------------------------------------------------------ tests


def kv_events_errors(wname, raw, ann, c):
    """An engine publishing KV events as vLLM spells it (vllm-project/vllm
    vllm/config/kv_events.py: enable_kv_cache_events, publisher "zmq", endpoint default
    "tcp://" + "*:5557", replay_endpoint, topic) must tell pdgw where: the pod annotations
    pdgw.io/kv-events-endpoint / -replay-endpoint equal to the bound endpoints (the wildcard
    stands for the pod's address), on declared container ports."""
    errs = []
    try:
        kc = json.loads(raw)
    except ValueError:
        return [f"{wname}: --kv-events-config is not JSON: {raw!r}"]
    if kc.get("enable_kv_cache_events") is not True or kc.get("publisher") != "zmq":
        errs.append(f"{wname}: --kv-events-config must enable the zmq publisher")
    ports = {p.get("containerPort") for p in c.get("ports", [])}
    for key, annk in (("endpoint", "pdgw.io/kv-events-endpoint"),
                      ("replay_endpoint", "pdgw.io/kv-events-replay-endpoint")):
        ep = kc.get(key)
        if ep is None:
            continue
        if ann.get(annk) != ep:
            errs.append(f"{wname}: annotation {annk} must equal {key} {ep!r}")
        if not ep.startswith("tcp://") or int(ep.rsplit(":", 1)[1]) not in ports:
            errs.append(f"{wname}: {key} {ep!r} needs a declared container port")
    return errs


def test_node_validator_installed():
    modules = node_modules()
    assert os.path.exists(os.path.join(modules, "kubernetes-models", "package.json"))


def test_every_overlay_valid():
    failures = {}
    seen_protocols = set()
    for name in ["base"] + OVERLAYS:
        path = os.path.join(K8S_DIR, "base" if name == "base" else f"overlays/{name}")
        assert os.path.exists(os.path.join(path, "README.md")) or name == "base", \
            f"{name}: README.md missing"
        objects, problems = validate_overlay(name, path)
        kinds = {o["kind"] for o in objects}
        for k in ("Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount",
                  "Role", "RoleBinding"):
            if k not in kinds:
                problems.append(f"no {k} rendered")
        for cm in by_kind(objects, "ConfigMap"):
            if cm["metadata"]["name"].startswith("pdgw-config"):
                seen_protocols.add(yaml.safe_load(cm["data"]["pdgw.yaml"]).get("protocol"))
        if problems:
            failures[name] = problems
        print(f"  {name}: {len(objects)} objects valid" if not problems else
              f"  {name}: {len(problems)} problems")
    assert not failures, json.dumps(failures, indent=1)
    assert {"vllm-kvt", "vllm-nixl", "sglang", "lmcache"} <= seen_protocols, seen_protocols


def test_image_default_config_valid():
    with open(os.path.join(SRC, "deploy", "docker", "pdgw.yaml")) as f:
        ok, out = check_config(f.read())
    assert ok, out


def _broken_copy():
    tmp = tempfile.mkdtemp(prefix="pdgw-k8s-broken.")
    shutil.copytree(K8S_DIR, os.path.join(tmp, "k8s"))
    return tmp, os.path.join(tmp, "k8s", "overlays", "sim-1p1d")


def _edit(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text, f"{old!r} not in {path}"
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def test_broken_overlay_rejected():
    """The same checks must fail on deliberately broken copies of sim-1p1d."""
    cases = [
        # (description, file, old, new, which layer must complain)
        ("wrong type", "sim-prefill.yaml", "containerPort: 8100", 'containerPort: "8100"',
         "must be integer"),
        ("unknown field", "sim-decode.yaml", "readinessProbe:", "readinesProbe:",
         "unknown field"),
        ("missing required", "sim-decode.yaml", "- name: sim\n", "- nom: sim\n",
         "required property"),
        ("selector selects nothing", "pdgw.yaml", "pdgw.io/role=decode,pdgw.io/pool=sim",
         "pdgw.io/role=decoder,pdgw.io/pool=sim", "selects no Service"),
        ("bad pdgw config", "pdgw.yaml", "prefill_policy: least-load",
         "prefill_policy: least-loaded", "--check-config rejects"),
        ("unknown pdgw config key", "pdgw.yaml", "health_interval: 2s",
         "health_intervall: 2s", "--check-config rejects"),
        ("unknown simulator flag", "sim-decode.yaml", '"--kv-port", "28000"',
         '"--kv-prot", "28000"', "has no flag --kv-prot"),
        ("PDB blocking drains", "../../base/pdb.yaml", "unhealthyPodEvictionPolicy: AlwaysAllow",
         "unhealthyPodEvictionPolicy: IfHealthyBudget", "must be AlwaysAllow"),
    ]
    for desc, fname, old, new, expect in cases:
        tmp, overlay = _broken_copy()
        try:
            _edit(os.path.join(overlay, fname), old, new)
            _, problems = validate_overlay("sim-1p1d", overlay)
            assert problems, f"{desc}: broken overlay was accepted"
            hits = [p for p in problems if expect in p]
            assert hits, f"{desc}: {problems}"
            print(f"  {desc}: rejected ({hits[0][:160]})")
        finally:
            shutil.rmtree(tmp)
    # A kustomization that cannot render.
    tmp, overlay = _broken_copy()
    try:
        _edit(os.path.join(overlay, "kustomization.yaml"), "- sim-decode.yaml",
              "- sim-decoder.yaml")
        try:
            render(overlay)
        except ValidationError as e:
            assert "sim-decoder.yaml" in str(e), e
        else:
            raise AssertionError("kustomize rendered a missing resource")
    finally:
        shutil.rmtree(tmp)
    # The monitoring components, through sim-2p2d which uses them.
    for desc, fname, old, new, expect in [
            ("ServiceMonitor port", "servicemonitor/servicemonitor.yaml", "- port: http",
             "- port: metrics", "has no port named metrics"),
            ("ServiceMonitor field", "servicemonitor/servicemonitor.yaml", "honorLabels: true",
             "honourLabels: true", "unknown field endpoints[].honourLabels"),
            ("HPA target", "hpa/hpa.yaml", "name: pdgw\n  minReplicas",
             "name: pdgw-gateway\n  minReplicas", "must scale Deployment pdgw")]:
        tmp, overlay = _broken_copy()
        try:
            _edit(os.path.join(tmp, "k8s", "components", fname), old, new)
            _, problems = validate_overlay("sim-2p2d", os.path.join(overlay, "..", "sim-2p2d"))
            assert any(expect in p for p in problems), f"{desc}: {problems}"
            print(f"  {desc}: rejected")
        finally:
            shutil.rmtree(tmp)
    # The gateway's drain timing: a drain longer than the grace period.
    tmp, overlay = _broken_copy()
    try:
        _edit(os.path.join(overlay, "pdgw.yaml"), "drain_timeout: 30s", "drain_timeout: 2m")
        _, problems = validate_overlay("sim-1p1d", overlay)
        assert any("terminationGracePeriodSeconds" in p for p in problems), problems
    finally:
        shutil.rmtree(tmp)


def test_autoscale_component_valid():
    """components/autoscale on sim-2p2d (a copy that adds it): the KEDA ScaledObjects scale
    the engine Deployments on pdgw's signals; broken copies are rejected."""
    def with_autoscale():
        tmp, overlay = _broken_copy()
        _edit(os.path.join(overlay, "..", "sim-2p2d", "kustomization.yaml"),
              "  - ../../components/hpa\n",
              "  - ../../components/hpa\n  - ../../components/autoscale\n")
        return tmp, os.path.join(overlay, "..", "sim-2p2d")

    tmp, overlay = with_autoscale()
    try:
        _, problems = validate_overlay("sim-2p2d", overlay)
        assert not problems, problems
        targets = sorted(o["spec"]["scaleTargetRef"]["name"] for o in render(overlay)
                         if o.get("kind") == "ScaledObject")
        assert targets == ["sim-decode", "sim-prefill"], targets
    finally:
        shutil.rmtree(tmp)
    for desc, old, new, expect in [
            ("target", "name: sim-decode\n  pollingInterval", "name: sim-decoder\n  "
             "pollingInterval", "scales no rendered Deployment"),
            ("field", "cooldownPeriod: 300", "coolDownPeriod: 300", "unknown field"),
            ("metric", 'sum(pdgw_autoscale_desired_replicas{role="prefill"',
             'sum(pdgw_autoscale_desired_replica{role="prefill"', "reads no pdgw"),
            ("threshold", 'threshold: "1"', "threshold: 1", "non-empty string")]:
        tmp, overlay = with_autoscale()
        try:
            _edit(os.path.join(tmp, "k8s", "components", "autoscale", "scaledobjects.yaml"),
                  old, new)
            _, problems = validate_overlay("sim-2p2d", overlay)
            assert any(expect in p for p in problems), f"{desc}: {problems}"
            print(f"  autoscale {desc}: rejected")
        finally:
            shutil.rmtree(tmp)


def test_quota_redis_component_valid():
    """components/quota-redis on sim-2p2d (a copy that adds it and tenants): the Redis and its
    Service render valid, the gateway's store URL names that Service's port, and the
    gateway's config with the Deployment's environment passes --check-config; without
    tenants the same environment is refused (a store with no tenants is an error)."""
    tmp, overlay = _broken_copy()
    overlay = os.path.join(overlay, "..", "sim-2p2d")
    try:
        _edit(os.path.join(overlay, "kustomization.yaml"), "  - ../../components/hpa\n",
              "  - ../../components/hpa\n  - ../../components/quota-redis\n")
        with open(os.path.join(overlay, "pdgw.yaml"), "a") as f:
            f.write("tenants:\n  - {name: team-a, api_keys: [ka], requests_per_minute: 600}\n")
        objects, problems = validate_overlay("sim-2p2d", overlay)
        assert not problems, problems
        svc = [o for o in by_kind(objects, "Service") if o["metadata"]["name"] == "pdgw-redis"]
        assert svc, "no pdgw-redis Service"
        gw = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "pdgw"][0]
        env = {}
        for e in gw["spec"]["template"]["spec"]["containers"][0].get("env", []):
            if e["name"].startswith("PDGW_QUOTA"):
                env[e["name"]] = e.get("value", "secret-from-the-cluster")
        url = env.get("PDGW_QUOTA_STORE", "")
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        assert host == "pdgw-redis", url
        assert int(port) in {p["port"] for p in svc[0]["spec"]["ports"]}, url
        assert env.get("PDGW_QUOTA_PASSWORD"), env
        cm = [c for c in by_kind(objects, "ConfigMap")
              if c["metadata"]["name"].startswith("pdgw-config")][0]
        # --check-config reads the file alone: the Deployment's environment goes in as keys
        store = (f"quota_store: {url}\nquota:\n  password: {env['PDGW_QUOTA_PASSWORD']}\n"
                 f"  expected_replicas: {env['PDGW_QUOTA_EXPECTED_REPLICAS']}\n")
        text = cm["data"]["pdgw.yaml"]
        ok, out = check_config(text + store)
        assert ok, out
        ok, out = check_config(text.split("tenants:")[0] + store)
        assert not ok and "no tenants are configured" in out, out
        print(f"  quota-redis: {len(objects)} objects valid, store {url}")
    finally:
        shutil.rmtree(tmp)


def _secret_mounts(spec, container):
    """{mountPath: (secretName, readable by the container's user)} of <container>'s secret
    volumes (a projected Secret file is root-owned: readable through its mode, or through
    the group when the pod's fsGroup is set)."""
    sc = spec.get("securityContext", {})
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        if "secret" not in v:
            continue
        mode = v["secret"].get("defaultMode", 0o644)
        readable = bool(mode & 0o004) or (bool(mode & 0o040) and "fsGroup" in sc)
        out[m["mountPath"].rstrip("/")] = (v["secret"]["secretName"], readable)
    return out


def _from_secret(path, mounts):
    """The (secret, readable) a file path is read from, or None."""
    d, key = os.path.split(path)
    return mounts.get(d) if key in ("tls.crt", "tls.key", "ca.crt") else None


def test_quota_redis_tls_component_valid():
    """components/quota-redis-tls on top of quota-redis: Redis serves TLS only on the port its
    Service targets, reading its certificate, key and CA from a Secret it can read; the
    gateway's store URL is rediss:// to that Service and its CA, certificate and key come
    from a readable Secret. Then the rendered Redis arguments and the gateway's environment
    are run for real (redis-server with certificates made here, pdgw with the same settings):
    the store connects over TLS.

    Redis facts (not pdgw's): --port 0 turns plain TCP off, --tls-port / --tls-cert-file /
    --tls-key-file / --tls-ca-cert-file serve TLS and check client certificates (redis
    TLS.md, "Running manually")."""
    tmp, overlay = _broken_copy()
    overlay = os.path.join(overlay, "..", "sim-2p2d")
    try:
        _edit(os.path.join(overlay, "kustomization.yaml"), "  - ../../components/hpa\n",
              "  - ../../components/hpa\n  - ../../components/quota-redis\n"
              "  - ../../components/quota-redis-tls\n")
        with open(os.path.join(overlay, "pdgw.yaml"), "a") as f:
            f.write("tenants:\n  - {name: team-a, api_keys: [ka], requests_per_minute: 600}\n")
        objects, problems = validate_overlay("sim-2p2d", overlay)
        assert not problems, problems
        deps = {d["metadata"]["name"]: d for d in by_kind(objects, "Deployment")}
        svc = [o for o in by_kind(objects, "Service") if o["metadata"]["name"] == "pdgw-redis"][0]
        rspec = deps["pdgw-redis"]["spec"]["template"]["spec"]
        redis = rspec["containers"][0]
        args = redis["args"]
        assert _flag(args, "--port") == "0", args
        tls_port = int(_flag(args, "--tls-port"))
        ports = {p["name"]: p["containerPort"] for p in redis["ports"]}
        target = svc["spec"]["ports"][0]["targetPort"]
        assert tls_port == (ports[target] if isinstance(target, str) else target), (args, svc)
        rmounts = _secret_mounts(rspec, redis)
        for flag in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"):
            src = _from_secret(_flag(args, flag), rmounts)
            assert src and src[1], f"{flag} {_flag(args, flag)} is not a readable Secret file"
        gspec = deps["pdgw"]["spec"]["template"]["spec"]
        gw = gspec["containers"][0]
        env = {e["name"]: e.get("value", "") for e in gw.get("env", [])}
        url = env["PDGW_QUOTA_STORE"]
        assert url.startswith("rediss://pdgw-redis:"), url
        assert int(url.split(":")[2].split("/")[0]) == svc["spec"]["ports"][0]["port"], url
        gmounts = _secret_mounts(gspec, gw)
        files = {}
        for k in ("PDGW_QUOTA_TLS_CA_FILE", "PDGW_QUOTA_TLS_CERT_FILE", "PDGW_QUOTA_TLS_KEY_FILE"):
            src = _from_secret(env.get(k, ""), gmounts)
            assert src and src[1], f"{k}={env.get(k)} is not a readable Secret file"
            files[k] = env[k]
        print(f"  quota-redis-tls: Redis TLS-only on {tls_port}, gateway {url}")
        if not shutil.which("redis-server") or not shutil.which("openssl"):
            print("  quota-redis-tls: live part skipped (needs redis-server and openssl)")
            return
        _run_rendered_tls_store(tmp, args, rmounts, env, files)
    finally:
        shutil.rmtree(tmp)


def _openssl(*a):
    subprocess.run(["openssl", *a], check=True, capture_output=True)


def _run_rendered_tls_store(tmp, redis_args, rmounts, env, files):
    """redis-server with the rendered arguments and pdgw with the rendered store settings,
    the Secrets' mount paths replaced by directories of certificates made here."""
    dirs = {}
    for mount, (secret, _) in rmounts.items():
        dirs[mount] = os.path.join(tmp, secret)
    for k, path in files.items():
        dirs[os.path.dirname(path)] = os.path.join(tmp, "gateway-secret")
    ca = os.path.join(tmp, "ca")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "2", "-subj", "/CN=test ca")
    ext = os.path.join(tmp, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:pdgw-redis\n")
    for d in set(dirs.values()):
        os.makedirs(d, exist_ok=True)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", os.path.join(d, "tls.key"), "-out", os.path.join(d, "tls.csr"),
                 "-subj", "/CN=pdgw-redis")
        _openssl("x509", "-req", "-in", os.path.join(d, "tls.csr"), "-CA", ca + ".crt",
                 "-CAkey", ca + ".key", "-CAcreateserial", "-out", os.path.join(d, "tls.crt"),
                 "-days", "2", "-extfile", ext)
        shutil.copy(ca + ".crt", os.path.join(d, "ca.crt"))

    def local(path):
        return os.path.join(dirs[os.path.dirname(path)], os.path.basename(path))

    port = pdgwtest.free_port()
    args = [a.replace("$(REDIS_PASSWORD)", "pw") for a in redis_args]
    for flag in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"):
        i = args.index(flag)
        args[i + 1] = local(args[i + 1])
    args[args.index("--tls-port") + 1] = str(port)
    assert args[0] == "redis-server", args
    redis = pdgwtest.Proc("redis-rendered", ["redis-server", *args[1:], "--bind", "127.0.0.1"])
    gw_port = pdgwtest.free_port()
    db = env["PDGW_QUOTA_STORE"].rsplit("/", 1)[1]
    cfg = os.path.join(tmp, "gw.yaml")
    with open(cfg, "w") as f:
        f.write(f"listen: 127.0.0.1:{gw_port}\nprotocol: neutral\naccess_log: false\n"
                f"instances:\n  - {{id: e1, url: \"http://127.0.0.1:1\", role: both}}\n"
                "tenants:\n  - {name: team-a, api_keys: [ka]}\n"
                f"quota_store: rediss://127.0.0.1:{port}/{db}\nquota:\n  password: pw\n"
                "  tls_server_name: pdgw-redis\n"
                f"  tls_ca_file: {local(files['PDGW_QUOTA_TLS_CA_FILE'])}\n"
                f"  tls_cert_file: {local(files['PDGW_QUOTA_TLS_CERT_FILE'])}\n"
                f"  tls_key_file: {local(files['PDGW_QUOTA_TLS_KEY_FILE'])}\n")
    gw = pdgwtest.Proc("pdgw-rendered", [pdgwtest.binary("pdgw"), "--config", cfg])
    try:
        pdgwtest.wait_http(gw_port, "/health", proc=gw)
        pdgwtest.wait_for(lambda: pdgwtest.metric_value(
            pdgwtest.request("GET", gw_port, "/metrics")[2].decode(),
            "pdgw_quota_store_connected") == 1, 10, "the gateway connected to the rendered Redis")
        print("  quota-redis-tls: the rendered Redis and gateway settings connect over TLS")
    finally:
        gw.kill()
        redis.kill()


if __name__ == "__main__":
    pdgwtest.skip_unless_tools(
        "kubectl", why="the overlays are rendered with `kubectl kustomize` and Debian 12 has no "
        "recent kubectl (install it from the Kubernetes project to run this test)")
    pdgwtest.run([test_node_validator_installed, test_every_overlay_valid,
                  test_image_default_config_valid, test_broken_overlay_rejected,
                  test_autoscale_component_valid, test_quota_redis_component_valid,
                  test_quota_redis_tls_component_valid])
