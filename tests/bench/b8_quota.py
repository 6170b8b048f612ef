#!/usr/bin/env python3
"""B8 tenants: what Redis-backed budgets cost a request, and fair shares under backlog.

Part 1, overhead. One pdgw-sim (--zero-delay, role both) behind two pdgw processes started
alike (neutral, 1 worker), one of them with two tenants whose budgets are far above the
load (nothing is refused, every request is charged, reconciled and released) and the
quota store on a redis-server of its own on loopback. A keep-alive client runs at 1 and 16
concurrent connections (closed loop), then at 16 connections sending a fixed rate of half what
the gateway without tenants served at 16 (point "16r"), alternating ROUNDS slices between the two gateways so that both
meet the same moments of a shared machine. Per point: pdgw's CPU per request (utime +
stime from /proc) with quota / without and the client's p50 with / without, each as the
median over the rounds of that round's pair (one noisy slice moves a sum, not a median), and Redis's
CPU per request (the lease keeps Redis off the request path: it works per sync interval,
not per request).

Part 2, fairness. The same sim with a decode time (so requests queue), pdgw with
max_concurrent_requests 2 and two tenants of weights 1 and 3, each flooding with 8
clients of identical requests. Completed tokens per tenant per second are written out; the
share of the weight-3 tenant over the backlogged window should be 3/4.

Usage: b8_quota.py BIN_DIR RESULTS_DIR   env: DURATION (s per slice, 2), ROUNDS (6),
FAIR_S (s of the fairness run, 12), OPEN_FRACTION (0.5)
Writes b8_quota.csv (overhead points) and b8_quota_fair.csv (second, tenant, tokens).
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
RESULTS = sys.argv[2] if len(sys.argv) > 2 else "."
DURATION = float(os.environ.get("DURATION", "2"))
ROUNDS = max(1, int(os.environ.get("ROUNDS", "6")))
FAIR_S = float(os.environ.get("FAIR_S", "12"))
OPEN_FRACTION = float(os.environ.get("OPEN_FRACTION", "0.5"))
MODEL = "sim-model"
PROCS = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(argv):
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    PROCS.append(p)
    return p


def wait_http(port, path, proc, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"process on port {port} exited: {proc.stderr.read().decode()[-400:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"port {port}{path} not ready")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_server():
    port = free_port()
    p = start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no"])
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return port, p
        except OSError:
            time.sleep(0.05)
    sys.exit("redis-server did not start")


def gateway(sim_port, extra):
    port = free_port()
    fd, cfg = tempfile.mkstemp(prefix="pdgw-b8-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(f"listen: 127.0.0.1:{port}\nprotocol: neutral\nworkers: 1\naccess_log: false\n"
                "log_level: warn\n"
                f"instances:\n  - {{id: e1, url: \"http://127.0.0.1:{sim_port}\", role: both}}\n"
                + extra)
    p = start([os.path.join(BIN, "pdgw"), "--config", cfg])
    wait_http(port, "/ready", p)
    return port, p


def body(max_tokens=4):
    return json.dumps({"model": MODEL, "prompt": "one two three four five six seven eight",
                       "max_tokens": max_tokens}).encode()


def closed_loop(port, clients, seconds, key, out_lat, payload):
    """<clients> keep-alive connections for <seconds>; latencies (s) appended to out_lat."""
    stop = time.perf_counter() + seconds
    lock = threading.Lock()
    errors = [0]

    def run():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        hdrs = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        mine = []
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                c.request("POST", "/v1/completions", body=payload, headers=hdrs)
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    errors[0] += 1
                    continue
            except OSError:
                errors[0] += 1
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                continue
            mine.append(time.perf_counter() - t0)
        with lock:
            out_lat.extend(mine)

    ths = [threading.Thread(target=run) for _ in range(clients)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return errors[0]


def open_loop(port, conns, rate, seconds, key, out_lat, payload):
    """<conns> keep-alive connections sending <rate> requests/s in all, on a fixed schedule
    (a request due while its connection is busy goes as soon as it is free). Below capacity
    the latency is the gateway's and the engine's, not a queue's."""
    lock = threading.Lock()
    errors = [0]
    start = time.perf_counter() + 0.05
    stop = start + seconds
    gap = conns / rate

    def run(k):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        hdrs = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        mine, due = [], start + k * gap / conns
        while due < stop:
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            due += gap
            t0 = time.perf_counter()
            try:
                c.request("POST", "/v1/completions", body=payload, headers=hdrs)
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    errors[0] += 1
                    continue
            except OSError:
                errors[0] += 1
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                continue
            mine.append(time.perf_counter() - t0)
        with lock:
            out_lat.extend(mine)

    ths = [threading.Thread(target=run, args=(k,)) for k in range(conns)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return errors[0]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def overhead():
    sim_port = free_port()
    sim = start([os.path.join(BIN, "pdgw-sim"), "--role", "both", "--port", str(sim_port),
                 "--zero-delay"])
    wait_http(sim_port, "/health", sim)
    rport, redis = redis_server()
    off_port, off = gateway(sim_port, "api_keys: [k-a, k-b]\n")
    on_port, on = gateway(sim_port, os.environ.get("B8_ON_CONFIG") or (
        "tenants:\n"
        "  - {name: team-a, api_keys: [k-a], weight: 1, requests_per_minute: 100000000,"
        " tokens_per_minute: 1000000000}\n"
        "  - {name: team-b, api_keys: [k-b], weight: 3, requests_per_minute: 100000000}\n"
        f"quota_store: redis://127.0.0.1:{rport}/0\n"))
    # the store connected before anything is measured
    deadline = time.time() + 10
    while time.time() < deadline:
        c = http.client.HTTPConnection("127.0.0.1", on_port, timeout=2)
        c.request("GET", "/metrics")
        if os.environ.get("B8_ON_CONFIG") or "pdgw_quota_store_connected 1" in c.getresponse().read().decode():
            break
        time.sleep(0.1)
    else:
        sys.exit("the quota store did not connect")
    payload = body()
    rows = []
    # Closed loops at 1 and 16 connections, then 16 connections at a fixed rate of
    # OPEN_FRACTION of what the gateway without tenants served closed-loop at 16: a saturated
    # machine turns any CPU difference into queueing, so the fixed-rate point is where the
    # added latency is the gateway's own.
    open_rate = None
    for conc in (1, 16, "16r"):
        conns = 16 if conc == "16r" else conc

        def drive(port, seconds, lat):
            if conc == "16r":
                return open_loop(port, conns, open_rate, seconds, "k-a", lat, payload)
            return closed_loop(port, conns, seconds, "k-a", lat, payload)

        drive(off_port, 0.5, [])  # warm both
        drive(on_port, 0.5, [])
        res = {"off": {"lat": [], "cpu": 0.0}, "on": {"lat": [], "cpu": 0.0}}
        ratios, added = [], []  # per round: a paired comparison, robust to a noisy slice
        redis_cpu, errors = 0.0, 0
        for rnd in range(ROUNDS):
            order = [("off", off_port, off), ("on", on_port, on)]
            per = {}
            for name, port, proc in order if rnd % 2 == 0 else order[::-1]:  # neither always first
                c0, r0, lat = cpu_s(proc.pid), cpu_s(redis.pid), []
                errors += drive(port, DURATION, lat)
                used = cpu_s(proc.pid) - c0
                res[name]["cpu"] += used
                res[name]["lat"] += lat
                per[name] = (used / max(len(lat), 1), pct(lat, 0.5))
                if name == "on":
                    redis_cpu += cpu_s(redis.pid) - r0
            ratios.append(per["on"][0] / per["off"][0] if per["off"][0] > 0 else float("nan"))
            added.append((per["on"][1] - per["off"][1]) * 1e6)
        n_off, n_on = len(res["off"]["lat"]), len(res["on"]["lat"])
        if conc == 16:
            open_rate = OPEN_FRACTION * n_off / (ROUNDS * DURATION)
        cpu_off = res["off"]["cpu"] / max(n_off, 1) * 1e6
        cpu_on = res["on"]["cpu"] / max(n_on, 1) * 1e6
        p50_off, p50_on = pct(res["off"]["lat"], 0.5) * 1e6, pct(res["on"]["lat"], 0.5) * 1e6
        row = {"concurrency": conc, "requests_off": n_off, "requests_on": n_on,
               "cpu_us_off": cpu_off, "cpu_us_on": cpu_on, "cpu_ratio": pct(ratios, 0.5),
               "p50_us_off": p50_off, "p50_us_on": p50_on, "p50_added_us": pct(added, 0.5),
               "redis_cpu_us_per_req": redis_cpu / max(n_on, 1) * 1e6, "errors": errors,
               "load1": os.getloadavg()[0]}
        rows.append(row)
        at = f" at {open_rate:.0f} req/s" if conc == "16r" else ""
        print(f"B8 c={conc}{at}: pdgw CPU/request {cpu_on:.1f} us with tenants+Redis, {cpu_off:.1f} "
              f"us without (median of {ROUNDS} paired rounds x{row['cpu_ratio']:.3f}, rounds "
              f"{' '.join(f'{r:.2f}' for r in ratios)}); p50 {p50_on:.0f} / {p50_off:.0f} us "
              f"(added, median of rounds {row['p50_added_us']:+.0f} us); Redis CPU "
              f"{row['redis_cpu_us_per_req']:.2f} "
              f"us/request; {n_on}/{n_off} requests; errors {errors}; load {row['load1']:.2f}",
              flush=True)
    for p in (on, off, redis, sim):
        p.terminate()
        p.wait(timeout=10)
    return rows


def fairness():
    sim_port = free_port()
    sim = start([os.path.join(BIN, "pdgw-sim"), "--role", "both", "--port", str(sim_port),
                 "--timing", "per-request", "--ttft-ms", "5", "--prefill-ms-per-token", "0",
                 "--tpot-ms", "2"])
    wait_http(sim_port, "/health", sim)
    gw_port, gw = gateway(sim_port, (
        "max_concurrent_requests: 2\nqueue_size: 64\nqueue_timeout: 60s\n"
        "tenants:\n"
        "  - {name: light, api_keys: [k-light], weight: 1}\n"
        "  - {name: heavy, api_keys: [k-heavy], weight: 3}\n"))
    served = []  # (time since start, tenant, tokens)
    lock = threading.Lock()
    t0 = time.perf_counter()
    stop = t0 + FAIR_S
    payload = body(max_tokens=16)

    def flood(key, tenant):
        c = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=60)
        hdrs = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        while time.perf_counter() < stop:
            c.request("POST", "/v1/completions", body=payload, headers=hdrs)
            r = c.getresponse()
            data = r.read()
            if r.status == 200:
                u = json.loads(data)["usage"]
                with lock:
                    served.append((time.perf_counter() - t0, tenant, u["total_tokens"]))

    ths = [threading.Thread(target=flood, args=(k, n)) for k, n in
           [("k-light", "light")] * 8 + [("k-heavy", "heavy")] * 8]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    gw.terminate()
    sim.terminate()
    gw.wait(timeout=10)
    sim.wait(timeout=10)
    per_s = {}
    for at, tenant, tokens in served:
        per_s.setdefault(int(at), {"light": 0, "heavy": 0})[tenant] += tokens
    # the backlogged window: every second but the first and the last (ramp, drain)
    window = [s for s in sorted(per_s) if 1 <= s < int(FAIR_S) - 1]
    light = sum(per_s[s]["light"] for s in window)
    heavy = sum(per_s[s]["heavy"] for s in window)
    share = heavy / (light + heavy) if light + heavy else float("nan")
    print(f"B8 fairness: weights 1:3, 8 clients each, 2 slots: tokens served {light} : {heavy} "
          f"over {len(window)} s; heavy's share {share:.3f} (3/4 = 0.750)", flush=True)
    return per_s, share


def main():
    for b in ("pdgw", "pdgw-sim"):
        if not os.path.exists(os.path.join(BIN, b)):
            sys.exit(f"missing {BIN}/{b} (build first)")
    os.makedirs(RESULTS, exist_ok=True)
    try:
        rows = overhead()
        per_s, share = fairness()
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
    cols = list(rows[0])
    with open(os.path.join(RESULTS, "b8_quota.csv"), "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                             for c in cols) + "\n")
    with open(os.path.join(RESULTS, "b8_quota_fair.csv"), "w") as f:
        f.write("second,light_tokens,heavy_tokens\n")
        for s in sorted(per_s):
            f.write(f"{s},{per_s[s]['light']},{per_s[s]['heavy']}\n")
    with open(os.path.join(RESULTS, "b8_quota_share.txt"), "w") as f:
        f.write(f"{share:.4f}\n")


if __name__ == "__main__":
    main()
