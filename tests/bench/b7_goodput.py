#!/usr/bin/env python3
"""B7 goodput: requests served within their latency targets, on a heterogeneous PD fleet.

4 prefill pdgw-sim engines of speeds 1, 1, 0.6, 0.6 and 4 decode engines with unequal KV
memory (16k, 8k, 4k and 2k tokens) behind one pdgw (vllm-nixl, batch scheduling). pdgw
is not told any speed or capacity: its latency models learn the speeds from its own leg
timings, the KV capacities come from the engines' vllm:cache_config_info.

Workload, ShareGPT-like: log-normal prompt lengths (mean ~350 tokens) with 5% long prompts
(1,000-1,400 tokens) and 40% of prompts opening with one of 4 shared system prompts of 256
tokens; log-normal output lengths (mean ~150, ignore_eos so that each runs to max_tokens).
Arrivals are Poisson with bursts: every 5 s, 1 s at 3x the base rate (the mean is the rate
asked for). Each request carries x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms (the targets below).

First the fleet's capacity C is measured (a closed loop of CONC_CAP clients under
least-load, enough to keep every prefill busy: completed requests per second once it is
saturated); then a rate sweep 0.5x..1.5x C, the same
stream per rate replayed under round-robin, least-load, precise-prefix and slo (the last
with slo_policy reject), each policy on a fresh fleet warmed by the same short warm-up.

Per policy and rate: SLO attainment (requests meeting both targets / offered), goodput
(those per second of the arrival window), TTFT p50/p90/p99 and TPOT p90 of the served,
refused % (429), errors, preemptions on the decodes (vllm:num_preemptions_total, delta),
the mean predictor error (pdgw_predict_error_ratio over instances and phases, from pdgw's
/metrics at the end), the prefill prediction's median and p90 relative error per request
(the access log's pred_prefill_ms against prefill_ms) and the 1-minute load average.
B7_POLICIES=slo,least-load runs only those, B7_RATES=1.2 only that rate; slo+pd is slo with
pd_skip_predicted (selective PD by the latency models), not run unless named.

Usage: b7_goodput.py [BIN_DIR] [--quick]
  --quick (or QUICK=1): rates 0.5/1.0/1.2/1.5 x C, 10 s each (about 4 minutes on 2 cores);
  full: 0.5/0.75/1.0/1.2/1.5 x C, 30 s each.
Results: tests/bench/results/b7_goodput.csv (env B7_CSV: another name); b7_goodput.sh plots
them.
"""

import http.client
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

HERE = os.path.dirname(os.path.abspath(__file__))
QUICK = "--quick" in sys.argv or os.environ.get("QUICK") == "1"
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
BIN_DIR = ARGS[0] if ARGS else os.environ.get("BIN_DIR", os.path.join(os.getcwd(), "bin"))
RESULTS = os.environ.get("RESULTS_DIR", os.path.join(HERE, "results"))

MODEL = "sim-model"
PREFILL_SPEEDS = [1.0, 1.0, 0.6, 0.6]
DECODE_KV = [16384, 8192, 4096, 2048]  # the smallest still holds the longest request
BLOCK = 16
PREFILL_TIMING = ["--ttft-ms", "10", "--prefill-ms-per-token", "1.0", "--tpot-ms", "10"]
DECODE_TIMING = ["--ttft-ms", "10", "--prefill-ms-per-token", "1.0", "--tpot-ms", "10",
                 "--step-ms-per-ktoken", "0.2", "--max-batch", "64"]
SLO_TTFT_MS, SLO_TPOT_MS = 1500, 30
POLICIES = os.environ.get("B7_POLICIES", "round-robin,least-load,precise-prefix,slo").split(",")
RATES = [0.5, 1.0, 1.2, 1.5] if QUICK else [0.5, 0.75, 1.0, 1.2, 1.5]
if os.environ.get("B7_RATES"):  # e.g. "1.2": only those multiples of C
    RATES = [float(x) for x in os.environ["B7_RATES"].replace(",", " ").split()]
RUN_S = 10.0 if QUICK else 30.0
WARM_S = 3.0 if QUICK else 10.0
CAP_S = 6.0 if QUICK else 15.0
# Enough clients that the prefills, not the clients, bound the closed loop: a request holds a
# client for its whole decode (~1.5 s), so 40 clients measured 40 / 5.5 s, not the fleet.
CONC_CAP = 160
SYSTEMS, SYSTEM_TOKENS = 4, 256


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(port, path, proc=None, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"port {port}: process exited {proc.returncode}")
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


