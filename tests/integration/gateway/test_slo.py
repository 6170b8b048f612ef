"""Latency targets through a real pdgw: x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms (llm-d's
headers, in milliseconds: llm-d-router pkg/epp/metadata/consts.go names them TTFTSLOHeaderKey
and TPOTSLOHeaderKey, with x-slo-ttft-ms / x-slo-tpot-ms kept as deprecated aliases that
GetLowerCaseHeaderValue reads after the current name; its ordering plugin
pkg/epp/framework/plugins/flowcontrol/ordering/slodeadline orders by arrival plus the TTFT
target), the slo policy and slo_policy: reject.

Two pdgw-sim engines of one model, one slow (the test's own timing flags; pdgw never reads
them, it learns both engines from its own leg timings):
- malformed or absurd headers get 400 `invalid_slo_header` naming the header, and reach no
  engine; requests without headers are served as before;
- while the models are cold nothing is refused, whatever the target;
- the slo policy tries each engine a few times, then sends the requests to the fast one;
- of two equal engines under load, one slowed five times mid-run (`POST /sim/speed`, the
  simulator's own knob) gets about a sixth of the requests within seconds, as its own
  legs' timings say;
- a request without headers gets its API key's targets (slo_keys), else its model's;
- with slo_policy: reject, a target nobody is predicted to meet gets 429 `slo_unattainable`
  (a sheddable request - priority above 0 - as soon as it is predicted to miss at all)
  at once, with a Retry-After; a reachable one is served and counted as met per model.
"""

import json
import subprocess
import os
import tempfile
import threading
import time

import pdgwtest as t

MODEL = "sim-model"
ENGINES = {
    "fast": ["--ttft-ms", "30", "--prefill-ms-per-token", "0.05", "--tpot-ms", "4"],
    "slow": ["--ttft-ms", "120", "--prefill-ms-per-token", "0.2", "--tpot-ms", "12"],
}


def completion(port, headers=None, prompt="hello there", stream=True):
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    return t.request("POST", port, "/v1/completions",
                     json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 6,
                                 "stream": stream, "ignore_eos": True}).encode(), hdrs, timeout=30)


def metric(port, name, labels):
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200
    return t.metric_value(body.decode(), name, labels) or 0


def served(port):
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm:request_success_total"))


