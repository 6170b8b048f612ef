"""Drive the two legs of each PD protocol exactly as docs/protocols/
says, without the gateway, against pdgw-sim prefill / decode instances."""

import copy
import json
import random
import threading
import time

import pdgwtest as T

NIXL_PREFILL_KVP = {"do_remote_decode": True, "do_remote_prefill": False,
                    "remote_engine_id": None, "remote_block_ids": None,
                    "remote_host": None, "remote_port": None}


class Inst:
    """One pdgw-sim instance and the ports it was given."""

    def __init__(self, role, *extra, name=None, kv=True, alloc_ports=1):
        # ports picked in advance can be taken meanwhile: retry with new ones
        for attempt in range(4):
            try:
                self._start(role, extra, name, kv, alloc_ports)
                return
            except RuntimeError as e:
                if "in use" not in str(e) or attempt == 3:
                    raise
                self.proc.kill()

    def _start(self, role, extra, name, kv, alloc_ports):
        self.role = role
        self.port = T.free_port()
        self.kv_port = T.free_port() if kv else 0
        self.boot_port = T.free_port() if kv else 0
        self.alloc_ports = [T.free_port() for _ in range(alloc_ports)] if role == "decode" else []
        self.init_ports = [T.free_port() for _ in range(alloc_ports)] if role == "decode" else []
        self.engine_id = f"{role}-{self.port}"
        argv = [T.binary("pdgw-sim"), "--role", role, "--port", str(self.port),
                "--engine-id", self.engine_id]
        if kv and role == "prefill":
            argv += ["--kv-port", str(self.kv_port), "--bootstrap-port", str(self.boot_port)]
        if self.alloc_ports:
            argv += ["--alloc-port", ",".join(map(str, self.alloc_ports)),
                     "--init-port", ",".join(map(str, self.init_ports))]
        argv += [str(a) for a in extra]
        self.proc = T.Proc(name or role, argv)
        T.wait_http(self.port, "/health", timeout=10, proc=self.proc)

    def metrics(self):
        st, _, body = T.request("GET", self.port, "/metrics")
        assert st == 200
        return body.decode()

    def metric(self, name, labels=None):
        v = T.metric_value(self.metrics(), name, labels)
        assert v is not None, name
        return v

    def records(self, rid=None):
        path = "/sim/requests" + (f"?request_id={rid}" if rid else "")
        st, _, body = T.request("GET", self.port, path)
        assert st == 200
        return json.loads(body)["requests"]

    def stop(self):
        """SIGTERM and expect a clean exit (sanitizer builds report leaks here)."""
        self.proc.signal(15)
        rc = self.proc.wait(timeout=10)
        out = self.proc.output()
        assert rc == 0, f"{self.proc.name} exited {rc}:\n{out[-3000:]}"
        assert "LeakSanitizer" not in out and "AddressSanitizer" not in out, out[-3000:]
        self.proc.kill()


def path_of(chat):
    return "/v1/chat/completions" if chat else "/v1/completions"


def hardened(body):
    """docs/protocols/README.md, hardened prefill leg: the prefill leg's body."""
    b = copy.deepcopy(body)
    b["max_tokens"] = 1
    if "max_completion_tokens" in b:
        b["max_completion_tokens"] = 1
    b["stream"] = False
    for k in ("stream_options", "min_tokens", "min_completion_tokens", "stop",
              "stop_token_ids"):
        b.pop(k, None)
    b["ignore_eos"] = True
    return b


def post(inst, body, rid, chat):
    return T.post_json(inst.port, path_of(chat), body, {"X-Request-Id": rid})


def decode_leg(inst, body, rid, chat):
    """The decode leg; returns (status, text, parsed or raw)."""
    if body.get("stream"):
        try:
            evs = list(T.sse_events(inst.port, path_of(chat), body, {"X-Request-Id": rid}))
        except T.HTTPError as e:
            return e.status, None, e.body
        assert evs[-1] == "[DONE]"
        return 200, T.stream_text(evs), evs
    st, _, obj, raw = post(inst, body, rid, chat)
    if st != 200:
        return st, None, raw
    ch = obj["choices"][0]
    return 200, ch["message"]["content"] if chat else ch["text"], obj


def in_parallel(*fns):
    out = [None] * len(fns)
    errs = []

    def run(i, f):
        try:
            out[i] = f()
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    ths = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(fns)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    if errs:
        raise errs[0]
    return out


