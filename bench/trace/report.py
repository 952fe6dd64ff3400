#!/usr/bin/env python3
"""Merges `lragent bench trace --json` results with bench/trace/hf_peer.py's into the LRAgent
poster's table (markdown) and plots (PNG, with matplotlib).

  python3 bench/trace/report.py --ours ours.json [--ours-budget budget.json] [--peer peer.json] \
      --out bench/results/trace-<gpu>-<date> [--commit ID]

Writes OUT.md, OUT-ttft.png, OUT-throughput.png, OUT-memory-agents.png (the PNGs only when
matplotlib imports). Table layout: one row per trace length; per system (each lragent sharing
mode, then HF transformers + PEFT eager / sdpa) a column group TTFT s | throughput tok/s | KV GB.
KV GB = cache bytes / 1e9 (lragent: the peak over the trace, every agent's cache; HF: the largest
cache one call holds). Ratios: BaseLRShared over Non-Shared (lragent base-lr vs none) and lragent
Non-Shared over HF.
"""
import argparse
import json
import os
import sys

MODE_LABEL = {"none": "Non-Shared", "full": "FullShared", "droidspeak": "DroidSpeak", "base": "BaseShared",
              "base-lr": "BaseLRShared", "hf-eager": "HF eager", "hf-sdpa": "HF sdpa",
              "hf-sdpa-cached": "HF sdpa, cache per agent"}


def load(path):
    with open(path) as f:
        return json.load(f)


def cells_of(ours, peer):
    """{(system, length): cell}; lragent systems are its modes, HF's are hf-eager / hf-sdpa."""
    out = {}
    for c in ours["cells"]:
        out[(c["mode"], c["length"])] = c
    for c in (peer or {}).get("cells", []):
        out[(c["system"], c["length"])] = c
    return out


def fmt_cell(c):
    if c is None:
        return ["", "", ""]
    if c["status"] != "ok":
        s = {"oom": "OOM", "n/a": "n/a", "context": "> ctx"}.get(c["status"], c["status"])
        return [s, s, ""]
    return ["%.3f" % c["ttft_s"], "%.1f" % c["throughput_tok_s"], "%.3g" % (c["kv_bytes"] / 1e9)]


def ratio(a, b, key, invert=False):
    if not a or not b or a.get("status") != "ok" or b.get("status") != "ok" or not a[key] or not b[key]:
        return ""
    r = b[key] / a[key] if invert else a[key] / b[key]
    return "%.2fx" % r


def mode_table(systems, lengths, cells, columns, values):
    """One row per length; per system the `columns` (header suffixes) filled by values(cell or None)."""
    head = "| tokens |" + "".join(" %s %s |" % (MODE_LABEL.get(s, s), col) for s in systems for col in columns)
    rule = "| ---: |" + " ---: |" * (len(columns) * len(systems))
    rows = [head, rule]
    for n in lengths:
        rows.append("| %d |" % n + "".join(" %s |" % v for s in systems for v in values(cells.get((s, n)))))
    return "\n".join(rows) + "\n"


def table(systems, lengths, cells):
    return mode_table(systems, lengths, cells, ("TTFT s", "tok/s", "KV GB"), fmt_cell)


def ratio_table(lengths, cells, peers):
    head = "| tokens | TTFT none / base-lr | throughput base-lr / none | KV base-lr / none |"
    rule = "| ---: | ---: | ---: | ---: |"
    for p in peers:
        head += " throughput none / %s | TTFT %s / none |" % (p, p)
        rule += " ---: | ---: |"
    rows = [head, rule]
    for n in lengths:
        none, blr = cells.get(("none", n)), cells.get(("base-lr", n))
        row = "| %d | %s | %s | %s |" % (n, ratio(none, blr, "ttft_s"), ratio(blr, none, "throughput_tok_s"),
                                         ratio(blr, none, "kv_bytes"))
        for p in peers:
            hf = cells.get((p, n))
            row += " %s | %s |" % (ratio(none, hf, "throughput_tok_s"), ratio(hf, none, "ttft_s"))
        rows.append(row)
    return "\n".join(rows) + "\n"


