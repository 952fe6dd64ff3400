// Sampling defaults from a model's generation_config.json (vLLM's --generation-config): which
// keys are taken and how, the flag's modes, and how a request's own fields and max_tokens meet
// them in /v1/completions, chat completions and the Responses API. And vLLM's bad_words served.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/sampling_defaults.h"
#include "server/server_fixture.h"
#include "server/synthetic_chat_fixture.h"
#include "test_util.h"

namespace lragent::server {
namespace {

using nlohmann::json;

SamplingDefaults from(const json& config, const json& overrides = json::object()) {
  auto d = sampling_defaults_from(config, "gen.json", overrides);
  EXPECT_TRUE(d.ok()) << d.error().message;
  return d.ok() ? *d : SamplingDefaults{};
}

TEST(SamplingDefaults, TakenFromTheGenerationConfigAsVllmReadsIt) {
  // Llama-3.1-8B-Instruct's file.
  SamplingDefaults d = from({{"bos_token_id", 128000}, {"do_sample", true}, {"eos_token_id", {128001, 128008, 128009}},
                             {"temperature", 0.6}, {"top_p", 0.9}, {"transformers_version", "4.42.3"}});
  EXPECT_DOUBLE_EQ(d.temperature, 0.6);
  EXPECT_DOUBLE_EQ(d.top_p, 0.9);
  EXPECT_EQ(d.top_k, 0);
  EXPECT_EQ(d.max_tokens, 0);
  EXPECT_EQ(d.describe(), "temperature=0.6, top_p=0.9");
  // Qwen3's.
  d = from({{"do_sample", true}, {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}});
  EXPECT_EQ(d.top_k, 20);
  EXPECT_EQ(d.describe(), "temperature=0.6, top_p=0.95, top_k=20");
  // transformers' own defaults are no recommendation (to_diff_dict leaves them out): top_k 50 stays off.
  d = from({{"temperature", 1.0}, {"top_p", 1}, {"top_k", 50}, {"repetition_penalty", 1.0}, {"min_p", nullptr}});
  EXPECT_EQ(d.describe(), "");
  // min_p and max_new_tokens have no such default: any value counts.
  d = from({{"min_p", 0.05}, {"max_new_tokens", 256}, {"repetition_penalty", 1.1}, {"top_k", 0}});
  EXPECT_DOUBLE_EQ(d.min_p, 0.05);
  EXPECT_EQ(d.max_tokens, 256);
  EXPECT_DOUBLE_EQ(d.repetition_penalty, 1.1);
  EXPECT_EQ(d.top_k, 0);
  EXPECT_EQ(from({{"top_k", -1}}).top_k, 0);
  // The overrides go on top, each key taken as given (top_k 50 too).
  d = from({{"temperature", 0.6}, {"top_p", 0.9}}, {{"temperature", 0.2}, {"top_k", 50}, {"top_p", nullptr}, {"seed", 3}});
  EXPECT_DOUBLE_EQ(d.temperature, 0.2);
  EXPECT_DOUBLE_EQ(d.top_p, 0.9);
  EXPECT_EQ(d.top_k, 50);
}

TEST(SamplingDefaults, BadValuesNameTheFileOrFlagAndTheKey) {
  struct Case {
    json config, overrides;
    ErrorCode code;
    const char* says;
  };
  const Case cases[] = {
      {{{"temperature", "hot"}}, json::object(), ErrorCode::kCorrupt, "gen.json: 'temperature' = \"hot\" must be a number"},
      {{{"temperature", -0.5}}, json::object(), ErrorCode::kCorrupt, "'temperature' = -0.5 must be from 0 to 100"},
      {{{"top_p", 0}}, json::object(), ErrorCode::kCorrupt, "'top_p' = 0 must be in (0, 1]"},
      {{{"top_k", -2}}, json::object(), ErrorCode::kCorrupt, "'top_k' = -2 must be an integer, -1 or 0 for off"},
      {{{"top_k", 2.5}}, json::object(), ErrorCode::kCorrupt, "'top_k' = 2.5 must be an integer"},
      {{{"min_p", 1.5}}, json::object(), ErrorCode::kCorrupt, "'min_p' = 1.5 must be in [0, 1]"},
      {{{"repetition_penalty", 0}}, json::object(), ErrorCode::kCorrupt, "'repetition_penalty' = 0 must be in (0, 100]"},
      {{{"max_new_tokens", 0}}, json::object(), ErrorCode::kCorrupt, "'max_new_tokens' = 0 must be an integer of at least 1"},
      {json::array(), json::object(), ErrorCode::kCorrupt, "gen.json: top level is not a JSON object"},
      {json::object(), {{"top_p", 2}}, ErrorCode::kInvalidArgument, "--override-generation-config: 'top_p' = 2"},
      {json::object(), json::array({1}), ErrorCode::kInvalidArgument, "--override-generation-config must be a JSON object"},
  };
  for (const Case& c : cases) {
    auto d = sampling_defaults_from(c.config, "gen.json", c.overrides);
    ASSERT_FALSE(d.ok()) << c.says;
    EXPECT_EQ(d.error().code, c.code) << c.says;
    EXPECT_NE(d.error().message.find(c.says), std::string::npos) << d.error().message;
  }
}

TEST(SamplingDefaults, TheFlagsModes) {
  const std::string model = testing::temp_dir("gen_model"), other = testing::temp_dir("gen_other");
  std::ofstream(model + "/generation_config.json") << R"({"temperature": 0.6, "top_p": 0.9, "eos_token_id": 2})";
  std::ofstream(other + "/generation_config.json") << R"({"top_k": 20})";
  auto d = load_sampling_defaults("auto", model, "");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->describe(), "temperature=0.6, top_p=0.9");
  d = load_sampling_defaults("vllm", model, "");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->describe(), "");
  d = load_sampling_defaults("vllm", model, R"({"max_new_tokens": 7})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->describe(), "max_tokens=7");
  d = load_sampling_defaults(other, model, R"({"temperature": 0})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->describe(), "temperature=0, top_k=20");
  // A model without the file: neutral. A directory given without one: an error that says what to give.
  const std::string bare = testing::temp_dir("gen_bare");
  d = load_sampling_defaults("auto", bare, "");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->describe(), "");
  d = load_sampling_defaults(bare, model, "");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::kNotFound);
  EXPECT_NE(d.error().message.find("no generation_config.json there"), std::string::npos) << d.error().message;
  d = load_sampling_defaults("auto", model, "{temperature: 1}");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(d.error().message.find("--override-generation-config is not valid JSON"), std::string::npos);
  std::ofstream(bare + "/generation_config.json") << "{\"temperature\": ";
  d = load_sampling_defaults("auto", bare, "");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(d.error().message.find("generation_config.json"), std::string::npos) << d.error().message;
}

