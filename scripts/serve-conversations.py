#!/usr/bin/env python3
"""Many multi-agent conversations at once through one `lragent serve`, as a production agent
service runs them: what the KV sharing modes give when the conversations compete for one GPU's
KV memory.

Per mode a server is started (`--preset` synthetic weights with a real model's shapes and its
plan/action/reflect adapters), then --conversations clients each drive one ReAct-shaped
conversation at the same moment (serve-bench.py's run_trace: plan / action / tool observation
rounds to --length tokens, then reflect; every call's prompt is that conversation's whole
trajectory as token ids, its tokens decoded greedily with ignore_eos). Under `none` each agent
keeps its own cache of the trajectory, under `base-lr` the agents share its base cache and its
low-rank one, so the same KV memory holds about three times as many conversations before
requests are preempted (docs/server.md, "Memory"). --kv-cache-memory GB (passed to the server)
sets that memory; without it the server's default applies (0.9 of the GPU).

Per mode: the wall time until the last conversation ends, the throughput (the conversations'
final tokens / wall, as bench trace defines it), the tokens the agents computed to catch up
(prefilled; more than the conversations' own tokens means recompute after preemption or
eviction), the preemptions and the engine's mean batch (from /metrics), the highest KV memory
use seen (`lragent:kv_cache_usage_perc`, sampled every 50 ms) and the calls' latencies.

Writes bench/results/serve-conversations-<gpu>-<preset>-<date>.json, .md and .png (with
--out-dir; the plot when matplotlib is there), with GPU name, date and commit; prints the markdown.

  scripts/serve-conversations.py --bin build-cuda/lragent --device cuda --preset llama3.1-8b \\
      --conversations 32 --length 8192 --kv-cache-memory 40 [--out-dir bench/results]
"""
import argparse
import datetime
import os
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
serve_bench = __import__("serve-bench")  # start_server, run_trace, PRESETS, write_results


