// The forward pass of LlamaModel: one batch of sequences, each with its own positions,
// KV binding and adapter.
#include <cmath>

#include "model/llama.h"
#include "model/lora_apply.h"

namespace lragent {
namespace {

const TensorView* opt(const TensorView& b) { return b.data ? &b : nullptr; }


}  // namespace

Result<Tensor> LlamaModel::forward(const std::vector<SeqInput>& batch, const AdapterRegistry* /*registry*/) {
  LRA_RETURN_IF_ERROR(validate_batch(batch));
  const ModelConfig& c = cfg_;
  const int64_t hid = c.hidden_size, hd = c.head_dim;
  const int64_t qw = static_cast<int64_t>(c.num_heads) * hd, kvw = static_cast<int64_t>(c.num_kv_heads) * hd;

  // Flatten the batch: rows of sequence s are [segs[s].row_begin, + n_tokens).
  std::vector<LoraSegment> segs;
  std::vector<int32_t> ids, pos;  // [N]
  int64_t n_out = 0;
  for (const SeqInput& in : batch) {
    segs.push_back({static_cast<int64_t>(ids.size()), in.n_tokens, in.adapter});
    for (int i = 0; i < in.n_tokens; ++i) {
      ids.push_back(in.tokens[i]);
      pos.push_back(static_cast<int32_t>(in.start_pos + i));
    }
    n_out += in.all_logits ? in.n_tokens : 1;
    LRA_RETURN_IF_ERROR(in.kv->reserve(in.start_pos + in.n_tokens));
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  bool need_full = false;
  for (const SeqInput& in : batch) need_full = need_full || in.kv->wants_full();

  Tensor h = be_.alloc(DType::kF32, {n, hid});          // [N, hidden] residual stream
  Tensor xn = be_.alloc(DType::kF32, {n, hid});         // [N, hidden] normed
  Tensor q = be_.alloc(DType::kF32, {n, c.num_heads, hd});       // [N, heads, hd]
  Tensor k_base = be_.alloc(DType::kF32, {n, c.num_kv_heads, hd});  // [N, kv_heads, hd]
  Tensor v_base = be_.alloc(DType::kF32, {n, kvw});     // [N, kv_heads*hd]
  Tensor attn = be_.alloc(DType::kF32, {n, qw});        // [N, heads*hd]
  Tensor gate = be_.alloc(DType::kF32, {n, c.intermediate_size});  // [N, inter]
  Tensor up = be_.alloc(DType::kF32, {n, c.intermediate_size});    // [N, inter]
  for (const Tensor* t : {&h, &xn, &q, &k_base, &v_base, &attn, &gate, &up})
    if (!t->view().data)
      return make_error(ErrorCode::kOutOfMemory,
                        "{}: out of memory for the activations of {} tokens in one forward pass; use a "
                        "smaller prefill chunk or KV budget",
                        be_.name(), n);
  be_.embedding(w_.embed, ids.data(), static_cast<int>(n), h.view());

  auto as2d = [](Tensor& t, int64_t cols) {
    TensorView v = t.view();
    v.shape = {t.dim(0), cols};
    v.strides.clear();
    return v;
  };

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    if (hook_) hook_(hook_ctx_, l, h.view());
    be_.rms_norm(h.view(), lw.attn_norm, static_cast<float>(c.rms_norm_eps), xn.view());

    TensorView q2 = as2d(q, qw), kb2 = as2d(k_base, kvw);
    be_.matmul(xn.view(), lw.wq, opt(lw.bq), q2);
    apply_lora(be_, l, LoraTarget::kQ, xn.view(), &q2, segs, nullptr, stats_);
    be_.matmul(xn.view(), lw.wk, opt(lw.bk), kb2);
    be_.matmul(xn.view(), lw.wv, opt(lw.bv), v_base.view());

    // Full K/V = base + LoRA delta, only when some binding stores full entries (the base modes
    // keep just the LR rows x·A, so the expand, copies and RoPE of full K would be wasted).
    Tensor k_full, v_full;  // [N, kv_heads, hd], [N, kv_heads*hd]
    std::vector<Tensor> lr_k, lr_v;  // per segment [n_rows, rank] or empty
    if (need_full) {
      k_full = be_.alloc(DType::kF32, {n, c.num_kv_heads, hd});
      v_full = be_.alloc(DType::kF32, {n, kvw});
      be_.copy(k_base.view(), k_full.view());
      be_.copy(v_base.view(), v_full.view());
      TensorView kf2 = as2d(k_full, kvw);
      apply_lora(be_, l, LoraTarget::kK, xn.view(), &kf2, segs, &lr_k, stats_);
      apply_lora(be_, l, LoraTarget::kV, xn.view(), &v_full.view(), segs, &lr_v, stats_);
    } else {
      apply_lora(be_, l, LoraTarget::kK, xn.view(), nullptr, segs, &lr_k, stats_);
      apply_lora(be_, l, LoraTarget::kV, xn.view(), nullptr, segs, &lr_v, stats_);
    }

    be_.rope(q.view(), pos.data(), inv_freq_.data());
    be_.rope(k_base.view(), pos.data(), inv_freq_.data());
    if (need_full) be_.rope(k_full.view(), pos.data(), inv_freq_.data());

    for (size_t s = 0; s < batch.size(); ++s) {
      const SeqInput& in = batch[s];
      const LoraSegment& sg = segs[s];
      LayerKvRows rows;
      rows.layer = l;
      rows.start_pos = in.start_pos;
      rows.n = sg.n_rows;
      rows.k_base = k_base.f32() + sg.row_begin * kvw;
      rows.v_base = v_base.f32() + sg.row_begin * kvw;
      if (need_full) {
        rows.k_full = k_full.f32() + sg.row_begin * kvw;
        rows.v_full = v_full.f32() + sg.row_begin * kvw;
      }
      if (lr_k[s].view().data) { rows.lr_k = lr_k[s].f32(); rows.rank_k = static_cast<int>(lr_k[s].dim(1)); }
      if (lr_v[s].view().data) { rows.lr_v = lr_v[s].f32(); rows.rank_v = static_cast<int>(lr_v[s].dim(1)); }
      in.kv->write(be_, rows);

      AttentionParams p;
      p.n_heads = c.num_heads;
      p.n_kv_heads = c.num_kv_heads;
      p.head_dim = static_cast<int>(hd);
      p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd));
      p.n_q = static_cast<int>(sg.n_rows);
      p.q = q.f32() + sg.row_begin * qw;
      p.q_pos = pos.data() + sg.row_begin;
      p.inv_freq = inv_freq_.data();
      p.out = attn.f32() + sg.row_begin * qw;
      in.kv->attention_views(l, p);
      be_.attention(p);
    }

