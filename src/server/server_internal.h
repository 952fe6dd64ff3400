// What server.cpp (the engine side: requests, choices, preemption) and server_http.cpp (the HTTP
// side: routes, responses) share of Server's insides. Not part of the API.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "server/server.h"

namespace lragent::server {

struct Server::Http {
  httplib::Server svr;
  bool bound = false;
  int socket = -1;  // the socket httplib last made (set_socket_options sees each before its bind)
  std::atomic<bool> stop_requested{false};  // stop() was called, maybe before serve() listened
};

struct Server::Prepared {
  CompletionRequest req;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  std::string agent;
  std::vector<std::vector<int32_t>> ids;  // [prompts][tokens]
  std::vector<std::string> echo;          // [prompts] the prompt text, when echo is on
  std::vector<int> budgets;               // [prompts] tokens to generate at most
  std::vector<std::vector<int32_t>> bad_words;  // req.bad_words as token ids (bad_word_ids)
  std::vector<int32_t> reasoning_start;         // with a thinking budget: kThinkStart's ids
  std::vector<int32_t> reasoning_end;           // with a thinking budget: kThinkEnd's ids
  // The structured output every choice follows (req.guided_regex or guided_grammar compiled);
  // null: free text. Shared with the server's guide cache and other requests of the same text
  // (Server::guides_); advanced and masked on the engine thread only.
  std::shared_ptr<guide::TokenGuide> guide;
};

// What the routes of server_http.cpp and server_responses.cpp share.
namespace routes {
std::string dump(const nlohmann::json& j);  // invalid UTF-8 replaced, never a throw
void send_json(httplib::Response& res, int status, const nlohmann::json& j);
void send_error(httplib::Response& res, const Error& e);  // its status (http_status) and error_json
// A POST route whose handler gets the body whatever its Content-Type.
void post_route(httplib::Server& svr, const char* route,
                std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)> handler);
std::string random_hex();                   // 16 hex digits
std::string random_id(const char* prefix);  // "<prefix>-<16 hex digits>"
// OPTIONS with Origin and Access-Control-Request-Method: a browser asking whether it may send a
// cross-origin request (server/cors.h).
bool is_cors_preflight(const httplib::Request& req);
}  // namespace routes

// An API whose answer is built from a completion's text as typed events (the Responses and
// Messages APIs: server_responses.cpp, server_messages.cpp), run by Server::respond_events:
// whole (its events built, not sent, and whole() answered) or streamed as server-sent events
// `event: TYPE` / `data: JSON` (no [DONE] line, as those APIs send none).
struct Server::EventAnswer {
  using Events = std::vector<nlohmann::json>;
  std::function<void(Events&)> begin;
  // The completion, a piece at a time: its text, and the tokens (and log-probabilities, when
  // asked for) that came with it.
  std::function<void(const CompletionDelta& piece, Events&)> push;
  std::function<void(const CompletionChoice&, Events&)> finish;
  std::function<void(const Error&, Events&)> fail;              // after the stream started
  std::function<nlohmann::json()> whole;                        // the answer when not streamed
  std::function<void(httplib::Response&, const Error&)> send_error;
};

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Prompt and completion tokens of a request's choices; a prompt counts once however many
// completions (n) it has, as vLLM counts.
inline std::pair<int64_t, int64_t> count_tokens(const std::vector<CompletionChoice>& cs) {
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    completion += cs[i].completion_tokens;
    if (i == 0 || cs[i].prompt_index != cs[i - 1].prompt_index) prompt += cs[i].prompt_tokens;
  }
  return {prompt, completion};
}

}  // namespace lragent::server
