"""A fresh Debian 12 machine has no kubectl (Debian does not ship a recent
one and deploy/install-deps.sh installs only Debian packages). The tests
that need it must then print exactly one `SKIP <why>` line and pass, so
`make test` is green there. Runs them with kubectl hidden from PATH: every
PATH directory that holds kubectl is replaced by a directory of symlinks to
everything else in it.
"""

import os
import subprocess
import sys
import tempfile

import pdgwtest

HERE = os.path.dirname(os.path.abspath(__file__))
NEEDS_KUBECTL = ["test_manifests.py", "test_sim_overlays.py"]


def path_without(tool, tmp):
    dirs = []
    for i, d in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if not os.path.exists(os.path.join(d, tool)):
            dirs.append(d)
            continue
        farm = os.path.join(tmp, f"path{i}")
        os.mkdir(farm)
        for name in os.listdir(d):
            if name != tool:
                os.symlink(os.path.join(d, name), os.path.join(farm, name))
        dirs.append(farm)
    return os.pathsep.join(dirs)


def test_kubectl_tests_skip_without_kubectl():
    with tempfile.TemporaryDirectory(prefix="pdgw-nokubectl.") as tmp:
        env = dict(os.environ, PATH=path_without("kubectl", tmp))
        check = subprocess.run(["sh", "-c", "command -v kubectl || echo hidden"], env=env,
                               capture_output=True, text=True)
        assert check.stdout.strip() == "hidden", check.stdout
        for script in NEEDS_KUBECTL:
            proc = subprocess.run([sys.executable, os.path.join(HERE, script)], env=env,
                                  capture_output=True, text=True, timeout=60)
            lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
            assert proc.returncode == 0, f"{script}: exit {proc.returncode}: {lines}"
            assert len(lines) == 1 and lines[0].startswith("SKIP kubectl "), \
                f"{script}: want one SKIP line, got {lines}"
            print(f"  {script}: {lines[0][:100]}")


if __name__ == "__main__":
    pdgwtest.run([test_kubectl_tests_skip_without_kubectl])
