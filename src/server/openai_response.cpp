// The answer side of the OpenAI API (openai_api.h): log-probabilities as the API writes them, a
// chat completion's message (content, reasoning, tool calls) and its streamed deltas. No HTTP.
// The requests are parsed in openai_api.cpp.
#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/ranges.h>

namespace lragent::server {

using nlohmann::json;

namespace {

std::string token_text(const Tokenizer* tok, int32_t id) {
  return tok ? tok->decode({id}) : fmt::format("token_id:{}", id);
}

float clamp_logprob(float lp) { return std::isnan(lp) || lp < -9999.f ? -9999.f : lp; }


json chat_entry(const Tokenizer* tok, int32_t id, float lp) {
  const std::string text = token_text(tok, id);
  json bytes = json::array();
  for (char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return json{{"token", text}, {"logprob", clamp_logprob(lp)}, {"bytes", std::move(bytes)}};
}

}  // namespace

size_t utf8_chars(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

json logprobs_json(const Tokenizer* tok, bool chat, std::span<const int32_t> ids, std::span<const StepLogprobs> lps,
                   size_t* text_offset) {
  const size_t n = std::min(ids.size(), lps.size());
  if (chat) {
    json content = json::array();
    for (size_t i = 0; i < n; ++i) {
      json e = chat_entry(tok, ids[i], lps[i].logprob);
      json top = json::array();
      for (const TokenLogprob& t : lps[i].top) top.push_back(chat_entry(tok, t.id, t.logprob));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return json{{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  size_t offset = text_offset ? *text_offset : 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string text = token_text(tok, ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(clamp_logprob(lps[i].logprob));
    // The taken token and the most likely ones (so up to logprobs + 1 entries, as OpenAI's).
    json top = json::object();
    top[text] = clamp_logprob(lps[i].logprob);
    for (const TokenLogprob& t : lps[i].top) top[token_text(tok, t.id)] = clamp_logprob(t.logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset);
    offset += utf8_chars(text);
  }
  if (text_offset) *text_offset = offset;
  return json{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)}, {"text_offset", std::move(offsets)}};
}

json prompt_logprobs_json(const Tokenizer* tok, std::span<const int32_t> prompt, std::span<const StepLogprobs> lps) {
  json out = json::array();
  if (prompt.empty()) return out;
  out.push_back(nullptr);  // the first token has nothing before it
  for (size_t i = 0; i + 1 < prompt.size() && i < lps.size(); ++i) {
    json e = json::object();
    auto put = [&](int32_t id, float lp, int64_t rank) {
      e[std::to_string(id)] = {{"logprob", clamp_logprob(lp)}, {"rank", rank}, {"decoded_token", token_text(tok, id)}};
    };
    for (size_t k = 0; k < lps[i].top.size(); ++k) put(lps[i].top[k].id, lps[i].top[k].logprob, static_cast<int64_t>(k) + 1);
    put(prompt[i + 1], lps[i].logprob, lps[i].rank);
    out.push_back(std::move(e));
  }
  return out;
}

bool valid_request_id(std::string_view id) {
  return !id.empty() && id.size() <= 256 &&
         std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 0x7F; });
}

json echo_logprobs_json(const Tokenizer* tok, std::span<const int32_t> prompt, std::span<const StepLogprobs> prompt_lps,
                        int top, std::span<const int32_t> ids, std::span<const StepLogprobs> lps,
                        size_t* end_offset) {
  size_t offset = 0;
  if (prompt.empty()) {
    json out = logprobs_json(tok, /*chat=*/false, ids, lps, &offset);
    if (end_offset) *end_offset = offset;
    return out;
  }
  // The prompt's first token: text, no log-probability (null, as OpenAI's and vLLM's).
  const std::string first = token_text(tok, prompt[0]);
  offset = utf8_chars(first);
  std::vector<StepLogprobs> shown(prompt_lps.begin(), prompt_lps.end());
  for (StepLogprobs& lp : shown) lp.top.resize(std::min(lp.top.size(), static_cast<size_t>(std::max(top, 0))));
  json head = logprobs_json(tok, false, prompt.subspan(1), shown, &offset);
  json tail = logprobs_json(tok, false, ids, lps, &offset);
  json out = {{"tokens", json::array({first})},
              {"token_logprobs", json::array({nullptr})},
              {"top_logprobs", json::array({nullptr})},
              {"text_offset", json::array({0})}};
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const json* part : {&head, &tail})
      for (const json& v : (*part)[key]) out[key].push_back(v);
  if (end_offset) *end_offset = offset;
  return out;
}

void put_chat_message(json& choice, const std::string& text, const ChatParsing& parsing) {
  json& m = choice["message"];
  m = {{"role", "assistant"}, {"content", text}};
  std::string content = text;
  if (parsing.reasoning) {
    ReasoningSplit split = split_reasoning(text, *parsing.reasoning);
    const json reasoning = split.reasoning ? json(*split.reasoning) : json(nullptr);
    m["content"] = split.content ? json(*split.content) : json(nullptr);
    m["reasoning_content"] = reasoning;
    m["reasoning"] = reasoning;
    content = split.content.value_or("");
  }
  m["tool_calls"] = json::array();
  if (!parsing.tool_calls) return;
  ParsedToolCalls parsed = parse_tool_calls(*parsing.tool_calls, content);
  if (parsed.calls.empty()) return;
  m["content"] = parsed.content.empty() ? json(nullptr) : json(parsed.content);
  for (const ToolCall& call : parsed.calls)
    m["tool_calls"].push_back({{"id", new_tool_call_id(*parsing.tool_calls)},
                               {"type", "function"},
                               {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  choice["finish_reason"] = "tool_calls";
}

ChatStream::ChatStream(const ChatParsing& parsing, bool call_deltas)
    : parsing_(parsing),
      reasoning_(parsing.reasoning.value_or(true)),
      calls_(parsing.tool_calls.value_or(ToolCallFormat::kHermes), call_deltas) {}

ChatStream::Delta ChatStream::push(const std::string& piece) {
  Delta d;
  if (parsing_.reasoning) {
    ReasoningStream::Piece p = reasoning_.push(piece);
    d.reasoning = std::move(p.reasoning);
    d.content = std::move(p.content);
  } else {
    d.content = piece;
  }
  if (parsing_.tool_calls) {
    ToolCallStream::Piece p = calls_.push(d.content);
    d.content = std::move(p.content);
    d.tool_calls = std::move(p.tool_calls);
  }
  return d;
}

ChatStream::End ChatStream::finish() {
  End end;
  if (parsing_.reasoning) {
    ReasoningStream::Piece p = reasoning_.finish();
    end.rest.reasoning = std::move(p.reasoning);
    end.rest.content = std::move(p.content);
  }
  if (parsing_.tool_calls) {
    ToolCallStream::Piece shown = calls_.push(end.rest.content);
    ToolCallStream::End calls = calls_.finish();
    end.rest.content = shown.content + calls.content;
    end.tool_calls = std::move(calls.tool_calls);
    // Deltas of this last piece first, they are the earlier part of the calls; one entry per call.
    end.tool_call_deltas = std::move(shown.tool_calls);
    for (json& d : calls.deltas) {
      auto same = std::find_if(end.tool_call_deltas.begin(), end.tool_call_deltas.end(),
                               [&](const json& e) { return e["index"] == d["index"]; });
      if (same == end.tool_call_deltas.end()) end.tool_call_deltas.push_back(std::move(d));
      else (*same)["function"]["arguments"] = (*same)["function"]["arguments"].get<std::string>() +
                                               d["function"]["arguments"].get<std::string>();
    }
  }
  return end;
}

int http_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupported:
    case ErrorCode::kCorrupt: return 400;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kOutOfMemory: return 503;
    case ErrorCode::kIo:
    case ErrorCode::kInternal: return 500;
  }
  return 500;
}

nlohmann::json error_json(const Error& e) {
  const int status = http_status(e.code);
  const char* type = status == 400   ? "invalid_request_error"
                     : status == 404 ? "not_found_error"
                     : status == 503 ? "service_unavailable_error"
                                     : "server_error";
  json err = {{"message", e.message}, {"type", type}, {"param", nullptr}, {"code", status}};
  return json{{"error", std::move(err)}};
}

CompletionText::CompletionText(const Tokenizer& tok, std::vector<std::string> stop, bool skip_special_tokens,
                               int32_t context_id, int min_tokens, bool include_stop)
    : tok_(tok),
      dec_(tok),
      stop_(std::move(stop)),
      skip_special_(skip_special_tokens),
      include_stop_(include_stop),
      min_tokens_(min_tokens) {
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
  if (context_id >= 0 && !tok_.is_special(context_id)) dec_.prime(context_id);
}

bool CompletionText::cut_at_stop(size_t end_after) {
  if (pushed_ < min_tokens_) return false;
  const size_t from = end_after >= longest_stop_ ? end_after - longest_stop_ + 1 : 0;
  size_t best = std::string::npos;
  for (const std::string& s : stop_) {
    // The first match of s that ends after end_after (one wholly before it was looked for with an
    // earlier piece, or lies before min_tokens).
    for (size_t at = text_.find(s, from); at != std::string::npos; at = text_.find(s, at + 1)) {
      if (at + s.size() <= end_after) continue;
      if (at < best) {
        best = at;
        matched_ = s;
      }
      break;
    }
  }
  if (best == std::string::npos) return false;
  text_.resize(include_stop_ ? best + matched_->size() : best);
  return true;
}

std::string CompletionText::take(size_t upto) {
  upto = std::max(upto, shown_);
  std::string out = text_.substr(shown_, upto - shown_);
  shown_ = upto;
  return out;
}

std::string CompletionText::push(int32_t id, bool ends_step) {
  ++pushed_;
  if (matched_ || (ends_step && !include_stop_) || (skip_special_ && tok_.is_special(id))) return {};
  const size_t before = text_.size();
  text_ += dec_.push(id);
  if (cut_at_stop(before)) return take(text_.size());
  // Held back: the last longest_stop_ - 1 bytes, which a later piece may complete into a stop string.
  const size_t hold = longest_stop_ > 0 ? longest_stop_ - 1 : 0;
  return take(text_.size() > hold ? text_.size() - hold : 0);
}

std::string CompletionText::finish() {
  if (!matched_) {
    const size_t before = text_.size();
    text_ += dec_.finish();
    cut_at_stop(before);
  }
  return take(text_.size());
}

}  // namespace lragent::server