class Fleet:
    def __init__(self, extra, engines=None):
        self.ports, self.sims = {}, []
        for name, flags in (engines or ENGINES).items():
            self.ports[name] = t.free_port()
            p = t.Proc(f"sim-{name}", [t.binary("pdgw-sim"), "--role", "both", "--port",
                                       str(self.ports[name]), "--model", MODEL] + flags)
            self.sims.append(p)
            t.wait_http(self.ports[name], "/health", timeout=10, proc=p)
        self.port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-slo-", suffix=".yaml",
                                               delete=False)
        lines = [f'listen: "127.0.0.1:{self.port}"', "workers: 1", "protocol: neutral",
                 "prefill_policy: slo", "decode_policy: slo"] + extra
        if not any(x.startswith("access_log") for x in extra):
            lines.append("access_log: false")
        lines.append("instances:")
        for name, port in self.ports.items():
            lines += [f"  - id: {name}", f"    url: http://127.0.0.1:{port}", "    role: both"]
        self.cfg.write("\n".join(lines) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        t.wait_http(self.port, "/ready", timeout=15, proc=self.gw)

    def close(self):
        for p in self.sims + [self.gw]:
            p.kill()
        os.unlink(self.cfg.name)


def test_bad_headers_and_plain_requests():
    f = Fleet([])
    try:
        before = served(f.ports["fast"]) + served(f.ports["slow"])
        for name in ("x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms", "x-slo-ttft-ms",
                     "x-slo-tpot-ms"):
            for value in ("abc", "-5", "1.5", "99999999999", "12ms", "+7", " "):
                status, _, body = completion(f.port, {name: value})
                assert status == 400, (name, value, status, body[:200])
                err = json.loads(body)["error"]
                assert err["code"] == "invalid_slo_header", err
                assert name in err["message"], err
        assert served(f.ports["fast"]) + served(f.ports["slow"]) == before
        status, _, body = completion(f.port, stream=False)
        assert status == 200, body[:200]
        status, _, body = completion(f.port, {"x-slo-ttft-ms": "0", "x-slo-tpot-ms": "0"})
        assert status == 200, body[:200]  # 0 = no target, as llm-d reads a missing one
        assert metric(f.port, "pdgw_rejected_requests_total", {"reason": "invalid"}) >= 28  # 4 names x 7 values
    finally:
        f.close()


def test_slo_policy_learns_the_fast_engine_and_refuses_the_unattainable():
    f = Fleet(["slo_policy: reject", "slo_reject_margin_percent: 50", "access_log: true",
               "log_format: json"])
    try:
        # cold: nothing learnt, nothing refused
        status, _, body = completion(f.port, {"x-slo-ttft-ms": "1"})
        assert status == 200, body[:300]
        fast0, slow0 = served(f.ports["fast"]), served(f.ports["slow"])
        words = "the cache of keys and values moves between the two phases "
        for i in range(40):
            status, _, body = completion(f.port, prompt=f"{i}: " + words * (2 + i % 9))
            assert status == 200, body[:300]
        fast, slow = served(f.ports["fast"]) - fast0, served(f.ports["slow"]) - slow0
        print(f"slo policy: fast {fast:.0f}, slow {slow:.0f} of 40")
        assert fast + slow == 40
        assert slow >= 1, "the slow engine was never tried"
        assert fast >= 28, (fast, slow)

        _, _, inst = t.request("GET", f.port, "/admin/instances", timeout=5)
        print("latency:", [(i["id"], i["latency"]) for i in json.loads(inst)])
        # warm: a 1 ms target is nobody's; refused at once with a Retry-After
        t0 = time.monotonic()
        status, hdrs, body = completion(f.port, {"x-slo-ttft-ms": "1"})
        took = time.monotonic() - t0
        assert status == 429, (status, body[:300])
        err = json.loads(body)["error"]
        assert err["code"] == "slo_unattainable", err
        assert int(hdrs["retry-after"]) >= 1, hdrs
        assert took < 1.0, took
        assert metric(f.port, "pdgw_rejected_requests_total", {"reason": "slo_unattainable"}) >= 1
        # a reachable target is served and counted as met
        status, _, body = completion(f.port, {"x-llm-d-slo-ttft-ms": "5000",
                                              "x-llm-d-slo-tpot-ms": "1000"})
        assert status == 200, body[:300]
        assert metric(f.port, "pdgw_model_slo_requests_total",
                      {"model": MODEL, "result": "met"}) >= 1
        # and the access log says so (targets and attainment)
        deadline = time.monotonic() + 5
        while True:
            lines = [json.loads(x) for x in f.gw.output().splitlines()
                     if x.startswith("{") and '"type":"access"' in x]
            met = [x for x in lines if x.get("slo_ttft_ms") == 5000]
            if met or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert met and met[-1]["slo"] == "met" and met[-1]["slo_tpot_ms"] == 1000, met
        # with what the warm model predicted of its first token; the cold first request none
        assert met[-1].get("pred_prefill_ms", 0) > 0, met[-1]
        assert "pred_prefill_ms" not in lines[0] and lines[0].get("slo_ttft_ms") == 1, lines[0]
        refused = [x for x in lines if x.get("slo_ttft_ms") == 1 and x["status"] == 429]
        assert refused and "slo" not in refused[-1], refused
        # a target a quarter below the prediction: within the margin (50 %) a request is
        # served; a sheddable one (priority above 0, served after the rest) is refused
        target = str(max(1, int(met[-1]["pred_prefill_ms"] / 1.25)))
        status, _, body = completion(f.port, {"x-llm-d-slo-ttft-ms": target})
        assert status == 200, (target, body[:300])
        status, _, body = completion(f.port, {"x-llm-d-slo-ttft-ms": target, "X-Priority": "5"})
        assert status == 429 and json.loads(body)["error"]["code"] == "slo_unattainable", \
            (target, status, body[:300])
    finally:
        f.close()


def test_slowed_engine_sheds_load():
    flags = ["--ttft-ms", "30", "--prefill-ms-per-token", "0.1", "--tpot-ms", "5"]
    f = Fleet([], engines={"a": flags, "b": flags})
    stop = threading.Event()
    errors = []

    def client(k):
        i = 0
        while not stop.is_set():
            status, _, body = completion(f.port, prompt=f"c{k} r{i} " + "words in a row " * 20)
            if status != 200:
                errors.append((status, body[:200]))
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    try:
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while served(f.ports["a"]) + served(f.ports["b"]) < 80:  # both learnt
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)
        a0, b0 = served(f.ports["a"]), served(f.ports["b"])
        time.sleep(2.0)
        a1, b1 = served(f.ports["a"]), served(f.ports["b"])
        before = (a1 - a0) / max(1, (a1 - a0) + (b1 - b0))
        for bad in ("abc", "0", "1e9", ""):
            status, _, _ = t.request("POST", f.ports["a"], f"/sim/speed?factor={bad}", timeout=5)
            assert status == 400, (bad, status)
        status, _, body = t.request("POST", f.ports["a"], "/sim/speed?factor=0.2", timeout=5)
        assert status == 200, body

        time.sleep(3.0)  # the models follow (within seconds)
        a2, b2 = served(f.ports["a"]), served(f.ports["b"])
        time.sleep(3.0)
        a3, b3 = served(f.ports["a"]), served(f.ports["b"])
        after = (a3 - a2) / max(1, (a3 - a2) + (b3 - b2))
        print(f"share of engine a: {before:.2f} before, {after:.2f} from "
              f"3-6 s after it slowed five times "
              f"({a3 - a2:.0f} of {(a3 - a2) + (b3 - b2):.0f})", flush=True)
        assert not errors, errors[:3]
        assert 0.3 < before < 0.7, before
        assert after < 0.3, after  # equal speeds gave it half; five times slower, a sixth
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=30)
        f.close()


