"""Scheduler policies seen through a real pdgw and three pdgw-sim engines.

- prefix-aware: repeats of one long prompt stick to one engine, another
  prompt family may go elsewhere;
- least-load: concurrent slow streams spread over all engines;
- /metrics carries the scheduler families and passes promtool.
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import pdgwtest as t

MODEL = "sim-model"


def sim_finished(port):
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200, status
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm:request_success_total"))


class Stack:
    def __init__(self, policy):
        self.sim_ports = [t.free_port() for _ in range(3)]
        self.sims = []
        for i, port in enumerate(self.sim_ports):
            p = t.Proc(f"sim{i}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                                   "--ttft-ms", "5", "--tpot-ms", "5", "--model", MODEL])
            self.sims.append(p)
            t.wait_http(port, "/health", timeout=10, proc=p)
        self.gw_port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-sched-", suffix=".yaml",
                                               delete=False)
        lines = [f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: neutral",
                 f"prefill_policy: {policy}", f"decode_policy: {policy}",
                 "health_interval: 500ms", "health_timeout: 500ms",
                 "metrics_scrape_interval: 500ms", "access_log: false", "instances:"]
        for i, port in enumerate(self.sim_ports):
            lines += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both"]
        self.cfg.write("\n".join(lines) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        t.wait_http(self.gw_port, "/ready", timeout=15, proc=self.gw)

    def close(self):
        for p in self.sims + [self.gw]:
            p.kill()
        os.unlink(self.cfg.name)

    def complete(self, prompt, max_tokens=2):
        status, _, body, raw = t.post_json(self.gw_port, "/v1/completions",
                                           {"model": MODEL, "prompt": prompt,
                                            "max_tokens": max_tokens}, timeout=30)
        assert status == 200, (status, raw[:300])
        return body

    def total_inflight(self):
        status, _, body = t.request("GET", self.gw_port, "/admin/instances", timeout=5)
        assert status == 200
        data = json.loads(body)
        if isinstance(data, dict):
            data = data.get("instances", data.get("data", []))
        return sum(inst["load"]["inflight"] for inst in data)

    def finished(self):
        return [sim_finished(p) for p in self.sim_ports]


def test_prefix_affinity():
    s = Stack("prefix-aware")
    try:
        family_a = "You are a helpful assistant. " * 40  # ~1,200 bytes shared prefix
        before = s.finished()
        for i in range(9):
            s.complete(family_a + f"Question {i}: what is {i} + {i}?")
        after = s.finished()
        delta = [a - b for a, b in zip(after, before)]
        assert sorted(delta) == [0, 0, 9], delta  # one engine took all of them
    finally:
        s.close()


def test_least_load_spreads_streams():
    s = Stack("least-load")
    try:
        before = s.finished()
        done = []

        def stream():
            events = list(t.sse_events(s.gw_port, "/v1/completions",
                                       {"model": MODEL, "prompt": "spread", "max_tokens": 200,
                                        "stream": True, "ignore_eos": True}, timeout=60))
            done.append(events[-1])

        threads = [threading.Thread(target=stream) for _ in range(6)]
        for k, th in enumerate(threads):
            th.start()
            # let each booking land before the next choice
            deadline = time.time() + 5
            while time.time() < deadline and s.total_inflight() < k + 1:
                time.sleep(0.005)
        for th in threads:
            th.join(60)
        assert done == ["[DONE]"] * 6, done
        delta = [a - b for a, b in zip(s.finished(), before)]
        assert delta == [2, 2, 2], delta
    finally:
        s.close()


def test_metrics_families():
    s = Stack("round-robin")
    try:
        s.complete("hello")
        status, _, body = t.request("GET", s.gw_port, "/metrics", timeout=5)
        assert status == 200
        text = body.decode()
        for family in ("pdgw_instance_inflight", "pdgw_instance_healthy", "pdgw_breaker_state",
                       "pdgw_schedule_seconds_bucket", "pdgw_no_instance_total"):
            assert family in text, family
        assert t.metric_value(text, "pdgw_instance_healthy", {"instance": "s0"}) == 1
        assert t.metric_value(text, "pdgw_breaker_state", {"instance": "s1"}) == 0
        assert t.metric_value(text, "pdgw_schedule_seconds_count") >= 1
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        s.close()


if __name__ == "__main__":
    t.run([test_prefix_affinity, test_least_load_spreads_streams, test_metrics_families])
