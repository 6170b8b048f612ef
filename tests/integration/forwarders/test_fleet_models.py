"""Several models behind one pdgw: every routing decision only considers instances that
serve the request's `model`.

Real pdgw + pdgw-sim processes on 127.0.0.1. The sims serve their names the way vLLM does
with `--served-model-name a b` (vllm/entrypoints/openai/serving_models.py: one model card per
served name on GET /v1/models, owned_by "vllm"; any other `model` is answered 404
NotFoundError by _check_model), so a request that reached an instance of another model would
show up as that sim's 404 and in its request record.

- PD (vllm-nixl, batch): two models, each with its own prefill and decode, names configured
  per instance (`models:`); round-robin prefill and prefix-aware decode picks.
- neutral: names not configured, learnt from each engine's GET /v1/models; least-load and
  round-robin; one sim serving two names.
- an unknown model: pdgw's own 404 (param model, code model_not_found), no engine touched.
- GET /v1/models: the union, entries as the engines gave them (owned_by, created).
- pdgw_model_requests_total{model,...} counts per model.
"""

import json
import time

import pdgwtest as T
from fwdconf import Gateway, Sim, PROMPT


def body(model, stream=False, chat=False, max_tokens=6):
    b = {"model": model, "max_tokens": max_tokens, "stream": stream}
    if chat:
        b["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        b["prompt"] = PROMPT
    return b


def total(sim):
    """Requests the sim has recorded (every inference request it received, 404s too)."""
    st, _, raw = T.request("GET", sim.port, "/sim/requests")
    assert st == 200, raw
    return json.loads(raw)["total"]


def ask(port, model, i):
    stream = i % 2 == 1
    chat = i % 3 == 0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if stream:
        events = list(T.sse_events(port, path, body(model, True, chat)))
        assert events[-1] == "[DONE]", events[-3:]
        first = json.loads(events[0])
        assert first["model"] == model, first
        return
    st, _, out, raw = T.post_json(port, path, body(model, False, chat))
    assert st == 200, raw
    assert out["model"] == model, out


def assert_unknown_model(port, sims):
    before = [total(s) for s in sims]
    st, _, out, raw = T.post_json(port, "/v1/completions", body("gamma-not-served"))
    assert st == 404, raw
    err = out["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model", err
    assert "gamma-not-served" in err["message"], err
    assert [total(s) for s in sims] == before, "an unknown model reached an engine"


def models_of(port):
    st, _, raw = T.request("GET", port, "/v1/models")
    assert st == 200, raw
    out = json.loads(raw)
    assert out["object"] == "list", out
    return out["data"]


def wait_learnt(port, n, timeout=10.0):
    """/admin/instances until all <n> instances have learnt their names from their engine
    (/v1/models itself would answer the same union earlier, by asking the engines)."""
    deadline = time.time() + timeout
    seen = None
    while time.time() < deadline:
        st, _, raw = T.request("GET", port, "/admin/instances")
        if st == 200:
            seen = [i["models_source"] for i in json.loads(raw)]
            if seen == ["engine"] * n:
                return
        time.sleep(0.1)
    raise AssertionError(f"names not learnt: {seen}")


def test_pd_two_models_configured():
    sims = {
        "alpha": [Sim("prefill", "p-alpha", "--served-model-name", "alpha"),
                  Sim("decode", "d-alpha", "--served-model-name", "alpha")],
        "beta": [Sim("prefill", "p-beta", "--served-model-name", "beta"),
                 Sim("decode", "d-beta", "--served-model-name", "beta")],
    }
    insts = []
    for model, pair in sims.items():
        for s in pair:
            insts.append(dict(s.instance(), models=[model]))
    gw = Gateway("vllm-nixl", "batch", insts,
                 top={"prefill_policy": "round-robin", "decode_policy": "prefix-aware"})
    try:
        n = {"alpha": 0, "beta": 0}
        for i in range(12):
            model = "alpha" if i % 3 else "beta"
            ask(gw.port, model, i)
            n[model] += 1
        for model, pair in sims.items():
            for s in pair:
                assert total(s) == n[model], (s.name, total(s), n)
        assert_unknown_model(gw.port, sims["alpha"] + sims["beta"])
        data = models_of(gw.port)
        assert sorted(m["id"] for m in data) == ["alpha", "beta"], data
        for m in data:
            assert m["object"] == "model" and m["owned_by"] and isinstance(m["created"], int), m
        st, _, raw = T.request("GET", gw.port, "/admin/instances")
        for inst in json.loads(raw):
            assert inst["models_source"] == "config" and len(inst["models"]) == 1, inst
        text = gw.metrics()
        for model in ("alpha", "beta"):
            got = T.metric_value(text, "pdgw_model_requests_total", {"model": model, "code": "200"})
            assert got == n[model], (model, got, n)
        assert T.metric_value(text, "pdgw_model_requests_total", {"model": "gamma-not-served"}) \
            is None, "an unknown model got its own series"
        assert T.metric_value(text, "pdgw_rejected_requests_total",
                              {"reason": "model_not_found"}) == 1
        gw.stop()
    finally:
        gw.proc.kill()
        for pair in sims.values():
            for s in pair:
                s.proc.kill()


def test_neutral_models_learnt():
    """No `models:` configured: pdgw learns the names from the engines' /v1/models."""
    a1 = Sim("both", "alpha-1", "--served-model-name", "alpha")
    a2 = Sim("both", "alpha-2", "--served-model-name", "alpha", "omega")
    b1 = Sim("both", "beta-1", "--served-model-name", "beta")
    gw = Gateway("neutral", "batch", [a1.instance(), a2.instance(), b1.instance()],
                 top={"decode_policy": "round-robin"})
    try:
        wait_learnt(gw.port, 3)
        assert sorted(m["id"] for m in models_of(gw.port)) == ["alpha", "beta", "omega"]
        st, _, raw = T.request("GET", gw.port, "/admin/instances")
        learnt = {i["id"]: (i["models_source"], sorted(i["models"])) for i in json.loads(raw)}
        assert learnt == {"alpha-1": ("engine", ["alpha"]), "alpha-2": ("engine", ["alpha", "omega"]),
                          "beta-1": ("engine", ["beta"])}, learnt
        for m in models_of(gw.port):
            # kept as the engine listed it (vLLM's ModelCard)
            assert m["owned_by"] == "vllm" and m["object"] == "model" and "created" in m, m
        for i in range(9):
            ask(gw.port, "beta", i)
        assert total(b1) == 9 and total(a1) == 0 and total(a2) == 0
        for i in range(6):
            ask(gw.port, "alpha", 2 * i)  # round-robin over the two alpha instances
        assert total(a1) == 3 and total(a2) == 3, (total(a1), total(a2))
        # "omega" is a second served name of alpha-2 only; vLLM answers with its first name
        st, _, out, raw = T.post_json(gw.port, "/v1/completions", body("omega"))
        assert st == 200 and out["model"] == "alpha", raw
        assert total(a2) == 4 and total(a1) == 3
        assert_unknown_model(gw.port, [a1, a2, b1])
        gw.stop()
    finally:
        gw.proc.kill()
        for s in (a1, a2, b1):
            s.proc.kill()


if __name__ == "__main__":
    T.run([test_pd_two_models_configured, test_neutral_models_learnt])
