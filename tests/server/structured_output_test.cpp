// Structured outputs end to end (Server::complete, no HTTP), checked against references nobody
// here wrote: std::regex for regexes and choices, nlohmann::json for JSON documents.
//   - tinystories-656k and its adapters write choices and regexes in its own words (its 2048
//     tokens spell no brace: a JSON request there fails with a message saying so);
//   - JSON runs on the built-in synthetic model (random weights, one token a byte: every text is
//     spellable, and random logits push the guide into every corner of its language).
// The languages are finite (bounded strings, enums, booleans) so every completion must end with
// "stop" at a whole match, greedy or sampled, for every agent.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "model/synthetic.h"
#include "server/chat_template.h"
#include "server/http_fixture.h"
#include "server/openai_api.h"
#include "server/server.h"
#include "server/template_fixture.h"
#include "test_util.h"
#include "tiny_agents.h"

namespace lragent::server {
namespace {

using nlohmann::json;

class StructuredOutputTest : public testing::TinyAgentsTest {
 protected:
  void SetUp() override {
    TinyAgentsTest::SetUp();
    for (auto& a : adapters_) ASSERT_TRUE(reg_.add(std::move(a)).ok());
    server_ = start(*model_, tok_.get(), reg_);
    auto synth = make_synthetic_model(SyntheticSpec{}, *be_);
    ASSERT_TRUE(synth.ok()) << synth.error().message;
    synth_ = std::move(*synth);
    bytes_ = make_byte_tokenizer();
    for (auto& a : make_synthetic_adapters(synth_->config())) ASSERT_TRUE(synth_reg_.add(std::move(a)).ok());
    synth_server_ = start(*synth_, bytes_.get(), synth_reg_);
  }
  std::unique_ptr<Server> start(LlamaModel& m, const Tokenizer* tok, AdapterRegistry& reg) {
    ServerOptions o;
    o.base_name = "tiny";
    o.pool.replay.sharing.mode = ShareMode::kBaseLr;
    o.pool.replay.sharing.max_tokens = 512;
    auto s = Server::create(m, tok, &reg, o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  void TearDown() override {
    for (Server* s : {server_.get(), synth_server_.get()})
      if (s) s->stop();
  }
  // The request's choices (ok), or its error.
  static Result<std::vector<CompletionChoice>> complete(Server& s, const json& body) {
    auto r = parse_completion_request(body.dump());
    if (!r.ok()) return r.error();
    return s.complete(*r);
  }
  Result<std::vector<CompletionChoice>> complete(const json& body) { return complete(*server_, body); }
  // The synthetic model served over HTTP with chat template `t` (and `o`'s other options),
  // stopped when it goes (an ASSERT leaving a test early stops it too).
  struct ChatServing {
    std::unique_ptr<Server> server;
    std::thread thread;
    int port = 0;
    ~ChatServing() {
      if (!server) return;
      server->stop();
      if (thread.joinable()) thread.join();
    }
    // POST /v1/chat/completions: the status and the body (-1 when nothing came back).
    std::pair<int, std::string> post(const json& body) const {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
      return res ? std::pair<int, std::string>{res->status, res->body} : std::pair<int, std::string>{-1, ""};
    }
  };
  std::unique_ptr<ChatServing> serve_chat(const ChatTemplate& t, ServerOptions o = {}) {
    o.base_name = "tiny";
    o.chat_template = t;
    o.pool.replay.sharing.max_tokens = 2048;
    auto served = std::make_unique<ChatServing>();
    auto s = Server::create(*synth_, bytes_.get(), &synth_reg_, o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    if (!s.ok()) return nullptr;
    served->server = std::move(*s);
    auto port = served->server->bind("127.0.0.1", 0);
    EXPECT_TRUE(port.ok()) << port.error().message;
    if (!port.ok()) return nullptr;
    served->port = *port;
    Server* raw = served->server.get();
    served->thread = std::thread([raw] { (void)raw->serve(); });
    return served;
  }
  // The synthetic model's chat server with Qwen2.5's real template behind qwen3's reasoning parser.
  std::unique_ptr<ChatServing> serve_thinking_chat() {
    const auto tokens = testing::template_tokens();
    auto t = ChatTemplate::from_tokenizer_config(testing::config_for("qwen2_5", tokens), "qwen2_5");
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) return nullptr;
    ServerOptions o;
    o.reasoning_parser = ReasoningFormat::kQwen3;
    return serve_chat(*t, o);
  }
  AdapterRegistry reg_, synth_reg_;
  std::unique_ptr<Server> server_, synth_server_;
  std::unique_ptr<LlamaModel> synth_;
  std::unique_ptr<Tokenizer> bytes_;
};

const char* kPrompt = "Once upon a time, there was a little girl named Lily. She";

TEST_F(StructuredOutputTest, ChoicesAndRegexesEndAtAWholeMatch) {
  const std::vector<std::string> choices = {"happy", "sad", "a big red dog", "1+1"};
  for (const char* model : {"tiny", "plan", "action"}) {
    SCOPED_TRACE(model);
    auto c = complete({{"model", model}, {"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0},
                       {"guided_choice", choices}});
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_NE(std::find(choices.begin(), choices.end(), (*c)[0].text), choices.end()) << (*c)[0].text;
    EXPECT_EQ((*c)[0].finish_reason, "stop");
    // Free, the same request writes something else (else the guide proved nothing).
    auto free = complete({{"model", model}, {"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0}});
    ASSERT_TRUE(free.ok());
    EXPECT_EQ(std::find(choices.begin(), choices.end(), (*free)[0].text), choices.end());

    const std::string re = " (?:yes|no), [a-z]{3,8}(?: [a-z]{2,5}){0,2}\\.";
    auto r = complete({{"model", model}, {"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 1.0},
                       {"seed", 11}, {"n", 3}, {"guided_regex", re}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->size(), 3u);
    for (const CompletionChoice& ch : *r) {
      EXPECT_TRUE(std::regex_match(ch.text, std::regex(re))) << ch.text;
      EXPECT_EQ(ch.finish_reason, "stop") << ch.text;
    }
  }
}

TEST_F(StructuredOutputTest, JsonSchemasGiveDocumentsThatHoldTheirFields) {
  const json schema = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}, {"minLength", 1}, {"maxLength", 10}}},
        {"happy", {{"type", "boolean"}}},
        {"color", {{"enum", {"red", "blue", "green"}}}},
        {"pet", {{"anyOf", {{{"type", "null"}}, {{"type", "string"}, {"maxLength", 6}}}}}}}},
      {"required", {"name", "happy", "color"}}};
  for (const json& form : {json{{"guided_json", schema}},
                           json{{"response_format",
                                 {{"type", "json_schema"}, {"json_schema", {{"name", "story"}, {"schema", schema}}}}}}}) {
    for (double temperature : {0.0, 1.0}) {
      json body = {{"model", "reflect"}, {"prompt", kPrompt}, {"max_tokens", 150}, {"temperature", temperature},
                   {"seed", 3}, {"n", 2}};
      body.update(form);
      auto r = complete(*synth_server_, body);
      ASSERT_TRUE(r.ok()) << r.error().message;
      for (const CompletionChoice& ch : *r) {
        SCOPED_TRACE(ch.text);
        EXPECT_EQ(ch.finish_reason, "stop");
        const json doc = json::parse(ch.text, nullptr, /*allow_exceptions=*/false);
        ASSERT_TRUE(doc.is_object());
        ASSERT_TRUE(doc.contains("name") && doc["name"].is_string());
        const std::string name = doc["name"].get<std::string>();
        const auto chars = static_cast<size_t>(std::count_if(
            name.begin(), name.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
        EXPECT_GE(chars, 1u);
        EXPECT_LE(chars, 10u);
        EXPECT_TRUE(doc["happy"].is_boolean());
        EXPECT_TRUE(doc["color"] == "red" || doc["color"] == "blue" || doc["color"] == "green");
        if (doc.contains("pet")) EXPECT_TRUE(doc["pet"].is_null() || doc["pet"].is_string());
        for (const auto& [k, v] : doc.items()) EXPECT_TRUE(k == "name" || k == "happy" || k == "color" || k == "pet") << k;
      }
    }
  }
}

// Any JSON object: a long enough budget ends in a whole object; a short one ends "length" with
// a prefix of one. Streamed, the pieces join into the same text.
TEST_F(StructuredOutputTest, JsonObjectsAndStreaming) {
  json body = {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0},
               {"response_format", {{"type", "json_object"}}}};
  auto shortened = complete(*synth_server_, body);
  ASSERT_TRUE(shortened.ok()) << shortened.error().message;
  EXPECT_EQ((*shortened)[0].finish_reason, "length");
  EXPECT_EQ((*shortened)[0].text.substr(0, 1), "{");
  body["max_tokens"] = 300;
  auto whole = complete(*synth_server_, body);
  ASSERT_TRUE(whole.ok());
  if ((*whole)[0].finish_reason == "stop") {
    const json doc = json::parse((*whole)[0].text, nullptr, false);
    EXPECT_TRUE(doc.is_object()) << (*whole)[0].text;
  }
  EXPECT_EQ((*whole)[0].text.substr(0, (*shortened)[0].text.size()), (*shortened)[0].text);
  std::string streamed;
  auto parsed = parse_completion_request(body.dump());
  ASSERT_TRUE(parsed.ok());
  auto s = synth_server_->complete(*parsed, [&](const CompletionDelta& d) {
    streamed += d.text;
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(streamed, (*whole)[0].text);
}

// tool_choice required / named on Qwen3's template: the message's tool_calls are the forced
// calls, each with its function's name and arguments that hold its parameters, finish_reason
// "tool_calls"; a named function is the one called.
TEST_F(StructuredOutputTest, ForcedToolCallsFollowTheirParameters) {
  const std::string cfg_path = testing::fetched_fixtures_dir() + "/qwen3/tokenizer_config.json";
  if (!std::filesystem::exists(cfg_path)) GTEST_SKIP() << cfg_path << " missing: run scripts/fetch-fixtures.sh";
  auto t = ChatTemplate::from_tokenizer_config(testing::read_file(cfg_path), cfg_path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto served = serve_chat(*t);
  ASSERT_TRUE(served);
  const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
        "properties": {"query": {"type": "string", "maxLength": 12}, "top": {"enum": [1, 5, 10]}},
        "required": ["query"]}}},
      {"type": "function", "function": {"name": "finish", "parameters": {"type": "object",
        "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}}}])");
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "finish"}}}}}) {
    SCOPED_TRACE(choice.dump());
    const json body = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Which is older?"}}}},
                       {"tools", tools}, {"tool_choice", choice}, {"max_tokens", 300}, {"temperature", 0.7},
                       {"seed", 2}};
    const auto [status, text] = served->post(body);
    ASSERT_EQ(status, 200) << text;
    const json answer = json::parse(text);
    const json& ch = answer["choices"][0];
    EXPECT_EQ(ch["finish_reason"], "tool_calls") << ch.dump();
    const json& calls = ch["message"]["tool_calls"];
    ASSERT_TRUE(calls.is_array() && !calls.empty()) << ch.dump();
    EXPECT_TRUE(ch["message"]["content"].is_null()) << ch.dump();
    if (choice.is_object()) EXPECT_EQ(calls.size(), 1u);
    for (const json& call : calls) {
      const std::string name = call["function"]["name"];
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      if (name == "search") {
        EXPECT_TRUE(args["query"].is_string());
        if (args.contains("top")) EXPECT_TRUE(args["top"] == 1 || args["top"] == 5 || args["top"] == 10);
      } else {
        ASSERT_EQ(name, "finish");
        EXPECT_TRUE(args["answer"].is_boolean());
      }
      if (choice.is_object()) EXPECT_EQ(name, "finish");
    }
  }
}

