// OpenAI's Responses API (POST /v1/responses), as vLLM serves it: a request is translated into
// the /v1/chat/completions body it runs as (so every sampling, tool and structured-output rule
// of chat applies unchanged), and the completion's text into the response's output items
// (reasoning, message, function_call), whole or as the API's stream of typed events. A stored
// response can be continued by `previous_response_id`: the server keeps each response's
// conversation (ResponseStore), and the next request, whichever agent (model) it names, runs
// on that conversation, so its KV cache is the trajectory's (the session pool finds it).
// No HTTP here (server_responses.cpp does that): all of it is tested and fuzzed without a socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "server/openai_api.h"
#include "server/sampling_defaults.h"

namespace lragent::server {

struct ResponsesRequest {
  std::string model;
  bool stream = false;
  bool store = true;  // keep the response for GET /v1/responses/{id} and previous_response_id
  // Answered at once with the response "queued" (stored; streamed: its events as they come); it
  // runs on, and GET /v1/responses/{id} shows it in_progress, then as it ended (streamed, GET
  // ...?stream=true&starting_after=N its events again); POST /v1/responses/{id}/cancel stops it.
  // Needs store.
  bool background = false;
  std::string previous_response_id;  // empty: a new conversation
  std::optional<std::string> instructions;  // a system message before everything (not carried on)
  // include: ["message.output_text.logprobs"]: the output text's tokens carry their
  // log-probabilities (and top_logprobs most likely ones), as chat's logprobs give them.
  bool output_logprobs = false;
  // The chat messages this request adds: its input items as /v1/chat/completions messages.
  nlohmann::ordered_json input_messages = nlohmann::ordered_json::array();
  // Its input as the API lists it back (GET /v1/responses/{id}/input_items): items with ids.
  nlohmann::ordered_json input_items = nlohmann::ordered_json::array();
  // The chat body's other fields (sampling, tools in chat's form, response_format, ...); the
  // messages are added by chat_body().
  nlohmann::ordered_json chat_fields = nlohmann::ordered_json::object();
  // Request fields the response object repeats back (tools, tool_choice, text, temperature, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
};

// Parses and validates a request body. Errors name the field: kInvalidArgument for bad values,
// kUnsupported for what lragent does not serve (images and files, built-in tools such as
// web_search). Fields the API does not know are ignored.
// `defaults`: the sampling defaults the chat completion will apply; the response repeats the
// temperature and top_p it runs with.
Result<ResponsesRequest> parse_responses_request(std::string_view body, const SamplingDefaults& defaults = {});

// The /v1/chat/completions body the request runs as: `history` (the previous response's
// conversation, chat messages; empty for none) after the instructions, then the input.
std::string chat_body(const ResponsesRequest& r, const nlohmann::ordered_json& history);

// A response's output items built from its completion's text, and the events that stream them
// (stream: true). The text comes in pieces already split by ChatStream (reasoning, content); the
// tool calls at the end. The same builder makes a whole response (its events not sent), so a
// streamed response and a whole one have the same items.
class ResponseBuilder {
 public:
  // `id`: "resp_..."; `echo`: ResponsesRequest::echo (and `previous_response_id`, `store`).
  ResponseBuilder(std::string id, int64_t created_at, std::string model, const ResponsesRequest& r);
  // response.created and response.in_progress.
  void begin(std::vector<nlohmann::json>& events);
  // A piece of reasoning, or of the message's text: its item (and content part) opened first.
  void reasoning(const std::string& delta, std::vector<nlohmann::json>& events);
  // `logprobs`: chat's logprobs entries of the tokens that came with this piece (include
  // message.output_text.logprobs); they join the output text's part and ride on the delta event.
  // With no text they still go out, on an empty delta, when the message is open (else dropped).
  void text(const std::string& delta, std::vector<nlohmann::json>& events,
            const nlohmann::json& logprobs = nlohmann::json::array());
  // Tool-call deltas as the chat completions stream sends them (ChatStream with call_deltas): a
  // call's first delta opens its function_call item (closing the item before it), each delta
  // adds a response.function_call_arguments.delta.
  void tool_call_deltas(const nlohmann::json& deltas, std::vector<nlohmann::json>& events);
  // Closes the open item, adds one function_call item per call (chat's tool_calls form: each
  // {"id", "function": {"name", "arguments"}}; the ones tool_call_deltas opened are closed with
  // what they hold), and the final response.completed event
  // (response.incomplete when finish_reason is "length", its incomplete_details saying
  // max_output_tokens; "abort", a client gone: cancelled). The usage's tokens: `u`.
  struct Usage {
    int64_t input = 0, output = 0;
    int64_t cached = 0;     // input tokens the KV cache held already
    int64_t reasoning = 0;  // output tokens of the reasoning
  };
  void finish(const nlohmann::json& tool_calls, const std::string& finish_reason, const Usage& u,
              std::vector<nlohmann::json>& events);
  // An "error" event (after the stream started), then response.failed.
  void fail(const Error& e, std::vector<nlohmann::json>& events);
  const nlohmann::json& response() const { return response_; }
  // The assistant's turn as a chat message (content and tool calls; reasoning_content when any),
  // what a later request continuing this response reads back.
  nlohmann::ordered_json assistant_message() const;

