// libFuzzer target: a PEFT adapter from memory, adapter_config.json's text, a NUL byte, then
// adapter_model.safetensors' bytes, for a tiny fixed Llama config (1 layer, hidden 16, 2 query
// heads, 1 KV head). The loader must return an error naming its source (never crash, throw or
// read out of bounds); an adapter it accepts must have A/B of the model's dimensions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "model/config.h"
#include "model/lora.h"
#include "model/safetensors.h"

namespace {

constexpr const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "vocab_size": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "max_position_embeddings": 64, "tie_word_embeddings": true, "hidden_act": "silu"})";

void check_names_source(const lragent::Error& e, const char* a, const char* b) {
  // Every error names the file it is about (or the adapter, for "adapts no module").
  if (e.message.find(a) == std::string::npos && e.message.find(b) == std::string::npos &&
      e.message.find("adapter 'fuzz'") == std::string::npos)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lragent::ModelConfig cfg = [] {
    auto c = lragent::parse_model_config(kConfig, "<fuzz config>");
    if (!c.ok()) __builtin_trap();  // the fixed config must parse
    return *c;
  }();
  const void* nul = std::memchr(data, 0, size);
  const size_t n_json = nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - data) : size;
  const std::string json(reinterpret_cast<const char*>(data), n_json);
  const uint8_t* st = nul ? data + n_json + 1 : data + size;
  const size_t n_st = nul ? size - n_json - 1 : 0;

  auto file = lragent::SafetensorsFile::from_buffer(st, n_st, "<fuzz tensors>");
  if (!file.ok()) {
    check_names_source(file.error(), "<fuzz tensors>", "<fuzz tensors>");
    return 0;
  }
  auto adapter = lragent::parse_lora_adapter("fuzz", json, "<fuzz adapter_config>", **file, "<fuzz tensors>", cfg);
  if (!adapter.ok()) {
    check_names_source(adapter.error(), "<fuzz adapter_config>", "<fuzz tensors>");
    return 0;
  }
  // [in, out] of each target (LoraTarget order q, k, v, o, gate, up, down) in kConfig: hidden 16,
  // 2 heads of 8 (q/o 16 wide), 1 KV head (k/v 8 wide), intermediate 32. Written out here, not
  // taken from the library, so a loader that accepted wrong widths would trap.
  constexpr int64_t kDims[lragent::kNumLoraTargets][2] = {{16, 16}, {16, 8}, {16, 8}, {16, 16},
                                                          {16, 32}, {16, 32}, {32, 16}};
  if ((*adapter)->layers.size() != 1) __builtin_trap();  // one layer in kConfig
  for (const auto& layer : (*adapter)->layers)
    for (int t = 0; t < lragent::kNumLoraTargets; ++t) {
      const auto& m = layer[static_cast<size_t>(t)];
      if (!m) continue;
      // A [r, in], B [out, r]: the forward pass relies on these, so check them here.
      if (m->rank <= 0 || m->a.shape().size() != 2 || m->b.shape().size() != 2 || m->a.shape()[0] != m->rank ||
          m->b.shape()[1] != m->rank || m->a.shape()[1] != kDims[t][0] || m->b.shape()[0] != kDims[t][1])
        __builtin_trap();
      volatile float sink = 0;
      for (int64_t i = 0; i < m->a.numel(); ++i) sink = sink + m->a.f32()[i];
      for (int64_t i = 0; i < m->b.numel(); ++i) sink = sink + m->b.f32()[i];
    }
  return 0;
}
