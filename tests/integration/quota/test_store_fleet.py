"""Three pdquota-drive replicas share one budget through a real redis-server.

The error bound (quota/README.md): with leases the fleet admits within N x slice of what one
token bucket would over the same time - over by at most N x slice (each replica's balance
swings between +slice/2 leased and -slice/2 run ahead), under by at most N x slice/2 left
parked in leases. Here: rpm 1200 (cap 1200, 20 per second), N = 3, lease fraction 1/12 ->
slice 100. Without sharing, three replicas would admit about 3 x 1200.

Redis facts used: EVALSHA / SCRIPT LOAD / TIME inside scripts (redis src/eval.c, src/server.c).
"""

import sys
import time

import pdgwtest as t

t.skip_unless_tools("redis-server", why="the quota store tests need a real Redis")

import quotadrive as qd

N = 3
CAP = 1200
RATE = CAP / 60.0
FRACTION = 1.0 / 12
SLICE = CAP * FRACTION


def test_three_replicas_share_one_budget():
    r = qd.Redis()
    reps = [qd.Drive(f"rep{i}", "--store", r.url, "--rpm", CAP, "--replicas", N,
                     "--lease-fraction", FRACTION, "--sync-ms", 50, "--prefix", "fleet:")
            for i in range(N)]
    for d in reps:
        assert d.cmd("wait-connected 1 5000") == "ok"
    for d in reps:
        d.send("run 1500")
    res = []
    for d in reps:
        ans = d.read(30)
        assert ans.startswith("ok"), ans
        res.append({k: int(v) for k, v in (p.split("=") for p in ans.split()[1:])})
    admitted = sum(x["admitted"] for x in res)
    span = (max(x["last_ns"] for x in res) - min(x["first_ns"] for x in res)) / 1e9
    one_bucket = CAP + RATE * span
    print(f"admitted {admitted} by {[x['admitted'] for x in res]} in {span:.3f}s; one bucket "
          f"would admit {one_bucket:.0f}; bound +-{N * SLICE:.0f}", flush=True)
    # over: never more than one bucket plus N x slice (+1 for the float edge, 20 ms of skew)
    assert admitted <= one_bucket + N * SLICE + 1 + RATE * 0.02, admitted
    # under: at most N x slice/2 parked, plus what refilled after the last sync (two syncs)
    assert admitted >= one_bucket - N * SLICE / 2 - RATE * 0.2 - 1, admitted
    # every replica took part (leases went to all of them)
    assert all(x["admitted"] > 0 for x in res), res
    # the fleet's usage totals add up across replicas once each pushed
    def fleet_total():
        import json
        u = json.loads(reps[0].cmd("usage"))
        return u["scope"] == "fleet" and u["tenants"]["t"]["total"]["requests"] == admitted
    qd.wait_for(fleet_total, 10, "fleet usage totals to reach every replica's count")
    for d in reps:
        d.send("quit")
    for d in reps:
        assert d.popen.wait(10) == 0, d.output()


if __name__ == "__main__":
    t.run([test_three_replicas_share_one_budget])
