"""deploy/grafana/pdgw-dashboard.json holds up:

- the dashboard JSON has what Grafana needs (title, uid, schemaVersion, panels with unique ids,
  gridPos inside the 24-column grid and not overlapping, targets with unique refIds, the
  datasource variable every panel uses, every $variable defined);
- every query parses as PromQL (`promtool check rules` on the expressions; skipped with a note
  when promtool is absent);
- every pdgw_* metric a query names is exposed by a running gateway's /metrics (a vllm-kvt
  gateway with two pdgw-sim engines, after requests), with the right type: rate() over a
  counter, histogram_quantile() over a histogram's _bucket; and the labels a query groups by
  are labels the metric's samples carry;
- the dashboard covers request rate, errors by phase, TTFT/TPOT, phase latencies, engine queue
  and load, KV transfer and breaker states;
- a broken copy (misspelt metric, overlapping panel, duplicate refId, undefined variable) is
  rejected.
"""

import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import pdgwtest as T

DASHBOARD = os.path.join(T.SOURCE_DIR, "deploy", "grafana", "pdgw-dashboard.json")
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__interval_ms"}
MUST_COVER = ["pdgw_requests_total", "pdgw_pd_failures_total", "pdgw_ttft_seconds",
              "pdgw_tpot_seconds", "pdgw_phase_duration_seconds", "pdgw_engine_waiting_requests",
              "pdgw_engine_running_requests", "pdgw_engine_kv_cache_usage_ratio",
              "pdgw_instance_inflight_requests", "pdgw_kv_wait_seconds", "pdgw_breaker_state"]


def load():
    with open(DASHBOARD) as f:
        return json.load(f)


def queries(dash):
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield p, t


def structure_errors(dash):
    errs = []
    for k, typ in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list)):
        if not isinstance(dash.get(k), typ):
            errs.append(f"dashboard.{k} missing or not {typ.__name__}")
    if errs:
        return errs
    if not 0 < len(dash["uid"]) <= 40:
        errs.append("uid must be 1..40 characters")
    variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    ids, rects = set(), []
    for p in dash["panels"]:
        pid = p.get("id")
        if not isinstance(pid, int) or pid in ids:
            errs.append(f"panel {p.get('title')!r}: id {pid!r} missing or duplicate")
        ids.add(pid)
        if not p.get("title") or p.get("type") not in ("row", "timeseries", "stat", "gauge",
                                                        "table", "heatmap", "bargauge"):
            errs.append(f"panel {pid}: title or type invalid")
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] < 0 or g["w"] <= 0 \
                or g["h"] <= 0 or g["x"] + g["w"] > 24:
            errs.append(f"panel {pid}: gridPos {g} outside the 24-column grid")
            continue
        for other, og in rects:
            if g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"] and \
                    g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]:
                errs.append(f"panel {pid} overlaps panel {other}")
        rects.append((pid, g))
        if p["type"] == "row":
            continue
        ds = (p.get("datasource") or {}).get("uid", "")
        if ds != "${datasource}" or "datasource" not in variables:
            errs.append(f"panel {pid}: datasource must be the ${{datasource}} variable")
        targets = p.get("targets") or []
        refs = [t.get("refId") for t in targets]
        if not targets or len(set(refs)) != len(refs) or not all(refs):
            errs.append(f"panel {pid}: targets missing or refIds not unique")
        for t in targets:
            expr = t.get("expr") or ""
            if "pdgw_" not in expr:
                errs.append(f"panel {pid}/{t.get('refId')}: query names no pdgw metric")
            for var in re.findall(r"\$\{?(\w+)", expr):
                if var not in variables and var not in BUILTIN_VARS:
                    errs.append(f"panel {pid}/{t.get('refId')}: undefined variable ${var}")
    return errs


