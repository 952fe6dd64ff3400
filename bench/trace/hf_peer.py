#!/usr/bin/env python3
"""HF transformers + PEFT peer of `lragent bench trace`, on the very same traces.

  lragent bench trace --preset llama3.1-8b --dump-traces traces.json --dump-only
  python3 bench/trace/hf_peer.py --traces traces.json --out peer.json [--attn eager,sdpa]

The model is built from the preset's config (no download: LlamaForCausalLM, MistralForCausalLM or
Qwen3ForCausalLM from a config dict, random init, bf16, on the GPU) with three PEFT LoRA adapters (plan, action,
reflect: r and alpha from the dump, q_proj and v_proj, random A and B; kept in f32 as PEFT does
by default, --adapter-dtype model keeps them in bf16). Each trace runs as any
user of these libraries would run a multi-agent workflow, Non-Shared: at every agent call,
`set_adapter(agent)` then `generate()` over the whole trajectory so far (no cache kept between
calls), greedy, exactly n new tokens (min_new_tokens = max_new_tokens = n); the appended tokens
come from the trace, so every system sees the same lengths. --cache-per-agent keeps each agent's
DynamicCache between its calls instead (system hf-<attn>-cached), which is how lragent's none mode
runs. Each trace is run --warmup-runs times untimed (default 1) before it is timed.

Metrics (same names and definitions as lragent's JSON; docs/bench.md):
  ttft_s            sum over agent calls of the time to the first token: generate() start to the
                    first logits processor call (after the prefill forward), synchronized
  wall_s            first step to last; throughput_tok_s = final trajectory tokens / wall_s
  decode_tok_s      (tokens after each call's first) / (time after each call's first token)
  kv_bytes          the largest KV cache one call holds: (prompt + n - 1) tokens x layers x 2 x
                    kv_heads x head_dim x 2 bytes (caches are dropped between calls)
  device_peak_bytes torch.cuda.max_memory_allocated() during the trace (weights included)
A cell that runs out of GPU memory is recorded as status "oom" and the run goes on; a trace longer
than the model's positions as "context" (as lragent does).
"""
import argparse
import gc
import json
import sys
import time


def build_config(p, attn):
    """A transformers config from the dump's preset (the fields of the real config.json)."""
    import transformers
    d = {
        "vocab_size": p["vocab_size"], "hidden_size": p["hidden_size"], "intermediate_size": p["intermediate_size"],
        "num_hidden_layers": p["num_hidden_layers"], "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"], "head_dim": p["head_dim"],
        "max_position_embeddings": p["max_position_embeddings"], "rms_norm_eps": p["rms_norm_eps"],
        "rope_theta": p["rope_theta"], "tie_word_embeddings": p["tie_word_embeddings"],
        "bos_token_id": p["bos_token_id"], "eos_token_id": p["eos_token_id"], "initializer_range": p["init_std"],
        "hidden_act": "silu", "attention_bias": False, "use_cache": True,
    }
    if p.get("rope_scaling"):
        d["rope_scaling"] = dict(p["rope_scaling"])
    if p["architecture"] == "MistralForCausalLM":
        d["sliding_window"] = None  # lragent attends the whole context (the preset's window is its max length)
        cls = transformers.MistralConfig
    elif p["architecture"] == "LlamaForCausalLM":
        d["mlp_bias"] = False
        cls = transformers.LlamaConfig
    elif p["architecture"] == "Qwen3ForCausalLM":  # q_norm / k_norm come with the class
        d["use_sliding_window"] = False
        cls = transformers.Qwen3Config
    else:
        sys.exit("hf_peer: architecture %s is not supported" % p["architecture"])
    cfg = cls.from_dict(d)
    cfg._attn_implementation = attn
    return cfg


