"""OpenTelemetry traces over OTLP/HTTP JSON, against a fake collector on 127.0.0.1.

The collector stands in for an OpenTelemetry Collector's OTLP/HTTP receiver: it takes
POST /v1/traces with an ExportTraceServiceRequest in the protobuf JSON mapping
(opentelemetry-proto: opentelemetry/proto/collector/trace/v1/trace_service.proto,
opentelemetry/proto/trace/v1/trace.proto; ids as hex strings, 64-bit times as decimal
strings, as the OTLP specification's JSON encoding says) and answers 200.

Checked: the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME,
OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_SCHEDULE_DELAY) and the config keys; a request span that
continues the client's trace and whose span id is the one the engines received in
traceparent; child spans queue, prefill, kv_transfer, decode inside it; attributes for model,
protocol, instances, status and the engine's token usage; an error status for a failed
request; parent-based sampling (a client's unsampled context is not exported) and ratio 0;
a collector that is down costs the requests nothing (spans counted as failed).
"""

import http.server
import json
import os
import secrets
import signal
import tempfile
import threading
import time

import pdgwtest as T

MODEL = "sim-model"


class Collector:
    def __init__(self):
        self.batches = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = self.path == "/v1/traces" and \
                    self.headers.get("Content-Type", "").startswith("application/json")
                if ok:
                    with outer.lock:
                        outer.batches.append(json.loads(body))
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def spans(self):
        """[(service.name, span)] of every batch received."""
        out = []
        with self.lock:
            for b in self.batches:
                for rs in b["resourceSpans"]:
                    svc = next(a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                               if a["key"] == "service.name")
                    for ss in rs["scopeSpans"]:
                        out += [(svc, s) for s in ss["spans"]]
        return out

    def wait_trace(self, trace_id, n, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = [s for _, s in self.spans() if s["traceId"] == trace_id]
            if len(got) >= n:
                return got
            time.sleep(0.02)
        raise AssertionError(f"trace {trace_id}: {len(got)} span(s), want {n}: {got}")

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def attrs(span):
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = int(v["intValue"]) if "intValue" in v else v.get("stringValue")
    return out


def pd_gateway(env, extra_yaml=""):
    def sim(role, extra):
        port = T.free_port()
        p = T.Proc(f"sim-{role}", [T.binary("pdgw-sim"), "--role", role, "--port", str(port),
                                   "--ttft-ms", "20", "--tpot-ms", "5", *extra])
        T.wait_http(port, "/health", proc=p)
        return port
    kv = T.free_port()
    pport = sim("prefill", ["--kv-port", str(kv), "--engine-id", "p0"])
    dport = sim("decode", ["--engine-id", "d0"])
    gport = T.free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(f'listen: "127.0.0.1:{gport}"\nprotocol: vllm-kvt\nscheduling: staged\n'
                f'{extra_yaml}instances:\n'
                f'  - {{id: p0, url: "http://127.0.0.1:{pport}", role: prefill, kv_port: {kv}}}\n'
                f'  - {{id: d0, url: "http://127.0.0.1:{dport}", role: decode}}\n')
    try:
        gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", f.name], env=env)
        T.wait_http(gport, "/ready", proc=gw)
    finally:
        os.unlink(f.name)
    return gw, gport, dport


def traceparent(sampled=True):
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{'01' if sampled else '00'}"


def test_request_spans():
    col = Collector()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{col.port}",
               "OTEL_SERVICE_NAME": "pdgw-test", "OTEL_BSP_SCHEDULE_DELAY": "50"}
        gw, port, dport = pd_gateway(env)
        tp = traceparent()
        trace_id, client_span = tp.split("-")[1], tp.split("-")[2]
        body = {"model": MODEL, "prompt": "trace me", "max_tokens": 6, "stream": True,
                "stream_options": {"include_usage": True}}
        events = list(T.sse_events(port, "/v1/completions", body,
                                   headers={"traceparent": tp, "X-Request-Id": "otel-1"}))
        usage = next(json.loads(e)["usage"] for e in events
                     if e != "[DONE]" and json.loads(e).get("usage"))
        spans = col.wait_trace(trace_id, 5)
        assert {svc for svc, _ in col.spans()} == {"pdgw-test"}
        roots = [s for s in spans if s.get("parentSpanId") == client_span]
        assert len(roots) == 1, spans
        root = roots[0]
        a = attrs(root)
        assert root["kind"] == 2 and root["name"] == "POST /v1/completions", root
        assert a["gen_ai.request.model"] == MODEL and a["pdgw.protocol"] == "vllm-kvt", a
        assert a["pdgw.prefill_instance"] == "p0" and a["pdgw.decode_instance"] == "d0", a
        assert a["http.response.status_code"] == 200 and "status" not in root, root
        assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"], (a, usage)
        assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"], (a, usage)
        kids = {s["name"]: s for s in spans if s.get("parentSpanId") == root["spanId"]}
        assert set(kids) == {"queue", "prefill", "kv_transfer", "decode"}, kids
        r0, r1 = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
        assert abs(r0 / 1e9 - time.time()) < 60 and r1 >= r0
        for k in kids.values():
            k0, k1 = int(k["startTimeUnixNano"]), int(k["endTimeUnixNano"])
            assert r0 - 2e6 <= k0 <= k1 <= r1 + 2e6, (k, root)
        assert int(kids["prefill"]["endTimeUnixNano"]) <= int(kids["decode"]["endTimeUnixNano"])
        # The engines saw the request span as their parent.
        recs = json.loads(T.request("GET", dport, "/sim/requests?request_id=otel-1")[2])
        recs = recs if isinstance(recs, list) else recs.get("requests", [])
        tps = {r.get("traceparent") for r in recs}
        assert f"00-{trace_id}-{root['spanId']}-01" in tps, tps

        # A failed request: error status on its span.
        tp2 = traceparent()
        st, _, _, raw = T.post_json(port, "/v1/completions",
                                    {"model": MODEL, "prompt": "x", "max_tokens": 0},
                                    headers={"traceparent": tp2})
        if st < 400:  # max_tokens 0 accepted: use a body the gateway refuses
            st, _, _, raw = T.post_json(port, "/v1/completions", {"model": MODEL},
                                        headers={"traceparent": tp2})
        assert st >= 400, raw
        failed = col.wait_trace(tp2.split("-")[1], 1)
        assert failed[0]["status"]["code"] == 2, failed
        assert attrs(failed[0])["http.response.status_code"] == st

        # A client that did not sample: nothing exported for its trace (parent-based).
        tp3 = traceparent(sampled=False)
        st, _, _, _ = T.post_json(port, "/v1/completions",
                                  {"model": MODEL, "prompt": "x", "max_tokens": 2},
                                  headers={"traceparent": tp3})
        assert st == 200
        # A later sampled request is exported; the unsampled one must not be there by then.
        # It carries latency targets (llm-d's x-slo-* headers): they and their outcome are on
        # its span.
        tp4 = traceparent()
        T.post_json(port, "/v1/completions", {"model": MODEL, "prompt": "y", "max_tokens": 2},
                    headers={"traceparent": tp4, "x-slo-ttft-ms": "60000",
                             "x-slo-tpot-ms": "5000"})
        a4 = attrs(next(s for s in col.wait_trace(tp4.split("-")[1], 5)
                        if s["name"].startswith("POST ")))
        assert a4["pdgw.slo.ttft_ms"] == 60000 and a4["pdgw.slo.tpot_ms"] == 5000, a4
        assert a4["pdgw.slo.result"] == "met", a4
        assert "pdgw.slo.ttft_ms" not in a and "pdgw.slo.result" not in a, a
        gw.signal(signal.SIGTERM)
        assert gw.wait(20) == 0, gw.output()[-2000:]
        assert not [s for _, s in col.spans() if s["traceId"] == tp3.split("-")[1]]
    finally:
        col.close()


