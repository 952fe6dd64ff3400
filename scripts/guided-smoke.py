#!/usr/bin/env python3
"""Structured outputs across devices: sends a fixed set of guided requests (a choice, two regexes;
greedy) to a running `lragent serve` of tinystories-656k with the qv-shared-a-r8 plan/action/reflect
adapters and prints each answer (text, finish_reason, token ids) as a JSON line. Run it against a
CPU server and a `--device cuda --dtype f32` one: the lines must be equal (docs/server.md,
Structured outputs). Standard library only.

  scripts/guided-smoke.py PORT > answers.jsonl
"""
import json, sys, urllib.request
port = int(sys.argv[1])
reqs = [
  {"model": "plan", "prompt": "Lily saw a big dog. The dog was", "max_tokens": 30, "temperature": 0, "guided_choice": ["happy", "sad", "very angry"]},
  {"model": "action", "prompt": "Lily saw a big dog. The dog was", "max_tokens": 40, "temperature": 0, "guided_regex": " (?:[a-z]+ ){2,5}[a-z]+\\."},
  {"model": "reflect", "prompt": "Tom had a toy car. He", "max_tokens": 40, "temperature": 0, "logprobs": 1, "guided_regex": " (?:yes|no), [a-z]{3,8}\\."},
]
for r in reqs:
    q = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(r).encode(), {"Content-Type": "application/json"})
    d = json.load(urllib.request.urlopen(q))
    c = d["choices"][0]
    print(json.dumps({"text": c["text"], "finish": c["finish_reason"], "ids": d["lragent"]["choices"][0]["token_ids"]}))
