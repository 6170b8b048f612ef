#!/usr/bin/env python3
"""pdgw test kit: a fake OpenAI-compatible engine that records every leg it receives.

For forwarder plugin authors: start one fake engine per role, point pdgw at them with your
plugin, send requests, then read what each engine received (path, headers, JSON body) and
assert your protocol's legs. Standard library only.

From Python:
    from pdgw_testkit import FakeEngine
    with FakeEngine("prefill") as p, FakeEngine("decode") as d:
        ... start pdgw --plugin ... --prefill p.url --decode d.url, send a request ...
        leg = p.legs()[0]      # {"path", "headers", "body"}
From C (or any language): run it as a process; it prints "port <n>" on stdout, and
GET /testkit/legs answers the recorded legs as a JSON array (DELETE clears them):
    python3 pdgw_testkit.py --role prefill [--port 0]

Answers: /health, /v1/models, and /v1/completions and /v1/chat/completions (streamed with
"stream": true). A request with kv_transfer_params.do_remote_decode true is answered like a
vLLM prefill whose KV waits for a remote decode: a non-stream answer carrying
kv_transfer_params with do_remote_prefill true and the remote_* fields a decode pulls with
(names from upstream vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
request_finished). The text is fixed ("Hello from <role>"), so a test can tell which
engine produced the answer.
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "testkit-model"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _send(self, status, obj=None, ctype="application/json", raw=None):
        data = raw if raw is not None else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        eng = self.server.engine
        if self.path == "/health":
            self._send(200, raw=b"", ctype="text/plain")
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path == "/testkit/legs":
            self._send(200, eng.legs())
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_DELETE(self):
        if self.path == "/testkit/legs":
            self.server.engine.clear()
            self._send(200, {})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        eng = self.server.engine
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON"}})
            return
        eng._record(self.path, dict(self.headers.items()), body)
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, {"error": {"message": "not found"}})
            return
        chat = self.path.endswith("chat/completions")
        kvp = body.get("kv_transfer_params") if isinstance(body, dict) else None
        text = "Hello from %s" % eng.role
        if isinstance(kvp, dict) and kvp.get("do_remote_decode"):
            self._send(200, eng._answer(chat, "H", {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": "testkit-%s" % eng.role, "remote_block_ids": [1, 2, 3],
                "remote_host": "127.0.0.1", "remote_port": eng.port}))
        elif isinstance(body, dict) and body.get("stream"):
            self._stream(eng, chat, text)
        else:
            self._send(200, eng._answer(chat, text, None))

    def _stream(self, eng, chat, text):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for word in text.split(" "):
            piece = word if word == text.split(" ")[0] else " " + word
            ev = eng._chunk(chat, piece)
            self._chunked(b"data: " + json.dumps(ev).encode() + b"\n\n")
        self._chunked(b"data: [DONE]\n\n")
        self._chunked(b"")

    def _chunked(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class FakeEngine:
    """One fake engine on 127.0.0.1 (port 0 = ephemeral); records every POST it receives."""

    def __init__(self, role="both", port=0):
        self.role = role
        self._legs = []
        self._lock = threading.Lock()
        self._srv = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._srv.daemon_threads = True
        self._srv.engine = self
        self.port = self._srv.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._srv.shutdown()
        self._srv.server_close()

    def legs(self):
        """The legs received so far: [{"path", "headers", "body"}, ...] (copies)."""
        with self._lock:
            return json.loads(json.dumps(self._legs))

    def clear(self):
        with self._lock:
            self._legs.clear()

    def wait_legs(self, n, timeout=10.0):
        """Wait until at least n legs arrived; returns them."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            legs = self.legs()
            if len(legs) >= n:
                return legs
            time.sleep(0.01)
        raise AssertionError("%s engine: %d legs, wanted %d" % (self.role, len(self.legs()), n))

    def _record(self, path, headers, body):
        with self._lock:
            self._legs.append({"path": path, "headers": headers, "body": body})

    def _answer(self, chat, text, kvp):
        choice = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        out = {"id": "testkit-1", "object": "chat.completion" if chat else "text_completion",
               "created": int(time.time()), "model": MODEL, "choices": [choice],
               "usage": {"prompt_tokens": 4, "completion_tokens": len(text.split()),
                         "total_tokens": 4 + len(text.split())}}
        if kvp is not None:
            out["kv_transfer_params"] = kvp
        return out

    def _chunk(self, chat, piece):
        choice = {"index": 0, "finish_reason": None}
        if chat:
            choice["delta"] = {"content": piece}
        else:
            choice["text"] = piece
        return {"id": "testkit-1", "object": "chat.completion.chunk" if chat
                else "text_completion", "created": int(time.time()), "model": MODEL,
                "choices": [choice]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", default="both")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    eng = FakeEngine(a.role, a.port)
    print("port %d" % eng.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
