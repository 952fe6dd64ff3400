#!/usr/bin/env python3
"""Goldens for lragent's Qwen3 support: a small random Qwen3ForCausalLM and two PEFT adapters.

Qwen3 differs from the Llama family that lragent already computes by its per-head RMSNorm on
queries and keys (q_norm, k_norm, applied after the projections and before RoPE), an explicit
head_dim that need not be hidden_size / num_attention_heads, and no q/k/v biases. This script
makes the model, runs HF transformers + PEFT on the CPU in float32 (eager attention) and writes:

    tests/fixtures/models/synthetic-qwen3/{config.json,model.safetensors}
    tests/fixtures/adapters/synthetic-qwen3/{qkvo,qv}/{adapter_config.json,adapter_model.safetensors}
    tests/fixtures/goldens/synthetic-qwen3.json          the base model
    tests/fixtures/goldens/synthetic-qwen3-qkvo.json     with the q/k/v/o adapter (not merged)
    tests/fixtures/goldens/synthetic-qwen3-qv.json       with the q/v adapter (not merged)

The case format is make_model_goldens.py's (prompt_tokens, last_logits, 64 greedy tokens by full
recomputation, top2_margins). Needs torch, transformers (with Qwen3), peft and safetensors; no
GPU, no network:

    python3 scripts/goldens/make_qwen3_goldens.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_model_goldens as mg  # noqa: E402  (shares the case format and the checks)

NAME = "synthetic-qwen3"
PROMPT_LENGTHS = [1, 5, 17, 40, 97, 130]
PROMPT_SEED = 20261129
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA 2:1
    "head_dim": 64,  # explicit: q is 4 * 64 = 256 wide against hidden 64, as Qwen3 models have; 64 runs the tuned CUDA kernels
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "use_cache": True,
    "tie_word_embeddings": True,  # as the small Qwen3 checkpoints
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 3,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
CANDIDATES = [(seed, scale) for scale in (1.0, 1.5, 2.0, 3.0) for seed in range(4321, 4326)]
MIN_MARGIN = 1e-3
MATRIX_STD = 0.12
NORM_STD = 0.2  # q_norm / k_norm weights 1 + 0.2 N(0,1): a wrong or missing norm shows
ADAPTERS = {
    # name: (target modules, rank, alpha)
    "qkvo": (["q_proj", "k_proj", "v_proj", "o_proj"], 4, 8),
    "qv": (["q_proj", "v_proj"], 8, 16),
}
LORA_STD = 0.25
LORA_SEEDS = range(777, 797)  # the first whose greedy steps all have a margin >= MIN_MARGIN wins


def prompts() -> list:
    import random

    rng = random.Random(PROMPT_SEED)
    return [[rng.randrange(3, CONFIG["vocab_size"]) for _ in range(n)] for n in PROMPT_LENGTHS]


def init_weights(model, seed: int, scale: float) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(tuple(p.shape), generator=gen, dtype=torch.float32)
            p.copy_(1.0 + NORM_STD * noise if name.endswith("norm.weight") else MATRIX_STD * scale * noise)
            tensors[name] = p.detach().clone().contiguous()
    return tensors


def cases_for(model, ps: list, what: str, checks) -> list:
    out = []
    for i, p in enumerate(ps):
        r = mg.greedy(model, p, mg.MAX_NEW_TOKENS)
        gen = mg.generate_crosscheck(model, p, r, f"{what} prompt {i}", checks)
        if min(r["top2_margins"]) < MIN_MARGIN:
            checks.warn(f"{what}: prompt {i} has a greedy margin of {min(r['top2_margins']):.3g}")
        out.append({
            "prompt_tokens": p,
            "output_tokens": r["output_tokens"],
            "min_top2_margin": mg.F32Scalar(min(r["top2_margins"])),
            "hf_generate_check": gen,
            "top2_margins": mg.F32(r["top2_margins"]),
            "last_logits": mg.F32(r["last_logits"].tolist()),
        })
    return out


def stage_model(args, checks, summary) -> Path:
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    mdir = args.fixtures / "models" / NAME
    mdir.mkdir(parents=True, exist_ok=True)
    cfg = dict(CONFIG, transformers_version=transformers.__version__)
    (mdir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    stale = mdir / "model.safetensors"
    if stale.exists():
        stale.unlink()
    config = AutoConfig.from_pretrained(str(mdir), local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to("cpu").float().eval()
    checks.ok(type(model).__name__ == "Qwen3ForCausalLM", f"model class {type(model).__name__}")
    names = [n for n, _ in model.named_parameters()]
    checks.ok(any(n.endswith("self_attn.q_norm.weight") for n in names)
              and any(n.endswith("self_attn.k_norm.weight") for n in names), "the model has q_norm and k_norm")
    checks.ok(not any(n.endswith(".bias") for n in names), "no biases")

    ps = prompts()
    seed, scale, _ = mg.pick_init(model, ps, CANDIDATES, init_weights, MIN_MARGIN, "qwen3", checks)
    tensors = init_weights(model, seed, scale)
    wpath = mdir / "model.safetensors"
    save_file(tensors, str(wpath), metadata={"format": "pt"})
    checks.ok("lm_head.weight" not in tensors, "tied: the file has no lm_head.weight")

    # Goldens come from the model as reloaded from disk, so the fixture is what was tested.
    model2 = mg.load_causal_lm(mdir, checks, "qwen3 (reloaded)")
    mg.verify_loaded_weights(model2, mdir, "qwen3", checks)
    cases = cases_for(model2, ps, "qwen3 base", checks)
    doc = {
        "model": NAME, "generator": mg.versions(), "config": cfg,
        "model_safetensors_sha256": hashlib.sha256(wpath.read_bytes()).hexdigest(),
        "init": {"seed": seed, "matrix_std": MATRIX_STD * scale, "norm_weight": f"1 + {NORM_STD} * N(0,1)",
                 "order": "sorted parameter names, one torch.Generator"},
        "settings": {"device": "cpu", "dtype": "float32", "attn_implementation": "eager",
                     "max_new_tokens": mg.MAX_NEW_TOKENS,
                     "decoding": "greedy argmax (lowest id on ties) over full-recompute logits; EOS does not stop",
                     "prompt_tokens": "token ids given directly (no tokenizer, no BOS added)"},
        "cases": cases,
    }
    path = args.out / f"{NAME}.json"
    summary.append((path, mg.write_json(path, doc)))
    summary.append((wpath, wpath.stat().st_size))
    return mdir


def stage_adapters(args, mdir: Path, checks, summary) -> None:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    base = mg.load_causal_lm(mdir, checks, "qwen3 base for the adapters")
    ps = prompts()
    base_logits = [mg.greedy(base, p, 1)["last_logits"] for p in ps]
    for name, (targets, r, alpha) in ADAPTERS.items():
        what = f"qwen3 adapter {name}"
        mg.log(f"\n== {what}")
        adir = args.fixtures / "adapters" / NAME / name
        adir.mkdir(parents=True, exist_ok=True)
        fresh = mg.load_causal_lm(mdir, checks, f"{what} base")
        pm = get_peft_model(fresh, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                                              bias="none", task_type="CAUSAL_LM"))
        lora_params = [(n, p) for n, p in sorted(pm.named_parameters(), key=lambda kv: kv[0])
                       if ".lora_A." in n or ".lora_B." in n]
        best = None
        for seed in LORA_SEEDS:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for _, p in lora_params:  # PEFT starts B at 0: the adapter would do nothing
                    p.copy_(LORA_STD * torch.randn(tuple(p.shape), generator=gen))
            margin = min(min(mg.greedy(pm, q, mg.MAX_NEW_TOKENS)["top2_margins"]) for q in ps)
            mg.log(f"  lora seed {seed}: min top2 margin {margin:.4g}")
            if best is None or margin > best[1]:
                best = (seed, margin)
            if margin >= MIN_MARGIN:
                break
        lora_seed = best[0]
        gen = torch.Generator().manual_seed(lora_seed)
        with torch.no_grad():
            for _, p in lora_params:
                p.copy_(LORA_STD * torch.randn(tuple(p.shape), generator=gen))
        pm.save_pretrained(str(adir))
        acfg_path = adir / "adapter_config.json"
        acfg = json.loads(acfg_path.read_text(encoding="utf-8"))
        acfg["base_model_name_or_path"] = NAME  # not this machine's path
        acfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for extra in adir.glob("README.md"):
            extra.unlink()

        # The goldens come from the adapter as reloaded from disk, unmerged.
        reloaded = PeftModel.from_pretrained(mg.load_causal_lm(mdir, checks, f"{what} reload base"), str(adir),
                                             is_trainable=False).to("cpu").eval()
        mg.verify_peft_weights(reloaded, adir, what, checks)
        cases = cases_for(reloaded, ps, what, checks)
        diffs = [float((torch.tensor(list(c["last_logits"])) - b).abs().max()) for c, b in zip(cases, base_logits)]
        checks.ok(min(diffs) > 1e-2, f"{what}: the adapter changes every prompt's logits (min max|diff| {min(diffs):.3g})")
        man = mg.manual_lora_logits(mdir, adir, ps[2], checks, what)
        d = float((man - torch.tensor(list(cases[2]["last_logits"]))).abs().max())
        checks.ok(d < 1e-3, f"{what}: PEFT logits == base + scaling*B@A math (max |diff| {d:.3g})")
        doc = {"model": NAME, "adapter": name, "generator": mg.versions(),
               "adapter_config": {k: acfg.get(k) for k in ["r", "lora_alpha", "target_modules", "use_rslora"]},
               "settings": {"device": "cpu", "dtype": "float32", "attn_implementation": "eager",
                            "max_new_tokens": mg.MAX_NEW_TOKENS, "adapter": "PeftModel.from_pretrained, not merged",
                            "lora_init": f"A and B ~ {LORA_STD} * N(0,1), torch.Generator({lora_seed}), sorted names"},
               "max_abs_logit_diff_vs_base": mg.F32Scalar(max(diffs)),
               "cases": cases}
        path = args.out / f"{NAME}-{name}.json"
        summary.append((path, mg.write_json(path, doc)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=mg.REPO_ROOT / "tests" / "fixtures" / "goldens")
    ap.add_argument("--fixtures", type=Path, default=mg.REPO_ROOT / "tests" / "fixtures")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    args.out, args.fixtures = args.out.resolve(), args.fixtures.resolve()
    mg.log(f"versions: {mg.versions()}")
    mg.setup_torch(args.threads)
    checks = mg.Checks()
    summary: list = []
    try:
        mdir = stage_model(args, checks, summary)
        stage_adapters(args, mdir, checks, summary)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        checks.ok(False, f"raised {type(e).__name__}: {e}")
    mg.log("\n== summary")
    for path, size in summary:
        mg.log(f"  {path} ({size} bytes)")
    for w in checks.warnings:
        mg.log(f"  warning: {w}")
    for f in checks.failures:
        mg.log(f"  FAILED: {f}")
    mg.log("OK" if not checks.failures else "SOME CHECKS FAILED - do not commit the goldens before looking")
    return 0 if not checks.failures else 1


if __name__ == "__main__":
    sys.exit(main())