TEST(SamplingDefaults, ARequestsOwnFieldsWinAndMaxNewTokensCapsIt) {
  SamplingDefaults d;
  d.temperature = 0.6;
  d.top_p = 0.9;
  d.top_k = 20;
  d.min_p = 0.05;
  d.repetition_penalty = 1.1;
  d.max_tokens = 8;
  auto r = parse_completion_request(R"({"prompt": "x"})", d);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);
  EXPECT_EQ(r->sampling.top_k, 20);
  EXPECT_FLOAT_EQ(r->min_p, 0.05f);
  EXPECT_FLOAT_EQ(r->penalties.repetition, 1.1f);
  EXPECT_EQ(r->max_tokens, 8);  // the API's 16, capped
  r = parse_completion_request(
      R"({"prompt": "x", "temperature": 0, "top_p": null, "top_k": -1, "min_p": 0, "repetition_penalty": 1, "max_tokens": 4})", d);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);  // null is no value
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r->min_p, 0.f);
  EXPECT_FLOAT_EQ(r->penalties.repetition, 1.f);
  EXPECT_EQ(r->max_tokens, 4);
  r = parse_completion_request(R"({"prompt": "x", "max_tokens": 100, "min_tokens": 10})", d);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'min_tokens' (10) must not exceed the model's max_new_tokens (8)"), std::string::npos)
      << r.error().message;
  // Neutral defaults change nothing.
  r = parse_completion_request(R"({"prompt": "x"})");
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r->sampling.temperature, 1.f);
  EXPECT_EQ(r->max_tokens, 16);

  auto c = parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}]})", ToolCallFormat::kHermes, d);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->req.max_tokens, -1);  // the rest of the context, capped once the prompt is known
  EXPECT_EQ(c->req.max_tokens_cap, 8);
  EXPECT_FLOAT_EQ(c->req.sampling.temperature, 0.6f);
  c = parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100})",
                         ToolCallFormat::kHermes, d);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->req.max_tokens, 8);
  c = parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})", ToolCallFormat::kHermes, d);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->req.max_tokens, 3);
  c = parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->req.max_tokens, -1);

  // The Responses API repeats the temperature and top_p the request runs with.
  auto resp = parse_responses_request(R"({"model": "m", "input": "hi"})", d);
  ASSERT_TRUE(resp.ok()) << resp.error().message;
  EXPECT_EQ(resp->echo["temperature"], 0.6);
  EXPECT_EQ(resp->echo["top_p"], 0.9);
  resp = parse_responses_request(R"({"model": "m", "input": "hi", "temperature": 0.3})", d);
  ASSERT_TRUE(resp.ok());
  EXPECT_EQ(resp->echo["temperature"], 0.3);
}

