// Anthropic's Messages API (messages_api.h): the translation of a request into the chat
// completion it runs as and the content blocks and events a completion becomes; end to end over
// HTTP on the synthetic model with Qwen2.5's real template, where every message must carry the
// text /v1/chat/completions gives for the same conversation and seed, and Anthropic's own
// JavaScript SDK (fetched by scripts/fetch-fixtures.sh) must read what the server sends.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_fixture.h"
#include "server/messages_api.h"
#include "server/openai_api.h"
#include "server/stream_fixture.h"
#include "server/synthetic_chat_fixture.h"

namespace lragent::server {
namespace {

using nlohmann::json;

ChatRequest as_chat(const json& body) {
  auto m = parse_messages_request(body.dump());
  EXPECT_TRUE(m.ok()) << body.dump() << "\n" << (m.ok() ? "" : m.error().message);
  if (!m.ok()) return {};
  auto c = parse_chat_request(m->chat.dump());
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? *c : ChatRequest{};
}

std::string error_of(const json& body) {
  auto r = parse_messages_request(body.dump());
  return r.ok() ? "" : r.error().message;
}

TEST(MessagesApi, BlocksBecomeTheChatMessagesTheyStandFor) {
  const json messages = json::parse(R"([
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "Two cities.", "signature": "x"},
      {"type": "text", "text": "Checking."},
      {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
      {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Rome"}}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
      {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "rain"}]},
      {"type": "text", "text": "And tomorrow?"}]}
  ])");
  ChatRequest c = as_chat({{"model", "plan"}, {"max_tokens", 9}, {"system", {{{"type", "text"}, {"text", "Be brief."}}}},
                           {"messages", messages}, {"stop_sequences", {"END"}}, {"temperature", 0.5}, {"top_k", 4},
                           {"thinking", {{"type", "disabled"}}}});
  ASSERT_EQ(c.messages.size(), 6u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "Be brief.");
  const ChatMessage& a = c.messages[2];
  EXPECT_EQ(a.role, "assistant");
  EXPECT_EQ(a.content, "Checking.");
  EXPECT_EQ(a.reasoning_content.value_or(""), "Two cities.");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(json::parse(a.tool_calls[1].arguments), json({{"city", "Rome"}}));
  EXPECT_EQ(c.messages[3].role, "tool");
  EXPECT_EQ(c.messages[3].template_view["tool_call_id"], "t1");
  EXPECT_EQ(c.messages[4].content, "rain");
  EXPECT_EQ(c.messages[5].role, "user");
  EXPECT_EQ(c.messages[5].content, "And tomorrow?");
  EXPECT_EQ(c.req.max_tokens, 9);
  EXPECT_EQ(c.req.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(c.req.sampling.top_k, 4);
  EXPECT_FALSE(c.enable_thinking);

  // Tools and tool_choice in chat's form: "any" is required, "tool" names one.
  const json tools = json::parse(R"([{"name": "weather", "description": "d", "input_schema": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}])");
  c = as_chat({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools},
               {"tool_choice", {{"type", "tool"}, {"name", "weather"}}}});
  ASSERT_EQ(c.tools.size(), 1u);
  EXPECT_EQ(json::parse(c.tools[0])["function"]["parameters"]["required"][0], "city");
  EXPECT_EQ(c.req.guided_from, "tool_choice");
  c = as_chat({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools},
               {"tool_choice", {{"type", "any"}}}});
  EXPECT_EQ(c.req.guided_from, "tool_choice");
  c = as_chat({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools},
               {"tool_choice", {{"type", "auto"}}}});
  EXPECT_TRUE(c.req.guided_from.empty());
  EXPECT_TRUE(c.tool_calls.has_value());
}