 private:
  nlohmann::json event(const char* type);
  // A piece of the reasoning item's text or of the message's, opening it first.
  void append(bool reasoning, const std::string& delta, std::vector<nlohmann::json>& events,
              const nlohmann::json& logprobs = nlohmann::json::array());
  void close_open_item(std::vector<nlohmann::json>& events);
  nlohmann::json response_;
  int64_t sequence_ = 0;
  // The item being streamed: -1 none; else its index in output and its kind.
  int open_ = -1;
  bool open_is_reasoning_ = false;
  std::vector<int> call_items_;  // [calls opened by tool_call_deltas] each one's index in output
  bool call_open_ = false;       // the last of them is still in progress
  void close_call(std::vector<nlohmann::json>& events);
};

// The responses a server keeps (store: true): each response object, and the conversation a
// request naming it as previous_response_id continues. A response keeps only its own turn
// (its input messages and the assistant's message) and the id before it; a conversation is the
// chain back to its start. The least recently used are dropped past `max_responses` or
// `max_bytes`; a chain's responses are used together (continuing one touches all its chain).
// Thread-safe.
class ResponseStore {
 public:
  ResponseStore(size_t max_responses, size_t max_bytes) : max_responses_(max_responses), max_bytes_(max_bytes) {}
  // Keeps a finished response (a second put of an id replaces it).
  void put(const std::string& id, const std::string& previous_id, nlohmann::json response,
           nlohmann::ordered_json turn_messages, nlohmann::ordered_json input_items = nlohmann::ordered_json::array());
  std::optional<nlohmann::json> get(const std::string& id);
  // Sets a kept response's "status" (a background response going in_progress); false when it is
  // not kept.
  bool set_status(const std::string& id, const std::string& status);
  // The request's input items (ResponsesRequest::input_items), oldest first.
  std::optional<nlohmann::ordered_json> input_items(const std::string& id);
  bool erase(const std::string& id);
  // The chat messages of the conversation that ends with response `id` (every turn of its
  // chain, oldest first). kNotFound when it, or a response of its chain, is not kept;
  // kInvalidArgument when one of them is a background response still queued or in progress.
  Result<nlohmann::ordered_json> conversation(const std::string& id);
  size_t size() const;
  size_t bytes() const;
  // Called with the id of each response the store drops to stay within its bounds (not for
  // erase() or a put that replaces), under the store's lock: the server drops that response's
  // event log with it, so both are kept by this one LRU. It must not call back into the store.
  void on_evict(std::function<void(const std::string&)> f);

 private:
  struct Entry {
    std::string previous;
    nlohmann::json response;
    nlohmann::ordered_json messages;
    nlohmann::ordered_json input_items;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  void touch(Entry& e, const std::string& id);
  void shrink();
  bool erase_locked(const std::string& id);  // mu_ held
  mutable std::mutex mu_;
  size_t max_responses_, max_bytes_, bytes_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // most recently used first
  std::function<void(const std::string&)> on_evict_;
};

}  // namespace lragent::server
