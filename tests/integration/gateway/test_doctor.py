"""The engine doctor: `pdgw --check-engines [--json]` and `check_engines_at_start`, against
real pdgw-sim instances.

Upstream facts the doctor encodes, checked in upstream's source:
- vllm-project/vllm vllm/distributed/kv_events.py (ZmqEventPublisher._socket_setup): the PUB
  socket binds only when the endpoint contains "*" or "::" or starts with ipc:// or inproc://;
  any other endpoint is connected to. pdgw's subscriber connects too, so an engine given
  tcp://127.0.0.1:PORT leaves nobody listening. The replay socket is a ROUTER that always
  binds; it answers [empty, 8-byte seq] with the buffered batches and then seq -1.
- vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py
  (MooncakeBootstrapServer): GET /query returns {dp_rank: {"engine_id", "worker_addr":
  {tp_rank: {pp_rank: addr}}}}.
- sgl-project/sglang python/sglang/srt/disaggregation/common/conn.py
  (CommonKVBootstrapServer._setup_routes): /route (GET with prefill_dp_rank, prefill_cp_rank,
  target_tp_rank, target_pp_rank; all -1 = the prefill's topology, 503 until every worker
  registered), /register_dp_rank, /query_dp_ranks, /health.

Cases: a correct fleet passes (exit 0, KV events seen with their block size); the
connect/connect KV-events mistake, a wrong model name, a dead Mooncake bootstrap port and a
closed LMCache alloc port each give their line and exit 1; --json parses; --json alone is
refused; the start-up run logs warnings, counts them in pdgw_engine_checks, and pdgw serves;
a start-up run still listening ends at SIGTERM. Every pdgw exits without a sanitizer report.
"""

import json
import os
import subprocess
import tempfile
import threading
import time

import pdgwtest as T

MODEL = "sim-model"
BLOCK = 16
SIM_TIMING = ["--ttft-ms", "1", "--tpot-ms", "1"]


def start_sim(name, args, attempts=4):
    """pdgw-sim on fresh ports; <args> is a function of the main port and two spare ports."""
    for attempt in range(attempts):
        port, a, b = T.free_port(), T.free_port(), T.free_port()
        p = T.Proc(name, [T.binary("pdgw-sim"), "--port", str(port), "--model", MODEL,
                          *SIM_TIMING, *args(port, a, b)])
        try:
            T.wait_http(port, "/health", timeout=10, proc=p)
            return p, port, a, b
        except RuntimeError:
            out = p.output()
            p.kill()
            if ("in use" in out or "cannot" in out) and attempt + 1 < attempts:
                continue
            raise


def kv_events_args(endpoint, replay=None):
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
           "topic": "kv"}
    if replay:
        cfg["replay_endpoint"] = replay
    return ["--block-size", str(BLOCK), "--kv-events-config", json.dumps(cfg)]


def write_config(lines):
    f = tempfile.NamedTemporaryFile("w", prefix="pdgw-doctor-", suffix=".yaml", delete=False)
    f.write("\n".join(lines) + "\n")
    f.close()
    return f.name


def base_lines(protocol, extra=()):
    return [f'listen: "127.0.0.1:{T.free_port()}"', "workers: 1", f"protocol: {protocol}",
            "check_engines_timeout: 1s", "check_engines_events_wait: 2s", "log_level: warn",
            *extra, "instances:"]


def doctor(path, *flags):
    """Run pdgw --check-engines; (exit status, stdout, seconds taken)."""
    start = time.time()
    r = subprocess.run([T.binary("pdgw"), "--config", path, "--check-engines", *flags],
                       capture_output=True, text=True, timeout=60)
    assert_clean(r.stderr)
    return r.returncode, r.stdout + r.stderr, time.time() - start


def assert_clean(out):
    """No sanitizer report (the sanitizer build runs this test too)."""
    assert "Sanitizer" not in out and "runtime error:" not in out, out[-5000:]


