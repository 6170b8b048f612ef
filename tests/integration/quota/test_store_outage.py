"""The quota store going away under a running replica, against a real redis-server.

- fail_open: while Redis hangs (SIGSTOP: connections are accepted, nothing answers) or is
  dead (SIGKILL), admission keeps admitting on local limits, costs microseconds (the
  background thread owns the connection; admit never waits on it), the outage is logged
  once however many reconnects fail, errors are counted, and the replica reconnects when
  Redis is back (also to a restarted Redis, whose script cache is empty);
- a server that forgot the scripts (SCRIPT FLUSH) answers NOSCRIPT and the replica falls
  back to EVAL (redis src/eval.c: EVALSHA of an unknown digest replies NOSCRIPT);
- fail_closed: the same outage refuses with the 503-style verdict, and admits again after.
"""

import signal

import pdgwtest as t

t.skip_unless_tools("redis-server", why="the quota store tests need a real Redis")

import quotadrive as qd

# generous for a shared machine and sanitizer builds; a wait on the network would be >= 100 ms
ADMIT_BOUND_NS = 20_000_000


def state(d):
    return d.kv("state")


def wait_state(d, key, pred, what, timeout=10):
    return qd.wait_for(lambda: pred(state(d)[key]), timeout, what)


def test_fail_open_hang_kill_restart():
    r = qd.Redis()
    d = qd.Drive("open", "--store", r.url, "--rpm", 600000, "--replicas", 2, "--fail", "open",
                 "--sync-ms", 50, "--timeout-ms", 100, "--backoff-ms", 200)
    assert d.cmd("wait-connected 1 5000") == "ok"
    assert d.kv("admit 50")["admitted"] == 50
    wait_state(d, "syncs", lambda v: v >= 2, "leases from the store")

    r.stop()
    wait_state(d, "connected", lambda v: v == 0, "the replica to notice the hung store")
    during = d.kv("admit 2000")
    print(f"admit while Redis hangs: avg {during['avg_ns']} ns, max {during['max_ns']} ns",
          flush=True)
    # fail open: local limits, starting from this replica's share (1/2) of what the fleet had
    assert during["admitted"] == 2000, during
    assert during["max_ns"] < ADMIT_BOUND_NS, during
    # reconnect attempts keep failing (each times out) but the outage is said once
    wait_state(d, "errors", lambda v: v >= 4, "several failed reconnects")
    assert state(d)["warn"] == 1, d.output()
    assert len(d.log_lines("unreachable")) == 1, d.output()

    r.cont()
    assert d.cmd("wait-connected 1 10000") == "ok", d.output()
    s = state(d)
    assert s["info"] == 1 and s["reconnects"] >= 1, s
    assert len(d.log_lines("reachable again")) == 1, d.output()

    # a dead server, then a new one on the same port (empty script cache)
    r.kill()
    wait_state(d, "connected", lambda v: v == 0, "the replica to notice the dead store")
    dead = d.kv("admit 500")
    assert dead["admitted"] == 500 and dead["max_ns"] < ADMIT_BOUND_NS, dead
    assert state(d)["warn"] == 2  # one line for this second outage
    r.start()
    assert d.cmd("wait-connected 1 10000") == "ok", d.output()

    # scripts flushed behind the replica's back: NOSCRIPT, then EVAL, and syncs go on
    assert r.command("SCRIPT", "FLUSH") == "+OK"
    wait_state(d, "noscript", lambda v: v >= 1, "the EVAL fallback")
    syncs = state(d)["syncs"]
    wait_state(d, "syncs", lambda v: v >= syncs + 3, "syncs after the fallback")
    assert state(d)["connected"] == 1
    assert d.kv("admit 10")["admitted"] == 10


def test_fail_closed_refuses_while_down():
    r = qd.Redis()
    d = qd.Drive("closed", "--store", r.url, "--rpm", 600000, "--fail", "closed",
                 "--sync-ms", 50, "--timeout-ms", 100, "--backoff-ms", 200)
    assert d.cmd("wait-connected 1 5000") == "ok"
    assert d.kv("admit 20")["admitted"] == 20
    r.stop()
    wait_state(d, "connected", lambda v: v == 0, "the replica to notice the hung store")
    down = d.kv("admit 1000")
    assert down["admitted"] == 0 and down["unavailable"] == 1000, down
    assert down["max_ns"] < ADMIT_BOUND_NS, down
    assert len(d.log_lines("fail_closed")) == 1, d.output()
    r.cont()
    assert d.cmd("wait-connected 1 10000") == "ok"
    qd.wait_for(lambda: d.kv("admit 1")["admitted"] == 1, 5, "admission after the store is back")


if __name__ == "__main__":
    t.run([test_fail_open_hang_kill_restart, test_fail_closed_refuses_while_down])
