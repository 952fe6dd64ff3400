#!/usr/bin/env python3
"""What batching across requests gives the clients of `lragent serve`: C independent clients
send their requests at once, and the server runs their passes together (continuous batching).

One server (`--preset` synthetic weights with a real model's shapes and its plan/action/reflect
adapters) serves every level. At each concurrency C, C clients each send one completion request
at the same moment: its own prompt (random token ids, --prompt tokens), an adapter in turn
(plan, action, reflect), --max-tokens tokens decoded (greedy, ignore_eos). Per level it records
the wall time until the last response, the aggregate generated tokens/s, each client's latency,
and from /metrics the engine's passes and the requests they served (the mean batch). The
speed-up at C is C x (the time of one request alone) / (the wall time of C at once): how much
sooner C requests end than run one after another.

--shared-prompt: the C clients are parallel agents given one prompt (a fan-out: plan, action,
reflect, ... reading the same trajectory). The server runs each beside the first on a copy of the
first's trajectory once the first has computed the prompt (docs/server.md). The baseline is then
measured, not derived: the same C requests sent one after another on another fresh prompt (each
reusing what the previous computed, as the server ran them before copies existed: they waited for
the first's trajectory). Written as serve-fanout-*.

Writes bench/results/serve-concurrency-<gpu>-<preset>-<date>.json, .md and .png (with --out-dir;
the plot when matplotlib is there), with GPU name, date and commit; prints the markdown.

  scripts/serve-concurrency.py --bin build-cuda/lragent --device cuda --preset llama3.1-8b \\
      --levels 1,2,4,8,16 [--out-dir bench/results]
"""
import argparse
import datetime
import os
import random
import re
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
serve_bench = __import__("serve-bench")  # start_server, post, PRESETS, write_results


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def bodies_for(c, prompt_tokens, max_tokens, preset, seed, shared):
    vocab_hi, bos = serve_bench.PRESETS[preset]
    rng = random.Random(seed)
    agents = ["plan", "action", "reflect"]
    prompt = lambda: [bos] + [rng.randrange(2, vocab_hi) for _ in range(prompt_tokens - 1)]
    one = prompt() if shared else None
    return [{"model": agents[i % 3], "prompt": one if shared else prompt(), "max_tokens": max_tokens,
             "temperature": 0, "ignore_eos": True} for i in range(c)]


def run_sequential(base, c, prompt_tokens, max_tokens, preset, seed, shared):
    """The same kind of C requests sent one after another: the wall time until the last answer."""
    bodies = bodies_for(c, prompt_tokens, max_tokens, preset, seed, shared)
    t0 = time.perf_counter()
    for b in bodies:
        serve_bench.post(base, b)
    return time.perf_counter() - t0


