#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace lragent {

namespace {

using tokjson::json;

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status normalize(std::string& s) const override {
    for (const auto& step : steps_) LRA_RETURN_IF_ERROR(step->normalize(s));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// HF prepends only to non-empty text, so an empty input stays empty.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status normalize(std::string& s) const override {
    // pieces: [k] (span, is_match) covering s.
    std::vector<std::pair<Span, bool>> pieces;
    LRA_RETURN_IF_ERROR(pattern_.find_matches(s, pieces));
    std::string out;
    out.reserve(s.size());
    for (const auto& [span, is_match] : pieces) {
      if (is_match) {
        out += content_;
      } else {
        out.append(s, span.begin, span.end - span.begin);
      }
    }
    s = std::move(out);
    return Status::Ok();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class NfcNormalizer final : public Normalizer {
 public:
  Status normalize(std::string& s) const override {
    s = unicode::nfc(s);
    return Status::Ok();
  }
};

}  // namespace

Result<std::unique_ptr<Normalizer>> Normalizer::from_json(const json& j, std::string_view where) {
  LRA_RETURN_IF_ERROR(tokjson::expect_object(j, where));
  LRA_ASSIGN_OR_RETURN(const std::string type, tokjson::get_string(j, "type", where));
  if (type == "Sequence") {
    const json* list = tokjson::find(j, "normalizers");
    const std::string list_where = tokjson::member(where, "normalizers");
    if (list == nullptr || !list->is_array()) return tokjson::corrupt(list_where, "expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      LRA_ASSIGN_OR_RETURN(auto step, from_json((*list)[i], tokjson::element(list_where, i)));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Prepend") {
    LRA_ASSIGN_OR_RETURN(std::string prefix, tokjson::get_string(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    const json* pattern = tokjson::find(j, "pattern");
    if (pattern == nullptr) return tokjson::corrupt(tokjson::member(where, "pattern"), "missing");
    LRA_ASSIGN_OR_RETURN(Pattern p, Pattern::from_json(*pattern, tokjson::member(where, "pattern")));
    LRA_ASSIGN_OR_RETURN(std::string content, tokjson::get_string(j, "content", where));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(p), std::move(content)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new NfcNormalizer());
  return tokjson::unsupported(where, fmt::format("normalizer type \"{}\" is not supported", type));
}

}  // namespace lragent