    // h += attn · W_o (+ LoRA o): xn is free again, use it for the projection.
    be_.matmul(attn.view(), lw.wo, nullptr, xn.view());
    apply_lora(be_, l, LoraTarget::kO, attn.view(), &xn.view(), segs, nullptr, stats_);
    be_.add(h.view(), xn.view());

    be_.rms_norm(h.view(), lw.mlp_norm, static_cast<float>(c.rms_norm_eps), xn.view());
    be_.matmul(xn.view(), lw.w_gate, nullptr, gate.view());
    apply_lora(be_, l, LoraTarget::kGate, xn.view(), &gate.view(), segs, nullptr, stats_);
    be_.matmul(xn.view(), lw.w_up, nullptr, up.view());
    apply_lora(be_, l, LoraTarget::kUp, xn.view(), &up.view(), segs, nullptr, stats_);
    be_.silu_mul(gate.view(), up.view(), gate.view());
    be_.matmul(gate.view(), lw.w_down, nullptr, xn.view());
    apply_lora(be_, l, LoraTarget::kDown, gate.view(), &xn.view(), segs, nullptr, stats_);
    be_.add(h.view(), xn.view());
  }
  if (hook_) hook_(hook_ctx_, c.num_layers, h.view());

  // Logits only for the rows that need them.
  std::vector<int32_t> out_rows;  // [n_out] batch rows whose logits are wanted
  for (size_t s = 0; s < batch.size(); ++s) {
    const int64_t first = batch[s].all_logits ? 0 : segs[s].n_rows - 1;
    for (int64_t r = first; r < segs[s].n_rows; ++r) out_rows.push_back(static_cast<int32_t>(segs[s].row_begin + r));
  }
  Tensor sel = be_.alloc(DType::kF32, {n_out, hid});  // [n_out, hidden]
  be_.gather_rows(h.view(), out_rows.data(), n_out, sel.view());
  Tensor seln = be_.alloc(DType::kF32, {n_out, hid});
  be_.rms_norm(sel.view(), w_.final_norm, static_cast<float>(c.rms_norm_eps), seln.view());
  Tensor logits = be_.alloc(DType::kF32, {n_out, c.vocab_size});  // [n_out, vocab]
  be_.matmul(seln.view(), w_.lm_head, nullptr, logits.view());
  if (be_.device() != Device::kCpu) return be_.to_host(logits.view());
  return logits;
}

}  // namespace lragent
