"""Scheduler failover behind a real pdgw: three pdgw-sim engines (role both).

- kill one: requests keep succeeding (retried elsewhere), probes mark it down
  (/admin/instances and pdgw_instance_healthy), it comes back when restarted;
- drain one through the admin API: requests in flight on it finish, no new
  request reaches it (its own vllm:request_success_total stays put), undrain
  brings it back;
- admin add / remove / validation errors.
"""

import json
import os
import signal
import sys
import tempfile
import threading
import time

import pdgwtest as t

MODEL = "sim-model"


def sim_finished(port):
    """Inference requests an engine has finished (all finished_reason labels)."""
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200, status
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Stack:
    """Three sims behind one pdgw (neutral protocol, round-robin decode)."""

    def __init__(self):
        self.sim_ports = [t.free_port() for _ in range(3)]
        self.sims = [None, None, None]
        for i in range(3):
            self.start_sim(i)
        self.gw_port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-sched-", suffix=".yaml",
                                               delete=False)
        lines = [
            f'listen: "127.0.0.1:{self.gw_port}"',
            "workers: 2",
            "protocol: neutral",
            "retries: 2",
            "connect_timeout: 500ms",
            "prefill_policy: round-robin",
            "decode_policy: round-robin",
            "health_interval: 500ms",
            # a killed engine refuses at once; the timeout only has to survive a loaded machine
            "health_timeout: 500ms",
            "healthy_threshold: 1",
            "unhealthy_threshold: 2",
            "metrics_scrape_interval: 300ms",
            "breaker_failures: 3",
            "breaker_open_time: 1s",
            "access_log: false",
            "instances:",
        ]
        for i, port in enumerate(self.sim_ports):
            lines += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both"]
        self.cfg.write("\n".join(lines) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        t.wait_http(self.gw_port, "/ready", timeout=15, proc=self.gw)

    def start_sim(self, i):
        self.sims[i] = t.Proc(f"sim{i}", [t.binary("pdgw-sim"), "--role", "both", "--port",
                                          str(self.sim_ports[i]), "--ttft-ms", "5",
                                          "--tpot-ms", "5", "--model", MODEL])
        t.wait_http(self.sim_ports[i], "/health", timeout=10, proc=self.sims[i])

    def close(self):
        for p in self.sims + [self.gw]:
            if p is not None:
                p.kill()
        os.unlink(self.cfg.name)

    def complete(self, max_tokens=4, timeout=30):
        status, _, body, raw = t.post_json(
            self.gw_port, "/v1/completions",
            {"model": MODEL, "prompt": "hello scheduler", "max_tokens": max_tokens},
            timeout=timeout)
        return status, body, raw

    def instances(self):
        status, _, body = t.request("GET", self.gw_port, "/admin/instances", timeout=5)
        assert status == 200, (status, body)
        data = json.loads(body)
        if isinstance(data, dict):  # {"instances": [...]} or a bare list
            data = data.get("instances", data.get("data", []))
        return {inst["id"]: inst for inst in data}

    def gw_metric(self, name, labels):
        status, _, body = t.request("GET", self.gw_port, "/metrics", timeout=5)
        assert status == 200
        return t.metric_value(body.decode(), name, labels)

    def wait_state(self, iid, state, timeout=10.0):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = self.instances().get(iid, {}).get("state")
            if last == state:
                return
            time.sleep(0.05)
        raise AssertionError(f"{iid} state {last!r}, expected {state!r}")


def expect_ok(stack, n, max_tokens=4):
    for k in range(n):
        status, body, raw = stack.complete(max_tokens)
        assert status == 200, (k, status, raw[:300])
        assert body["choices"][0]["text"], body


def test_kill_marks_down_and_recovers():
    s = Stack()
    try:
        expect_ok(s, 6)
        before = [sim_finished(p) for p in s.sim_ports]
        assert all(b >= 1 for b in before), before  # round-robin reached everyone

        s.sims[1].kill()
        # requests keep succeeding while s1 is dead (connect error -> retry elsewhere)
        expect_ok(s, 12)
        s.wait_state("s1", "down", timeout=10)
        inst = s.instances()["s1"]
        assert inst["last_error"], inst
        assert s.gw_metric("pdgw_instance_healthy", {"instance": "s1"}) == 0
        assert s.gw_metric("pdgw_instance_healthy", {"instance": "s0"}) == 1
        expect_ok(s, 6)

        s.start_sim(1)
        s.wait_state("s1", "up", timeout=10)
        assert s.gw_metric("pdgw_instance_healthy", {"instance": "s1"}) == 1
        # new requests reach the restarted engine again
        deadline = time.time() + 10
        while sim_finished(s.sim_ports[1]) < 1 and time.time() < deadline:
            expect_ok(s, 3)
        assert sim_finished(s.sim_ports[1]) >= 1
    finally:
        s.close()


def test_drain_stops_new_requests_inflight_finish():
    s = Stack()
    try:
        expect_ok(s, 3)
        s2_start = sim_finished(s.sim_ports[2])
        results = []

        def stream():
            try:
                events = list(t.sse_events(s.gw_port, "/v1/completions",
                                           {"model": MODEL, "prompt": "drain me",
                                            "max_tokens": 300, "stream": True,
                                            "ignore_eos": True}, timeout=60))
                results.append(events)
            except Exception as e:  # recorded and asserted below
                results.append(e)

        # start slow streams until one is in flight on s2 (round-robin: about every third)
        threads = []
        for _ in range(6):
            th = threading.Thread(target=stream)
            th.start()
            threads.append(th)
            deadline = time.time() + 1.0
            while time.time() < deadline and s.instances()["s2"]["load"]["inflight"] < 1:
                time.sleep(0.02)
            if s.instances()["s2"]["load"]["inflight"] >= 1:
                break
        assert s.instances()["s2"]["load"]["inflight"] >= 1, s.instances()["s2"]

        status, _, body = t.request("POST", s.gw_port, "/admin/instances/s2/drain", timeout=5)
        assert status == 200, (status, body)
        assert s.instances()["s2"]["state"] == "draining"
        assert s.gw_metric("pdgw_instance_inflight", {"instance": "s2"}) >= 1

        for th in threads:
            th.join(60)
        assert len(results) == len(threads)
        for r in results:
            assert not isinstance(r, Exception), r
            assert r[-1] == "[DONE]", r[-3:]
            assert not any('"error"' in ev for ev in r), r
        assert s.instances()["s2"]["load"]["inflight"] == 0
        assert sim_finished(s.sim_ports[2]) >= s2_start + 1  # the stream on s2 ended there

        drained_before = sim_finished(s.sim_ports[2])
        others_before = sim_finished(s.sim_ports[0]) + sim_finished(s.sim_ports[1])
        expect_ok(s, 12)
        assert sim_finished(s.sim_ports[2]) == drained_before
        assert sim_finished(s.sim_ports[0]) + sim_finished(s.sim_ports[1]) >= others_before + 12

        status, _, _ = t.request("POST", s.gw_port, "/admin/instances/s2/undrain", timeout=5)
        assert status == 200
        assert s.instances()["s2"]["state"] == "up"
        expect_ok(s, 6)
        assert sim_finished(s.sim_ports[2]) > drained_before

        status, _, _ = t.request("POST", s.gw_port, "/admin/instances/nope/drain", timeout=5)
        assert status == 404, status
    finally:
        s.close()


def test_admin_add_remove():
    s = Stack()
    try:
        status, _, _ = t.request("DELETE", s.gw_port, "/admin/instances/s0", timeout=5)
        assert status in (200, 204), status
        assert sorted(s.instances()) == ["s1", "s2"]
        before = sim_finished(s.sim_ports[0])
        expect_ok(s, 6)
        assert sim_finished(s.sim_ports[0]) == before

        status, _, body, raw = t.post_json(s.gw_port, "/admin/instances",
                                           {"id": "s0b", "role": "both",
                                            "url": f"http://127.0.0.1:{s.sim_ports[0]}"})
        assert status in (200, 201), (status, raw)
        assert s.instances()["s0b"]["state"] == "up"
        status, _, body, raw = t.post_json(s.gw_port, "/admin/instances",
                                           {"id": "s0b", "role": "both",
                                            "url": f"http://127.0.0.1:{s.sim_ports[0]}"})
        assert status == 409, (status, raw)
        status, _, body, raw = t.post_json(s.gw_port, "/admin/instances",
                                           {"id": "bad", "url": "ftp://x"})
        assert status == 400, (status, raw)
        assert b"url" in raw, raw
        expect_ok(s, 6)
        assert sim_finished(s.sim_ports[0]) > before
    finally:
        s.close()


if __name__ == "__main__":
    t.run([test_kill_marks_down_and_recovers, test_drain_stops_new_requests_inflight_finish,
           test_admin_add_remove])
