#!/usr/bin/env python3
"""Writes tokenizer goldens: tests/fixtures/goldens/tokenizer-NAME.jsonl for each tokenizer.

  tokenizer_goldens.py --tokenizer-dir NAME=DIR [...] --lines FILE --out DIR [--transformers NAME ...]
                       [--js-oracle]

Each output file starts with a header object {"source": ..., ...}; then one object per input
line, {"text", "ids", "decoded", "api"}, where ids = encode(text, add_special_tokens=True) and
decoded = decode(ids, skip_special_tokens=False); then decode-only cases {"decode_ids", "decoded"}
(random ids, single ids, and prefixes/suffixes of encodings that cut multi-byte characters).

Oracles:
  default      HF `tokenizers` (Tokenizer.from_file). For the names given with --transformers
               (default: tinystories) `transformers.AutoTokenizer.from_pretrained(DIR)` is used
               instead: tok(text)["input_ids"] and tok.decode(ids); lines where raw `tokenizers`
               disagrees also carry "ids_tokenizers".
  --js-oracle  PROVISIONAL: the transformers.js bundle that scripts/fetch-fixtures.sh saved as
               DIR/oracle.global.js (needs node). Only for development before HF goldens exist.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

# Encodings of these hard cases are cut at every id to make decode cases that split characters.
CUT_CASES = ["日本語のテキストです。", "👨‍👩‍👧‍👦 family", "café naïve résumé", "🇺🇸🇯🇵🇩🇪", "Привет, мир!",
             "Hi<|eot_id|>", "한국어 텍스트", "Tiếng Việt có dấu"]

JS_RUNNER = r"""
const fs = require('fs'), vm = require('vm'), readline = require('readline');
// The bundles assign their API to a top-level var (qwen3's is even named `undefined`).
const src = fs.readFileSync(process.argv[2], 'utf8').replace(/^("use strict";)?var [\w$]+=/, '$1globalThis.__oracle=');
const ctx = {console, TextEncoder, TextDecoder}; vm.createContext(ctx);
vm.runInContext(src, ctx);
const tok = ctx.__oracle.fromPreTrained();
const out = [];
const rl = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
rl.on('line', (line) => {
  const req = JSON.parse(line);
  if (req.op === 'encode') out.push(JSON.stringify({ids: tok.encode(req.text, {add_special_tokens: true})}));
  else out.push(JSON.stringify({text: tok.decode(req.ids, {skip_special_tokens: false, clean_up_tokenization_spaces: false})}));
});
rl.on('close', () => process.stdout.write(out.join('\n') + '\n'));
"""


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def vocab_bound(tok_dir):
    """max id + 1 over the model vocab and added tokens of DIR/tokenizer.json."""
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    vocab = t["model"]["vocab"]
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [a["id"] for a in t.get("added_tokens", [])]
    return max(ids) + 1, sorted(a["id"] for a in t.get("added_tokens", []))


def decode_cases(texts, encodings, bound, added_ids, seed):
    """Deterministic id sequences to decode: (list of id lists)."""
    rng = random.Random(seed)
    cases = [[i] for i in range(min(64, bound))]
    cases += [[i] for i in added_ids[:40]]
    cases += [[rng.randrange(bound)] for _ in range(40)]
    for _ in range(60):
        cases.append([rng.randrange(bound) for _ in range(rng.randint(2, 12))])
    by_text = dict(zip(texts, encodings))
    for text in CUT_CASES:
        ids = by_text.get(text)
        if not ids:
            continue
        for k in range(1, len(ids)):
            cases.append(ids[:k])
            cases.append(ids[k:])
    seen, unique = set(), []
    for c in cases:
        if tuple(c) not in seen:
            seen.add(tuple(c))
            unique.append(c)
    return unique


def run_js_oracle(tok_dir, requests):
    bundle = os.path.join(tok_dir, "oracle.global.js")
    if not os.path.exists(bundle):
        sys.exit(f"{bundle} is missing: run scripts/fetch-fixtures.sh")
    with tempfile.NamedTemporaryFile("w", suffix=".js", delete=False) as f:
        f.write(JS_RUNNER)
        runner = f.name
    try:
        stdin = "\n".join(json.dumps(r) for r in requests) + "\n"
        res = subprocess.run(["node", runner, bundle], input=stdin, capture_output=True, text=True)
    finally:
        os.unlink(runner)
    if res.returncode != 0:
        sys.exit(f"js oracle failed: {res.stderr[-2000:]}")
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def golden_js(name, tok_dir, texts):
    package = open(os.path.join(tok_dir, "PACKAGE")).read().strip()
    enc = run_js_oracle(tok_dir, [{"op": "encode", "text": t} for t in texts])
    encodings = [e["ids"] for e in enc]
    bound, added_ids = vocab_bound(tok_dir)
    cases = decode_cases(texts, encodings, bound, added_ids, seed=name)
    dec = run_js_oracle(tok_dir, [{"op": "decode", "ids": ids} for ids in encodings + cases])
    header = {"source": f"js-oracle: transformers.js bundled in {package} (PROVISIONAL, not HF)",
              "tokenizer": name, "node": subprocess.run(["node", "--version"], capture_output=True,
                                                        text=True).stdout.strip()}
    rows = [{"text": t, "ids": ids, "decoded": d["text"], "api": "transformers.js"}
            for t, ids, d in zip(texts, encodings, dec)]
    rows += [{"decode_ids": ids, "decoded": d["text"]} for ids, d in zip(cases, dec[len(texts):])]
    return header, rows


def golden_hf(name, tok_dir, texts, use_transformers):
    import tokenizers  # noqa: PLC0415 (only the GPU machine has it)

    raw = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    header = {"source": "huggingface", "tokenizer": name, "tokenizers_version": tokenizers.__version__}
    rows = []
    if use_transformers:
        import transformers  # noqa: PLC0415

        auto = transformers.AutoTokenizer.from_pretrained(tok_dir)
        header.update(transformers_version=transformers.__version__, transformers_class=type(auto).__name__)
        encodings = [auto(t)["input_ids"] for t in texts]
        disagree = 0
        for t, ids in zip(texts, encodings):
            row = {"text": t, "ids": ids, "decoded": auto.decode(ids), "api": "transformers"}
            raw_ids = raw.encode(t, add_special_tokens=True).ids
            if raw_ids != ids:
                row["ids_tokenizers"] = raw_ids
                disagree += 1
            rows.append(row)
        header["lines_where_tokenizers_disagrees"] = disagree
        decode = auto.decode
    else:
        encodings = [raw.encode(t, add_special_tokens=True).ids for t in texts]
        rows = [{"text": t, "ids": ids, "decoded": raw.decode(ids, skip_special_tokens=False), "api": "tokenizers"}
                for t, ids in zip(texts, encodings)]

        def decode(ids):
            return raw.decode(ids, skip_special_tokens=False)
    bound, added_ids = vocab_bound(tok_dir)
    for ids in decode_cases(texts, encodings, bound, added_ids, seed=name):
        rows.append({"decode_ids": ids, "decoded": decode(ids)})
    return header, rows


def main():
    ap = argparse.ArgumentParser(description="Writes tokenizer goldens (see module docstring).")
    ap.add_argument("--tokenizer-dir", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--lines", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--transformers", action="append", metavar="NAME",
                    help="use transformers.AutoTokenizer for NAME (default: tinystories)")
    ap.add_argument("--js-oracle", action="store_true", help="provisional goldens from transformers.js")
    args = ap.parse_args()
    use_transformers = set(args.transformers or ["tinystories"])
    texts = read_lines(args.lines)
    os.makedirs(args.out, exist_ok=True)
    for spec in args.tokenizer_dir:
        if not re.fullmatch(r"[\w.-]+=.+", spec):
            sys.exit(f"bad --tokenizer-dir {spec!r}: expected NAME=DIR")
        name, tok_dir = spec.split("=", 1)
        if args.js_oracle:
            header, rows = golden_js(name, tok_dir, texts)
        else:
            header, rows = golden_hf(name, tok_dir, texts, name in use_transformers)
        path = os.path.join(args.out, f"tokenizer-{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for obj in [header] + rows:
                f.write(json.dumps(obj) + "\n")
        print(f"{path}: {len(rows)} rows ({header['source']})", file=sys.stderr)


if __name__ == "__main__":
    main()
