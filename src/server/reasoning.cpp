#include "server/reasoning.h"

#include <algorithm>

namespace lragent::server {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = kThinkEnd;

std::optional<std::string> non_empty(std::string_view s) {
  return s.empty() ? std::nullopt : std::optional<std::string>(std::string(s));
}

}  // namespace

const char* reasoning_format_name(ReasoningFormat f) {
  switch (f) {
    case ReasoningFormat::kQwen3: return "qwen3";
    case ReasoningFormat::kDeepSeekR1: return "deepseek_r1";
  }
  return "?";
}

Result<ReasoningFormat> parse_reasoning_format(std::string_view name) {
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  return make_error(ErrorCode::kInvalidArgument, "reasoning parser '{}' is not one of qwen3, deepseek_r1", name);
}

ReasoningSplit split_reasoning(const std::string& text, bool thinking) {
  if (!thinking) return {std::nullopt, non_empty(text)};
  std::string_view t = text;
  if (t.starts_with(kOpen)) t.remove_prefix(kOpen.size());
  const size_t close = t.find(kClose);
  if (close == std::string_view::npos) return {non_empty(t), std::nullopt};
  return {non_empty(t.substr(0, close)), non_empty(t.substr(close + kClose.size()))};
}

std::string after_reasoning(const std::string& regex) {
  // Text without "</think>": the tag's characters are all different, so after a '<' a run of its
  // prefix either breaks off at a character that is neither the tag's next one nor '<' (back to
  // the start), or meets another '<' (a new run), or the text ends inside it.
  static const std::string kPrefix = "(?:/(?:t(?:h(?:i(?:n(?:k)?)?)?)?)?)?";  // "/", "/t", ... "/think" or none
  static const std::string kBreak = "(?:[^/<]|/(?:[^t<]|t(?:[^h<]|h(?:[^i<]|i(?:[^n<]|n(?:[^k<]|k[^<>]))))))";
  static const std::string kNoClose = "(?:[^<]|<(?:" + kPrefix + "<)*" + kBreak + ")*(?:<(?:" + kPrefix + "<)*" + kPrefix + ")?";
  return "(?:<think>)?" + kNoClose + "</think>\\s*(?:" + regex + ")";
}

ReasoningStream::Piece ReasoningStream::push(const std::string& piece) {
  text_ += piece;
  return advance(/*last=*/false);
}

ReasoningStream::Piece ReasoningStream::finish() { return advance(/*last=*/true); }

ReasoningStream::Piece ReasoningStream::advance(bool last) {
  Piece out;
  if (!thinking_) answering_ = started_ = true;
  if (!started_) {
    // Hold a text that may still become "<think>"; then skip the tag if it is one.
    if (!last && text_.size() < kOpen.size() && kOpen.starts_with(text_)) return out;
    started_ = true;
    if (std::string_view(text_).starts_with(kOpen)) sent_ = kOpen.size();
  }
  if (!answering_) {
    // A "</think>" starts at or after sent_: a tail that might begin one is never handed out.
    const size_t close = text_.find(kClose, sent_);
    if (close != std::string::npos) {
      out.reasoning = text_.substr(sent_, close - sent_);
      sent_ = close + kClose.size();
      answering_ = true;
    } else {
      size_t upto = text_.size();
      if (!last)  // hold back a tail that a later piece may complete into "</think>"
        for (size_t k = std::min(kClose.size() - 1, text_.size() - sent_); k > 0; --k)
          if (text_.compare(text_.size() - k, k, kClose, 0, k) == 0) {
            upto = text_.size() - k;
            break;
          }
      out.reasoning = text_.substr(sent_, upto - sent_);
      sent_ = upto;
      return out;
    }
  }
  out.content = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace lragent::server
