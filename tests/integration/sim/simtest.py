"""Shared helpers of the pdgw-sim integration tests."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import pdgwtest as T  # noqa: E402


def start_sim(*args, name="sim", wait=True):
    """Start pdgw-sim on a free port; returns (Proc, port). A port picked in
    advance may be taken meanwhile: then retry with another."""
    for attempt in range(4):
        port = T.free_port()
        argv = [T.binary("pdgw-sim"), "--port", str(port)] + [str(a) for a in args]
        p = T.Proc(name, argv)
        if not wait:
            return p, port
        try:
            T.wait_http(port, "/health", timeout=10, proc=p)
            return p, port
        except RuntimeError as e:
            p.kill()
            if "in use" not in str(e) or attempt == 3:
                raise


def metrics(port):
    status, _, body = T.request("GET", port, "/metrics")
    assert status == 200, status
    return body.decode()


def metric(port, name, labels=None):
    v = T.metric_value(metrics(port), name, labels)
    assert v is not None, f"metric {name} missing"
    return v


def records(port, request_id=None):
    path = "/sim/requests" + (f"?request_id={request_id}" if request_id else "")
    status, _, body = T.request("GET", port, path)
    assert status == 200, status
    return json.loads(body)["requests"]


def complete(port, body, headers=None, chat=False):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, hdrs, obj, raw = T.post_json(port, path, body, headers)
    assert status == 200, (status, raw[:500])
    return obj, hdrs


def text_of(obj):
    ch = obj["choices"][0]
    return ch["message"]["content"] if "message" in ch else ch["text"]


def stream(port, body, headers=None, chat=False):
    """Returns (list of parsed chunks, raw event strings)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = dict(body, stream=True)
    evs = list(T.sse_events(port, path, body, headers))
    assert evs and evs[-1] == "[DONE]", evs[-3:]
    return [json.loads(e) for e in evs[:-1]], evs


def stop_clean(p):
    """SIGTERM; expect exit 0 and no sanitizer report (leaks show up here)."""
    p.signal(15)
    rc = p.wait(timeout=10)
    out = p.output()
    assert rc == 0, f"{p.name} exited {rc}:\n{out[-3000:]}"
    assert "Sanitizer" not in out, out[-3000:]
    p.kill()
