"""An engine whose KV events never reach pdgw, found at run time: a real pdgw and two
pdgw-sim engines, one set up right, one with the connect/connect mistake.

Upstream facts (vllm-project/vllm):
- vllm/distributed/kv_events.py ZmqEventPublisher: the PUB binds when the endpoint has a
  wildcard ("*", "::") or is ipc:// / inproc://, and connects otherwise; so an engine given
  tcp://127.0.0.1:PORT connects, and pdgw's SUB, which connects too, hears nothing
  (pdgw-sim imitates that, tests/sim/sim_kv_events.c). A batch is the multipart message
  [topic, 8-byte big-endian seq, msgpack payload].
- tests/v1/core/test_kv_events_contract.py: the payload is the array [ts, [events],
  data_parallel_rank], each event a map whose "type" names it.

What pdgw promises (docs/protocols/kv-events.md, Silence at run time):
- once precise-prefix routed requests to the silent instance and kv_events_silence (1 s
  here) passed, exactly one warning line names its endpoint, pdgw_kv_event_silent is 1
  for it and /admin/instances shows kv_events.silent;
- when a publisher then binds that endpoint and sends, exactly one "resumed" line follows
  and the gauge clears;
- the instance set up right is never warned about.
"""

import json
import os
import tempfile
import time

import msgpack
import zmq

import pdgwtest as t

MODEL = "sim-model"
BLOCK = 16


def prompt(k):
    return [3000 + 97 * k + i for i in range(2 * BLOCK + 3)]


