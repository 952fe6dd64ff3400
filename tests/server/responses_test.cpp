// OpenAI's Responses API (responses_api.h): the translation of a request into the chat
// completion it runs as, the output items and events a completion becomes, the response store;
// and end to end over HTTP on the synthetic model with Qwen2.5's real chat template, where
// every response must carry exactly the text /v1/chat/completions gives for the same
// conversation and seed, and OpenAI's own JavaScript SDK (fetched by scripts/fetch-fixtures.sh)
// must read what the server sends, streamed and whole.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/http_fixture.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/stream_fixture.h"
#include "server/synthetic_chat_fixture.h"

namespace lragent::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ResponsesRequest parsed(const json& body) {
  auto r = parse_responses_request(body.dump());
  EXPECT_TRUE(r.ok()) << body.dump() << "\n" << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : ResponsesRequest{};
}

// The chat request a Responses body runs as, parsed by the chat endpoint's own parser.
ChatRequest as_chat(const json& body, const ordered_json& history = ordered_json::array()) {
  auto c = parse_chat_request(chat_body(parsed(body), history));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? *c : ChatRequest{};
}

std::string error_of(const json& body) {
  auto r = parse_responses_request(body.dump());
  return r.ok() ? "" : r.error().message;
}

TEST(ResponsesApi, InputItemsBecomeTheChatMessagesTheyStandFor) {
  // A string: one user message; instructions first, as a system message.
  ChatRequest c = as_chat({{"model", "plan"}, {"input", "Hi"}, {"instructions", "Be brief."}});
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "Be brief.");
  EXPECT_EQ(c.messages[1].role, "user");
  EXPECT_EQ(c.messages[1].content, "Hi");

  // Messages (developer as system, text parts joined as chat joins them), a reasoning item, a
  // message and two calls of one assistant turn, their outputs.
  const json input = json::parse(R"([
    {"role": "developer", "content": "Use tools."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"}, {"type": "input_text", "text": "Paris and Rome?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Two cities."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
    {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\": \"Rome\"}"},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]}
  ])");
  c = as_chat({{"input", input}});
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[1].content, "Weather in\nParis and Rome?");
  const ChatMessage& a = c.messages[2];
  EXPECT_EQ(a.role, "assistant");
  EXPECT_EQ(a.content, "Checking.");
  EXPECT_EQ(a.reasoning_content.value_or(""), "Two cities.");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[1].name, "weather");
  EXPECT_EQ(a.tool_calls[1].arguments, "{\"city\": \"Rome\"}");
  EXPECT_EQ(c.messages[3].role, "tool");
  EXPECT_EQ(c.messages[3].template_view["tool_call_id"], "c1");
  EXPECT_EQ(c.messages[4].content, "rain");

  // A call with no message before it is an assistant turn of its own.
  c = as_chat({{"input", json::parse(R"([{"role": "user", "content": "x"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}])")}});
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].role, "assistant");
  EXPECT_EQ(c.messages[1].tool_calls.size(), 1u);

  // The input as the API lists it back: ids on every item, string contents as parts.
  const ResponsesRequest listed = parsed({{"input", input}});
  ASSERT_EQ(listed.input_items.size(), input.size());
  EXPECT_EQ(listed.input_items[0]["type"], "message");
  EXPECT_EQ(listed.input_items[0]["role"], "developer");
  EXPECT_EQ(listed.input_items[0]["content"][0], ordered_json({{"type", "input_text"}, {"text", "Use tools."}}));
  EXPECT_EQ(listed.input_items[2]["id"], "rs_1");  // an item's own id is kept
  for (const auto& item : listed.input_items) EXPECT_TRUE(item["id"].is_string()) << item.dump();
  EXPECT_EQ(parsed({{"input", "Hi"}}).input_items[0]["content"][0]["text"], "Hi");

  // History goes between the instructions and the input.
  const ordered_json history = ordered_json::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])");
  c = as_chat({{"input", "c"}, {"instructions", "I"}}, history);
  ASSERT_EQ(c.messages.size(), 4u);
  EXPECT_EQ(c.messages[0].content, "I");
  EXPECT_EQ(c.messages[2].content, "b");
  EXPECT_EQ(c.messages[3].content, "c");
}

