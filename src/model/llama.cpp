#include "model/llama.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "model/rope.h"

namespace lragent {
namespace {

// A weight of the expected shape in a float dtype the backends compute with: any other
// safetensors dtype (integers, F64) is refused here rather than read as floats by a kernel.
Result<TensorView> load_tensor(const WeightStore& st, const std::string& name, std::vector<int64_t> shape) {
  LRA_ASSIGN_OR_RETURN(TensorView v, st.get(name, shape));
  if (v.dtype != DType::kF32 && v.dtype != DType::kF16 && v.dtype != DType::kBF16)
    return make_error(ErrorCode::kUnsupported,
                      "tensor {} in {} is {}; model weights must be F32, F16 or BF16 (quantized and F64 checkpoints "
                      "are not supported: convert it, e.g. with torch's .to(torch.bfloat16))",
                      name, st.source(), dtype_name(v.dtype));
  return v;
}

Result<ModelWeights> bind_weights(const ModelConfig& c, const WeightStore& st) {
  ModelWeights w;
  const int64_t h = c.hidden_size, q = static_cast<int64_t>(c.num_heads) * c.head_dim,
                kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  std::set<std::string> used;  // every tensor the model reads; any other is an error below
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    used.insert(name);
    return load_tensor(st, name, std::move(shape));
  };
  // Tied checkpoints store the shared matrix once, under either name (torch drops the alias).
  const bool tied_alias = c.tie_word_embeddings && !st.has("model.embed_tokens.weight") && st.has("lm_head.weight");
  LRA_ASSIGN_OR_RETURN(w.embed, take(tied_alias ? "lm_head.weight" : "model.embed_tokens.weight", {c.vocab_size, h}));
  LRA_ASSIGN_OR_RETURN(w.final_norm, take("model.norm.weight", {h}));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
    used.insert("lm_head.weight");  // a tied checkpoint may keep the alias too; HF ties it away
  } else {
    LRA_ASSIGN_OR_RETURN(w.lm_head, take("lm_head.weight", {c.vocab_size, h}));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights lw;
    LRA_ASSIGN_OR_RETURN(lw.attn_norm, take(p + "input_layernorm.weight", {h}));
    LRA_ASSIGN_OR_RETURN(lw.wq, take(p + "self_attn.q_proj.weight", {q, h}));
    LRA_ASSIGN_OR_RETURN(lw.wk, take(p + "self_attn.k_proj.weight", {kv, h}));
    LRA_ASSIGN_OR_RETURN(lw.wv, take(p + "self_attn.v_proj.weight", {kv, h}));
    LRA_ASSIGN_OR_RETURN(lw.wo, take(p + "self_attn.o_proj.weight", {h, q}));
    if (c.attention_bias) {
      LRA_ASSIGN_OR_RETURN(lw.bq, take(p + "self_attn.q_proj.bias", {q}));
      LRA_ASSIGN_OR_RETURN(lw.bk, take(p + "self_attn.k_proj.bias", {kv}));
      LRA_ASSIGN_OR_RETURN(lw.bv, take(p + "self_attn.v_proj.bias", {kv}));
      // Llama's and Qwen3's attention_bias covers o_proj too; Qwen2's o_proj has none.
      if (c.architecture != "Qwen2ForCausalLM") {
        LRA_ASSIGN_OR_RETURN(lw.bo, take(p + "self_attn.o_proj.bias", {h}));
      }
    }
    if (c.qk_norm) {
      LRA_ASSIGN_OR_RETURN(lw.q_norm, take(p + "self_attn.q_norm.weight", {c.head_dim}));
      LRA_ASSIGN_OR_RETURN(lw.k_norm, take(p + "self_attn.k_norm.weight", {c.head_dim}));
    }
    LRA_ASSIGN_OR_RETURN(lw.mlp_norm, take(p + "post_attention_layernorm.weight", {h}));
    LRA_ASSIGN_OR_RETURN(lw.w_gate, take(p + "mlp.gate_proj.weight", {inter, h}));
    LRA_ASSIGN_OR_RETURN(lw.w_up, take(p + "mlp.up_proj.weight", {inter, h}));
    LRA_ASSIGN_OR_RETURN(lw.w_down, take(p + "mlp.down_proj.weight", {h, inter}));
    w.layers.push_back(std::move(lw));
  }
  // A tensor the model does not read is a part of the checkpoint's model that this one lacks
  // (a bias, a norm, another architecture's module): computing without it would silently give
  // other outputs than the model's own code. Old checkpoints' RoPE tables are recomputed.
  std::vector<std::string> unused;
  for (const std::string& name : st.names())
    if (!used.count(name) && !name.ends_with("rotary_emb.inv_freq")) unused.push_back(name);
  if (!unused.empty()) {
    const size_t shown = std::min<size_t>(unused.size(), 3);
    return make_error(ErrorCode::kUnsupported,
                      "{} holds {} tensor{} this {} model does not use ({}{}): the checkpoint's architecture has "
                      "parts this engine does not compute; check config.json (architectures, attention_bias, "
                      "mlp_bias) or convert the checkpoint",
                      st.source(), unused.size(), unused.size() == 1 ? "" : "s", c.architecture,
                      fmt::join(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                      unused.size() > shown ? ", ..." : "");
  }
  return w;
}

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& dir, Backend& backend,
                                                     const LoadProgress& progress) {
  LRA_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  LRA_ASSIGN_OR_RETURN(auto store, WeightStore::open_dir(dir));
  LRA_ASSIGN_OR_RETURN(ModelWeights w, bind_weights(cfg, *store));
  std::unique_ptr<LlamaModel> m(new LlamaModel(std::move(cfg), backend));
  m->w_ = std::move(w);
  m->store_ = std::move(store);
  m->inv_freq_ = rope_inv_freq(m->cfg_);
  m->source_ = dir;
  LRA_RETURN_IF_ERROR(m->place_weights(progress));
  return m;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_weights(ModelConfig cfg, ModelWeights weights,
                                                             std::vector<Tensor> owned, Backend& backend) {
  LRA_RETURN_IF_ERROR(cfg.validate("<synthetic>"));
  std::unique_ptr<LlamaModel> m(new LlamaModel(std::move(cfg), backend));
  m->w_ = std::move(weights);
  m->owned_ = std::move(owned);
  m->inv_freq_ = rope_inv_freq(m->cfg_);
  m->source_ = "<synthetic>";
  LRA_RETURN_IF_ERROR(m->place_weights());
  return m;
}

Status LlamaModel::place_weights(const LoadProgress& progress) {
  const bool tied = w_.lm_head.data == w_.embed.data;
  // Every tensor once (a tied lm_head is the embedding), matrices flagged: they go to the
  // backend's weight dtype; norms and biases stay f32 (tiny, and exact).
  std::vector<std::pair<TensorView*, bool>> all = {{&w_.embed, true}, {&w_.final_norm, false}};
  if (!tied) all.push_back({&w_.lm_head, true});
  for (LayerWeights& lw : w_.layers) {
    for (TensorView* v : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) all.push_back({v, true});
    for (TensorView* v : {&lw.attn_norm, &lw.mlp_norm, &lw.bq, &lw.bk, &lw.bv, &lw.bo, &lw.q_norm, &lw.k_norm})
      all.push_back({v, false});
  }
  int64_t total = 0, done = 0;
  for (const auto& [v, matrix] : all)
    if (v->data) total += static_cast<int64_t>(v->nbytes());
  if (be_.device() == Device::kCpu) {
    if (progress) progress(total, total);
    return Status::Ok();
  }
  int64_t missing = 0;  // bytes that found no device memory
  for (auto& [v, matrix] : all) {
    if (!v->data) continue;
    done += static_cast<int64_t>(v->nbytes());
    if (v->device != be_.device()) {
      Tensor t = be_.upload(*v, matrix ? be_.weight_dtype() : DType::kF32);
      if (!t.view().data) {
        missing += static_cast<int64_t>(v->nbytes());
      } else {
        *v = t.view();
        owned_.push_back(std::move(t));
      }
    }
    if (progress) progress(done, total);
  }
  if (tied) w_.lm_head = w_.embed;
  if (missing > 0) {
    (void)be_.take_error();
    return make_error(ErrorCode::kOutOfMemory,
                      "{}: out of device memory for the model's weights ({:.2f} GiB did not fit); use a GPU with "
                      "more memory or a smaller model",
                      be_.name(), static_cast<double>(missing) / (1 << 30));
  }
  LRA_RETURN_IF_ERROR(be_.take_error());
  // The host copies (mmap or synthetic host tensors) are no longer read.
  store_.reset();
  std::erase_if(owned_, [&](const Tensor& t) { return t.view().device == Device::kCpu; });
  return Status::Ok();
}

Status LlamaModel::validate_batch(const std::vector<SeqInput>& batch) const {
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqInput& in = batch[s];
    if (in.n_tokens <= 0) return make_error(ErrorCode::kInvalidArgument, "sequence {} has no new tokens", s);
    if (!in.kv) return make_error(ErrorCode::kInternal, "sequence {} has no KV binding", s);
    if (in.feed_row >= 0 && in.n_tokens != 1)
      return make_error(ErrorCode::kInvalidArgument, "sequence {}: a fed token (feed_row {}) comes alone, not with {} tokens",
                        s, in.feed_row, in.n_tokens);
    for (int i = 0; in.feed_row < 0 && i < in.n_tokens; ++i)
      if (in.tokens[i] < 0 || in.tokens[i] >= cfg_.vocab_size)
        return make_error(ErrorCode::kInvalidArgument, "token id {} is outside the vocabulary [0, {})",
                          in.tokens[i], cfg_.vocab_size);
    if (in.start_pos < 0)
      return make_error(ErrorCode::kInvalidArgument, "sequence {}: start position {} is negative", s, in.start_pos);
    if (in.decoder && in.adapter)
      return make_error(ErrorCode::kInternal, "sequence {}: an ICaRus decoder's entries come from the base model, not an adapter", s);
    const int64_t end = in.start_pos + in.n_tokens;
    if (cfg_.max_position_embeddings > 0 && end > cfg_.max_position_embeddings)
      return make_error(ErrorCode::kInvalidArgument,
                        "context of {} tokens exceeds the model's max_position_embeddings ({}{}); use a shorter "
                        "prompt or fewer generated tokens",
                        end, cfg_.max_position_embeddings,
                        cfg_.sliding_window > 0 ? ", its sliding_window: attention beyond the window is not supported"
                                                : "");
  }
  return Status::Ok();
}

}  // namespace lragent
