#!/usr/bin/env python3
"""Builds tests/fixtures/text/lines.jsonl: the texts the tokenizer goldens are computed on.

Real text comes from shared/data (agent-trajectory prompts and steps, HotpotQA questions and
context paragraphs), split into non-empty lines, deduplicated, capped at MAX_CHARS characters,
and sampled evenly per source so the result is deterministic. Hand-picked hard cases (Unicode,
whitespace, digits, contractions, special-token spellings, code) come first.

One ASCII JSON string per output line, so newlines inside a case survive. Stdlib only.
Usage: extract_text_lines.py [--data DIR] [--out FILE]
"""
import argparse
import json
import os
import sys

MAX_CHARS = 2000
# Lines wanted from each source group, in this order (a group with fewer lines gives them all).
QUOTAS = [
    ("prompts", 120),
    ("trajectories", 900),
    ("role-steps", 700),
    ("hotpotqa", 900),
]

HARD_CASES = [
    # Empty and whitespace-only inputs.
    "", " ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \n ", "   leading spaces", "trailing spaces   ",
    "  both  ", "tab\tseparated\tvalues", "\t\tindented with tabs", "mixed \t \n whitespace",
    "many     spaces     between", "line one\nline two\n", "windows\r\nline\r\nendings\r\n",
    "a\n\n\nb", "a \n b", "end with newline\n", "\nstart with newline", " \t\r\n\x0b\x0c ",
    # Unusual whitespace (Unicode White_Space and look-alikes that are not).
    "nbsp\u00a0here", "nel\u0085here", "ideographic\u3000space", "em\u2003space", "line\u2028sep",
    "para\u2029sep", "zero\u200bwidth", "bom\ufeffhere", "mongolian\u180evowel", "ogham\u1680mark",
    "x\u0085\u0085\u0085y", "nel run \u0085\u0085 ", "\u00a0\u00a0nbsp lead", "ideo\u3000\u3000\u3000 end",
    "bom run\ufeff\ufeff x", "mvs\u180e\u180e x", "zw\u200b\u200b x", "a \u2028\u2028 b", "tail nel\u0085",
    # Digits.
    "1234567", "3.14159", "1,000,000", "0", "00000000000000000000", "v1.2.3-rc4", "2024-01-31 23:59:59",
    "+1 (555) 123-4567", "x1y22z333w4444", "１２３ full-width digits", "٣٤٥ arabic-indic", "Ⅻ roman numeral",
    "½ ¼ ² ³", "1e-10 and 6.022e23",
    # Contractions, both cases.
    "I'm you're they've he'll she'd it's don't", "I'M YOU'RE THEY'VE HE'LL SHE'D IT'S DON'T",
    "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "rock'n'roll o'clock y'all",
    "‘curly’ “quotes” don’t", "'ſ long s",
    # Accents, composed and decomposed.
    "café naïve résumé", "cafe\u0301 nai\u0308ve re\u0301sume\u0301", "Ångström Ærøskøbing", "Zürich Straße",
    "ǅ ǆ Ǆ titlecase", "e\u0301\u0302\u0323 stacked marks", "Z\u0351\u0336a\u0338\u034el\u0322g\u0335o\u0334",
    "\u1100\u1161\u11a8 decomposed hangul", "한국어 텍스트", "ﬁ ligature ﬀ",
    # Scripts.
    "日本語のテキストです。", "中文文本，包含标点。", "Привет, мир!", "Ελληνικά κείμενα", "مرحبا بالعالم",
    "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Tiếng Việt có dấu", "ᚠᚢᚦᚨᚱᚲ runes",
    # Emoji: single, skin tone, ZWJ sequences, flags, keycaps, variation selectors.
    "😀", "hello 🌍 world", "👍🏽 thumbs", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "🇺🇸🇯🇵🇩🇪", "1️⃣ 2️⃣ #️⃣",
    "❤️ vs ❤", "🧑🏻‍💻 coder", "😀😃😄😁😆😅🤣😂",
    # Special-token spellings inside text.
    "<s>", "</s>", "<unk>", "<s>Hello</s>", "Hello <s> world </s>", "a<s>b", " <s> ",
    "<|begin_of_text|>", "<|begin_of_text|>Hello", "Hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|eot_id|><|eot_id|>", "<|end_of_text|> trailing", "<|reserved_special_token_5|>",
    "<|start_story|>Once upon a time", "The end.<|end_story|>", "x <|start_story|> y",
    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "<think>\nreasoning\n</think>", "<tool_call>{}</tool_call>",
    "<|begin_of_text", "begin_of_text|>", "<|unknown_token|>", "<0x41> <0xE4>", "▁ lower one eighth block",
    "Ġ Ċ byte-level letters", "\ufffd replacement char",
    # Control characters.
    "nul\u0000char", "bell\u0007 and escape\u001b[0m", "del\u007f",
    # Code and punctuation runs.
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}', "https://example.com/path?q=1&r=two#frag",
    "user.name+tag@example.co.uk", "!!!???...", "----====____", "~~~***", "((([[[{{{}}}]]])))",
    "#include <vector>\nint main() { return 0; }", "SELECT * FROM t WHERE a >= 10;", "$ ls -la | grep '^d'",
    "<div class=\"a\">text</div>", "**bold** _italic_ `code`", "a.b.c.d", "...", "'''", '"""',
    # Long runs (BPE on long words).
    "a" * 300, "ab" * 150, "0" * 300, "supercalifragilisticexpialidocious" * 4, "=" * 120,
    "😀" * 40, " " * 50 + "x", "x" + " " * 50,
]


