// The built-in default model: a deterministic, Llama-shaped model with random weights
// generated from a fixed seed, plus a byte-level tokenizer. It lets every command run on
// a fresh machine with no downloads; its text is meaningless by construction.
#pragma once

#include <cstdint>
#include <memory>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace lragent {

struct SyntheticSpec {
  int hidden = 128, layers = 4, heads = 8, kv_heads = 4, intermediate = 384, max_positions = 4096;
  uint64_t seed = 20260101;
};

ModelConfig synthetic_config(const SyntheticSpec& spec);
Result<std::unique_ptr<LlamaModel>> make_synthetic_model(const SyntheticSpec& spec, Backend& backend);
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
