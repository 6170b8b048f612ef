"""Every package deploy/install-deps.sh installs for every job (build, demo,
test, bench) and every package the Dockerfile's stages install exists in
Debian 12's archive: `apt-cache policy <pkg>` lists a deb.debian.org origin
of a bookworm suite. This is the promise of the README's two commands on a
fresh Debian 12 machine; a package that only exists on this machine because
it came from elsewhere (kubectl, for one) must fail the check, which the
negative control proves.

Prints one `SKIP <why>` line and passes when apt has no package lists from
deb.debian.org (a machine that never ran apt-get update, or another mirror).
"""

import glob
import os
import re
import subprocess
import sys

import pdgwtest

SRC = pdgwtest.SOURCE_DIR
INSTALL_DEPS = os.path.join(SRC, "deploy", "install-deps.sh")
DOCKERFILE = os.path.join(SRC, "deploy", "docker", "Dockerfile")
JOBS = ["build", "demo", "test", "bench"]
LISTS = "/var/lib/apt/lists"
# A Debian 12 origin line of a version table: priority, URL, suite/component.
ORIGIN = re.compile(r"^\s+\d+\s+https?://deb\.debian\.org/debian(-security)?\s+bookworm"
                    r"(-updates|-security)?/\S+\s")


def script_packages(job):
    proc = subprocess.run(["bash", INSTALL_DEPS, "--list", job], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    pkgs = proc.stdout.split()
    assert pkgs, f"install-deps.sh --list {job} printed nothing"
    return pkgs


def dockerfile_packages():
    """Words after `apt-get install` in the Dockerfile's RUN lines (no options)."""
    with open(DOCKERFILE) as f:
        text = f.read().replace("\\\n", " ")
    pkgs = []
    for part in re.split(r"&&|;", text):
        if "apt-get install" in part:
            pkgs += [w for w in part.split("apt-get install", 1)[1].split()
                     if not w.startswith("-") and "=" not in w]
    return pkgs


def archive_origins(pkgs):
    """{package: [Debian 12 origin lines]} from one `apt-cache policy` call."""
    proc = subprocess.run(["apt-cache", "policy", *pkgs], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, LC_ALL="C"))
    assert proc.returncode == 0, proc.stderr
    out, cur = {p: [] for p in pkgs}, None
    for line in proc.stdout.splitlines():
        m = re.match(r"^(\S+):$", line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, [])
        elif cur and ORIGIN.match(line):
            out[cur].append(line.strip())
    return out


def test_every_job_package_in_debian12():
    wanted = {}
    for job in JOBS:
        for p in script_packages(job):
            wanted.setdefault(p, f"install-deps.sh {job}")
    for p in dockerfile_packages():
        wanted.setdefault(p, "deploy/docker/Dockerfile")
    # The jobs nest: build ⊂ demo ⊂ test ⊂ bench.
    for a, b in zip(JOBS, JOBS[1:]):
        assert set(script_packages(a)) <= set(script_packages(b)), f"{a} not within {b}"
    origins = archive_origins(sorted(wanted))
    missing = [f"{p} (from {wanted[p]})" for p in sorted(wanted) if not origins.get(p)]
    assert not missing, "not in Debian 12's archive: " + ", ".join(missing)
    print(f"  {len(wanted)} packages, each with a Debian 12 origin")


def test_check_rejects_foreign_packages():
    """Negative control: names Debian 12 does not carry have no origin line."""
    origins = archive_origins(["kubectl", "pdgw-no-such-package"])
    assert not origins["kubectl"], origins["kubectl"]
    assert not origins["pdgw-no-such-package"]
    assert "kubectl" not in script_packages("bench")


if __name__ == "__main__":
    pdgwtest.skip_unless_tools("apt-cache", why="not a Debian system")
    if not glob.glob(os.path.join(LISTS, "deb.debian.org_debian_dists_bookworm_*Packages*")):
        print("SKIP apt-cache has no Debian 12 package lists from deb.debian.org "
              "(run apt-get update)", flush=True)
        sys.exit(0)
    pdgwtest.run([test_every_job_package_in_debian12, test_check_rejects_foreign_packages])
