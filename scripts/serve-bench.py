#!/usr/bin/env python3
"""The multi-agent trace through `lragent serve` over HTTP, per KV sharing mode: what a client of
the server sees of the sharing that `lragent bench trace` measures inside the engine.

For each mode a server is started (`--preset` synthetic weights with a real model's shapes, its
plan/action/reflect adapters), then one ReAct-shaped conversation runs as an agent framework
would drive it: each call's prompt is the whole trajectory so far (token ids), plan / action /
observation rounds until the target length, then reflect. Every call decodes a fixed number of
tokens (ignore_eos, greedy), so every mode does the same decoding; what differs is what each
agent must prefill. Per call it records the wall time seen by the client (request sent to
response read) and the lragent fields (reused and prefilled tokens).

Writes bench/results/serve-<gpu>-<date>.json and .md (with --out-dir), with GPU name, date and
commit; prints the markdown.

  scripts/serve-bench.py --bin build-cuda/lragent --device cuda --preset llama3.1-8b \\
      --lengths 4096,16384 --modes none,base-lr [--out-dir bench/results]
"""
import argparse
import datetime
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.request


def start_server(bin_path, args):
    proc = subprocess.Popen([bin_path, "serve", "--port", "0", "--quiet", *args], stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 600:
        line = proc.stderr.readline()
        if not line:
            sys.exit(f"serve exited ({proc.wait()}) before listening")
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
    sys.exit("serve did not start")


def post(base, body):
    data = json.dumps(body).encode()
    req = urllib.request.Request(base + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read().decode())
    return out, time.perf_counter() - t0


# The presets' vocabulary and BOS (src/model/presets.cpp).
PRESETS = {"llama3.1-8b": (128256, 128000), "ministral-8b": (131072, 1), "qwen3-8b": (151936, 151643), "tiny": (512, 1)}


def run_trace(base, target, seed, budgets, rounds, preset):
    """One conversation of `rounds` plan/action/observation rounds and a reflect call, its
    observations sized so that it ends at about `target` tokens (as bench trace sizes its tool
    observations). Returns the per-call records and the final length."""
    rng = random.Random(seed)
    vocab_hi, bos = PRESETS[preset]
    traj = [bos] + [rng.randrange(2, vocab_hi) for _ in range(600)]  # BOS + system prompt and question
    calls = []
    step = 0

    def call(agent, n):
        r, wall = post(base, {"model": agent, "prompt": traj, "max_tokens": n, "temperature": 0, "ignore_eos": True})
        lr = r["lragent"]["choices"][0]
        calls.append({"agent": agent, "prompt_tokens": len(traj), "wall_s": wall, "reused_tokens": lr["reused_tokens"],
                      "prefilled_tokens": lr["prefilled_tokens"], "decoded": len(lr["token_ids"])})
        traj.extend(lr["token_ids"])

    per_round = budgets["plan"] + budgets["action"] + 8
    obs_tokens = max(1, (target - len(traj) - rounds * per_round - 8 - budgets["reflect"]) // rounds)
    for _ in range(rounds):
        step += 1
        traj.extend(rng.randrange(2, vocab_hi) for _ in range(4))  # "Thought k:"
        call("plan", budgets["plan"])
        traj.extend(rng.randrange(2, vocab_hi) for _ in range(4))  # "Action k:"
        call("action", budgets["action"])
        traj.extend(rng.randrange(2, vocab_hi) for _ in range(obs_tokens))  # the tool's observation
    traj.extend(rng.randrange(2, vocab_hi) for _ in range(8))  # "Reflect:"
    call("reflect", budgets["reflect"])
    return calls, len(traj)


def write_results(a, name, script, md, fields):
    """Writes <out_dir>/<name>-<gpu>-<preset>-<date>.json (the run's metadata and `fields`) and .md
    (`md`); returns the path without its extension. `a`: the parsed arguments (out_dir, gpu_name,
    device, preset, commit)."""
    os.makedirs(a.out_dir, exist_ok=True)
    tag = re.sub(r"[^a-z0-9]+", "-", (a.gpu_name or a.device).lower()).strip("-")
    stem = os.path.join(a.out_dir, f"{name}-{tag}-{a.preset}-{datetime.date.today():%Y%m%d}")
    meta = {"benchmark": script, "gpu": a.gpu_name, "device": a.device, "preset": a.preset, "commit": a.commit,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    with open(stem + ".json", "w") as f:
        json.dump({**meta, **fields}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md)
    return stem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/lragent")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default="none,full,base,base-lr")
    ap.add_argument("--lengths", default="2048,4096")
    ap.add_argument("--rounds", type=int, default=6, help="plan/action/observation rounds per conversation")
    ap.add_argument("--out-dir", default="")
    ap.add_argument("--gpu-name", default="")
    ap.add_argument("--commit", default=os.environ.get("LRAGENT_COMMIT", ""))
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    budgets = {"plan": 48, "action": 24, "reflect": 24}
    results = []
    for mode in a.modes.split(","):
        args = ["--preset", a.preset, "--device", a.device, "--kv-share", mode, "--max-context", str(max(lengths) + 256),
                "--max-sessions", "1"]
        proc, base = start_server(a.bin, args)
        try:
            run_trace(base, 1200, 99, budgets, 2, a.preset)  # warm-up: kernels, allocator, graphs
            for n in lengths:
                t0 = time.perf_counter()
                calls, final = run_trace(base, n, 7, budgets, a.rounds, a.preset)
                wall = time.perf_counter() - t0
                prefilled = sum(c["prefilled_tokens"] for c in calls)
                results.append({"mode": mode, "target_tokens": n, "final_tokens": final, "calls": len(calls),
                                "wall_s": wall, "throughput_tok_s": final / wall,
                                "summed_call_s": sum(c["wall_s"] for c in calls), "prefilled_tokens": prefilled,
                                "decoded_tokens": sum(c["decoded"] for c in calls), "per_call": calls})
                print(f"{mode:8s} {final:6d} tokens {len(calls):3d} calls: {wall:7.2f} s, prefilled {prefilled}",
                      file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    by = {(r["mode"], r["target_tokens"]): r for r in results}
    lines = [f"# lragent serve: multi-agent trace over HTTP ({a.preset}, {a.device})", "",
             f"GPU: {a.gpu_name or 'n/a'} · date: {datetime.date.today()} · commit: {a.commit or 'n/a'}", "",
             f"Each conversation: {a.rounds} plan / action / observation rounds and a reflect call; each call's prompt "
             "is the whole trajectory (token ids); plan 48 / action 24 / reflect 24 tokens decoded per call (greedy, "
             "ignore_eos); the observations sized to reach the length. Wall: the client's time for the whole "
             "conversation; ratio: none's wall / this mode's.", "",
             "| mode | length | calls | prefilled tokens | decoded | wall (s) | tokens/s | speed-up vs none |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        ref = by.get(("none", r["target_tokens"]))
        ratio = f"{ref['wall_s'] / r['wall_s']:.2f}x" if ref else "n/a"
        lines.append(f"| {r['mode']} | {r['final_tokens']} | {r['calls']} | {r['prefilled_tokens']} | "
                     f"{r['decoded_tokens']} | {r['wall_s']:.2f} | {r['throughput_tok_s']:.0f} | {ratio} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out_dir:
        write_results(a, "serve", "scripts/serve-bench.py", md,
                      {"budgets": budgets, "rounds": a.rounds, "results": results})


if __name__ == "__main__":
    main()