def detail_table(systems, lengths, cells):
    def values(c):
        if c is None or c["status"] != "ok":
            return ("", "") if c is None else (c["status"], c["status"])
        peak = c.get("device_peak_bytes")
        return ("%.1f" % c["decode_tok_s"], "%.2f" % (peak / 1e9) if peak else "")
    return mode_table(systems, lengths, cells, ("decode tok/s", "peak GB"), values)


def curve_table(curve, order):
    modes = [m for m in order if m in curve["modes"]]
    agents = curve["agents"]
    pick = [n for n in agents if n in (1, 2, 3, 4, 8, 16)] or agents
    head = "| agents |" + "".join(" %s GB |" % MODE_LABEL.get(m, m) for m in modes)
    rule = "| ---: |" + " ---: |" * len(modes)
    rows = [head, rule]
    for n in pick:
        i = agents.index(n)
        rows.append("| %d |" % n + "".join(
            " %s |" % ("%.3g" % (curve["modes"][m][i]["total"] / 1e9) if curve["modes"][m] else "n/a") for m in modes))
    return "\n".join(rows) + "\n"


def eviction_table(systems, lengths, cells):
    """Per mode under the budget: private caches dropped, the tokens they held, and the forward-pass
    tokens of all agents (prefill + decode, recomputation included)."""
    systems = [s for s in systems if any(cells.get((s, n), {}).get("evictions") for n in lengths)]
    if not systems:
        return ""

    def values(c):
        if c is None or c["status"] != "ok":
            return ("", "", "")
        return ("%d" % c.get("evictions", 0), "%d" % c.get("evicted_tokens", 0), "%d" % c["computed_tokens"])
    return mode_table(systems, lengths, cells, ("evictions", "evicted tokens", "computed tokens"), values)


def notes(cells):
    out = []
    for (s, n), c in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if c["status"] != "ok" and c.get("message"):
            out.append("- %d tokens, %s: %s %s" % (n, MODE_LABEL.get(s, s), c["status"], c["message"]))
    return "\n".join(out) + ("\n" if out else "")