class Workload:
    """Requests drawn from one seed: (prompt token ids, max_tokens)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.systems = [[50000 + s * 997 + i for i in range(SYSTEM_TOKENS)]
                        for s in range(SYSTEMS)]
        self.next_id = 200000 + seed * 10000000

    def request(self):
        rng = self.rng
        if rng.random() < 0.05:
            n = rng.randint(1000, 1400)
        else:
            n = lognormal(rng, 350, 0.9, 16, 1000)
        prompt = []
        if rng.random() < 0.4:
            prompt = list(self.systems[rng.randrange(SYSTEMS)])
        rest = max(8, n - len(prompt))
        prompt += range(self.next_id, self.next_id + rest)
        self.next_id += rest
        return prompt, lognormal(rng, 150, 0.7, 8, 300)

    def arrivals(self, rate, seconds):
        """(offset s, prompt, max_tokens): Poisson at rate/1.4, 3x that 1 s in every 5."""
        base, t, out = rate / 1.4, 0.0, []
        while True:
            burst = (t % 5.0) >= 4.0
            t += self.rng.expovariate(base * (3.0 if burst else 1.0))
            if t >= seconds:
                return out
            out.append((t, *self.request()))


class Fleet:
    def __init__(self, policy):
        self.procs, self.sims, self.cfg = [], [], None
        self.logs = tempfile.TemporaryFile()
        self.gw_log = tempfile.TemporaryFile()  # pdgw alone: its access log is read
        self.gw_log_at = 0
        try:
            self._start(policy)
        except BaseException as e:
            tail = self.log_tail()[-600:]
            self.close()
            raise RuntimeError(f"{e}; logs: {tail}") from e

    def _start(self, policy):
        base = policy.split("+")[0]  # "slo+pd": slo and selective PD by prediction
        roles = [("prefill", s, None) for s in PREFILL_SPEEDS] + \
                [("decode", 1.0, kv) for kv in DECODE_KV]
        for i, (role, speed, kv_cap) in enumerate(roles):
            port, ev, rp = free_port(), free_port(), free_port()
            kvc = {"enable_kv_cache_events": True, "publisher": "zmq",
                   "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}", "topic": "kv"}
            engine_id = f"b7-{role}-{port}"
            inst = {"id": f"{role[0]}{i}", "url": f"http://127.0.0.1:{port}", "role": role,
                    "engine_id": engine_id}
            argv = [os.path.join(BIN_DIR, "pdgw-sim"), "--role", role, "--port", str(port),
                    "--model", MODEL, "--engine-id", engine_id, "--block-size", str(BLOCK),
                    "--record-capacity", "0", "--kv-events-config", json.dumps(kvc),
                    "--speed", str(speed)]
            if role == "prefill":
                kvp, boot = free_port(), free_port()
                # The prefills report usage.prompt_tokens_details.cached_tokens as vLLM does
                # with --enable-prompt-tokens-details: pdgw learns what was computed.
                argv += PREFILL_TIMING + ["--kv-port", str(kvp), "--bootstrap-port", str(boot),
                                          "--enable-prompt-tokens-details"]
                inst.update(kv_port=kvp, bootstrap_port=boot)
            else:
                alloc, init = free_port(), free_port()
                argv += DECODE_TIMING + ["--kv-capacity-tokens", str(kv_cap), "--alloc-port",
                                         str(alloc), "--init-port", str(init)]
                inst.update(alloc_ports=f"[{alloc}]", init_ports=f"[{init}]", tp_size=1)
            if base in ("precise-prefix", "slo"):  # slo reads what is cached where too
                inst["kv_events_endpoint"] = f'"tcp://127.0.0.1:{ev}"'
                inst["kv_events_replay_endpoint"] = f'"tcp://127.0.0.1:{rp}"'
            p = subprocess.Popen(argv, stdout=self.logs, stderr=self.logs)
            self.procs.append(p)
            self.sims.append({"role": role, "port": port, "inst": inst, "proc": p})
        for s in self.sims:
            wait_http(s["port"], "/health", s["proc"])
        self.gw_port = free_port()
        lines = [f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: vllm-nixl",
                 "scheduling: batch", f"prefill_policy: {base}", f"decode_policy: {base}",
                 "health_interval: 1s", "health_timeout: 1s", "metrics_scrape_interval: 200ms",
                 "access_log: true", "log_format: json", "log_level: warn"]
        if base == "slo":
            lines.append("slo_policy: reject")
        if policy.endswith("+pd"):
            lines.append("pd_skip_predicted: true")
        lines.append("instances:")
        for s in self.sims:
            for i, (k, v) in enumerate(s["inst"].items()):
                lines.append(("  - " if i == 0 else "    ") + f"{k}: {v}")
        fd, self.cfg = tempfile.mkstemp(prefix="pdgw-b7-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        p = subprocess.Popen([os.path.join(BIN_DIR, "pdgw"), "--config", self.cfg],
                             stdout=self.gw_log, stderr=self.gw_log)
        self.procs.append(p)
        wait_http(self.gw_port, "/ready", p)

    def metrics(self, port):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics")
        return c.getresponse().read().decode()

    def pd_skipped(self):
        """Requests the gateway sent decode-only by prediction so far."""
        for line in self.metrics(self.gw_port).splitlines():
            if line.startswith('pdgw_pd_skipped_total{reason="predicted"}'):
                return float(line.split()[-1])
        return 0.0

    def preemptions(self):
        total = 0.0
        for s in self.sims:
            if s["role"] != "decode":
                continue
            for line in self.metrics(s["port"]).splitlines():
                if line.startswith("vllm:num_preemptions_total"):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def predictor_error(self):
        vals = [float(line.rsplit(" ", 1)[1]) for line in self.metrics(self.gw_port).splitlines()
                if line.startswith("pdgw_predict_error_ratio{")]
        return sum(vals) / len(vals) if vals else float("nan")

    def prefill_prediction_errors(self):
        """|predicted - actual| / actual of the prefill legs logged since the last call: the
        access log's pred_prefill_ms (the chosen instance's model when it was booked; absent
        while that model was cold) against its prefill_ms."""
        self.gw_log.seek(self.gw_log_at)
        data = self.gw_log.read()
        self.gw_log_at += len(data)
        errs = []
        for line in data.decode(errors="replace").splitlines():
            if '"pred_prefill_ms"' not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("prefill_ms", 0) > 0:
                errs.append(abs(e["pred_prefill_ms"] - e["prefill_ms"]) / e["prefill_ms"])
        return errs

    def log_tail(self):
        self.logs.seek(0)
        self.gw_log.seek(0)
        return (self.logs.read().decode(errors="replace")[-1000:] +
                self.gw_log.read().decode(errors="replace")[-1000:])

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.cfg:
            os.unlink(self.cfg)


def one_request(port, prompt, max_tokens):
    """Stream one completion: ('ok', ttft s, tpot s) / ('refused', ..) / ('error', ..)."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True}).encode()
    headers = {"Content-Type": "application/json", "x-llm-d-slo-ttft-ms": str(SLO_TTFT_MS),
               "x-llm-d-slo-tpot-ms": str(SLO_TPOT_MS)}
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body=body, headers=headers)
        r = c.getresponse()
        if r.status == 429:
            r.read()
            return ("refused", None, None)
        if r.status != 200:
            return ("error", f"HTTP {r.status}: {r.read()[:120]!r}", None)
        first = last = None
        tokens = 0
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            now = time.perf_counter()
            buf += chunk
            n = buf.count(b"data: {")
            if n:
                tokens += n
                buf = buf[buf.rfind(b"data: {") + 7:]
                if first is None:
                    first = now
                last = now
        c.close()
    except OSError as e:
        return ("error", repr(e), None)
    if first is None:
        return ("error", "no token", None)
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return ("ok", first - t0, tpot)