def test_defaults_per_api_key_then_model():
    """slo_keys gives one API key's requests their targets; other keys get their model's
    (slo_models); a header still wins. A malformed entry is refused at start without
    printing the key (a secret)."""
    f = Fleet(["api_keys: [k-gold, k-plain]", 'slo_keys: {k-gold: "800ms:20ms"}',
               'slo_models: {sim-model: "7s"}', "access_log: true", "log_format: json"])
    try:
        sent = [({"Authorization": "Bearer k-gold"}, 800, 20),
                ({"Authorization": "Bearer k-plain"}, 7000, None),
                ({"Authorization": "Bearer k-gold", "x-slo-ttft-ms": "3000"}, 3000, 20),
                # both names: the current one wins, as in llm-d
                ({"Authorization": "Bearer k-plain", "x-llm-d-slo-ttft-ms": "4000",
                  "x-slo-ttft-ms": "9000"}, 4000, None)]
        for hdrs, _, _ in sent:
            status, _, body = completion(f.port, hdrs)
            assert status == 200, body[:200]
        deadline = time.monotonic() + 5
        while True:
            lines = [json.loads(x) for x in f.gw.output().splitlines()
                     if x.startswith("{") and '"type":"access"' in x]
            if len(lines) >= len(sent) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        got = [(x.get("slo_ttft_ms"), x.get("slo_tpot_ms")) for x in lines[-len(sent):]]
        assert got == [(ttft, tpot) for _, ttft, tpot in sent], got
        # the targets are the gateway's business: no engine sees them (llm-d strips them too)
        for port in f.ports.values():
            _, _, recs = t.request("GET", port, "/sim/requests", timeout=5)
            for rec in json.loads(recs)["requests"]:
                leaked = [h for h in rec.get("headers", {}) if "slo-t" in h.lower()]
                assert not leaked, (leaked, rec.get("headers"))
    finally:
        f.close()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as cfg:
        cfg.write("protocol: neutral\napi_keys: [s3cret-key]\n"
                  'slo_keys: {s3cret-key: "fast"}\n'
                  "instances:\n  - {url: http://127.0.0.1:9, role: both}\n")
    try:
        proc = subprocess.run([t.binary("pdgw"), "--check-config", cfg.name],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0 and "slo_keys" in proc.stderr, proc.stderr
        assert "s3cret-key" not in proc.stderr, proc.stderr
    finally:
        os.unlink(cfg.name)


def test_admission_queue_by_slo_deadline():
    """admission_order: slo_deadline serves the waiters by arrival + TTFT target (llm-d's
    slodeadline ordering: earliest first, requests without a target after all with one),
    not by arrival."""
    f = Fleet(["max_concurrent_requests: 1", "queue_size: 10", "admission_order: slo_deadline",
               "access_log: true", "log_format: json"])
    try:
        done, lock = [], threading.Lock()

        def send(tag, hdrs, max_tokens):
            body = json.dumps({"model": MODEL, "prompt": "hold the slot", "max_tokens": max_tokens,
                               "ignore_eos": True}).encode()
            h = {"Content-Type": "application/json", "X-Request-Id": tag}
            h.update(hdrs)
            status, _, _ = t.request("POST", f.port, "/v1/completions", body, h, timeout=60)
            with lock:
                done.append((tag, status))

        def depth():
            return metric(f.port, "pdgw_admission_queue_depth", {"priority": "normal"})

        holder = threading.Thread(target=send, args=("holder", {}, 400))
        holder.start()
        t.wait_for(lambda: metric(f.port, "pdgw_admission_inflight", {}) == 1, 10, "the slot held")
        waiters = [("no-target", {}), ("loose", {"x-llm-d-slo-ttft-ms": "60000"}),
                   ("tight", {"x-llm-d-slo-ttft-ms": "20000"})]
        threads = []
        for i, (tag, hdrs) in enumerate(waiters):
            th = threading.Thread(target=send, args=(tag, hdrs, 2))
            th.start()
            threads.append(th)
            t.wait_for(lambda n=i + 1: depth() == n, 10, f"{tag} queued")
        for th in [holder] + threads:
            th.join(60)
        assert all(st == 200 for _, st in done), done
        assert [tag for tag, _ in done] == ["holder", "tight", "loose", "no-target"], done
    finally:
        f.close()


if __name__ == "__main__":
    t.run([test_slowed_engine_sheds_load, test_bad_headers_and_plain_requests,
           test_slo_policy_learns_the_fast_engine_and_refuses_the_unattainable,
           test_defaults_per_api_key_then_model, test_admission_queue_by_slo_deadline])
