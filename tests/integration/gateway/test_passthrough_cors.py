"""Pass-through of the engines' other endpoints, and CORS, end to end on 127.0.0.1.

Real pdgw (neutral) in front of pdgw-sim processes serving different model names the way
vLLM's `--served-model-name` does.

- /tokenize and /detokenize in vLLM's shapes (vllm/entrypoints/openai/protocol.py
  TokenizeRequest {model, prompt} -> TokenizeResponse {count, max_model_len, tokens};
  DetokenizeRequest {model, tokens} -> {prompt}; the engine checks `model` first,
  serving_tokenization.py _check_model) reach only an instance of the body's model and come
  back byte for byte as the engine answered; auth, the body limit and pdgw's own 404 for an
  unknown model apply as for chat; other /v1/ paths come back with the engine's status.
- a streaming endpoint (SGLang's POST /generate with "stream": true,
  python/sglang/srt/entrypoints/http_server.py: SSE "data: {...}" per token, then
  "data: [DONE]") is relayed as it comes: the first event reaches the client while the
  engine is still generating.
- CORS: a preflight from an allowed origin is answered 204 with the allow headers, one from
  another origin 403 and counted; an allowed origin's responses, streamed and errors alike,
  carry Access-Control-Allow-Origin.
"""

import http.client
import json
import time

import pdgwtest as T

KEY = "sk-pt-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example"


def start_sim(*extra):
    port = T.free_port()
    p = T.Proc(f"sim-{port}", [T.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                               "--ttft-ms", "5", "--tpot-ms", "2", *extra])
    T.wait_http(port, "/health", proc=p)
    return p, port


def start_gw(sim_ports, *extra):
    port = T.free_port()
    argv = [T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--protocol", "neutral",
            "--workers", "2", "--health-interval", "500ms", "--health-timeout", "500ms",
            "--api-key", KEY, *extra]
    for sp in sim_ports:
        argv += ["--both", f"http://127.0.0.1:{sp}"]
    p = T.Proc("pdgw", argv)
    T.wait_http(port, "/health", proc=p)
    T.wait_http(port, "/ready", proc=p)
    return p, port


def wait_learnt(port, n, timeout=10.0):
    """Until all <n> instances learnt their model names from their engine's /v1/models."""
    deadline = time.time() + timeout
    seen = None
    while time.time() < deadline:
        st, _, raw = T.request("GET", port, "/admin/instances", headers=AUTH)
        if st == 200:
            seen = [i["models_source"] for i in json.loads(raw)]
            if seen == ["engine"] * n:
                return
        time.sleep(0.1)
    raise AssertionError(f"names not learnt: {seen}")


def test_tokenize_passthrough():
    a, aport = start_sim("--served-model-name", "alpha")
    b, bport = start_sim("--served-model-name", "beta")
    gw, port = start_gw([aport, bport], "--max-body-bytes", "4096")
    wait_learnt(port, 2)
    req = {"model": "beta", "prompt": "tokens of a prompt that pdgw passes on"}
    st, _, direct = T.request("POST", bport, "/tokenize", req)
    assert st == 200, direct
    want = json.loads(direct)
    assert set(want) == {"count", "max_model_len", "tokens"} and want["count"] == len(want["tokens"])
    # the other engine refuses the name (vLLM's _check_model): only beta's sim can answer 200
    assert T.request("POST", aport, "/tokenize", req)[0] == 404
    for _ in range(4):
        st, hdrs, raw = T.request("POST", port, "/tokenize", req, AUTH)
        assert st == 200, raw
        assert raw == direct, (raw, direct)
        assert hdrs["content-type"].startswith("application/json"), hdrs
        assert hdrs.get("x-request-id"), hdrs
    # ids of words the sim's vocabulary has, as its own /tokenize gives them
    st, _, raw = T.request("POST", aport, "/tokenize", {"model": "alpha", "prompt": "the lazy dog"})
    detok = {"model": "alpha", "tokens": json.loads(raw)["tokens"]}
    dst, _, ddirect = T.request("POST", aport, "/detokenize", detok)
    assert dst == 200 and json.loads(ddirect)["prompt"], ddirect
    st, _, raw = T.request("POST", port, "/detokenize", detok, AUTH)
    assert (st, raw) == (dst, ddirect), raw
    # chat-shaped tokenize (TokenizeChatRequest) too
    st, _, raw = T.request("POST", port, "/tokenize",
                           {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]},
                           AUTH)
    assert st == 200 and json.loads(raw)["count"] > 0, raw
    # as for chat: auth, body limit, unknown model
    assert T.request("POST", port, "/tokenize", req)[0] == 401
    st, _, raw = T.request("POST", port, "/tokenize", {"model": "beta", "prompt": "x" * 5000},
                           AUTH)
    assert st == 413, raw
    st, _, raw = T.request("POST", port, "/tokenize", {"model": "nope", "prompt": "x"}, AUTH)
    assert st == 404 and json.loads(raw)["error"]["code"] == "model_not_found", raw
    # any other /v1/ path goes to an engine, whose own answer comes back
    st, _, raw = T.request("GET", port, "/v1/not-an-endpoint", None, AUTH)
    assert st == 404 and json.loads(raw)["error"]["type"] == "NotFoundError", raw
    st, _, raw = T.request("GET", port, "/metrics")
    text = raw.decode()
    assert T.metric_value(text, "pdgw_passthrough_requests_total",
                          {"endpoint": "/tokenize", "code": "200"}) == 5, text
    assert T.metric_value(text, "pdgw_model_requests_total", {"model": "beta", "code": "200"}) == 4
    gw.signal(15)
    assert gw.wait(timeout=20) == 0
    # passthrough: false → pdgw's own 404, the engine is not asked
    gw, port = start_gw([bport], "--no-passthrough")
    st, _, raw = T.request("POST", port, "/tokenize", req, AUTH)
    assert st == 404 and json.loads(raw)["error"]["type"] == "not_found_error", raw
    gw.signal(15)
    assert gw.wait(timeout=20) == 0


