#!/usr/bin/env python3
"""Runs `lragent serve` with the given flags, drives a plan/action/reflect conversation through
/v1/completions as an agent framework would (each prompt = the trajectory so far), plus a
sampled streamed request and a greedy one with logprobs, and prints one JSON object: every completion's text and lragent
fields, and the sessions. Comparing the output of two runs (e.g. --device cpu and --device cuda
--dtype f32) checks that the server gives the same answers on both.

  scripts/serve-check.py --bin build/lragent -- --model DIR --adapter plan=P ... [--device cuda]

With --load-reflect DIR the server starts without reflect (give it plan and action only) and
with --enable-runtime-lora; reflect is loaded through POST /v1/load_lora_adapter right before its
first turn (it must then answer as when served from the start) and unloaded at the end.
"""
import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read().decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/lragent")
    ap.add_argument("--question", default="Question: Which magazine was started first, Arthur's Magazine or First for Women?\n")
    ap.add_argument("--load-reflect", default="", help="load reflect from DIR at run time")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.serve_args if x != "--"]
    if a.load_reflect:
        args.append("--enable-runtime-lora")
    proc = subprocess.Popen([a.bin, "serve", "--port", "0", "--quiet", *args], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        t0 = time.time()
        while port is None and time.time() - t0 < 300:
            line = proc.stderr.readline()
            if not line:
                sys.exit(f"serve exited: {proc.wait()}")
            m = re.search(r"on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
        base = f"http://127.0.0.1:{port}"
        out = {"turns": []}
        traj = a.question
        for step in range(1, 3):
            for agent, tag, budget in (("plan", f"Thought {step}:", 24), ("action", f"Action {step}:", 12)):
                traj += tag
                r = json.loads(post(base, "/v1/completions", {"model": agent, "prompt": traj, "max_tokens": budget,
                                                              "temperature": 0, "stop": "\n"}))
                text = r["choices"][0]["text"]
                out["turns"].append({"agent": agent, "text": text, "finish_reason": r["choices"][0]["finish_reason"],
                                     "lragent": r["lragent"]["choices"][0], "usage": r["usage"]})
                traj += text + "\n"
            traj += f"Observation {step}: nothing found.\n"
        traj += "Reflect:"
        if a.load_reflect:
            out["load_reflect"] = post(base, "/v1/load_lora_adapter", {"lora_name": "reflect", "lora_path": a.load_reflect})
        body = {"model": "reflect", "prompt": traj, "max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "seed": 5,
                "stream": True, "stream_options": {"include_usage": True}}
        events = [json.loads(l[6:]) for l in post(base, "/v1/completions", body).split("\n\n")
                  if l.startswith("data: ") and l != "data: [DONE]"]
        out["reflect_stream"] = "".join(c["text"] for e in events for c in e.get("choices", []))
        body["stream"] = False
        del body["stream_options"]
        out["reflect"] = json.loads(post(base, "/v1/completions", body))["choices"][0]["text"]
        out["stream_equals_plain"] = out["reflect_stream"] == out["reflect"]
        # Log-probabilities of a greedy plan turn (the model's log_softmax; compare across devices
        # with a tolerance).
        lp = json.loads(post(base, "/v1/completions", {"model": "plan", "prompt": traj, "max_tokens": 8,
                                                       "temperature": 0, "logprobs": 5}))["choices"][0]["logprobs"]
        out["logprobs"] = {"tokens": lp["tokens"], "token_logprobs": lp["token_logprobs"],
                           "top_logprobs": lp["top_logprobs"]}
        # vLLM's logits processors (picked on the host): a bias, a minimum length over EOS, and
        # min_p on a sampled request.
        shaped = json.loads(post(base, "/v1/completions", {
            "model": "action", "prompt": traj, "max_tokens": 12, "temperature": 0.8, "seed": 9, "min_p": 0.2,
            "min_tokens": 6, "logit_bias": {"13": 4.0}}))
        out["shaped"] = {"text": shaped["choices"][0]["text"], "token_ids": shaped["lragent"]["choices"][0]["token_ids"]}
        # Three greedy choices of one request run at once, the second and third on copies of the
        # first's trajectory: each must be the single greedy completion.
        many = json.loads(post(base, "/v1/completions", {"model": "reflect", "prompt": traj, "max_tokens": 16,
                                                         "temperature": 0, "n": 3}))
        out["n3"] = [c["text"] for c in many["choices"]]
        out["n3_trajectories"] = len({c["trajectory"] for c in many["lragent"]["choices"]})
        with urllib.request.urlopen(base + "/metrics") as r:
            metrics = r.read().decode()
        out["trajectories_copied"] = sum(
            float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("lragent:trajectories_copied_total "))
        out["metrics_prompt_tokens_reused"] = sum(
            float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("lragent:prompt_tokens_reused_total{"))
        with urllib.request.urlopen(base + "/lragent/sessions") as r:
            out["sessions"] = json.loads(r.read().decode())
        if a.load_reflect:
            out["unload_reflect"] = post(base, "/v1/unload_lora_adapter", {"lora_name": "reflect"})
            try:
                post(base, "/v1/completions", {"model": "reflect", "prompt": traj, "max_tokens": 4})
                out["reflect_after_unload"] = 200
            except urllib.error.HTTPError as e:
                out["reflect_after_unload"] = e.code
        print(json.dumps(out, indent=1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
