"""The configuration documents agree with the option table pdgw parses.

- gateway/CONFIG.md's reference tables (keys, command-line only, instance fields) are what
  pdgw-config-doc prints from gateway/src/config/pdgw_config.c: `make docs` rewrites them, this
  test fails on any difference (with the diff);
- deploy/examples/pdgw.yaml, "every key with its default", names every top-level key of the
  table, passes --check-config, and holds the defaults pdgw applies (--print-config of the
  file against --print-config of no file), except the keys it sets on purpose.
"""

import os
import re
import subprocess

import pdgwtest as t

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
EXAMPLE = os.path.join(ROOT, "deploy", "examples", "pdgw.yaml")
# Keys the example sets away from the default, and why.
ON_PURPOSE = {
    "listen": "the example serves other hosts (0.0.0.0:8000); the default is loopback",
}


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


def test_config_md_is_generated():
    p = run("python3", os.path.join(ROOT, "gateway", "tools", "config_docs.py"), t.BIN_DIR)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr


def table_keys():
    p = run(t.binary("pdgw-config-doc"), "keys")
    assert p.returncode == 0, p.stderr
    keys = re.findall(r"^\| `([a-z_.]+)` \|", p.stdout, re.M)
    assert len(keys) > 50, keys
    return keys


def top_level(text):
    """key -> value of the top-level scalar lines of a --print-config output."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+): (.+)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_example_names_every_key_with_its_default():
    with open(EXAMPLE) as f:
        text = f.read()
    missing = []
    for key in table_keys():
        parts = key.split(".")
        # a nested key: its leaf indented under its section
        pat = (rf"^{re.escape(parts[0])}:" if len(parts) == 1
               else rf"^\s+{re.escape(parts[-1])}:")
        if not re.search(pat, text, re.M) or (len(parts) > 1 and
                                              not re.search(rf"^{parts[0]}:", text, re.M)):
            missing.append(key)
    assert not missing, f"deploy/examples/pdgw.yaml lacks: {missing}"

    check = run(t.binary("pdgw"), "--check-config", EXAMPLE)
    assert check.returncode == 0 and "config OK" in check.stdout, check.stdout + check.stderr

    ex = run(t.binary("pdgw"), "--print-config", "-c", EXAMPLE)
    assert ex.returncode == 0, ex.stderr
    base = run(t.binary("pdgw"), "--print-config", "--both", "http://127.0.0.1:9")
    assert base.returncode == 0, base.stderr
    a, b = top_level(ex.stdout), top_level(base.stdout)
    differ = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k) and k not in ON_PURPOSE}
    assert not differ, f"example values that are not the defaults (value, default): {differ}"


if __name__ == "__main__":
    t.run([test_config_md_is_generated, test_example_names_every_key_with_its_default])
