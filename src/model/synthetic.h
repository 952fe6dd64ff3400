// The built-in default model: a deterministic, Llama-shaped model with random weights
// generated from a fixed seed, plus a byte-level tokenizer. It lets every command run on
// a fresh machine with no downloads; its text is meaningless by construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/llama.h"
#include "model/lora.h"
#include "tokenizer/tokenizer.h"

namespace lragent {

struct SyntheticSpec {
  int hidden = 128, layers = 4, heads = 8, kv_heads = 4, intermediate = 384, max_positions = 4096;
  uint64_t seed = 20260101;
};

ModelConfig synthetic_config(const SyntheticSpec& spec);
Result<std::unique_ptr<LlamaModel>> make_synthetic_model(const SyntheticSpec& spec, Backend& backend);
// Three role adapters (plan, action, reflect) for the synthetic model: LoRA r = `rank` on
// q_proj and v_proj with one shared A (shared-A multi-LoRA) and a B per role.
std::vector<std::unique_ptr<LoraAdapter>> make_synthetic_adapters(const ModelConfig& cfg, int rank = 8,
                                                                  uint64_t seed = 7);
// How make_role_adapters draws its three adapters: role r's A from the NormalRng stream
// a_seed(r) (the same seed for every role: shared A; LoraModule::a_hash follows from it, so equal
// A matrices group), its B from b_seed(r) with standard deviation b_sd.
struct RoleAdapterRecipe {
  std::string dir;  // LoraAdapter::dir, a label ("<synthetic>", "<preset shared-A>", ...)
  std::function<uint64_t(int role)> a_seed, b_seed;
  float b_sd = 0.02f;
};
// Three role adapters (plan, action, reflect): LoRA r = `rank` on q_proj and v_proj, lora_alpha
// 2·rank (scale 2), A [rank, hidden] with standard deviation 1/sqrt(hidden), B [out, rank].
std::vector<std::unique_ptr<LoraAdapter>> make_role_adapters(const ModelConfig& cfg, int rank,
                                                             const RoleAdapterRecipe& recipe);
// Byte tokenizer: id 1 = <s>, 2 = </s>, 3 + b = byte b. BOS is added by encode().
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Deterministic standard normal numbers (Box-Muller over splitmix64), identical on every platform.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}
  float next();

 private:
  uint64_t next_u64();
  uint64_t state_;
  bool has_spare_ = false;
  float spare_ = 0.f;
};

}  // namespace lragent