def sse_data(raw):
    return [line[5:].strip().decode() for line in raw.split(b"\n") if line.startswith(b"data:")]


def test_streaming_passthrough():
    sim, sport = start_sim("--tpot-ms", "60")
    gw, port = start_gw([sport])
    body = {"text": "stream me some words", "stream": True,
            "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    st, hdrs, direct = T.request("POST", sport, "/generate", body)
    assert st == 200, direct
    want = sse_data(direct)
    assert want[-1] == "[DONE]" and len(want) > 3, want
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/generate", body=json.dumps(body).encode(),
                     headers=dict(AUTH, **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type").startswith("text/event-stream")
        # the engine's own end-to-end headers come along (the sim's stream sets this one)
        assert resp.getheader("Cache-Control") == hdrs["cache-control"] == "no-cache"
        buf = resp.read1(65536)
        while b"\n\n" not in buf:
            buf += resp.read1(65536)
        # relayed as it comes: the engine is still generating this request
        running = T.metric_value(T.request("GET", sport, "/metrics")[2].decode(),
                                 "vllm:num_requests_running")
        assert running == 1, running
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        conn.close()
    got = sse_data(buf)
    assert got[-1] == "[DONE]" and len(got) == len(want), (got, want)
    assert json.loads(got[-2])["text"] == json.loads(want[-2])["text"]
    assert json.loads(got[-2])["meta_info"]["completion_tokens"] == 12
    # a client that leaves mid-stream: the engine's connection is closed too
    gone = T.metric_value(T.request("GET", sport, "/metrics")[2].decode(),
                          "sim_client_disconnects_total") or 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/generate", body=json.dumps(dict(body, sampling_params={
        "max_new_tokens": 200, "ignore_eos": True})).encode(),
        headers=dict(AUTH, **{"Content-Type": "application/json"}))
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read1(65536)
    conn.close()
    deadline = time.time() + 20
    while True:
        text = T.request("GET", sport, "/metrics")[2].decode()
        if (T.metric_value(text, "sim_client_disconnects_total") or 0) > gone and \
                not T.metric_value(text, "vllm:num_requests_running"):
            break
        assert time.time() < deadline, "the engine kept generating for a client that left"
        time.sleep(0.05)
    gw.signal(15)
    assert gw.wait(timeout=20) == 0


def test_cors():
    sim, sport = start_sim()
    gw, port = start_gw([sport], "--cors-allowed-origin", ORIGIN)
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    st, h, raw = T.request("OPTIONS", port, "/v1/chat/completions", None, pre)
    assert st == 204, raw
    assert h["access-control-allow-origin"] == ORIGIN, h
    assert "POST" in h["access-control-allow-methods"], h
    assert h["access-control-allow-headers"] == "authorization, content-type", h
    assert int(h["access-control-max-age"]) > 0, h
    assert "Origin" in h.get("vary", ""), h
    st, h, raw = T.request("OPTIONS", port, "/v1/chat/completions", None,
                           dict(pre, Origin="https://evil.example"))
    assert st == 403, raw
    assert "access-control-allow-origin" not in h, h
    # a streamed answer to an allowed origin carries the header
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 5, "stream": True}
    st, h, raw = T.request("POST", port, "/v1/chat/completions", chat,
                           dict(AUTH, Origin=ORIGIN))
    assert st == 200 and h["content-type"].startswith("text/event-stream"), raw
    assert h["access-control-allow-origin"] == ORIGIN, h
    assert "X-Request-Id" in h["access-control-expose-headers"], h
    assert sse_data(raw)[-1] == "[DONE]"
    # errors too (the browser must be able to read the 401)
    st, h, raw = T.request("POST", port, "/v1/chat/completions", chat, {"Origin": ORIGIN})
    assert st == 401 and h["access-control-allow-origin"] == ORIGIN, (st, h)
    # another origin's actual request: answered, without CORS headers (the browser blocks it)
    st, h, raw = T.request("POST", port, "/v1/chat/completions", dict(chat, stream=False),
                           dict(AUTH, Origin="https://evil.example"))
    assert st == 200 and "access-control-allow-origin" not in h, h
    text = T.request("GET", port, "/metrics")[2].decode()
    assert T.metric_value(text, "pdgw_rejected_requests_total", {"reason": "cors_origin"}) == 1
    gw.signal(15)
    assert gw.wait(timeout=20) == 0
    # "*": any origin
    gw, port = start_gw([sport], "--cors-allowed-origin", "*")
    st, h, raw = T.request("OPTIONS", port, "/tokenize", None,
                           dict(pre, Origin="https://other.example"))
    assert st == 204 and h["access-control-allow-origin"] == "*", h
    gw.signal(15)
    assert gw.wait(timeout=20) == 0


if __name__ == "__main__":
    T.run([test_tokenize_passthrough, test_streaming_passthrough, test_cors])
