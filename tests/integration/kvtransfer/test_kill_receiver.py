# Kill the receiver in the middle of a pull: the sender's pinned pages are
# released by the pull-pending TTL sweep (short TTL here), not leaked.
# ctest-timeout: 120
import re
import signal
import time

import pdgwtest


def wait_line(proc, pattern, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        m = re.search(pattern, proc.output(), re.M)
        if m:
            return m
        if not proc.alive():
            break
        time.sleep(0.05)
    raise AssertionError(f"{proc.name}: no line matching {pattern!r}:\n{proc.output()[-3000:]}")


def test_kill_receiver_mid_pull():
    bench = pdgwtest.binary("kvt-bench")
    common = ["--bind", "127.0.0.1", "--host", "127.0.0.1", "--block-size", "64K",
              "--batch", "8", "--buffer-size", "4M"]
    # pull-delay receiver that holds the request: the sender's pages stay pinned
    recv = pdgwtest.Proc("recv", [bench, "--mode", "recv", "--port", "0", "--init-port", "0",
                                  "--pull", "--delay", "--hold"] + common)
    m = wait_line(recv, r"alloc_port=(\d+) init_port=(\d+)")
    send = pdgwtest.Proc("send", [bench, "--mode", "send", "--port", m.group(1),
                                  "--init-port", m.group(2), "--pull", "--bytes", "512K",
                                  "--pending-ttl", "2.0", "--linger", "20"] + common)
    wait_line(recv, r"holding bench-0")
    wait_line(send, r"send: pinned=8 ")
    recv.signal(signal.SIGKILL)
    recv.wait(10)
    killed = time.time()
    # still pinned right after the kill: nothing else releases them
    assert "pinned=8" in send.output().splitlines()[-1], send.output()[-500:]
    assert send.wait(30) == 0, send.output()[-3000:]
    out = send.output()
    res = re.search(r"^RESULT .*pinned=(\d+) expired=(\d+)", out, re.M)
    assert res, out[-3000:]
    assert int(res.group(1)) == 0, out[-2000:]
    assert int(res.group(2)) >= 1, out[-2000:]
    assert time.time() - killed < 15


if __name__ == "__main__":
    pdgwtest.run([test_kill_receiver_mid_pull])