def run_nixl(P, D, body, rid, chat=False):
    """vllm-nixl / vllm-mooncake serial: prefill returns params, decode pulls."""
    pb = hardened(body)
    pb["kv_transfer_params"] = dict(NIXL_PREFILL_KVP)
    st, _, pobj, raw = post(P, pb, rid, chat)
    assert st == 200, raw
    kvp = pobj["kv_transfer_params"]
    for k in ("do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
              "remote_request_id", "remote_host", "remote_port", "tp_size"):
        assert k in kvp, (k, kvp)
    assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
    assert kvp["remote_engine_id"] == P.engine_id and kvp["remote_port"] == P.kv_port
    db = copy.deepcopy(body)
    db["kv_transfer_params"] = kvp
    return decode_leg(D, db, rid, chat)


# vllm-mooncake serial (docs/protocols/vllm-mooncake.md) has exactly the nixl leg shapes: the
# prefill's kv_transfer_params are copied whole into the decode leg.
run_mooncake_serial = run_nixl


def run_mooncake_parallel(P, D, body, rid, chat=False):
    tid = f"tx-{rid}"
    pb = hardened(body)
    pb["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                "transfer_id": tid}
    db = copy.deepcopy(body)
    db["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                "remote_bootstrap_addr": f"http://127.0.0.1:{P.boot_port}",
                                "remote_engine_id": P.engine_id, "transfer_id": tid}
    pres, dres = in_parallel(lambda: post(P, pb, rid, chat), lambda: decode_leg(D, db, rid, chat))
    assert pres[0] == 200, pres[3]
    assert pres[2]["kv_transfer_params"] is None
    return dres


def run_kvt_batch(P, D, body, rid, chat=False):
    db = copy.deepcopy(body)
    db["kv_transfer_params"] = {"remote_host": "127.0.0.1", "remote_port": P.kv_port}
    return decode_leg(D, db, rid, chat)


def run_kvt_staged(P, D, body, rid, chat=False):
    pb = hardened(body)
    pb["kv_transfer_params"] = {"do_remote_decode": True}
    st, _, pobj, raw = post(P, pb, rid, chat)
    assert st == 200, raw
    db = copy.deepcopy(body)
    db["kv_transfer_params"] = {"do_remote_prefill": True, "remote_host": "127.0.0.1",
                                "remote_port": P.kv_port}
    return decode_leg(D, db, rid, chat)


def run_sglang(P, D, body, rid, chat=False):
    room = random.getrandbits(63)
    b = copy.deepcopy(body)
    b.update(bootstrap_host="127.0.0.1", bootstrap_port=P.boot_port, bootstrap_room=room)
    pb = hardened(b)
    pres, dres = in_parallel(lambda: post(P, pb, rid, chat), lambda: decode_leg(D, b, rid, chat))
    assert pres[0] == 200, pres[3]
    return dres


class Proxy:
    """The gateway's ZMQ PULL for lmcache ProxyNotif."""

    def __init__(self):
        import msgpack
        import zmq
        self.msgpack = msgpack
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.seen = []

    def wait(self, req_id, count, timeout=10.0):
        import zmq
        deadline = time.time() + timeout
        while self.seen.count(req_id) < count:
            left = deadline - time.time()
            assert left > 0, f"ProxyNotif {req_id} x{count} not received: {self.seen}"
            if self.sock.poll(int(left * 1000), zmq.POLLIN):
                msg = self.msgpack.unpackb(self.sock.recv(), raw=False)
                assert isinstance(msg, dict) and msg.get("type") == "ProxyNotif", msg
                self.seen.append(msg["req_id"])

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def run_lmcache(P, D, body, rid, chat=False, proxy=None, decode_spec=False):
    """lmcache: prefill pushes to the receiver named in disagg_spec; the decode
    leg goes after ProxyNotif from every TP rank. decode_spec: the decode leg
    also carries the disagg_spec (then it waits for exactly that transfer)."""
    spec = {"req_id": rid, "receiver_host": "127.0.0.1",
            "receiver_init_port": D.init_ports, "receiver_alloc_port": D.alloc_ports}
    pb = hardened(body)
    pb["kv_transfer_params"] = {"disagg_spec": spec}
    st, _, pobj, raw = post(P, pb, rid, chat)
    assert st == 200, raw
    proxy.wait(rid, len(D.init_ports))
    db = copy.deepcopy(body)
    if decode_spec:
        db["kv_transfer_params"] = {"disagg_spec": spec}
    return decode_leg(D, db, rid, chat)


def wait_idle(*insts, timeout=5.0):
    """Nothing pinned / used / running on any instance (polls: releases are async)."""
    deadline = time.time() + timeout
    while True:
        bad = []
        for i in insts:
            text = i.metrics()
            for name in ("sim_kv_pages_pinned", "sim_kv_pages_used", "sim_kv_blocks_used",
                         "vllm:num_requests_running", "vllm:num_requests_waiting"):
                v = T.metric_value(text, name)
                if v != 0:
                    bad.append((i.proc.name, name, v))
        if not bad:
            return
        if time.time() > deadline:
            raise AssertionError(f"not idle: {bad}")
        time.sleep(0.05)
