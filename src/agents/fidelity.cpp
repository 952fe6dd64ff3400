#include "agents/fidelity.h"

#include <algorithm>
#include <cmath>

#include "kv/full_cache.h"

namespace lragent {
namespace {

// Records every layer's cache material while acting as a private full cache.
class CaptureBinding final : public KvBinding {
 public:
  CaptureBinding(BlockPool* kv, int n_layers, int64_t width)
      : inner_(kv), width_(width), full_(n_layers), base_(n_layers), delta_(n_layers) {}
  Status reserve(int64_t total) override { return inner_.reserve(total); }
  void write(Backend& be, const LayerKvRows& r) override {
    inner_.write(be, r);
    const auto l = static_cast<size_t>(r.layer);
    for (int64_t i = 0; i < r.n * width_; ++i) {
      full_[l].push_back(r.k_full[i]);
      base_[l].push_back(r.k_base[i]);
      delta_[l].push_back(r.k_full[i] - r.k_base[i]);
    }
    for (int64_t i = 0; i < r.n * width_; ++i) {
      full_[l].push_back(r.v_full[i]);
      base_[l].push_back(r.v_base[i]);
      delta_[l].push_back(r.v_full[i] - r.v_base[i]);
    }
  }
  void attention_views(int layer, AttentionParams& p) const override { inner_.attention_views(layer, p); }

