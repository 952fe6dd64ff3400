// The forward pass of LlamaModel: one batch of sequences, each with its own positions,
// KV binding and adapter.
#include <algorithm>
#include <cmath>

#include "model/llama.h"
#include "model/lora_apply.h"

namespace lragent {
namespace {

const TensorView* opt(const TensorView& b) { return b.data ? &b : nullptr; }


}  // namespace

Result<Tensor> LlamaModel::forward(const std::vector<SeqInput>& batch, const AdapterRegistry* /*registry*/) {
  auto r = run_pass(batch, nullptr);
  // A device op that failed mid-pass (ops cannot return errors; see Backend::take_error).
  LRA_RETURN_IF_ERROR(be_.take_error());
  return r;
}

Result<std::vector<int32_t>> LlamaModel::forward_argmax(const std::vector<SeqInput>& batch) {
  std::vector<int32_t> ids;
  auto r = run_pass(batch, &ids);
  LRA_RETURN_IF_ERROR(be_.take_error());
  if (!r.ok()) return r.error();
  return ids;
}

Status LlamaModel::forward_kv(const std::vector<SeqInput>& batch, int n_layers) {
  if (n_layers < 1 || n_layers > cfg_.num_layers)
    return make_error(ErrorCode::kInternal, "forward_kv: {} layers asked of a model with {}", n_layers, cfg_.num_layers);
  auto r = run_pass(batch, nullptr, {}, false, n_layers);
  LRA_RETURN_IF_ERROR(be_.take_error());
  return r.ok() ? Status::Ok() : Status(r.error());
}

namespace {
// Logits rows a batch yields (every row of an all_logits sequence, else its last), which must be
// the number of sampling rows given.
Result<size_t> sampled_rows(const char* what, const std::vector<SeqInput>& batch, std::span<const RowSampling> rows) {
  size_t n_out = 0;
  for (const SeqInput& in : batch) n_out += in.all_logits ? static_cast<size_t>(std::max(in.n_tokens, 0)) : 1;
  if (rows.size() != n_out)
    return make_error(ErrorCode::kInvalidArgument, "{}: {} sampling rows given for a batch that yields {} logits rows",
                      what, rows.size(), n_out);
  return n_out;
}
}  // namespace

Result<std::vector<int32_t>> LlamaModel::forward_sample(const std::vector<SeqInput>& batch,
                                                        std::span<const RowSampling> rows) {
  LRA_RETURN_IF_ERROR(sampled_rows("forward_sample", batch, rows));
  std::vector<int32_t> ids;
  auto r = run_pass(batch, &ids, rows);
  LRA_RETURN_IF_ERROR(be_.take_error());
  if (!r.ok()) return r.error();
  return ids;
}

Status LlamaModel::launch_sample(const std::vector<SeqInput>& batch, std::span<const RowSampling> rows) {
  LRA_ASSIGN_OR_RETURN(const size_t n_out, sampled_rows("launch_sample", batch, rows));
  if (deferred_rows_.size() >= Backend::kMaxDeferredPicks)
    return make_error(ErrorCode::kInternal, "launch_sample: {} passes already wait for take_picks",
                      deferred_rows_.size());
  std::vector<int32_t> none;
  auto r = run_pass(batch, &none, rows, /*deferred=*/true);
  LRA_RETURN_IF_ERROR(be_.take_error());
  if (!r.ok()) return r.error();
  deferred_rows_.push_back(static_cast<int64_t>(n_out));
  return Status::Ok();
}

Result<std::vector<int32_t>> LlamaModel::take_picks() {
  if (deferred_rows_.empty()) return make_error(ErrorCode::kInternal, "take_picks: no launched pass waits");
  std::vector<int32_t> ids(static_cast<size_t>(deferred_rows_.front()));
  deferred_rows_.pop_front();
  be_.take_picks(ids.data(), static_cast<int64_t>(ids.size()));
  LRA_RETURN_IF_ERROR(be_.take_error());
  return ids;
}

void LlamaModel::discard_picks() {
  while (!deferred_rows_.empty()) (void)take_picks();
}

namespace {
// The sequences a pass runs: `given`, with each ICaRus sequence (SeqInput::decoder) split into its
// encoder part (the base model over its new tokens: stores entries, yields no logits) and its
// decoder part (the adapter over the rows whose logits are wanted: reads the entries only).
// kv_only passes (entries alone) run no decoder part. A batch without decoders is `given` itself
// (every pass goes through here: no copy then).
struct PassSeqs {
  const std::vector<SeqInput>* seqs = nullptr;  // `given` or `split`
  std::vector<SeqInput> split;
  std::vector<char> stores;  // [split] whether its rows' entries are written (empty: every sequence's)
  std::vector<char> yields;  // [split] whether it gives logits rows (all_logits: each row; else its last)
  bool stores_at(size_t s) const { return stores.empty() || stores[s]; }
  bool yields_at(size_t s) const { return yields.empty() || yields[s]; }
};
void split_icarus(const std::vector<SeqInput>& given, bool kv_only, PassSeqs& out) {
  out.seqs = &given;
  if (std::none_of(given.begin(), given.end(), [](const SeqInput& in) { return in.decoder != nullptr; })) return;
  for (const SeqInput& in : given) {
    if (!in.decoder) {
      out.split.push_back(in);
      out.stores.push_back(1);
      out.yields.push_back(1);
      continue;
    }
    SeqInput enc = in;
    enc.decoder = nullptr;
    enc.all_logits = false;
    out.split.push_back(enc);
    out.stores.push_back(1);
    out.yields.push_back(0);
    if (kv_only) continue;
    SeqInput dec = in;
    dec.decoder = nullptr;
    dec.adapter = in.decoder;
    const int skip = in.all_logits ? 0 : in.n_tokens - 1;  // the decoder's rows: all, or the last
    dec.n_tokens = in.n_tokens - skip;
    dec.start_pos = in.start_pos + skip;
    if (in.feed_row < 0) dec.tokens = in.tokens + skip;
    out.split.push_back(dec);
    out.stores.push_back(0);
    out.yields.push_back(1);
  }
  out.seqs = &out.split;
}
}  // namespace

Result<Tensor> LlamaModel::run_pass(const std::vector<SeqInput>& given, std::vector<int32_t>* picks,
                                    std::span<const RowSampling> rows, bool deferred, int kv_layers) {
  LRA_RETURN_IF_ERROR(validate_batch(given));
  PassSeqs parts;
  split_icarus(given, kv_layers >= 0, parts);
  const std::vector<SeqInput>& batch = *parts.seqs;
  const ModelConfig& c = cfg_;
  const int64_t hid = c.hidden_size, hd = c.head_dim;
  const int64_t qw = static_cast<int64_t>(c.num_heads) * hd, kvw = static_cast<int64_t>(c.num_kv_heads) * hd;

  // Flatten the batch: rows of sequence s are [segs[s].row_begin, + n_tokens).
  std::vector<LoraSegment> segs;
  std::vector<int32_t> ids, pos, feed;  // [N]; feed: the previous pass's pick row, or -1
  bool any_fed = false;
  int64_t n_out = 0;
  for (const SeqInput& in : batch) {
    segs.push_back({static_cast<int64_t>(ids.size()), in.n_tokens, in.adapter});
    any_fed = any_fed || in.feed_row >= 0;
    for (int i = 0; i < in.n_tokens; ++i) {
      ids.push_back(in.feed_row >= 0 ? 0 : in.tokens[i]);
      feed.push_back(in.feed_row);
      pos.push_back(static_cast<int32_t>(in.start_pos + i));
    }
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqInput& in = batch[s];
    if (parts.yields_at(s)) n_out += in.all_logits ? in.n_tokens : 1;
    if (parts.stores_at(s)) LRA_RETURN_IF_ERROR(in.kv->reserve(in.start_pos + in.n_tokens));
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  // Every tensor below dies before the scope ends (the CUDA backend may replay this pass as a graph).
  PassScope pass(be_, n, static_cast<int64_t>(batch.size()));
  // Without LoRA terms or a hidden-state hook, normalised and SwiGLU activations feed only GEMMs.
  bool any_adapter = false;
  for (const LoraSegment& sg : segs) any_adapter = any_adapter || sg.adapter != nullptr;
  struct MatmulOnly {
    Backend& be;
    explicit MatmulOnly(Backend& b, bool on) : be(b) { be.set_matmul_only_outputs(on); }
    ~MatmulOnly() { be.set_matmul_only_outputs(false); }
  } matmul_only(be_, !any_adapter && hook_ == nullptr);
  // Whether some sequence's adapter adapts `target` in layer l; with storing_only, some sequence
  // that stores entries (an ICaRus decoder's part does not: its K/V terms would go unread).
  auto adapts = [&](int l, LoraTarget target, bool storing_only = false) {
    for (size_t s = 0; s < segs.size(); ++s) {
      const LoraSegment& sg = segs[s];
      if ((!storing_only || parts.stores_at(s)) && sg.adapter &&
          sg.adapter->layers[static_cast<size_t>(l)][static_cast<size_t>(target)].has_value())
        return true;
    }
    return false;
  };
  bool need_full = false;
  for (const SeqInput& in : batch) need_full = need_full || in.kv->wants_full();
  // Per sequence: whether its K and V rows go unread (it stores no entries), so no K/V LoRA term
  // runs for it; empty when all store.
  std::vector<char> kv_unused;
  if (!parts.stores.empty())
    for (size_t s = 0; s < batch.size(); ++s) kv_unused.push_back(parts.stores_at(s) ? 0 : 1);

  Tensor h = be_.alloc(DType::kF32, {n, hid});          // [N, hidden] residual stream
  Tensor xn = be_.alloc(DType::kF32, {n, hid});         // [N, hidden] normed
  Tensor q = be_.alloc(DType::kF32, {n, c.num_heads, hd});       // [N, heads, hd]
  Tensor k_base = be_.alloc(DType::kF32, {n, c.num_kv_heads, hd});  // [N, kv_heads, hd]
  Tensor v_base = be_.alloc(DType::kF32, {n, kvw});     // [N, kv_heads*hd]
  Tensor attn = be_.alloc(DType::kF32, {n, qw});        // [N, heads*hd]
  Tensor gate = be_.alloc(DType::kF32, {n, c.intermediate_size});  // [N, inter]
  Tensor up = be_.alloc(DType::kF32, {n, c.intermediate_size});    // [N, inter]
  // A backend's alloc gives a tensor without data when memory runs out: every one is checked.
  auto out_of_memory = [&] {
    return make_error(ErrorCode::kOutOfMemory,
                      "{}: out of memory for the activations of {} tokens in one forward pass; use a "
                      "smaller prefill chunk or KV budget",
                      be_.name(), n);
  };
  for (const Tensor* t : {&h, &xn, &q, &k_base, &v_base, &attn, &gate, &up})
    if (!t->view().data) return out_of_memory();
  if (any_fed)
    be_.embedding_fed(w_.embed, ids.data(), feed.data(), static_cast<int>(n), h.view());
  else
    be_.embedding(w_.embed, ids.data(), static_cast<int>(n), h.view());

  auto as2d = [](Tensor& t, int64_t cols) {
    TensorView v = t.view();
    v.shape = {t.dim(0), cols};
    v.strides.clear();
    return v;
  };

  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool kv_only = kv_layers >= 0;
  const int n_layers = kv_only ? kv_layers : c.num_layers;
  // Decode-sized passes on a backend whose products fold RMSNorm in (folds_rms_norm): the q/k/v
  // and gate/up stages read h through the norm (their LoRA shrinks with them), and the o and down
  // projections add into h (beta = 1; with a LoRA term there, into xn, then one add), so a layer
  // runs no norm kernel. Otherwise xn = attn_norm(h) enters every layer (the previous layer's
  // add_rms_norm) and each stage reads xn.
  const bool fold = be_.folds_rms_norm(n);
  if (c.num_layers > 0 && !fold) be_.rms_norm(h.view(), w_.layers[0].attn_norm, eps, xn.view());
  // h += x · w (+ bias, + the target's LoRA term): straight into h when no adapter of the batch
  // adapts the target, else into xn and then one add.
  auto add_projection = [&](int l, LoraTarget t, const TensorView& x, const TensorView& w, const TensorView* bias,
                            std::vector<Tensor>& keep) -> Status {
    if (!adapts(l, t)) {
      be_.matmul(x, w, bias, h.view(), 1.f, 1.f);
      return Status::Ok();
    }
    const Backend::MatmulOut o[] = {{&w, bias, &xn.view()}};
    const LoraTargetOut lora[] = {{t, &xn.view()}};
    LRA_RETURN_IF_ERROR(project_with_lora(be_, l, x, o, lora, segs, keep, stats_));
    be_.add(h.view(), xn.view());
    return Status::Ok();
  };
  std::vector<AttentionParams> attn_ps;  // [batch] this layer's attention of every sequence
  attn_ps.reserve(batch.size());
  for (int l = 0; l < n_layers; ++l) {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    // forward_kv's last layer: its entries are all the pass wants; its attention and MLP would
    // only feed layers that are not run.
    const bool entries_only = kv_only && l + 1 == n_layers;
    // h is the residual stream entering layer l; unless the pass folds norms, xn = attn_norm(h)
    // (the previous layer's last op).
    if (hook_) hook_(hook_ctx_, l, h.view());

    const NormedInput attn_in{&h.view(), &lw.attn_norm, eps}, mlp_in{&h.view(), &lw.mlp_norm, eps};

    TensorView q2 = as2d(q, qw), kb2 = as2d(k_base, kvw);
    // Full K/V = base + LoRA delta, only when some binding stores full entries (the base modes
    // keep just the LR rows x·A, so the expand, copies and RoPE of full K would be wasted), and
    // only when the adapter of some sequence that stores adapts k (v): otherwise the full entries
    // are the base ones.
    const bool own_k_full = need_full && adapts(l, LoraTarget::kK, true);
    const bool own_v_full = need_full && adapts(l, LoraTarget::kV, true);
    Tensor k_full, v_full;  // [N, kv_heads, hd], [N, kv_heads*hd] when own_*_full
    if (own_k_full) k_full = be_.alloc(DType::kF32, {n, c.num_kv_heads, hd});
    if (own_v_full) v_full = be_.alloc(DType::kF32, {n, kvw});
    if ((own_k_full && !k_full.view().data) || (own_v_full && !v_full.view().data)) return out_of_memory();
    TensorView kf2 = own_k_full ? as2d(k_full, kvw) : TensorView{};
    std::vector<Tensor> lr_keep;     // this layer's x·A tensors: alive until its KV write
    std::vector<TensorView> lr_k, lr_v;  // per segment [n_rows, rank] or no data
    std::vector<Backend::LoraExpandJob> q_lora;  // q's LoRA expands, applied by the RoPE op
    {
      const Backend::MatmulOut qkv[] = {{&lw.wq, opt(lw.bq), &q2}, {&lw.wk, opt(lw.bk), &kb2},
                                        {&lw.wv, opt(lw.bv), &v_base.view()}};
      // q's expands are handed to the op that reads q next: the RoPE, or Qwen3's q/k norm.
      const std::vector<char>* unused = kv_unused.empty() ? nullptr : &kv_unused;
      const LoraTargetOut lora[] = {
          {LoraTarget::kQ, &q2, nullptr, nullptr, &q_lora},
          {LoraTarget::kK, own_k_full ? &kf2 : nullptr, own_k_full ? &kb2 : nullptr, &lr_k, nullptr, unused},
          {LoraTarget::kV, own_v_full ? &v_full.view() : nullptr, own_v_full ? &v_base.view() : nullptr, &lr_v, nullptr,
           unused}};
      LRA_RETURN_IF_ERROR(
          project_with_lora(be_, l, xn.view(), qkv, lora, segs, lr_keep, stats_, fold ? &attn_in : nullptr));
    }

    if (c.qk_norm) {  // Qwen3: per-head RMSNorm of q (with its LoRA term) and of every K before RoPE
      be_.qk_rms_norm(q.view(), lw.q_norm, k_base.view(), lw.k_norm, eps, q_lora);
      q_lora.clear();
      if (own_k_full) be_.head_rms_norm(k_full.view(), lw.k_norm, eps);
    }
    be_.rope_pair_lora(q.view(), k_base.view(), pos.data(), inv_freq_.data(), q_lora);
    if (own_k_full) be_.rope(k_full.view(), pos.data(), inv_freq_.data());

    // Every sequence's entries, then every sequence's attention in one call (the backend may
    // batch sequences of different trajectories and adapters into one launch).
    attn_ps.clear();
    be_.begin_store_batch();  // every sequence's stores in one launch (the caches are read below)
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
        rows.k_full = (own_k_full ? k_full : k_base).f32() + sg.row_begin * kvw;
        rows.v_full = (own_v_full ? v_full : v_base).f32() + sg.row_begin * kvw;
      }
      if (lr_k[s].data) { rows.lr_k = lr_k[s].f32(); rows.rank_k = static_cast<int>(lr_k[s].dim(1)); }
      if (lr_v[s].data) { rows.lr_v = lr_v[s].f32(); rows.rank_v = static_cast<int>(lr_v[s].dim(1)); }
      if (parts.stores_at(s)) in.kv->write(be_, rows);
      if (entries_only) continue;

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
      attn_ps.push_back(p);
    }
    be_.end_store_batch();
    if (entries_only) break;
    be_.attention_batch(attn_ps);

    if (fold) {
      // h += attn · W_o (+ LoRA o), gate = silu(norm(h) · W_gate) * (norm(h) · W_up) (+ LoRA),
      // h += gate · W_down (+ LoRA down).
      LRA_RETURN_IF_ERROR(add_projection(l, LoraTarget::kO, attn.view(), lw.wo, opt(lw.bo), lr_keep));
      if (!adapts(l, LoraTarget::kGate) && !adapts(l, LoraTarget::kUp)) {
        be_.rms_norm_matmul_swiglu(h.view(), lw.mlp_norm, eps, xn.view(), lw.w_gate, lw.w_up, gate.view(),
                                   up.view());
      } else {
        const Backend::MatmulOut gate_up[] = {{&lw.w_gate, nullptr, &gate.view()}, {&lw.w_up, nullptr, &up.view()}};
        const LoraTargetOut lora[] = {{LoraTarget::kGate, &gate.view()}, {LoraTarget::kUp, &up.view()}};
        LRA_RETURN_IF_ERROR(project_with_lora(be_, l, xn.view(), gate_up, lora, segs, lr_keep, stats_, &mlp_in));
        be_.silu_mul(gate.view(), up.view(), gate.view());
      }
      LRA_RETURN_IF_ERROR(add_projection(l, LoraTarget::kDown, gate.view(), lw.w_down, nullptr, lr_keep));
      continue;
    }
    // h += attn · W_o (+ LoRA o): xn is free again, use it for the projection.
    {
      const Backend::MatmulOut o[] = {{&lw.wo, opt(lw.bo), &xn.view()}};
      const LoraTargetOut lora[] = {{LoraTarget::kO, &xn.view()}};
      LRA_RETURN_IF_ERROR(project_with_lora(be_, l, attn.view(), o, lora, segs, lr_keep, stats_));
    }
    be_.add_rms_norm(h.view(), xn.view(), lw.mlp_norm, eps, xn.view());  // h += o; xn = mlp_norm(h)

    if (!adapts(l, LoraTarget::kGate) && !adapts(l, LoraTarget::kUp)) {
      // gate = silu(xn · W_gate) * (xn · W_up): one kernel on a backend that fuses it.
      be_.matmul_swiglu(xn.view(), lw.w_gate, lw.w_up, gate.view(), up.view());
    } else {
      const Backend::MatmulOut gate_up[] = {{&lw.w_gate, nullptr, &gate.view()}, {&lw.w_up, nullptr, &up.view()}};
      const LoraTargetOut lora[] = {{LoraTarget::kGate, &gate.view()}, {LoraTarget::kUp, &up.view()}};
      LRA_RETURN_IF_ERROR(project_with_lora(be_, l, xn.view(), gate_up, lora, segs, lr_keep, stats_));
      be_.silu_mul(gate.view(), up.view(), gate.view());
    }
    {
      const Backend::MatmulOut down[] = {{&lw.w_down, nullptr, &xn.view()}};
      const LoraTargetOut lora[] = {{LoraTarget::kDown, &xn.view()}};
      LRA_RETURN_IF_ERROR(project_with_lora(be_, l, gate.view(), down, lora, segs, lr_keep, stats_));
    }
    if (l + 1 < c.num_layers)  // h += mlp; xn = the next layer's attn_norm(h)
      be_.add_rms_norm(h.view(), xn.view(), w_.layers[static_cast<size_t>(l) + 1].attn_norm, eps, xn.view());
    else
      be_.add(h.view(), xn.view());
  }
  if (kv_only) return Tensor();
  if (hook_) hook_(hook_ctx_, c.num_layers, h.view());