def stop(gw, bound_s=10):
    """SIGTERM; pdgw exits 0 within <bound_s> without a sanitizer report; the seconds taken."""
    start = time.time()
    gw.signal(15)
    rc = gw.wait(timeout=bound_s)
    out = gw.output()
    assert rc == 0, f"pdgw exited {rc}:\n{out[-3000:]}"
    assert_clean(out)
    return time.time() - start


def rows(path):
    rc, out, _ = doctor(path, "--json")
    doc = json.loads(out)  # --json output parses
    assert doc["ok"] == (rc == 0), (rc, doc)
    return rc, doc


def find(doc, instance, check):
    got = [c for c in doc["checks"] if c["instance"] == instance and c["check"] == check]
    assert got, (instance, check, json.dumps(doc, indent=1))
    return got[0]


def complete(port, salt=0):
    """One request; a new <salt> makes new blocks (a repeated prompt is a cache hit and
    publishes nothing)."""
    st, _, _, raw = T.post_json(port, "/v1/completions",
                                {"model": MODEL, "prompt": f"doctor {salt} " + "x " * 80,
                                 "max_tokens": 2})
    assert st == 200, raw[:300]


def test_correct_fleet_passes():
    """Two engines publishing KV events on bind endpoints (one with a replay ROUTER): exit 0,
    every row ok or info, events seen with their block size."""
    s0, p0, ev0, rp0 = start_sim("ok0", lambda p, a, b: ["--role", "both"] + kv_events_args(
        f"tcp://*:{a}", f"tcp://*:{b}"))
    s1, p1, ev1, _ = start_sim("ok1", lambda p, a, b: ["--role", "both"] + kv_events_args(
        f"tcp://*:{a}"))
    path = write_config(base_lines("neutral", ["prefill_policy: precise-prefix",
                                               "decode_policy: precise-prefix"]) + [
        "  - id: ok0", f"    url: http://127.0.0.1:{p0}", f"    models: [{MODEL}]",
        f'    kv_events_endpoint: "tcp://127.0.0.1:{ev0}"',
        f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{rp0}"',
        "  - id: ok1", f"    url: http://127.0.0.1:{p1}",
        f'    kv_events_endpoint: "tcp://127.0.0.1:{ev1}"'])
    try:
        complete(p0)  # buffered on ok0: the replay brings it back
        # ok1 has no replay: it must publish while the doctor listens, however long the
        # doctor takes to start listening (a sanitizer build is slow): until it is done
        done = threading.Event()

        def traffic():
            deadline, n = time.time() + 60, 0
            while not done.is_set() and time.time() < deadline:
                n += 1
                complete(p1, n)
                done.wait(0.1)  # pace: a request every 100 ms

        th = threading.Thread(target=traffic)
        th.start()
        try:
            rc, doc = rows(path)
        finally:
            done.set()
            th.join()
        bad = [c for c in doc["checks"] if c["result"] not in ("ok", "info")]
        assert rc == 0 and not bad, json.dumps(doc, indent=1)
        for inst in ("ok0", "ok1"):
            assert "block size 16" in find(doc, inst, "kv-events")["detail"], doc
            assert find(doc, inst, "health")["result"] == "ok"
            assert find(doc, inst, "metrics")["result"] == "ok"
        assert find(doc, "ok0", "models")["result"] == "ok"
        rc2, text, took = doctor(path)
        assert rc2 == 0 and "INSTANCE" in text and "0 error(s)" in text, text
        assert took < 10, took  # bounded: 2 s events wait, probes concurrent
    finally:
        s0.kill()
        s1.kill()
        os.unlink(path)


