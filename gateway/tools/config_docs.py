#!/usr/bin/env python3
"""Keep gateway/CONFIG.md's reference tables generated from pdgw's option table.

    config_docs.py BIN_DIR           check: exit 1 with a diff when CONFIG.md differs
    config_docs.py BIN_DIR --write   rewrite the tables in place (make docs)

Each table sits between a begin and an end marker in CONFIG.md; BIN_DIR holds the
pdgw-config-doc tool, which prints the tables from gateway/src/config/pdgw_config.c.
"""
import difflib
import os
import re
import subprocess
import sys

TABLES = ("keys", "cli", "instances")
HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.join(HERE, "..", "CONFIG.md")


def begin(name):
    return f"<!-- generated from the option table (make docs): {name} -->\n"


def end(name):
    return f"<!-- end of generated table: {name} -->\n"


def generated(bin_dir):
    out = {}
    for name in TABLES:
        out[name] = subprocess.run([os.path.join(bin_dir, "pdgw-config-doc"), name], check=True,
                                   capture_output=True, text=True).stdout
    return out


def splice(text, tables):
    for name, body in tables.items():
        pat = re.compile(re.escape(begin(name)) + r".*?" + re.escape(end(name)), re.S)
        if not pat.search(text):
            raise SystemExit(f"CONFIG.md: markers of table '{name}' not found")
        text = pat.sub(lambda _m: begin(name) + body + end(name), text, count=1)
    return text


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--write"):
        raise SystemExit(__doc__)
    with open(DOC, encoding="utf-8") as f:
        current = f.read()
    wanted = splice(current, generated(sys.argv[1]))
    if len(sys.argv) == 3:
        if wanted != current:
            with open(DOC, "w", encoding="utf-8") as f:
                f.write(wanted)
        return 0
    if wanted != current:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True),
                                                   wanted.splitlines(True),
                                                   "gateway/CONFIG.md (committed)",
                                                   "gateway/CONFIG.md (from the option table)"))
        print("\nCONFIG.md differs from the option table: run `make docs` and commit it.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
