"""What an operator meets first, end to end on 127.0.0.1:

- `pdgw --check-config` refuses what start-up refuses: a misspelled protocol option (the
  forwarder's configure runs, in check-only mode so it binds nothing), and configured
  instances that lack what the protocol needs of their role (every request through them
  would fail) or carry attributes it does not read — and still accepts the shipped example
  configs.
- `--listen 127.0.0.1:0` picks a free port and the start-up log names it.
- A 405 names the allowed methods in `Allow`.
- After PD requests, pdgw_phase_duration_seconds has observations for every phase its help
  text names; pdgw_instance_inflight_requests counts a stream while it runs and drops back
  to 0 after it; token counters add up the engines' usage; the engines' scraped load (vLLM
  and SGLang names) is a gauge per instance.
- A booking with no usable prefill instance says so once ("no usable prefill instance").
"""

import glob
import http.server
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time

import pdgwtest as T

MODEL = "sim-model"
SRC = T.SOURCE_DIR


def check_config(text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        proc = subprocess.run([T.binary("pdgw"), "--check-config", f.name],
                              capture_output=True, text=True, timeout=20)
        return proc.returncode, (proc.stdout + proc.stderr).strip()
    finally:
        os.unlink(f.name)


PD_INSTANCES = """instances:
  - {id: p0, url: "http://127.0.0.1:1", role: prefill%s}
  - {id: d0, url: "http://127.0.0.1:2", role: decode%s}
"""


def test_check_config_runs_the_forwarder():
    # (protocol block, prefill extras, decode extras, expected rc, text the output must hold)
    cases = [
        ("protocol: vllm-mooncake\nprotocol_options: {mooncake_dispach: parallel}\n", "", "",
         1, "unknown protocol option 'mooncake_dispach'"),
        ("protocol: vllm-mooncake\nprotocol_options: {mooncake_dispatch: paralel}\n", "", "",
         1, "mooncake_dispatch"),
        # no bootstrap_port: the legs carry null and the prefill uses its own port, as
        # SGLang's routers do (python/sglang/srt/disaggregation/mini_lb.py)
        ("protocol: sglang\n", "", "", 0, "config OK"),
        ("protocol: sglang\n", ", bootstrap_port: 8998", "", 0, "config OK"),
        ("protocol: vllm-kvt\n", "", "", 1, "p0: prefill instance has no kv_port"),
        ("protocol: vllm-kvt\n", ", kv_port: 28000", "", 0, "config OK"),
        # parallel: engine ids from the bootstrap server (port default 8998) or the config
        ("protocol: vllm-mooncake\n", "", "", 0, "config OK"),
        ("protocol: vllm-mooncake\nprotocol_options: {mooncake_engine_id: config}\n",
         ", bootstrap_port: 8998", "", 1, "p0: prefill instance needs engine_id"),
        ("protocol: vllm-mooncake\nprotocol_options: {mooncake_engine_id: config}\n",
         ", bootstrap_port: 8998, engine_id: e0", "", 0, "config OK"),
        ("protocol: vllm-mooncake\nprotocol_options: {mooncake_dispatch: serial}\n", "", "", 0,
         "config OK"),  # serial copies the params
        ("protocol: lmcache\nprotocol_options: {proxy_port: 7500}\n", "", "", 1,
         "d0: decode instance needs init_ports and alloc_ports"),
        ("protocol: vllm-nixl\nprotocol_options: {no_such: 1}\n", "", "", 1, "no_such"),
        ("protocol: vllm-nixl\nclient_pd_fields: pass\n", "", "", 1,
         "'pass' is only allowed for a plain-proxy protocol"),
        # an attribute the protocol does not read is a mistake, not a silent no-op
        ("protocol: vllm-nixl\n", ", attrs: {trt_port: 9000}", "", 1,
         "p0: attrs.trt_port: protocol vllm-nixl reads no instance attributes"),
    ]
    for proto, pextra, dextra, want_rc, want in cases:
        text = 'listen: "127.0.0.1:0"\n' + proto + PD_INSTANCES % (pextra, dextra)
        rc, out = check_config(text)
        assert rc == want_rc and want in out, f"{proto!r}{pextra!r}: rc {rc}: {out}"
        print(f"  {proto.splitlines()[0]}{pextra}: rc {rc} ({out[-90:]})")


def test_check_config_equals_startup():
    """What --check-config refuses also stops start-up, with the same words: a protocol
    option, and instances the protocol cannot use (a missing field, an undeclared attr)."""
    cases = [
        ("protocol: vllm-mooncake\nprotocol_options: {mooncake_dispach: parallel}\n", "",
         "unknown protocol option 'mooncake_dispach'"),
        ("protocol: vllm-kvt\n", "", "p0: prefill instance has no kv_port"),
        ("protocol: vllm-nixl\n", ", attrs: {trt_port: 9000}", "attrs.trt_port"),
    ]
    for proto, pextra, want in cases:
        text = 'listen: "127.0.0.1:0"\n' + proto + PD_INSTANCES % (pextra, "")
        rc, out = check_config(text)
        assert rc != 0 and want in out, out
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
        try:
            proc = subprocess.run([T.binary("pdgw"), "--config", f.name], capture_output=True,
                                  text=True, timeout=20)
        finally:
            os.unlink(f.name)
        assert proc.returncode != 0, (proto, proc.stdout + proc.stderr)
        assert want in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_check_config_binds_nothing():
    """lmcache's configure opens the ProxyNotif socket at start-up; the check must not, so
    it passes while a running gateway holds the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        text = ('listen: "127.0.0.1:0"\nprotocol: lmcache\n'
                f'protocol_options: {{proxy_host: 127.0.0.1, proxy_port: {port}}}\n' +
                PD_INSTANCES % ("", ", init_ports: [7300], alloc_ports: [7400]"))
        rc, out = check_config(text)
    assert rc == 0 and out.endswith("config OK"), out


def test_shipped_configs_pass():
    files = sorted(glob.glob(os.path.join(SRC, "deploy", "examples", "*.yaml")))
    files.append(os.path.join(SRC, "deploy", "docker", "pdgw.yaml"))
    assert len(files) > 3
    for path in files:
        with open(path) as f:
            rc, out = check_config(f.read())
        assert rc == 0, f"{path}: {out}"


def start_sim(role, extra=()):
    port = T.free_port()
    p = T.Proc(f"sim-{role}", [T.binary("pdgw-sim"), "--role", role, "--port", str(port),
                               "--ttft-ms", "5", "--tpot-ms", "5", "--max-tokens-default", "16",
                               *extra])
    T.wait_http(port, "/health", proc=p)
    return p, port


def start_gw_config(text):
    tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    tmp.write(text)
    tmp.close()
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", tmp.name])
    try:
        deadline = time.time() + 10
        port = None
        while port is None and time.time() < deadline:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", gw.output())
            if m:
                port = int(m.group(1))
            elif not gw.alive():
                raise AssertionError(gw.output())
            else:
                time.sleep(0.05)
        assert port, gw.output()
        return gw, port
    finally:
        os.unlink(tmp.name)


def test_listen_port_zero():
    sim, sport = start_sim("both")
    gw, port = start_gw_config(f'listen: "127.0.0.1:0"\nprotocol: neutral\ninstances:\n'
                               f'  - {{id: b0, url: "http://127.0.0.1:{sport}", role: both}}\n')
    assert port != 0
    T.wait_http(port, "/ready", proc=gw)
    st, _, _, raw = T.post_json(port, "/v1/completions",
                                {"model": MODEL, "prompt": "x", "max_tokens": 4})
    assert st == 200, raw


def test_405_has_allow():
    sim, sport = start_sim("both")
    gw, port = start_gw_config(f'listen: "127.0.0.1:0"\nprotocol: neutral\ninstances:\n'
                               f'  - {{id: b0, url: "http://127.0.0.1:{sport}", role: both}}\n')
    cases = [("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
             ("POST", "/metrics", "GET, HEAD"), ("DELETE", "/health", "GET, HEAD"),
             ("PUT", "/admin/instances", "GET, POST"), ("POST", "/admin/instances/b0", "GET, DELETE"),
             ("GET", "/admin/instances/b0/drain", "POST")]
    for method, path, allow in cases:
        st, hdrs, body = T.request(method, port, path)
        assert st == 405, (method, path, st, body)
        assert hdrs.get("allow") == allow, (method, path, hdrs)


def test_admin_added_instances_are_checked():
    """An instance added through POST /admin/instances gets the protocol's checks a configured
    one gets at start-up: refused with 400 naming what is missing, and never joins."""
    gw, port = start_gw_config(
        'listen: "127.0.0.1:0"\nprotocol: vllm-kvt\ninstances:\n'
        '  - {id: p0, url: "http://127.0.0.1:1", role: prefill, kv_port: 7000}\n'
        '  - {id: d0, url: "http://127.0.0.1:2", role: decode}\n')
    try:
        for inst, want in (({"id": "p1", "url": "http://127.0.0.1:3", "role": "prefill"},
                            "no kv_port"),):
            st, _, body, raw = T.post_json(port, "/admin/instances", inst)
            assert st == 400 and want in raw.decode(), (st, raw)
            assert body["error"]["code"] == "invalid_instance", body
            st, _, _ = T.request("GET", port, f"/admin/instances/{inst['id']}")
            assert st == 404, st
        st, _, body, raw = T.post_json(port, "/admin/instances",
                                       {"id": "p1", "url": "http://127.0.0.1:3",
                                        "role": "prefill", "kv_port": 7001})
        assert st == 201, raw
    finally:
        gw.kill()


def pd_stack(tpot_ms="5"):
    kv = T.free_port()
    pre, pport = start_sim("prefill", ["--kv-port", str(kv), "--engine-id", "pre0",
                                       "--tpot-ms", tpot_ms])
    dec, dport = start_sim("decode", ["--engine-id", "dec0", "--tpot-ms", tpot_ms])
    gw, port = start_gw_config(
        'listen: "127.0.0.1:0"\nprotocol: vllm-kvt\nscheduling: staged\ninstances:\n'
        f'  - {{id: p0, url: "http://127.0.0.1:{pport}", role: prefill, kv_port: {kv}}}\n'
        f'  - {{id: d0, url: "http://127.0.0.1:{dport}", role: decode}}\n')
    T.wait_http(port, "/ready", proc=gw)
    return port


def metrics(port):
    st, _, body = T.request("GET", port, "/metrics")
    assert st == 200
    return body.decode()


def test_phase_durations_observed():
    port = pd_stack()
    body = {"model": MODEL, "prompt": "phases of a request", "max_tokens": 6}
    for stream in (False, True):
        if stream:
            evs = list(T.sse_events(port, "/v1/completions", dict(body, stream=True)))
            assert evs[-1] == "[DONE]"
        else:
            st, _, _, raw = T.post_json(port, "/v1/completions", body)
            assert st == 200, raw
    text = metrics(port)
    help_line = next(l for l in text.splitlines()
                     if l.startswith("# HELP pdgw_phase_duration_seconds "))
    promised = [p for p in ("queue", "prefill", "kv_transfer", "decode") if p in help_line]
    assert len(promised) == 4, help_line
    for phase in promised:
        n = T.metric_value(text, "pdgw_phase_duration_seconds_count",
                           {"protocol": "vllm-kvt", "phase": phase})
        assert n and n >= 2, f"phase {phase}: {n}"


def test_instance_inflight_gauge():
    port = pd_stack(tpot_ms="100")
    body = {"model": MODEL, "prompt": "a slow stream", "max_tokens": 30, "stream": True}
    seen = []
    gen = T.sse_events(port, "/v1/completions", body)
    next(gen)  # the stream is running: the decode leg is open
    v = T.metric_value(metrics(port), "pdgw_instance_inflight_requests",
                       {"instance": "d0", "role": "decode"})
    seen.append(v)
    rest = list(gen)
    assert rest[-1] == "[DONE]"
    assert seen == [1.0], seen
    text = metrics(port)
    for inst, role in (("d0", "decode"), ("p0", "prefill")):
        v = T.metric_value(text, "pdgw_instance_inflight_requests",
                           {"instance": inst, "role": role})
        assert v == 0.0, (inst, v)


def test_no_usable_instance_wording():
    dec, dport = start_sim("decode")
    dead = T.free_port()  # nothing listens: the prefill goes down after its probes
    gw, port = start_gw_config(
        'listen: "127.0.0.1:0"\nprotocol: vllm-kvt\nscheduling: staged\n'
        'health_interval: 100ms\nhealth_timeout: 100ms\nunhealthy_threshold: 1\n'
        'instances:\n'
        f'  - {{id: p0, url: "http://127.0.0.1:{dead}", role: prefill, kv_port: 1}}\n'
        f'  - {{id: d0, url: "http://127.0.0.1:{dport}", role: decode}}\n')
    T.wait_http(port, "/ready", proc=gw, expect=503)
    st, _, obj, raw = T.post_json(port, "/v1/completions",
                                  {"model": MODEL, "prompt": "x", "max_tokens": 4})
    assert st == 503, raw
    msg = obj["error"]["message"]
    assert "no usable prefill instance" in msg and msg.count("no usable") == 1, msg


def test_token_counters():
    """pdgw_prompt_tokens_total / pdgw_completion_tokens_total add up the usage the engine
    reported: non-stream bodies, and streams whose client asked for include_usage."""
    sim, sport = start_sim("both")
    gw, port = start_gw_config(f'listen: "127.0.0.1:0"\nprotocol: neutral\ninstances:\n'
                               f'  - {{id: b0, url: "http://127.0.0.1:{sport}", role: both}}\n')
    T.wait_http(port, "/ready", proc=gw)
    want_p = want_c = 0
    body = {"model": MODEL, "prompt": "count the tokens of this prompt", "max_tokens": 5}
    st, _, obj, raw = T.post_json(port, "/v1/completions", body)
    assert st == 200, raw
    want_p += obj["usage"]["prompt_tokens"]
    want_c += obj["usage"]["completion_tokens"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    usage = [json.loads(e)["usage"] for e in T.sse_events(port, "/v1/chat/completions", chat)
             if e != "[DONE]" and json.loads(e).get("usage")]
    assert len(usage) == 1, usage
    want_p += usage[0]["prompt_tokens"]
    want_c += usage[0]["completion_tokens"]
    # Without include_usage the engine reports nothing, and nothing is counted.
    list(T.sse_events(port, "/v1/completions", dict(body, stream=True)))
    text = metrics(port)
    got_p = T.metric_value(text, "pdgw_prompt_tokens_total", {"protocol": "neutral"})
    got_c = T.metric_value(text, "pdgw_completion_tokens_total", {"protocol": "neutral"})
    assert want_p > 0 and want_c == 12, (want_p, want_c)
    assert (got_p, got_c) == (want_p, want_c), (got_p, got_c, want_p, want_c)


class FakeSGLang(http.server.BaseHTTPRequestHandler):
    """An engine that answers /health and serves SGLang's metric names (upstream
    python/sglang/srt/metrics/collector.py): num_running_reqs, num_queue_reqs, the PD
    prealloc / transfer queues, token_usage (a fraction), one sample per TP rank."""
    LABELS = '{model_name="m",engine_type="decode",tp_rank="%d",pp_rank="0",moe_ep_rank="0"}'

    def do_GET(self):
        if self.path == "/metrics":
            lines = []
            for rank, (run, queue, transfer, usage) in enumerate([(3, 1, 2, 0.25), (2, 0, 1, 0.5)]):
                lab = self.LABELS % rank
                lines += [f"sglang:num_running_reqs{lab} {run}.0",
                          f"sglang:num_queue_reqs{lab} {queue}.0",
                          f"sglang:num_decode_transfer_queue_reqs{lab} {transfer}.0",
                          f"sglang:token_usage{lab} {usage}"]
            data = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
        else:
            data = b""
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def test_engine_load_gauges():
    """The scraped engine load per instance: vLLM names from pdgw-sim, SGLang names from a
    stand-in; counts summed over ranks, usage the largest."""
    sim, sport = start_sim("both")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        gw, port = start_gw_config(
            'listen: "127.0.0.1:0"\nprotocol: neutral\nmetrics_scrape_interval: 100ms\n'
            'instances:\n'
            f'  - {{id: vllm0, url: "http://127.0.0.1:{sport}", role: both}}\n'
            f'  - {{id: sgl0, url: "http://127.0.0.1:{srv.server_address[1]}", role: both}}\n')
        want = {("sgl0", "pdgw_engine_running_requests"): 5.0,
                ("sgl0", "pdgw_engine_waiting_requests"): 4.0,
                ("sgl0", "pdgw_engine_kv_cache_usage_ratio"): 0.5,
                ("vllm0", "pdgw_engine_running_requests"): 0.0,
                ("vllm0", "pdgw_engine_kv_cache_usage_ratio"): 0.0}
        deadline = time.time() + 10
        while True:
            text = metrics(port)
            got = {k: T.metric_value(text, k[1], {"instance": k[0], "role": "both"})
                   for k in want}
            if got == want or time.time() > deadline:
                break
            time.sleep(0.05)
        assert got == want, got
    finally:
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":
    T.run([test_check_config_runs_the_forwarder, test_check_config_equals_startup,
           test_check_config_binds_nothing, test_shipped_configs_pass, test_listen_port_zero,
           test_405_has_allow, test_admin_added_instances_are_checked,
           test_phase_durations_observed, test_instance_inflight_gauge,
           test_no_usable_instance_wording, test_token_counters, test_engine_load_gauges])
