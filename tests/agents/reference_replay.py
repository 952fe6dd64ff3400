#!/usr/bin/python3
"""Independent numpy reference for `lragent replay`.

Written from the replay specification and the Hugging Face model definitions
(LlamaForCausalLM forward, PEFT LoRA), not from lragent's sources.  Everything
is computed in float64, one token at a time, with materialised caches.

Model: HF Llama.  Per layer
    h  = RMSNorm(x) * input_layernorm          (this is "X" of the spec)
    q  = h (W_q + s A_q B_q)   [LoRA only when q_proj is a target]
    k, v: taken from the mode's cache layout (see below)
    RoPE: HF rotate-half form, inv_freq = theta^(-2i/d), at the absolute position
    attention: causal, GQA (query head h reads kv head h // (n_heads / n_kv)),
               softmax(q k^T / sqrt(head_dim))
    x += o_proj(attn)  [+ s A_o B_o when o_proj is a target]
    x += down(silu(gate(h2)) * up(h2)),  h2 = RMSNorm(x) * post_attention_layernorm
logits = RMSNorm(x) * norm  @ lm_head^T   (tied embeddings: embed = lm_head.weight)

Cache layouts (per layer, per token position j):
    full entry:  K_j = RoPE_j(X (W_k + s A_k B_k)),  V_j = X (W_v + s A_v B_v)
    base entry:  Kb_j = RoPE_j(X W_k),  Vb_j = X W_v
    LR entry:    LRk_j = X A_k (only when k_proj is a target), LRv_j = X A_v
Agent a reads, in the base modes,
    K_j = Kb_j + RoPE_j(s LRk_j B_k^a),  V_j = Vb_j + s LRv_j B_v^a.
Writes happen before the token's attention, so a token whose entry already
exists in a shared store attends to that existing (origin's) entry.

Modes: none, full, base, base-lr, droidspeak (see replay()).
"""
from __future__ import annotations

import json
import math
import os
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

DT = np.float64
MODES = ("none", "full", "base", "base-lr", "droidspeak")


class ReplayError(Exception):
    """A configuration error the replay must refuse (lragent exits non-zero)."""


# ----------------------------------------------------------------------------- safetensors

def load_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict]:
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": None}
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        lo, hi = info["data_offsets"]
        raw = blob[base + lo: base + hi]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(dtypes[dt]).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"]).astype(DT)
    return out, meta


# ----------------------------------------------------------------------------- model / adapter