def run_level(base, c, prompt_tokens, max_tokens, preset, seed, shared=False):
    bodies = bodies_for(c, prompt_tokens, max_tokens, preset, seed, shared)
    out = [None] * c
    start = threading.Barrier(c + 1)

    def client(i):
        start.wait()
        r, wall = serve_bench.post(base, bodies[i])
        out[i] = {"latency_s": wall, "tokens": r["usage"]["completion_tokens"]}

    passes0 = metric(base, "lragent:engine_passes_total")
    served0 = metric(base, "lragent:engine_pass_sequences_total")
    copied0 = metric(base, "lragent:trajectories_copied_total")
    preempted0 = metric(base, "lragent:num_preemptions_total")
    threads = [threading.Thread(target=client, args=(i,)) for i in range(c)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    passes = metric(base, "lragent:engine_passes_total") - passes0
    served = metric(base, "lragent:engine_pass_sequences_total") - served0
    copied = metric(base, "lragent:trajectories_copied_total") - copied0
    preempted = metric(base, "lragent:num_preemptions_total") - preempted0
    kv_used = metric(base, "lragent:kv_memory_used_bytes")  # the trajectories kept after the level (nan: none)
    tokens = sum(o["tokens"] for o in out)
    if tokens != c * max_tokens:
        sys.exit(f"C={c}: {tokens} tokens generated, not {c} x {max_tokens}")
    lat = sorted(o["latency_s"] for o in out)
    return {"concurrency": c, "wall_s": wall, "generated_tokens": tokens, "tokens_per_s": tokens / wall,
            "latency_mean_s": sum(lat) / c, "latency_max_s": lat[-1], "engine_passes": passes,
            "mean_batch": served / passes if passes else float("nan"), "trajectories_copied": copied,
            "kv_memory_used_bytes": kv_used, "preemptions": preempted}


def head_rule(head):
    return "|" + " ---: |" * (head.count("|") - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/lragent")
    ap.add_argument("--preset", default="tiny", choices=sorted(serve_bench.PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-share", default="base-lr")
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens each request decodes")
    ap.add_argument("--shared-prompt", action="store_true",
                    help="the clients are parallel agents on one prompt (baseline: the same requests one after another)")
    ap.add_argument("--server-args", default="", help="more `lragent serve` flags, e.g. \"--enforce-eager\"")
    ap.add_argument("--max-context", type=int, default=0,
                    help="the server's --max-context (default: --prompt + --max-tokens + 64)")
    ap.add_argument("--max-sessions", type=int, default=0, help="the server's --max-sessions (default: the top level + 1)")
    ap.add_argument("--out-dir", default="")
    ap.add_argument("--name", default="", help="results' file name stem (default: serve-fanout / serve-concurrency)")
    ap.add_argument("--gpu-name", default="")
    ap.add_argument("--commit", default=os.environ.get("LRAGENT_COMMIT", ""))
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    args = ["--preset", a.preset, "--device", a.device, "--kv-share", a.kv_share, "--max-context",
            str(a.max_context or a.prompt + a.max_tokens + 64), "--max-sessions",
            str(a.max_sessions or max(levels) + 1)] + a.server_args.split()
    proc, base = serve_bench.start_server(a.bin, args)
    results = []
    try:
        run_level(base, 2, a.prompt, 16, a.preset, 1, a.shared_prompt)  # warm-up: kernels, allocator, graphs
        for i, c in enumerate(levels):
            r = run_level(base, c, a.prompt, a.max_tokens, a.preset, 100 + i, a.shared_prompt)
            if a.shared_prompt:  # a fresh prompt of its own (seed): nothing of it is cached
                r["sequential_wall_s"] = run_sequential(base, c, a.prompt, a.max_tokens, a.preset, 200 + i, True)
            results.append(r)
            print(f"C={c:3d}: {r['wall_s']:6.2f} s, {r['tokens_per_s']:8.1f} tok/s, mean batch {r['mean_batch']:.2f}",
                  file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        sys.stderr.write(proc.stderr.read())  # the server's exit report (e.g. LRAGENT_CUDA_GRAPH_STATS=1)
    one = next((r for r in results if r["concurrency"] == 1), None)
    for r in results:
        if a.shared_prompt:
            r["speedup_vs_one_at_a_time"] = r["sequential_wall_s"] / r["wall_s"]
        else:
            r["speedup_vs_one_at_a_time"] = r["concurrency"] * one["wall_s"] / r["wall_s"] if one else None
    if a.shared_prompt:
        title = f"# lragent serve: parallel agents on one prompt ({a.preset}, {a.device}, --kv-share {a.kv_share})"
        what = (f"C clients send one request each at once, all on one {a.prompt}-token prompt (parallel agents reading "
                f"one trajectory), an adapter in turn (plan / action / reflect), {a.max_tokens} tokens decoded (greedy, "
                "ignore_eos), over HTTP. The first computes the prompt; the others run beside it on copies of its "
                "trajectory once it has (copied: trajectories copied, from /metrics; a copy shares the prompt's "
                "KV blocks, and the decode attention reads them once for the copies of a batch when enough are "
                "shared). KV memory: the server's KV memory in use after the level (kv_memory_used_bytes: every "
                "trajectory kept, shared blocks once). One after another: the same C "
                "requests on another fresh prompt sent in turn, measured in the same run (each reuses the prompt the "
                "first computed). Speed-up: that time / the wall time at once.")
        head = ("| clients | wall (s) | one after another (s) | generated tokens/s | mean latency (s) | max latency (s) "
                "| mean batch | copied | KV memory (GB) | speed-up vs one after another |")
        lines_fmt = lambda r, sp: (f"| {r['concurrency']} | {r['wall_s']:.2f} | {r['sequential_wall_s']:.2f} | "
                                   f"{r['tokens_per_s']:.0f} | {r['latency_mean_s']:.2f} | {r['latency_max_s']:.2f} | "
                                   f"{r['mean_batch']:.2f} | {r['trajectories_copied']:.0f} | "
                                   f"{r.get('kv_memory_used_bytes', float('nan')) / 1e9:.2f} | {sp} |")
    else:
        title = f"# lragent serve: concurrent clients ({a.preset}, {a.device}, --kv-share {a.kv_share})"
        what = (f"C clients send one request each at once: its own {a.prompt}-token prompt, an adapter in turn "
                f"(plan / action / reflect), {a.max_tokens} tokens decoded (greedy, ignore_eos), over HTTP. Speed-up: "
                "C x (one request's wall time) / (C requests' wall time), i.e. against running them one after another.")
        what += (" Preempted: running requests the server preempted because its KV memory (--kv-cache-memory) "
                 "filled, each resumed by recomputing (from /metrics).")
        head = ("| clients | wall (s) | generated tokens/s | mean latency (s) | max latency (s) | mean batch | preempted "
                "| speed-up vs one at a time |")
        lines_fmt = lambda r, sp: (f"| {r['concurrency']} | {r['wall_s']:.2f} | {r['tokens_per_s']:.0f} | "
                                   f"{r['latency_mean_s']:.2f} | {r['latency_max_s']:.2f} | {r['mean_batch']:.2f} | "
                                   f"{r['preemptions']:.0f} | {sp} |")
    lines = [title, "", f"GPU: {a.gpu_name or 'n/a'} · date: {datetime.date.today()} · commit: {a.commit or 'n/a'}", "",
             f"Server: `lragent serve {' '.join(args)}`.", "",
             what + " Mean batch: requests served per engine pass (from /metrics).", "",
             head, head_rule(head)]
    for r in results:
        sp = f"{r['speedup_vs_one_at_a_time']:.2f}x" if r["speedup_vs_one_at_a_time"] else "n/a"
        lines.append(lines_fmt(r, sp))
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out_dir:
        stem = serve_bench.write_results(a, a.name or ("serve-fanout" if a.shared_prompt else "serve-concurrency"),
                                         "scripts/serve-concurrency.py", md,
                                         {"kv_share": a.kv_share, "prompt_tokens": a.prompt, "max_tokens": a.max_tokens,
                                          "shared_prompt": a.shared_prompt, "results": results})
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
            cs = [r["concurrency"] for r in results]
            ax[0].plot(cs, [r["tokens_per_s"] for r in results], "o-")
            ax[0].set(xlabel="concurrent clients", ylabel="generated tokens/s", xscale="log", title="throughput")
            if a.shared_prompt:
                ax[1].plot(cs, [r["wall_s"] for r in results], "o-", label="at once (copies)")
                ax[1].plot(cs, [r["sequential_wall_s"] for r in results], "s--", label="one after another")
                ax[1].set(xlabel="agents on one prompt", ylabel="wall time (s)", xscale="log", title="all answered")
                ax[1].legend()
            else:
                ax[1].plot(cs, [r["latency_mean_s"] for r in results], "o-")
                ax[1].set(xlabel="concurrent clients", ylabel="mean latency (s)", xscale="log", title="latency")
            for x in ax:
                x.grid(alpha=0.3)
                x.set_xticks(cs)
                x.set_xticklabels([str(c) for c in cs])
                x.minorticks_off()
            fig.suptitle(f"lragent serve, {a.preset}, {a.gpu_name or a.device}")
            fig.tight_layout()
            fig.savefig(stem + ".png", dpi=110)
        except ImportError:
            print("matplotlib is not installed: no plot", file=sys.stderr)


if __name__ == "__main__":
    main()
