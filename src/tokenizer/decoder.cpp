#include "tokenizer/decoder.h"

#include <optional>

#include "tokenizer/json_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace lragent {

namespace {

using tokjson::json;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }
  void map_token(std::string& token) const override {
    for (const auto& step : steps_) step->map_token(token);
  }
  bool unstable(const std::string& token) const override {
    for (const auto& step : steps_) {
      if (step->unstable(token)) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) map_token(t);
  }
  void map_token(std::string& token) const override {
    std::vector<std::pair<Span, bool>> pieces;  // [k] (span, is_match) covering token
    // decode() has no error channel. A regex can only give up here on a huge single token
    // string, and the Replace decoders of known tokenizers use literal patterns, which cannot
    // fail; the token then stays as it is.
    if (!pattern_.find_matches(token, pieces).ok()) return;
    std::string out;
    for (const auto& [span, is_match] : pieces) {
      if (is_match) {
        out += content_;
      } else {
        out.append(token, span.begin, span.end - span.begin);
      }
    }
    token = std::move(out);
  }
  bool unstable(const std::string&) const override { return false; }

 private:
  Pattern pattern_;
  std::string content_;
};

// The byte a "<0xNN>" piece stands for. Mirrors HF: six bytes, and Rust's u8::from_str_radix
// on the two in the middle (which also takes a leading '+').
std::optional<uint8_t> fallback_byte(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = t[3] == '+' ? 0 : hex(t[3]);
  const int lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Runs of <0xNN> pieces become their bytes when those form valid UTF-8; otherwise HF emits
// one U+FFFD per byte of the run (not from_utf8_lossy's one per bad subsequence).
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;  // bytes of the pending <0xNN> pieces
    auto flush = [&] {
      if (run.empty()) return;
      if (unicode::is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& t : tokens) {
      if (const auto b = fallback_byte(t)) {
        run.push_back(static_cast<char>(*b));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }
  void map_token(std::string& token) const override {
    if (const auto b = fallback_byte(token)) token.assign(1, static_cast<char>(*b));
  }
  bool unstable(const std::string& token) const override { return fallback_byte(token).has_value(); }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
  void map_token(std::string&) const override {}
  bool unstable(const std::string&) const override { return false; }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    const size_t n = content_.size();
    for (std::string& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t i = 0; i < start_ && t.compare(begin, n, content_) == 0 && begin < end; ++i) begin += n;
      for (size_t i = 0; i < stop_ && end >= begin + n && t.compare(end - n, n, content_) == 0; ++i) end -= n;
      t = t.substr(begin, end - begin);
    }
  }
  void map_token(std::string&) const override {}
  bool unstable(const std::string&) const override { return start_ > 1 || stop_ > 0; }

 private:
  std::string content_;  // one character
  size_t start_;
  size_t stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(MetaspaceConfig config) : config_(std::move(config)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    // HF drops every replacement char of the first token (not just a leading one) unless the
    // scheme is "never"; elsewhere each becomes a space.
    const bool drop_first = config_.prepend != MetaspaceConfig::Prepend::kNever;
    for (size_t i = 0; i < tokens.size(); ++i) replace(tokens[i], i == 0 && drop_first ? "" : " ");
  }
  void map_token(std::string& token) const override { replace(token, " "); }
  bool unstable(const std::string&) const override { return false; }

 private:
  void replace(std::string& t, std::string_view with) const {
    const std::string& rep = config_.replacement;
    for (size_t pos = t.find(rep); pos != std::string::npos; pos = t.find(rep, pos + with.size())) {
      t.replace(pos, rep.size(), with);
    }
  }
  MetaspaceConfig config_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (std::string& t : tokens) {
      map_token(t);
      bytes += t;
    }
    tokens.assign(1, unicode::from_utf8_lossy(bytes));
  }
  // A token whose every char is in the byte-level alphabet stands for those bytes; any other
  // token (e.g. an added "<|eot_id|>" with a space in it) for its own UTF-8 bytes.
  void map_token(std::string& token) const override {
    std::string bytes;
    bytes.reserve(token.size());
    for (size_t i = 0, len = 0; i < token.size(); i += len) {
      const int b = unicode::byte_from_char(unicode::decode_utf8(token, i, &len));
      if (b < 0) return;
      bytes.push_back(static_cast<char>(b));
    }
    token = std::move(bytes);
  }
  bool unstable(const std::string&) const override { return false; }
};

}  // namespace

Result<std::unique_ptr<Decoder>> Decoder::from_json(const json& j, std::string_view where) {
  LRA_RETURN_IF_ERROR(tokjson::expect_object(j, where));
  LRA_ASSIGN_OR_RETURN(const std::string type, tokjson::get_string(j, "type", where));
  if (type == "Sequence") {
    const json* list = tokjson::find(j, "decoders");
    const std::string list_where = tokjson::member(where, "decoders");
    if (list == nullptr || !list->is_array()) return tokjson::corrupt(list_where, "expected an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      LRA_ASSIGN_OR_RETURN(auto step, from_json((*list)[i], tokjson::element(list_where, i)));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "Replace") {
    const json* pattern = tokjson::find(j, "pattern");
    if (pattern == nullptr) return tokjson::corrupt(tokjson::member(where, "pattern"), "missing");
    LRA_ASSIGN_OR_RETURN(Pattern p, Pattern::from_json(*pattern, tokjson::member(where, "pattern")));
    LRA_ASSIGN_OR_RETURN(std::string content, tokjson::get_string(j, "content", where));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(p), std::move(content)));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    LRA_ASSIGN_OR_RETURN(std::string content, tokjson::get_char(j, "content", where));
    LRA_ASSIGN_OR_RETURN(const int64_t start, tokjson::get_int(j, "start", where, 0));
    LRA_ASSIGN_OR_RETURN(const int64_t stop, tokjson::get_int(j, "stop", where, 0));
    if (start < 0 || stop < 0) return tokjson::corrupt(where, "Strip start/stop must be non-negative");
    return std::unique_ptr<Decoder>(
        new StripDecoder(std::move(content), static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (type == "Metaspace") {
    LRA_ASSIGN_OR_RETURN(MetaspaceConfig config, parse_metaspace(j, where));
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(config)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  return tokjson::unsupported(where, fmt::format("decoder type \"{}\" is not supported", type));
}

}  // namespace lragent