// A forced call comes in the form the model's template shows it (Qwen2.5: Hermes blocks;
// Llama-3.2: {"name", "parameters"}; Mistral-Nemo: [TOOL_CALLS][...]; DeepSeek-V3: its call
// blocks; pythonic's [weather(city="...")] under --tool-call-parser), is read back by that form's
// parser, whole and streamed alike, and the call (its id too: Mistral's templates take only 9
// letters and digits) goes back into the template in the next turn with its result.
TEST_F(StructuredOutputTest, ForcedCallsComeInTheTemplatesFormAndGoBackIntoIt) {
  const auto tokens = testing::template_tokens();
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}])");
  // The last: Llama-3.2's template served with --tool-call-parser pythonic.
  for (const auto& [name, format] : std::vector<std::pair<std::string, ToolCallFormat>>{
           {"qwen2_5", ToolCallFormat::kHermes}, {"llama3_2", ToolCallFormat::kLlama3Json},
           {"mistral_nemo", ToolCallFormat::kMistral}, {"deepseek_v3", ToolCallFormat::kDeepSeekV3},
           {"llama3_2", ToolCallFormat::kPythonic}}) {
    SCOPED_TRACE(name + " " + tool_call_format_name(format));
    auto t = ChatTemplate::from_tokenizer_config(testing::config_for(name, tokens), name);
    ASSERT_TRUE(t.ok()) << t.error().message;
    if (format == ToolCallFormat::kPythonic) t->tool_call_format = format;
    ASSERT_EQ(t->tool_call_format, format);
    auto served = serve_chat(*t);
    ASSERT_TRUE(served);
    auto post = [&](const json& body) { return served->post(body); };
    json messages = {{{"role", "user"}, {"content", "What is the weather in Paris?"}}};
    json body = {{"model", "plan"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 200},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "weather"}}}}},
                 {"temperature", 0.7}, {"seed", 3}};
    auto [st, text] = post(body);
    ASSERT_EQ(st, 200) << text;
    const json ch = json::parse(text)["choices"][0];
    EXPECT_EQ(ch["finish_reason"], "tool_calls") << ch.dump();
    EXPECT_TRUE(ch["message"]["content"].is_null()) << ch.dump();
    ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << ch.dump();
    const json call = ch["message"]["tool_calls"][0];
    EXPECT_EQ(call["function"]["name"], "weather");
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    ASSERT_TRUE(args["city"].is_string()) << args.dump();
    const std::string id = call["id"];
    if (format == ToolCallFormat::kMistral) {
      EXPECT_EQ(id.size(), 9u) << id;
    } else {
      EXPECT_EQ(id.rfind("chatcmpl-tool-", 0), 0u) << id;
    }

    // Streamed, the same request (same seed) gives the same call: its deltas joined by index (every
    // format sends the arguments as they are written).
    body["stream"] = true;
    auto [sst, events] = post(body);
    ASSERT_EQ(sst, 200) << events;
    json streamed = json::array();
    std::string content, finish;
    bool done = false;
    for (const json& e : testing::sse_events(events, &done)) {
      if (e["choices"].empty()) continue;
      const json& c = e["choices"][0];
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls"))
        for (const json& tc : c["delta"]["tool_calls"]) streamed.push_back(tc);
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_TRUE(done);
    EXPECT_EQ(content, "");
    EXPECT_EQ(finish, "tool_calls");
    ASSERT_GE(streamed.size(), 1u) << events;
    json joined = streamed[0];
    EXPECT_EQ(joined["index"], 0);
    for (size_t k = 1; k < streamed.size(); ++k) {
      EXPECT_EQ(streamed[k]["index"], 0) << events;
      EXPECT_FALSE(streamed[k].contains("id")) << events;
      joined["function"]["arguments"] =
          joined["function"]["arguments"].get<std::string>() + streamed[k]["function"]["arguments"].get<std::string>();
    }
    EXPECT_EQ(joined["function"], call["function"]);
    EXPECT_GT(streamed.size(), 1u) << "the arguments went out as the model wrote them: " << events;

    // The next turn: the call and its result go back into the template.
    messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
    messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", "sunny"}});
    auto [nst, next] = post({{"model", "plan"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 4}});
    EXPECT_EQ(nst, 200) << next;
  }
}

