// Synthetic models with the real shapes of published checkpoints (benchmarks): the config is
// built in code, the weights are random numbers generated directly in backend memory
// (Backend::fill_random), so an 8B-parameter model needs no download and no host copy.
// The text such a model writes is meaningless; its compute and memory figures are real.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/llama.h"
#include "model/lora.h"

namespace lragent {

struct ModelPreset {
  std::string name;         // "llama3.1-8b"
  std::string description;  // where the shapes come from
  ModelConfig config;
  uint64_t seed = 0;        // weight stream seed (every tensor derives its own from it)
  float init_std = 0.02f;   // std of every matrix (HF initializer_range); norm weights are 1
};

// "tiny" (CPU tests), "llama3.1-8b", "ministral-8b", "qwen3-8b". Unknown names are kInvalidArgument listing these.
Result<ModelPreset> model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// Bytes of the preset's weights when matrices are stored in `matrix_dtype` (norms stay f32).
int64_t preset_weight_bytes(const ModelConfig& cfg, DType matrix_dtype);

// Allocates every weight with backend.alloc in backend.weight_dtype() (norms f32) and fills it on
// the backend: matrices normal(0, init_std) from fill_random, norm weights 1. Deterministic: the
// same preset gives the same weights on every run and (up to libm ulps) every backend.
// kOutOfMemory names the tensor that did not fit.
Result<std::unique_ptr<LlamaModel>> make_preset_model(const ModelPreset& preset, Backend& backend);

// Three role adapters (plan, action, reflect): LoRA r = `rank`, lora_alpha = 2r, on q_proj and
// v_proj of every layer, as host f32 tensors (upload them with upload_adapter). shared_a: one A
// per (layer, module) for all three (shared-A multi-LoRA, what base-lr needs); else an
// independent A per role. Deterministic in `seed`.
std::vector<std::unique_ptr<LoraAdapter>> make_preset_adapters(const ModelConfig& cfg, int rank, bool shared_a,
                                                               uint64_t seed);

}  // namespace lragent
