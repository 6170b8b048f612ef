# Two kvt-bench processes on loopback move at least 1 GiB each way through
# the engine (push: the sender writes; pull: the receiver reads), and the
# receiver verifies every byte of every chunk it loads.
# ctest-timeout: 300
# ctest-labels: nosanitize
import re
import time

import pdgwtest

GIB = 1 << 30


def wait_line(proc, pattern, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        m = re.search(pattern, proc.output())
        if m:
            return m
        if not proc.alive():
            break
        time.sleep(0.05)
    raise AssertionError(f"{proc.name}: no line matching {pattern!r}:\n{proc.output()[-3000:]}")


def result(proc):
    m = re.search(r"^RESULT (.*)$", proc.output(), re.M)
    assert m, proc.output()[-3000:]
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def transfer(extra):
    bench = pdgwtest.binary("kvt-bench")
    common = ["--bind", "127.0.0.1", "--host", "127.0.0.1", "--block-size", "1M",
              "--batch", "16", "--buffer-size", "128M", "--bytes", "1G", "--lanes", "2"]
    recv = pdgwtest.Proc("recv", [bench, "--mode", "recv", "--port", "0", "--init-port", "0"]
                         + common + extra)
    m = wait_line(recv, r"alloc_port=(\d+) init_port=(\d+)")
    send = pdgwtest.Proc("send", [bench, "--mode", "send", "--port", m.group(1),
                                  "--init-port", m.group(2)] + common + extra)
    assert send.wait(240) == 0, send.output()[-3000:]
    assert recv.wait(60) == 0, recv.output()[-3000:]
    s, r = result(send), result(recv)
    assert int(s["bytes"]) >= GIB, s
    assert int(r["verified_bytes"]) >= GIB, r
    assert int(r["bad"]) == 0, r
    return s, r


def test_push_1gib_verified():
    s, r = transfer([])
    assert int(s["bytes_write"]) >= GIB, s  # the sender wrote it
    assert int(r["bytes_read"]) == 0, r


def test_pull_1gib_verified():
    s, r = transfer(["--pull"])
    assert int(s["bytes_write"]) == 0, s
    assert int(r["bytes_read"]) >= GIB, r  # the receiver read it


if __name__ == "__main__":
    pdgwtest.run([test_push_1gib_verified, test_pull_1gib_verified])
