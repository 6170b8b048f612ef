// B9's reference side: @lenml/tokenizers (transformers.js's tokenizers) in Node, answering
// the same commands as tok-bench (tok_bench.c) so that b9_tokenizer.py alternates the two.
//   cold FILE          clear the BPE model's word cache, encode FILE's texts once
//   warm FILE MIN_MS   encode them once untimed, then again until MIN_MS of CPU time
//   -> ok CPU_S TOKENS PASSES DIGEST | error WHY
// CPU time is the process's (process.cpuUsage(): user + system, all of V8's threads).
'use strict';
const fs = require('fs');
const readline = require('readline');
const { TokenizerLoader } = require('@lenml/tokenizers');

const dir = process.argv[2];
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8')),
});

const cpuNow = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

function readTexts(path) {
  const td = new TextDecoder('utf-8');
  const parts = td.decode(fs.readFileSync(path)).split('\0');
  parts.pop(); // every text ends with a NUL
  return parts;
}

function encodePass(texts, ids) {
  let tokens = 0;
  for (let i = 0; i < texts.length; i++) {
    ids[i] = tok.encode(texts[i]); // add_special_tokens, as pdtok_encode(..., true, ...)
    tokens += ids[i].length;
  }
  return tokens;
}

function digest(ids) {
  return ids.map((a) => {
    let h = 2166136261; // FNV-1a over 32-bit ids, as tok_bench.c
    for (const id of a) h = Math.imul(h ^ id, 16777619) >>> 0;
    return a.length + ':' + h;
  }).join(',');
}

function run(line) {
  const [cmd, path, minMs] = line.trim().split(/\s+/);
  if (cmd !== 'cold' && cmd !== 'warm') return 'error bad command';
  const texts = readTexts(path);
  const ids = new Array(texts.length);
  const minCpu = cmd === 'warm' ? Number(minMs) / 1e3 : -1;
  if (cmd === 'cold') tok.model.clear_cache?.();
  else encodePass(texts, ids);
  const t0 = cpuNow();
  let tokens = 0, passes = 0, cpu = 0;
  do {
    tokens += encodePass(texts, ids);
    passes++;
    cpu = cpuNow() - t0;
  } while (cpu < minCpu);
  return `ok ${cpu.toFixed(6)} ${tokens} ${passes} ${digest(ids)}`;
}

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  let out;
  try {
    out = run(line);
  } catch (e) {
    out = 'error ' + String(e.message || e).replace(/\s+/g, ' ');
  }
  fs.writeSync(1, out + '\n');
});
