"""Config reload under load, end to end on 127.0.0.1 (real pdgw, three pdgw-sim engines).

While client threads send a steady stream of chat requests (streaming and not), the config
file is rewritten and pdgw gets SIGHUP:

- no request fails, before, during or after any reload;
- an instance added to the file gets traffic; one removed from it gets none once the
  requests it already held have finished (they do finish: in-flight work is never cut);
- a file that does not parse, and one that does not validate (POST /admin/reload), are
  refused with one log line and pdgw_config_reloads_total{result="error"}; the running
  config keeps serving;
- a change that cannot be applied live (workers) is named "needs restart" and kept;
- API keys change live: the new key works, the old one is refused at once;
- request_timeout, max_body_bytes and retries change live: a request in flight keeps the
  values it started with, new ones get the new values (413 above the new body limit, 504 at
  the new deadline);
- protocol_options change live: vllm-mooncake's mooncake_bootstrap_fields switches the decode
  leg's kv_transfer_params from remote_bootstrap_addr to bootstrap_server_host/port (both as
  vLLM's MooncakeConnector reads them, vllm-project/vllm
  vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py) for new
  requests, while a request whose prefill was running during the reload finishes with the
  forwarder context it started with.
"""

import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid

import pdgwtest as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "forwarders"))
from fwdconf import Gateway, Sim, client_body, path_of  # noqa: E402

MODEL = "sim-model"


def start_sim(name):
    port = T.free_port()
    p = T.Proc(name, [T.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                      "--ttft-ms", "5", "--tpot-ms", "3", "--max-tokens-default", "16"])
    T.wait_http(port, "/health", proc=p)
    return p, port


def sim_total(port):
    _, _, data = T.request("GET", port, "/sim/requests")
    return json.loads(data)["total"]


def config_text(gw_port, sims, extra=""):
    lines = [f'listen: "127.0.0.1:{gw_port}"', "workers: 2", "protocol: neutral",
             "health_interval: 500ms", "health_timeout: 500ms", extra, "instances:"]
    for name, port in sims:
        lines.append(f'  - {{id: {name}, url: "http://127.0.0.1:{port}"}}')
    return "\n".join(lines) + "\n"


def write(path, text):
    # Written next to the file and renamed over it, as config managers do: the gateway
    # never reads half a file.
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def metrics(port, headers=None):
    status, _, data = T.request("GET", port, "/metrics", headers=headers)
    assert status == 200, status
    return data.decode()


def wait_for(what, cond, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def reloads(port, result, headers=None):
    return T.metric_value(metrics(port, headers), "pdgw_config_reloads_total",
                          {"result": result}) or 0


class Load:
    """Client threads sending chat requests, half streaming, until stopped."""

    def __init__(self, port, threads=4, headers=None):
        self.port = port
        self.headers = dict(headers or {})
        self.lock = threading.Lock()
        self.ok = 0
        self.failures = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]

    def set_headers(self, headers):
        with self.lock:
            self.headers = dict(headers)

    def one(self, stream, n):
        with self.lock:
            hdrs = dict(self.headers)
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {n}"}],
                "max_tokens": 8, "stream": stream}
        if stream:
            events = list(T.sse_events(self.port, "/v1/chat/completions", body, hdrs))
            # complete = a chunk with finish_reason, then [DONE] (the text may be empty: the
            # sim ends some answers with an early EOS)
            finished = any(ch.get("finish_reason") for ev in events[:-1]
                           for ch in json.loads(ev).get("choices", []))
            if not events or events[-1] != "[DONE]" or not finished:
                return f"stream {n} incomplete: {events[-2:]}"
            return None
        status, _, parsed, raw = T.post_json(self.port, "/v1/chat/completions", body, hdrs)
        if status != 200 or not parsed or not parsed.get("choices"):
            return f"request {n}: HTTP {status} {raw[:200]!r}"
        return None

    def run(self, i):
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                err = self.one(n % 2 == 0, f"{i}-{n}")
            except Exception as e:  # connection refused/reset, HTTPError
                err = f"request {i}-{n}: {e!r}"
            with self.lock:
                if err:
                    self.failures.append(err)
                else:
                    self.ok += 1

    def count(self):
        with self.lock:
            return self.ok

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def inflight_on(port, instance):
    return T.metric_value(metrics(port), "pdgw_instance_inflight_requests",
                          {"instance": instance}) or 0