TEST(MessagesApi, WhatIsNotServedIsRefusedByName) {
  const json user = {{{"role", "user"}, {"content", "x"}}};
  EXPECT_NE(error_of({{"messages", user}}).find("'max_tokens' is required"), std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 0}, {"messages", user}}).find("'max_tokens'"), std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 5}}).find("'messages'"), std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 5}, {"messages", {{{"role", "system"}, {"content", "x"}}}}}).find("messages[0].role"),
            std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}}})
                .find("messages[0].content[0] is a 'image' block"),
            std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", "tool_use"}}}}}}}})
                .find("a user message cannot hold"),
            std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 5}, {"messages", user}, {"tools", {{{"type", "web_search_20250305"}, {"name", "s"}}}}})
                .find("tools[0] is a 'web_search_20250305' tool"),
            std::string::npos);
  EXPECT_NE(error_of({{"max_tokens", 5}, {"messages", user}, {"mcp_servers", json::array()}}).find("mcp_servers"),
            std::string::npos);
  // A final assistant message (a prefill) is continued: the chat request says so.
  const ChatRequest prefill =
      as_chat({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "The"}}}}});
  EXPECT_TRUE(prefill.continue_final_message);
  EXPECT_FALSE(prefill.add_generation_prompt);
  EXPECT_FALSE(as_chat({{"max_tokens", 5}, {"messages", user}}).continue_final_message);
  EXPECT_NE(error_of({{"max_tokens", 5}, {"messages", user}, {"thinking", {{"type", "maybe"}}}}).find("'thinking'"),
            std::string::npos);
  auto u = parse_messages_request(json({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", "document"}}}}}}}}).dump());
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.error().code, ErrorCode::kUnsupported);
  // count_tokens needs no max_tokens.
  EXPECT_TRUE(parse_count_tokens_request(json({{"messages", user}}).dump()).ok());
  EXPECT_EQ(messages_error_json(404, "m")["error"]["type"], "not_found_error");
  EXPECT_EQ(messages_error_json(400, "m")["type"], "error");
}

// The message the events rebuild, as the SDK's MessageStream rebuilds it (a tool_use block's
// input parsed from its partial_json pieces joined).
json rebuild_message(const std::vector<json>& ev) {
  json snapshot;
  std::vector<std::string> partial(16);
  for (const json& e : ev) {
    const std::string type = e["type"];
    if (type == "message_start") {
      snapshot = e["message"];
    } else if (type == "content_block_start") {
      EXPECT_EQ(e["index"], snapshot["content"].size());
      snapshot["content"].push_back(e["content_block"]);
    } else if (type == "content_block_delta") {
      const size_t i = e["index"];
      json& block = snapshot["content"][i];
      const json& d = e["delta"];
      if (d["type"] == "text_delta") block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "thinking_delta") block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "input_json_delta") {
        partial[i] += d["partial_json"].get<std::string>();
        const json input = json::parse(partial[i], nullptr, /*allow_exceptions=*/false);  // complete so far
        if (!input.is_discarded()) block["input"] = input;
      }
    } else if (type == "message_delta") {
      snapshot["stop_reason"] = e["delta"]["stop_reason"];
      snapshot["stop_sequence"] = e["delta"]["stop_sequence"];
      snapshot["usage"]["output_tokens"] = e["usage"]["output_tokens"];
      snapshot["usage"]["input_tokens"] = e["usage"]["input_tokens"];
      snapshot["usage"]["cache_read_input_tokens"] = e["usage"]["cache_read_input_tokens"];
    }
  }
  return snapshot;
}