@dataclass
class Model:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv: int
    head_dim: int
    eps: float
    theta: float
    vocab: int
    max_pos: int
    bos: int
    embed: np.ndarray
    lm_head: np.ndarray
    norm: np.ndarray
    layers: list  # dicts of weights ([out, in] like torch Linear)
    cos: np.ndarray = None  # [max_pos, head_dim]
    sin: np.ndarray = None

    @staticmethod
    def load(model_dir: str) -> "Model":
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        w, _ = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        hidden = cfg["hidden_size"]
        n_heads = cfg["num_attention_heads"]
        n_kv = cfg.get("num_key_value_heads", n_heads)
        head_dim = cfg.get("head_dim") or hidden // n_heads
        if cfg.get("rope_scaling"):
            raise ReplayError("reference: rope scaling not implemented")
        embed = w.get("model.embed_tokens.weight")
        lm_head = w.get("lm_head.weight")
        if embed is None:
            embed = lm_head  # tied, stored once as lm_head.weight
        if lm_head is None:
            lm_head = embed
        layers = []
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            layers.append({
                "in_norm": w[p + "input_layernorm.weight"],
                "post_norm": w[p + "post_attention_layernorm.weight"],
                "q": w[p + "self_attn.q_proj.weight"],
                "k": w[p + "self_attn.k_proj.weight"],
                "v": w[p + "self_attn.v_proj.weight"],
                "o": w[p + "self_attn.o_proj.weight"],
                "gate": w[p + "mlp.gate_proj.weight"],
                "up": w[p + "mlp.up_proj.weight"],
                "down": w[p + "mlp.down_proj.weight"],
            })
        m = Model(n_layers=cfg["num_hidden_layers"], hidden=hidden, n_heads=n_heads, n_kv=n_kv, head_dim=head_dim,
                  eps=cfg.get("rms_norm_eps", 1e-6), theta=cfg.get("rope_theta", 10000.0), vocab=cfg["vocab_size"],
                  max_pos=cfg.get("max_position_embeddings", 2048), bos=cfg.get("bos_token_id", 1),
                  embed=embed, lm_head=lm_head, norm=w["model.norm.weight"], layers=layers)
        inv_freq = 1.0 / (m.theta ** (np.arange(0, head_dim, 2, dtype=DT) / head_dim))
        freqs = np.outer(np.arange(m.max_pos, dtype=DT), inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        m.cos, m.sin = np.cos(emb), np.sin(emb)
        return m

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x: [..., n, head_dim] with the position axis -3 when pos is an array, or a single position."""
        half = self.head_dim // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        if np.isscalar(pos):
            c, s = self.cos[pos], self.sin[pos]
        else:
            c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        return x * c + rot * s


@dataclass
class Adapter:
    name: str
    r: int
    alpha: float
    s: float
    targets: set
    A: list  # per layer: {module: [r, in]}
    B: list  # per layer: {module: [out, r]}

    @staticmethod
    def load(name: str, adir: str, n_layers: int) -> "Adapter":
        cfg = json.load(open(os.path.join(adir, "adapter_config.json")))
        w, _ = load_safetensors(os.path.join(adir, "adapter_model.safetensors"))
        r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
        if cfg.get("use_rslora"):
            s = alpha / math.sqrt(r)
        else:
            s = alpha / r
        targets = set()
        A = [dict() for _ in range(n_layers)]
        B = [dict() for _ in range(n_layers)]
        for key, arr in w.items():
            # base_model.model.model.layers.{l}.self_attn.{m}_proj.lora_{A,B}.weight
            parts = key.split(".")
            li = parts.index("layers")
            l = int(parts[li + 1])
            mod = parts[li + 3].replace("_proj", "")
            which = parts[li + 4]
            (A if which == "lora_A" else B)[l][mod] = arr
            targets.add(mod)
        return Adapter(name=name, r=r, alpha=alpha, s=s, targets=targets, A=A, B=B)

    def has(self, mod):
        return mod in self.targets

    def rank_k(self):
        return self.r if self.has("k") else 0

    def rank_v(self):
        return self.r if self.has("v") else 0


def proj(model: Model, ad: Adapter, l: int, mod: str, x: np.ndarray) -> np.ndarray:
    """x (W + s A B) in HF orientation: W [out,in], A [r,in], B [out,r]."""
    y = x @ model.layers[l][mod].T
    if ad.has(mod):
        y = y + ad.s * ((x @ ad.A[l][mod].T) @ ad.B[l][mod].T)
    return y


# ----------------------------------------------------------------------------- stores

class Store:
    """Append-only per-layer cache of one entry kind: a pair of arrays (K-like, V-like) per layer,
    position-indexed, with a fill count per layer."""

    def __init__(self, n_layers, max_pos, shapes):
        self.arrs = [[np.zeros((max_pos,) + tuple(sh), dtype=DT) for sh in shapes] for _ in range(n_layers)]
        self.n = [0] * n_layers

    def count(self, l):
        return self.n[l]

    def has(self, l, pos):
        return pos < self.n[l]

    def put(self, l, pos, values):
        assert pos == self.n[l], f"non-sequential cache write at layer {l} pos {pos}"
        for arr, v in zip(self.arrs[l], values):
            if v is not None:
                arr[pos] = v
        self.n[l] += 1

    def stack(self, l, n, idx):
        assert n <= self.n[l]
        return self.arrs[l][idx][:n]


@dataclass
class StepOut:
    agent: str
    prefilled_tokens: int
    output_tokens: list
    logits: list = field(default_factory=list)


class Replay:
    def __init__(self, model: Model, adapters: dict, mode: str, recompute_layers=()):
        if mode not in MODES:
            raise ReplayError(f"unknown sharing mode '{mode}'")
        self.m, self.ads, self.mode = model, adapters, mode
        self.names = list(adapters)
        L = model.n_layers
        self.R = set()
        if mode == "droidspeak":
            for l in recompute_layers:
                if not (0 <= l < L):
                    raise ReplayError(f"recompute layer {l} out of range (model has {L} layers)")
            self.R = set(recompute_layers)
        if mode == "base-lr":
            self._require_shared_a()
        self.traj = [model.bos]
        self.processed = {a: 0 for a in self.names}  # prefix length each agent has run its forward over
        self.done = 0  # prefix length any agent has processed (shared stores are filled this far)
        self.near_ties = 0
        # stores
        T, kv = model.max_pos, (model.n_kv, model.head_dim)
        def lr_shapes(a):
            return ((adapters[a].rank_k(),), (adapters[a].rank_v(),))
        self.priv_full = {a: Store(L, T, (kv, kv)) for a in self.names}  # none / droidspeak recompute layers
        self.shared_full = Store(L, T, (kv, kv))                         # full / droidspeak shared layers
        self.shared_base = Store(L, T, (kv, kv))                         # base / base-lr
        self.priv_lr = {a: Store(L, T, lr_shapes(a)) for a in self.names}  # base
        self.shared_lr = Store(L, T, lr_shapes(self.names[0]))           # base-lr

    def _require_shared_a(self):
        first = self.ads[self.names[0]]
        for a in self.names[1:]:
            ad = self.ads[a]
            for mod in ("k", "v"):
                if first.has(mod) != ad.has(mod) or (first.has(mod) and first.r != ad.r):
                    raise ReplayError("base-lr needs shared-A adapters (same targets and rank)")
                if not first.has(mod):
                    continue
                for l in range(self.m.n_layers):
                    if not np.array_equal(first.A[l][mod], ad.A[l][mod]):
                        raise ReplayError(f"base-lr requires shared-A adapters: {mod}_proj lora_A differs between "
                                          f"'{self.names[0]}' and '{a}' at layer {l}")

    # -- per-layer K/V handling
    def _write_and_read_kv(self, a: str, l: int, pos: int, X: np.ndarray):
        m, ad, mode = self.m, self.ads[a], self.mode
        nkv, hd = m.n_kv, m.head_dim

        def full_entry():
            k = m.rope(proj(m, ad, l, "k", X).reshape(nkv, hd), pos)
            v = proj(m, ad, l, "v", X).reshape(nkv, hd)
            return (k, v)

        def base_entry():
            k = m.rope((X @ m.layers[l]["k"].T).reshape(nkv, hd), pos)
            v = (X @ m.layers[l]["v"].T).reshape(nkv, hd)
            return (k, v)

        def lr_entry():
            lk = X @ ad.A[l]["k"].T if ad.has("k") else None
            lv = X @ ad.A[l]["v"].T if ad.has("v") else None
            return (lk, lv)

        n = pos + 1
        if mode == "none" or (mode == "droidspeak" and l in self.R):
            st = self.priv_full[a]
            st.put(l, pos, full_entry())
            return st.stack(l, n, 0), st.stack(l, n, 1)
        if mode in ("full", "droidspeak"):
            st = self.shared_full
            if not st.has(l, pos):
                st.put(l, pos, full_entry())
            return st.stack(l, n, 0), st.stack(l, n, 1)
        # base modes
        if not self.shared_base.has(l, pos):
            self.shared_base.put(l, pos, base_entry())
        lr = self.priv_lr[a] if mode == "base" else self.shared_lr
        if not lr.has(l, pos):
            lr.put(l, pos, lr_entry())
        K = self.shared_base.stack(l, n, 0)
        V = self.shared_base.stack(l, n, 1)
        if ad.has("k"):
            LRk = lr.stack(l, n, 0)  # [n, r]
            dk = (ad.s * (LRk @ ad.B[l]["k"].T)).reshape(n, nkv, hd)
            K = K + m.rope(dk, np.arange(n))
        if ad.has("v"):
            LRv = lr.stack(l, n, 1)
            V = V + (ad.s * (LRv @ ad.B[l]["v"].T)).reshape(n, nkv, hd)
        return K, V

    def forward(self, a: str, pos: int) -> np.ndarray:
        """Run agent a's forward pass for trajectory position pos; returns logits."""
        m, ad = self.m, self.ads[a]
        assert pos < m.max_pos, "trajectory exceeds max_position_embeddings"
        x = m.embed[self.traj[pos]].copy()
        rep = m.n_heads // m.n_kv
        for l in range(m.n_layers):
            W = m.layers[l]
            X = m.rmsnorm(x, W["in_norm"])
            q = m.rope(proj(m, ad, l, "q", X).reshape(m.n_heads, m.head_dim), pos)
            K, V = self._write_and_read_kv(a, l, pos, X)  # [n, nkv, hd]
            Kh = np.repeat(K, rep, axis=1)  # [n, nh, hd]  (HF repeat_kv)
            Vh = np.repeat(V, rep, axis=1)
            sc = np.einsum("hd,nhd->hn", q, Kh) / math.sqrt(m.head_dim)
            sc = sc - sc.max(axis=1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(axis=1, keepdims=True)
            att = np.einsum("hn,nhd->hd", p, Vh).reshape(-1)
            x = x + proj(m, ad, l, "o", att)
            h2 = m.rmsnorm(x, W["post_norm"])
            g = h2 @ W["gate"].T
            mlp = (g / (1.0 + np.exp(-g)) * (h2 @ W["up"].T)) @ W["down"].T
            x = x + mlp
        self.processed[a] = pos + 1
        self.done = max(self.done, pos + 1)
        return m.rmsnorm(x, m.norm) @ m.lm_head.T

    def catch_up_start(self, a: str) -> int:
        if self.mode in ("full", "base-lr"):
            return self.done
        return self.processed[a]

    def agent_step(self, a: str, n_tokens: int, forced=None, prefer=None, tie_tol=0.0) -> StepOut:
        """Catch agent a up, then decode n_tokens greedily (or take `forced`).  `prefer` (optional, the other
        implementation's tokens for this step) is taken instead of the argmax only where its logit is within
        tie_tol of the maximum: a near-tie that float rounding may break either way (counted in near_ties)."""
        if a not in self.ads:
            raise ReplayError(f"unknown agent '{a}'")
        start = self.catch_up_start(a)
        logits = None
        for pos in range(start, len(self.traj)):
            logits = self.forward(a, pos)
        if logits is None:
            raise ReplayError("nothing to catch up on (reference expects at least one unprocessed token)")
        out = StepOut(agent=a, prefilled_tokens=len(self.traj) - start, output_tokens=[])
        for t in range(n_tokens):
            out.logits.append(logits)
            tok = int(forced[t]) if forced is not None else int(np.argmax(logits))  # ties -> lowest id
            if forced is None and prefer is not None and t < len(prefer) and prefer[t] != tok and \
                    0 <= prefer[t] < len(logits) and logits[prefer[t]] >= logits[tok] - tie_tol:
                tok = int(prefer[t])
                self.near_ties += 1
            out.output_tokens.append(tok)
            self.traj.append(tok)
            if t + 1 < n_tokens:  # HF generate: the last token is not forwarded
                logits = self.forward(a, len(self.traj) - 1)
        return out

    def cache_bytes(self) -> dict:
        m, L = self.m, self.m.n_layers
        kv = 2 * m.n_kv * m.head_dim * 4
        base = lr = full = 0
        for l in range(L):
            full += self.shared_full.count(l) * kv
            base += self.shared_base.count(l) * kv
            for a in self.names:
                ad = self.ads[a]
                full += self.priv_full[a].count(l) * kv
                lr += self.priv_lr[a].count(l) * (ad.rank_k() + ad.rank_v()) * 4
            if self.shared_lr.count(l):
                ad = self.ads[self.names[0]]
                lr += self.shared_lr.count(l) * (ad.rank_k() + ad.rank_v()) * 4
        return {"base_bytes": base, "lr_bytes": lr, "full_bytes": full, "total_bytes": base + lr + full}

    def analytic_cache_bytes(self) -> dict:
        """The same numbers from the per-agent processed counts alone (cross-check of the stores)."""
        m, L = self.m, self.m.n_layers
        kv = 2 * m.n_kv * m.head_dim * 4
        def lrb(a):
            return (self.ads[a].rank_k() + self.ads[a].rank_v()) * 4
        base = lr = full = 0
        if self.mode == "none":
            full = sum(self.processed.values()) * L * kv
        elif self.mode == "full":
            full = self.done * L * kv
        elif self.mode == "base":
            base = self.done * L * kv
            lr = sum(self.processed[a] * L * lrb(a) for a in self.names)
        elif self.mode == "base-lr":
            base = self.done * L * kv
            lr = self.done * L * lrb(self.names[0])
        else:
            nr = len(self.R)
            full = self.done * (L - nr) * kv + sum(self.processed.values()) * nr * kv
        return {"base_bytes": base, "lr_bytes": lr, "full_bytes": full, "total_bytes": base + lr + full}


def replay(model: Model, adapters: dict, script: dict, mode: str, recompute_layers=(), prefer=None,
           tie_tol=0.0) -> dict:
    """Run a script.  prefer: optional list (one per agent step) of another implementation's output tokens,
    used only to resolve greedy near-ties within tie_tol (see Replay.agent_step)."""
    rp = Replay(model, adapters, mode, recompute_layers)
    steps = []
    for st in script["steps"]:
        if "append_tokens" in st:
            rp.traj.extend(int(t) for t in st["append_tokens"])
        elif "append" in st:
            raise ReplayError("reference replay: text 'append' steps need a tokenizer; use append_tokens")
        elif "force_tokens" in st:
            o = rp.agent_step(st["agent"], len(st["force_tokens"]), forced=st["force_tokens"])
            steps.append(o)
        elif "generate" in st:
            if st.get("stop"):
                raise ReplayError("reference replay: stop strings are not supported")
            pre = prefer[len(steps)] if prefer is not None and len(steps) < len(prefer) else None
            steps.append(rp.agent_step(st["agent"], int(st["generate"]), prefer=pre, tie_tol=tie_tol))
        else:
            raise ReplayError(f"bad script step {st}")
    cb = rp.cache_bytes()
    assert cb == rp.analytic_cache_bytes(), (cb, rp.analytic_cache_bytes())
    return {
        "mode": mode,
        "steps": [{"agent": s.agent, "prefilled_tokens": s.prefilled_tokens, "output_tokens": s.output_tokens,
                   "logits": [np.asarray(r) for r in s.logits]} for s in steps],
        "cache": cb,
        "trajectory": list(rp.traj),
        "processed": dict(rp.processed),
        "near_ties": rp.near_ties,
    }


def plain_forward(model: Model, ad: Adapter, tokens: list) -> np.ndarray:
    """Uncached whole-sequence HF forward with one adapter (causal mask); logits [n, vocab].
    Used as a self-check: mode none must agree with it."""
    m = model
    n = len(tokens)
    x = m.embed[tokens].copy()
    pos = np.arange(n)
    rep = m.n_heads // m.n_kv
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(m.n_layers):
        W = m.layers[l]
        X = m.rmsnorm(x, W["in_norm"])
        q = m.rope(proj(m, ad, l, "q", X).reshape(n, m.n_heads, m.head_dim), pos)
        k = m.rope(proj(m, ad, l, "k", X).reshape(n, m.n_kv, m.head_dim), pos)
        v = proj(m, ad, l, "v", X).reshape(n, m.n_kv, m.head_dim)
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        sc = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(m.head_dim) + mask
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p /= p.sum(axis=-1, keepdims=True)
        att = np.einsum("hij,jhd->ihd", p, v).reshape(n, -1)
        x = x + proj(m, ad, l, "o", att)
        h2 = m.rmsnorm(x, W["post_norm"])
        g = h2 @ W["gate"].T
        x = x + (g / (1.0 + np.exp(-g)) * (h2 @ W["up"].T)) @ W["down"].T
    return m.rmsnorm(x, m.norm) @ m.lm_head.T


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", action="append", default=[], help="NAME=DIR (order = agent order)")
    ap.add_argument("--kv-share", default="none")
    ap.add_argument("--recompute-layers", default="")
    ap.add_argument("--script", required=True)
    args = ap.parse_args(argv)
    model = Model.load(args.model)
    ads = {}
    for spec in args.adapter:
        name, d = spec.split("=", 1)
        ads[name] = Adapter.load(name, d, model.n_layers)
    rl = [int(x) for x in args.recompute_layers.split(",") if x.strip()]
    try:
        res = replay(model, ads, json.load(open(args.script)), args.kv_share, rl)
    except ReplayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for s in res["steps"]:
        s["first_logits"] = s["logits"][0].tolist() if s["logits"] else None
        s["logits"] = [r.tolist() for r in s["logits"]]
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