def test_sighup_under_load():
    _, pa = start_sim("sim-a")
    _, pb = start_sim("sim-b")
    _, pc = start_sim("sim-c")
    port = T.free_port()
    d = tempfile.mkdtemp(prefix="pdgw-reload-")
    path = os.path.join(d, "pdgw.yaml")
    write(path, config_text(port, [("a", pa), ("b", pb)]))
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    T.wait_http(port, "/ready", proc=gw)
    hash0 = T.metric_value(metrics(port), "pdgw_config_hash")
    assert hash0, "the loaded config's hash is exported"

    with Load(port) as load:
        wait_for("traffic on a and b", lambda: sim_total(pa) >= 5 and sim_total(pb) >= 5)
        assert sim_total(pc) == 0

        # 1. Remove a, add c, change something that needs a restart.
        write(path, config_text(port, [("b", pb), ("c", pc)],
                                "access_log: false\nmax_connections: 5000"))
        gw.signal(signal.SIGHUP)
        wait_for("the reload", lambda: reloads(port, "ok") == 1)
        # Requests that booked a before the reload finish there; after that, none goes to a.
        # (twice, with new traffic on c in between: a request booked just before the
        # reload may not have opened its leg at the first look)
        wait_for("a's requests to finish", lambda: inflight_on(port, "a") == 0)
        c_start = sim_total(pc)
        wait_for("traffic on c", lambda: sim_total(pc) >= c_start + 3)
        wait_for("a's requests to finish", lambda: inflight_on(port, "a") == 0)
        a_after = sim_total(pa)
        c_start = sim_total(pc)
        wait_for("more traffic on c", lambda: sim_total(pc) >= c_start + 10)
        assert sim_total(pa) == a_after, "a removed instance got new requests"
        assert T.metric_value(metrics(port), "pdgw_config_hash") != hash0
        log = gw.output()
        assert "'max_connections' changed but needs restart" in log, log[-3000:]
        assert "applied: access_log, instances" in log, log[-3000:]
        # access_log: false took effect: c served only after the reload, and unlogged
        assert "decode=a " in log and "decode=c " not in log, log[-3000:]

        # 2. A file that does not parse: refused, one error line, the old config serves.
        write(path, "instances: [\n")
        gw.signal(signal.SIGHUP)
        wait_for("the refusal", lambda: reloads(port, "error") == 1)
        assert T.metric_value(metrics(port), "pdgw_config_last_reload_successful") == 0
        b0, c0 = sim_total(pb), sim_total(pc)
        wait_for("b and c still serving", lambda: sim_total(pb) > b0 + 3 and sim_total(pc) > c0 + 3)
        refusals = [l for l in gw.output().splitlines() if "config reload refused" in l]
        assert len(refusals) == 1 and "pdgw.yaml" in refusals[0], refusals

        # 3. One that parses but does not validate, through the admin API (from loopback,
        # no admin key configured): refused with an OpenAI-style error, old config stays.
        write(path, config_text(port, [("b", pb), ("c", "not-a-port")]))
        status, _, parsed, raw = T.post_json(port, "/admin/reload", {})
        assert status == 400, (status, raw)
        assert parsed["error"]["code"] == "config_reload_failed", parsed
        assert "instances[1]" in parsed["error"]["message"], parsed
        assert reloads(port, "error") == 2

        # 4. API keys on, live: requests carrying the key go on without a failure.
        load.set_headers({"Authorization": "Bearer sk-one"})
        write(path, config_text(port, [("b", pb), ("c", pc)], "api_keys: [sk-one]"))
        status, _, parsed, raw = T.post_json(port, "/admin/reload", {},
                                             {"Authorization": "Bearer sk-one"})
        assert status == 200 and parsed["result"] == "ok", (status, raw)
        assert "api_keys" in parsed["applied"], parsed
        st, _, _ = T.request("GET", port, "/v1/models")
        assert st == 401, f"no key after keys were switched on: {st}"
        # ...and rotated: the old key is refused at once.
        write(path, config_text(port, [("b", pb), ("c", pc)], "api_keys: [sk-two]"))
        load.set_headers({"Authorization": "Bearer sk-two"})
        gw.signal(signal.SIGHUP)
        wait_for("the key rotation", lambda: reloads(port, "ok", {"Authorization":
                                                                  "Bearer sk-two"}) == 3)
        st, _, _ = T.request("GET", port, "/v1/models", headers={"Authorization":
                                                                  "Bearer sk-one"})
        assert st == 401, st
        done = load.count()
        wait_for("more requests", lambda: load.count() >= done + 10)

    # Requests sent with the old key while the rotation was on its way may be refused (the
    # client switched keys first); everything else must have succeeded.
    real = [f for f in load.failures if "HTTP 401" not in f]
    assert not real, f"{len(real)} failed requests, first: {real[:3]}"
    assert load.count() >= 50, load.count()
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0