def test_connect_connect_and_wrong_model():
    """An engine whose KV-events endpoint is a connect address (vLLM then connects its PUB,
    and so does pdgw: nobody listens) and an instance configured with a model the engine does
    not serve: both named, exit 1."""
    s, port, ev, _ = start_sim("cc", lambda p, a, b: ["--role", "both"] + kv_events_args(
        f"tcp://127.0.0.1:{a}"))
    path = write_config(base_lines("neutral") + [
        "  - id: cc", f"    url: http://127.0.0.1:{port}", "    models: [no-such-model]",
        f'    kv_events_endpoint: "tcp://127.0.0.1:{ev}"'])
    try:
        complete(port)
        rc, doc = rows(path)
        assert rc == 1, doc
        kv = find(doc, "cc", "kv-events")
        assert kv["result"] == "error" and "nothing listens" in kv["detail"], kv
        assert "tcp://*:PORT" in kv["fix"] and "connects" in kv["fix"], kv
        m = find(doc, "cc", "models")
        assert m["result"] == "error" and "no-such-model" in m["detail"], m
        assert MODEL in m["detail"], m
        rc2, text, _ = doctor(path)
        assert rc2 == 1 and "nothing listens" in text and "no-such-model" in text, text
    finally:
        s.kill()
        os.unlink(path)


def mooncake_fleet(boot_override=None):
    pre, pp, kvp, boot = start_sim("mcp", lambda p, a, b: [
        "--role", "prefill", "--kv-port", str(a), "--bootstrap-port", str(b),
        "--engine-id", f"mc-{p}"])
    dec, dp, _, _ = start_sim("mcd", lambda p, a, b: ["--role", "decode"])
    path = write_config(base_lines("vllm-mooncake") + [
        "  - id: mcp", f"    url: http://127.0.0.1:{pp}", "    role: prefill",
        f"    kv_port: {kvp}", f"    bootstrap_port: {boot_override or boot}",
        "  - id: mcd", f"    url: http://127.0.0.1:{dp}", "    role: decode"])
    return [pre, dec], path, pp


def test_mooncake_bootstrap():
    """A live bootstrap server passes with its engine ids per DP rank; a port nobody serves
    (the prefill's bootstrap moved) gives the bootstrap line and exit 1."""
    procs, path, pp = mooncake_fleet()
    try:
        rc, doc = rows(path)
        b = find(doc, "mcp", "bootstrap")
        assert rc == 0 and b["result"] == "ok" and f"0=mc-{pp}" in b["detail"], doc
    finally:
        for p in procs:
            p.kill()
        os.unlink(path)
    dead = T.free_port()  # handed out to nobody else: nothing binds it
    procs, path, _ = mooncake_fleet(boot_override=dead)
    try:
        rc, doc = rows(path)
        b = find(doc, "mcp", "bootstrap")
        assert rc == 1 and b["result"] == "error" and str(dead) in b["detail"], doc
        assert "bootstrap_port" in b["fix"], b
    finally:
        for p in procs:
            p.kill()
        os.unlink(path)


def lmcache_fleet(alloc_override=None):
    pre, pp, _, _ = start_sim("lmp", lambda p, a, b: ["--role", "prefill"])
    dec, dp, alloc, init = start_sim("lmd", lambda p, a, b: [
        "--role", "decode", "--alloc-port", str(a), "--init-port", str(b)])
    path = write_config(base_lines("lmcache") + [
        "  - id: lmp", f"    url: http://127.0.0.1:{pp}", "    role: prefill",
        "  - id: lmd", f"    url: http://127.0.0.1:{dp}", "    role: decode",
        f"    alloc_ports: [{alloc_override or alloc}]", f"    init_ports: [{init}]",
        "    tp_size: 1", "    kv_engine: libkvt"])
    return [pre, dec], path