class Fleet:
    def __init__(self):
        self.ports, self.ev_ports, self.sims = [], [], []
        # s0 binds (wildcard) as it should; s1 names a host, so it connects
        for i, bind in enumerate((True, False)):
            self._start_sim(i, bind)
        self.gw_port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-kvsil-", suffix=".yaml",
                                               delete=False)
        lines = [f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: neutral",
                 "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
                 "kv_events_silence: 1s", "health_interval: 500ms", "health_timeout: 500ms",
                 "access_log: false", "instances:"]
        for i, port in enumerate(self.ports):
            lines += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both",
                      f'    kv_events_endpoint: "tcp://127.0.0.1:{self.ev_ports[i]}"']
        self.cfg.write("\n".join(lines) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        t.wait_http(self.gw_port, "/ready", timeout=15, proc=self.gw)

    def _start_sim(self, i, bind, attempts=3):
        for attempt in range(attempts):
            port, ev = t.free_port(), t.free_port()
            endpoint = f"tcp://*:{ev}" if bind else f"tcp://127.0.0.1:{ev}"
            kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
            p = t.Proc(f"sim{i}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                                   "--ttft-ms", "1", "--tpot-ms", "1", "--model", MODEL,
                                   "--block-size", str(BLOCK),
                                   "--kv-events-config", json.dumps(kv_cfg)])
            try:
                t.wait_http(port, "/health", timeout=10, proc=p)
            except RuntimeError:
                out = p.output()
                p.kill()
                if ("in use" in out or "cannot listen" in out) and attempt + 1 < attempts:
                    continue
                raise
            self.ports.append(port)
            self.ev_ports.append(ev)
            self.sims.append(p)
            return

    def close(self):
        for p in self.sims + [self.gw]:
            p.kill()
        os.unlink(self.cfg.name)

    def endpoint(self, i):
        return f"tcp://127.0.0.1:{self.ev_ports[i]}"

    def admin(self, method, path):
        status, _, body = t.request(method, self.gw_port, path, timeout=5)
        assert status == 200, (status, body[:300])
        return body

    def kv_events(self, i):
        for inst in json.loads(self.admin("GET", "/admin/instances")):
            if inst["id"] == f"s{i}":
                return inst["kv_events"]
        raise AssertionError(f"s{i} not in /admin/instances")

    def metric(self, name, i):
        _, _, body = t.request("GET", self.gw_port, "/metrics", timeout=5)
        return t.metric_value(body.decode(), name, {"instance": f"s{i}"})

    def batches(self):
        _, _, body = t.request("GET", self.gw_port, "/metrics", timeout=5)
        return t.metric_value(body.decode(), "pdgw_kv_event_batches_total") or 0.0

    def lines(self, needle):
        return [ln for ln in self.gw.output().splitlines() if needle in ln]

    def wait(self, what, cond, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(0.05)
        raise TimeoutError(what)

    def route_to(self, i, n):
        """<n> requests with token prompts through pdgw, all to s<i> (the other drained)."""
        other = 1 - i
        self.admin("POST", f"/admin/instances/s{other}/drain")
        self.admin("POST", f"/admin/instances/s{i}/undrain")
        for k in range(n):
            status, _, _, raw = t.post_json(self.gw_port, "/v1/completions",
                                            {"model": MODEL, "prompt": prompt(10 * i + k),
                                             "max_tokens": 1}, timeout=30)
            assert status == 200, (status, raw[:300])
        self.admin("POST", f"/admin/instances/s{other}/undrain")


def warned(fleet, i):
    return fleet.lines(f"kv events: nothing from {fleet.endpoint(i)}")


def resumed(fleet, i):
    return fleet.lines(f"kv events from {fleet.endpoint(i)} resumed after")


def batch(seq):
    """One batch as current vLLM sends it: an array of map events."""
    toks = prompt(100 + seq)[:BLOCK]
    ev = {"type": "BlockStored", "block_hashes": [7000 + seq], "parent_block_hash": None,
          "token_ids": toks, "block_size": BLOCK, "lora_id": None, "medium": "GPU",
          "lora_name": None, "extra_keys": [None], "group_idx": 0,
          "kv_cache_spec_kind": "full_attention"}
    return [b"", seq.to_bytes(8, "big"),
            msgpack.packb([time.time(), [ev], 0], use_bin_type=True)]


def test_silent_instance_warned_once_then_resumed():
    fleet = Fleet()
    ctx = zmq.Context()
    try:
        # the instance set up right is routed to and publishes: never silent
        fleet.route_to(0, 3)
        fleet.wait("s0's events", lambda: fleet.kv_events(0)["ever"])

        # the misconfigured one is routed to and stays silent past kv_events_silence
        fleet.route_to(1, 3)
        fleet.wait("one warning for s1", lambda: warned(fleet, 1))
        kv = fleet.kv_events(1)
        assert kv["silent"] is True and kv["ever"] is False, kv
        assert kv["routed_since_last_event"] >= 3, kv
        assert fleet.metric("pdgw_kv_event_silent", 1) == 1
        # still one line after more checks (two more silence periods)
        quiet = fleet.metric("pdgw_kv_event_silence_seconds", 1)
        fleet.wait("s1 silent 2 s more",
                   lambda: fleet.metric("pdgw_kv_event_silence_seconds", 1) >= quiet + 2)
        assert len(warned(fleet, 1)) == 1, warned(fleet, 1)
        assert fleet.kv_events(1)["silent"] is True

        # the operator fixes it: a publisher binds the endpoint pdgw connects to
        pub = ctx.socket(zmq.PUB)
        pub.bind(fleet.endpoint(1))
        seq = [0]

        def publish_until_resumed():
            pub.send_multipart(batch(seq[0]))  # a SUB misses what came before it joined
            seq[0] += 1
            return resumed(fleet, 1)

        fleet.wait("s1 resumed", publish_until_resumed)
        fleet.wait("s1's gauge cleared", lambda: fleet.metric("pdgw_kv_event_silent", 1) == 0)
        kv = fleet.kv_events(1)
        assert kv["silent"] is False and kv["ever"] is True, kv
        assert fleet.metric("pdgw_kv_event_silence_seconds", 1) < quiet
        applied = fleet.batches()
        pub.send_multipart(batch(seq[0]))  # more events: no second resumed line
        fleet.wait("s1's later batch", lambda: fleet.batches() > applied)
        assert len(resumed(fleet, 1)) == 1, resumed(fleet, 1)
        assert len(warned(fleet, 1)) == 1
        pub.close(linger=0)

        # the right one was never warned about, and nothing else was
        assert warned(fleet, 0) == [] and resumed(fleet, 0) == []
        assert len(fleet.lines("kv events: nothing from")) == 1
        assert fleet.kv_events(0)["silent"] is False
        assert fleet.metric("pdgw_kv_event_silent", 0) == 0
    finally:
        ctx.destroy(linger=0)
        fleet.close()


if __name__ == "__main__":
    t.run([test_silent_instance_warned_once_then_resumed])