  // Logits only for the rows that need them.
  std::vector<int32_t> out_rows;  // [n_out] batch rows whose logits are wanted
  for (size_t s = 0; s < batch.size(); ++s) {
    if (!parts.yields_at(s)) continue;
    const int64_t first = batch[s].all_logits ? 0 : segs[s].n_rows - 1;
    for (int64_t r = first; r < segs[s].n_rows; ++r) out_rows.push_back(static_cast<int32_t>(segs[s].row_begin + r));
  }
  Tensor sel = be_.alloc(DType::kF32, {n_out, hid});               // [n_out, hidden]
  Tensor seln = be_.alloc(DType::kF32, {n_out, hid});              // [n_out, hidden]
  Tensor logits = be_.alloc(DType::kF32, {n_out, c.vocab_size});  // [n_out, vocab]
  if (!sel.view().data || !seln.view().data || !logits.view().data) return out_of_memory();
  if (fold && n_out == n) {
    // Every row's logits (a decode step): no gather, and the final norm folded into lm_head.
    const Backend::MatmulOut head[] = {{&w_.lm_head, nullptr, &logits.view()}};
    be_.rms_norm_matmul_group(h.view(), w_.final_norm, eps, seln.view(), head);
  } else {
    be_.gather_rows(h.view(), out_rows.data(), n_out, sel.view());
    be_.rms_norm(sel.view(), w_.final_norm, eps, seln.view());
    be_.matmul(seln.view(), w_.lm_head, nullptr, logits.view());
  }
  if (picks && deferred) {
    if (rows.empty()) {
      const std::vector<RowSampling> greedy(static_cast<size_t>(n_out));
      be_.sample_rows_deferred(logits.view(), greedy);
    } else {
      be_.sample_rows_deferred(logits.view(), rows);
    }
    return Tensor();
  }
  if (picks) {
    picks->resize(static_cast<size_t>(n_out));
    if (rows.empty())
      be_.argmax_rows(logits.view(), picks->data());
    else
      be_.sample_rows(logits.view(), rows, picks->data());
    return Tensor();
  }
  if (be_.device() != Device::kCpu) return be_.to_host(logits.view());
  return logits;
}

}  // namespace lragent
