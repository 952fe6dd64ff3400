// tokenizer.json "normalizer": rewrites the text before pre-tokenization (HF normalizers).
// Supported: Sequence, Prepend, Replace, NFC -- what Llama-2/Mistral/TinyStories and Qwen use.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "core/result.h"

namespace lragent {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `s` (valid UTF-8) in place; the result is valid UTF-8. Fails only where a Replace
  // regex gives up on the text (see Regex::find_all); `s` is then unchanged by that step.
  virtual Status normalize(std::string& s) const = 0;

  // `j` must not be null (a null normalizer means "none" and is handled by the caller).
  static Result<std::unique_ptr<Normalizer>> from_json(const nlohmann::json& j, std::string_view where);
};

}  // namespace lragent
