#!/usr/bin/env python3
"""Goldens for --kv-share icarus (ICaRus, arXiv 2603.13281): transformers + PEFT as the reference.

ICaRus splits a decoder-only model into a logical encoder, the base model, which computes every
K/V entry, and a logical decoder, the base model with an agent's adapter, whose queries attend
to those entries and whose output gives the agent's next token; the decoder's own K/V
projections are never used. transformers has no such forward, so this script composes it from
the library's own modules: the base model's cache (PeftModel with the adapter disabled, one
forward with use_cache), then, layer by layer, the adapted model's input norm, q_proj (PEFT's
LoRA layer), rotary embedding, attention over the cached K/V (causal, GQA), o_proj, post-attention
norm and MLP, and the final norm and LM head. With the adapter disabled the same loop must give
the base model's own logits: the script checks that first.

Run where torch, transformers, peft and numpy are (CPU, float32; no network):

    python3 scripts/goldens/make_icarus_goldens.py --shared ../shared

Writes tests/fixtures/goldens/tinystories-icarus.json: for each case (adapter, tokens = a golden
prompt and the first 24 greedy tokens the adapter's golden file holds), the decoder's logits at
every position teacher-forced over those tokens: the top 5 ids and values of each row, and the
whole last row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
CASES = [("qv-shared-a-r8", "plan"), ("qkvo-shared-a-r4", "action")]
PROMPTS = 4        # the first cases of each adapter's golden file
EXTRA_TOKENS = 24  # of its greedy output, appended to the prompt
TOP = 5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.environ.get("LRAGENT_SHARED", str(REPO.parent / "shared")))
    ap.add_argument("--out", default=str(REPO / "tests/fixtures/goldens/tinystories-icarus.json"))
    args = ap.parse_args()

    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    torch.manual_seed(0)
    model_dir = Path(args.shared) / "models/tinystories-656k"

    def cache_kv(cache, layer):
        if hasattr(cache, "layers"):  # transformers 5
            return cache.layers[layer].keys, cache.layers[layer].values
        return cache.key_cache[layer], cache.value_cache[layer]

    def decoder_logits(peft_model, ids, adapter_on):
        """The logical decoder over `ids` [1, T] attending to the base model's entries."""
        with torch.no_grad():
            with peft_model.disable_adapter():
                base = peft_model(input_ids=ids, use_cache=True)
            inner = peft_model.base_model.model  # LlamaForCausalLM (its Linear layers wrapped by PEFT)
            if not adapter_on:
                ctx = peft_model.disable_adapter()
            else:
                import contextlib
                ctx = contextlib.nullcontext()
            with ctx:
                m = inner.model
                T = ids.shape[1]
                pos = torch.arange(T).unsqueeze(0)
                h = m.embed_tokens(ids)
                cos, sin = m.rotary_emb(h, pos)
                mask = torch.full((T, T), float("-inf")).triu(1)
                for li, layer in enumerate(m.layers):
                    attn = layer.self_attn
                    hd = attn.head_dim
                    x = layer.input_layernorm(h)
                    q = attn.q_proj(x).view(1, T, -1, hd).transpose(1, 2)
                    q, _ = apply_rotary_pos_emb(q, q, cos, sin)
                    k, v = cache_kv(base.past_key_values, li)  # [1, kv_heads, T, hd], K with RoPE
                    groups = q.shape[1] // k.shape[1]
                    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
                    w = torch.matmul(q, k.transpose(2, 3)) * attn.scaling + mask
                    w = torch.softmax(w.float(), dim=-1)
                    o = torch.matmul(w, v).transpose(1, 2).reshape(1, T, -1)
                    h = h + attn.o_proj(o)
                    h = h + layer.mlp(layer.post_attention_layernorm(h))
                logits = inner.lm_head(m.norm(h))[0]
        return logits, base.logits[0]

    failures = []
    out_cases = []
    for set_name, role in CASES:
        golden = json.loads((REPO / f"tests/fixtures/goldens/tinystories-{set_name}-{role}.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        peft_model = PeftModel.from_pretrained(model, str(Path(args.shared) / f"adapters/tinystories-656k/{set_name}/{role}"))
        peft_model.eval()
        for case in golden["cases"][:PROMPTS]:
            tokens = case["prompt_tokens"] + case["output_tokens"][:EXTRA_TOKENS]
            ids = torch.tensor([tokens])
            # The loop itself, adapter off: the base model's logits.
            plain, base_logits = decoder_logits(peft_model, ids, adapter_on=False)
            err = (plain - base_logits).abs().max().item()
            if err > 1e-4:
                failures.append(f"{set_name}/{role}: the decoder loop without the adapter is {err:.2e} off the base model")
            logits, _ = decoder_logits(peft_model, ids, adapter_on=True)
            # And the adapter changes them (else the case would check nothing).
            moved = (logits - base_logits).abs().max().item()
            if moved < 1e-3:
                failures.append(f"{set_name}/{role}: the adapter's decoder logits equal the base model's")
            top = torch.topk(logits, TOP, dim=-1)
            out_cases.append({
                "adapter": f"{set_name}/{role}",
                "tokens": tokens,
                "top_ids": top.indices.tolist(),
                "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()],
                "last_logits": [round(v, 5) for v in logits[-1].tolist()],
                "max_abs_diff_vs_base": round(moved, 5),
                "loop_check_max_abs_err": err,
            })
            print(f"{set_name}/{role}: {len(tokens)} tokens, decoder vs base max |diff| {moved:.3f}, loop check {err:.1e}")

    doc = {
        "model": "tinystories-656k",
        "generator": f"scripts/goldens/make_icarus_goldens.py (transformers {transformers.__version__}, "
                     f"torch {torch.__version__}, float32, CPU)",
        "definition": "ICaRus: every K/V entry from the base model (PEFT adapter disabled); the adapted model's "
                      "queries attend to them (causal); logits teacher-forced at every position",
        "cases": out_cases,
    }
    Path(args.out).write_text(json.dumps(doc) + "\n")
    print(f"wrote {args.out} ({len(out_cases)} cases)")
    for f in failures:
        print("FAILED:", f)
    print("OK" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
