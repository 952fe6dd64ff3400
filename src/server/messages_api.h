// Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens), as vLLM and
// llama.cpp's server serve it, so that clients written for it (Anthropic's SDKs, Claude Code-style
// agents) run on lragent's models and adapters. As with the Responses API (responses_api.h), a
// request is translated into the /v1/chat/completions body it runs as, and the completion's text
// into the API's content blocks (thinking, text, tool_use), whole or as its stream of events.
// Errors take the API's own shape: {"type": "error", "error": {"type", "message"}}.
// No HTTP here (server_messages.cpp does that).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server {

struct MessagesRequest {
  std::string model;
  bool stream = false;
  // The /v1/chat/completions body it runs as (model, messages, sampling, tools, ...).
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();
};

// Parses and validates a request body (max_tokens is required, as the API requires it). Errors
// name the field: kInvalidArgument for bad values, kUnsupported for what lragent does not serve
// (images and documents, server tools such as web_search, MCP servers, citations).
Result<MessagesRequest> parse_messages_request(std::string_view body);
// count_tokens takes the same body without max_tokens.
Result<MessagesRequest> parse_count_tokens_request(std::string_view body);

// {"type": "error", "error": {"type": "invalid_request_error" | "authentication_error" |
// "not_found_error" | "request_too_large" | "overloaded_error" | "api_error", "message"}}, the
// type following the HTTP status (http_status).
nlohmann::json messages_error_json(int status, const std::string& message);

// The assistant message built from a completion's text (split by ChatStream into thinking and
// text, the tool calls at the end), and the events that stream it. The same builder makes the
// whole message, so a streamed one and a whole one have the same blocks.
class MessageBuilder {
 public:
  // input_tokens: the prompt's tokens (message_start's usage; the final usage splits off the cached ones).
  MessageBuilder(std::string id, std::string model, int64_t input_tokens);
  void begin(std::vector<nlohmann::json>& events);  // message_start
  void thinking(const std::string& delta, std::vector<nlohmann::json>& events);
  void text(const std::string& delta, std::vector<nlohmann::json>& events);
  // Tool-call deltas as the chat completions stream sends them (ChatStream with call_deltas): a
  // call whose arguments open an object opens its tool_use block and streams them as
  // input_json_delta (the others wait for finish: the API's input is an object).
  void tool_call_deltas(const nlohmann::json& deltas, std::vector<nlohmann::json>& events);
  // Closes the open block, adds a tool_use block per call (chat's tool_calls form; the arguments
  // parsed into "input"; the blocks tool_call_deltas opened get theirs), then message_delta and
  // message_stop. stop_reason: "tool_use" when
  // there are calls, else from finish_reason ("length": max_tokens; "stop" with a stop string:
  // stop_sequence; else end_turn). cached: the prompt tokens the KV cache held.
  void finish(const nlohmann::json& tool_calls, const std::string& finish_reason,
              const std::optional<std::string>& stop_string, int64_t output_tokens, int64_t cached,
              std::vector<nlohmann::json>& events);
  // An "error" event (after the stream started).
  void fail(const std::string& message, std::vector<nlohmann::json>& events);
  const nlohmann::json& message() const { return message_; }

 private:
  void open(nlohmann::json block, std::vector<nlohmann::json>& events);
  void close(std::vector<nlohmann::json>& events);
  nlohmann::json message_;
  int64_t input_tokens_ = 0;
  int open_ = -1;  // the index of the block being streamed, or -1
  // [calls seen by tool_call_deltas] each one's tool_use block, or -1: not streamed (its
  // arguments are no object), added whole by finish.
  std::vector<int> call_blocks_;
};

}  // namespace lragent::server
