#!/usr/bin/env python3
"""B6 fleet: where the KV cache is, measured on a simulated fleet.

N pdgw-sim engines (role both, vLLM's KV events on, a small KV capacity so the prefix
caches evict for real, a time model where an uncached prompt token costs prefill time and
a running batch is bounded) behind one pdgw (neutral). A multi-turn shared-prefix workload
like llm-d's precise-prefix benchmark: a few long system prompts shared by many
conversations, each turn's prompt = system prompt + the whole history + a new user turn
(lengths drawn log-normally, like public chat traces). The same request stream is replayed
under each routing policy on a fresh fleet: round-robin, random, least-load, prefix-aware
(pdgw's own guess from what it routed) and precise-prefix (the engines' KV events); then
again with two pdgw replicas behind a load balancer (as the Kubernetes overlays scale the
gateway), where each replica's prefix-aware guess sees only half the traffic while the KV
events are the same for both.

Reported per policy: TTFT p50/p90 (client side, first streamed token), throughput
(requests/s over the run), prefix-cache hit rate (the engines' own token counters), and
the ratios against round-robin and prefix-aware from the same run.

Usage: b6_fleet.py [BIN_DIR] [--quick]   (results in tests/bench/results/b6_fleet.csv)
"""

import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
QUICK = "--quick" in sys.argv or os.environ.get("QUICK") == "1"
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
BIN_DIR = ARGS[0] if ARGS else os.environ.get("BIN_DIR", os.path.join(os.getcwd(), "bin"))
RESULTS = os.environ.get("RESULTS_DIR", os.path.join(HERE, "results"))

N_SIMS = 8
BLOCK = 16
KV_CAPACITY = 4096           # tokens per engine: a few system prompts and histories
SYSTEMS = 6                  # distinct shared system prompts
SYSTEM_TOKENS = 1024
CONVERSATIONS = 24 if QUICK else 48
TURNS = 4
CONCURRENCY = 16
MAX_TOKENS = 16
POLICIES = ["round-robin", "random", "least-load", "prefix-aware", "precise-prefix"]
SIM_TIMING = ["--ttft-ms", "10", "--tpot-ms", "2", "--prefill-ms-per-token", "0.25",
              "--max-batch", "4"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(port, path, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"port {port}{path} not ready")


def lognormal(rng, mean, sigma, lo, hi):
    mu = math.log(mean) - sigma * sigma / 2
    return max(lo, min(hi, int(rng.lognormvariate(mu, sigma))))


def workload(seed=7):
    """Conversations: (system id, [(user tokens, assistant tokens) per turn])."""
    rng = random.Random(seed)
    systems = [[100000 + s * 10007 + i for i in range(SYSTEM_TOKENS)] for s in range(SYSTEMS)]
    convs = []
    nxt = 1
    for c in range(CONVERSATIONS):
        turns = []
        for _ in range(TURNS):
            u = lognormal(rng, 120, 0.6, 16, 600)
            a = lognormal(rng, 60, 0.5, 8, 200)
            turns.append(([nxt + i for i in range(u)], [nxt + u + i for i in range(a)]))
            nxt += u + a
        convs.append((rng.randrange(SYSTEMS), turns))
    return systems, convs


class Fleet:
    def __init__(self, policy, gateways=1):
        self.procs = []
        self.ports = [free_port() for _ in range(N_SIMS)]
        evs = [free_port() for _ in range(N_SIMS)]
        rps = [free_port() for _ in range(N_SIMS)]
        self.logs = tempfile.TemporaryFile()
        for i, port in enumerate(self.ports):
            kv = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{evs[i]}", "replay_endpoint": f"tcp://*:{rps[i]}",
                  "topic": "kv"}
            self.procs.append(subprocess.Popen(
                [os.path.join(BIN_DIR, "pdgw-sim"), "--role", "both", "--port", str(port),
                 "--block-size", str(BLOCK), "--kv-capacity-tokens", str(KV_CAPACITY),
                 "--record-capacity", "0", "--kv-events-config", json.dumps(kv),
                 *SIM_TIMING], stdout=self.logs, stderr=self.logs))
        for port in self.ports:
            wait_http(port, "/health")
        self.gw_ports = [free_port() for _ in range(gateways)]
        self.cfgs = []
        for gw_port in self.gw_ports:
            self._gateway(policy, gw_port, evs, rps)

    def _gateway(self, policy, gw_port, evs, rps):
        lines = [f'listen: "127.0.0.1:{gw_port}"', "workers: 2", "protocol: neutral",
                 f"prefill_policy: {policy}", f"decode_policy: {policy}",
                 "health_interval: 1s", "health_timeout: 1s", "metrics_scrape_interval: 200ms",
                 "access_log: false", "log_level: warn", "instances:"]
        for i, port in enumerate(self.ports):
            lines += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both"]
            if policy == "precise-prefix":
                lines += [f'    kv_events_endpoint: "tcp://127.0.0.1:{evs[i]}"',
                          f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{rps[i]}"']
        fd, cfg = tempfile.mkstemp(prefix="pdgw-b6-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.procs.append(subprocess.Popen([os.path.join(BIN_DIR, "pdgw"), "--config", cfg],
                                           stdout=self.logs, stderr=self.logs))
        wait_http(gw_port, "/ready")

    def sim_counter(self, name):
        total = 0.0
        for port in self.ports:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/metrics")
            for line in c.getresponse().read().decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for cfg in self.cfgs:
            os.unlink(cfg)


