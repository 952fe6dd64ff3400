#!/usr/bin/env python3
"""Merges attention_bench.json, sdpa_peer.json and the test summary into one report
(kernels-<gpu>-<date>.json and .md) with the headline ratios, and prints a short table.

Usage: make_report.py --ours A.json --sdpa S.json --tests "summary" --meta k=v ... --out-prefix P
       make_report.py --plot-only kernels-<gpu>-<date>.json   (redraws the PNG of a written report)

With matplotlib, P.png plots the headline figures: prefill TFLOP/s per kernel version and SDPA
against the GEMM ceiling, and decode bandwidth per shape against the copy ceiling.
"""
import argparse
import json
import os


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "results": []}


def find(results, group, name, ctx=None):
    for r in results:
        if r.get("group") == group and r.get("name", "").startswith(name) and (ctx is None or r.get("ctx") == ctx):
            return r
    return None


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt(x, spec=".2f"):
    return "n/a" if x is None else format(x, spec)


def plot(report, path):
    """Two panels from a report dict: prefill (1024 queries at 8k / 32k / 64k) and decode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("make_report.py: matplotlib is not installed; no PNG")
        return None
    R = report.get("ours", {}).get("results", [])
    S = report.get("sdpa", {}).get("results", [])
    ceil = report.get("ratios", {}).get("ceilings", {})
    meta = report.get("meta", {})
    ctxs = (8192, 32768, 65536)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    series = [("v6 plain (default)", "plain"), ("v6 Flash-LoRA V r16", "flash_lora_v_r16"), ("v5 plain", "v5_plain"),
              ("v3 plain", "v3_plain"), ("Flash-LoRA K+V r16", "flash_lora_kv_r16")]
    for label, name in series:
        pts = [(c, r["tflops"]) for c in ctxs for r in R
               if r.get("group") == "prefill" and r.get("name") == name and r.get("ctx") == c and r.get("tflops")]
        if pts:
            a1.plot([p[0] // 1024 for p in pts], [p[1] for p in pts], marker="o", label=label)
    for prefix, label in (("sdpa_flash", "torch SDPA (flash)"), ("sdpa_cudnn", "torch SDPA (cuDNN, fastest variant)")):
        best = {}
        for r in S:
            if r.get("name", "").startswith(prefix) and r.get("tflops"):
                best[r["ctx"]] = max(best.get(r["ctx"], 0), r["tflops"])
        sd = sorted(best.items())
        if sd:
            a1.plot([p[0] // 1024 for p in sd], [p[1] for p in sd], marker="s", linestyle="--", label=label)
    if ceil.get("gemm_tflops"):
        a1.axhline(ceil["gemm_tflops"], color="gray", linestyle=":", label="bf16 GEMM ceiling")
    a1.set_xscale("log", base=2)
    a1.set_xticks([8, 32, 64])
    a1.set_xticklabels(["8k", "32k", "64k"])
    a1.set_xlabel("context (1024-query prefill chunk at its end)")
    a1.set_ylabel("TFLOP/s")
    a1.set_title("Prefill attention, Llama-3.1-8B shapes")
    a1.grid(True, alpha=0.3)
    a1.legend(fontsize=7)
    bars = [("8 x 32k\nprivate", "decode", "private_plain", "v1_private_plain"),
            ("1 x 4k\n(8B step, 1 layer)", "decode1", "plain", "v1_plain"),
            ("1 x 32k\n(8B step, 1 layer)", "decode1_long", "plain", "v1_plain"),
            ("3 agents,\n1 x 32k shared", "agents3", "shared_plain", "v1_shared_plain"),
            ("8 agents,\n1 x 32k shared", "agents", "shared_plain", "v1_shared_plain")]
    labels, ours_bw, v1_bw = [], [], []
    for label, group, name, v1 in bars:
        r = next((x for x in R if x.get("group") == group and x.get("name") == name), None)
        r1 = next((x for x in R if x.get("group") == group and x.get("name") == v1), None)
        if r is None:
            continue
        labels.append(label)
        ours_bw.append(r.get("gbps", 0))
        v1_bw.append(r1.get("gbps", 0) if r1 else 0)
    xs = range(len(labels))
    a2.bar([x - 0.2 for x in xs], ours_bw, width=0.4, label="default (v4 where it applies)")
    a2.bar([x + 0.2 for x in xs], v1_bw, width=0.4, label="v1")
    if ceil.get("copy_gbps"):
        a2.axhline(ceil["copy_gbps"], color="gray", linestyle=":", label="device copy ceiling")
    a2.set_xticks(list(xs))
    a2.set_xticklabels(labels, fontsize=8)
    a2.set_ylabel("GB/s of K/V read")
    a2.set_title("Decode attention (plain)")
    a2.grid(True, axis="y", alpha=0.3)
    a2.legend(fontsize=7)
    fig.suptitle(f"lragent attention kernels on {meta.get('gpu', '?')} ({meta.get('date', '?')}, commit {meta.get('commit', '?')})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path



def step_bound_ms(dec, copy_gbps):
    """A decode step's bandwidth bound: its weight and KV bytes at the measured copy bandwidth."""
    return (dec["weight_bytes"] + dec["cache_bytes"]) / (copy_gbps * 1e9) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot-only", help="a report JSON this script wrote: redraw its PNG beside it and exit")
    ap.add_argument("--ours")
    ap.add_argument("--sdpa")
    ap.add_argument("--tests", default="")
    ap.add_argument("--model", default="", help="lragent_model_bench JSON (whole model through the engine)")
    ap.add_argument("--replay", default="", help="replay.log of gpu-check (GPU vs CPU greedy tokens)")
    ap.add_argument("--model-eager", default="", help="lragent_model_bench --eager JSON (decode without CUDA graphs)")
    ap.add_argument("--model-extra", nargs="*", default=[],
                    help="more lragent_model_bench JSONs of the same call (their decode steps, listed beside the first)")
    ap.add_argument("--model-long", nargs="*", default=[],
                    help="lragent_model_bench JSONs of decode-only runs (--prefill 0): the step at a long context "
                         "(--ctx 32768), and other presets' shapes (Ministral-8B's, so that a shape only it has is "
                         "launched on the GPU in every check); one headline row each, the first also as ratios.model_long")
    ap.add_argument("--gemv", default="", help="lragent_gemv_bench JSON (decode GEMV versions vs copy BW)")
    ap.add_argument("--meta", nargs="*", default=[])
    ap.add_argument("--out-prefix")
    args = ap.parse_args()
    if args.plot_only:
        out = plot(load(args.plot_only), os.path.splitext(args.plot_only)[0] + ".png")
        print("wrote", out)
        return 0 if out else 1
    if not args.ours or not args.sdpa or not args.out_prefix:
        ap.error("--ours, --sdpa and --out-prefix are required (or --plot-only REPORT.json)")
    ours, sdpa = load(args.ours), load(args.sdpa)
    meta = dict(kv.split("=", 1) for kv in args.meta if "=" in kv)
    R, S = ours.get("results", []), sdpa.get("results", [])

    def ms(r):
        return None if r is None else r.get("median_ms")

    ratios = {}
    rows = []
    for ctx in (8192, 32768, 65536):
        plain = find(R, "prefill", "plain", ctx)
        if plain is None:
            continue
        fla = find(R, "prefill", "flash_lora_v_r16", ctx)
        flakv = find(R, "prefill", "flash_lora_kv_r16", ctx)
        mat = find(R, "prefill", "materialise_then_attend", ctx)
        matk = find(R, "prefill", "materialise_k_flash_lora_kv", ctx)
        peer = find(S, "prefill", "sdpa_flash", ctx)
        # SDPA's cuDNN backend, when it ran: its fastest validated variant at this context.
        cudnn = min((r for r in S if r.get("group") == "prefill" and r.get("name", "").startswith("sdpa_cudnn")
                     and r.get("ctx") == ctx and r.get("median_ms")), key=lambda r: r["median_ms"], default=None)
        v2 = {n: find(R, "prefill", "v2_" + n, ctx) for n in ("plain", "flash_lora_v_r16", "flash_lora_kv_r16")}
        v3 = {n: find(R, "prefill", "v3_" + n, ctx) for n in ("plain", "flash_lora_v_r16")}
        v5 = {n: find(R, "prefill", "v5_" + n, ctx) for n in ("plain", "flash_lora_v_r16", "flash_lora_kv_r16")}
        k = f"prefill_{ctx // 1024}k"
        ratios[k] = {
            "ours_tflops": plain.get("tflops"),
            "sdpa_tflops": None if peer is None else peer.get("tflops"),
            "ours_over_sdpa_speed": ratio(ms(peer), ms(plain)),
            "ours_over_sdpa_time": ratio(ms(plain), ms(peer)),
            "sdpa_cudnn_tflops": None if cudnn is None else cudnn.get("tflops"),
            "ours_over_sdpa_cudnn_time": ratio(ms(plain), ms(cudnn)),
            "fla_over_plain_time": ratio(ms(fla), ms(plain)),
            "fla_kv_over_plain_time": ratio(ms(flakv), ms(plain)),
            "materialise_k_fla_kv_over_plain_time": ratio(ms(matk), ms(plain)),
            "materialise_over_fla_time": ratio(ms(mat), ms(fla)),
            "v3_tflops": None if v3["plain"] is None else v3["plain"].get("tflops"),
            "v3_fla_over_plain_time": ratio(ms(v3["flash_lora_v_r16"]), ms(v3["plain"])),
            "default_over_v3_speed": ratio(ms(v3["plain"]), ms(plain)),
            "default_over_v3_speed_fla": ratio(ms(v3["flash_lora_v_r16"]), ms(fla)),
            "v5_tflops": None if v5["plain"] is None else v5["plain"].get("tflops"),
            "v5_fla_tflops": None if v5["flash_lora_v_r16"] is None else v5["flash_lora_v_r16"].get("tflops"),
            "default_over_v5_speed": ratio(ms(v5["plain"]), ms(plain)),
            "default_over_v5_speed_fla": ratio(ms(v5["flash_lora_v_r16"]), ms(fla)),
            "v5_fla_over_plain_time": ratio(ms(v5["flash_lora_v_r16"]), ms(v5["plain"])),
            "v5_over_sdpa_time": ratio(ms(v5["plain"]), ms(peer)),
            "v2_tflops": None if v2["plain"] is None else v2["plain"].get("tflops"),
            "default_over_v2_speed": ratio(ms(v2["plain"]), ms(plain)),
            "default_over_v2_speed_fla_kv": ratio(ms(v2["flash_lora_kv_r16"]), ms(flakv)),
            "default_over_v5_speed_fla_kv": ratio(ms(v5["flash_lora_kv_r16"]), ms(flakv)),
            "v5_fla_kv_over_plain_time": ratio(ms(v5["flash_lora_kv_r16"]), ms(v5["plain"])),
        }
        rows.append((f"prefill {ctx // 1024}k: ours {fmt(plain.get('tflops'), '.0f')} TFLOP/s, "
                     f"SDPA {fmt(None if peer is None else peer.get('tflops'), '.0f')}",
                     f"ours/SDPA time {fmt(ratios[k]['ours_over_sdpa_time'])} "
                     f"(SDPA cuDNN backend {fmt(ratios[k]['sdpa_cudnn_tflops'], '.0f')} TFLOP/s, ours/cuDNN time "
                     f"{fmt(ratios[k]['ours_over_sdpa_cudnn_time'])}), "
                     f"FLA/plain {fmt(ratios[k]['fla_over_plain_time'])}, "
                     f"FLA+K/plain {fmt(ratios[k]['fla_kv_over_plain_time'])} "
                     f"(K materialised, the engine's prefill: {fmt(ratios[k]['materialise_k_fla_kv_over_plain_time'])}), "
                     f"materialise/FLA {fmt(ratios[k]['materialise_over_fla_time'])}; "
                     f"default (v6) / v5 speed plain {fmt(ratios[k]['default_over_v5_speed'])}x, "
                     f"FLA {fmt(ratios[k]['default_over_v5_speed_fla'])}x (v5 {fmt(ratios[k]['v5_tflops'], '.0f')} TFLOP/s, "
                     f"v5/SDPA time {fmt(ratios[k]['v5_over_sdpa_time'])}, v5 FLA/plain {fmt(ratios[k]['v5_fla_over_plain_time'])}); "
                     f"default / v3 speed plain {fmt(ratios[k]['default_over_v3_speed'])}x, "
                     f"FLA {fmt(ratios[k]['default_over_v3_speed_fla'])}x "
                     f"(v3 FLA/plain {fmt(ratios[k]['v3_fla_over_plain_time'])}); "
                     f"FLA+K default / v5 speed {fmt(ratios[k]['default_over_v5_speed_fla_kv'])}x "
                     f"(v5 FLA+K/plain {fmt(ratios[k]['v5_fla_kv_over_plain_time'])})"))
    sq = {n: find(R, "prefill_square", n) for n in ("plain", "v5_plain", "flash_lora_v_r16", "v5_flash_lora_v_r16")}
    if sq["plain"] is not None:
        ratios["prefill_square"] = {
            "ctx": sq["plain"].get("ctx"),
            "tflops": sq["plain"].get("tflops"),
            "v5_tflops": None if sq["v5_plain"] is None else sq["v5_plain"].get("tflops"),
            "fla_tflops": None if sq["flash_lora_v_r16"] is None else sq["flash_lora_v_r16"].get("tflops"),
            "v5_fla_tflops": None if sq["v5_flash_lora_v_r16"] is None else sq["v5_flash_lora_v_r16"].get("tflops"),
        }
        q = ratios["prefill_square"]
        rows.append((f"prefill from position 0, causal {q['ctx']} x {q['ctx']}",
                     f"plain {fmt(q['tflops'], '.0f')} TFLOP/s (v5 {fmt(q['v5_tflops'], '.0f')}), "
                     f"Flash-LoRA V r16 {fmt(q['fla_tflops'], '.0f')} (v5 {fmt(q['v5_fla_tflops'], '.0f')})"))
    copy = find(R, "ceiling", "d2d_copy")
    tcopy = find(S, "ceiling", "torch_copy")
    gemm = find(S, "ceiling", "torch_gemm")
    copy_gbps = copy.get("gbps") if copy else (tcopy.get("gbps") if tcopy else None)
    dec = find(R, "decode", "private_plain")
    dec_fla = find(R, "decode", "private_flash_lora_v_r16")
    dec_mat = find(R, "decode", "private_materialise_then_attend")
    ratios["decode"] = {
        "materialise_over_fla_time": ratio(ms(dec_mat), ms(dec_fla)),
        "gbps": None if dec is None else dec.get("gbps"),
        "copy_gbps": copy_gbps,
        "fraction_of_copy": ratio(None if dec is None else dec.get("gbps"), copy_gbps),
        "fla_fraction_of_copy": ratio(None if dec_fla is None else dec_fla.get("gbps"), copy_gbps),
    }
    rows.append((f"decode 8x{(dec or {}).get('ctx', 0) // 1024}k private: {fmt(ratios['decode']['gbps'], '.0f')} GB/s",
                 f"{fmt(ratios['decode']['fraction_of_copy'])} of copy ceiling "
                 f"({fmt(copy_gbps, '.0f')} GB/s); FLA {fmt(ratios['decode']['fla_fraction_of_copy'])}; "
                 f"materialise/FLA {fmt(ratios['decode']['materialise_over_fla_time'])}"))
    # One sequence (an 8B batch-1 step's attention, one layer) at 4k and, since 17ff45b's bench, 32k.
    for group in ("decode1", "decode1_long"):
        d1 = {n: find(R, group, n) for n in ("plain", "v1_plain", "flash_lora_v_r16", "v1_flash_lora_v_r16")}
        if not d1["plain"]:
            continue
        ratios[group] = {n: ms(r) for n, r in d1.items()}
        ratios[group]["fraction_of_copy"] = ratio(d1["plain"].get("gbps"), copy_gbps)
        rows.append((f"decode 1x{d1['plain'].get('ctx', 0) // 1024}k (a batch-1 step's attention, one layer)",
                     f"v4 {fmt(1e3 * (ms(d1['plain']) or 0), '.1f')} us vs v1 {fmt(1e3 * (ms(d1['v1_plain']) or 0), '.1f')} us "
                     f"({fmt(ratios[group]['fraction_of_copy'])} of copy); FLA v4 "
                     f"{fmt(1e3 * (ms(d1['flash_lora_v_r16']) or 0), '.1f')} us vs v1 "
                     f"{fmt(1e3 * (ms(d1['v1_flash_lora_v_r16']) or 0), '.1f')} us"))
    sh = {n: find(R, "agents", n) for n in ("shared_plain", "shared_flash_lora_v_r16", "shared_flash_lora_kv_r16")}
    # Like for like: shared variant X vs the private decodes of the same variant X (the first
    # report, fc7ae7f, divided every shared variant by private *plain*; kept as *_vs_private_plain).
    priv = {n: find(R, "decode", n.replace("shared_", "private_")) for n in sh}
    ratios["shared_vs_private"] = {n + "_speedup": ratio(ms(priv[n]), ms(r)) for n, r in sh.items()}
    ratios["shared_vs_private"].update({n + "_speedup_vs_private_plain": ratio(ms(dec), ms(r)) for n, r in sh.items()})
    rows.append(("8 agents shared base vs 8 private decodes (same variant)",
                 ", ".join(f"{n.replace('shared_', '')} {fmt(ratios['shared_vs_private'][n + '_speedup'])}x "
                           f"(vs private plain {fmt(ratios['shared_vs_private'][n + '_speedup_vs_private_plain'])}x)"
                           for n in sh)))
    sh3 = {n: find(R, "agents3", n) for n in ("shared_plain", "shared_flash_lora_v_r16", "v1_shared_plain",
                                              "v1_shared_flash_lora_v_r16", "private_plain",
                                              "private_flash_lora_v_r16")}
    if sh3["shared_plain"]:
        # The poster's three agents over one shared cache: v4 (one m16 tile of 3 x G rows) against v1.
        ratios["agents3"] = {n + "_ms": ms(r) for n, r in sh3.items()}
        ratios["agents3"]["fraction_of_copy"] = ratio(sh3["shared_plain"].get("gbps"), copy_gbps)
        ratios["agents3"]["plain_speedup_vs_private"] = ratio(ms(sh3["private_plain"]), ms(sh3["shared_plain"]))
        ratios["agents3"]["flash_lora_v_speedup_vs_private"] = ratio(ms(sh3["private_flash_lora_v_r16"]),
                                                                     ms(sh3["shared_flash_lora_v_r16"]))
        rows.append(("3 agents shared base, one 32k decode (v4 vs v1; vs 3 private decodes)",
                     f"plain {fmt(1e3 * (ms(sh3['shared_plain']) or 0), '.1f')} us vs "
                     f"{fmt(1e3 * (ms(sh3['v1_shared_plain']) or 0), '.1f')} us "
                     f"({fmt(ratios['agents3']['fraction_of_copy'])} of copy), "
                     f"{fmt(ratios['agents3']['plain_speedup_vs_private'])}x 3 private; FLA "
                     f"{fmt(1e3 * (ms(sh3['shared_flash_lora_v_r16']) or 0), '.1f')} us vs "
                     f"{fmt(1e3 * (ms(sh3['v1_shared_flash_lora_v_r16']) or 0), '.1f')} us, "
                     f"{fmt(ratios['agents3']['flash_lora_v_speedup_vs_private'])}x 3 private"))
    ratios["ceilings"] = {"copy_gbps": copy_gbps, "torch_copy_gbps": None if tcopy is None else tcopy.get("gbps"),
                          "gemm_tflops": None if gemm is None else gemm.get("tflops")}
    if gemm:
        rows.append(("ceilings", f"bf16 GEMM {fmt(gemm.get('tflops'), '.0f')} TFLOP/s, copy {fmt(copy_gbps, '.0f')} GB/s"))
    model = load(args.model) if args.model and os.path.exists(args.model) else {}
    if model:
        gemm_tf = None if gemm is None else gemm.get("tflops")
        pre, dec = model.get("prefill", {}), model.get("decode", {})
        ideal_ms = None
        if dec and copy_gbps:
            ideal_ms = step_bound_ms(dec, copy_gbps)
        ratios["model"] = {
            "preset": model.get("preset"),
            "prefill_tokens": pre.get("tokens"), "prefill_ms": pre.get("median_ms"), "prefill_tflops": pre.get("tflops"),
            "prefill_fraction_of_gemm_ceiling": ratio(pre.get("tflops"), gemm_tf),
            "decode_ctx": dec.get("ctx"), "decode_ms": dec.get("median_ms"), "decode_ideal_ms": ideal_ms,
            "decode_host_record_ms": dec.get("host_record_ms"),
            "decode_lookahead_ms": model.get("decode_lookahead", {}).get("median_ms"),
            "decode_lookahead_over_ideal": ratio(model.get("decode_lookahead", {}).get("median_ms"), ideal_ms),
            "decode_over_ideal": ratio(dec.get("median_ms"), ideal_ms),
            "decode_lora_base_lr_ms": model.get("decode_lora_base_lr", {}).get("median_ms"),
            "decode_lora_full_ms": model.get("decode_lora_full", {}).get("median_ms"),
            "decode_lora_icarus_ms": model.get("decode_lora_icarus", {}).get("median_ms"),
            "decode_sampled_ms": model.get("decode_sampled", {}).get("median_ms"),
            "decode_verify_drafts": model.get("decode_verify", {}).get("drafts"),
            "decode_verify_ms": model.get("decode_verify", {}).get("median_ms"),
            "decode_verify_over_step": ratio(model.get("decode_verify", {}).get("median_ms"), dec.get("median_ms")),
            "peak_device_bytes": model.get("peak_device_bytes"),
        }
        eager = load(args.model_eager) if args.model_eager and os.path.exists(args.model_eager) else {}
        if eager.get("decode"):
            m_e = eager["decode"].get("median_ms")
            ratios["model"]["decode_eager_ms"] = m_e
            ratios["model"]["decode_eager_lora_base_lr_ms"] = eager.get("decode_lora_base_lr", {}).get("median_ms")
        # The same decode step in the call's other model runs: a process-to-process spread of
        # ~0.1-0.2 ms is normal on these machines, so every run is listed, the first one leads.
        extra = [load(f) for f in args.model_extra if f and os.path.exists(f)]
        ratios["model"]["decode_other_runs_ms"] = [e["decode"]["median_ms"] for e in extra if e.get("decode")]
        m = ratios["model"]
        others = "".join(f"; another run in this call {fmt(x, '.3f')} ms = {fmt(ratio(x, ideal_ms))}x"
                         for x in m["decode_other_runs_ms"])
        rows.append((f"model {m['preset']} prefill {m['prefill_tokens']} tokens",
                     f"{fmt(m['prefill_ms'])} ms, {fmt(m['prefill_tflops'], '.0f')} TFLOP/s = "
                     f"{fmt(m['prefill_fraction_of_gemm_ceiling'])} of the GEMM ceiling"))
        rows.append((f"model {m['preset']} decode batch 1 at {m['decode_ctx']} ctx",
                     f"{fmt(m['decode_ms'], '.3f')} ms/step = {fmt(m['decode_over_ideal'])}x of (weights + KV) / copy BW "
                     f"({fmt(ideal_ms, '.3f')} ms), the host records the step in {fmt(m['decode_host_record_ms'], '.3f')} ms (the GPU runs the first 16 ops meanwhile: split pass); "
                     f"with decode lookahead (the Generator's way) {fmt(m['decode_lookahead_ms'], '.3f')} ms = {fmt(m['decode_lookahead_over_ideal'])}x; sampled on the device (T 0.8, top-p 0.95) "
                     f"{fmt(m['decode_sampled_ms'], '.3f')} ms; with LoRA r16 on q/v: base-lr {fmt(m['decode_lora_base_lr_ms'], '.3f')} ms, "
                     f"private full cache {fmt(m['decode_lora_full_ms'], '.3f')} ms, "
                     f"icarus (a base row and a decoder row) {fmt(m['decode_lora_icarus_ms'], '.3f')} ms; "
                     f"launched op by op (--enforce-eager) {fmt(m.get('decode_eager_ms'), '.3f')} ms{others}"))
        if m.get("decode_verify_ms") is not None:
            rows.append((f"model {m['preset']} speculative pass at {m['decode_ctx']} ctx",
                         f"the last token + {m['decode_verify_drafts']} drafts, a greedy pick a row (--speculative-config): "
                         f"{fmt(m['decode_verify_ms'], '.3f')} ms = {fmt(m['decode_verify_over_step'])}x a decode step, "
                         f"so a pass pays for itself once it keeps {fmt(m['decode_verify_over_step'] - 1 if m['decode_verify_over_step'] else None)} "
                         f"drafts on average"))
    for i, path in enumerate(args.model_long):
        long_run = load(path) if path and os.path.exists(path) else {}
        if not (long_run.get("decode") and copy_gbps):
            # A run that failed (a launch error, a timeout) must show in the headline, not vanish.
            rows.append((f"model decode run {os.path.basename(path)}", "NO RESULT (the run failed: see model.log)"))
            continue
        d = long_run["decode"]
        ideal = step_bound_ms(d, copy_gbps)
        la = long_run.get("decode_lookahead", {}).get("median_ms")
        ml = {
            "preset": long_run.get("preset"),
            "decode_ctx": d.get("ctx"), "decode_ms": d.get("median_ms"), "decode_ideal_ms": ideal,
            "decode_over_ideal": ratio(d.get("median_ms"), ideal),
            "decode_lookahead_ms": la, "decode_lookahead_over_ideal": ratio(la, ideal),
            "decode_lora_base_lr_ms": long_run.get("decode_lora_base_lr", {}).get("median_ms"),
            "decode_lora_full_ms": long_run.get("decode_lora_full", {}).get("median_ms"),
            "decode_lora_icarus_ms": long_run.get("decode_lora_icarus", {}).get("median_ms"),
        }
        ratios.setdefault("model_decode_runs", []).append(ml)
        if i == 0:
            ratios["model_long"] = ml
        rows.append((f"model {ml['preset']} decode batch 1 at {ml['decode_ctx']} ctx",
                     f"{fmt(ml['decode_ms'], '.3f')} ms/step = {fmt(ml['decode_over_ideal'])}x of (weights + KV) / copy BW "
                     f"({fmt(ideal, '.3f')} ms); with decode lookahead {fmt(la, '.3f')} ms = "
                     f"{fmt(ml['decode_lookahead_over_ideal'])}x; with LoRA r16 on q/v: base-lr "
                     f"{fmt(ml['decode_lora_base_lr_ms'], '.3f')} ms, private full cache {fmt(ml['decode_lora_full_ms'], '.3f')} ms, "
                     f"icarus {fmt(ml['decode_lora_icarus_ms'], '.3f')} ms"))
    gemv = load(args.gemv) if args.gemv and os.path.exists(args.gemv) else {}
    if gemv.get("results"):
        ratios["gemv"] = gemv
        one = [g for g in gemv["results"] if g.get("rows") == 1]
        rows.append(("decode GEMV, 1 row, fraction of copy BW",
                     ", ".join(f"{g['shape']} {g['version']} {g['frac_copy']:.2f}" for g in one)))
        # Batched steps (2-16 rows) take version 3 (tensor cores); v2's figures there show why (v2
        # takes at most 8 rows; past 8 version 3 reads x in bf16).
        for r in (2, 8, 16):
            many = [g for g in gemv["results"] if g.get("rows") == r and g.get("version") in ("v2", "v3")]
            if many:
                rows.append((f"decode GEMV, {r} rows, fraction of copy BW",
                             ", ".join(f"{g['shape']} {g['version']} {g['frac_copy']:.2f}" for g in many)))
    replay_lines = []
    if args.replay and os.path.exists(args.replay):
        replay_lines = [ln.strip() for ln in open(args.replay) if ln.startswith("replay ")]
        ratios["replay"] = replay_lines
        for ln in replay_lines:
            rows.append(("GPU replay vs CPU", ln[len("replay "):]))
    checks = [r for r in R if r.get("group") == "check"]

    report = {"meta": meta, "tests": args.tests, "ratios": ratios, "ours": ours, "sdpa": sdpa, "model": model}
    with open(args.out_prefix + ".json", "w") as f:
        json.dump(report, f, indent=2)

    md = [f"# Attention kernels on {meta.get('gpu', '?')} ({meta.get('date', '?')})", "",
          f"commit `{meta.get('commit', '?')}`, torch {sdpa.get('torch', '?')}, SDPA variant "
          f"`{sdpa.get('variant', '?')}`", "", f"Tests: {args.tests}", "", "## Headline", ""]
    md += [f"- **{a}**: {b}" for a, b in rows]
    md += ["", "## All measurements (ours)", "", "| group | name | ctx | n_q | splits | ms | TFLOP/s | GB/s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in R:
        if r.get("group") == "check":
            continue
        md.append(f"| {r['group']} | {r['name']} | {r.get('ctx', '')} | {r.get('n_q', '')} | {r.get('splits', '')} | "
                  f"{r['median_ms']:.3f} | {r.get('tflops', 0):.1f} | {r.get('gbps', 0):.0f} |")
    md += ["", "## SDPA peer", "", "| name | ctx | ms | TFLOP/s / GB/s |", "|---|---|---|---|"]
    for r in S:
        v = r.get("tflops") if "tflops" in r else r.get("gbps")
        md.append(f"| {r['name']} | {r.get('ctx', '')} | {r['median_ms']:.3f} | {fmt(v, '.1f')} |")
    md += ["", "## Full-size consistency checks (rel. L2)", ""]
    md += [f"- {c['name']} ctx={c.get('ctx')}: {c.get('note')}" for c in checks]
    if sdpa.get("log"):
        md += ["", "## SDPA log", ""] + [f"- {x}" for x in sdpa["log"]]
    png = plot(report, args.out_prefix + ".png")
    if png:
        md[md.index("## Headline")] = f"![headline figures]({os.path.basename(png)})\n\n## Headline"
    with open(args.out_prefix + ".md", "w") as f:
        f.write("\n".join(md) + "\n")

    print("")
    print("=" * 100)
    print(f"{meta.get('gpu', '?')}  {meta.get('date', '?')}  commit {meta.get('commit', '?')}")
    print(f"tests: {args.tests}")
    for c in checks:
        print(f"check {c['name']} ctx={c.get('ctx')}: {c.get('note')}")
    for a, b in rows:
        print(f"{a:<48} {b}")
    print("report:", os.path.abspath(args.out_prefix + ".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