def test_ratio_zero_and_config_keys():
    col = Collector()
    try:
        # Config keys instead of the environment; ratio 0: roots are never sampled.
        gw, port, dport = pd_gateway({"OTEL_BSP_SCHEDULE_DELAY": "50"},
                                 f'tracing:\n  otlp_endpoint: "http://127.0.0.1:{col.port}"\n'
                                 f'  service_name: keyed\n  sample_ratio: "0"\n')
        for i in range(5):
            st, _, _, _ = T.post_json(port, "/v1/completions",
                                      {"model": MODEL, "prompt": "z", "max_tokens": 2},
                                      headers={"X-Request-Id": f"unsampled-{i}"})
            assert st == 200
        # New traces that are not sampled reach the engines unsampled (flags 00).
        recs = json.loads(T.request("GET", dport, "/sim/requests?request_id=unsampled-0")[2])
        recs = recs if isinstance(recs, list) else recs.get("requests", [])
        assert recs and all(r["traceparent"].endswith("-00") for r in recs), recs
        # A sampled parent still wins over the ratio (parent-based sampler).
        tp = traceparent()
        T.post_json(port, "/v1/completions", {"model": MODEL, "prompt": "z", "max_tokens": 2},
                    headers={"traceparent": tp})
        spans = col.wait_trace(tp.split("-")[1], 1)
        assert {svc for svc, _ in col.spans()} == {"keyed"}
        gw.signal(signal.SIGTERM)
        assert gw.wait(20) == 0
        assert all(s["traceId"] == tp.split("-")[1] for _, s in col.spans()), col.spans()
    finally:
        col.close()


def test_collector_down_costs_nothing():
    dead = T.free_port()
    gw, port, _ = pd_gateway({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{dead}",
                              "OTEL_BSP_SCHEDULE_DELAY": "50"})
    for _ in range(3):
        st, _, _, raw = T.post_json(port, "/v1/completions",
                                    {"model": MODEL, "prompt": "q", "max_tokens": 2})
        assert st == 200, raw
    deadline = time.time() + 10
    while True:
        text = T.request("GET", port, "/metrics")[2].decode()
        failed = T.metric_value(text, "pdgw_otel_spans_total", {"result": "failed"})
        if (failed and failed >= 3) or time.time() > deadline:
            break
        time.sleep(0.05)
    assert failed and failed >= 3, text[-2000:]
    assert T.metric_value(text, "pdgw_otel_spans_total", {"result": "exported"}) == 0


def test_bad_tracing_config_refused():
    import subprocess
    for yaml_text, want in [('tracing:\n  sample_ratio: "2"\n', "sample_ratio"),
                            ('tracing:\n  otlp_endpoint: "collector:4318"\n', "otlp_endpoint")]:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write('listen: "127.0.0.1:0"\nprotocol: neutral\n' + yaml_text +
                    'instances:\n  - {id: b0, url: "http://127.0.0.1:1", role: both}\n')
        try:
            proc = subprocess.run([T.binary("pdgw"), "--check-config", f.name],
                                  capture_output=True, text=True, timeout=20)
        finally:
            os.unlink(f.name)
        assert proc.returncode != 0 and want in proc.stderr, (yaml_text, proc.stderr)


if __name__ == "__main__":
    T.run([test_request_spans, test_ratio_zero_and_config_keys, test_collector_down_costs_nothing,
           test_bad_tracing_config_refused])
