// The sampling parameters a request gets for those it leaves out, as vLLM's --generation-config
// sets them: OpenAI's neutral values ("vllm"), or the ones the model's creators recommend in its
// generation_config.json ("auto", the default; Llama-3.1-Instruct's: temperature 0.6, top_p 0.9).
// A request that gives a value keeps it; max_new_tokens caps every request, as vLLM caps it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server {

struct SamplingDefaults {
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;  // 0: off
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  int max_tokens = 0;  // > 0: no request generates more (HF's max_new_tokens; vLLM takes the least)
  // "temperature=0.6, top_p=0.9": the values that differ from the neutral ones; "" when none do.
  std::string describe() const;
};

// vLLM's rule (its get_diff_sampling_param): of `generation_config` (a generation_config.json
// object), the keys temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens
// whose values differ from transformers' GenerationConfig defaults (1.0, 1.0, 50, none, 1.0,
// none); then every such key of `overrides` (--override-generation-config) on top. A null value
// is no value. Errors name `where` (the file, or the flag) and the key, and say what it must be.
Result<SamplingDefaults> sampling_defaults_from(const nlohmann::json& generation_config, const std::string& where,
                                                const nlohmann::json& overrides = nlohmann::json::object());

// --generation-config MODE: "auto" (MODEL_DIR/generation_config.json; neutral when there is
// none), "vllm" (neutral), or a directory that must hold a generation_config.json.
// `overrides_json`: --override-generation-config's JSON object text ("" for none).
Result<SamplingDefaults> load_sampling_defaults(const std::string& mode, const std::string& model_dir,
                                                const std::string& overrides_json);

}  // namespace lragent::server
