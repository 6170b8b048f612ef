"""Every documented protocol-option default is the one the code applies.

The defaults are read from the code itself: every pdgw_fwd_opt_int/bool/str/enum (or the
in-tree fwd_pd_opt_* names) call with a literal key in forwarders/*.c and
gateway/src/kvctl/pdgw_kvctl*.c, an enum's default resolved through its NULL-terminated name table
in the same file. The documented ones come from docs/protocols/*.md and forwarders/README.md:
option tables (a `default` column, or a cell with "`v` (default)" / "lo..hi (v)") and prose
of the form "`key` (v)" or "`key: v` (default)". A documented default of a known key that the
code does not apply fails the test, so neither copy can drift alone. No list of options is
written here.
"""

import glob
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

CALL = re.compile(r'\b(?:pdgw_fwd|fwd_pd)_opt_(int|bool|str|enum)\s*\(\s*options\s*,\s*'
                  r'"([a-z0-9_]+)"\s*,\s*([^;]*?)\)\s*(?:\|\||;|\))', re.S)
TABLE = re.compile(r'static\s+const\s+char\s*\*\s*const\s+(\w+)\[\]\s*=\s*\{([^}]*)\}')


def code_defaults():
    """{key: set of defaults as text} for every option with a literal default."""
    out = {}
    files = glob.glob(os.path.join(ROOT, "forwarders", "*.c")) + \
        glob.glob(os.path.join(ROOT, "gateway", "src", "kvctl", "pdgw_kvctl*.c"))
    for path in files:
        src = open(path).read()
        tables = {m.group(1): re.findall(r'"([^"]*)"', m.group(2)) for m in TABLE.finditer(src)}
        for kind, key, rest in CALL.findall(src):
            args = [a.strip() for a in rest.split(",")]
            v = None
            if kind == "int" and re.fullmatch(r"-?\d+", args[0]):
                v = args[0]
            elif kind == "bool" and args[0] in ("0", "1"):
                v = "true" if args[0] == "1" else "false"
            elif kind == "str" and re.fullmatch(r'"[^"]*"', args[0]):
                v = args[0][1:-1]
            elif kind == "enum" and args[0] in tables and re.fullmatch(r"\d+", args[1]):
                v = tables[args[0]][int(args[1])]
            if v is not None and v != "":
                out.setdefault(key, set()).add(v)
    return out


def norm(cell):
    """The default a doc cell states, or None when it states none we can compare."""
    cell = cell.strip()
    m = re.search(r"`([^`]+)`\s*\(default\)", cell)
    if m:
        return m.group(1)
    m = re.fullmatch(r"-?\d+\.\.-?\d+\s*\((-?\d+)\)", cell)
    if m:
        return m.group(1)
    m = re.fullmatch(r"`?([A-Za-z0-9_.-]+)`?", cell)
    if m:
        return m.group(1)
    return None


def doc_defaults():
    """[(file, line, key, documented default)]."""
    out = []
    pages = glob.glob(os.path.join(ROOT, "docs", "protocols", "*.md")) + \
        [os.path.join(ROOT, "forwarders", "README.md")]
    for path in pages:
        default_col = None
        for n, line in enumerate(open(path), 1):
            if line.startswith("|"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                low = [c.lower() for c in cells]
                if "default" in low:
                    default_col = low.index("default")
                    continue
                m = re.fullmatch(r"`([a-z0-9_]+)`", cells[0]) if cells else None
                if not m or len(cells) < 2:
                    continue
                if default_col is not None and default_col < len(cells):
                    v = norm(cells[default_col])
                else:
                    v = norm(cells[1]) if "(" in cells[1] else None
                if v is not None:
                    out.append((path, n, m.group(1), v))
                continue
            default_col = None
            for m in re.finditer(r"`([a-z0-9_]+)`\s+\(`?([A-Za-z0-9_.-]+)`?\)", line):
                out.append((path, n, m.group(1), m.group(2)))
            for m in re.finditer(r"`([a-z0-9_]+):\s*([A-Za-z0-9_.-]+)`\s*\(default", line):
                out.append((path, n, m.group(1), m.group(2)))
    return out


def test_documented_defaults_match_the_code():
    code = code_defaults()
    # the scan must see the forwarders' options, or it proves nothing
    assert len(code) >= 15, code
    checked, wrong = 0, []
    for path, n, key, v in doc_defaults():
        if key not in code:
            continue
        checked += 1
        if v not in code[key]:
            wrong.append(f"{os.path.relpath(path, ROOT)}:{n}: `{key}` documented default "
                         f"{v!r}, the code applies {sorted(code[key])}")
    assert checked >= 15, checked
    assert not wrong, "\n".join(wrong)


def test_the_check_can_fail():
    """A README claiming the old mooncake_dispatch default is caught."""
    code = code_defaults()
    assert "serial" not in code["mooncake_dispatch"], code["mooncake_dispatch"]
    assert "parallel" in code["mooncake_dispatch"], code["mooncake_dispatch"]


if __name__ == "__main__":
    failed = 0
    for t in (test_documented_defaults_match_the_code, test_the_check_can_fail):
        try:
            t()
            print(f"[ PASS ] {t.__name__}")
        except AssertionError as e:
            failed += 1
            print(f"[ FAIL ] {t.__name__}: {e}")
    sys.exit(1 if failed else 0)
