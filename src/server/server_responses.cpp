// Server's Responses API routes (responses_api.h): a request runs as the chat completion it
// translates to, through the same prepare/run as /v1/chat/completions; its text becomes output
// items (ChatStream splits reasoning and tool calls, whole or streamed alike) and, with
// "store", the response is kept for GET /v1/responses/{id} and previous_response_id; with
// "background", it runs on a job of its own (BackgroundJobs) and is fetched from there (streamed:
// its events kept in an EventLog, for its stream and GET ...?stream=true).
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <exception>
#include <optional>
#include <vector>

#include <httplib.h>

#include "server/api_translation.h"
#include "server/server_internal.h"

namespace lragent::server {

using nlohmann::json;
using namespace routes;

namespace {

// Query parameter `name` as an integer in [lo, hi] (`absent` when it is not given); nullopt when
// it is something else.
std::optional<long long> int_param(const httplib::Request& req, const char* name, long long absent, long long lo,
                                   long long hi) {
  if (!req.has_param(name)) return absent;
  const std::string text = req.get_param_value(name);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) return std::nullopt;
  return v;
}

}  // namespace

void Server::install_responses_routes() {
  httplib::Server& svr = http_->svr;
  post_route(svr, "/v1/responses", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    if (!opts_.chat_template) return send_error(res, no_chat_template());
    auto parsed = parse_responses_request(body, opts_.sampling_defaults);
    if (!parsed.ok()) return send_error(res, parsed.error());
    respond_responses(*parsed, http, res);
  });
  svr.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto r = responses_->get(id);
    if (!r) return send_error(res, Error{ErrorCode::kNotFound, fmt::format("no stored response '{}'", id)});
    // A streamed background response's events again, those after sequence_number
    // `starting_after` (all without it), live while it runs. Others keep no events: said, rather
    // than answered with JSON a client reading events would choke on.
    if (req.has_param("stream") && req.get_param_value("stream") != "false") {
      std::shared_ptr<EventLog> log = event_logs_->find(id);
      if (!log)
        return send_error(res, Error{ErrorCode::kUnsupported,
                                     fmt::format("response '{}' keeps no events to stream again (only a streamed "
                                                 "background response does): GET it without stream=true", id)});
      const std::optional<long long> after = int_param(req, "starting_after", -1, -1, LLONG_MAX - 1);
      if (!after)
        return send_error(res, Error{ErrorCode::kInvalidArgument, "'starting_after' must be an event's sequence_number"});
      return send_event_log(res, log, static_cast<size_t>(*after + 1));
    }
    send_json(res, 200, *r);
  });
  // The API's list: newest first unless order=asc, `limit` (1-100, default 20) a page, `after`
  // an item id to start past; has_more says whether a page follows.
  svr.Get(R"(/v1/responses/([^/]+)/input_items)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto items = responses_->input_items(id);
    if (!items) return send_error(res, Error{ErrorCode::kNotFound, fmt::format("no stored response '{}'", id)});
    const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
    if (order != "asc" && order != "desc")
      return send_error(res, Error{ErrorCode::kInvalidArgument, "'order' must be asc or desc"});
    const std::optional<long long> limit = int_param(req, "limit", 20, 1, 100);
    if (!limit) return send_error(res, Error{ErrorCode::kInvalidArgument, "'limit' must be an integer from 1 to 100"});
    std::vector<nlohmann::ordered_json> all(items->begin(), items->end());
    if (order == "desc") std::reverse(all.begin(), all.end());
    size_t from = 0;
    if (req.has_param("after")) {
      const std::string after = req.get_param_value("after");
      auto it = std::find_if(all.begin(), all.end(), [&](const nlohmann::ordered_json& x) { return x.value("id", "") == after; });
      if (it == all.end())
        return send_error(res, Error{ErrorCode::kNotFound, fmt::format("no input item '{}' in response '{}'", after, id)});
      from = static_cast<size_t>(it - all.begin()) + 1;
    }
    const size_t to = std::min(all.size(), from + static_cast<size_t>(*limit));
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (size_t i = from; i < to; ++i) data.push_back(all[i]);
    nlohmann::ordered_json page = {{"object", "list"},
                                   {"data", data},
                                   {"first_id", data.empty() ? nlohmann::ordered_json(nullptr) : data.front()["id"]},
                                   {"last_id", data.empty() ? nlohmann::ordered_json(nullptr) : data.back()["id"]},
                                   {"has_more", to < all.size()}};
    res.status = 200;
    res.set_content(page.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  // vLLM's and the API's: a background response still queued or in progress stops (its output
  // so far kept, status "cancelled"); any other is refused.
  post_route(svr, R"(/v1/responses/([^/]+)/cancel)", [this](const httplib::Request& req, const std::string&, httplib::Response& res) {
    const std::string id = req.matches[1];
    const bool cancelled = background_->cancel(id);  // returns once its run has stored what it ended as
    auto r = responses_->get(id);
    if (!r) return send_error(res, Error{ErrorCode::kNotFound, fmt::format("no stored response '{}'", id)});
    if (!cancelled)
      return send_error(res, Error{ErrorCode::kInvalidArgument,
                                   fmt::format("response '{}' is {}: only a background response that is queued or in "
                                               "progress can be cancelled", id, r->value("status", "?"))});
    send_json(res, 200, *r);
  });
  svr.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    background_->cancel(id);  // a background response running: stopped first, then dropped
    event_logs_->erase(id);
    if (!responses_->erase(id)) return send_error(res, Error{ErrorCode::kNotFound, fmt::format("no stored response '{}'", id)});
    send_json(res, 200, json{{"id", id}, {"object", "response"}, {"deleted", true}});
  });
}