TEST(ResponsesApi, FieldsMapToTheirChatNames) {
  const json tools = json::parse(R"([{"type": "function", "name": "weather", "description": "d",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}])");
  ChatRequest c = as_chat({{"input", "x"}, {"max_output_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9},
                           {"seed", 11}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"name", "weather"}}}});
  EXPECT_EQ(c.req.max_tokens, 7);
  EXPECT_FLOAT_EQ(c.req.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.req.sampling.top_p, 0.9f);
  EXPECT_TRUE(c.req.seeded);
  ASSERT_EQ(c.tools.size(), 1u);
  EXPECT_EQ(json::parse(c.tools[0])["function"]["name"], "weather");
  EXPECT_EQ(json::parse(c.tools[0])["function"]["strict"], true);
  EXPECT_EQ(c.req.guided_from, "tool_choice");  // a forced call is guided
  // text.format json_schema is chat's response_format.
  c = as_chat({{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"},
              {"schema", {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}}}}}}}});
  EXPECT_EQ(c.req.guided_from, "response_format");
  EXPECT_FALSE(c.req.guided_regex.empty());
  c = as_chat({{"input", "x"}, {"text", {{"format", {{"type", "text"}}}}}});
  EXPECT_TRUE(c.req.guided_from.empty());
  // The response repeats the request's fields, with the API's defaults.
  const ResponsesRequest r = parsed({{"input", "x"}, {"temperature", 0.5}, {"metadata", {{"k", "v"}}}});
  EXPECT_EQ(r.echo["temperature"], 0.5);
  EXPECT_EQ(r.echo["top_p"], 1.0);
  EXPECT_EQ(r.echo["metadata"]["k"], "v");
  EXPECT_EQ(r.echo["tool_choice"], "auto");
  EXPECT_EQ(r.echo["text"]["format"]["type"], "text");
  EXPECT_TRUE(r.store);
}

TEST(ResponsesApi, WhatIsNotServedIsRefusedByName) {
  EXPECT_NE(error_of({{"model", "x"}}).find("'input' is missing"), std::string::npos);
  EXPECT_NE(error_of({{"input", 3}}).find("'input' must be"), std::string::npos);
  EXPECT_NE(error_of({{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "u"}}}}}}}})
                .find("input[0].content[0] is input_image"),
            std::string::npos);
  EXPECT_NE(error_of({{"input", {{{"role", "robot"}, {"content", "x"}}}}}).find("input[0].role"), std::string::npos);
  EXPECT_NE(error_of({{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}}).find("input[0].call_id"),
            std::string::npos);
  EXPECT_NE(error_of({{"input", {{{"type", "item_reference"}, {"id", "x"}}}}}).find("previous_response_id"), std::string::npos);
  EXPECT_NE(error_of({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}).find("tools[0] is a 'web_search' tool"),
            std::string::npos);
  EXPECT_NE(error_of({{"input", "x"}, {"background", true}, {"store", false}}).find("'background' needs \"store\""),
            std::string::npos);
  EXPECT_NE(error_of({{"input", "x"}, {"max_output_tokens", 0}}).find("'max_output_tokens'"), std::string::npos);
  EXPECT_NE(error_of({{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}).find("'text.format.type'"),
            std::string::npos);
  EXPECT_NE(error_of({{"input", "x"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}, {"tool_choice", "any"}})
                .find("'tool_choice'"),
            std::string::npos);
  auto unsupported = parse_responses_request(R"({"input": "x", "tools": [{"type": "web_search"}]})");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_EQ(unsupported.error().code, ErrorCode::kUnsupported);
  auto background = parse_responses_request(R"({"input": "x", "background": true, "stream": true})");
  ASSERT_TRUE(background.ok()) << background.error().message;
  EXPECT_TRUE(background->background);
  EXPECT_FALSE(parse_responses_request("{").ok());
  EXPECT_FALSE(parse_responses_request("[]").ok());
}