// The events rebuild the message exactly, as the SDK's MessageStream rebuilds it.
TEST(MessagesApi, EventsRebuildTheMessage) {
  MessageBuilder b("msg_1", "plan", 30);
  std::vector<json> ev;
  b.begin(ev);
  b.thinking("Let me ", ev);
  b.thinking("think.", ev);
  b.text("Hello", ev);
  b.text(" there", ev);
  const json calls = json::parse(R"([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, 2]}"}},
      {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}])");
  b.finish(calls, "stop", std::nullopt, 12, 20, ev);
  const json snapshot = rebuild_message(ev);
  EXPECT_EQ(ev.back()["type"], "message_stop");
  EXPECT_EQ(ev[1]["type"], "ping");  // as Anthropic's API sends it, after message_start
  const json& m = b.message();
  // Tool ids are made by the builder: the snapshot has them from content_block_start.
  EXPECT_EQ(snapshot, m);
  ASSERT_EQ(m["content"].size(), 4u);
  EXPECT_EQ(m["content"][0]["thinking"], "Let me think.");
  EXPECT_EQ(m["content"][1]["text"], "Hello there");
  EXPECT_EQ(m["content"][2]["input"], json({{"a", {1, 2}}}));
  EXPECT_EQ(m["content"][3]["input"], json({{"arguments", "not json"}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["usage"]["input_tokens"], 10);  // 30 less the 20 read from the cache
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 20);

  MessageBuilder s("msg_2", "plan", 5);
  std::vector<json> ev2;
  s.begin(ev2);
  s.text("a.", ev2);
  s.finish(json::array(), "stop", std::string("END"), 2, 0, ev2);
  EXPECT_EQ(s.message()["stop_reason"], "stop_sequence");
  EXPECT_EQ(s.message()["stop_sequence"], "END");
  MessageBuilder l("msg_3", "plan", 5);
  l.finish(json::array(), "length", std::nullopt, 2, 0, ev2);
  EXPECT_EQ(l.message()["stop_reason"], "max_tokens");
}

