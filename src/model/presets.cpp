#include "model/presets.h"

#include <cmath>

#include "backend/random.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

ModelConfig llama31_8b() {
  // meta-llama/Llama-3.1-8B config.json.
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  c.tie_word_embeddings = false;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  c.torch_dtype = "bfloat16";
  return c;
}

ModelConfig ministral_8b() {
  // mistralai/Ministral-8B-Instruct-2410 config.json. Its sliding_window (32768) equals
  // max_position_embeddings, so every position attends the whole context: plain causal attention.
  ModelConfig c;
  c.architecture = "MistralForCausalLM";
  c.vocab_size = 131072;
  c.hidden_size = 4096;
  c.intermediate_size = 12288;
  c.num_layers = 36;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100000000.0;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "bfloat16";
  return c;
}

ModelConfig qwen3_8b() {
  // Qwen/Qwen3-8B config.json: Ministral-8B's layer shapes (hidden 4096, 36 layers, 32 / 8 heads
  // of 128, MLP 12288, untied), with q_norm / k_norm per head before RoPE and 40960 positions.
  ModelConfig c = ministral_8b();
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 151936;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.qk_norm = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  return c;
}

ModelConfig tiny() {
  // Llama-3.1 in miniature (GQA 2, llama3 RoPE scaling, 131072 positions) for CPU tests.
  ModelConfig c = llama31_8b();
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 192;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "float32";
  return c;
}

// The seed of weight tensor `index` (a fixed enumeration) of a preset.
uint64_t tensor_seed(uint64_t preset_seed, uint64_t index) { return splitmix64(preset_seed ^ splitmix64(index + 1)); }

}  // namespace

std::vector<std::string> model_preset_names() { return {"tiny", "llama3.1-8b", "ministral-8b", "qwen3-8b"}; }

Result<ModelPreset> model_preset(std::string_view name) {
  ModelPreset p;
  p.name = std::string(name);
  if (name == "tiny") {
    p.config = tiny();
    p.description = "tiny Llama-3.1-shaped model (hidden 64, 2 layers, GQA 4/2) for CPU tests";
  } else if (name == "llama3.1-8b") {
    p.config = llama31_8b();
    p.description = "Llama-3.1-8B shapes (meta-llama/Llama-3.1-8B config.json), random weights";
  } else if (name == "ministral-8b") {
    p.config = ministral_8b();
    p.description = "Ministral-8B shapes (mistralai/Ministral-8B-Instruct-2410 config.json), random weights";
  } else if (name == "qwen3-8b") {
    p.config = qwen3_8b();
    p.description = "Qwen3-8B shapes (Qwen/Qwen3-8B config.json), random weights";
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "--preset '{}' is not a model preset; choose tiny, llama3.1-8b, ministral-8b or qwen3-8b", name);
  }
  p.seed = 20261122;  // one fixed seed for every preset: they differ by shape
  LRA_RETURN_IF_ERROR(p.config.validate("preset " + p.name));
  return p;
}

int64_t preset_weight_bytes(const ModelConfig& c, DType matrix_dtype) {
  const int64_t h = c.hidden_size, q = static_cast<int64_t>(c.num_heads) * c.head_dim,
                kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  const int64_t per_layer = q * h + 2 * kv * h + h * q + 3 * inter * h;
  const int64_t matrices = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + c.num_layers * per_layer;
  const int64_t norms = h * (2 * c.num_layers + 1) + (c.qk_norm ? 2 * int64_t{c.head_dim} * c.num_layers : 0);
  return matrices * static_cast<int64_t>(dtype_size(matrix_dtype)) + norms * 4;
}

Result<std::unique_ptr<LlamaModel>> make_preset_model(const ModelPreset& preset, Backend& be) {
  const ModelConfig& c = preset.config;
  std::vector<Tensor> owned;
  uint64_t index = 0;
  // A matrix: normal(0, init_std) in the weight dtype; a norm weight: ones in f32 (as the
  // forward keeps norms on every backend).
  auto make = [&](const std::string& what, std::vector<int64_t> shape, bool norm) -> Result<TensorView> {
    const DType dtype = norm ? DType::kF32 : be.weight_dtype();
    Tensor t = be.alloc(dtype, shape);
    const uint64_t seed = tensor_seed(preset.seed, index++);
    if (!t.view().data)
      return make_error(ErrorCode::kOutOfMemory, "preset {}: cannot allocate weight '{}' {} {} on {} ({:.1f} GiB in all)",
                        preset.name, what, TensorView(dtype, shape, nullptr).shape_str(), dtype_name(dtype), be.name(),
                        static_cast<double>(preset_weight_bytes(c, be.weight_dtype())) / (1 << 30));
    if (norm) be.fill(t.view(), 1.0f);
    else be.fill_random(t.view(), seed, preset.init_std);
    owned.push_back(std::move(t));
    return owned.back().view();
  };
  const int64_t h = c.hidden_size, q = static_cast<int64_t>(c.num_heads) * c.head_dim,
                kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  ModelWeights w;
  LRA_ASSIGN_OR_RETURN(w.embed, make("embed_tokens", {c.vocab_size, h}, false));
  LRA_ASSIGN_OR_RETURN(w.lm_head, make("lm_head", {c.vocab_size, h}, false));
  LRA_ASSIGN_OR_RETURN(w.final_norm, make("norm", {h}, true));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    LayerWeights lw;
    LRA_ASSIGN_OR_RETURN(lw.attn_norm, make(p + "input_layernorm", {h}, true));
    LRA_ASSIGN_OR_RETURN(lw.wq, make(p + "q_proj", {q, h}, false));
    LRA_ASSIGN_OR_RETURN(lw.wk, make(p + "k_proj", {kv, h}, false));
    LRA_ASSIGN_OR_RETURN(lw.wv, make(p + "v_proj", {kv, h}, false));
    LRA_ASSIGN_OR_RETURN(lw.wo, make(p + "o_proj", {h, q}, false));
    if (c.qk_norm) {
      LRA_ASSIGN_OR_RETURN(lw.q_norm, make(p + "q_norm", {c.head_dim}, true));
      LRA_ASSIGN_OR_RETURN(lw.k_norm, make(p + "k_norm", {c.head_dim}, true));
    }
    LRA_ASSIGN_OR_RETURN(lw.mlp_norm, make(p + "post_attention_layernorm", {h}, true));
    LRA_ASSIGN_OR_RETURN(lw.w_gate, make(p + "gate_proj", {inter, h}, false));
    LRA_ASSIGN_OR_RETURN(lw.w_up, make(p + "up_proj", {inter, h}, false));
    LRA_ASSIGN_OR_RETURN(lw.w_down, make(p + "down_proj", {h, inter}, false));
    w.layers.push_back(lw);
  }
  be.synchronize();
  return LlamaModel::from_weights(c, std::move(w), std::move(owned), be);
}

std::vector<std::unique_ptr<LoraAdapter>> make_preset_adapters(const ModelConfig& cfg, int rank, bool shared_a,
                                                               uint64_t seed) {
  RoleAdapterRecipe r;
  r.dir = shared_a ? "<preset shared-A>" : "<preset independent-A>";
  // Shared A: every role draws A from the same stream, so the matrices are bit-identical.
  r.a_seed = [=](int role) { return shared_a ? seed : splitmix64(seed + 100 + static_cast<uint64_t>(role)); };
  r.b_seed = [=](int role) { return splitmix64(seed + 1000 + static_cast<uint64_t>(role)); };
  r.b_sd = 0.02f;
  return make_role_adapters(cfg, rank, r);
}

}  // namespace lragent
