#include "model/synthetic.h"

#include <cmath>
#include <numbers>

#include "backend/random.h"

namespace lragent {

uint64_t NormalRng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float NormalRng::next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = (static_cast<double>(next_u64() >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = static_cast<double>(next_u64() >> 11) / 9007199254740992.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = static_cast<float>(r * std::sin(2 * std::numbers::pi * u2));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(2 * std::numbers::pi * u2));
}

ModelConfig synthetic_config(const SyntheticSpec& s) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 259;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.hidden / s.heads;
  c.max_position_embeddings = s.max_positions;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "float32";
  return c;
}

Result<std::unique_ptr<LlamaModel>> make_synthetic_model(const SyntheticSpec& spec, Backend& backend) {
  const ModelConfig c = synthetic_config(spec);
  NormalRng rng(spec.seed);
  std::vector<Tensor> owned;
  auto make = [&](std::vector<int64_t> shape, float std, float mean = 0.f) {
    Tensor t = Tensor::empty(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = mean + std * rng.next();
    owned.push_back(std::move(t));
    return owned.back().view();
  };
  const int64_t h = c.hidden_size, q = static_cast<int64_t>(c.num_heads) * c.head_dim,
                kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  // Scaled like a trained model's init so activations stay O(1) through the layers.
  const float sd = 1.0f / std::sqrt(static_cast<float>(h));
  ModelWeights w;
  w.embed = make({c.vocab_size, h}, 1.0f);
  w.final_norm = make({h}, 0.05f, 1.0f);
  w.lm_head = make({c.vocab_size, h}, 2.0f * sd);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = make({h}, 0.05f, 1.0f);
    lw.wq = make({q, h}, sd * 2);
    lw.wk = make({kv, h}, sd * 2);
    lw.wv = make({kv, h}, sd);
    lw.wo = make({h, q}, sd / std::sqrt(static_cast<float>(c.num_layers)));
    lw.mlp_norm = make({h}, 0.05f, 1.0f);
    lw.w_gate = make({inter, h}, sd);
    lw.w_up = make({inter, h}, sd);
    lw.w_down = make({h, inter}, 1.0f / std::sqrt(static_cast<float>(inter * c.num_layers)));
    w.layers.push_back(lw);
  }
  return LlamaModel::from_weights(c, std::move(w), std::move(owned), backend);
}

std::vector<std::unique_ptr<LoraAdapter>> make_role_adapters(const ModelConfig& cfg, int rank,
                                                             const RoleAdapterRecipe& recipe) {
  const char* roles[] = {"plan", "action", "reflect"};
  const int64_t h = cfg.hidden_size;
  const int64_t out_of[] = {static_cast<int64_t>(cfg.num_heads) * cfg.head_dim,
                            static_cast<int64_t>(cfg.num_kv_heads) * cfg.head_dim};
  const LoraTarget targets[] = {LoraTarget::kQ, LoraTarget::kV};
  auto fill = [](NormalRng& rng, std::vector<int64_t> shape, float sd) {
    Tensor t = Tensor::empty(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = sd * rng.next();
    return t;
  };
  std::vector<std::unique_ptr<LoraAdapter>> out;
  for (int role = 0; role < 3; ++role) {
    auto a = std::make_unique<LoraAdapter>();
    a->name = roles[role];
    a->dir = recipe.dir;
    a->default_rank = rank;
    a->lora_alpha = 2.0f * static_cast<float>(rank);
    a->layers.resize(static_cast<size_t>(cfg.num_layers));
    const uint64_t a_seed = recipe.a_seed(role);
    NormalRng a_rng(a_seed);
    NormalRng b_rng(recipe.b_seed(role));
    for (int l = 0; l < cfg.num_layers; ++l)
      for (int t = 0; t < 2; ++t) {
        LoraModule m;
        m.rank = rank;
        m.scale = a->lora_alpha / static_cast<float>(rank);
        m.a = fill(a_rng, {rank, h}, 1.0f / std::sqrt(static_cast<float>(h)));
        m.b = fill(b_rng, {out_of[t], rank}, recipe.b_sd);
        m.a_hash = splitmix64(a_seed ^ static_cast<uint64_t>(l * 2 + t));  // identical A <=> identical hash
        a->layers[static_cast<size_t>(l)][static_cast<size_t>(targets[t])] = std::move(m);
      }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<std::unique_ptr<LoraAdapter>> make_synthetic_adapters(const ModelConfig& cfg, int rank, uint64_t seed) {
  RoleAdapterRecipe r;
  r.dir = "<synthetic>";
  r.a_seed = [seed](int) { return seed; };  // the same A for every role
  r.b_seed = [seed](int role) { return seed * 1000 + static_cast<uint64_t>(role) + 1; };
  r.b_sd = 0.15f / std::sqrt(static_cast<float>(rank));
  return make_role_adapters(cfg, rank, r);
}

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(1);
    for (unsigned char ch : text) ids.push_back(3 + ch);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += token_bytes(id);
    return out;
  }
  std::string token_bytes(int32_t id) const override {
    if (id == 1) return "<s>";
    if (id == 2) return "</s>";
    if (id >= 3 && id < 259) return std::string(1, static_cast<char>(id - 3));
    return "";
  }
  std::string id_to_token(int32_t id) const override { return token_bytes(id); }
  int32_t token_to_id(std::string_view t) const override {
    if (t == "<s>") return 1;
    if (t == "</s>") return 2;
    return t.size() == 1 ? 3 + static_cast<unsigned char>(t[0]) : -1;
  }
  int32_t vocab_size() const override { return 259; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace lragent