def build_model(preset, adapters, attn, device, dtype, adapter_dtype="float32"):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = build_config(preset, attn)
    with torch.device(device):
        try:
            base = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            base = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, torch_dtype=dtype)
    base.eval()
    lcfg = LoraConfig(r=adapters["rank"], lora_alpha=adapters["lora_alpha"], target_modules=list(adapters["targets"]),
                      lora_dropout=0.0, bias="none", init_lora_weights=False)
    names = list(adapters["agents"])
    # PEFT's default (autocast_adapter_dtype=True) keeps bf16 models' adapters in f32.
    model = get_peft_model(base, lcfg, adapter_name=names[0], autocast_adapter_dtype=adapter_dtype == "float32")
    for n in names[1:]:
        model.add_adapter(n, lcfg)
    # PEFT 0.21 makes add_adapter's adapters f32 whatever autocast_adapter_dtype says; one dtype for all.
    want = torch.float32 if adapter_dtype == "float32" else dtype
    for pname, p in model.named_parameters():
        if "lora_" in pname:
            p.data = p.data.to(want)
    model.to(device)
    model.eval()
    return model


def kv_bytes_per_token(p, elem_bytes):
    return p["num_hidden_layers"] * 2 * p["num_key_value_heads"] * p["head_dim"] * elem_bytes


