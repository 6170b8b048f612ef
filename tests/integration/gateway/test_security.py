"""Security defaults, end to end (real pdgw and pdgw-sim on this host):

- `listen` defaults to 127.0.0.1:8000; the shipped container and Kubernetes configs open
  0.0.0.0 themselves.
- /admin writes: without admin_api_key only from loopback (403 permission_error from any
  other address); with it, refused (401) without the admin key or with an API key, accepted
  with it; reads take the admin key or an API key. Refusals are OpenAI-style bodies and
  counted in pdgw_rejected_requests_total.
- TLS: a self-signed certificate made here (openssl, else GnuTLS certtool); chat, streaming
  included, over HTTPS; a plain-HTTP request to the TLS port fails without an HTTP answer and
  the gateway goes on serving; with tls_ca, requests without a certificate it signed get 403
  (probes excepted); a key that does not match the certificate stops start-up with a message
  naming the files.
"""

import glob
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time

import pdgwtest as T

MODEL = "sim-model"
SRC = T.SOURCE_DIR


def start_sim():
    port = T.free_port()
    p = T.Proc("sim", [T.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                       "--ttft-ms", "5", "--tpot-ms", "2", "--max-tokens-default", "8"])
    T.wait_http(port, "/health", proc=p)
    return port


def start_gw(sim_port, extra=(), host="127.0.0.1"):
    # A free port is picked on loopback; on 0.0.0.0 another socket of the machine (a client's
    # ephemeral port) may hold it by the time pdgw binds: pick again in that case only.
    for attempt in range(5):
        port = T.free_port()
        gw = T.Proc("pdgw", [T.binary("pdgw"), "--listen", f"{host}:{port}", "--workers", "1",
                             "--both", f"http://127.0.0.1:{sim_port}", *extra])
        try:
            T.wait_http(port, "/ready", proc=gw)
            return gw, port
        except RuntimeError:
            if attempt == 4 or "address in use" not in gw.output():
                raise
            gw.kill()


def rejected(port, reason, headers=None):
    status, _, data = T.request("GET", port, "/metrics", headers=headers)
    assert status == 200, status
    return T.metric_value(data.decode(), "pdgw_rejected_requests_total", {"reason": reason}) or 0