// With a reasoning parser (serve --reasoning-parser qwen3) a completion that has not closed its
// <think> block (the synthetic model writes random bytes: it never does) is all reasoning, whole
// and streamed alike, and with enable_thinking false the same text is all content. A forced
// tool call waits until the model has reasoned (here: it never starts), and with thinking off it
// comes at once. Where the split falls once "</think>" comes: tests/server/reasoning_test.cpp.
TEST_F(StructuredOutputTest, AReasoningParserHandsTheThinkingApart) {
  auto served = serve_thinking_chat();
  ASSERT_TRUE(served);
  auto post = [&](const json& body) { return served->post(body); };
  // ASCII only: the byte tokenizer hands out a character's bytes one by one, and each event's JSON
  // would replace a split one.
  json ascii = json::object();
  for (int b = 0x80; b < 0x100; ++b) ascii[std::to_string(3 + b)] = -100;
  json body = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Which is older?"}}}},
               {"max_tokens", 24}, {"temperature", 0.8}, {"seed", 4}, {"logit_bias", ascii}};
  auto [st, text] = post(body);
  ASSERT_EQ(st, 200) << text;
  const json ch = json::parse(text)["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "length");
  ASSERT_TRUE(ch["message"]["reasoning_content"].is_string()) << ch.dump();
  const std::string reasoning = ch["message"]["reasoning_content"];
  EXPECT_FALSE(reasoning.empty());
  EXPECT_EQ(ch["message"]["reasoning"], reasoning);
  EXPECT_TRUE(ch["message"]["content"].is_null()) << ch.dump();

  body["stream"] = true;
  auto [sst, events] = post(body);
  ASSERT_EQ(sst, 200) << events;
  std::string streamed_reasoning, streamed_content;
  bool done = false;
  for (const json& e : testing::sse_events(events, &done)) {
    if (e["choices"].empty()) continue;
    const json& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) streamed_reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) streamed_content += d["content"].get<std::string>();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed_reasoning, reasoning);
  EXPECT_EQ(streamed_content, "");

  // Thinking turned off (Qwen2.5's template ignores the flag: the same prompt, the same text): all content.
  body["stream"] = false;
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto [ost, off] = post(body);
  ASSERT_EQ(ost, 200) << off;
  const json plain = json::parse(off)["choices"][0]["message"];
  EXPECT_TRUE(plain["reasoning_content"].is_null()) << plain.dump();
  EXPECT_EQ(plain["content"], reasoning) << plain.dump();

  // A forced call: after the reasoning, so not within 120 tokens of a model that never stops
  // thinking (the call itself takes ~65); with thinking off, at once.
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}])");
  json forced = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"tools", tools},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "weather"}}}}}, {"max_tokens", 120},
                 {"temperature", 0.8}, {"seed", 4}};
  auto [fst, thinking] = post(forced);
  ASSERT_EQ(fst, 200) << thinking;
  const json tc = json::parse(thinking)["choices"][0];
  EXPECT_EQ(tc["finish_reason"], "length") << tc.dump();
  EXPECT_TRUE(tc["message"]["tool_calls"].empty()) << tc.dump();
  EXPECT_TRUE(tc["message"]["reasoning_content"].is_string()) << tc.dump();
  forced["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto [nst, at_once] = post(forced);
  ASSERT_EQ(nst, 200) << at_once;
  const json nc = json::parse(at_once)["choices"][0];
  EXPECT_EQ(nc["finish_reason"], "tool_calls") << nc.dump();
  EXPECT_EQ(nc["message"]["tool_calls"].size(), 1u) << nc.dump();
  EXPECT_TRUE(nc["message"]["reasoning_content"].is_null()) << nc.dump();
}