// Calls streamed as the model writes them (ChatStream with call_deltas): an object's arguments go
// out as input_json_delta pieces, arguments that are no object wait for the end; the events
// rebuild the message, whose inputs are the calls' parsed arguments.
TEST(MessagesApi, StreamedCallsRebuildTheMessage) {
  ChatParsing parsing;
  parsing.tool_calls = ToolCallFormat::kHermes;
  ChatStream text(parsing, /*call_deltas=*/true);
  MessageBuilder b("msg_3", "plan", 4);
  std::vector<json> ev;
  b.begin(ev);
  const std::string out =
      "Checking.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>"
      "<tool_call>\n{\"name\": \"g\", \"arguments\": \"as text\"}\n</tool_call>";
  ChatStream::End end = testing::stream_into(text, b, out, ev);
  b.finish(end.tool_calls, "stop", std::nullopt, 30, 0, ev);
  size_t pieces = 0;
  for (const json& e : ev) pieces += e["type"] == "content_block_delta" && e["delta"]["type"] == "input_json_delta";
  EXPECT_GT(pieces, 5u) << "the first call's arguments went out in pieces";
  const json& m = b.message();
  EXPECT_EQ(rebuild_message(ev), m);
  ASSERT_EQ(m["content"].size(), 3u) << m.dump();
  EXPECT_EQ(m["content"][0]["text"], "Checking.");
  EXPECT_EQ(m["content"][1]["input"], json({{"city", "Paris"}, {"days", {1, 2}}}));
  EXPECT_EQ(m["content"][2]["name"], "g");
  EXPECT_EQ(m["content"][2]["input"], json({{"arguments", "\"as text\""}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");
}

// The same for pythonic and deepseek_v3 calls: their arguments go out as pieces too (a call opens
// with the first of them, which shows they are an object).
TEST(MessagesApi, PythonicAndDeepSeekCallsStreamAsPieces) {
  for (const auto& [format, out] : std::vector<std::pair<ToolCallFormat, std::string>>{
           {ToolCallFormat::kPythonic, "[f(city='Paris', days=[1, 2]), g()]"},
           {ToolCallFormat::kDeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"city\": \"Paris\", \"days\": [1, "
            "2]}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜>"
            "<｜tool▁calls▁end｜>"}}) {
    ChatParsing parsing;
    parsing.tool_calls = format;
    ChatStream text(parsing, /*call_deltas=*/true);
    MessageBuilder b("msg_4", "plan", 4);
    std::vector<json> ev;
    b.begin(ev);
    ChatStream::End end = testing::stream_into(text, b, out, ev);
    b.finish(end.tool_calls, "stop", std::nullopt, 30, 0, ev);
    size_t pieces = 0;
    for (const json& e : ev) pieces += e["type"] == "content_block_delta" && e["delta"]["type"] == "input_json_delta";
    EXPECT_GT(pieces, 3u) << out;
    const json& m = b.message();
    EXPECT_EQ(rebuild_message(ev), m) << out;
    ASSERT_EQ(m["content"].size(), 2u) << m.dump();
    EXPECT_EQ(m["content"][0]["input"], json({{"city", "Paris"}, {"days", {1, 2}}}));
    EXPECT_EQ(m["content"][1]["name"], "g");
    EXPECT_EQ(m["content"][1]["input"], json::object());
  }
}

class MessagesTest : public testing::SyntheticChatServerTest {};

// A message's text is the chat completion's for the same conversation and seed, whole and
// streamed; errors come in the API's shape.
TEST_F(MessagesTest, AMessageIsTheChatCompletionOfItsConversation) {
  const json sampling = {{"temperature", 0.8}, {"seed", 9}, {"logit_bias", ascii_only()}};
  const json cj = chat_reference("plan", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}},
                                  20, sampling);
  ASSERT_FALSE(cj.is_null());
  const std::string want = cj["choices"][0]["message"]["content"];

  json body = {{"model", "plan"}, {"system", "Be brief."}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 20}};
  body.update(sampling);
  auto [st, text] = post("/v1/messages", body);
  ASSERT_EQ(st, 200) << text;
  const json m = json::parse(text);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["model"], "plan");
  ASSERT_EQ(m["content"].size(), 1u) << text;
  EXPECT_EQ(m["content"][0]["text"], want);
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_EQ(m["usage"]["input_tokens"].get<int64_t>() + m["usage"]["cache_read_input_tokens"].get<int64_t>(),
            cj["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_GT(m["usage"]["cache_read_input_tokens"].get<int64_t>(), 0);  // the chat request's trajectory

  body["stream"] = true;
  auto [sst, events] = post("/v1/messages", body);
  ASSERT_EQ(sst, 200) << events;
  std::string streamed;
  std::vector<std::string> types;
  for (const json& e : testing::sse_events(events)) {
    types.push_back(e["type"]);
    if (e["type"] == "content_block_delta") streamed += e["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, want);
  ASSERT_GE(types.size(), 5u);
  EXPECT_EQ(types.front(), "message_start");
  EXPECT_EQ(types[1], "ping");
  EXPECT_EQ(types.back(), "message_stop");
  EXPECT_NE(events.find("event: content_block_delta\ndata: "), std::string::npos);
  EXPECT_NE(events.find("event: ping\ndata: {\"type\":\"ping\"}"), std::string::npos);

  // count_tokens: the prompt's tokens.
  body.erase("stream");
  auto [tst, tcount] = post("/v1/messages/count_tokens", body);
  ASSERT_EQ(tst, 200) << tcount;
  EXPECT_EQ(json::parse(tcount)["input_tokens"], cj["usage"]["prompt_tokens"]);

  // A tool result goes back as chat's tool message: the same completion as chat gives.
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}}])");
  json tchat = {{"model", "action"}, {"tools", tools}, {"max_tokens", 10},
                {"messages", json::parse(R"([{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "t1", "type": "function",
                     "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "sunny"}])")}};
  tchat.update(sampling);
  auto [tcs, tct] = post("/v1/chat/completions", tchat);
  ASSERT_EQ(tcs, 200) << tct;
  json tmsg = {{"model", "action"}, {"max_tokens", 10},
               {"tools", json::parse(R"([{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])")},
               {"messages", json::parse(R"([{"role": "user", "content": "Weather?"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}])")}};
  tmsg.update(sampling);
  auto [tms, tmt] = post("/v1/messages", tmsg);
  ASSERT_EQ(tms, 200) << tmt;
  const json tc = json::parse(tct)["choices"][0]["message"];
  const json tm = json::parse(tmt);
  if (tc["tool_calls"].empty()) {
    EXPECT_EQ(tm["content"][0]["text"], tc["content"]) << tmt;
  }
  EXPECT_EQ(tm["usage"]["output_tokens"], json::parse(tct)["usage"]["completion_tokens"]);

  // Errors in the API's shape.
  auto [est, etext] = post("/v1/messages", {{"model", "nobody"}, {"max_tokens", 3}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(est, 404);
  const json err = json::parse(etext);
  EXPECT_EQ(err["type"], "error");
  EXPECT_EQ(err["error"]["type"], "not_found_error");
  EXPECT_EQ(post("/v1/messages", {{"messages", {{{"role", "user"}, {"content", "x"}}}}}).first, 400);
}

// vLLM's continue_final_message: the chat is cut after the final message's text, so the model
// goes on with it; the prompt is what /tokenize gives for the same flags, and the Messages API's
// prefill (a final assistant message) is that chat completion.
TEST_F(MessagesTest, AFinalMessageIsContinued) {
  const json sampling = {{"temperature", 0.8}, {"seed", 5}, {"logit_bias", ascii_only()}};
  const json convo = {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "The answer is"}}};
  json chat = {{"model", "plan"}, {"messages", convo}, {"max_tokens", 12}, {"add_generation_prompt", false},
               {"continue_final_message", true}};
  chat.update(sampling);
  auto [cs, ctext] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cs, 200) << ctext;
  const std::string content = json::parse(ctext)["choices"][0]["message"]["content"];

  auto [ts, ttext] = post("/tokenize", {{"model", "plan"}, {"messages", convo}, {"add_generation_prompt", false},
                                         {"continue_final_message", true}});
  ASSERT_EQ(ts, 200) << ttext;
  const std::vector<int32_t> ids = json::parse(ttext)["tokens"];
  const std::string prompt = tok_->decode(ids);
  EXPECT_TRUE(prompt.ends_with("assistant\nThe answer is")) << prompt;  // Qwen2.5's turn, left open
  json completion = {{"model", "plan"}, {"prompt", ids}, {"max_tokens", 12}};
  completion.update(sampling);
  auto [ps, ptext] = post("/v1/completions", completion);
  ASSERT_EQ(ps, 200) << ptext;
  EXPECT_EQ(json::parse(ptext)["choices"][0]["text"], content);

  json msg = {{"model", "plan"}, {"messages", convo}, {"max_tokens", 12}};
  msg.update(sampling);
  auto [ms, mtext] = post("/v1/messages", msg);
  ASSERT_EQ(ms, 200) << mtext;
  EXPECT_EQ(json::parse(mtext)["content"][0]["text"], content);

  chat.erase("add_generation_prompt");  // vLLM's rule: not with a generation prompt
  auto [es, etext] = post("/v1/chat/completions", chat);
  EXPECT_EQ(es, 400);
  EXPECT_NE(etext.find("'continue_final_message' and 'add_generation_prompt' cannot both be true"), std::string::npos)
      << etext;
}

