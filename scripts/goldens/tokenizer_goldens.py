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
               DIR/oracle.global.js, or for a DIR without one (tinystories) the --js-bundle loader
               fed DIR's files (needs node). Only for development before HF goldens exist; lines
               where transformers.js is known to differ from HF are left out (see the header).
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
// argv[3], when given, is a tokenizer directory to load into the bundle's generic loader; the
// class is forced to PreTrainedTokenizerFast so that tokenizer.json's pipeline is kept as is.
let tok;
if (process.argv[3]) {
  const json = (f) => JSON.parse(fs.readFileSync(process.argv[3] + '/' + f, 'utf8'));
  const config = {...json('tokenizer_config.json'), tokenizer_class: 'PreTrainedTokenizerFast'};
  tok = ctx.__oracle.TokenizerLoader.fromPreTrained({tokenizerJSON: json('tokenizer.json'), tokenizerConfig: config});
} else {
  tok = ctx.__oracle.fromPreTrained();
}
const out = [];
const rl = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
rl.on('line', (line) => {
  const req = JSON.parse(line);
  if (req.op === 'encode') out.push(JSON.stringify({ids: tok.encode(req.text, {add_special_tokens: true})}));
  else if (req.ids.length === 0) out.push(JSON.stringify({text: ''}));  // transformers.js rejects []
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


def js_bundle(tok_dir, fallback):
    """(bundle path, tokenizer dir to load into it or None)."""
    own = os.path.join(tok_dir, "oracle.global.js")
    if os.path.exists(own):
        return own, None
    if not os.path.exists(fallback):
        sys.exit(f"{fallback} is missing: run scripts/fetch-fixtures.sh")
    return fallback, tok_dir


def run_js_oracle(bundle, load_dir, requests):
    with tempfile.NamedTemporaryFile("w", suffix=".js", delete=False) as f:
        f.write(JS_RUNNER)
        runner = f.name
    try:
        stdin = "\n".join(json.dumps(r) for r in requests) + "\n"
        res = subprocess.run(["node", runner, bundle] + ([load_dir] if load_dir else []), input=stdin,
                             capture_output=True, text=True)
    finally:
        os.unlink(runner)
    if res.returncode != 0:
        sys.exit(f"js oracle failed: {res.stderr[-2000:]}")
    return [json.loads(line) for line in res.stdout.split("\n") if line.strip()]  # not splitlines: U+2028 may be raw


def normalized_added_tokens(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    if not t.get("normalizer"):
        return []
    return [a["content"] for a in t.get("added_tokens", []) if a.get("normalized", not a.get("special"))]


def golden_js(name, tok_dir, texts, fallback_bundle):
    bundle, load_dir = js_bundle(tok_dir, fallback_bundle)
    package = open(os.path.join(os.path.dirname(bundle), "PACKAGE")).read().strip()
    # transformers.js looks for every added token in the raw text, while HF looks for normalized
    # ones in the normalized text; lines holding such a token cannot be compared.
    skip = normalized_added_tokens(tok_dir)
    kept = [t for t in texts if not any(a in t for a in skip)]
    enc = run_js_oracle(bundle, load_dir, [{"op": "encode", "text": t} for t in kept])
    encodings = [e["ids"] for e in enc]
    bound, added_ids = vocab_bound(tok_dir)
    cases = decode_cases(kept, encodings, bound, added_ids, seed=name)
    dec = run_js_oracle(bundle, load_dir, [{"op": "decode", "ids": ids} for ids in encodings + cases])
    header = {"source": f"js-oracle: transformers.js bundled in {package} (PROVISIONAL, not HF)",
              "tokenizer": name, "node": subprocess.run(["node", "--version"], capture_output=True,
                                                        text=True).stdout.strip(),
              "skipped_lines": len(texts) - len(kept),
              "skip_reason": "text holds a normalized added token, which transformers.js matches differently"}
    rows = [{"text": t, "ids": ids, "decoded": d["text"], "api": "transformers.js"}
            for t, ids, d in zip(kept, encodings, dec)]
    rows += [{"decode_ids": ids, "decoded": d["text"]} for ids, d in zip(cases, dec[len(kept):])]
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
    ap.add_argument("--js-bundle", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), ".fixtures", "llama3", "oracle.global.js"),
                    help="transformers.js bundle for a DIR that has none (default: the llama3 one)")
    args = ap.parse_args()
    use_transformers = set(args.transformers or ["tinystories"])
    texts = read_lines(args.lines)
    os.makedirs(args.out, exist_ok=True)
    for spec in args.tokenizer_dir:
        if not re.fullmatch(r"[\w.-]+=.+", spec):
            sys.exit(f"bad --tokenizer-dir {spec!r}: expected NAME=DIR")
        name, tok_dir = spec.split("=", 1)
        if args.js_oracle:
            header, rows = golden_js(name, tok_dir, texts, args.js_bundle)
        else:
            header, rows = golden_hf(name, tok_dir, texts, name in use_transformers)
        path = os.path.join(args.out, f"tokenizer-{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for obj in [header] + rows:
                f.write(json.dumps(obj) + "\n")
        print(f"{path}: {len(rows)} rows ({header['source']})", file=sys.stderr)


if __name__ == "__main__":
    main()
