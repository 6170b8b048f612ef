#!/usr/bin/env python3
"""The forwarder SDK as a plugin author meets it: `cmake --install` into a fresh prefix, the
installed example (share/pdgw/examples/forwarder/fwd_example.c) built outside the tree
with `pkg-config --cflags pdgw` only, loaded into the installed pdgw with --plugin
(dlopen), and a PD request sent through it to the installed test kit's fake engines
(share/pdgw/testkit/pdgw_testkit.py), which record the legs.

The prefill answer's kv_transfer_params fields follow upstream vLLM
(vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, request_finished); the
example forwards them to the decode verbatim."""
import os
import shutil
import subprocess
import sys
import tempfile

import pdgwtest as T


def sh(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode,
                                                     p.stdout.decode()[-3000:]))
    return p.stdout.decode()


def install(prefix):
    build = os.environ["PDGW_BUILD_DIR"]
    sh(["cmake", "--install", build, "--prefix", prefix])
    for f in ("bin/pdgw", "include/pdgw/forwarder.h", "share/pkgconfig/pdgw.pc",
              "share/pdgw/examples/forwarder/fwd_example.c",
              "share/pdgw/testkit/pdgw_testkit.py"):
        assert os.path.exists(os.path.join(prefix, f)), "not installed: " + f


def build_example(prefix, workdir):
    src = os.path.join(prefix, "share/pdgw/examples/forwarder")
    shutil.copytree(src, os.path.join(workdir, "plugin"))
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "share/pkgconfig"))
    cflags = sh(["pkg-config", "--cflags", "pdgw"], env=env).split()
    inc = [f[2:] for f in cflags if f.startswith("-I")]
    assert any(os.path.realpath(i) == os.path.realpath(os.path.join(prefix, "include"))
               for i in inc), cflags
    n = sum(1 for _ in open(os.path.join(src, "fwd_example.c")))
    assert n < 80, "the example plugin has %d lines" % n
    # no include path into the source tree: only what pkg-config says
    sh(["make", "-C", os.path.join(workdir, "plugin"), "CFLAGS=-O2 -Wall -Werror"], env=env)
    so = os.path.join(workdir, "plugin", "fwd_example.so")
    assert os.path.exists(so)
    return so


def test_installed_example_plugin():
    with tempfile.TemporaryDirectory() as work:
        prefix = os.path.join(work, "prefix")
        install(prefix)
        so = build_example(prefix, work)
        sys.path.insert(0, os.path.join(prefix, "share/pdgw/testkit"))
        from pdgw_testkit import FakeEngine
        with FakeEngine("prefill") as pre, FakeEngine("decode") as dec:
            port = T.free_port()
            gw = T.Proc("pdgw", [os.path.join(prefix, "bin/pdgw"),
                                 "--listen", "127.0.0.1:%d" % port, "--workers", "1",
                                 "--plugin", so, "--protocol", "example-pd",
                                 "--protocol-opt", "leg_header=X-Example-Leg: yes",
                                 "--prefill", pre.url, "--decode", dec.url])
            T.wait_http(port, "/ready", proc=gw)
            body = {"model": "testkit-model", "prompt": "Hi", "max_tokens": 8}
            status, _, resp, raw = T.post_json(port, "/v1/completions", body)
            assert status == 200, (status, raw)
            assert resp["choices"][0]["text"] == "Hello from decode", raw
            p, d = pre.wait_legs(1)[0], dec.wait_legs(1)[0]
            assert p["body"]["max_tokens"] == 1 and p["body"]["stream"] is False, p
            assert p["body"]["kv_transfer_params"] == {"do_remote_decode": True}, p
            assert p["headers"].get("X-Example-Leg") == "yes", p["headers"]
            kvp = d["body"]["kv_transfer_params"]
            assert kvp["do_remote_prefill"] is True and kvp["remote_port"] == pre.port, kvp
            assert kvp["remote_block_ids"] == [1, 2, 3], kvp
            assert d["body"]["max_tokens"] == 8, d
            assert d["headers"].get("X-Example-Leg") == "yes", d["headers"]
            # streamed through the same plugin
            events = list(T.sse_events(port, "/v1/completions", dict(body, stream=True)))
            assert T.stream_text(events) == "Hello from decode", events
            gw.kill()


if __name__ == "__main__":
    T.run([test_installed_example_plugin])