def replay(port, stream):
    """Send each request at its offset (a thread each); results in stream order."""
    results = [None] * len(stream)
    threads = []
    t0 = time.perf_counter()
    for i, (off, prompt, mt) in enumerate(stream):
        delay = t0 + off - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # the arrival process itself: a request is due then

        def run(i=i, prompt=prompt, mt=mt):
            results[i] = one_request(port, prompt, mt)

        th = threading.Thread(target=run)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return results


def closed_loop(port, wl, clients, seconds, skip=0.0):
    """Completed requests per second with <clients> always waiting on one, counted from <skip>
    seconds on (the fleet saturated by then) to <seconds>."""
    done = [0]
    lock = threading.Lock()
    t0 = time.perf_counter()
    start, stop = t0 + skip, t0 + seconds

    def client():
        while time.perf_counter() < stop:
            with lock:
                prompt, mt = wl.request()
            ok = one_request(port, prompt, mt)[0] == "ok"
            now = time.perf_counter()
            if ok and start <= now <= stop:
                with lock:
                    done[0] += 1

    ths = [threading.Thread(target=client) for _ in range(clients)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return done[0] / (seconds - skip)


def pct(vals, p):
    if not vals:
        return float("nan")
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(p * len(vals)))]


def summarise(policy, mult, rate, results, pre, err, pred_errs, seconds):
    ok = [r for r in results if r[0] == "ok"]
    refused = sum(1 for r in results if r[0] == "refused")
    errors = [r[1] for r in results if r[0] == "error"]
    good = sum(1 for r in ok if r[1] * 1e3 <= SLO_TTFT_MS and r[2] * 1e3 <= SLO_TPOT_MS)
    n = len(results)
    return {"policy": policy, "rate_x": mult, "rate": rate, "offered": n, "served": len(ok),
            "attainment": good / n if n else float("nan"), "goodput": good / seconds,
            "ttft_p50": pct([r[1] for r in ok], 0.5), "ttft_p90": pct([r[1] for r in ok], 0.9),
            "ttft_p99": pct([r[1] for r in ok], 0.99), "tpot_p90": pct([r[2] for r in ok], 0.9),
            "refused_pct": 100.0 * refused / n if n else 0.0, "errors": len(errors),
            "first_error": errors[0] if errors else "", "preemptions": pre,
            "predict_err": err, "ttft_pred_err_med": pct(pred_errs, 0.5),
            "ttft_pred_err_p90": pct(pred_errs, 0.9), "load1": os.getloadavg()[0]}


