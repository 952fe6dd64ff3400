// tokenizer.json "pre_tokenizer": cuts normalized text into the words BPE sees (HF pre-tokenizers).
// Supported: Sequence, Split (regex or literal, all delimiter behaviours), ByteLevel, Metaspace.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent {

struct PreToken {
  std::string text;
  // Starts at offset 0 of the caller's original text: Metaspace's prepend_scheme "first"
  // only prepends there (HF checks offsets_original().0 == 0).
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces, in order; empty pieces are dropped as in HF. Fails
  // only where a split regex gives up on the text (see Regex::find_all).
  virtual Status pre_tokenize(std::vector<PreToken>& pieces) const = 0;

  // `j` must not be null (a null pre-tokenizer means "none" and is handled by the caller).
  static Result<std::unique_ptr<PreTokenizer>> from_json(const nlohmann::json& j, std::string_view where);
};

// Settings shared by the Metaspace pre-tokenizer and decoder (HF serialises both alike).
struct MetaspaceConfig {
  enum class Prepend { kAlways, kFirst, kNever };
  std::string replacement;  // one character, usually U+2581
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};
// Legacy files give add_prefix_space instead of prepend_scheme; false there means kNever.
Result<MetaspaceConfig> parse_metaspace(const nlohmann::json& j, std::string_view where);

}  // namespace lragent