  FullKvCache inner_;
  int64_t width_;
  std::vector<std::vector<float>> full_, base_, delta_;  // [layer][tokens * (K then V) values]
};

struct HiddenCapture {
  std::vector<std::vector<float>> per_layer;  // [layer][tokens * hidden]
  static void hook(void* ctx, int layer, const TensorView& h) {
    auto* self = static_cast<HiddenCapture*>(ctx);
    if (static_cast<size_t>(layer) >= self->per_layer.size()) self->per_layer.resize(static_cast<size_t>(layer) + 1);
    self->per_layer[static_cast<size_t>(layer)].assign(h.f32(), h.f32() + h.numel());
  }
};

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return (na == 0 || nb == 0) ? 0.0 : dot / std::sqrt(na * nb);
}

// log-softmax of a logits row, in double.
std::vector<double> log_softmax(const std::vector<float>& row) {
  const double mx = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(x - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] - lse;
  return out;
}

Result<std::vector<LayerSimilarity>> layer_similarity(LlamaModel& model, const std::vector<int32_t>& traj,
                                                      const std::vector<const LoraAdapter*>& adapters, int page_size) {
  // The capture bindings and hooks read hidden states and cache rows in host memory.
  if (model.backend().device() != Device::kCpu)
    return make_error(ErrorCode::kUnsupported, "the fidelity tools run on the CPU backend; use --device cpu");
  const ModelConfig& c = model.config();
  const int64_t width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  // The pools must outlive the bindings that hold blocks in them.
  LRA_ASSIGN_OR_RETURN(KvPools pools, KvPools::create(c, page_size,
                                                      KvPools::blocks_for(static_cast<int64_t>(adapters.size()),
                                                                          static_cast<int64_t>(traj.size()), page_size),
                                                      "fidelity"));
  std::vector<std::unique_ptr<CaptureBinding>> caps;
  std::vector<HiddenCapture> hidden(adapters.size());
  for (size_t a = 0; a < adapters.size(); ++a) {
    caps.push_back(std::make_unique<CaptureBinding>(pools.kv.get(), c.num_layers, width));
    SeqInput in;
    in.tokens = traj.data();
    in.n_tokens = static_cast<int>(traj.size());
    in.kv = caps.back().get();
    in.adapter = adapters[a];
    model.set_hidden_hook(&HiddenCapture::hook, &hidden[a]);
    auto r = model.forward({in});
    model.set_hidden_hook(nullptr, nullptr);
    if (!r.ok()) return r.error();
  }
  std::vector<LayerSimilarity> out;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerSimilarity s;
    s.layer = l;
    int pairs = 0;
    const auto ul = static_cast<size_t>(l);
    for (size_t i = 0; i < adapters.size(); ++i)
      for (size_t j = i + 1; j < adapters.size(); ++j) {
        s.full += cosine(caps[i]->full_[ul], caps[j]->full_[ul]);
        s.base += cosine(caps[i]->base_[ul], caps[j]->base_[ul]);
        s.adapter += cosine(caps[i]->delta_[ul], caps[j]->delta_[ul]);
        s.hidden += cosine(hidden[i].per_layer[ul], hidden[j].per_layer[ul]);
        ++pairs;
      }
    if (pairs > 0) {
      s.full /= pairs;
      s.base /= pairs;
      s.adapter /= pairs;
      s.hidden /= pairs;
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

Result<std::pair<std::vector<ReplayStep>, std::vector<std::vector<float>>>> force_along_none(
    LlamaModel& model, const Tokenizer* tok, const std::vector<std::string>& names,
    const std::vector<const LoraAdapter*>& adapters, const std::vector<ReplayStep>& steps, int page_size) {
  const bool any_agent = std::any_of(steps.begin(), steps.end(), [](const ReplayStep& s) {
    return (s.kind == ReplayStep::Kind::kGenerate && s.generate > 0) ||
           (s.kind == ReplayStep::Kind::kForce && !s.tokens.empty());
  });
  if (!any_agent)
    return make_error(ErrorCode::kInvalidArgument,
                      "the script has no agent step that outputs a token (\"agent\" with \"generate\" > 0 or "
                      "\"force_tokens\"): nothing to compare between modes");
  ReplayOptions o;
  o.sharing.mode = ShareMode::kNone;
  o.sharing.page_size = page_size;
  o.keep_logits = true;
  LRA_ASSIGN_OR_RETURN(ReplayResult none, run_replay(model, tok, names, adapters, steps, o));
  std::vector<ReplayStep> forced;
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < steps.size(); ++i) {
    ReplayStep s = steps[i];
    if (s.kind == ReplayStep::Kind::kAppendText) {
      // run_replay above encoded the same text, so a tokenizer is there and cannot fail now.
      if (tok == nullptr) return make_error(ErrorCode::kInternal, "step {} appends text without a tokenizer", i);
      LRA_ASSIGN_OR_RETURN(s.tokens, tok->encode(s.text, false));
      s.kind = ReplayStep::Kind::kAppendTokens;
    } else if (s.kind == ReplayStep::Kind::kGenerate) {
      s.kind = ReplayStep::Kind::kForce;
      s.tokens = none.steps[i].output_tokens;
    }
    for (const auto& r : none.steps[i].logits) rows.push_back(r);
    forced.push_back(std::move(s));
  }
  return std::make_pair(std::move(forced), std::move(rows));
}

Result<ModeFidelity> compare_with_none(LlamaModel& model, const Tokenizer* tok, const std::vector<std::string>& names,
                                       const std::vector<const LoraAdapter*>& adapters,
                                       const std::vector<ReplayStep>& forced_steps,
                                       const std::vector<std::vector<float>>& none_rows, const SharingOptions& so) {
  ReplayOptions o;
  o.sharing = so;
  o.keep_logits = true;
  LRA_ASSIGN_OR_RETURN(ReplayResult r, run_replay(model, tok, names, adapters, forced_steps, o));
  ModeFidelity f;
  f.mode = so.mode;
  f.cache = r.cache;
  for (int64_t c : r.computed_per_agent) f.computed_tokens += c;
  for (int64_t c : r.partial_per_agent) f.partial_tokens += c;
  size_t k = 0;
  double agree = 0, kl = 0;
  for (const StepResult& s : r.steps)
    for (const auto& row : s.logits) {
      if (k >= none_rows.size()) return make_error(ErrorCode::kInternal, "fidelity: more rows than the none run");
      const auto& ref = none_rows[k++];
      const auto lp = log_softmax(ref), lq = log_softmax(row);
      double d = 0;
      for (size_t v = 0; v < lp.size(); ++v) d += std::exp(lp[v]) * (lp[v] - lq[v]);
      kl += d;
      agree += std::max_element(ref.begin(), ref.end()) - ref.begin() == std::max_element(row.begin(), row.end()) - row.begin();
    }
  f.positions = static_cast<int64_t>(k);
  if (k > 0) {
    f.argmax_agreement = agree / static_cast<double>(k);
    f.mean_kl = kl / static_cast<double>(k);
  }
  return f;
}

Result<FidelityReport> measure_fidelity(LlamaModel& model, const Tokenizer* tok, const std::vector<std::string>& names,
                                        const std::vector<const LoraAdapter*>& adapters,
                                        const std::vector<ReplayStep>& steps, const FidelityOptions& opts) {
  LRA_ASSIGN_OR_RETURN(auto forced, force_along_none(model, tok, names, adapters, steps, opts.page_size));
  FidelityReport rep;
  // The trajectory `none` produced: replay the forced script once to get it.
  ReplayOptions o;
  o.sharing.page_size = opts.page_size;
  LRA_ASSIGN_OR_RETURN(ReplayResult none, run_replay(model, tok, names, adapters, forced.first, o));
  rep.trajectory_tokens = static_cast<int64_t>(none.trajectory.size());
  LRA_ASSIGN_OR_RETURN(rep.layers, layer_similarity(model, none.trajectory, adapters, opts.page_size));
  for (ShareMode m : opts.modes) {
    SharingOptions so;
    so.mode = m;
    so.page_size = opts.page_size;
    if (m == ShareMode::kDroidSpeak) so.recompute_layers = opts.droidspeak_layers;
    // A k_proj adapter on a model that norms its keys (Qwen3): the base modes have no row either.
    if (Status lr_k = check_low_rank_k(model.config(), adapters, m); !lr_k.ok()) {
      rep.skipped.push_back({m, lr_k.error().message});
      continue;
    }
    auto f = compare_with_none(model, tok, names, adapters, forced.first, forced.second, so);
    if (!f.ok()) {
      if (m == ShareMode::kBaseLr && f.error().code == ErrorCode::kInvalidArgument) {  // not shared-A: no row
        rep.skipped.push_back({m, f.error().message});
        continue;
      }
      return f.error();
    }
    rep.modes.push_back(*f);
  }
  return rep;
}

Result<std::vector<std::pair<int, double>>> profile_layers(LlamaModel& model, const Tokenizer* tok,
                                                           const std::vector<std::string>& names,
                                                           const std::vector<const LoraAdapter*>& adapters,
                                                           const std::vector<ReplayStep>& steps, int page_size) {
  LRA_ASSIGN_OR_RETURN(auto forced, force_along_none(model, tok, names, adapters, steps, page_size));
  const int L = model.config().num_layers;
  std::vector<std::pair<int, double>> ranking;
  for (int l = 0; l < L; ++l) {
    SharingOptions so;
    so.mode = ShareMode::kDroidSpeak;
    so.page_size = page_size;
    for (int o = 0; o < L; ++o)
      if (o != l) so.recompute_layers.push_back(o);  // share layer l alone
    if (so.recompute_layers.empty()) so.mode = ShareMode::kFull;
    LRA_ASSIGN_OR_RETURN(ModeFidelity f, compare_with_none(model, tok, names, adapters, forced.first, forced.second, so));
    ranking.emplace_back(l, f.mean_kl);
  }
  std::sort(ranking.begin(), ranking.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return ranking;
}

}  // namespace lragent
