#!/usr/bin/env python3
"""Torture run of one unit-test binary (curl's torture mode, on libpdb's wrapper).

Runs the binary once to count its allocations (PDB_ALLOC_COUNT_FILE), then once per N
with PDB_ALLOC_FAIL=N: allocation N fails, the failing call's file:line is printed by
libpdb. Every run must end cleanly:
  - no crash: no signal, no exception caught by cmocka, no sanitizer report;
  - no hang: each run ends within --run-timeout seconds;
  - no leak: LeakSanitizer's report fails the run when the suite still passed (the
    failure was handled and recovered from, so anything left over is a real leak).
    When a test's assertion failed, cmocka leaves that test's body early and the test's
    own objects are not freed; such runs are checked for crashes and sanitizer errors,
    and their leak reports are counted and listed but not failed.
A crash whose innermost frame in the source tree is a test file (tests/unit/: a test
passing the NULL it was handed to cmocka's assert_string_equal, say) is the test's own
artefact of the injected failure: counted and listed, not failed. A crash in library
code, a sanitizer error other than a leak, or a hang always fails.
N covers every allocation when the count and the time allow (--max-runs, --budget
seconds); above that the runs are spread evenly over 1..count (the first --head
allocations always run), so the suite's time stays bounded. --every-n plans every N
whatever the count (the budget then only guards against a suite grown far beyond it; a run
cut short still covers 1..count evenly). Exit 0 when every run ended cleanly.

Speed: the sweep records one stack frame per allocation (malloc_context_size), which
halves the time of allocation-heavy suites; a failing N is run again with full stacks for
its report. Detection (crashes, sanitizer errors, leaks) is the same either way.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

CRASH_MARKERS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "Test failed with exception",
    "ThreadSanitizer",
    "Segmentation fault",
)


def run(binary, env_extra, timeout, full_stacks=True):
    env = dict(os.environ)
    env.update(env_extra)
    # leaks are reported with exit code 23; abort on the first ASan error
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=66:allow_user_segv_handler=0"
    if not full_stacks:
        env["ASAN_OPTIONS"] += ":malloc_context_size=1"
    env["LSAN_OPTIONS"] = "exitcode=23"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=66"
    try:
        p = subprocess.run([binary], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode("utf-8", "replace") if e.stdout else ""
        return None, out


def count_allocations(binary, timeout):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "count")
        rc, out = run(binary, {"PDB_ALLOC_COUNT_FILE": path}, timeout)
        if rc != 0:
            sys.exit("%s fails without fault injection (rc %s):\n%s" % (binary, rc, out[-3000:]))
        with open(path) as f:
            return int(f.read().strip())


def plan(count, max_runs, head):
    if count <= max_runs:
        return list(range(1, count + 1))
    ns = set(range(1, head + 1))
    rest = max_runs - head
    for i in range(rest):
        ns.add(head + 1 + (count - head - 1) * i // max(rest - 1, 1))
    return sorted(ns)


def innermost_tree_frame(out, root):
    """File of the innermost stack frame of the first sanitizer report inside <root>."""
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("#") and " in " in line and root in line:
            return line.rsplit(" ", 1)[-1]
    return ""


def failed_run(rc, out):
    """Anything but a clean pass (the full-stack re-run then classifies it)."""
    return rc != 0 or any(m in out for m in CRASH_MARKERS) or "LeakSanitizer" in out


def site_of(out):
    for line in out.splitlines():
        if line.startswith("pdb: injected failure"):
            return line.split(" at ", 1)[-1]
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--max-runs", type=int, default=300)
    ap.add_argument("--head", type=int, default=100)
    ap.add_argument("--run-timeout", type=float, default=60)
    ap.add_argument("--budget", type=float, default=0, help="seconds for the whole suite")
    ap.add_argument("--every-n", action="store_true", help="plan every N whatever the count")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    t = time.monotonic()
    count = count_allocations(a.binary, a.run_timeout)
    per_run = max(time.monotonic() - t, 0.01)
    max_runs = a.max_runs
    if a.every_n:
        max_runs = count
    elif a.budget > 0:
        max_runs = max(min(max_runs, int(a.budget / per_run)), 10)
    ns = plan(count, max_runs, min(a.head, max_runs // 2))
    name = os.path.basename(a.binary)
    print("%s: %d allocations, %d runs (%s)" % (name, count, len(ns),
                                              "every N" if len(ns) == count else "spread"),
          flush=True)
    failures, tolerated, artefacts = [], [], []
    t0 = time.monotonic()
    # interleaved, so a run cut short by the budget still covers 1..count evenly
    stride = 16
    order = [n for k in range(stride) for n in ns[k::stride]]
    done = 0
    for n in order:
        if a.budget > 0 and time.monotonic() - t0 > a.budget:
            break
        done += 1
        rc, out = run(a.binary, {"PDB_ALLOC_FAIL": str(n)}, a.run_timeout, full_stacks=False)
        if failed_run(rc, out):
            rc, out = run(a.binary, {"PDB_ALLOC_FAIL": str(n)}, a.run_timeout)  # the report
        site = site_of(out)
        if rc is None:
            failures.append((n, site, "hang (no end within %gs)" % a.run_timeout, out))
        elif rc < 0 or rc == 66 or any(m in out for m in CRASH_MARKERS) or (
                rc == 23 and "LeakSanitizer" not in out):
            frame = innermost_tree_frame(out, root)
            if "/tests/unit/" in frame and "SEGV" in out:
                artefacts.append((n, site, frame))
            else:
                failures.append((n, site, "crash (rc %d) at %s" % (rc, frame or "?"), out))
        elif "LeakSanitizer" in out:
            if "[  FAILED  ]" in out:
                tolerated.append((n, site))
            else:
                failures.append((n, site, "leak", out))
    print("%s: %d of %d runs in %.1fs, %d failed, %d leak reports after a failed assertion, "
          "%d test-code crashes on a NULL it was handed"
          % (name, done, len(ns), time.monotonic() - t0, len(failures), len(tolerated),
             len(artefacts)))
    for n, site, frame in artefacts[:10]:
        print("  test-code crash: allocation %d at %s, crashed in %s" % (n, site, frame))
    for n, site in tolerated[:10]:
        print("  leak after failed assertion: allocation %d at %s" % (n, site))
    for n, site, what, out in failures[:5]:
        print("FAIL allocation %d at %s: %s\n%s\n" % (n, site, what, out[-4000:]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