// Behind a reasoning parser the thinking is a block of its own; with thinking disabled, all of it is text.
TEST_F(MessagesTest, ThinkingIsABlockOfItsOwn) {
  ServerOptions o;
  o.reasoning_parser = ReasoningFormat::kQwen3;
  start(o);
  const json sampling = {{"temperature", 0.8}, {"seed", 4}, {"logit_bias", ascii_only()}};
  const json cj = chat_reference("plan", {{{"role", "user"}, {"content", "Which is older?"}}}, 24, sampling);
  ASSERT_FALSE(cj.is_null());
  const std::string reasoning = cj["choices"][0]["message"]["reasoning_content"];

  json body = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Which is older?"}}}}, {"max_tokens", 24}};
  body.update(sampling);
  auto [st, text] = post("/v1/messages", body);
  ASSERT_EQ(st, 200) << text;
  const json m = json::parse(text);
  ASSERT_EQ(m["content"].size(), 1u) << text;
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], reasoning);
  body["stream"] = true;
  auto [sst, events] = post("/v1/messages", body);
  ASSERT_EQ(sst, 200) << events;
  std::string streamed;
  for (const json& e : testing::sse_events(events))
    if (e["type"] == "content_block_delta") streamed += e["delta"].value("thinking", "");
  EXPECT_EQ(streamed, reasoning);
  body["stream"] = false;
  body["thinking"] = {{"type", "disabled"}};
  auto [ost, off] = post("/v1/messages", body);
  ASSERT_EQ(ost, 200) << off;
  const json plain = json::parse(off);
  ASSERT_EQ(plain["content"].size(), 1u) << off;
  EXPECT_EQ(plain["content"][0]["type"], "text");
  EXPECT_EQ(plain["content"][0]["text"], reasoning);
}