def metrics(base):
    """The unlabelled series of /metrics as floats."""
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def run_mode(a, mode, budgets):
    args = ["--preset", a.preset, "--device", a.device, "--kv-share", mode]
    if a.kv_cache_memory > 0:
        args += ["--kv-cache-memory", str(a.kv_cache_memory)]
    args += a.server_args.split()
    proc, base = serve_bench.start_server(a.bin, args)
    try:
        serve_bench.run_trace(base, 1200, 99, budgets, 2, a.preset)  # warm-up: kernels, allocator, graphs
        before = metrics(base)
        peak = [0.0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                try:
                    peak[0] = max(peak[0], metrics(base).get("lragent:kv_cache_usage_perc", 0.0))
                except OSError:
                    pass
                done.wait(0.05)

        out = [None] * a.conversations
        errors = []

        def conversation(i):
            try:
                out[i] = serve_bench.run_trace(base, a.length, 1000 + i, budgets, a.rounds, a.preset)
            except Exception as e:  # an HTTP error: reported, the others go on
                errors.append(f"conversation {i}: {e}")

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=conversation, args=(i,)) for i in range(a.conversations)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        after = metrics(base)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    calls = [c for o in out if o for c in o[0]]
    final = sum(o[1] for o in out if o)
    delta = lambda k: after.get(k, 0.0) - before.get(k, 0.0)
    passes = delta("lragent:engine_passes_total")
    lat = sorted(c["wall_s"] for c in calls)
    row = {"mode": mode, "conversations": a.conversations, "finished": sum(1 for o in out if o),
           "errors": errors, "final_tokens": final, "calls": len(calls), "wall_s": wall,
           "throughput_tok_s": final / wall if wall > 0 else 0.0,
           "prefilled_tokens": sum(c["prefilled_tokens"] for c in calls),
           "reused_tokens": sum(c["reused_tokens"] for c in calls),
           "decoded_tokens": sum(c["decoded"] for c in calls),
           "preemptions": delta("lragent:num_preemptions_total"),
           "evicted_trajectories": delta("lragent:trajectories_evicted_total"),
           "mean_batch": delta("lragent:engine_pass_sequences_total") / passes if passes else 0.0,
           "peak_kv_usage": peak[0],
           "kv_memory_bytes": after.get("lragent:kv_memory_bytes", -1),
           "call_p50_s": statistics.median(lat) if lat else 0.0,
           "call_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else 0.0}
    print(f"{mode:8s} {row['finished']}/{a.conversations} conversations, {final} tokens in {wall:.2f} s, "
          f"prefilled {row['prefilled_tokens']}, preempted {row['preemptions']:.0f}, peak KV {peak[0]:.2f}",
          file=sys.stderr)
    for e in errors:
        print("  " + e, file=sys.stderr)
    return row


def plot(rows, stem, title):
    """<stem>.png: throughput and the tokens computed per mode, when matplotlib is there."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    modes = [r["mode"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(11, 3.5))
    ax[0].bar(modes, [r["throughput_tok_s"] for r in rows], color="tab:blue")
    ax[0].set_title("throughput (tokens/s)")
    ax[1].bar(modes, [r["prefilled_tokens"] / 1e3 for r in rows], color="tab:orange")
    ax[1].set_title("tokens computed to catch up (k)")
    ax[2].bar(modes, [100 * r["peak_kv_usage"] for r in rows], color="tab:green")
    ax[2].set_title("peak KV memory use (%)")
    ax[2].set_ylim(0, 100)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/lragent")
    ap.add_argument("--preset", default="tiny", choices=sorted(serve_bench.PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default="none,base-lr")
    ap.add_argument("--conversations", type=int, default=8, help="conversations driven at once")
    ap.add_argument("--length", type=int, default=2048, help="tokens each conversation ends at")
    ap.add_argument("--rounds", type=int, default=6, help="plan/action/observation rounds per conversation")
    ap.add_argument("--kv-cache-memory", type=float, default=0, help="the server's --kv-cache-memory in GB (0: its default)")
    ap.add_argument("--server-args", default="", help="more `lragent serve` flags, e.g. \"--max-context 16384\"")
    ap.add_argument("--name", default="serve-conversations", help="results' file name stem")
    ap.add_argument("--out-dir", default="")
    ap.add_argument("--gpu-name", default="")
    ap.add_argument("--commit", default=os.environ.get("LRAGENT_COMMIT", ""))
    a = ap.parse_args()
    budgets = {"plan": 48, "action": 24, "reflect": 24}
    rows = [run_mode(a, mode, budgets) for mode in a.modes.split(",")]
    by = {r["mode"]: r for r in rows}
    memory = f"--kv-cache-memory {a.kv_cache_memory:g} GB" if a.kv_cache_memory > 0 else "the server's default KV memory"
    lines = [f"# lragent serve: {a.conversations} multi-agent conversations at once ({a.preset}, {a.device})", "",
             f"GPU: {a.gpu_name or 'n/a'} · date: {datetime.date.today()} · commit: {a.commit or 'n/a'}", "",
             f"Each conversation: {a.rounds} plan / action / observation rounds and a reflect call to {a.length} tokens, "
             "every call's prompt its whole trajectory (token ids); plan 48 / action 24 / reflect 24 tokens decoded per "
             f"call (greedy, ignore_eos). All {a.conversations} start at once; {memory}"
             + (f", server flags `{a.server_args}`" if a.server_args else "") + ". Throughput: the conversations' "
             "final tokens / the wall time to the last one's end; prefilled: tokens the agents computed to catch up "
             "(recompute after preemption or eviction included); evicted: kept trajectories dropped for room (a "
             "conversation's, between its calls); peak KV: the highest `kv_cache_usage_perc` seen, of the KV memory.", "",
             "| mode | done | wall (s) | tokens/s | vs none | prefilled | preempted | evicted | mean batch | peak KV of (GB) | call p50 / p95 (s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        ref = by.get("none")
        ratio = f"{r['throughput_tok_s'] / ref['throughput_tok_s']:.2f}x" if ref and ref["throughput_tok_s"] > 0 else "n/a"
        lines.append(f"| {r['mode']} | {r['finished']}/{r['conversations']} | {r['wall_s']:.2f} | "
                     f"{r['throughput_tok_s']:.0f} | {ratio} | {r['prefilled_tokens']} | {r['preemptions']:.0f} | "
                     f"{r['evicted_trajectories']:.0f} | {r['mean_batch']:.1f} | "
                     f"{100 * r['peak_kv_usage']:.0f}% of {r['kv_memory_bytes'] / 1e9:.3g} | "
                     f"{r['call_p50_s']:.2f} / {r['call_p95_s']:.2f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out_dir:
        stem = serve_bench.write_results(a, a.name, "scripts/serve-conversations.py", md,
                                         {"budgets": budgets, "rounds": a.rounds, "length": a.length,
                                          "kv_cache_memory_gb": a.kv_cache_memory, "server_args": a.server_args,
                                          "results": rows})
        plot(rows, stem, f"{a.conversations} conversations of {a.length} tokens, {memory} ({a.preset}, "
                         f"{a.gpu_name or a.device})")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
