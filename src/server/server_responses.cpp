// Server's Responses API routes (responses_api.h): a request runs as the chat completion it
// translates to, through the same prepare/run as /v1/chat/completions; its text becomes output
// items (ChatStream splits reasoning and tool calls, whole or streamed alike) and, with
// "store", the response is kept for GET /v1/responses/{id} and previous_response_id.
#include <httplib.h>

#include "server/client_socket.h"
#include "server/server_internal.h"

namespace lragent::server {

using nlohmann::json;
using namespace routes;

namespace {

// "event: TYPE\ndata: JSON\n\n", as the API streams its typed events (no [DONE] after them).
std::string sse(const json& e) { return "event: " + e.value("type", "") + "\ndata: " + dump(e) + "\n\n"; }

}  // namespace

void Server::install_responses_routes() {
  httplib::Server& svr = http_->svr;
  post_route(svr, "/v1/responses", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    if (!opts_.chat_template) return send_error(res, no_chat_template());
    auto parsed = parse_responses_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    respond_responses(*parsed, http, res);
  });
  svr.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto r = responses_->get(id);
    if (!r) return send_error(res, Error{ErrorCode::kNotFound, fmt::format("no stored response '{}'", id)});
    send_json(res, 200, *r);
  });
  svr.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
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
  ChatParsing parsing;
  auto req = chat_completion_request(chat_body(r, history), &parsing);
  if (!req.ok()) return send_error(res, req.error());
  auto prepared = prepare(*req);
  if (!prepared.ok()) return send_error(res, prepared.error());

  // One builder and text splitter for the response, shared by the stream's provider (copied by
  // httplib) and the store at its end.
  struct Run {
    ResponseBuilder builder;
    ChatStream text;
    std::string reasoning;  // all of it, to count its tokens
  };
  const std::string id = fmt::format("resp_{}", random_id("").substr(1));
  auto run_state = std::make_shared<Run>(Run{ResponseBuilder(id, unix_now(), prepared->agent, r), ChatStream(parsing), {}});
  auto push = [run_state](const ChatStream::Delta& d, std::vector<json>& events) {
    run_state->reasoning += d.reasoning;
    run_state->builder.reasoning(d.reasoning, events);
    run_state->builder.text(d.content, events);
  };
  // After the completion: what the splitter held back, the tool calls and the usage; the
  // response is stored when asked.
  auto finish = [this, run_state, push, r](const CompletionChoice& c, std::vector<json>& events) {
    ChatStream::End end = run_state->text.finish();
    push(end.rest, events);
    ResponseBuilder::Usage u;
    u.input = c.prompt_tokens;
    u.output = c.completion_tokens;
    u.cached = c.reused_tokens;
    if (!run_state->reasoning.empty() && tok_) {  // its text re-tokenized: the ids are not split by part
      auto ids = tok_->encode(run_state->reasoning, /*add_special_tokens=*/false);
      if (ids.ok()) u.reasoning = std::min<int64_t>(static_cast<int64_t>(ids->size()), c.completion_tokens);
    }
    run_state->builder.finish(end.tool_calls, c.finish_reason, u, events);
    if (r.store && opts_.max_stored_responses > 0) {
      nlohmann::ordered_json turn = r.input_messages;
      turn.push_back(run_state->builder.assistant_message());
      responses_->put(run_state->builder.response()["id"], r.previous_response_id, run_state->builder.response(),
                      std::move(turn));
    }
  };

  if (!r.stream) {
    const int fd = find_client_socket(http.remote_addr, http.remote_port, http.local_port);
    AliveFn alive;
    if (fd >= 0) alive = [fd] { return client_still_there(fd); };
    auto out = run(*prepared, {}, alive);
    if (!out.ok()) return send_error(res, out.error());
    if (out->empty()) return send_error(res, Error{ErrorCode::kInternal, "a response request ended with no completion"});
    std::vector<json> unsent;  // a whole response: its events are not sent
    run_state->builder.begin(unsent);
    push(run_state->text.push(out->front().text), unsent);
    finish(out->front(), unsent);
    return send_json(res, 200, run_state->builder.response());
  }
  auto prep = std::make_shared<const Prepared>(std::move(*prepared));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, prep, run_state, push, finish](size_t, httplib::DataSink& sink) {
    auto send = [&sink](std::vector<json>& events) {
      bool ok = true;
      for (const json& e : events) {
        const std::string line = sse(e);
        ok = ok && sink.write(line.data(), line.size());
      }
      events.clear();
      return ok;
    };
    std::vector<json> events;
    run_state->builder.begin(events);
    if (!send(events)) return false;
    const AliveFn alive = [&sink] { return !sink.is_writable || sink.is_writable(); };
    auto out = run(*prep, [&](const CompletionDelta& d) {
      push(run_state->text.push(d.text), events);
      return send(events);
    }, alive);
    if (!out.ok()) {
      run_state->builder.fail(out.error(), events);
    } else if (!out->empty()) {
      finish(out->front(), events);
    }
    send(events);
    sink.done();
    return true;
  });
}

}  // namespace lragent::server