def promql_errors(dash):
    """Every expression through promtool's PromQL parser (as recording rules)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        print("  note: promtool not in PATH, PromQL syntax not checked")
        return []
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for i, (p, t) in enumerate(queries(dash)):
        expr = t["expr"].replace("$__rate_interval", "5m").replace("$job", ".*")
        rules["groups"][0]["rules"].append({"record": f"dashboard:q{i}", "expr": expr})
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        json.dump(rules, f)  # JSON is YAML
    try:
        proc = subprocess.run([promtool, "check", "rules", f.name], capture_output=True,
                              text=True, timeout=60)
    finally:
        os.unlink(f.name)
    return [] if proc.returncode == 0 else [f"promtool: {proc.stdout}{proc.stderr}"]


def parse_exposition(text):
    """{family: type}, {sample name: set of label names}."""
    types, labels = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ
        elif line and not line.startswith("#"):
            head = line.rpartition(" ")[0]
            name, _, rest = head.partition("{")
            names = set(re.findall(r'(\w+)="', rest))
            labels.setdefault(name, set()).update(names)
    return types, labels


def metric_errors(dash, exposition):
    types, labels = parse_exposition(exposition)
    errs = []
    for p, t in queries(dash):
        where = f"panel {p['id']} ({p['title']})/{t['refId']}"
        expr = t["expr"]
        for m in re.finditer(r"\b(pdgw_[a-z0-9_]+)\b", expr):
            name = m.group(1)
            fam = re.sub(r"_(bucket|sum|count)$", "", name)
            if name in types:
                fam = name
            if fam not in types:
                errs.append(f"{where}: {name} is not in pdgw's /metrics")
                continue
            before = expr[:m.start()]
            if re.search(r"(rate|increase)\(\s*$", before) and not (
                    types[fam] == "counter" or (types[fam] == "histogram" and name != fam)):
                errs.append(f"{where}: rate() over {name}, a {types[fam]}")
            if "histogram_quantile" in expr and name.endswith("_bucket") and \
                    types[fam] != "histogram":
                errs.append(f"{where}: histogram_quantile over {name}, a {types[fam]}")
            seen = labels.get(name, set())
            if seen:
                for group in re.findall(r"by \(([^)]*)\)", expr):
                    for lab in (x.strip() for x in group.split(",")):
                        if lab and lab not in seen:
                            errs.append(f"{where}: groups by {lab}, not a label of {name} "
                                        f"({sorted(seen)})")
    named = {re.sub(r"_(bucket|sum|count)$", "", n)
             for _, t in queries(dash) for n in re.findall(r"\b(pdgw_[a-z0-9_]+)\b", t["expr"])}
    for want in MUST_COVER:
        if want not in named:
            errs.append(f"the dashboard has no panel on {want}")
    return errs


def running_gateway_metrics():
    def sim(role, extra):
        port = T.free_port()
        p = T.Proc(f"sim-{role}", [T.binary("pdgw-sim"), "--role", role, "--port", str(port),
                                   "--ttft-ms", "5", "--tpot-ms", "2", *extra])
        T.wait_http(port, "/health", proc=p)
        return port
    kv = T.free_port()
    pport = sim("prefill", ["--kv-port", str(kv), "--engine-id", "p0"])
    dport = sim("decode", ["--engine-id", "d0"])
    gport = T.free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f'listen: "127.0.0.1:{gport}"\nprotocol: vllm-kvt\nscheduling: staged\n'
              f'metrics_scrape_interval: 100ms\ninstances:\n'
              f'  - {{id: p0, url: "http://127.0.0.1:{pport}", role: prefill, kv_port: {kv}}}\n'
              f'  - {{id: d0, url: "http://127.0.0.1:{dport}", role: decode}}\n')
    cfg.close()
    try:
        gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", cfg.name])
        T.wait_http(gport, "/ready", proc=gw)
    finally:
        os.unlink(cfg.name)
    body = {"model": "sim-model", "prompt": "dashboards", "max_tokens": 4}
    st, _, _, raw = T.post_json(gport, "/v1/completions", body)
    assert st == 200, raw
    list(T.sse_events(gport, "/v1/completions", dict(body, stream=True)))
    T.request("POST", gport, "/v1/completions", "{not json")  # a rejected request
    deadline = time.time() + 10
    while True:
        text = T.request("GET", gport, "/metrics")[2].decode()
        if "pdgw_engine_running_requests{" in text or time.time() > deadline:
            return text


def test_structure():
    errs = structure_errors(load())
    assert not errs, "\n".join(errs)


def test_promql_parses():
    dash = load()
    errs = promql_errors(dash)
    assert not errs, "\n".join(errs)
    if shutil.which("promtool"):
        broken = copy.deepcopy(dash)
        target = next(t for _, t in queries(broken))
        target["expr"] = target["expr"].replace("by (", "by ((", 1)
        assert promql_errors(broken), "promtool accepted a broken expression"


def test_metrics_exist_in_gateway():
    dash = load()
    errs = metric_errors(dash, running_gateway_metrics())
    assert not errs, "\n".join(errs)
    print(f"  {sum(1 for _ in queries(dash))} queries checked against /metrics")


def test_broken_copies_rejected():
    dash = load()
    text = running_gateway_metrics()
    panel = next(p for p in dash["panels"] if p.get("targets"))
    cases = []
    d = copy.deepcopy(dash)
    d["panels"][panel["id"] - 1]["targets"][0]["expr"] = "rate(pdgw_requests_totl[5m])"
    cases.append(("misspelt metric", d, "not in pdgw's /metrics"))
    d = copy.deepcopy(dash)
    d["panels"][panel["id"] - 1]["targets"][0]["expr"] = "rate(pdgw_inflight_requests[5m])"
    cases.append(("rate over a gauge", d, "rate() over pdgw_inflight_requests"))
    d = copy.deepcopy(dash)
    d["panels"][-1]["gridPos"] = dict(d["panels"][-2]["gridPos"])
    cases.append(("overlap", d, "overlaps"))
    d = copy.deepcopy(dash)
    tg = d["panels"][panel["id"] - 1]["targets"]
    tg.append(dict(tg[0]))
    cases.append(("duplicate refId", d, "refIds not unique"))
    d = copy.deepcopy(dash)
    d["panels"][panel["id"] - 1]["targets"][0]["expr"] += ' + on() vector($nosuchvar)'
    cases.append(("undefined variable", d, "undefined variable $nosuchvar"))
    for desc, d, want in cases:
        errs = structure_errors(d) + metric_errors(d, text)
        assert any(want in e for e in errs), f"{desc}: {errs}"


if __name__ == "__main__":
    T.run([test_structure, test_promql_parses, test_metrics_exist_in_gateway,
           test_broken_copies_rejected])