// GBNF grammars (vLLM's guided_grammar, structured_outputs.grammar; llama.cpp's grammar): a
// finite language in tinystories' own words, checked with std::regex; on the synthetic model a
// language no regex describes (arrays of arrays of digits, three deep at most), checked with
// nlohmann::json; and, behind a reasoning parser, the grammar holds from the answer on.
TEST_F(StructuredOutputTest, GrammarsGiveTextsOfTheirLanguage) {
  const std::string names = R"(root ::= " " name (", " name){0,3} "."
name ::= "Lily" | "Tom" | "Ben" | "the dog"
)";
  const std::regex names_re(" (?:Lily|Tom|Ben|the dog)(?:, (?:Lily|Tom|Ben|the dog)){0,3}\\.");
  for (const char* field : {"guided_grammar", "grammar"}) {
    auto r = complete({{"model", "action"}, {"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 1.0},
                       {"seed", 3}, {"n", 3}, {field, names}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (const CompletionChoice& ch : *r) {
      EXPECT_TRUE(std::regex_match(ch.text, names_re)) << ch.text;
      EXPECT_EQ(ch.finish_reason, "stop") << ch.text;
    }
  }
  const std::string arrays = R"(root ::= e3
e3 ::= "[" (e2 ("," e2){0,2})? "]" | [0-9]
e2 ::= "[" (e1 ("," e1){0,2})? "]" | [0-9]
e1 ::= [0-9]
)";
  int nested = 0;
  for (int seed = 0; seed < 8; ++seed) {
    // '[' favoured (the byte tokenizer's id for a byte is 3 + the byte), else digits win 10 to 1.
    auto r = complete(*synth_server_, {{"model", "plan"}, {"prompt", "x"}, {"max_tokens", 60}, {"temperature", 1.0},
                                       {"seed", seed}, {"logit_bias", {{std::to_string(3 + '['), 4}}},
                                       {"structured_outputs", {{"grammar", arrays}}}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    const std::string text = (*r)[0].text;
    SCOPED_TRACE(text);
    EXPECT_EQ((*r)[0].finish_reason, "stop");
    ASSERT_TRUE(json::accept(text));
    const json v = json::parse(text);
    if (!v.is_array()) continue;
    EXPECT_LE(v.size(), 3u);
    for (const json& a : v) {
      if (!a.is_array()) continue;
      ++nested;
      EXPECT_LE(a.size(), 3u);
      for (const json& d : a) EXPECT_TRUE(d.is_number_integer() && d.get<int>() >= 0 && d.get<int>() <= 9);
    }
  }
  EXPECT_GT(nested, 0);  // the random model reached the second level somewhere

  // Behind qwen3's reasoning parser: with thinking off the grammar holds from the first token.
  auto served = serve_thinking_chat();
  ASSERT_TRUE(served);
  json body = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Numbers?"}}}}, {"max_tokens", 60},
               {"temperature", 1.0}, {"seed", 2}, {"guided_grammar", arrays},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto [st, text] = served->post(body);
  ASSERT_EQ(st, 200) << text;
  const json msg = json::parse(text)["choices"][0]["message"];
  ASSERT_TRUE(msg["content"].is_string()) << msg.dump();
  EXPECT_TRUE(json::accept(msg["content"].get<std::string>())) << msg.dump();
  // Thinking on: the model may reason first (it never closes the block in 16 tokens here), so
  // what comes out is reasoning, not a grammar-shaped answer cut short.
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  body["max_tokens"] = 16;
  auto [tst, thinking] = served->post(body);
  ASSERT_EQ(tst, 200) << thinking;
  const json tc = json::parse(thinking)["choices"][0];
  EXPECT_EQ(tc["finish_reason"], "length") << tc.dump();
  EXPECT_TRUE(tc["message"]["reasoning_content"].is_string()) << tc.dump();
}

// Agents send the same schema at every turn: its compiled guide is kept (at most kGuideCache
// texts, the least recently used dropped) and reused, with the same outputs as a fresh one, also
// by requests running at once.
TEST_F(StructuredOutputTest, ACompiledGuideIsKeptForTheNextRequestOfTheSameText) {
  ASSERT_EQ(server_->cached_guides(), 0u);
  const std::string re = " (?:yes|no), [a-z]{3,8}(?: [a-z]{2,5}){0,2}\\.";
  const json body = {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 1.0},
                     {"seed", 5}, {"n", 2}, {"guided_regex", re}};
  auto first = complete(body);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(server_->cached_guides(), 1u);
  auto again = complete(body);  // the cached guide, its masks already made
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(server_->cached_guides(), 1u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ((*again)[k].text, (*first)[k].text);
    EXPECT_TRUE(std::regex_match((*again)[k].text, std::regex(re))) << (*again)[k].text;
  }
  // A grammar of the same language is another text: another guide, the same picks.
  json as_grammar = body;
  as_grammar.erase("guided_regex");
  as_grammar["guided_grammar"] =
      "root ::= \" \" (\"yes\" | \"no\") \", \" [a-z]{3,8} (\" \" [a-z]{2,5}){0,2} \".\"";
  auto g = complete(as_grammar);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(server_->cached_guides(), 2u);
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ((*g)[k].text, (*first)[k].text);
  // Several clients at once on one cached guide.
  std::vector<std::thread> clients;
  std::vector<Result<std::vector<CompletionChoice>>> got(4, Error{ErrorCode::kInternal, "not run"});
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      json b = body;
      b["seed"] = 5 + c % 2;
      got[static_cast<size_t>(c)] = complete(b);
    });
  for (auto& t : clients) t.join();
  for (int c = 0; c < 4; ++c) {
    ASSERT_TRUE(got[static_cast<size_t>(c)].ok()) << got[static_cast<size_t>(c)].error().message;
    for (const CompletionChoice& ch : *got[static_cast<size_t>(c)])
      EXPECT_TRUE(std::regex_match(ch.text, std::regex(re))) << ch.text;
    if (c % 2 == 0) EXPECT_EQ((*got[static_cast<size_t>(c)])[0].text, (*first)[0].text);
  }
  // Bounded: the oldest texts go.
  for (int k = 0; k < 12; ++k) {
    auto r = complete({{"prompt", kPrompt}, {"max_tokens", 8}, {"guided_choice", {"a" + std::to_string(k)}}});
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  EXPECT_EQ(server_->cached_guides(), 8u);
}

// What cannot be followed is a 400 before anything runs: a bad regex, a schema keyword the
// converter cannot enforce; and a server without a tokenizer cannot guide at all.
TEST_F(StructuredOutputTest, BadPatternsAreRequestErrors) {
  auto bad = complete({{"prompt", kPrompt}, {"guided_regex", "(ab"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("guided_regex"), std::string::npos) << bad.error().message;
  auto backref = complete({{"prompt", kPrompt}, {"guided_regex", "(a)\\1"}});
  ASSERT_FALSE(backref.ok());
  EXPECT_EQ(backref.error().code, ErrorCode::kUnsupported);
  auto empty = complete({{"prompt", kPrompt}, {"guided_regex", "[^\\x00-\\u{10FFFF}]"}});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("matches no text"), std::string::npos) << empty.error().message;
  // tinystories' vocabulary has no "{": the request fails, saying why.
  auto no_brace = complete({{"prompt", kPrompt}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_FALSE(no_brace.ok());
  EXPECT_NE(no_brace.error().message.find("no token of the vocabulary"), std::string::npos) << no_brace.error().message;
  // A grammar is checked before anything runs too, naming the field, the rule and the place.
  for (const auto& [gbnf, says] : {std::pair<const char*, const char*>{"root ::= root", "rule 'root' can never finish"},
                                   {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
                                   {"start ::= \"a\"", "no rule named 'root'"},
                                   {"root ::= list\nlist ::= list \",\" \"a\" | \"a\"", "left-recursive"}}) {
    auto g = complete({{"prompt", kPrompt}, {"guided_grammar", gbnf}});
    ASSERT_FALSE(g.ok()) << gbnf;
    EXPECT_EQ(g.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(g.error().message.find("'guided_grammar': grammar: "), std::string::npos) << g.error().message;
    EXPECT_NE(g.error().message.find(says), std::string::npos) << g.error().message;
  }
  // The server keeps serving.
  auto ok = complete({{"prompt", kPrompt}, {"max_tokens", 4}, {"guided_choice", {"yes"}}});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ((*ok)[0].text, "yes");
}

}  // namespace
}  // namespace lragent::server
