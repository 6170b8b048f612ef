"""`make demo` as a newcomer runs it: the build is one line (its output goes
to a log), then the streamed answer stands between two rules, non-empty,
followed by the KV transfer summary. PDGW_DEMO_ONCE=1 makes the demo stop
after the answer instead of serving until Ctrl-C.
"""

import os
import re
import subprocess

import pdgwtest

SRC = pdgwtest.SOURCE_DIR
BUILD_DIR = os.environ.get("PDGW_BUILD_DIR", os.getcwd())
RULE = "-" * 64
BUILD_NOISE = re.compile(r"Building C|Linking|Built target|\[\s*\d+%\]|-- Configuring|gmake")


def test_make_demo_shows_answer():
    # DEPS_JOB=build: only checks that the build packages are installed (they are,
    # this build exists) so the test never calls apt.
    env = dict(os.environ, PDGW_DEMO_ONCE="1")
    proc = subprocess.run(["make", "demo", f"BUILD={BUILD_DIR}", "DEPS_JOB=build", "JOBS=1"],
                          cwd=SRC, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = out.splitlines()
    noise = [l for l in lines if BUILD_NOISE.search(l)]
    assert not noise, f"build output in the demo: {noise[:5]}"
    assert lines[0].startswith("demo: building"), lines[:3]
    rules = [i for i, l in enumerate(lines) if l == RULE]
    assert len(rules) == 2, out
    answer = "\n".join(lines[rules[0] + 1:rules[1]]).strip()
    assert answer and "[error]" not in answer, out
    assert any(l.startswith("KV transfer: prefill sent") and "verify failures 0" in l
               for l in lines[rules[1]:]), out
    print(f"  answer: {answer[:80]}")


if __name__ == "__main__":
    pdgwtest.skip_unless_tools("make", "curl", why="make demo needs them")
    pdgwtest.run([test_make_demo_shows_answer])
