#include "tokenizer/pretokenizer.h"

#include <algorithm>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace lragent {

namespace {

using tokjson::json;

// How a Split keeps the delimiters it found (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF NormalizedString::split: turns pattern pieces into the spans to keep.
// pieces: [k] (span, is_match) covering a text in order. Returns kept spans (some may be empty).
std::vector<Span> apply_split_behavior(const std::vector<std::pair<Span, bool>>& pieces, SplitBehavior behavior) {
  std::vector<Span> out;
  out.reserve(pieces.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [span, is_match] : pieces) {
        if (!is_match) out.push_back(span);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& piece : pieces) out.push_back(piece.first);
      break;
    case SplitBehavior::kMergedWithPrevious:
      // A match joins the piece before it, unless that piece was itself a match.
      for (const auto& [span, is_match] : pieces) {
        if (is_match && !previous_match && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      // Mirror image of kMergedWithPrevious: walk backwards, a match joins the piece after it.
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->second && !previous_match && !out.empty()) {
          out.back().begin = it->first.begin;
        } else {
          out.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      // Runs of consecutive matches become one piece.
      for (const auto& [span, is_match] : pieces) {
        if (is_match == previous_match && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
  }
  return out;
}

// Cuts `piece` at `spans` (relative to its text), appending non-empty sub-pieces to `out`.
void emit_spans(PreToken&& piece, const std::vector<Span>& spans, std::vector<PreToken>& out) {
  for (const Span& s : spans) {
    if (s.end <= s.begin) continue;
    out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_origin && s.begin == 0});
  }
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& step : steps_) LRA_RETURN_IF_ERROR(step->pre_tokenize(pieces));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<Span, bool>> matches;  // [k] (span, is_match) of one piece
    for (PreToken& piece : pieces) {
      LRA_RETURN_IF_ERROR(pattern_.find_matches(piece.text, matches));
      if (invert_) {
        for (auto& m : matches) m.second = !m.second;
      }
      emit_spans(std::move(piece), apply_split_behavior(matches, behavior_), out);
    }
    pieces = std::move(out);
    return Status::Ok();
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Maps every byte to its printable stand-in so that BPE works on bytes, optionally after
// GPT-2's own regex split and a leading space.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces.size());
    std::vector<Span> matches;
    for (PreToken& piece : pieces) {
      if (add_prefix_space_ && piece.text.front() != ' ') piece.text.insert(0, " ");
      if (!regex_) {
        out.push_back(std::move(piece));
        continue;
      }
      // The regex covers every character, so Isolated behaviour == keep matches and gaps alike.
      std::vector<std::pair<Span, bool>> spans;
      matches.clear();
      LRA_RETURN_IF_ERROR(regex_->find_all(piece.text, matches));
      size_t prev = 0;
      for (const Span& m : matches) {
        if (prev != m.begin) spans.push_back({{prev, m.begin}, false});
        spans.push_back({m, true});
        prev = m.end;
      }
      if (prev != piece.text.size()) spans.push_back({{prev, piece.text.size()}, false});
      emit_spans(std::move(piece), apply_split_behavior(spans, SplitBehavior::kIsolated), out);
    }
    for (PreToken& p : out) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (const char c : p.text) unicode::append_utf8(mapped, unicode::byte_to_char(static_cast<uint8_t>(c)));
      p.text = std::move(mapped);
    }
    pieces = std::move(out);
    return Status::Ok();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // GPT-2 split regex when use_regex, else null
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  explicit MetaspacePreTokenizer(MetaspaceConfig config) : config_(std::move(config)) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    const std::string& rep = config_.replacement;
    std::vector<PreToken> out;
    out.reserve(pieces.size() * 4);
    for (PreToken& piece : pieces) {
      std::string text;
      text.reserve(piece.text.size() + rep.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          text += rep;
        } else {
          text.push_back(c);
        }
      }
      const bool starts_with_rep = text.compare(0, rep.size(), rep) == 0;
      const bool prepend =
          !starts_with_rep && (config_.prepend == MetaspaceConfig::Prepend::kAlways ||
                               (config_.prepend == MetaspaceConfig::Prepend::kFirst && piece.at_origin));
      if (prepend) text.insert(0, rep);
      piece.text = std::move(text);
      if (!config_.split) {
        out.push_back(std::move(piece));
        continue;
      }
      // Every occurrence of the replacement is its own match, merged with what follows it.
      std::vector<std::pair<Span, bool>> matches;
      size_t prev = 0;
      for (size_t pos = piece.text.find(rep); pos != std::string::npos; pos = piece.text.find(rep, pos + rep.size())) {
        if (prev != pos) matches.push_back({{prev, pos}, false});
        matches.push_back({{pos, pos + rep.size()}, true});
        prev = pos + rep.size();
      }
      if (prev != piece.text.size()) matches.push_back({{prev, piece.text.size()}, false});
      emit_spans(std::move(piece), apply_split_behavior(matches, SplitBehavior::kMergedWithNext), out);
    }
    pieces = std::move(out);
    return Status::Ok();
  }

 private:
  MetaspaceConfig config_;
};

