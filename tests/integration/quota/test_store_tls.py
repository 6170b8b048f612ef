# ctest-timeout: 180
"""The quota store over TLS (rediss://): a real redis-server serving TLS only, certificates
made by the test; a trusted store is used, an untrusted or misnamed one is refused and said
so, a hung one costs only the timeout.

Wire facts (not pdgw's):
- Redis serves TLS on --tls-port with --tls-cert-file / --tls-key-file and checks clients'
  certificates against --tls-ca-cert-file; a client without a certificate is refused unless
  tls-auth-clients is no (redis TLS.md "Running manually"; tests/unit/tls.tcl, "Verify
  tls-auth-clients behaves as expected"). --port 0 turns plain TCP off.
- redis-cli speaks TLS with --tls --cacert --cert --key (redis src/redis-cli.c).
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import pdgwtest as t  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import quotadrive as qd  # noqa: E402

t.skip_unless_tools("redis-server", "redis-cli", "openssl",
                    why="the TLS quota store test needs redis-server, redis-cli and openssl")

MODEL = "sim-model"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Certs:
    """A CA, a server certificate for 127.0.0.1 and redis.test, a client certificate, and a
    second CA that signed none of them."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pdgwtest-tls-")
        p = lambda n: os.path.join(self.dir, n)
        for ca in ("ca", "other-ca"):
            openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", p(f"{ca}.key"), "-out", p(f"{ca}.pem"), "-days", "2",
                    "-subj", f"/CN=pdgw test {ca}")
        ext = p("server.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:redis.test\n")
        for leaf, extra in (("server", ["-extfile", ext]), ("client", [])):
            openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", p(f"{leaf}.key"), "-out", p(f"{leaf}.csr"),
                    "-subj", f"/CN=pdgw test {leaf}")
            openssl("x509", "-req", "-in", p(f"{leaf}.csr"), "-CA", p("ca.pem"), "-CAkey",
                    p("ca.key"), "-CAcreateserial", "-out", p(f"{leaf}.pem"), "-days", "2",
                    *extra)
        self.path = p


class TlsRedis(qd.Redis):
    """redis-server serving TLS only (no plain port)."""

    def __init__(self, certs):
        self.certs = certs
        super().__init__()

    def start(self):
        c = self.certs.path
        self.proc = t.Proc("redis-tls", [
            "redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
            "--tls-cert-file", c("server.pem"), "--tls-key-file", c("server.key"),
            "--tls-ca-cert-file", c("ca.pem"), "--save", "", "--appendonly", "no"])
        qd.wait_for(lambda: self.cli("PING") == "PONG", 10, "redis-server answering over TLS",
                    self.proc)

    def cli(self, *words):
        c = self.certs.path
        r = subprocess.run(["redis-cli", "--tls", "--cacert", c("ca.pem"), "--cert",
                            c("client.pem"), "--key", c("client.key"), "-h", "127.0.0.1",
                            "-p", str(self.port), *words],
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip()

    @property
    def url(self):
        return f"rediss://127.0.0.1:{self.port}/0"


def sim():
    port = t.free_port()
    p = t.Proc(f"sim{port}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                              "--zero-delay"])
    t.wait_http(port, "/health", proc=p)
    return port


def gateway(sim_port, yaml_text, name="pdgw"):
    port = t.free_port()
    f = tempfile.NamedTemporaryFile("w", prefix="pdgwtest-tls-", suffix=".yaml", delete=False)
    f.write(f"listen: 127.0.0.1:{port}\nprotocol: neutral\naccess_log: false\n"
            f"instances:\n  - {{id: e1, url: \"http://127.0.0.1:{sim_port}\", role: both}}\n"
            + yaml_text)
    f.close()
    p = t.Proc(name, [t.binary("pdgw"), "--config", f.name])
    t.wait_http(port, "/health", proc=p)
    return port, p


def complete(port):
    return t.post_json(port, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2},
                       headers={"Authorization": "Bearer k"})


def connected(port):
    return t.metric_value(t.request("GET", port, "/metrics")[2].decode(),
                          "pdgw_quota_store_connected")


def store_yaml(r, certs, ca="ca.pem", extra="", client=True):
    c = certs.path
    return ("tenants:\n  - {name: acme, api_keys: [k], requests_per_minute: 1000}\n"
            f"quota_store: {r.url}\nquota:\n  timeout: 300ms\n  sync_interval: 20ms\n"
            f"  tls_ca_file: {c(ca)}\n"
            + (f"  tls_cert_file: {c('client.pem')}\n  tls_key_file: {c('client.key')}\n"
               if client else "") + extra)


def test_budget_and_usage_over_tls():
    certs = Certs()
    r = TlsRedis(certs)
    s = sim()
    g, _ = gateway(s, store_yaml(r, certs))
    qd.wait_for(lambda: connected(g) == 1, 10, "connected over TLS")
    for _ in range(5):
        st, _, _, raw = complete(g)
        assert st == 200, raw
    # the buckets and usage totals are in the TLS-only Redis: written through the TLS link
    qd.wait_for(lambda: r.cli("KEYS", "pdq:*") != "", 10, "the gateway's keys in the store")
    keys = r.cli("KEYS", "pdq:*").split()
    assert any("acme" in k for k in keys), keys


def test_untrusted_or_misnamed_server_is_refused():
    certs = Certs()
    r = TlsRedis(certs)
    s = sim()
    for ca, extra, client, says in [
        ("other-ca.pem", "", True, "issuer is unknown"),
        ("ca.pem", "  tls_server_name: wrong.test\n", True, "wrong.test"),
        ("ca.pem", "", False, "certificate is required"),  # Redis wants one
    ]:
        g, p = gateway(s, store_yaml(r, certs, ca, extra + "  fail_mode: closed\n", client))
        qd.wait_for(lambda: "unreachable" in p.output(), 10, "the refusal logged")
        st, _, body, raw = complete(g)
        assert st == 503 and body["error"]["code"] == "quota_store_unavailable", raw
        assert connected(g) == 0
        line = [l for l in p.output().splitlines() if "unreachable" in l]
        assert len(line) == 1 and says in line[0].lower() and "TLS" in line[0], line
        p.kill()
    # the name the certificate carries, given explicitly (sent as SNI and verified)
    g, _ = gateway(s, store_yaml(r, certs, extra="  tls_server_name: redis.test\n"))
    qd.wait_for(lambda: connected(g) == 1, 10, "connected with the certificate's DNS name")


def test_hung_tls_store_costs_only_the_timeout():
    certs = Certs()
    r = TlsRedis(certs)
    s = sim()
    g, _ = gateway(s, store_yaml(r, certs, extra="  fail_mode: closed\n"))
    qd.wait_for(lambda: connected(g) == 1, 10, "connected")
    r.stop()  # accepts, never answers: a command and the next handshake both time out
    qd.wait_for(lambda: complete(g)[0] == 503, 10, "refused while it hangs")
    r.cont()
    qd.wait_for(lambda: complete(g)[0] == 200, 15, "served again")
    assert connected(g) == 1


if __name__ == "__main__":
    t.run([test_budget_and_usage_over_tls, test_untrusted_or_misnamed_server_is_refused,
           test_hung_tls_store_costs_only_the_timeout])