def test_lmcache_alloc_port():
    """The decode's alloc and init ports greet as ZeroMQ (nothing is sent to them); a closed
    alloc port gives its line and exit 1."""
    procs, path = lmcache_fleet()
    try:
        rc, doc = rows(path)
        assert rc == 0, json.dumps(doc, indent=1)
        assert find(doc, "lmd", "alloc port[0]")["result"] == "ok"
        assert find(doc, "lmd", "init port[0]")["result"] == "ok"
    finally:
        for p in procs:
            p.kill()
        os.unlink(path)
    closed = T.free_port()
    procs, path = lmcache_fleet(alloc_override=closed)
    try:
        rc, doc = rows(path)
        a = find(doc, "lmd", "alloc port[0]")
        assert rc == 1 and a["result"] == "error" and str(closed) in a["detail"], doc
        assert find(doc, "lmd", "init port[0]")["result"] == "ok"
    finally:
        for p in procs:
            p.kill()
        os.unlink(path)


def test_json_alone_refused():
    r = subprocess.run([T.binary("pdgw"), "--json", "--both", "http://127.0.0.1:1"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 1 and "--check-engines" in r.stderr, (r.returncode, r.stderr)


def test_startup_run_warns_but_serves():
    """check_engines_at_start: the wrong model name is logged as a warning and counted, and
    pdgw serves the model the engine has."""
    s, port, _, _ = start_sim("st", lambda p, a, b: ["--role", "both"])
    gw_port = T.free_port()
    path = write_config([f'listen: "127.0.0.1:{gw_port}"', "workers: 1", "protocol: neutral",
                         "check_engines_at_start: true", "check_engines_timeout: 1s",
                         "log_level: info", "instances:",
                         "  - id: st", f"    url: http://127.0.0.1:{port}",
                         f"    models: [{MODEL}, not-served]"])
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    try:
        T.wait_http(gw_port, "/ready", timeout=15, proc=gw)
        deadline = time.time() + 15
        while "engine checks done" not in gw.output():
            assert time.time() < deadline and gw.alive(), gw.output()
            time.sleep(0.05)
        log = gw.output()
        assert "engine check st models: error" in log and "not-served" in log, log
        _, _, body = T.request("GET", gw_port, "/metrics")
        errors = T.metric_value(body.decode(), "pdgw_engine_checks", {"result": "error"})
        assert errors is not None and errors >= 1, body.decode()[-2000:]
        complete(gw_port)  # the gateway serves regardless
        stop(gw)
    finally:
        gw.kill()
        s.kill()
        os.unlink(path)


def test_startup_run_stopped_at_shutdown():
    """A start-up run still listening for KV events (a 60 s wait, an engine that publishes
    nothing) ends at SIGTERM: pdgw exits promptly and cleanly, having logged no result."""
    s, port, ev, _ = start_sim("quiet", lambda p, a, b: ["--role", "both"] + kv_events_args(
        f"tcp://*:{a}"))
    gw_port = T.free_port()
    path = write_config([f'listen: "127.0.0.1:{gw_port}"', "workers: 1", "protocol: neutral",
                         "check_engines_at_start: true", "check_engines_timeout: 1s",
                         "check_engines_events_wait: 60s", "log_level: info", "instances:",
                         "  - id: quiet", f"    url: http://127.0.0.1:{port}",
                         f'    kv_events_endpoint: "tcp://127.0.0.1:{ev}"'])
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    try:
        T.wait_http(gw_port, "/ready", timeout=15, proc=gw)
        _, _, body = T.request("GET", gw_port, "/metrics")
        # not done yet: the gauge appears only when the run finished
        assert "pdgw_engine_checks{" not in body.decode(), body.decode()[-2000:]
        took = stop(gw)
        assert took < 8, took
        assert "engine checks done" not in gw.output(), gw.output()[-3000:]
    finally:
        gw.kill()
        s.kill()
        os.unlink(path)


if __name__ == "__main__":
    T.run([test_correct_fleet_passes, test_connect_connect_and_wrong_model,
           test_mooncake_bootstrap, test_lmcache_alloc_port, test_json_alone_refused,
           test_startup_run_warns_but_serves, test_startup_run_stopped_at_shutdown])