Result<SplitBehavior> parse_behavior(const json& j, std::string_view where) {
  LRA_ASSIGN_OR_RETURN(const std::string name, tokjson::get_string(j, "behavior", where));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return tokjson::corrupt(tokjson::member(where, "behavior"), fmt::format("unknown split behavior \"{}\"", name));
}

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

Result<MetaspaceConfig> parse_metaspace(const json& j, std::string_view where) {
  MetaspaceConfig config;
  LRA_ASSIGN_OR_RETURN(config.replacement, tokjson::get_char(j, "replacement", where));
  LRA_ASSIGN_OR_RETURN(const auto scheme, tokjson::get_optional_string(j, "prepend_scheme", where));
  if (scheme) {
    if (*scheme == "always") {
      config.prepend = MetaspaceConfig::Prepend::kAlways;
    } else if (*scheme == "first") {
      config.prepend = MetaspaceConfig::Prepend::kFirst;
    } else if (*scheme == "never") {
      config.prepend = MetaspaceConfig::Prepend::kNever;
    } else {
      return tokjson::corrupt(tokjson::member(where, "prepend_scheme"), fmt::format("unknown scheme \"{}\"", *scheme));
    }
  }
  LRA_ASSIGN_OR_RETURN(const bool add_prefix_space, tokjson::get_bool(j, "add_prefix_space", where, true));
  if (!add_prefix_space) config.prepend = MetaspaceConfig::Prepend::kNever;
  LRA_ASSIGN_OR_RETURN(config.split, tokjson::get_bool(j, "split", where, true));
  return config;
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::from_json(const json& j, std::string_view where) {
  LRA_RETURN_IF_ERROR(tokjson::expect_object(j, where));
  LRA_ASSIGN_OR_RETURN(const std::string type, tokjson::get_string(j, "type", where));
  if (type == "Sequence") {
    const json* list = tokjson::find(j, "pretokenizers");
    const std::string list_where = tokjson::member(where, "pretokenizers");
    if (list == nullptr || !list->is_array()) return tokjson::corrupt(list_where, "expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      LRA_ASSIGN_OR_RETURN(auto step, from_json((*list)[i], tokjson::element(list_where, i)));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Split") {
    const json* pattern = tokjson::find(j, "pattern");
    if (pattern == nullptr) return tokjson::corrupt(tokjson::member(where, "pattern"), "missing");
    LRA_ASSIGN_OR_RETURN(Pattern p, Pattern::from_json(*pattern, tokjson::member(where, "pattern")));
    LRA_ASSIGN_OR_RETURN(const SplitBehavior behavior, parse_behavior(j, where));
    LRA_ASSIGN_OR_RETURN(const bool invert, tokjson::get_bool(j, "invert", where, false));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(p), behavior, invert));
  }
  if (type == "ByteLevel") {
    LRA_ASSIGN_OR_RETURN(const bool add_prefix_space, tokjson::get_bool(j, "add_prefix_space", where, true));
    LRA_ASSIGN_OR_RETURN(const bool use_regex, tokjson::get_bool(j, "use_regex", where, true));
    std::unique_ptr<Regex> regex;
    if (use_regex) {
      LRA_ASSIGN_OR_RETURN(regex, Regex::compile(kGpt2Regex, where));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
  }
  if (type == "Metaspace") {
    LRA_ASSIGN_OR_RETURN(MetaspaceConfig config, parse_metaspace(j, where));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(std::move(config)));
  }
  return tokjson::unsupported(where, fmt::format("pre-tokenizer type \"{}\" is not supported", type));
}

}  // namespace lragent
