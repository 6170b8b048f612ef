"""The scheduler's latency models learn each instance from what pdgw itself observes.

Two pdgw-sim engines of one model, one slow (a larger base time to first token, five times
the prefill cost per prompt token, three times the time per output token), behind a real
pdgw with round-robin (so both get the same mix). The test streams prompts of several
lengths through pdgw; pdgw never reads the engines' timing flags, it only times its own
legs. Afterwards /admin/instances must show each instance's models taught by the legs it
served, the slow one predicted slower in both phases by about the engines' real ratio, and
/metrics must carry pdgw_predict_observations_total and pdgw_predict_error_ratio. The same
holds when every answer is whole (non-stream): only its time and its output tokens are seen,
and both models learn from the sum.
"""

import json
import os
import tempfile

import pdgwtest as t

MODEL = "sim-model"
ENGINES = {  # id: pdgw-sim timing flags, the test's own numbers
    "fast": ["--ttft-ms", "5", "--prefill-ms-per-token", "0.02", "--tpot-ms", "4"],
    "slow": ["--ttft-ms", "20", "--prefill-ms-per-token", "0.1", "--tpot-ms", "12"],
}


def complete(port, prompt, max_tokens, stream=True):
    status, _, body = t.request(
        "POST", port, "/v1/completions",
        json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                    "stream": stream, "ignore_eos": True}).encode(),
        {"Content-Type": "application/json"}, timeout=30)
    assert status == 200, (status, body[:300])
    if stream:
        assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
    else:
        assert json.loads(body)["usage"]["completion_tokens"] == max_tokens, body[:300]


def instances(port):
    status, _, body = t.request("GET", port, "/admin/instances", timeout=5)
    assert status == 200, status
    data = json.loads(body)
    if isinstance(data, dict):
        data = data.get("instances", data.get("data", []))
    return {inst["id"]: inst for inst in data}


def learn_the_fleet(stream):
    sims, ports = [], {}
    cfg = None
    gw = None
    try:
        for name, flags in ENGINES.items():
            ports[name] = t.free_port()
            p = t.Proc(f"sim-{name}", [t.binary("pdgw-sim"), "--role", "both", "--port",
                                       str(ports[name]), "--model", MODEL] + flags)
            sims.append(p)
            t.wait_http(ports[name], "/health", timeout=10, proc=p)
        gw_port = t.free_port()
        cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-lat-", suffix=".yaml", delete=False)
        lines = [f'listen: "127.0.0.1:{gw_port}"', "workers: 1", "protocol: neutral",
                 "prefill_policy: round-robin", "decode_policy: round-robin",
                 "access_log: false", "instances:"]
        for name, port in ports.items():
            lines += [f"  - id: {name}", f"    url: http://127.0.0.1:{port}", "    role: both"]
        cfg.write("\n".join(lines) + "\n")
        cfg.close()
        gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", cfg.name])
        t.wait_http(gw_port, "/ready", timeout=15, proc=gw)

        # cold: both answer the same priors, untaught
        cold = instances(gw_port)
        assert cold["fast"]["latency"]["ttft"]["observed"] == 0
        assert (cold["fast"]["latency"]["ttft"]["seconds_1k_tokens"]
                == cold["slow"]["latency"]["ttft"]["seconds_1k_tokens"])

        words = "the cache of keys and values moves between the two phases of serving "
        for i in range(48):
            # a distinct first block each: no prefix-cache hit makes a prompt cheaper
            # whole answers: output lengths vary, so that the two phases can be told apart
            complete(gw_port, f"request {i} of the run: " + words * (4 + (i * 7) % 40),
                     8 if stream else 4 + (i * 11) % 37, stream)

        inst = instances(gw_port)
        lat = {k: inst[k]["latency"] for k in ENGINES}
        print("learnt:", json.dumps(lat))
        for k in ENGINES:
            assert lat[k]["ttft"]["observed"] >= 20, lat[k]
            assert lat[k]["tpot"]["observed"] >= 20, lat[k]
            # a sum is learnt, not scored: nothing says how each phase erred
            assert (lat[k]["ttft"]["error_ratio"] is not None) == stream, lat[k]
        # the engines' real ratios are about 4.8 (TTFT at 1k tokens) and 3 (TPOT)
        ttft_ratio = lat["slow"]["ttft"]["seconds_1k_tokens"] / lat["fast"]["ttft"]["seconds_1k_tokens"]
        tpot_ratio = lat["slow"]["tpot"]["seconds"] / lat["fast"]["tpot"]["seconds"]
        assert 2.0 < ttft_ratio < 12.0, ttft_ratio
        assert 1.8 < tpot_ratio < 6.0, tpot_ratio
        assert 0.0 < lat["fast"]["tpot"]["seconds"] < 0.05, lat["fast"]
        # their own error: small where the times are well above the loop's millisecond (the
        # fast engine's 5-15 ms first tokens are within a few ms of scheduling noise)
        if stream:
            assert lat["slow"]["ttft"]["error_ratio"] < 0.3, lat["slow"]
            for k in ENGINES:
                assert lat[k]["tpot"]["error_ratio"] < 0.3, lat[k]

        status, _, body = t.request("GET", gw_port, "/metrics", timeout=5)
        assert status == 200
        text = body.decode()
        assert 'pdgw_predict_observations_total{instance="slow",phase="ttft"}' in text
        assert ('pdgw_predict_error_ratio{instance="fast",phase="tpot"}' in text) == stream
    finally:
        if gw:
            gw.kill()
        for p in sims:
            p.kill()
        if cfg:
            os.unlink(cfg.name)


def test_models_learn_the_fleet():
    learn_the_fleet(True)


def test_whole_answers_teach_the_models():
    learn_the_fleet(False)


if __name__ == "__main__":
    t.run([test_models_learn_the_fleet, test_whole_answers_teach_the_models])