def plots(prefix, systems, lengths, cells, curve):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib is not installed; no PNGs", file=sys.stderr)
        return []
    written = []
    for key, ylabel, name in (("ttft_s", "summed TTFT (s)", "ttft"), ("throughput_tok_s", "throughput (tokens/s)", "throughput")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in systems:
            pts = [(n, cells[(s, n)][key]) for n in lengths if (s, n) in cells and cells[(s, n)]["status"] == "ok"]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=MODE_LABEL.get(s, s),
                        linestyle="--" if s.startswith("hf-") else "-")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("final trajectory length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = "%s-%s.png" % (prefix, name)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    if curve:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in [m for m in systems if m in curve["modes"]]:
            vals = curve["modes"][m]
            if vals:
                ax.plot(curve["agents"], [v["total"] / 1e9 for v in vals], marker=".", label=MODE_LABEL.get(m, m))
        ax.set_xlabel("agents sharing the trajectory")
        ax.set_ylabel("KV cache (GB) at %d tokens" % curve["length"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = "%s-memory-agents.png" % prefix
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--ours-budget", help="a second lragent run with --kv-budget (evictions / OOM table)")
    ap.add_argument("--peer", help="hf_peer.py output")
    ap.add_argument("--out", required=True, help="output prefix (OUT.md, OUT-*.png)")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    ours = load(args.ours)
    peer = load(args.peer) if args.peer and os.path.exists(args.peer) else None
    cells = cells_of(ours, peer)
    lengths = list(ours["lengths"])
    peers = [s for s in ("hf-eager", "hf-sdpa", "hf-sdpa-cached") if any(k[0] == s for k in cells)]
    systems = list(ours["modes"]) + peers
    p = ours["preset"]
    md = ["# Multi-agent trace benchmark: %s on %s\n" % (p["name"], ours["device"]),
          "Date %s%s. %s; weights %s, KV cache %s; adapters %s r=%d on %s; trace %s (%d agent calls), "
          "page size %d, droidspeak recompute layers %s. Made by `lragent bench trace` and "
          "`bench/trace/report.py` (docs/bench.md defines the traces and metrics).\n" % (
              ours["date_utc"], (", commit " + args.commit) if args.commit else "", p["description"],
              ours["weight_dtype"], ours["cache_dtype"], ours["adapters"]["kind"], ours["adapters"]["rank"],
              ", ".join(ours["adapters"]["targets"]), ours["trace"]["trajectory_id"], ours["trace"]["agent_calls"],
              ours["page_size"], ours["droidspeak_layers"])]
    if peer:
        md.append("Peer: HF transformers %s + PEFT %s, torch %s, %s, %s; Non-Shared. hf-eager / hf-sdpa: every "
                  "agent call re-runs generate() over the whole trajectory (no cache kept between calls); "
                  "hf-sdpa-cached: each agent keeps its own DynamicCache between its calls, as lragent's none mode "
                  "keeps one private cache per agent. Every cell, ours and the peer's, is run untimed first "
                  "(warm-up runs per cell: ours %s, peer %s) so that a new length's one-off costs are not timed.\n"
                  % (peer["transformers"], peer["peft"], peer["torch"], peer["dtype"], peer["device"],
                     ours.get("warmup_runs_per_cell", "none recorded"),
                     peer.get("warmup_runs_per_cell", "none recorded")))
    md += ["## TTFT (summed over agent calls), throughput (final tokens / wall), KV memory\n",
           table(systems, lengths, cells), "\n## Ratios\n", ratio_table(lengths, cells, peers),
           "\n## Decode throughput and peak device memory\n", detail_table(systems, lengths, cells)]
    if args.ours_budget:
        b = load(args.ours_budget)
        bc = cells_of(b, None)
        evict = b.get("kv_evict", False)
        md += ["\n## Under a KV budget of %s GB\n" % b["kv_budget_gb"],
               ("One KV arena of this size for all caches of the trace. When it is full, the least recently run "
                "other agent's private caches are dropped and recomputed at its next call (vLLM's preemption by "
                "recompute); shared caches are never dropped. OOM: one agent's caches alone do not fit. KV GB is "
                "the peak.\n" if evict else
                "One KV arena of this size for all caches of the trace, without eviction (`--no-kv-evict`): OOM "
                "where the caches outgrow it.\n"),
               table(list(b["modes"]), list(b["lengths"]), bc),
               "\n", ratio_table(list(b["lengths"]), bc, [])]
        et = eviction_table(list(b["modes"]), list(b["lengths"]), bc)
        if et:
            md += ["\nEvictions (private caches dropped, the tokens they held, forward-pass tokens of all agents "
                   "including recomputation):\n", et]
        n = notes(bc)
        if n:
            md += [n]
    if ours.get("agents_curve"):
        md += ["\n## KV memory vs number of agents (%d tokens, exact cache accounting)\n" % ours["agents_curve"]["length"],
               curve_table(ours["agents_curve"], ours["modes"])]
    n = notes(cells)
    if n:
        md += ["\n## Cells that did not run\n", n]
    pngs = plots(args.out, systems, lengths, cells, ours.get("agents_curve"))
    if pngs:
        md += ["\n## Plots\n"] + ["![](%s)\n" % os.path.basename(x) for x in pngs]
    with open(args.out + ".md", "w") as f:
        # Blocks separated by blank lines (a table must not touch the paragraph above it).
        f.write("\n".join(x.strip("\n") + "\n" for x in md if x.strip()))
    print("wrote %s.md%s" % (args.out, "".join(", " + x for x in pngs)), file=sys.stderr)


if __name__ == "__main__":
    main()
