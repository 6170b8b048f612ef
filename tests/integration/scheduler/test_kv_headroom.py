"""No decode preemption while another decode has room (pdgw's KV headroom).

A PD fleet of pdgw-sim engines behind a real pdgw (vllm-nixl, batch scheduling): one
prefill and two decodes, "small" with 2,048 tokens of KV and "big" with 65,536. pdgw is
told neither: it reads each engine's capacity from the vllm:cache_config_info gauge that
vLLM exports (vllm/v1/metrics/loggers.py log_metrics_info, labels num_gpu_blocks and
block_size from vllm/config/cache.py metrics_info), which pdgw-sim imitates. A burst of
concurrent requests of 400 prompt tokens + 200 output tokens is sent; four of them at once
on small need 2,400 tokens, more than it holds, so the engine preempts (vLLM V1 recomputes
the last admitted request, counted in vllm:num_preemptions_total). Under round-robin (the
control: it does not look) small preempts; under least-load and slo, which keep a decode's
projected KV (prompt + max_tokens of what is booked on it) within its capacity, neither
decode preempts, and pdgw counts the bookings that passed small over.
"""
# ctest-timeout: 120
# ctest-labels: scheduler

import json
import os
import tempfile
import threading
import time

import pdgwtest as t

MODEL = "sim-model"
CAPACITY = {"small": 2048, "big": 65536}
PROMPT, OUTPUT, CONCURRENT, ROUNDS = 400, 200, 8, 2
TIMING = ["--ttft-ms", "5", "--prefill-ms-per-token", "0.01", "--tpot-ms", "4",
          "--max-batch", "16"]


class Fleet:
    def __init__(self, policy):
        self.procs, self.ports, self.cfg = [], {}, None
        try:
            self._start(policy)
        except BaseException:
            self.close()
            raise

    def _sim(self, name, role, extra):
        port = t.free_port()
        p = t.Proc(f"sim-{name}", [t.binary("pdgw-sim"), "--role", role, "--port", str(port),
                                   "--model", MODEL, "--engine-id", f"hr-{name}-{port}",
                                   *TIMING, *extra])
        self.procs.append(p)
        self.ports[name] = port
        return port, p

    def _start(self, policy):
        inst = []
        kvp, boot = t.free_port(), t.free_port()
        port, p = self._sim("p0", "prefill", ["--kv-port", str(kvp), "--bootstrap-port",
                                              str(boot)])
        inst.append([f"id: p0", f"url: http://127.0.0.1:{port}", "role: prefill",
                     f"engine_id: hr-p0-{port}", f"kv_port: {kvp}", f"bootstrap_port: {boot}"])
        for name, cap in CAPACITY.items():
            alloc, init = t.free_port(), t.free_port()
            port, p = self._sim(name, "decode", ["--kv-capacity-tokens", str(cap),
                                                 "--alloc-port", str(alloc), "--init-port",
                                                 str(init)])
            inst.append([f"id: {name}", f"url: http://127.0.0.1:{port}", "role: decode",
                         f"engine_id: hr-{name}-{port}", f"alloc_ports: [{alloc}]",
                         f"init_ports: [{init}]", "tp_size: 1"])
        for name, port in self.ports.items():
            t.wait_http(port, "/health", timeout=10)
        self.gw_port = t.free_port()
        lines = [f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: vllm-nixl",
                 "scheduling: batch", f"prefill_policy: {policy}", f"decode_policy: {policy}",
                 "health_interval: 1s", "metrics_scrape_interval: 100ms", "access_log: false",
                 "log_level: warn", "instances:"]
        for fields in inst:
            lines += ["  - " + fields[0]] + ["    " + f for f in fields[1:]]
        cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-hr-", suffix=".yaml", delete=False)
        cfg.write("\n".join(lines) + "\n")
        cfg.close()
        self.cfg = cfg.name
        gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg])
        self.procs.append(gw)
        t.wait_http(self.gw_port, "/ready", timeout=15, proc=gw)

    def instances(self):
        status, _, body = t.request("GET", self.gw_port, "/admin/instances", timeout=5)
        assert status == 200, status
        data = json.loads(body)
        if isinstance(data, dict):
            data = data.get("instances", data.get("data", []))
        return {i["id"]: i for i in data}

    def preemptions(self, name):
        status, _, body = t.request("GET", self.ports[name], "/metrics", timeout=5)
        assert status == 200
        return t.metric_value(body.decode(), "vllm:num_preemptions_total") or 0.0

    def close(self):
        for p in reversed(self.procs):
            p.kill()
        if self.cfg:
            os.unlink(self.cfg)


def until(pred, timeout, what):
    """Poll <pred> (as wait_http polls a port) until true; fail naming <what>."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def burst(fleet):
    errors = []
    counter = iter(range(10 ** 6))
    lock = threading.Lock()

    def worker():
        for _ in range(ROUNDS):
            with lock:
                n = next(counter)
            # distinct token ids per request: no prefix-cache hit shrinks a prompt
            prompt = [1000 + n * PROMPT + i for i in range(PROMPT)]
            try:
                status, _, body = t.request(
                    "POST", fleet.gw_port, "/v1/completions",
                    json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT,
                                "ignore_eos": True}).encode(),
                    {"Content-Type": "application/json"}, timeout=60)
                if status != 200:
                    errors.append((status, body[:200]))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(CONCURRENT)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]


def run_policy(policy):
    fleet = Fleet(policy)
    try:
        # pdgw learns the capacities from the engines' own gauge (a scrape away)
        until(lambda: all(
            (fleet.instances()[n].get("kv_headroom") or {}).get("capacity_tokens") == c
            for n, c in CAPACITY.items()), 10, "KV capacities scraped")
        src = fleet.instances()["small"]["kv_headroom"]["capacity_source"]
        assert src == "engine", src
        burst(fleet)
        pre = {n: fleet.preemptions(n) for n in CAPACITY}
        status, _, body = t.request("GET", fleet.gw_port, "/metrics", timeout=5)
        refusals = t.metric_value(body.decode(), "pdgw_decode_kv_headroom_refusals_total",
                                  {"instance": "small"})
        print(policy, "preemptions:", pre, "refusals on small:", refusals)
        return pre, refusals
    finally:
        fleet.close()


def test_round_robin_preempts():
    pre, _ = run_policy("round-robin")
    assert pre["small"] > 0, pre


def test_least_load_keeps_headroom():
    pre, refusals = run_policy("least-load")
    assert pre == {"small": 0, "big": 0}, pre
    assert refusals and refusals > 0, refusals


def test_slo_keeps_headroom():
    pre, refusals = run_policy("slo")
    assert pre == {"small": 0, "big": 0}, pre
    assert refusals and refusals > 0, refusals


if __name__ == "__main__":
    t.run([test_round_robin_preempts, test_least_load_keeps_headroom, test_slo_keeps_headroom])