def one_request(port, prompt):
    """Stream one completion; returns TTFT seconds (first token event)."""
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "stream": True, "ignore_eos": True}).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft = None
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        if ttft is None and b"data: {" in buf:
            ttft = time.perf_counter() - t0
    c.close()
    return ttft if ttft is not None else time.perf_counter() - t0


def run_policy(policy, systems, convs, gateways=1):
    fleet = Fleet(policy, gateways)
    lb = random.Random(11)  # the load balancer in front of the replicas
    ttfts, errors = [], []
    lock = threading.Lock()
    queue = list(range(len(convs)))
    try:
        q0, h0 = fleet.sim_counter("vllm:prefix_cache_queries_total"), \
            fleet.sim_counter("vllm:prefix_cache_hits_total")

        def worker():
            while True:
                with lock:
                    if not queue:
                        return
                    ci = queue.pop(0)
                sysid, turns = convs[ci]
                history = list(systems[sysid])
                for user, assistant in turns:
                    prompt = history + user
                    with lock:
                        port = fleet.gw_ports[lb.randrange(len(fleet.gw_ports))]
                    try:
                        t = one_request(port, prompt)
                        with lock:
                            ttfts.append(t)
                    except Exception as e:  # noqa: BLE001 - counted and reported
                        with lock:
                            errors.append(str(e))
                    history = prompt + assistant

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(CONCURRENCY)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        q = fleet.sim_counter("vllm:prefix_cache_queries_total") - q0
        h = fleet.sim_counter("vllm:prefix_cache_hits_total") - h0
    finally:
        fleet.close()
    ttfts.sort()

    def pct(p):
        return ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else float("nan")

    return {"policy": policy, "gateways": gateways, "requests": len(ttfts), "errors": len(errors),
            "ttft_p50": pct(0.5), "ttft_p90": pct(0.9), "rps": len(ttfts) / wall,
            "hit_rate": h / q if q else 0.0, "wall_s": wall}


def main():
    for b in ("pdgw", "pdgw-sim"):
        if not os.path.exists(os.path.join(BIN_DIR, b)):
            sys.exit(f"missing {BIN_DIR}/{b} (build first)")
    systems, convs = workload()
    n_req = sum(len(t) for _, t in convs)
    print(f"B6 fleet: {N_SIMS} sims x {KV_CAPACITY} KV tokens, {SYSTEMS} system prompts of "
          f"{SYSTEM_TOKENS} tokens, {len(convs)} conversations x {TURNS} turns = {n_req} "
          f"requests, concurrency {CONCURRENCY}; load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for gateways, policies in ((1, POLICIES),
                               (2, ["round-robin", "prefix-aware", "precise-prefix"])):
        for policy in policies:
            r = run_policy(policy, systems, convs, gateways)
            rows.append(r)
            print(f"  {gateways} gw {policy:15s} ttft p50 {r['ttft_p50'] * 1e3:8.1f} ms  p90 "
                  f"{r['ttft_p90'] * 1e3:8.1f} ms  {r['rps']:6.2f} req/s  hit "
                  f"{r['hit_rate'] * 100:5.1f}%  errors {r['errors']}", flush=True)
    by = {(r["gateways"], r["policy"]): r for r in rows}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "b6_fleet.csv"), "w") as f:
        f.write("gateways,policy,requests,errors,ttft_p50_s,ttft_p90_s,req_per_s,hit_rate,wall_s\n")
        for r in rows:
            f.write(f"{r['gateways']},{r['policy']},{r['requests']},{r['errors']},{r['ttft_p50']:.4f},"
                    f"{r['ttft_p90']:.4f},{r['rps']:.3f},{r['hit_rate']:.4f},{r['wall_s']:.2f}\n")
    print("ratios (same run):")
    for g in (1, 2):
        p, rr, pa = by[(g, "precise-prefix")], by[(g, "round-robin")], by[(g, "prefix-aware")]
        for name, base in (("round-robin", rr), ("prefix-aware", pa)):
            print(f"  {g} gw precise/{name:12s} TTFT p50 {p['ttft_p50'] / base['ttft_p50']:.2f}x"
                  f"  p90 {p['ttft_p90'] / base['ttft_p90']:.2f}x  throughput "
                  f"{p['rps'] / base['rps']:.2f}x  hit "
                  f"{p['hit_rate'] / max(base['hit_rate'], 1e-9):.2f}x")
    print(f"  load at end {os.getloadavg()[0]:.2f}")
    if any(r["errors"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