def local_address():
    """A non-loopback address of this host, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 9))  # no packet is sent for a UDP connect
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def admin_post(host, port, headers=None):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    body = json.dumps({"id": "x1", "url": "http://127.0.0.1:9", "role": "both"})
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    conn.request("POST", "/admin/instances", body=body, headers=hdrs)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def test_listen_default():
    out = subprocess.run([T.binary("pdgw"), "--print-config", "--both", "http://127.0.0.1:9",
                          "--admin-api-key", "adm-topsecret"],
                         capture_output=True, text=True, timeout=20, env={"PATH": "/usr/bin"})
    assert out.returncode == 0, out.stderr
    assert 'listen: "127.0.0.1:8000"' in out.stdout, out.stdout[:400]
    # the admin key is a secret like the API keys
    assert 'admin_api_key: "***"' in out.stdout and "adm-topsecret" not in out.stdout
    # The deployments that must be reachable from other hosts say so themselves.
    configs = [os.path.join(SRC, "deploy/docker/pdgw.yaml")]
    configs += glob.glob(os.path.join(SRC, "deploy/k8s/base/pdgw.yaml"))
    configs += glob.glob(os.path.join(SRC, "deploy/k8s/overlays/*/pdgw.yaml"))
    assert len(configs) >= 3, configs
    for path in configs:
        with open(path) as f:
            text = f.read()
        assert 'listen: "0.0.0.0:8000"' in text, f"{path} relies on the listen default"


def test_admin_without_admin_key():
    sim = start_sim()
    gw, port = start_gw(sim, host="0.0.0.0")
    status, body = admin_post("127.0.0.1", port)
    assert status == 201, (status, body)
    addr = local_address()
    if addr is None:
        print("note: no non-loopback address here; the 403 case is not exercised", flush=True)
    else:
        before = rejected(port, "admin_forbidden")
        status, body = admin_post(addr, port, {"X-Request-Id": "x"})
        assert status == 403, (status, body)
        assert body["error"]["type"] == "permission_error", body
        assert body["error"]["code"] == "admin_forbidden", body
        assert rejected(port, "admin_forbidden") == before + 1
        # reads stay open as before (no keys configured at all)
        conn = http.client.HTTPConnection(addr, port, timeout=10)
        conn.request("GET", "/admin/instances")
        assert conn.getresponse().status == 200
        conn.close()
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0


def test_admin_key():
    sim = start_sim()
    gw, port = start_gw(sim, ["--api-key", "sk-user", "--admin-api-key", "adm-secret"])
    user = {"Authorization": "Bearer sk-user"}
    admin = {"Authorization": "Bearer adm-secret"}
    before = rejected(port, "admin_auth", user)
    for hdrs, want in (({}, 401), (user, 401), ({"Authorization": "Bearer nope"}, 401)):
        status, body = admin_post("127.0.0.1", port, hdrs)
        assert status == want, (hdrs, status, body)
        assert body["error"]["type"] == "authentication_error", body
        assert body["error"]["code"] in ("missing_api_key", "invalid_api_key"), body
    assert rejected(port, "admin_auth", user) == before + 3
    status, body = admin_post("127.0.0.1", port, admin)
    assert status == 201, (status, body)
    # reads: the admin key or an API key, never nothing
    assert T.request("GET", port, "/admin/instances", headers=user)[0] == 200
    assert T.request("GET", port, "/admin/instances", headers=admin)[0] == 200
    assert T.request("GET", port, "/admin/instances")[0] == 401
    # the admin key is not an API key
    status, _, _, _ = T.post_json(port, "/v1/chat/completions",
                                  {"model": MODEL, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "hi"}]}, admin)
    assert status == 401, status
    # reload is an admin write too
    assert T.request("POST", port, "/admin/reload", b"", user)[0] == 401
    status, _, data = T.request("POST", port, "/admin/reload", b"", admin)
    assert status == 200, data
    # DELETE with the admin key
    assert T.request("DELETE", port, "/admin/instances/x1", headers=admin)[0] == 200
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0


def make_cert(d):
    """Self-signed certificate for 127.0.0.1 / localhost. Returns (cert, key) or None."""
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    if shutil.which("openssl"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out",
                        cert], check=True, capture_output=True, timeout=60)
        return cert, key
    if shutil.which("certtool"):
        tmpl = os.path.join(d, "cert.tmpl")
        with open(tmpl, "w") as f:
            f.write('cn = "localhost"\ndns_name = "localhost"\nip_address = "127.0.0.1"\n'
                    "expiration_days = 2\ntls_www_server\n")
        subprocess.run(["certtool", "--generate-privkey", "--key-type", "rsa", "--bits", "2048",
                        "--outfile", key], check=True, capture_output=True, timeout=60)
        subprocess.run(["certtool", "--generate-self-signed", "--load-privkey", key,
                        "--template", tmpl, "--outfile", cert], check=True,
                       capture_output=True, timeout=60)
        return cert, key
    return None


def test_tls():
    d = tempfile.mkdtemp(prefix="pdgw-tls-")
    pair = make_cert(d)
    if pair is None:
        print("SKIP neither openssl nor certtool (gnutls-bin) is installed: no certificate "
              "for the TLS test", flush=True)
        return
    cert, key = pair
    sim = start_sim()
    port = T.free_port()
    gw = T.Proc("pdgw", [T.binary("pdgw"), "--listen", f"127.0.0.1:{port}", "--workers", "2",
                         "--both", f"http://127.0.0.1:{sim}", "--tls-cert", cert, "--tls-key",
                         key])
    ctx = ssl.create_default_context(cafile=cert)

    def https(method, path, body=None):
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    # wait for the HTTPS port
    for _ in range(200):
        if not gw.alive():
            raise AssertionError(gw.output())
        try:
            if https("GET", "/ready")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.05)
    else:
        raise AssertionError("the HTTPS port never became ready")
    assert "listening on https://127.0.0.1" in gw.output()
    status, data = https("POST", "/v1/chat/completions",
                         {"model": MODEL, "max_tokens": 4,
                          "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(data)["choices"], data
    status, data = https("POST", "/v1/chat/completions",
                         {"model": MODEL, "max_tokens": 4, "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and data.rstrip().endswith(b"data: [DONE]"), data[-200:]

    # Plain HTTP to the TLS port: no HTTP answer, the connection just ends.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            pass
    assert not got.startswith(b"HTTP/"), got[:100]
    # ...and the gateway is unaffected.
    assert https("GET", "/health")[0] == 200
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0

    # Client certificates: tls_ca = a client's own self-signed certificate (its CA).
    client = make_cert(tempfile.mkdtemp(prefix="pdgw-tls-client-"))
    stranger = make_cert(tempfile.mkdtemp(prefix="pdgw-tls-stranger-"))
    port = T.free_port()
    gw = T.Proc("pdgw-mtls", [T.binary("pdgw"), "--listen", f"127.0.0.1:{port}",
                              "--both", f"http://127.0.0.1:{sim}", "--tls-cert", cert,
                              "--tls-key", key, "--tls-ca", client[0]])

    def https_as(pair, method, path, body=None):
        c = ssl.create_default_context(cafile=cert)
        if pair is not None:
            c.load_cert_chain(pair[0], pair[1])
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=c, timeout=10)
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    for _ in range(200):
        if not gw.alive():
            raise AssertionError(gw.output())
        try:
            if https_as(None, "GET", "/ready")[0] == 200:  # probes need no certificate
                break
        except OSError:
            pass
        time.sleep(0.05)
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    status, data = https_as(client, "POST", "/v1/chat/completions", chat)
    assert status == 200, data
    for who in (None, stranger):
        status, data = https_as(who, "POST", "/v1/chat/completions", chat)
        assert status == 403, (who, status, data)
        assert json.loads(data)["error"]["code"] == "client_certificate_required", data
    status, data = https_as(client, "GET", "/metrics")
    assert T.metric_value(data.decode(), "pdgw_rejected_requests_total",
                          {"reason": "client_cert"}) == 2
    gw.signal(signal.SIGTERM)
    assert gw.wait(timeout=30) == 0

    # A key that belongs to another certificate: start-up refuses, naming the files.
    bad = subprocess.run([T.binary("pdgw"), "--listen", f"127.0.0.1:{T.free_port()}",
                          "--both", f"http://127.0.0.1:{sim}", "--tls-cert", cert, "--tls-key",
                          stranger[1]], capture_output=True, text=True, timeout=20)
    assert bad.returncode == 1, bad.stderr[-500:]
    assert "tls_cert" in bad.stderr and cert in bad.stderr, bad.stderr[-500:]
    # tls_cert without tls_key: a config error.
    bad = subprocess.run([T.binary("pdgw"), "--tls-cert", cert, "--both",
                          f"http://127.0.0.1:{sim}"], capture_output=True, text=True, timeout=20)
    assert bad.returncode == 1 and "tls_cert and tls_key go together" in bad.stderr, bad.stderr


if __name__ == "__main__":
    T.run([test_listen_default, test_admin_without_admin_key, test_admin_key, test_tls])
