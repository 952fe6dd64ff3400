// Model hyper-parameters from a Hugging Face config.json.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"

namespace lragent {

struct RopeScaling {
  std::string type;  // "" (none), "llama3", "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // LlamaForCausalLM | MistralForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // config "head_dim" if present, else hidden_size / num_heads
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2 always; Llama when attention_bias=true)
  bool mlp_bias = false;         // parsed to be refused: MLP biases are not computed
  // Qwen3: q and k are RMS-normed per head (weights q_norm, k_norm [head_dim]) after their
  // projections and before RoPE. A key is then no longer linear in x, so a k_proj LoRA term
  // cannot be kept in low-rank form (the base sharing modes refuse such adapters).
  bool qk_norm = false;
  // Attention window (Mistral, Qwen2 with use_sliding_window) when narrower than the context:
  // max_position_embeddings is then capped at it (within it, sliding and full attention agree);
  // 0: none.
  int sliding_window = 0;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  std::string torch_dtype;  // informational

  // Checks that sizes are positive and divisible (heads % kv_heads ...) and that rope
  // scaling is usable. parse_model_config() fills head_dim before calling it.
  Status validate(const std::string& source) const;
};

// Parses config.json text. `source` names the file in errors. Unknown architectures are
// kUnsupported ("config.json: architecture 'GPT2LMHeadModel' is not supported; supported: ...").
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace lragent