// The response the events rebuild, as the SDK's stream helper rebuilds it; the events are in
// order, with sequence numbers from 0.
json rebuild_response(const std::vector<json>& ev) {
  json snapshot;
  for (size_t i = 0; i < ev.size(); ++i) {
    const json& e = ev[i];
    EXPECT_EQ(e["sequence_number"], i);
    const std::string type = e["type"];
    if (i == 0) {
      EXPECT_EQ(type, "response.created");
      snapshot = e["response"];
      continue;
    }
    if (type == "response.output_item.added") {
      EXPECT_EQ(e["output_index"], snapshot["output"].size());
      snapshot["output"].push_back(e["item"]);
    } else if (type == "response.content_part.added") {
      snapshot["output"][e["output_index"].get<size_t>()]["content"].push_back(e["part"]);
    } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      json& part = snapshot["output"][e["output_index"].get<size_t>()]["content"][e["content_index"].get<size_t>()];
      part["text"] = part["text"].get<std::string>() + e["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.delta") {
      json& item = snapshot["output"][e["output_index"].get<size_t>()];
      item["arguments"] = item["arguments"].get<std::string>() + e["delta"].get<std::string>();
    } else if (type == "response.output_item.done") {
      snapshot["output"][e["output_index"].get<size_t>()] = e["item"];
    }
  }
  return snapshot;
}

