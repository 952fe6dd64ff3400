// Server's Anthropic Messages API routes (messages_api.h): a request runs as the chat completion
// it translates to, through the same prepare/run as /v1/chat/completions; its text becomes
// content blocks (ChatStream splits thinking and tool calls, whole or streamed alike). Errors
// are the API's own JSON.
#include <httplib.h>

#include "server/api_translation.h"
#include "server/server_internal.h"

namespace lragent::server {

using nlohmann::json;
using namespace routes;

namespace {

void send_messages_error(httplib::Response& res, const Error& e) {
  const int status = http_status(e.code);
  send_json(res, status, messages_error_json(status, e.message));
}

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
    auto state = std::make_shared<Run>(Run{
        MessageBuilder(translation::random_id("msg"), prepared->agent, static_cast<int64_t>(prepared->ids.front().size())),
        // Whole, the calls are the text's parse. DeepSeek's arguments stream as written, which
        // need not be JSON: the API's input_json_delta pieces must join into JSON, so they wait.
        ChatStream(parsing, /*call_deltas=*/parsed->stream && parsing.tool_calls != ToolCallFormat::kDeepSeekV3)});
    auto push = [state](const ChatStream::Delta& d, EventAnswer::Events& events) {
      state->builder.thinking(d.reasoning, events);
      state->builder.text(d.content, events);
      state->builder.tool_call_deltas(d.tool_calls, events);
    };
    auto answer = std::make_shared<EventAnswer>();
    answer->begin = [state](EventAnswer::Events& events) { state->builder.begin(events); };
    answer->push = [state, push](const CompletionDelta& piece, EventAnswer::Events& events) {
      push(state->text.push(piece.text), events);
    };
    answer->finish = [state, push](const CompletionChoice& c, EventAnswer::Events& events) {
      ChatStream::End end = state->text.finish();
      push(end.rest, events);
      state->builder.tool_call_deltas(end.tool_call_deltas, events);
      state->builder.finish(end.tool_calls, c.finish_reason, c.stop_reason, c.completion_tokens, c.reused_tokens, events);
    };
    answer->fail = [state](const Error& e, EventAnswer::Events& events) { state->builder.fail(e.message, events); };
    answer->whole = [state] { return state->builder.message(); };
    answer->send_error = send_messages_error;
    respond_events(std::move(*prepared), parsed->stream, http, res, std::move(answer));
  });
}

}  // namespace lragent::server