// Served: a request that gives no temperature gets the default's (0 here: greedy, so it is
// `generate`'s text), and max_new_tokens cuts it at that length.
TEST_F(ServerTest, GenerationConfigDefaultsApplyToRequestsThatLeaveThemOut) {
  ServerOptions o;
  o.sampling_defaults.temperature = 0;
  o.sampling_defaults.max_tokens = 5;
  start(ShareMode::kNone, o);
  const std::string prompt = "One day, a boy named Tim went to the park";  // greedy: no EOS for 24 tokens
  auto [status, j] = complete({{"prompt", prompt}, {"max_tokens", 24}});
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], generate_text(prompt, "", 5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  // Its own temperature wins: sampled at 1 with a seed, it is what a neutral server gives.
  const json sampled = {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 11}};
  auto [s1, a] = complete(sampled);
  ASSERT_EQ(s1, 200) << a.dump();
  stop();
  start(ShareMode::kNone);
  auto [s2, b] = complete(sampled);
  ASSERT_EQ(s2, 200) << b.dump();
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  auto [s3, g] = complete({{"prompt", prompt}, {"max_tokens", 5}, {"seed", 11}});  // neutral: temperature 1
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(g["choices"][0]["text"], b["choices"][0]["text"]);
}

// vLLM's bad_words, served: on the synthetic model's byte tokenizer each character is a token, so
// a two-character word of the free completion bans its second character after its first. Seeded,
// the banned completion draws as the free one did up to the first place a word would begin: the
// text changes, and no banned run of tokens is in what it generates.
class BadWordsTest : public testing::SyntheticChatServerTest {};

// A chat request without max_tokens runs to the end of the context, but at most the model's
// max_new_tokens; a cap beyond the context is no error (vLLM takes the least of the two).
class ChatDefaultsTest : public testing::SyntheticChatServerTest {};

TEST_F(ChatDefaultsTest, MaxNewTokensCapsAChatWithoutMaxTokens) {
  json body = {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"temperature", 0.8},
               {"seed", 3}, {"ignore_eos", true}};
  for (int cap : {7, 1 << 20}) {
    SCOPED_TRACE(cap);
    ServerOptions o;
    o.sampling_defaults.max_tokens = cap;
    o.max_model_len = 320;  // a short context: the uncapped case runs to its end quickly
    start(o);
    auto [status, text] = post("/v1/chat/completions", body);
    ASSERT_EQ(status, 200) << cap << ": " << text;
    const json j = json::parse(text);
    if (cap == 7) {
      EXPECT_EQ(j["usage"]["completion_tokens"], 7);
    } else {  // the rest of the context
      EXPECT_EQ(j["usage"]["prompt_tokens"].get<int64_t>() + j["usage"]["completion_tokens"].get<int64_t>(), 320);
    }
  }
}

TEST_F(BadWordsTest, NoGeneratedRunIsABadWord) {
  start(ServerOptions{});
  const json sampling = {{"temperature", 0.8}, {"seed", 3}, {"logit_bias", ascii_only()}};
  json body = {{"model", "plan"}, {"prompt", "Tell me"}, {"max_tokens", 32}};
  body.update(sampling);
  auto [s1, t1] = post("/v1/completions", body);
  ASSERT_EQ(s1, 200) << t1;
  const json free = json::parse(t1);
  const std::string text = free["choices"][0]["text"];
  ASSERT_GE(text.size(), 8u) << text;
  // A pair of non-space characters it wrote, and one character alone.
  size_t at = 0;
  while (at + 1 < text.size() && (text[at] == ' ' || text[at + 1] == ' ')) ++at;
  ASSERT_LT(at + 1, text.size()) << text;
  const std::vector<std::string> words = {text.substr(at, 2), std::string(1, text[text.size() - 1] == ' ' ? text[0] : text.back())};
  auto banned = bad_word_ids(*tok_, words);
  ASSERT_TRUE(banned.ok()) << banned.error().message;
  body["bad_words"] = words;
  auto [s2, t2] = post("/v1/completions", body);
  ASSERT_EQ(s2, 200) << t2;
  const json j = json::parse(t2);
  EXPECT_NE(j["choices"][0]["text"], text);
  const std::vector<int32_t> got = j["lragent"]["choices"][0]["token_ids"];
  for (const std::vector<int32_t>& w : *banned)
    EXPECT_EQ(std::search(got.begin(), got.end(), w.begin(), w.end()), got.end()) << tok_->decode(w) << " in " << t2;
  body["bad_words"] = {" "};
  EXPECT_EQ(post("/v1/completions", body).first, 400);
}

}  // namespace
}  // namespace lragent::server