void Server::respond_responses(const ResponsesRequest& r, const httplib::Request& http, httplib::Response& res) {
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  if (!r.previous_response_id.empty()) {
    auto h = responses_->conversation(r.previous_response_id);
    if (!h.ok()) return send_error(res, h.error());
    history = std::move(*h);
  }
  if (r.background && opts_.max_stored_responses == 0)
    return send_error(res, Error{ErrorCode::kInvalidArgument,
                                 "'background' needs stored responses, and this server keeps none "
                                 "(--max-stored-responses 0)"});
  ChatParsing parsing;
  auto req = chat_completion_request(chat_body(r, history), &parsing);
  if (!req.ok()) return send_error(res, req.error());
  auto prepared = prepare(*req);
  if (!prepared.ok()) return send_error(res, prepared.error());

  // The response's builder and text splitter, kept by the answer's hooks (the stream's provider
  // outlives this call).
  struct Run {
    ResponseBuilder builder;
    ChatStream text;
    std::string reasoning;  // all of it, to count its tokens
    // include message.output_text.logprobs: the entries of tokens whose text has not gone out as
    // the message's yet (held back, or reasoning), for its next piece.
    nlohmann::json pending_logprobs = nlohmann::json::array();
  };
  const std::string id = translation::random_id("resp");
  // Streamed, calls go out as they are written; whole, they are the text's parse (a call cut
  // off by max_tokens stays text, as in a chat completion).
  auto state = std::make_shared<Run>(
      Run{ResponseBuilder(id, unix_now(), prepared->agent, r), ChatStream(parsing, /*call_deltas=*/r.stream), {}});
  auto push = [state](const ChatStream::Delta& d, EventAnswer::Events& events) {
    state->reasoning += d.reasoning;
    state->builder.reasoning(d.reasoning, events);
    if (!d.content.empty()) {
      state->builder.text(d.content, events, state->pending_logprobs);
      state->pending_logprobs = nlohmann::json::array();
    }
    state->builder.tool_call_deltas(d.tool_calls, events);
  };
  auto answer = std::make_shared<EventAnswer>();
  answer->begin = [state](EventAnswer::Events& events) { state->builder.begin(events); };
  answer->push = [this, state, push, with_logprobs = r.output_logprobs](const CompletionDelta& piece,
                                                                        EventAnswer::Events& events) {
    if (with_logprobs) {
      nlohmann::json lp = logprobs_json(tok_, /*chat=*/true, piece.token_ids, piece.logprobs, nullptr);
      for (nlohmann::json& e : lp["content"]) state->pending_logprobs.push_back(std::move(e));
    }
    push(state->text.push(piece.text), events);
  };
  // After the completion: what the splitter held back, the tool calls and the usage; the
  // response is stored when asked.
  answer->finish = [this, state, push, r](const CompletionChoice& c, EventAnswer::Events& events) {
    ChatStream::End end = state->text.finish();
    push(end.rest, events);
    state->builder.text("", events, state->pending_logprobs);  // the last tokens' (a stop id's), when any
    state->builder.tool_call_deltas(end.tool_call_deltas, events);
    ResponseBuilder::Usage u;
    u.input = c.prompt_tokens;
    u.output = c.completion_tokens;
    u.cached = c.reused_tokens;
    if (!state->reasoning.empty() && tok_) {  // its text re-tokenized: the ids are not split by part
      auto ids = tok_->encode(state->reasoning, /*add_special_tokens=*/false);
      if (ids.ok()) u.reasoning = std::min<int64_t>(static_cast<int64_t>(ids->size()), c.completion_tokens);
    }
    state->builder.finish(end.tool_calls, c.finish_reason, u, events);
    if (r.store && opts_.max_stored_responses > 0) {
      nlohmann::ordered_json turn = r.input_messages;
      turn.push_back(state->builder.assistant_message());
      responses_->put(state->builder.response()["id"], r.previous_response_id, state->builder.response(), std::move(turn),
                      r.input_items);
    }
  };
  answer->fail = [state](const Error& e, EventAnswer::Events& events) { state->builder.fail(e, events); };
  answer->whole = [state] { return state->builder.response(); };
  answer->send_error = [](httplib::Response& res, const Error& e) { send_error(res, e); };
  if (!r.background) return respond_events(std::move(*prepared), r.stream, http, res, std::move(answer));

  // Background: stored "queued" and answered at once (streamed: with its events as they come);
  // a job of its own runs it, and `finish` stores it as it ended (a failure, or a cancel before
  // it started, here). A streamed one keeps its events in a log that its request's stream and
  // GET ...?stream=true read, so a client gone does not stop it.
  json queued = state->builder.response();
  queued["status"] = "queued";
  responses_->put(id, r.previous_response_id, queued, r.input_messages, r.input_items);
  std::shared_ptr<EventLog> log = r.stream ? event_logs_->open(id) : nullptr;
  auto p = std::make_shared<const Prepared>(std::move(*prepared));
  Status started = background_->start(id, [this, p, answer, id, r, log](const std::atomic<bool>& cancelled) {
    responses_->set_status(id, "in_progress");
    EventAnswer::Events events;
    auto keep = [&] {
      if (log) log->append(events);
      events.clear();
    };
    answer->begin(events);
    if (!events.empty() && events[0].contains("response")) events[0]["response"]["status"] = "queued";
    keep();
    // Asked between pieces (false stops it at its next token) and while none comes. No caller
    // catches on this thread: an exception is the response's failure, not the process's end.
    Result<std::vector<CompletionChoice>> out = Error{ErrorCode::kInternal, "no run"};
    try {
      out = run(*p, [&](const CompletionDelta& d) {
        answer->push(d, events);
        keep();
        return !cancelled.load();
      }, [&cancelled] { return !cancelled.load(); });
    } catch (const std::exception& e) {
      out = Error{ErrorCode::kInternal, fmt::format("the background response failed: {}", e.what())};
    }
    if (out.ok() && !out->empty()) {
      answer->finish(out->front(), events);
    } else if (cancelled.load()) {  // before it started: no choice ran
      CompletionChoice none;
      none.finish_reason = "abort";
      answer->finish(none, events);
    } else {
      answer->fail(out.ok() ? Error{ErrorCode::kInternal, "a request ended with no completion"} : out.error(), events);
      responses_->put(id, r.previous_response_id, answer->whole(), r.input_messages, r.input_items);
    }
    keep();
    if (log) log->close();
  });
  if (!started.ok()) {
    responses_->erase(id);
    event_logs_->erase(id);
    return send_error(res, started.error());
  }
  if (log) return send_event_log(res, log, 0);
  send_json(res, 200, queued);
}

}  // namespace lragent::server