// The events of a streamed response rebuild its items exactly (as the SDK's stream helper
// rebuilds them), in order, with sequence numbers from 0.
TEST(ResponsesApi, EventsRebuildTheResponse) {
  const ResponsesRequest r = parsed({{"input", "x"}, {"max_output_tokens", 9}});
  ResponseBuilder b("resp_1", 100, "plan", r);
  std::vector<json> ev;
  b.begin(ev);
  b.reasoning("Let me ", ev);
  b.reasoning("think.", ev);
  b.text("Hello", ev);
  b.text(" there", ev);
  const json calls = json::parse(R"([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}])");
  b.finish(calls, "length", {.input = 5, .output = 9, .cached = 2, .reasoning = 3}, ev);
  const json snapshot = rebuild_response(ev);
  EXPECT_EQ(ev.back()["type"], "response.incomplete");
  const json& final = b.response();
  EXPECT_EQ(ev.back()["response"], final);
  EXPECT_EQ(snapshot["output"], final["output"]);
  ASSERT_EQ(final["output"].size(), 3u);
  EXPECT_EQ(final["output"][0]["type"], "reasoning");
  EXPECT_EQ(final["output"][0]["content"][0]["text"], "Let me think.");
  EXPECT_EQ(final["output"][1]["content"][0]["text"], "Hello there");
  EXPECT_EQ(final["output"][2]["call_id"], "call_1");
  EXPECT_EQ(final["output"][2]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(final["status"], "incomplete");
  EXPECT_EQ(final["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(final["usage"]["total_tokens"], 14);
  EXPECT_EQ(final["usage"]["input_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(final["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
  EXPECT_EQ(final["max_output_tokens"], 9);
  // The turn as a chat message, for the conversation a later request continues.
  const ordered_json m = b.assistant_message();
  EXPECT_EQ(m["content"], "Hello there");
  EXPECT_EQ(m["reasoning_content"], "Let me think.");
  EXPECT_EQ(m["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
}

// Calls streamed as the model writes them (ChatStream with call_deltas): each call's item opens
// with its first delta and its arguments come in pieces; the events rebuild the response.
TEST(ResponsesApi, StreamedCallsRebuildTheResponse) {
  ChatParsing parsing;
  parsing.tool_calls = ToolCallFormat::kHermes;
  ChatStream text(parsing, /*call_deltas=*/true);
  const ResponsesRequest r = parsed({{"input", "x"}});
  ResponseBuilder b("resp_2", 100, "plan", r);
  std::vector<json> ev;
  b.begin(ev);
  const std::string out =
      "Checking.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>"
      "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  ChatStream::End end = testing::stream_into(text, b, out, ev);
  b.finish(end.tool_calls, "stop", {.input = 5, .output = 30}, ev);
  size_t pieces = 0;
  for (const json& e : ev) pieces += e["type"] == "response.function_call_arguments.delta";
  EXPECT_GT(pieces, 5u) << "the first call's arguments went out in pieces";
  const json& final = b.response();
  EXPECT_EQ(rebuild_response(ev)["output"], final["output"]);
  ASSERT_EQ(final["output"].size(), 3u) << final.dump();
  EXPECT_EQ(final["output"][0]["content"][0]["text"], "Checking.");
  EXPECT_EQ(final["output"][1]["arguments"], R"({"city": "Paris", "days": [1, 2]})");
  EXPECT_EQ(final["output"][1]["status"], "completed");
  EXPECT_EQ(final["output"][2]["name"], "g");
  EXPECT_EQ(final["output"][2]["arguments"], "{}");
  EXPECT_EQ(final["output"][1]["call_id"], end.tool_calls[0]["id"]);
}

TEST(ResponsesApi, TheStoreKeepsConversationsAndDropsTheLeastRecentlyUsed) {
  auto turn = [](const std::string& u) {
    return ordered_json::array({{{"role", "user"}, {"content", u}}, {{"role", "assistant"}, {"content", u + "!"}}});
  };
  ResponseStore s(3, 1 << 20);
  s.put("r1", "", json{{"id", "r1"}}, turn("a"));
  s.put("r2", "r1", json{{"id", "r2"}}, turn("b"));
  auto conv = s.conversation("r2");
  ASSERT_TRUE(conv.ok());
  ASSERT_EQ(conv->size(), 4u);
  EXPECT_EQ((*conv)[0]["content"], "a");
  EXPECT_EQ((*conv)[3]["content"], "b!");
  // r1 is r2's chain: continuing r2 keeps r1 too; an unrelated response goes first.
  s.put("x", "", json{{"id", "x"}}, turn("x"));
  ASSERT_TRUE(s.conversation("r2").ok());
  s.put("r3", "r2", json{{"id", "r3"}}, turn("c"));
  EXPECT_EQ(s.size(), 3u);
  EXPECT_FALSE(s.get("x"));
  EXPECT_EQ(s.conversation("r3")->size(), 6u);
  // A broken chain says which response is missing.
  ASSERT_TRUE(s.erase("r1"));
  auto broken = s.conversation("r3");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().code, ErrorCode::kNotFound);
  EXPECT_NE(broken.error().message.find("'r1'"), std::string::npos) << broken.error().message;
  EXPECT_EQ(s.conversation("nope").error().code, ErrorCode::kNotFound);
  EXPECT_FALSE(s.erase("nope"));
  // A background response still running is not continued (its turn has no answer yet).
  s.put("bg", "", json{{"id", "bg"}, {"status", "queued"}}, turn("d"));
  ASSERT_TRUE(s.set_status("bg", "in_progress"));
  EXPECT_EQ(s.get("bg")->at("status"), "in_progress");
  auto running = s.conversation("bg");
  ASSERT_FALSE(running.ok());
  EXPECT_EQ(running.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(running.error().message.find("still in progress"), std::string::npos) << running.error().message;
  ASSERT_TRUE(s.set_status("bg", "completed"));
  EXPECT_TRUE(s.conversation("bg").ok());
  EXPECT_FALSE(s.set_status("nope", "completed"));
  // The byte bound.
  ResponseStore small(100, 300);
  for (int i = 0; i < 10; ++i) small.put("r" + std::to_string(i), "", json{{"id", i}}, turn(std::string(50, 'x')));
  EXPECT_LE(small.bytes(), 300u);
  EXPECT_GE(small.size(), 1u);
  EXPECT_TRUE(small.get("r9"));
}

// --- End to end over HTTP --------------------------------------------------------------------
class ResponsesTest : public testing::SyntheticChatServerTest {};

// A response's text is the chat completion's for the same conversation and seed, whole and
// streamed; a continued response runs on its conversation (another agent reads its cache) and
// gives what sending the whole conversation gives.
TEST_F(ResponsesTest, AResponseIsTheChatCompletionOfItsConversation) {
  const json sampling = {{"temperature", 0.8}, {"seed", 9}, {"logit_bias", ascii_only()}};
  const json cj = chat_reference("plan", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}},
                                  20, sampling);
  ASSERT_FALSE(cj.is_null());
  const std::string want = cj["choices"][0]["message"]["content"];

  json body = {{"model", "plan"}, {"instructions", "Be brief."}, {"input", "Hi"}, {"max_output_tokens", 20}};
  body.update(sampling);
  auto [st, text] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << text;
  const json r = json::parse(text);
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["model"], "plan");
  ASSERT_EQ(r["output"].size(), 1u) << text;
  EXPECT_EQ(r["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(r["usage"]["input_tokens"], cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);
  EXPECT_EQ(r["status"], "incomplete");

  body["stream"] = true;
  auto [sst, events] = post("/v1/responses", body);
  ASSERT_EQ(sst, 200) << events;
  std::string streamed;
  json last;
  for (const json& e : testing::sse_events(events)) {
    if (e["type"] == "response.output_text.delta") streamed += e["delta"].get<std::string>();
    last = e;
  }
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(last["type"], "response.incomplete");
  EXPECT_EQ(last["response"]["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(events.find("[DONE]"), std::string::npos);
  EXPECT_NE(events.find("event: response.created\ndata: "), std::string::npos);

  // Continued by another agent: the conversation so far (without the first instructions, as the
  // API drops them) plus the new input, read from the trajectory's cache.
  json next = {{"model", "action"}, {"previous_response_id", r["id"]}, {"input", "More?"}, {"max_output_tokens", 12}};
  next.update(sampling);
  auto [nst, ntext] = post("/v1/responses", next);
  ASSERT_EQ(nst, 200) << ntext;
  const json n = json::parse(ntext);
  const json w = chat_reference("action", {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", want}},
                                          {{"role", "user"}, {"content", "More?"}}}, 12, sampling);
  ASSERT_FALSE(w.is_null());
  EXPECT_EQ(n["output"][0]["content"][0]["text"], w["choices"][0]["message"]["content"]);
  EXPECT_EQ(n["usage"]["input_tokens"], w["usage"]["prompt_tokens"]);
  EXPECT_GT(n["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(n["previous_response_id"], r["id"]);

  // Stored: GET gives it back, DELETE drops it, and then it is a 404 to continue; /metrics counts them.
  httplib::Client c("127.0.0.1", port_);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("\nlragent:stored_responses 3\n"), std::string::npos) << metrics->body;
  auto got = c.Get(fmt::format("/v1/responses/{}", r["id"].get<std::string>()));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["output"], r["output"]);
  auto del = c.Delete(fmt::format("/v1/responses/{}", r["id"].get<std::string>()));
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 200);
  auto [gst, gone] = post("/v1/responses", next);
  EXPECT_EQ(gst, 404) << gone;
  // Not stored: nothing to continue.
  json unstored = body;
  unstored["stream"] = false;
  unstored["store"] = false;
  auto [ust, utext] = post("/v1/responses", unstored);
  ASSERT_EQ(ust, 200) << utext;
  auto missing = c.Get(fmt::format("/v1/responses/{}", json::parse(utext)["id"].get<std::string>()));
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  // Bad requests are 400s naming the field, an unknown model a 404.
  EXPECT_EQ(post("/v1/responses", {{"input", "x"}, {"tools", {{{"type", "file_search"}}}}}).first, 400);
  EXPECT_EQ(post("/v1/responses", {{"model", "nobody"}, {"input", "x"}}).first, 404);
}

// Behind a reasoning parser (serve --reasoning-parser qwen3) the reasoning is an item of its
// own, the text chat gives as reasoning_content (the synthetic model never closes its <think>
// block: all of it), streamed as reasoning_text events; with thinking off, all of it is the message.
// include: ["message.output_text.logprobs"] with top_logprobs: the output text's part carries
// chat's logprobs for the same conversation and seed; streamed, the deltas' logprobs join to
// them (and the done event has them all). Without include, none are computed.
TEST_F(ResponsesTest, OutputTextLogprobsAreChats) {
  const json sampling = {{"temperature", 0.8}, {"seed", 9}, {"logit_bias", ascii_only()}};
  json chat = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 12},
               {"logprobs", true}, {"top_logprobs", 3}};
  chat.update(sampling);
  auto [cs, ctext] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cs, 200) << ctext;
  const json want = json::parse(ctext)["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(want[0]["top_logprobs"].size(), 3u);

  json body = {{"model", "plan"}, {"input", "Hi"}, {"max_output_tokens", 12},
               {"include", {"message.output_text.logprobs"}}, {"top_logprobs", 3}};
  body.update(sampling);
  auto [st, text] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << text;
  const json r = json::parse(text);
  EXPECT_EQ(r["top_logprobs"], 3);
  ASSERT_EQ(r["output"].size(), 1u) << text;
  EXPECT_TRUE(testing::json_near(r["output"][0]["content"][0]["logprobs"], want));

  body["stream"] = true;
  auto [sst, events] = post("/v1/responses", body);
  ASSERT_EQ(sst, 200) << events;
  json joined = json::array(), done;
  for (const json& e : testing::sse_events(events)) {
    if (e["type"] == "response.output_text.delta")
      for (const json& x : e["logprobs"]) joined.push_back(x);
    if (e["type"] == "response.output_text.done") done = e["logprobs"];
  }
  EXPECT_TRUE(testing::json_near(joined, want));
  EXPECT_TRUE(testing::json_near(done, want));

  body.erase("include");
  body["stream"] = false;
  auto [nst, none] = post("/v1/responses", body);
  ASSERT_EQ(nst, 200) << none;
  EXPECT_EQ(json::parse(none)["output"][0]["content"][0]["logprobs"], json::array());
  // More than --max-logprobs (20): refused where they would be computed (included), as vLLM
  // checks its sampling parameters; left out, they are not computed and not checked.
  body["top_logprobs"] = 21;
  EXPECT_EQ(post("/v1/responses", body).first, 200);
  body["include"] = {"message.output_text.logprobs"};
  auto [over, why] = post("/v1/responses", body);
  EXPECT_EQ(over, 400);
  EXPECT_NE(why.find("--max-logprobs"), std::string::npos) << why;
}

TEST_F(ResponsesTest, ReasoningIsAnItemOfItsOwn) {
  ServerOptions o;
  o.reasoning_parser = ReasoningFormat::kQwen3;
  start(o);
  const json sampling = {{"temperature", 0.8}, {"seed", 4}, {"logit_bias", ascii_only()}};
  const json cj = chat_reference("plan", {{{"role", "user"}, {"content", "Which is older?"}}}, 24, sampling);
  ASSERT_FALSE(cj.is_null());
  const std::string reasoning = cj["choices"][0]["message"]["reasoning_content"];
  ASSERT_FALSE(reasoning.empty());

  json body = {{"model", "plan"}, {"input", "Which is older?"}, {"max_output_tokens", 24}};
  body.update(sampling);
  auto [st, text] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << text;
  const json r = json::parse(text);
  ASSERT_EQ(r["output"].size(), 1u) << text;
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], reasoning);
  const int rt = r["usage"]["output_tokens_details"]["reasoning_tokens"];
  EXPECT_GT(rt, 0);
  EXPECT_LE(rt, 24);

  body["stream"] = true;
  auto [sst, events] = post("/v1/responses", body);
  ASSERT_EQ(sst, 200) << events;
  std::string streamed;
  for (const json& e : testing::sse_events(events)) {
    EXPECT_NE(e["type"], "response.output_text.delta");
    if (e["type"] == "response.reasoning_text.delta") streamed += e["delta"].get<std::string>();
  }
  EXPECT_EQ(streamed, reasoning);

  body["stream"] = false;
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto [ost, off] = post("/v1/responses", body);
  ASSERT_EQ(ost, 200) << off;
  const json plain = json::parse(off);
  ASSERT_EQ(plain["output"].size(), 1u) << off;
  EXPECT_EQ(plain["output"][0]["type"], "message");
  EXPECT_EQ(plain["output"][0]["content"][0]["text"], reasoning);
}

// "background": true answers at once with the response queued; it runs on, and GET shows it
// as it ended: the same output as the request without background. One still running cannot be
// continued; cancel stops it (status cancelled, its output so far kept), and only it; streamed,
// its events come as they are made and can be read again; a server stopping cancels the ones
// still running.
TEST_F(ResponsesTest, BackgroundResponsesRunOnAndCanBeCancelled) {
  httplib::Client c("127.0.0.1", port_);
  // GET until it has ended (a minute at most).
  auto ended = [&](const std::string& id) {
    json r;
    for (int i = 0; i < 6000; ++i) {
      auto got = c.Get(fmt::format("/v1/responses/{}", id));
      if (!got || got->status != 200) return json(nullptr);
      r = json::parse(got->body);
      if (r["status"] != "queued" && r["status"] != "in_progress") return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "background response " << id << " still " << r["status"];
    return r;
  };
  const json sampling = {{"temperature", 0.8}, {"seed", 5}, {"logit_bias", ascii_only()}};
  json body = {{"model", "plan"}, {"input", "Hi"}, {"max_output_tokens", 16}};
  body.update(sampling);
  auto [st, text] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << text;
  const json want = json::parse(text);

  body["background"] = true;
  auto [bst, btext] = post("/v1/responses", body);
  ASSERT_EQ(bst, 200) << btext;
  const json queued = json::parse(btext);
  EXPECT_EQ(queued["status"], "queued");
  EXPECT_EQ(queued["background"], true);
  EXPECT_TRUE(queued["output"].empty());
  const json done = ended(queued["id"]);
  EXPECT_EQ(done["status"], want["status"]);
  EXPECT_EQ(done["background"], true);
  ASSERT_EQ(done["output"].size(), 1u) << done;
  EXPECT_EQ(done["output"][0]["content"][0]["text"], want["output"][0]["content"][0]["text"]);
  EXPECT_EQ(done["usage"]["output_tokens"], want["usage"]["output_tokens"]);
  // Ended: not cancelled (400), and continued as any stored response.
  auto [cst, ctext] = post(fmt::format("/v1/responses/{}/cancel", queued["id"].get<std::string>()).c_str(), json::object());
  EXPECT_EQ(cst, 400) << ctext;
  EXPECT_NE(ctext.find("only a background response that is queued or in progress"), std::string::npos) << ctext;
  json next = {{"model", "action"}, {"previous_response_id", queued["id"]}, {"input", "More?"}, {"max_output_tokens", 4}};
  EXPECT_EQ(post("/v1/responses", next).first, 200);

  // A long one (ignore_eos: all 1500 tokens), cancelled at once: stopped, not finished.
  json long_body = {{"model", "plan"}, {"input", "Go on"}, {"max_output_tokens", 1500}, {"ignore_eos", true},
                    {"background", true}};
  long_body.update(sampling);
  auto [lst, ltext] = post("/v1/responses", long_body);
  ASSERT_EQ(lst, 200) << ltext;
  const std::string long_id = json::parse(ltext)["id"];
  json on_it = {{"model", "action"}, {"previous_response_id", long_id}, {"input", "And?"}};
  auto [rst, rtext] = post("/v1/responses", on_it);
  EXPECT_EQ(rst, 400) << rtext;
  EXPECT_NE(rtext.find("is a background response still"), std::string::npos) << rtext;
  auto [kst, ktext] = post(fmt::format("/v1/responses/{}/cancel", long_id).c_str(), json::object());
  ASSERT_EQ(kst, 200) << ktext;
  const json cancelled = json::parse(ktext);
  EXPECT_EQ(cancelled["status"], "cancelled");
  if (!cancelled["usage"].is_null()) EXPECT_LT(cancelled["usage"]["output_tokens"].get<int>(), 1500);
  auto again = c.Get(fmt::format("/v1/responses/{}", long_id));
  ASSERT_TRUE(again);
  EXPECT_EQ(json::parse(again->body)["status"], "cancelled");
  EXPECT_EQ(post(fmt::format("/v1/responses/{}/cancel", long_id).c_str(), json::object()).first, 400);
  EXPECT_EQ(post("/v1/responses/resp-nobody/cancel", json::object()).first, 404);
  auto restream = c.Get(fmt::format("/v1/responses/{}?stream=true&starting_after=3", long_id));
  ASSERT_TRUE(restream);
  EXPECT_EQ(restream->status, 400);
  EXPECT_NE(restream->body.find("keeps no events to stream again"), std::string::npos) << restream->body;
  // Refused: without store; with a server that stores none (below).
  json unstored = long_body;
  unstored["store"] = false;
  EXPECT_EQ(post("/v1/responses", unstored).first, 400);

  // Streamed: its events as they come (the first one showing it queued), the text the request
  // without background gives; GET ...?stream=true gives them again, all or past starting_after.
  json streamed_body = body;
  streamed_body["stream"] = true;
  auto [sst, sse] = post("/v1/responses", streamed_body);
  ASSERT_EQ(sst, 200) << sse;
  const std::vector<json> events = testing::sse_events(sse);
  ASSERT_GE(events.size(), 4u) << sse;
  EXPECT_EQ(events[0]["type"], "response.created");
  EXPECT_EQ(events[0]["response"]["status"], "queued");
  EXPECT_EQ(events[0]["response"]["background"], true);
  std::string streamed_text;
  for (size_t k = 0; k < events.size(); ++k) {
    EXPECT_EQ(events[k]["sequence_number"], k);
    if (events[k]["type"] == "response.output_text.delta") streamed_text += events[k]["delta"].get<std::string>();
  }
  EXPECT_EQ(streamed_text, want["output"][0]["content"][0]["text"]);
  EXPECT_EQ(events.back()["type"], "response.incomplete");
  const std::string sid = events[0]["response"]["id"];
  auto replay = c.Get(fmt::format("/v1/responses/{}?stream=true", sid));
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 200);
  EXPECT_EQ(testing::sse_events(replay->body), events);
  auto tail = c.Get(fmt::format("/v1/responses/{}?stream=true&starting_after=2", sid));
  ASSERT_TRUE(tail);
  const std::vector<json> rest = testing::sse_events(tail->body);
  ASSERT_EQ(rest.size(), events.size() - 3);
  EXPECT_EQ(rest.front(), events[3]);
  auto bad_after = c.Get(fmt::format("/v1/responses/{}?stream=true&starting_after=x", sid));
  ASSERT_TRUE(bad_after);
  EXPECT_EQ(bad_after->status, 400);
  EXPECT_EQ(ended(sid)["output"], events.back()["response"]["output"]);

  // One left running when the server stops: cancelled and joined before the engine goes (a job
  // outliving it would run on a freed server: ASan's build catches that).
  ASSERT_EQ(post("/v1/responses", long_body).first, 200);
  TearDown();
  ServerOptions none;
  none.max_stored_responses = 0;
  start(none);
  auto [nst, ntext] = post("/v1/responses", body);
  EXPECT_EQ(nst, 400) << ntext;
  EXPECT_NE(ntext.find("--max-stored-responses 0"), std::string::npos) << ntext;
}

// OpenAI's JavaScript SDK reads the server's responses and events (tests/server/responses_sdk.mjs).
TEST_F(ResponsesTest, OpenAisSdkReadsWhatTheServerSends) {
  run_sdk_script("responses_sdk.mjs", "openai", fmt::format("http://127.0.0.1:{}/v1", port_));
}

}  // namespace
}  // namespace lragent::server
