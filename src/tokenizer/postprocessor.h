// What encode(add_special_tokens=true) wraps around the model's ids: HF's post_processor
// (TemplateProcessing, Bert/RobertaProcessing, ByteLevel, Sequence) or, when transformers
// rebuilds it from tokenizer_config.json, BOS/EOS flags.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent {

class PostProcessor {
 public:
  // `j` may be null (no post-processor).
  static Result<PostProcessor> from_json(const nlohmann::json& j, std::string_view where);
  // [bos] $A [eos], leaving out an id that is -1.
  static PostProcessor bos_eos(int32_t bos, int32_t eos);

  // Applies the single-sequence templates in order to `ids`.
  void apply(std::vector<int32_t>& ids) const;

 private:
  // One template element: special ids, or the sequence itself when is_sequence.
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  using Template = std::vector<Piece>;

  static Status parse_into(const nlohmann::json& j, std::string_view where, std::vector<Template>& out);

  std::vector<Template> templates_;  // applied in order, like an HF Sequence post-processor
};

}  // namespace lragent