def start_fleet(policy, attempts=3):
    for attempt in range(attempts):
        try:
            return Fleet(policy)
        except RuntimeError as e:
            print(f"  fleet start failed ({e}), attempt {attempt + 1}/{attempts}",
                  file=sys.stderr, flush=True)
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def main():
    for b in ("pdgw", "pdgw-sim"):
        if not os.path.exists(os.path.join(BIN_DIR, b)):
            sys.exit(f"missing {BIN_DIR}/{b} (build first)")
    load0 = os.getloadavg()
    print(f"B7 goodput{' (quick)' if QUICK else ''}: prefill speeds {PREFILL_SPEEDS}, decode KV "
          f"{DECODE_KV}; SLO TTFT {SLO_TTFT_MS} ms, TPOT {SLO_TPOT_MS} ms; rates {RATES} x C, "
          f"{RUN_S:.0f} s each; load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    fleet = start_fleet("least-load")
    try:
        cap = closed_loop(fleet.gw_port, Workload(2), CONC_CAP, WARM_S + CAP_S, WARM_S)
    finally:
        fleet.close()
    print(f"  capacity C = {cap:.2f} req/s (closed loop, {CONC_CAP} clients, least-load)",
          flush=True)
    warm = Workload(3).arrivals(0.5 * cap, WARM_S)
    streams = {m: Workload(10 + i).arrivals(m * cap, RUN_S) for i, m in enumerate(RATES)}
    rows = []
    for policy in POLICIES:
        fleet = start_fleet(policy)
        try:
            replay(fleet.gw_port, warm)
            fleet.prefill_prediction_errors()  # the warm-up's are not scored
            for m in RATES:
                p0, s0 = fleet.preemptions(), fleet.pd_skipped()
                res = replay(fleet.gw_port, streams[m])
                r = summarise(policy, m, m * cap, res, fleet.preemptions() - p0,
                              fleet.predictor_error(), fleet.prefill_prediction_errors(), RUN_S)
                r["decode_only_pct"] = 100.0 * (fleet.pd_skipped() - s0) / max(1, r["offered"])
                rows.append(r)
                print(f"  {policy:14s} {m:4.2f}xC ({r['rate']:5.2f}/s): attain "
                      f"{r['attainment'] * 100:5.1f}%  goodput {r['goodput']:5.2f}/s  TTFT p50/"
                      f"p90/p99 {r['ttft_p50'] * 1e3:6.0f}/{r['ttft_p90'] * 1e3:6.0f}/"
                      f"{r['ttft_p99'] * 1e3:6.0f} ms  TPOT p90 {r['tpot_p90'] * 1e3:5.1f} ms  "
                      f"refused {r['refused_pct']:4.1f}%  err {r['errors']}  preempt "
                      f"{r['preemptions']:.0f}  pred.err {r['predict_err']:.2f}  prefill "
                      f"pred.err med/p90 {r['ttft_pred_err_med']:.2f}/{r['ttft_pred_err_p90']:.2f}  load "
                      f"{r['load1']:.2f}  decode-only {r['decode_only_pct']:.0f}%", flush=True)
                if r["errors"]:
                    print(f"    first error: {r['first_error']}", file=sys.stderr)
        finally:
            fleet.close()
    os.makedirs(RESULTS, exist_ok=True)
    cols = ["policy", "rate_x", "rate", "offered", "served", "attainment", "goodput",
            "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p90", "refused_pct", "errors",
            "preemptions", "predict_err", "ttft_pred_err_med", "ttft_pred_err_p90", "load1",
            "decode_only_pct"]
    with open(os.path.join(RESULTS, os.environ.get("B7_CSV", "b7_goodput.csv")), "w") as f:
        f.write(",".join(cols) + f",capacity\n")
        for r in rows:
            f.write(",".join(str(round(r[c], 4)) if isinstance(r[c], float) else str(r[c])
                             for c in cols) + f",{cap:.3f}\n")
    load1 = os.getloadavg()
    print(f"  load at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if sum(r["errors"] for r in rows) > 0.01 * sum(r["offered"] for r in rows):
        sys.exit(1)  # more than 1% of requests failed: the figures are not the policies'


if __name__ == "__main__":
    main()
