// What server.cpp and server_engine.cpp (the engine side: requests, choices, preemption) and
// server_http.cpp (the HTTP side: routes, responses) share of Server's insides. Not part of the API.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "agents/agent_turn.h"
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

// One choice of a request as the engine thread runs it (server_engine.cpp).
struct Server::ChoiceRun {
  size_t index = 0;                     // the choice (prompt index * n + sample)
  CompletionChoice c;
  int64_t lease = 0;                    // its trajectory (SessionPool id)
  int64_t kept = 0;                     // tokens that trajectory held when it took it (Lease::reused_tokens)
  std::optional<CompletionText> text;   // the shown text and its stop strings (with a tokenizer)
  std::string shown;                    // the echoed prompt
  // Streamed with "logprobs": the echo waits for the prompt's log-probabilities, to go out with
  // the first token (or the step's end), as vLLM's first chunk carries both.
  bool echo_pending = false;
  CompletionDelta pending;              // tokens (and log-probabilities) not sent with a piece yet
  size_t pushed = 0;                    // output tokens given to `text`
  uint64_t seed = 0;                    // its sampler's (a resumed turn draws on from the same stream)
  // Preempted (its trajectory dropped to make room in the KV memory): what it had produced, which
  // its next turn resumes from, and the tokens its earlier turns computed.
  std::vector<int32_t> resumed;
  std::vector<StepLogprobs> resumed_logprobs;  // [resumed] when asked for
  int64_t prefilled_before = 0;
  DraftCounts drafts_before;
  // Preempted once while it ran alone (Server::make_room): it ran short on a trajectory that held
  // other agents' caches too, and resumed without them; short alone again, it does not fit.
  bool restarted_alone = false;
  std::unique_ptr<AgentTurn> turn;
};

// A request between its handler thread (which waits in run()) and the engine thread. The fields
// under `mu` pass pieces and the end to the handler; the rest is the engine's, and the handler
// reads `out` and `error` only once `finished` is set, after which the engine never touches it.
struct Server::Job {
  using Clock = std::chrono::steady_clock;
  const Prepared* p = nullptr;
  bool streaming = false;
  std::atomic<bool> cancelled{false};  // the handler's on_delta declined: the client went away
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CompletionDelta> deltas;  // under mu: pieces for the handler
  bool finished = false;                // under mu
  std::optional<Error> error;
  std::vector<CompletionChoice> out;
  // Engine thread only.
  size_t next = 0;           // the next choice to start (prompt next / n, sample next % n)
  bool running = false;      // counted as running in the metrics
  bool abandoned = false;    // the engine saw `cancelled`
  bool ended = false;        // in ended_
  std::optional<Clock::time_point> first_token;
  // The choices running now: several at once when they can (n > 1, several prompts), each on its
  // own trajectory (a copy of the one its prompt belongs on while another choice runs there).
  std::vector<std::unique_ptr<ChoiceRun>> runs;
  // Choices preempted to make room in the KV memory, in the order they stopped: each resumes
  // (before any new choice of any request starts) once there is room again.
  std::deque<std::unique_ptr<ChoiceRun>> preempted;
  std::vector<std::optional<CompletionChoice>> done;  // [choices()] the finished ones
  size_t choices() const { return p->ids.size() * static_cast<size_t>(p->req.n); }
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