def run_trace(model, trace, preset, device, elem_bytes, cache_per_agent=False):
    """Runs one trace Non-Shared; returns the cell (metrics) or raises torch's OOM error.

    cache_per_agent: each agent keeps its DynamicCache between its calls (passed back to
    generate(), which then runs only the tokens the cache lacks): Non-Shared as lragent runs it,
    one private cache per adapter, instead of recomputing the whole trajectory at every call."""
    import torch
    from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

    cuda = device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class FirstToken(LogitsProcessor):
        """Records when the first logits exist: the prefill forward is done."""
        def __init__(self):
            self.t = None

        def __call__(self, input_ids, scores):
            if self.t is None:
                sync()
                self.t = time.perf_counter()
            return scores

    ids = [preset["bos_token_id"]]
    caches = {}  # agent -> DynamicCache (cache_per_agent)
    cell = {"ttft_s": 0.0, "decode_s": 0.0, "decode_tokens": 0, "prefill_tokens": 0, "kv_bytes": 0, "agent_calls": 0}
    per_token = kv_bytes_per_token(preset, elem_bytes)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync()
    start = time.perf_counter()
    for step in trace["steps"]:
        if "append_tokens" in step:
            ids.extend(step["append_tokens"])
            continue
        n = int(step["generate"])
        model.set_adapter(step["agent"])
        x = torch.tensor([ids], dtype=torch.long, device=device)
        first = FirstToken()
        extra = {}
        cached = 0
        if cache_per_agent:
            extra["past_key_values"] = caches.setdefault(step["agent"], DynamicCache())
            cached = extra["past_key_values"].get_seq_length()
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, num_beams=1, pad_token_id=0, use_cache=True,
                                 logits_processor=LogitsProcessorList([first]), **extra)
        sync()
        t1 = time.perf_counter()
        new = out[0, x.shape[1]:].tolist()
        if len(new) != n:
            raise RuntimeError("generate() returned %d tokens for a step of %d" % (len(new), n))
        cell["agent_calls"] += 1
        cell["ttft_s"] += first.t - t0
        cell["decode_s"] += t1 - first.t
        cell["decode_tokens"] += n - 1
        cell["prefill_tokens"] += len(ids) - cached
        # One call's cache (recompute), or every agent's caches held at once (cache per agent).
        held = sum(c.get_seq_length() for c in caches.values()) if cache_per_agent else len(ids) + n - 1
        cell["kv_bytes"] = max(cell["kv_bytes"], held * per_token)
        ids.extend(new)
        del x, out
    sync()
    wall = time.perf_counter() - start
    cell.update({"status": "ok", "final_tokens": len(ids), "wall_s": wall,
                 "throughput_tok_s": len(ids) / wall if wall > 0 else 0.0,
                 "decode_tok_s": cell["decode_tokens"] / cell["decode_s"] if cell["decode_s"] > 0 else 0.0,
                 "device_peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0})
    return cell


def is_oom(e):
    import torch
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    return isinstance(e, oom_types) or "out of memory" in str(e).lower()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", required=True, help="lragent bench trace --dump-traces output")
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--attn", default="eager,sdpa", help="attention implementations, comma-separated")
    ap.add_argument("--lengths", default="", help="only these trace lengths (default: all in the file)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup-runs", type=int, default=1,
                    help="untimed runs of each trace before it is timed (a new length's one-off costs: torch and "
                         "cuBLAS pick kernels per shape; timed cold, the first run at 3.0k took twice the warm one)")
    ap.add_argument("--cache-per-agent", action="store_true",
                    help="keep each agent's KV cache between its calls (system hf-<attn>-cached): Non-Shared with "
                         "one private cache per adapter, as lragent's none mode, instead of recomputing every call")
    ap.add_argument("--runs", type=int, default=1, help="timed runs per trace; the run of median wall time is reported")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--adapter-dtype", default="float32", choices=["float32", "model"],
                    help="float32: PEFT's default (adapters upcast to f32); model: adapters in the model's dtype")
    ap.add_argument("--skip-after-oom", action="store_true",
                    help="once a length runs out of memory, record longer ones as oom without running them")
    args = ap.parse_args()

    import torch
    import transformers
    import peft

    dump = json.load(open(args.traces))
    preset, adapters = dump["preset"], dump["adapters"]
    traces = dump["traces"]
    if args.lengths:
        keep = {int(x) for x in args.lengths.split(",")}
        traces = [t for t in traces if t["target_tokens"] in keep]
    if not traces:
        sys.exit("hf_peer: %s holds no trace of the lengths asked for (--lengths %s)" % (args.traces, args.lengths))
    dtype = getattr(torch, args.dtype)
    elem_bytes = 2 if args.dtype == "bfloat16" else 4
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"benchmark": "hf_peer", "torch": torch.__version__, "transformers": transformers.__version__,
              "peft": peft.__version__, "device": device_name, "dtype": args.dtype,
              "adapter_dtype": args.adapter_dtype if args.adapter_dtype == "float32" else args.dtype, "preset": preset,
              "adapters": adapters, "trace": dump.get("trace"), "warmup_runs_per_cell": args.warmup_runs,
              "timed_runs_per_cell": args.runs, "cells": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    for attn in [a for a in args.attn.split(",") if a]:
        system = "hf-" + attn + ("-cached" if args.cache_per_agent else "")
        t0 = time.perf_counter()
        model = build_model(preset, adapters, attn, args.device, dtype, args.adapter_dtype)
        print("[%s] model ready in %.1f s" % (system, time.perf_counter() - t0), file=sys.stderr, flush=True)
        try:
            # Untimed: the whole shortest trace once (kernel selection, allocator growth, every adapter).
            run_trace(model, min(traces, key=lambda t: t["target_tokens"]), preset, args.device, elem_bytes,
                      args.cache_per_agent)
        except Exception as e:  # noqa: BLE001 - a failed warm-up must not stop the other system
            if not is_oom(e):
                raise
        oom_from = None
        for t in traces:
            base = {"system": system, "mode": "none", "length": t["target_tokens"]}
            if t["target_tokens"] > preset["max_position_embeddings"]:
                result["cells"].append(dict(base, status="context", message="the trace has %d tokens; the model has %d positions"
                                            % (t["target_tokens"], preset["max_position_embeddings"])))
                continue
            if oom_from is not None and args.skip_after_oom:
                result["cells"].append(dict(base, status="oom", message="skipped: %d tokens already ran out of memory" % oom_from))
                continue
            try:
                for _ in range(args.warmup_runs):
                    run_trace(model, t, preset, args.device, elem_bytes, args.cache_per_agent)
                timed = sorted((run_trace(model, t, preset, args.device, elem_bytes, args.cache_per_agent)
                                for _ in range(max(args.runs, 1))), key=lambda c: c["wall_s"])
                cell = dict(timed[(len(timed) - 1) // 2], warmup_runs=args.warmup_runs)
                if len(timed) > 1:
                    cell["wall_s_runs"] = [c["wall_s"] for c in timed]
            except Exception as e:  # noqa: BLE001
                if not is_oom(e):
                    raise
                cell = {"status": "oom", "message": str(e).split("\n")[0][:300],
                        "device_peak_bytes": torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0}
                oom_from = t["target_tokens"] if oom_from is None else oom_from
            gc.collect()
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            cell.update(base)
            result["cells"].append(cell)
            save()
            what = ("ttft %.3f s, %.0f tok/s" % (cell["ttft_s"], cell["throughput_tok_s"])) if cell["status"] == "ok" \
                else cell["status"]
            print("[%s] %d tokens: %s" % (system, t["target_tokens"], what), file=sys.stderr, flush=True)
        del model
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
