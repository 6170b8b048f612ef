"""pdgw-sim as a `both` engine: OpenAI API shape, determinism, sampling
controls, validation, metrics, request record, timing model, faults."""

import http.client
import json
import threading
import time

import pdgwtest as T
from simtest import complete, metric, records, start_sim, stop_clean, stream, text_of

PROMPT = "The quick brown fox jumps over the lazy dog, again and again."


def test_endpoints_and_shapes():
    p, port = start_sim("--ttft-ms", 5, "--tpot-ms", 1)
    st, hdrs, body = T.request("GET", port, "/health")
    assert st == 200
    st, _, body = T.request("GET", port, "/v1/models")
    models = json.loads(body)
    assert st == 200 and models["object"] == "list"
    assert models["data"][0]["id"] == "sim-model"

    obj, hdrs = complete(port, {"model": "sim-model", "prompt": PROMPT, "max_tokens": 7,
                                "ignore_eos": True}, {"X-Request-Id": "req-1"})
    assert hdrs["x-request-id"] == "req-1"
    assert int(hdrs["x-sim-engine-time-us"]) > 0
    assert obj["id"] == "cmpl-req-1" and obj["object"] == "text_completion"
    assert obj["model"] == "sim-model" and isinstance(obj["created"], int)
    assert obj["choices"][0]["finish_reason"] == "length"
    assert obj["usage"] == {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21,
                            "prompt_tokens_details": None}
    assert len(obj["choices"][0]["text"].split()) == 7
    assert obj["sim_engine_time_us"] > 0

    chat = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
            "max_completion_tokens": 5, "ignore_eos": True}
    cobj, _ = complete(port, chat, chat=True)
    assert cobj["object"] == "chat.completion"
    assert cobj["choices"][0]["message"]["role"] == "assistant"
    assert len(cobj["choices"][0]["message"]["content"].split()) == 5
    assert cobj["usage"]["completion_tokens"] == 5

    # chat stream: role chunk first, content deltas, finish_reason, usage chunk, [DONE]
    chunks, _ = stream(port, dict(chat, stream_options={"include_usage": True}), chat=True)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]
                      if c["choices"])
    assert content == cobj["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5

    # completion stream: same text as the non-stream answer, no usage unless asked
    chunks, _ = stream(port, {"prompt": PROMPT, "max_tokens": 7, "ignore_eos": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == obj["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)


def test_determinism_and_sampling():
    p, port = start_sim("--ttft-ms", 1, "--tpot-ms", 0)
    q, port2 = start_sim("--ttft-ms", 1, "--tpot-ms", 0, name="sim2")
    body = {"prompt": PROMPT, "max_tokens": 30, "ignore_eos": True}
    a, _ = complete(port, body)
    b, _ = complete(port2, body)
    assert text_of(a) == text_of(b), "same request on two instances must give the same text"
    c, _ = complete(port, {"prompt": PROMPT + " x", "max_tokens": 30, "ignore_eos": True})
    assert text_of(c) != text_of(a)
    d, _ = complete(port, dict(body, seed=7, temperature=0.8))
    e, _ = complete(port2, dict(body, seed=7, temperature=0.8))
    assert text_of(d) == text_of(e) and text_of(d) != text_of(a)
    # shorter max_tokens is a prefix of the longer output
    f, _ = complete(port, dict(body, max_tokens=10))
    assert text_of(a).startswith(text_of(f)) and len(text_of(f).split()) == 10

    # stop strings: cut before the first occurrence, finish "stop", stop_reason = string
    words = text_of(a).split()
    stop_word = words[5]
    cut = text_of(a).index(" " + stop_word)
    g, _ = complete(port, dict(body, stop=[" " + stop_word, "zzz"]))
    assert text_of(g) == text_of(a)[:cut], (text_of(g), text_of(a), stop_word)
    assert g["choices"][0]["finish_reason"] == "stop"
    assert g["choices"][0]["stop_reason"] == " " + stop_word
    chunks, _ = stream(port, dict(body, stop=" " + stop_word))
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == text_of(g)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    # EOS: some prompt stops early without ignore_eos; ignore_eos and min_tokens override
    found = None
    for i in range(40):
        pr = f"prompt number {i} about something"
        o, _ = complete(port, {"prompt": pr, "max_tokens": 200})
        if o["choices"][0]["finish_reason"] == "stop":
            found = (pr, o)
            break
    assert found, "no EOS within 40 prompts x 200 tokens"
    pr, o = found
    n = o["usage"]["completion_tokens"]
    assert n < 200 and o["choices"][0]["stop_reason"] is None
    full, _ = complete(port, {"prompt": pr, "max_tokens": 200, "ignore_eos": True})
    assert full["usage"]["completion_tokens"] == 200
    assert full["choices"][0]["finish_reason"] == "length"
    assert text_of(full).startswith(text_of(o))
    mt, _ = complete(port, {"prompt": pr, "max_tokens": 200, "min_tokens": n + 1})
    assert mt["usage"]["completion_tokens"] > n


def test_bad_input():
    p, port = start_sim("--ttft-ms", 1, "--tpot-ms", 0, "--max-model-len", 64)
    cases = [
        ("POST", "/v1/completions", b"{not json", 400, None),
        ("POST", "/v1/completions", b"[1,2]", 400, None),
        ("POST", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": "3"}, 400, "max_tokens"),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("POST", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
        ("POST", "/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}},
         400, "stream_options"),
        ("POST", "/v1/completions", {"prompt": "x", "stop": [1]}, 400, "stop"),
        ("POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
        ("POST", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400,
         "min_tokens"),
        ("POST", "/v1/completions", {"prompt": "x " * 60, "max_tokens": 10}, 400, "prompt"),
        ("POST", "/v1/completions", {"prompt": "x", "model": "other"}, 404, "model"),
        ("POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("POST", "/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages"),
        ("GET", "/v1/completions", None, 405, None),
        ("POST", "/health", b"", 405, None),
        ("GET", "/nope", None, 404, None),
    ]
    for method, path, body, want, param in cases:
        st, hdrs, raw = T.request(method, port, path, body)
        assert st == want, (method, path, body, st, raw)
        err = json.loads(raw)["error"]
        assert err["code"] == want and isinstance(err["message"], str) and err["type"]
        if param:
            assert err["param"] == param, (path, body, err)
    # the model name error is vLLM's wording
    st, _, raw = T.request("POST", port, "/v1/completions", {"prompt": "x", "model": "other"})
    assert json.loads(raw)["error"]["message"] == "The model `other` does not exist."
    # still serving, and 4xx were counted
    obj, _ = complete(port, {"prompt": "ok", "max_tokens": 2})
    assert obj["usage"]["prompt_tokens"] == 1
    assert metric(port, "sim_http_errors_total", {"class": "4xx"}) == len(cases) + 1


def test_record_of_requests():
    p, port = start_sim("--ttft-ms", 1, "--tpot-ms", 0, "--record-capacity", 4)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = {"prompt": "hello", "max_tokens": 2, "kv_transfer_params": {"do_remote_decode": True}}
    complete(port, body, {"X-Request-Id": "rec-1", "traceparent": tp,
                          "Authorization": "Bearer secret", "X-Custom": "v"})
    recs = records(port)
    assert len(recs) == 1
    r = recs[0]
    assert r["path"] == "/v1/completions" and r["method"] == "POST"
    assert r["request_id"] == "rec-1" and r["traceparent"] == tp
    assert r["authorization"] is True and "authorization" not in r["headers"]
    assert r["headers"]["x-custom"] == "v"
    assert r["body"] == body and r["status"] == 200 and r["seq"] == 1
    T.request("POST", port, "/v1/completions", b"garbage", {"X-Request-Id": "rec-2"})
    r2 = records(port, "rec-2")[0]
    assert r2["body"] is None and r2["body_raw"] == "garbage" and r2["status"] == 400
    assert r2["authorization"] is False
    for i in range(5):
        complete(port, {"prompt": f"p{i}", "max_tokens": 1})
    st, _, raw = T.request("GET", port, "/sim/requests")
    dump = json.loads(raw)
    assert len(dump["requests"]) == 4 and dump["total"] == 7 and dump["dropped"] == 3
    st, _, _ = T.request("DELETE", port, "/sim/requests")
    assert st == 200 and records(port) == []
    stop_clean(p)


def test_record_of_tokenize_calls():
    """/tokenize (vLLM's TokenizeCompletionRequest, vllm/entrypoints/openai/protocol.py) is
    recorded only with --record-tokenize: tests that count an engine's inference requests see
    none of them, a benchmark that counts the engine's time sees them all."""
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for flag in (False, True):
        p, port = start_sim("--record-capacity", 8, *(["--record-tokenize"] if flag else []))
        st, _, raw = T.request("POST", port, "/tokenize",
                               json.dumps({"prompt": "hello world"}).encode(),
                               {"Content-Type": "application/json", "traceparent": tp})
        assert st == 200 and json.loads(raw)["count"] == 2, raw
        T.request("POST", port, "/tokenize", b"{", {"Content-Type": "application/json"})
        recs = records(port)
        if not flag:
            assert recs == [], recs
        else:
            assert [r["path"] for r in recs] == ["/tokenize", "/tokenize"], recs
            assert recs[0]["traceparent"] == tp and recs[0]["status"] == 200
            assert recs[0]["t_done_us"] >= recs[0]["t_recv_us"]
            assert recs[1]["status"] == 400 and recs[1]["body"] is None
        stop_clean(p)


def test_metrics_batch_and_prefix_cache():
    # one running request at a time: the second waits. The second is sent only once the
    # first is seen running (two threads started together may reach the engine far apart
    # on a loaded machine), and the first runs long enough for the second to arrive.
    p, port = start_sim("--ttft-ms", 1500, "--tpot-ms", 1, "--max-batch", 1,
                        "--kv-capacity-tokens", 1024, "--block-size", 16)
    results = []

    def go(i):
        results.append(complete(port, {"prompt": f"req {i}", "max_tokens": 2}))

    def sample():
        text = T.request("GET", port, "/metrics")[2].decode()
        return (T.metric_value(text, "vllm:num_requests_running"),
                T.metric_value(text, "vllm:num_requests_waiting"),
                T.metric_value(text, "vllm:kv_cache_usage_perc"))

    def wait_until(cond, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond(*sample()):
                return True
            time.sleep(0.02)
        return False

    ths = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    ths[0].start()
    assert wait_until(lambda run, wait, usage: run == 1, 5), "first request never ran"
    ths[1].start()
    seen = wait_until(lambda run, wait, usage: run == 1 and wait == 1 and
                      abs(usage - 1 / 64) < 1e-6, 5)
    for t in ths:
        t.join()
    assert seen, "never saw running=1 waiting=1 with one block in use"
    assert len(results) == 2
    assert metric(port, "vllm:num_requests_running") == 0
    assert metric(port, "vllm:kv_cache_usage_perc") == 0
    assert metric(port, "vllm:prompt_tokens_total") == 4
    assert metric(port, "vllm:generation_tokens_total") == 4
    p.kill()

    # prefix cache: the same long prefix again → hits and a lower engine TTFT
    p, port = start_sim("--ttft-ms", 5, "--tpot-ms", 0, "--prefill-ms-per-token", 0.5,
                        "--block-size", 16)
    long_prompt = " ".join(f"w{i}" for i in range(200))
    _, h1 = complete(port, {"prompt": long_prompt + " first", "max_tokens": 1})
    assert metric(port, "vllm:prefix_cache_hits_total") == 0
    _, h2 = complete(port, {"prompt": long_prompt + " second", "max_tokens": 1})
    hits = metric(port, "vllm:prefix_cache_hits_total")
    assert hits == 192, hits  # 12 full blocks of 16 shared
    assert metric(port, "vllm:prefix_cache_queries_total") == 402
    # The modelled prefill time, not the wall clock (which a loaded machine stretches):
    # 5 ms + 0.5 ms for each of the 201 uncached tokens, then for the 9 past the cached blocks.
    modelled = [r["prefill_model_us"] for r in records(port)]
    assert modelled == [105500, 9500], modelled
    assert int(h1["x-sim-engine-time-us"]) >= 105500, h1
    p.kill()
    p, port = start_sim("--ttft-ms", 5, "--tpot-ms", 0, "--no-prefix-cache")
    complete(port, {"prompt": long_prompt, "max_tokens": 1})
    complete(port, {"prompt": long_prompt, "max_tokens": 1})
    assert metric(port, "vllm:prefix_cache_hits_total") == 0


def test_timing_timestamps_and_zero_delay():
    p, port = start_sim("--ttft-ms", 100, "--tpot-ms", 20, "--emit-timestamps")
    t0 = time.time()
    chunks, _ = stream(port, {"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True})
    took = time.time() - t0
    assert 0.25 < took < 2.0, took  # 100 ms + 9 x 20 ms
    ts = [c["sim_emit_ns"] for c in chunks]
    assert ts == sorted(ts) and (ts[-1] - ts[0]) / 1e6 >= 150
    p.kill()
    p, port = start_sim("--zero-delay", "--ttft-ms", 1000, "--tpot-ms", 1000)
    t0 = time.time()
    for _ in range(20):
        chunks, _ = stream(port, {"prompt": PROMPT, "max_tokens": 50, "ignore_eos": True})
    # with the delays one stream alone would take 50 s; the bound leaves room for a
    # loaded machine
    assert time.time() - t0 < 10.0
    assert len(chunks) == 50


def test_concurrent_streams_and_disconnect():
    p, port = start_sim("--ttft-ms", 10, "--tpot-ms", 10)
    errors = []
    texts = []

    def go(i):
        try:
            chunks, _ = stream(port, {"prompt": f"s {i % 5}", "max_tokens": 20,
                                      "ignore_eos": True})
            texts.append((i % 5, "".join(c["choices"][0]["text"] for c in chunks)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=go, args=(i,)) for i in range(100)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not errors, errors[:3]
    by = {}
    for k, t in texts:
        by.setdefault(k, set()).add(t)
    assert len(texts) == 100 and all(len(v) == 1 for v in by.values())

    # a client that goes away mid-stream: request aborted, slot and blocks freed
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/v1/completions",
                 json.dumps({"prompt": "long", "max_tokens": 5000, "ignore_eos": True,
                             "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read1(100)
    assert metric(port, "vllm:num_requests_running") == 1
    conn.sock.close()
    conn.close()
    deadline = time.time() + 5  # a bound on the wait, not a speed requirement
    while time.time() < deadline and metric(port, "vllm:num_requests_running") != 0:
        time.sleep(0.02)
    assert metric(port, "vllm:num_requests_running") == 0
    assert metric(port, "sim_client_disconnects_total") == 1
    assert metric(port, "vllm:request_success_total", {"finished_reason": "abort"}) == 1
    assert metric(port, "vllm:kv_cache_usage_perc") == 0
    # a stream still open at SIGTERM ends with an error event; clean exit
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/v1/completions",
                 json.dumps({"prompt": "long", "max_tokens": 5000, "ignore_eos": True,
                             "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read1(100)
    stop_clean(p)
    rest = resp.read()
    assert rest.endswith(b"data: [DONE]\n\n") and b"shutting down" in rest, rest[-300:]
    conn.close()


def test_faults():
    p, port = start_sim("--fail-rate", 1, "--fail-status", 503)
    st, _, raw = T.request("POST", port, "/v1/completions", {"prompt": "x"})
    assert st == 503 and json.loads(raw)["error"]["code"] == 503
    assert metric(port, "sim_faults_injected_total") == 1
    p.kill()
    p, port = start_sim("--ttft-ms", 1, "--tpot-ms", 1, "--stall-after-tokens", 3)
    got = []
    try:
        # 2 s per read: the three events arrive even on a loaded machine, then the stall
        for ev in T.sse_events(port, "/v1/completions",
                               {"prompt": "x", "max_tokens": 10, "ignore_eos": True,
                                "stream": True}, timeout=2.0):
            got.append(ev)
    except OSError:
        pass  # read timeout: the stream stalled
    assert len(got) == 3 and "[DONE]" not in got, got
    p.kill()
    p, port = start_sim("--crash-after-ms", 100)
    complete(port, {"prompt": "x", "max_tokens": 1})
    p.popen.wait(timeout=5)
    assert p.popen.returncode != 0


def test_record_receipt_stamped_before_parsing():
    """A record's t_recv_us is when the sim had read the request, before it parsed it: B3
    (tests/bench/b3_pd.py) charges everything inside [t_recv_us, t_done_us] to the engine and
    everything outside it to the gateway, so an engine's own parse must fall inside. A body of
    400,000 token ids takes the parser far longer than the read's wake-up; the receipt must
    lie in the first half of the span from the client's last byte to the answer."""
    p, port = start_sim("--record-capacity", 4)
    body = json.dumps({"model": "sim-model", "prompt": list(range(400000)),
                       "max_tokens": 1}).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(len(body)))
    c.endheaders()
    c.send(body)
    t_sent_us = time.monotonic_ns() // 1000  # CLOCK_MONOTONIC, the sim's clock too
    c.getresponse().read()
    c.close()
    rec = records(port)[0]
    assert rec["t_done_us"] > rec["t_recv_us"], rec
    # t_recv_us may precede t_sent_us by the time the client took to stamp it
    assert rec["t_recv_us"] - t_sent_us < (rec["t_done_us"] - t_sent_us) / 2, \
        (t_sent_us, rec["t_recv_us"], rec["t_done_us"])
    stop_clean(p)


def test_return_token_ids():
    """vLLM's return_token_ids (vllm/entrypoints/openai/completion/protocol.py, answered in
    completion/serving.py): a completions answer's choice carries prompt_token_ids (the prompt
    as /tokenize gives it) and token_ids (one per completion token); a stream carries the
    prompt's ids in its first chunk only and each chunk its token's ids. --no-return-token-ids
    imitates an engine from before the field: it is ignored."""
    for old in (False, True):
        p, port = start_sim(*(["--no-return-token-ids"] if old else []))
        body = {"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True, "return_token_ids": True}
        st, _, raw = T.request("POST", port, "/tokenize", json.dumps({"prompt": PROMPT}).encode(),
                               {"Content-Type": "application/json"})
        assert st == 200, raw
        tokens = json.loads(raw)["tokens"]
        ch = complete(port, body)[0]["choices"][0]
        chunks = [c for c in stream(port, body)[0] if c["choices"]]
        if old:
            assert "prompt_token_ids" not in ch and "token_ids" not in ch, ch
            assert not any("token_ids" in c["choices"][0] for c in chunks), chunks
        else:
            assert ch["prompt_token_ids"] == tokens, (ch, tokens)
            assert len(ch["token_ids"]) == 5 and all(isinstance(i, int) for i in ch["token_ids"])
            assert chunks[0]["choices"][0]["prompt_token_ids"] == tokens, chunks[0]
            assert not any("prompt_token_ids" in c["choices"][0] for c in chunks[1:]), chunks
            assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == ch["token_ids"]
        stop_clean(p)


def test_truncate_prompt_tokens():
    """vLLM's prompt truncation (vllm/renderers/params.py TokenizeParams): truncate_prompt_tokens
    keeps N prompt tokens, the last ones (a generation model's tokenizer truncates from the left,
    vllm/tokenizers/registry.py) unless truncation_side is "right"; -1 keeps max_model_len -
    max_tokens; more than that is refused; a prompt of ids and chat's templated prompt are cut
    alike (completion/protocol.py and chat_completion/protocol.py carry both fields)."""
    p, port = start_sim("--max-model-len", "64")
    st, _, raw = T.request("POST", port, "/tokenize", json.dumps({"prompt": PROMPT}).encode(),
                           {"Content-Type": "application/json"})
    assert st == 200, raw
    tokens = json.loads(raw)["tokens"]
    assert len(tokens) > 4, tokens
    base = {"max_tokens": 2, "return_token_ids": True}

    def ids(body):
        obj = complete(port, dict(base, **body))[0]
        return obj["choices"][0]["prompt_token_ids"], obj["usage"]["prompt_tokens"]

    assert ids({"prompt": PROMPT, "truncate_prompt_tokens": 4}) == (tokens[-4:], 4)
    assert ids({"prompt": tokens, "truncate_prompt_tokens": 4}) == (tokens[-4:], 4)
    assert ids({"prompt": PROMPT, "truncate_prompt_tokens": 4,
                "truncation_side": "right"}) == (tokens[:4], 4)
    assert ids({"prompt": PROMPT, "truncate_prompt_tokens": -1}) == (tokens, len(tokens))
    assert ids({"prompt": PROMPT, "truncate_prompt_tokens": None}) == (tokens, len(tokens))
    st, _, raw = T.request("POST", port, "/v1/completions", json.dumps(
        dict(base, prompt=PROMPT, truncate_prompt_tokens=63)).encode(),
        {"Content-Type": "application/json"})
    assert st == 400 and json.loads(raw)["error"]["param"] == "truncate_prompt_tokens", raw
    st, _, raw = T.request("POST", port, "/v1/completions", json.dumps(
        dict(base, prompt=PROMPT, truncate_prompt_tokens=4, truncation_side="middle")).encode(),
        {"Content-Type": "application/json"})
    assert st == 400 and json.loads(raw)["error"]["param"] == "truncation_side", raw
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    st, _, raw = T.request("POST", port, "/v1/chat/completions", json.dumps(
        dict(chat, truncate_prompt_tokens=3)).encode(), {"Content-Type": "application/json"})
    assert st == 200 and json.loads(raw)["usage"]["prompt_tokens"] == 3, raw
    stop_clean(p)


if __name__ == "__main__":
    T.run([test_endpoints_and_shapes, test_determinism_and_sampling, test_bad_input,
           test_record_of_requests, test_record_of_tokenize_calls,
           test_metrics_batch_and_prefix_cache,
           test_timing_timestamps_and_zero_delay, test_concurrent_streams_and_disconnect,
           test_faults, test_record_receipt_stamped_before_parsing, test_return_token_ids,
           test_truncate_prompt_tokens])