def test_removed_instance_finishes_its_stream():
    """A stream running on an instance the reload removes is not cut: it runs to [DONE]
    with every token, while new requests already go to the instance that replaced it."""
    port_a = T.free_port()
    sa = T.Proc("sim-a", [T.binary("pdgw-sim"), "--role", "both", "--port", str(port_a),
                          "--ttft-ms", "5", "--tpot-ms", "20", "--eos-period", "0"])
    T.wait_http(port_a, "/health", proc=sa)
    _, pb = start_sim("sim-b")
    port = T.free_port()
    d = tempfile.mkdtemp(prefix="pdgw-reload-")
    path = os.path.join(d, "pdgw.yaml")
    write(path, config_text(port, [("a", port_a)]))
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    T.wait_http(port, "/ready", proc=gw)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long one"}],
            "max_tokens": 200, "stream": True}
    events = []
    it = T.sse_events(port, "/v1/chat/completions", body)
    events.append(next(it))  # the stream is running on a
    write(path, config_text(port, [("b", pb)]))
    gw.signal(signal.SIGHUP)
    wait_for("the reload", lambda: reloads(port, "ok") == 1)
    b0 = sim_total(pb)
    status, _, _, _ = T.post_json(port, "/v1/chat/completions",
                                  {"model": MODEL, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and sim_total(pb) == b0 + 1, "a new request went elsewhere than b"
    # (the stream takes 4 s: it is still running now)
    assert inflight_on(port, "a") == 1, "the stream on a was cut by the reload"
    events.extend(it)
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    finish = [ch.get("finish_reason") for c in chunks for ch in c.get("choices", [])]
    assert finish[-1] == "length", finish[-3:]  # all 200 tokens, no early end
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0


def test_reload_keeps_restart_only_options():
    """listen, workers, protocol and TLS files need a restart: reported, kept, and the
    gateway keeps serving where it was."""
    _, pb = start_sim("sim-b")
    port = T.free_port()
    d = tempfile.mkdtemp(prefix="pdgw-reload-")
    path = os.path.join(d, "pdgw.yaml")
    write(path, config_text(port, [("b", pb)]))
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    T.wait_http(port, "/ready", proc=gw)
    other = T.free_port()
    text = config_text(other, [("b", pb)]).replace("workers: 2", "workers: 3")
    write(path, text + "prefill_policy: round-robin\n")
    status, _, parsed, raw = T.post_json(port, "/admin/reload", {})
    assert status == 200, raw
    assert sorted(parsed["needs_restart"]) == ["listen", "workers"], parsed
    assert parsed["applied"] == ["prefill_policy"], parsed
    # Not reported as reloaded: what needs a restart is named as not applied.
    assert parsed["result"] == "partial", parsed
    assert "not applied until a restart" in parsed["message"], parsed
    assert "listen" in parsed["message"] and "workers" in parsed["message"], parsed
    T.wait_http(port, "/ready", proc=gw)
    status, _, _, _ = T.post_json(port, "/v1/chat/completions",
                                  {"model": MODEL, "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0


class Slow(threading.Thread):
    """One chat request in its own thread."""

    def __init__(self, port, body=None):
        super().__init__(daemon=True)
        self.port, self.status, self.data = port, None, None
        self.body = body or {"model": MODEL, "max_tokens": 4,
                             "messages": [{"role": "user", "content": "slow"}]}
        self.start()

    def run(self):
        try:
            self.status, _, self.data = T.request("POST", self.port, "/v1/chat/completions",
                                                  self.body, timeout=60)
        except OSError as e:
            self.status = e


def test_request_limits_apply_live():
    sim_port = T.free_port()
    sim = T.Proc("sim-slow", [T.binary("pdgw-sim"), "--role", "both", "--port", str(sim_port),
                              "--ttft-ms", "1500", "--prefill-ms-per-token", "0", "--tpot-ms", "1",
                              "--max-tokens-default", "4"])
    T.wait_http(sim_port, "/health", proc=sim)
    port = T.free_port()
    d = tempfile.mkdtemp(prefix="pdgw-reload-")
    path = os.path.join(d, "pdgw.yaml")
    before = "request_timeout: 60s\nmax_body_bytes: 65536\nretries: 1"
    after = "request_timeout: 500ms\nmax_body_bytes: 2048\nretries: 0"
    write(path, config_text(port, [("s", sim_port)], before))
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    T.wait_http(port, "/ready", proc=gw)
    try:
        big = {"model": MODEL, "max_tokens": 4,
               "messages": [{"role": "user", "content": "x " * 1500}]}
        # in flight across the reload: started under request_timeout 60 s
        inflight = Slow(port)
        wait_for("the request at the engine", lambda: sim_total(sim_port) >= 1)
        write(path, config_text(port, [("s", sim_port)], after))
        status, _, parsed, raw = T.post_json(port, "/admin/reload", {})
        assert status == 200, raw
        assert sorted(parsed["applied"]) == ["max_body_bytes", "request_timeout", "retries"], \
            parsed
        assert parsed["needs_restart"] == [], parsed
        inflight.join(30)
        assert inflight.status == 200, (inflight.status, inflight.data)
        # new requests: the new body limit ...
        status, _, data = T.request("POST", port, "/v1/chat/completions", big)
        assert status == 413, (status, data)
        # ... and the new deadline (the engine takes 1.5 s: 200 under the old one)
        status, _, data = T.request("POST", port, "/v1/chat/completions",
                                    {"model": MODEL, "max_tokens": 4,
                                     "messages": [{"role": "user", "content": "late"}]})
        assert status == 504, (status, data)
        assert (T.metric_value(metrics(port), "pdgw_retries_total",
                               {"protocol": "neutral"}) or 0) == 0
        gw.signal(signal.SIGTERM)
        assert gw.wait(timeout=30) == 0
    finally:
        gw.kill()
        sim.kill()


def test_protocol_options_apply_live():
    P = Sim("prefill", "reload-P", "--kv-connector", "mooncake", "--ttft-ms", "1500")
    D = Sim("decode", "reload-D")
    gw = Gateway("vllm-mooncake", "batch", [P.instance(), D.instance()], {})
    try:
        def decode_kvp(rid):
            [rec] = [r for r in D.records(rid) if r["path"] == path_of(False)]
            assert rec["kv_result"]["ok"], rec
            return rec["body"]["kv_transfer_params"]

        def send(rid, out):
            st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False),
                                        {"X-Request-Id": rid})
            out.append((st, raw))

        old_rid = "ro-" + uuid.uuid4().hex[:10]
        res = []
        t = threading.Thread(target=send, args=(old_rid, res), daemon=True)
        t.start()
        wait_for("the old request's prefill", lambda: P.records(old_rid))
        with open(gw.cfg) as f:
            text = f.read()
        assert "protocol_options: {}" in text, text
        write(gw.cfg, text.replace("protocol_options: {}",
                                   "protocol_options:\n  mooncake_bootstrap_fields: host_port"))
        status, _, parsed, raw = T.post_json(gw.port, "/admin/reload", {})
        assert status == 200, raw
        assert parsed["applied"] == ["protocol_options"], parsed
        t.join(30)
        assert res and res[0][0] == 200, res
        old = decode_kvp(old_rid)
        assert "remote_bootstrap_addr" in old and "bootstrap_server_host" not in old, old
        new_rid = "rn-" + uuid.uuid4().hex[:10]
        res = []
        send(new_rid, res)
        assert res[0][0] == 200, res
        new = decode_kvp(new_rid)
        assert new["bootstrap_server_host"] == "127.0.0.1", new
        assert new["bootstrap_server_port"] == P.boot_port, new
        assert "remote_bootstrap_addr" not in new, new
    finally:
        gw.stop()
        P.proc.kill()
        D.proc.kill()


def test_protocol_options_kept_when_not_live():
    """lmcache runs a KV control service: a change of one of its start-up options
    (tokenize_timeout_ms) is reported "needs restart" with the reason, no second forwarder
    context is made (its ProxyNotif port could not be bound twice), the running options stay
    and the gateway keeps serving."""
    pp = T.free_port()
    P = Sim("prefill", "reload-lmP", "--proxy-host", "127.0.0.1", "--proxy-port", pp)
    D = Sim("decode", "reload-lmD")
    gw = Gateway("lmcache", "batch", [P.instance(), D.instance()],
                 {"proxy_host": "127.0.0.1", "proxy_port": pp})
    try:
        with open(gw.cfg) as f:
            text = f.read()
        write(gw.cfg, text.replace("protocol_options:\n",
                                   "protocol_options:\n  tokenize_timeout_ms: 5000\n"))
        status, _, parsed, raw = T.post_json(gw.port, "/admin/reload", {})
        assert status == 200, raw
        assert parsed["needs_restart"] == ["protocol_options"], parsed
        assert parsed["applied"] == [], parsed
        wait_for("the reason logged",
                 lambda: "'protocol_options' changed but needs restart" in gw.proc.output())
        assert "cannot bind" not in gw.proc.output(), "a second context was tried"
        st, _, _, raw = T.post_json(gw.port, path_of(False), client_body(False, False))
        assert st == 200, raw
    finally:
        gw.stop()
        P.proc.kill()
        D.proc.kill()


def test_reload_without_keys_fails_closed():
    """A reloaded file that drops every API key is refused (the keys stay in force) unless it
    says `api_keys: []` in so many words."""
    _, pb = start_sim("sim-k")
    port = T.free_port()
    d = tempfile.mkdtemp(prefix="pdgw-reload-")
    path = os.path.join(d, "pdgw.yaml")
    key = {"Authorization": "Bearer sk-one"}
    write(path, config_text(port, [("b", pb)], "api_keys: [sk-one]"))
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--config", path])
    T.wait_http(port, "/ready", proc=gw)
    write(path, config_text(port, [("b", pb)]))  # the keys' line lost
    status, _, parsed, raw = T.post_json(port, "/admin/reload", {}, key)
    assert status == 400, (status, raw)
    assert "api_keys: []" in parsed["error"]["message"], parsed
    st, _, _ = T.request("GET", port, "/v1/models")
    assert st == 401, f"keys dropped by a refused reload: {st}"
    gw.signal(signal.SIGHUP)
    wait_for("the refused SIGHUP", lambda: reloads(port, "error", key) == 2)
    st, _, _ = T.request("GET", port, "/v1/models")
    assert st == 401, st
    # Said explicitly: authentication goes off.
    write(path, config_text(port, [("b", pb)], "api_keys: []"))
    status, _, parsed, raw = T.post_json(port, "/admin/reload", {}, key)
    assert status == 200 and parsed["result"] == "ok", (status, raw)
    st, _, _ = T.request("GET", port, "/v1/models")
    assert st == 200, st
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0


if __name__ == "__main__":
    T.run([test_reload_without_keys_fails_closed, test_sighup_under_load, test_removed_instance_finishes_its_stream,
           test_reload_keeps_restart_only_options, test_request_limits_apply_live,
           test_protocol_options_apply_live, test_protocol_options_kept_when_not_live])
