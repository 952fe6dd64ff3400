#!/usr/bin/env python3
"""Renders conversations with HF transformers' apply_chat_template for the Llama-3 and Qwen3
tokenizers (the npm fixtures in .fixtures/, scripts/fetch-fixtures.sh) and writes
tests/fixtures/goldens/chat_templates.json, which tests/server/chat_template_test.cpp compares
lragent's renderer with. Needs transformers (and jinja2); no network, no GPU.

  python3 scripts/goldens/chat_template_goldens.py [--fixtures .fixtures] [--out tests/fixtures/goldens]
"""
import argparse
import json
import os

from transformers import AutoTokenizer

CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "Hello"}],
    "system_user": [
        {"role": "system", "content": "You are the plan agent of a ReAct loop."},
        {"role": "user", "content": "Question: Which magazine was started first, Arthur's Magazine or First for Women?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Thought 1:"},
        {"role": "assistant", "content": "I need to search Arthur's Magazine."},
        {"role": "user", "content": "Observation 1: Arthur's Magazine (1844-1846) was an American literary periodical."},
    ],
    "whitespace": [
        {"role": "user", "content": "  padded \n"},
        {"role": "assistant", "content": "\n\nanswer  "},
        {"role": "user", "content": "\t next\r\n"},
    ],
    "unicode_space": [{"role": "user", "content": "\u3000caf\u00e9 \u00a0"}, {"role": "assistant", "content": "\u2003ok\u2028"}],
    "thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple sum\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "<think>\n\nadd again\n\n</think>\n\n\n6"},
    ],
    "thinking_inner": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "before<think>a<think>b</think>mid</think>\nafter"},
        {"role": "user", "content": "again"},
    ],
    "tools": [
        {"role": "user", "content": "Search for Toy Story."},
        {"role": "assistant", "content": "Calling search."},
        {"role": "tool", "content": "Toy Story is a 1995 film."},
        {"role": "tool", "content": "It was made by Pixar."},
        {"role": "assistant", "content": "<think>\nfound it\n</think>\n\n1995"},
    ],
    "tool_response_user": [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "<think>x</think>calling"},
        {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"},
        {"role": "assistant", "content": "<think>y</think>done"},
    ],
    "extra_roles": [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "hi"},
        {"role": "function", "content": "42"},
    ],
    "system_later": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ok"},
    ],
}


# Meta-Llama-3-Instruct's second template revision: the assistant header only with
# add_generation_prompt (the first revision, in the npm fixture, always writes it).
def llama3_agp_variant(template):
    old = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    assert old in template
    return template.replace(old, "{% if add_generation_prompt %}" + old + "{% endif %}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=".fixtures")
    ap.add_argument("--out", default="tests/fixtures/goldens")
    a = ap.parse_args()
    out = {"transformers": __import__("transformers").__version__, "cases": []}
    for name in ("llama3", "llama3-agp", "qwen3"):
        tok = AutoTokenizer.from_pretrained(os.path.join(a.fixtures, name.split("-")[0]))
        template = tok.chat_template if name != "llama3-agp" else llama3_agp_variant(tok.chat_template)
        if name == "llama3-agp":
            out["llama3_agp_template"] = template
        for conv_name, messages in CONVERSATIONS.items():
            variants = [{"add_generation_prompt": True}, {"add_generation_prompt": False}]
            if name == "qwen3":
                variants.append({"add_generation_prompt": True, "enable_thinking": False})
            for kw in variants:
                text = tok.apply_chat_template(messages, tokenize=False, chat_template=template, **kw)
                out["cases"].append({"tokenizer": name, "conversation": conv_name, "messages": messages, **kw,
                                     "text": text})
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "chat_templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    print(f"{len(out['cases'])} cases -> {path}")


if __name__ == "__main__":
    main()
