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


# Tool definitions and calls (Qwen3 only: the Llama-3 templates have no place for them), in the
# OpenAI API's form as a client sends them; vllm_tools / vllm_messages turn them into what vLLM
# hands the template.
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search Wikipedia; returns the first paragraph.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 3}},
                   "required": ["query"]}}}
LOOKUP = {"function": {"parameters": {"type": "object", "properties": {"keyword": {"type": "string",
                                                                                  "description": "caf\u00e9 \u2014 \"quoted\"\n"}}},
                       "name": "lookup", "strict": True}, "type": "function"}
FINISH = {"type": "function", "function": {"name": "finish"}}
TOOL_CASES = {
    "tool_defs": ([{"role": "system", "content": "You are the action agent."},
                   {"role": "user", "content": "Which magazine was started first?"}], [SEARCH, LOOKUP, FINISH]),
    "tool_defs_no_system": ([{"role": "user", "content": "hi"}], [FINISH]),
    "tool_calls": ([
        {"role": "user", "content": "Search for Toy Story."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Toy Story\", \"limit\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Toy Story is a 1995 film."},
        {"role": "assistant", "content": "Found it.", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": "{\"keyword\":\"Pixar\",\"opts\":{\"z\":0.5,\"a\":[1,true,null,1e-05]},\"u\":\"\u00e9\\n\"}"}},
            {"id": "call_3", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "Pixar made it."},
    ], [SEARCH, LOOKUP, FINISH]),
    "tool_calls_thinking": ([
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": "<think>\nI should search.\n</think>\n\nSearching.", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"x\"}"}}]},
        {"role": "tool", "content": "nothing"},
    ], [SEARCH]),
}


def vllm_tools(tools):
    """vLLM's [tool.model_dump() for tool in request.tools]: declared fields first (absent: None),
    extras after, in their order."""
    out = []
    for t in tools:
        f = t["function"]
        fn = {k: f.get(k) for k in ("name", "description", "parameters")}
        fn.update({k: v for k, v in f.items() if k not in fn})
        norm = {"type": "function", "function": fn}
        norm.update({k: v for k, v in t.items() if k not in norm})
        out.append(norm)
    return out


def vllm_messages(messages):
    """vLLM parses an assistant's tool-call arguments (JSON text) before rendering."""
    out = json.loads(json.dumps(messages))
    for m in out:
        if m["role"] == "assistant" and isinstance(m.get("tool_calls"), list):
            for c in m["tool_calls"]:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m.get("content") is None:
            m["content"] = ""
    return out


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
    out = {"transformers": __import__("transformers").__version__, "cases": [], "tool_cases": []}
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
        if name == "qwen3":
            for conv_name, (messages, tools) in TOOL_CASES.items():
                for kw in ({"add_generation_prompt": True}, {"add_generation_prompt": False}):
                    text = tok.apply_chat_template(vllm_messages(messages), tools=vllm_tools(tools), tokenize=False,
                                                   chat_template=template, **kw)
                    out["tool_cases"].append({"tokenizer": name, "conversation": conv_name, "messages": messages,
                                              "tools": tools, **kw, "text": text})
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "chat_templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    print(f"{len(out['cases'])} cases, {len(out['tool_cases'])} tool cases -> {path}")


if __name__ == "__main__":
    main()
