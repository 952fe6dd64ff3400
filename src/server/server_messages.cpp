// Server's Anthropic Messages API routes (messages_api.h): a request runs as the chat completion
// it translates to, through the same prepare/run as /v1/chat/completions; its text becomes
// content blocks (ChatStream splits thinking and tool calls, whole or streamed alike). Errors
// are the API's own JSON.
#include <httplib.h>

#include "server/client_socket.h"
#include "server/server_internal.h"

namespace lragent::server {

using nlohmann::json;
using namespace routes;

namespace {

void send_messages_error(httplib::Response& res, const Error& e) {
  const int status = http_status(e.code);
  send_json(res, status, messages_error_json(status, e.message));
}

std::string sse(const json& e) { return "event: " + e.value("type", "") + "\ndata: " + dump(e) + "\n\n"; }

}  // namespace

void Server::install_messages_routes() {
  httplib::Server& svr = http_->svr;
  post_route(svr, "/v1/messages/count_tokens", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    if (!opts_.chat_template) return send_messages_error(res, no_chat_template());
    auto parsed = parse_count_tokens_request(body);
    if (!parsed.ok()) return send_messages_error(res, parsed.error());
    if (auto agent = agent_for(parsed->model); !agent.ok()) return send_messages_error(res, agent.error());
    ChatParsing parsing;
    auto req = chat_completion_request(parsed->chat.dump(-1, ' ', false, json::error_handler_t::replace), &parsing);
    if (!req.ok()) return send_messages_error(res, req.error());
    auto ids = prompt_ids(req->prompts.front());
    if (!ids.ok()) return send_messages_error(res, ids.error());
    send_json(res, 200, json{{"input_tokens", ids->size()}});
  });
  post_route(svr, "/v1/messages", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    if (!opts_.chat_template) return send_messages_error(res, no_chat_template());
    auto parsed = parse_messages_request(body);
    if (!parsed.ok()) return send_messages_error(res, parsed.error());
    ChatParsing parsing;
    auto req = chat_completion_request(parsed->chat.dump(-1, ' ', false, json::error_handler_t::replace), &parsing);
    if (!req.ok()) return send_messages_error(res, req.error());
    auto prepared = prepare(*req);
    if (!prepared.ok()) return send_messages_error(res, prepared.error());

    struct Run {
      MessageBuilder builder;
      ChatStream text;
    };
    const std::string id = fmt::format("msg_{}", random_id("").substr(1));
    auto state = std::make_shared<Run>(
        Run{MessageBuilder(id, prepared->agent, static_cast<int64_t>(prepared->ids.front().size())), ChatStream(parsing)});
    auto push = [state](const ChatStream::Delta& d, std::vector<json>& events) {
      state->builder.thinking(d.reasoning, events);
      state->builder.text(d.content, events);
    };
    auto finish = [state, push](const CompletionChoice& c, std::vector<json>& events) {
      ChatStream::End end = state->text.finish();
      push(end.rest, events);
      state->builder.finish(end.tool_calls, c.finish_reason, c.stop_reason, c.completion_tokens, c.reused_tokens, events);
    };
    if (!parsed->stream) {
      const int fd = find_client_socket(http.remote_addr, http.remote_port, http.local_port);
      AliveFn alive;
      if (fd >= 0) alive = [fd] { return client_still_there(fd); };
      auto out = run(*prepared, {}, alive);
      if (!out.ok()) return send_messages_error(res, out.error());
      if (out->empty()) return send_messages_error(res, Error{ErrorCode::kInternal, "a message request ended with no completion"});
      std::vector<json> unsent;  // a whole message: its events are not sent
      state->builder.begin(unsent);
      push(state->text.push(out->front().text), unsent);
      finish(out->front(), unsent);
      return send_json(res, 200, state->builder.message());
    }
    auto prep = std::make_shared<const Prepared>(std::move(*prepared));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, prep, state, push, finish](size_t, httplib::DataSink& sink) {
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
      state->builder.begin(events);
      if (!send(events)) return false;
      const AliveFn alive = [&sink] { return !sink.is_writable || sink.is_writable(); };
      auto out = run(*prep, [&](const CompletionDelta& d) {
        push(state->text.push(d.text), events);
        return send(events);
      }, alive);
      if (!out.ok()) {
        state->builder.fail(out.error().message, events);
      } else if (!out->empty()) {
        finish(out->front(), events);
      }
      send(events);
      sink.done();
      return true;
    });
  });
}

}  // namespace lragent::server