def collect_strings(value, out):
    """Appends every string inside a JSON value, in document order."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            collect_strings(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            collect_strings(v, out)


def source_files(data):
    """Files of each source group, in a fixed order."""
    traj = os.path.join(data, "agent-trajectories")
    groups = {
        "prompts": [os.path.join(traj, "prompts", f) for f in sorted(os.listdir(os.path.join(traj, "prompts")))],
        "trajectories": [os.path.join(traj, f) for f in sorted(os.listdir(traj)) if f.endswith(".json")],
        "role-steps": [os.path.join(traj, "role-steps", f)
                       for f in sorted(os.listdir(os.path.join(traj, "role-steps")))],
        "hotpotqa": [os.path.join(data, "hotpotqa", f) for f in sorted(os.listdir(os.path.join(data, "hotpotqa")))],
    }
    return groups


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    strings = []
    if path.endswith(".json"):
        collect_strings(json.loads(text), strings)
    else:
        strings.append(text)
    for s in strings:
        for line in s.split("\n"):
            if line.strip():
                yield line[:MAX_CHARS]


def spread(items, n):
    """n items taken at evenly spaced positions (all of them if there are fewer)."""
    if len(items) <= n:
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(root), "shared", "data"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "text", "lines.jsonl"))
    args = ap.parse_args()

    seen = set()
    out = []
    for case in HARD_CASES:
        if case not in seen:
            seen.add(case)
            out.append(case)
    n_hard = len(out)
    groups = source_files(args.data)
    for group, quota in QUOTAS:
        candidates = []
        for path in groups[group]:
            for line in lines_of(path):
                if line not in seen:
                    seen.add(line)
                    candidates.append(line)
        picked = spread(candidates, quota)
        # Lines not picked may be picked by a later group; only the chosen ones stay reserved.
        for line in candidates:
            seen.discard(line)
        seen.update(picked)
        out.extend(picked)
        print(f"{group}: {len(picked)} of {len(candidates)} distinct lines", file=sys.stderr)

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for line in out:
            f.write(json.dumps(line) + "\n")  # ASCII-only, so no reader can split a line
    print(f"wrote {len(out)} lines ({n_hard} hard cases) to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
