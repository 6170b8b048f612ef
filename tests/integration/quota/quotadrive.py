"""Helpers for libpdquota's integration tests: a real redis-server on a free loopback port
and pdquota-drive replicas spoken to over stdin/stdout.

Both are registered with pdgwtest, so they are killed when a test ends, passes or fails.
"""

import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time

import pdgwtest as t


class Redis:
    """redis-server --port P --save '' --appendonly no, on 127.0.0.1."""

    def __init__(self, port=None):
        self.port = port or t.free_port()
        self.start()

    def start(self):
        self.proc = t.Proc("redis", ["redis-server", "--port", str(self.port), "--bind",
                                     "127.0.0.1", "--save", "", "--appendonly", "no"])
        wait_for(lambda: self.command("PING") == "+PONG", 10, "redis-server answering PING",
                 self.proc)

    def command(self, *words, timeout=1.0):
        """One inline command; the first reply line, or None when nothing answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
                s.sendall((" ".join(words) + "\r\n").encode())
                data = b""
                while not data.endswith(b"\r\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                return data.decode(errors="replace").split("\r\n")[0]
        except OSError:
            return None

    def stop(self):   # a hang: the kernel still accepts connections, nothing answers
        self.proc.signal(signal.SIGSTOP)

    def cont(self):
        self.proc.signal(signal.SIGCONT)

    def kill(self):
        self.proc.kill()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"


def wait_for(cond, timeout, what, proc=None):
    """Poll <cond> until true or raise after <timeout> seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.output()}")
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


class Drive:
    """One pdquota-drive replica."""

    def __init__(self, name, *flags):
        self.name = name
        self.argv = [t.binary("pdquota-drive"), *[str(f) for f in flags]]
        self.log = tempfile.NamedTemporaryFile(prefix=f"pdgwtest-{name}-", suffix=".log",
                                               delete=False)
        self.popen = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self.log, start_new_session=True, text=True,
                                      bufsize=1)
        t._live.append(self)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.popen.stdout, selectors.EVENT_READ)
        first = self.read(10)
        assert first == "ready", f"{name}: {first}\n{self.output()}"

    def alive(self):
        return self.popen.poll() is None

    def kill(self):
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait()
        if self in t._live:
            t._live.remove(self)

    def output(self):
        self.log.flush()
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()

    def send(self, line):
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def read(self, timeout):
        if not self.sel.select(timeout):
            raise TimeoutError(f"{self.name}: no answer in {timeout}s\n{self.output()}")
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited:\n{self.output()}")
        return line.strip()

    def cmd(self, line, timeout=20):
        self.send(line)
        return self.read(timeout)

    def kv(self, line, timeout=20):
        """A command whose answer is `ok k=v ...`, as a dict of ints."""
        ans = self.cmd(line, timeout)
        assert ans.startswith("ok"), f"{self.name}: {line}: {ans}"
        return {k: int(v) for k, v in (p.split("=") for p in ans.split()[1:])}

    def log_lines(self, word):
        return [l for l in self.output().splitlines() if word in l]