// A thinking budget (vLLM's thinking_token_budget; the Messages API's thinking.budget_tokens):
// after that many tokens the model, still thinking, writes "</think>" and then answers. The
// synthetic model never closes its thinking by itself: unbounded, all 24 tokens are reasoning.
TEST_F(MessagesTest, AThinkingBudgetEndsTheThinking) {
  ServerOptions o;
  o.reasoning_parser = ReasoningFormat::kQwen3;
  start(o);
  const json sampling = {{"temperature", 0.8}, {"seed", 4}, {"logit_bias", ascii_only()}};
  const json convo = {{{"role", "user"}, {"content", "Which is older?"}}};
  const json free = chat_reference("plan", convo, 24, sampling);
  ASSERT_FALSE(free.is_null());
  const std::string reasoning = free["choices"][0]["message"]["reasoning_content"];
  ASSERT_GE(reasoning.size(), 6u) << reasoning;  // one byte a token, no </think>

  json chat = {{"model", "plan"}, {"messages", convo}, {"max_tokens", 24}, {"thinking_token_budget", 5}};
  chat.update(sampling);
  auto [cs, ctext] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cs, 200) << ctext;
  const json msg = json::parse(ctext)["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], reasoning.substr(0, 5));  // the same draws up to the budget
  const std::string content = msg["content"].is_string() ? msg["content"].get<std::string>() : "";
  EXPECT_FALSE(content.empty()) << ctext;  // 24 - 5 - the marker's tokens, answered

  json body = {{"model", "plan"}, {"messages", convo}, {"max_tokens", 24},
               {"thinking", {{"type", "enabled"}, {"budget_tokens", 5}}}};
  body.update(sampling);
  auto [ms, mtext] = post("/v1/messages", body);
  ASSERT_EQ(ms, 200) << mtext;
  const json m = json::parse(mtext);
  ASSERT_EQ(m["content"].size(), 2u) << mtext;
  EXPECT_EQ(m["content"][0]["thinking"], reasoning.substr(0, 5));
  EXPECT_EQ(m["content"][1]["text"], content);
  body["thinking"]["budget_tokens"] = -1;
  EXPECT_EQ(post("/v1/messages", body).first, 400);

  start(ServerOptions{});  // no reasoning parser: nothing says where thinking ends
  auto [es, etext] = post("/v1/chat/completions", chat);
  EXPECT_EQ(es, 400);
  EXPECT_NE(etext.find("'thinking_token_budget' needs to know where a model's thinking ends"), std::string::npos) << etext;
}

// Anthropic's JavaScript SDK reads the server's messages and events (tests/server/messages_sdk.mjs);
// with --api-key it authenticates with x-api-key, as Anthropic's clients do.
TEST_F(MessagesTest, AnthropicsSdkReadsWhatTheServerSends) {
  ServerOptions o;
  o.api_key = "none";
  start(o);
  run_sdk_script("messages_sdk.mjs", "anthropic", fmt::format("http://127.0.0.1:{}", port_));
}

// stop() right after the serving thread starts (before it listens: httplib's own stop does
// nothing then) still ends serve(); start() above restarts servers so, and used to hang.
TEST_F(MessagesTest, AServerStoppedBeforeItListensEnds) {
  for (int i = 0; i < 20; ++i) {
    TearDown();
    auto s = Server::create(*model_, tok_.get(), &reg_, ServerOptions{});
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_TRUE((*s)->bind("127.0.0.1", 0).ok());
    std::atomic<bool> returned{false};
    Server* raw = s->get();
    std::thread t([raw, &returned] {
      (void)raw->serve();
      returned = true;
    });
    raw->stop();
    for (int ms = 0; ms < 5000 && !returned; ms += 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(returned) << "serve() still running 5 s after stop()";
    t.join();
  }
}

}  // namespace
}  // namespace lragent::server
