// Request parsing and completion text of the OpenAI-compatible API (no HTTP): the defaults of
// the OpenAI API, every accepted form of a field, errors that name the field, and text that is
// cut at stop strings identically whether it is streamed or not.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "agents/replay.h"
#include "server/openai_api.h"
#include "test_util.h"

namespace lragent::server {
namespace {

CompletionRequest parse_ok(const std::string& body) {
  auto r = parse_completion_request(body);
  EXPECT_TRUE(r.ok()) << body << ": " << r.error().message;
  return r.ok() ? *r : CompletionRequest{};
}

// The error's code, and that its message names `field`.
void expect_error(const std::string& body, ErrorCode code, const std::string& field) {
  auto r = parse_completion_request(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().code, code) << body << ": " << r.error().message;
  EXPECT_NE(r.error().message.find(field), std::string::npos) << body << ": " << r.error().message;
}

TEST(OpenAiRequest, DefaultsAreTheOpenAiApis) {
  CompletionRequest r = parse_ok(R"({"model": "plan", "prompt": "Hello"})");
  EXPECT_EQ(r.model, "plan");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.n, 1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.seeded);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_FALSE(r.stream || r.echo || r.ignore_eos || r.include_usage);
  // null means the default; unknown fields are ignored (as vLLM does); no model: the base model.
  r = parse_ok(R"({"prompt": "x", "max_tokens": null, "temperature": null, "user": "me", "whatever": [1]})");
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.max_tokens, 16);
}

TEST(OpenAiRequest, EveryFormOfTheFields) {
  CompletionRequest r = parse_ok(R"({"prompt": [1, 450, 3], "max_tokens": 7.0, "temperature": 0, "top_p": 0.5,
      "top_k": -1, "seed": 42, "stop": ["\n", "END"], "stop_token_ids": [2], "ignore_eos": true,
      "skip_special_tokens": false, "echo": true, "n": 3, "best_of": 3, "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": null, "presence_penalty": 0,
      "frequency_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {}})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{1, 450, 3}));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);  // -1: off, as vLLM
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(r.stop_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(r.ignore_eos && r.echo && r.stream && r.include_usage);
  EXPECT_FALSE(r.skip_special_tokens);
  EXPECT_EQ(r.n, 3);
  EXPECT_FALSE(r.penalties.active());
  r = parse_ok(R"({"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
      "max_tokens": 0, "echo": true, "min_tokens": 0, "response_format": {"type": "text"}})");
  EXPECT_FLOAT_EQ(r.penalties.presence, 0.5f);
  EXPECT_FLOAT_EQ(r.penalties.frequency, -1.f);
  EXPECT_FLOAT_EQ(r.penalties.repetition, 1.2f);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.prompt_logprobs, -1);
  // The prompt's log-probabilities: vLLM's field (shown as prompt_logprobs), or echo + logprobs
  // (the legacy logprobs object), computed with the larger top count of the two.
  r = parse_ok(R"({"prompt": "a", "prompt_logprobs": 3})");
  EXPECT_EQ(r.prompt_logprobs, 3);
  EXPECT_TRUE(r.show_prompt_logprobs);
  r = parse_ok(R"({"prompt": "a", "max_tokens": 0, "echo": true, "logprobs": 2})");
  EXPECT_EQ(r.prompt_logprobs, 2);
  EXPECT_FALSE(r.show_prompt_logprobs);
  r = parse_ok(R"({"prompt": "a", "echo": true, "logprobs": 4, "prompt_logprobs": 1})");
  EXPECT_EQ(r.prompt_logprobs, 4);
  EXPECT_EQ(r.logprobs, 4);
  r = parse_ok(R"({"prompt": "a", "logprobs": 4, "prompt_logprobs": null})");
  EXPECT_EQ(r.prompt_logprobs, -1);
  // Streamed: echo + logprobs still computes them (the first chunk leads with them); vLLM's
  // prompt_logprobs 0 is taken and computes nothing.
  r = parse_ok(R"({"prompt": "a", "echo": true, "logprobs": 2, "stream": true})");
  EXPECT_EQ(r.prompt_logprobs, 2);
  EXPECT_FALSE(r.show_prompt_logprobs);
  r = parse_ok(R"({"prompt": "a", "prompt_logprobs": 0, "stream": true})");
  EXPECT_EQ(r.prompt_logprobs, -1);
  EXPECT_FALSE(r.show_prompt_logprobs);

  r = parse_ok(R"({"prompt": ["a", [5, 6]], "stop": "x", "top_k": 40})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].text, "a");
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.sampling.top_k, 40);
}

TEST(OpenAiRequest, BadInputNamesTheField) {
  expect_error("{bad", ErrorCode::kInvalidArgument, "not valid JSON");
  expect_error("[1, 2]", ErrorCode::kInvalidArgument, "JSON object");
  expect_error("{}", ErrorCode::kInvalidArgument, "'prompt' is missing");
  expect_error(R"({"prompt": 5})", ErrorCode::kInvalidArgument, "'prompt'");
  expect_error(R"({"prompt": []})", ErrorCode::kInvalidArgument, "empty list");
  expect_error(R"({"prompt": [1, "a"]})", ErrorCode::kInvalidArgument, "'prompt'");
  expect_error(R"({"prompt": [[]]})", ErrorCode::kInvalidArgument, "'prompt'[0]");
  expect_error(R"({"prompt": [-1]})", ErrorCode::kInvalidArgument, "no token id");
  expect_error(R"({"prompt": [99999999999]})", ErrorCode::kInvalidArgument, "no token id");
  expect_error(R"({"prompt": "a", "model": 3})", ErrorCode::kInvalidArgument, "'model'");
  expect_error(R"({"prompt": "a", "cache_salt": ""})", ErrorCode::kInvalidArgument, "'cache_salt'");
  expect_error(R"({"prompt": "a", "cache_salt": 7})", ErrorCode::kInvalidArgument, "'cache_salt'");
  expect_error(R"({"prompt": "a", "max_tokens": -1})", ErrorCode::kInvalidArgument, "'max_tokens'");
  expect_error(R"({"prompt": "a", "max_tokens": 1.5})", ErrorCode::kInvalidArgument, "'max_tokens'");
  expect_error(R"({"prompt": "a", "max_tokens": "16"})", ErrorCode::kInvalidArgument, "'max_tokens'");
  expect_error(R"({"prompt": "a", "n": 0})", ErrorCode::kInvalidArgument, "'n'");
  expect_error(R"({"prompt": "a", "temperature": -0.5})", ErrorCode::kInvalidArgument, "'temperature'");
  expect_error(R"({"prompt": "a", "temperature": "hot"})", ErrorCode::kInvalidArgument, "'temperature'");
  expect_error(R"({"prompt": "a", "top_p": 0})", ErrorCode::kInvalidArgument, "'top_p'");
  expect_error(R"({"prompt": "a", "top_p": 1.5})", ErrorCode::kInvalidArgument, "'top_p'");
  expect_error(R"({"prompt": "a", "top_k": -2})", ErrorCode::kInvalidArgument, "'top_k'");
  expect_error(R"({"prompt": "a", "seed": "x"})", ErrorCode::kInvalidArgument, "'seed'");
  expect_error(R"({"prompt": "a", "stop": ""})", ErrorCode::kInvalidArgument, "'stop'");
  expect_error(R"({"prompt": "a", "stop": [1]})", ErrorCode::kInvalidArgument, "'stop'");
  expect_error(R"({"prompt": "a", "stream": "yes"})", ErrorCode::kInvalidArgument, "'stream'");
  expect_error(R"({"prompt": "a", "stream_options": {"include_usage": true}})", ErrorCode::kInvalidArgument,
               "'stream_options'");
  expect_error(R"({"prompt": "a", "logprobs": 1048577})", ErrorCode::kInvalidArgument, "'logprobs'");
  expect_error(R"({"prompt": "a", "logprobs": true})", ErrorCode::kInvalidArgument, "'logprobs'");
  expect_error(R"({"prompt": "a", "prompt_logprobs": 1, "stream": true})", ErrorCode::kUnsupported,
               "not available with \"stream\"");
  expect_error(R"({"prompt": "a", "prompt_logprobs": 1048577})", ErrorCode::kInvalidArgument, "'prompt_logprobs'");
  expect_error(R"({"prompt": "a", "best_of": 4})", ErrorCode::kUnsupported, "'best_of'");
  expect_error(R"({"prompt": "a", "presence_penalty": 2.5})", ErrorCode::kInvalidArgument, "'presence_penalty'");
  expect_error(R"({"prompt": "a", "frequency_penalty": -3})", ErrorCode::kInvalidArgument, "'frequency_penalty'");
  expect_error(R"({"prompt": "a", "repetition_penalty": 0})", ErrorCode::kInvalidArgument, "'repetition_penalty'");
  expect_error(R"({"prompt": "a", "max_tokens": 0})", ErrorCode::kInvalidArgument, "'max_tokens'");
  // vLLM options that would change the output are refused, not ignored.
  expect_error(R"({"prompt": "a", "min_tokens": 17})", ErrorCode::kInvalidArgument, "'min_tokens'");  // > max_tokens 16
  expect_error(R"({"prompt": "a", "min_tokens": -1})", ErrorCode::kInvalidArgument, "'min_tokens'");
  expect_error(R"({"prompt": "a", "min_p": 1.5})", ErrorCode::kInvalidArgument, "'min_p'");
  expect_error(R"({"prompt": "a", "logit_bias": {"x": 1}})", ErrorCode::kInvalidArgument, "'logit_bias'");
  expect_error(R"({"prompt": "a", "logit_bias": {"-1": 1}})", ErrorCode::kInvalidArgument, "'logit_bias'");
  expect_error(R"({"prompt": "a", "logit_bias": {"1.5": 1}})", ErrorCode::kInvalidArgument, "'logit_bias'");
  expect_error(R"({"prompt": "a", "logit_bias": {"5": "up"}})", ErrorCode::kInvalidArgument, "'logit_bias'");
  expect_error(R"({"prompt": "a", "logit_bias": [5]})", ErrorCode::kInvalidArgument, "'logit_bias'");
  expect_error(R"({"prompt": "a", "include_stop_str_in_output": 1})", ErrorCode::kInvalidArgument, "include_stop_str");
  expect_error(R"({"prompt": "a", "truncate_prompt_tokens": 0})", ErrorCode::kInvalidArgument, "'truncate_prompt_tokens' must be at least 1");
  expect_error(R"({"prompt": "a", "truncate_prompt_tokens": -2})", ErrorCode::kInvalidArgument, "truncate_prompt_tokens");
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "truncate_prompt_tokens": 5})").truncate_prompt_tokens, 5);
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "truncate_prompt_tokens": -1})").truncate_prompt_tokens, -1);
  expect_error(R"({"prompt": "a", "allowed_token_ids": []})", ErrorCode::kInvalidArgument, "allowed_token_ids");
  expect_error(R"({"prompt": "a", "allowed_token_ids": [1, "x"]})", ErrorCode::kInvalidArgument, "allowed_token_ids");
  expect_error(R"({"prompt": "a", "bad_words": "x"})", ErrorCode::kInvalidArgument, "'bad_words' must be a list");
  expect_error(R"({"prompt": "a", "bad_words": ["x", " "]})", ErrorCode::kInvalidArgument, "non-empty strings");
  expect_error(R"({"prompt": "a", "bad_words": [1]})", ErrorCode::kInvalidArgument, "'bad_words'");
  expect_error(R"({"prompt": "a", "logits_processors": ["m.f"]})", ErrorCode::kUnsupported, "logits_processors");
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "bad_words": ["x", " the end"]})").bad_words,
            (std::vector<std::string>{"x", " the end"}));
  expect_error(R"({"prompt": "a", "use_beam_search": true})", ErrorCode::kUnsupported, "use_beam_search");
  expect_error(R"({"prompt": "a", "length_penalty": 0.5})", ErrorCode::kUnsupported, "length_penalty");
  expect_error(R"({"prompt": "a", "stream": true, "stream_options": {"continuous_usage_stats": "yes"}})",
               ErrorCode::kInvalidArgument, "continuous_usage_stats");
  EXPECT_FALSE(parse_ok(R"({"prompt": "a", "stream": true, "stream_options": {"continuous_usage_stats": true}})")
                   .continuous_usage);  // only with include_usage
  EXPECT_TRUE(parse_ok(R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": true,
                           "continuous_usage_stats": true}})")
                  .continuous_usage);
  expect_error(R"({"prompt": "a", "suffix": "x"})", ErrorCode::kUnsupported, "'suffix'");
}

// vLLM's logits processors: logit_bias clamped to [-100, 100] as vLLM clamps it, min_tokens, min_p.
TEST(OpenAiRequest, LogitBiasMinTokensAndMinP) {
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "allowed_token_ids": [7, 3]})").allowed_token_ids, (std::vector<int32_t>{7, 3}));
  CompletionRequest r = parse_ok(R"({"prompt": "a", "logit_bias": {"5": 10, "7": -300.5}, "min_tokens": 4, "min_p": 0.05})");
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[0], (std::pair<int32_t, float>{5, 10.f}));
  EXPECT_EQ(r.logit_bias[1], (std::pair<int32_t, float>{7, -100.f}));
  EXPECT_EQ(r.min_tokens, 4);
  EXPECT_FLOAT_EQ(r.min_p, 0.05f);
  auto chat = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "min_tokens": 40})");
  ASSERT_TRUE(chat.ok()) << chat.error().message;  // no max_tokens: the rest of the context
  EXPECT_EQ(chat->req.min_tokens, 40);
  EXPECT_FALSE(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "min_tokens": 9, "max_tokens": 8})").ok());
}

// Completions: "logprobs" is the top count (0-20, null: none). Chat: "logprobs": true, with
// "top_logprobs" (0-20) only alongside it.
// Structured outputs: every form vLLM and OpenAI take becomes one regex (json_regex.h makes it;
// its own tests check the languages), named by the field it came from.
TEST(OpenAiRequest, StructuredOutputsInEveryForm) {
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})";
  CompletionRequest free_text = parse_ok(R"({"prompt": "a", "response_format": {"type": "text"}})");
  EXPECT_TRUE(free_text.guided_from.empty());
  struct Case {
    std::string fields, from;
  };
  const Case cases[] = {
      {R"("guided_json": )" + schema, "guided_json"},
      {R"("guided_json": "{\"type\": \"boolean\"}")", "guided_json"},  // its JSON text
      {R"("json_schema": )" + schema, "json_schema"},  // llama.cpp's
      {R"("guided_regex": "[0-9]{3}")", "guided_regex"},
      {R"("guided_choice": ["yes", "no"])", "guided_choice"},
      {R"("structured_outputs": {"json": )" + schema + "}", "structured_outputs.json"},
      {R"("structured_outputs": {"regex": "a+"})", "structured_outputs.regex"},
      {R"("structured_outputs": {"choice": ["x"]})", "structured_outputs.choice"},
      {R"("structured_outputs": {"json_object": true})", "structured_outputs.json_object"},
      {R"("response_format": {"type": "json_object"})", "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )" + schema + "}}",
       "response_format"},
  };
  for (const Case& c : cases) {
    const std::string body = R"({"prompt": "a", )" + c.fields + "}";
    auto r = parse_completion_request(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().message;
    EXPECT_EQ(r->guided_from, c.from) << body;
    EXPECT_FALSE(r->guided_regex.empty()) << body;
    EXPECT_TRUE(r->guided_grammar.empty()) << body;
  }
  // A GBNF grammar stays text (Grammar::parse reads it when the request is prepared): vLLM's two
  // fields and llama.cpp's.
  for (const auto& [fields, from] : {std::pair<std::string, std::string>{R"("guided_grammar": "root ::= x")", "guided_grammar"},
                                     {R"("structured_outputs": {"grammar": "root ::= x"})", "structured_outputs.grammar"},
                                     {R"("grammar": "root ::= x")", "grammar"}}) {
    const std::string body = R"({"prompt": "a", )" + fields + "}";
    auto r = parse_completion_request(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().message;
    EXPECT_EQ(r->guided_from, from) << body;
    EXPECT_EQ(r->guided_grammar, "root ::= x") << body;
    EXPECT_EQ(r->guided_grammar_root, "root") << body;
    EXPECT_TRUE(r->guided_regex.empty()) << body;
  }
  // Without "::=" it is Lark's syntax, converted as vLLM converts it; its start rule is kept.
  const CompletionRequest lark = parse_ok(R"({"prompt": "a", "guided_grammar": "start: word+\nword: \"a\" | 'b'"})");
  EXPECT_EQ(lark.guided_grammar_root, "start");
  EXPECT_EQ(lark.guided_grammar, "start ::= word+\nword ::= \"a\" | \"b\"\n");
  expect_error(R"({"prompt": "a", "guided_grammar": "start: /x+/"})", ErrorCode::kUnsupported,
               "'guided_grammar' (read as Lark's syntax: it has no '::='): Lark grammar, line 1: regular expressions");
  EXPECT_TRUE(parse_ok(R"({"prompt": "a", "grammar": ""})").guided_from.empty());  // "": free text, as llama.cpp
  expect_error(R"({"prompt": "a", "guided_grammar": 5})", ErrorCode::kInvalidArgument, "'guided_grammar' must be a GBNF");
  expect_error(R"({"prompt": "a", "guided_grammar": "root ::= x", "guided_regex": "a"})", ErrorCode::kInvalidArgument,
               "one structured output at most");
  expect_error(R"({"prompt": "a", "structured_outputs": {"structural_tag": "x"}})", ErrorCode::kUnsupported,
               "structured_outputs.structural_tag");
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "guided_regex": "[0-9]{3}"})").guided_regex, "[0-9]{3}");
  // Chat takes them too.
  auto chat = parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  EXPECT_EQ(chat->req.guided_from, "response_format");

  expect_error(R"({"prompt": "a", "guided_regex": "a", "guided_choice": ["b"]})", ErrorCode::kInvalidArgument,
               "guided_regex and guided_choice");
  expect_error(R"({"prompt": "a", "guided_regex": 5})", ErrorCode::kInvalidArgument, "'guided_regex'");
  expect_error(R"({"prompt": "a", "guided_choice": []})", ErrorCode::kInvalidArgument, "'guided_choice'");
  expect_error(R"({"prompt": "a", "guided_choice": ["a", 1]})", ErrorCode::kInvalidArgument, "'guided_choice'");
  expect_error(R"({"prompt": "a", "guided_json": "{not json"})", ErrorCode::kInvalidArgument, "'guided_json'");
  expect_error(R"({"prompt": "a", "guided_json": [1]})", ErrorCode::kInvalidArgument, "'guided_json'");
  // A schema keyword the converter cannot enforce is refused, naming the field and the keyword.
  expect_error(R"({"prompt": "a", "guided_json": {"type": "string", "not": {"const": "x"}}})", ErrorCode::kUnsupported,
               "not");
  expect_error(R"({"prompt": "a", "structured_outputs": {"jsn": {}}})", ErrorCode::kInvalidArgument, "jsn");
  expect_error(R"({"prompt": "a", "structured_outputs": {"json_object": false}})", ErrorCode::kInvalidArgument,
               "json_object");
  expect_error(R"({"prompt": "a", "response_format": {"type": "xml"}})", ErrorCode::kInvalidArgument, "xml");
  expect_error(R"({"prompt": "a", "response_format": {"type": "json_schema"}})", ErrorCode::kInvalidArgument,
               "json_schema");
  expect_error(R"({"prompt": "a", "response_format": "json"})", ErrorCode::kInvalidArgument, "'response_format'");
}

TEST(OpenAiRequest, LogprobsFollowEachApisForm) {
  EXPECT_EQ(parse_ok(R"({"prompt": "a"})").logprobs, -1);
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "logprobs": null})").logprobs, -1);
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "logprobs": 0})").logprobs, 0);
  EXPECT_EQ(parse_ok(R"({"prompt": "a", "logprobs": 20})").logprobs, 20);
  auto chat = [](const std::string& extra) {
    return parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}])" + extra + "}");
  };
  EXPECT_EQ(chat("")->req.logprobs, -1);
  EXPECT_EQ(chat(R"(, "logprobs": false)")->req.logprobs, -1);
  EXPECT_EQ(chat(R"(, "logprobs": true)")->req.logprobs, 0);
  EXPECT_EQ(chat(R"(, "logprobs": true, "top_logprobs": 5)")->req.logprobs, 5);
  for (const char* bad : {R"(, "top_logprobs": 2)", R"(, "logprobs": true, "top_logprobs": 1048577)", R"(, "logprobs": 3)"}) {
    auto r = chat(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message.find("logprobs'"), std::string::npos) << r.error().message;
  }
}

// Chat tools: rendered in vLLM's form; tool_choice auto (default) parses calls, none leaves the
// text, required or a named function forces calls (a structured output).
TEST(OpenAiRequest, ChatToolsAndToolChoice) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])";
  auto c = parse_chat_request("{" + msgs + ", " + tools + "}");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->tools.size(), 1u);
  EXPECT_EQ(c->tools[0], R"({"type": "function", "function": {"name": "f", "description": null, "parameters": {"z": 1, "a": 2}}})");
  EXPECT_EQ(c->tool_calls, ToolCallFormat::kHermes);
  EXPECT_TRUE(c->req.skip_special_tokens);
  auto none = parse_chat_request("{" + msgs + ", " + tools + R"(, "tool_choice": "none", "stream": true})");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->tool_calls);
  EXPECT_FALSE(parse_chat_request("{" + msgs + "}")->tool_calls);
  EXPECT_EQ(parse_chat_request("{" + msgs + ", " + tools + R"(, "stream": true})")->tool_calls, ToolCallFormat::kHermes);
  // The model's form: Mistral's [TOOL_CALLS] is a special token, kept in the text (as vLLM's
  // mistral parser asks) when calls are parsed.
  auto mistral = parse_chat_request("{" + msgs + ", " + tools + "}", ToolCallFormat::kMistral);
  ASSERT_TRUE(mistral.ok()) << mistral.error().message;
  EXPECT_EQ(mistral->tool_calls, ToolCallFormat::kMistral);
  EXPECT_FALSE(mistral->req.skip_special_tokens);
  EXPECT_TRUE(parse_chat_request("{" + msgs + ", " + tools + R"(, "tool_choice": "none"})", ToolCallFormat::kMistral)
                  ->req.skip_special_tokens);
  // Forcing a call is a structured output: calls in the model's form whose arguments follow the
  // parameters (the structured-output tests run it; here, what is accepted and what is refused).
  const std::string typed = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"q": {"type": "string"}}, "required": ["q"]}}}, {"type": "function", "function": {"name": "g"}}])";
  for (const std::string extra : {R"(, "tool_choice": "required")", R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})"}) {
    auto r = parse_chat_request("{" + msgs + ", " + typed + extra + "}");
    ASSERT_TRUE(r.ok()) << extra << ": " << r.error().message;
    EXPECT_EQ(r->req.guided_from, "tool_choice");
    EXPECT_NE(r->req.guided_regex.find("<tool_call>"), std::string::npos);
    EXPECT_EQ(r->tool_calls, ToolCallFormat::kHermes);
    auto llama = parse_chat_request("{" + msgs + ", " + typed + extra + "}", ToolCallFormat::kLlama3Json);
    ASSERT_TRUE(llama.ok()) << llama.error().message;
    EXPECT_EQ(llama->req.guided_regex.find("<tool_call>"), std::string::npos);
    EXPECT_NE(llama->req.guided_regex.find("parameters"), std::string::npos);
  }
  for (const auto& [extra, what] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})", "'nope'"},
           {R"(, "tool_choice": "sometimes")", "sometimes"},
           {R"(, "tool_choice": "required", "guided_regex": "x")", "cannot be combined"}}) {
    auto r = parse_chat_request("{" + msgs + ", " + typed + extra + "}");
    ASSERT_FALSE(r.ok()) << extra;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }
  // Parameters the converter cannot enforce (the toy schema above: no type, unknown keys) are refused, naming the tool.
  auto loose = parse_chat_request("{" + msgs + ", " + tools + R"(, "tool_choice": "required"})");
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.error().message.find("'f'"), std::string::npos) << loose.error().message;
  EXPECT_EQ(parse_chat_request("{" + msgs + R"(, "tools": [{"type": "function"}]})").error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(parse_chat_request("{" + msgs + R"(, "tool_choice": "auto"})").error().code, ErrorCode::kInvalidArgument);
  // Nested past kMaxJsonDepth: refused before any recursive walk (one a million deep overflowed the stack).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = parse_chat_request("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": )" +
                              deep + "}}}]}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("deep"), std::string::npos);
  EXPECT_FALSE(parse_completion_request(R"({"prompt": )" + deep + "}").ok());
  EXPECT_TRUE(json_depth_within(R"({"a": "[[[[[[", "b": [[1]]})", 3));  // brackets in strings do not count
  EXPECT_FALSE(json_depth_within("[[[[1]]]]", 3));
}

TEST(OpenAiRequest, ChatMessageJsonCarriesParsedToolCalls) {
  const std::string text = "Searching.<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
  auto message = [](const std::string& t, bool parse, std::string* finish = nullptr) {
    nlohmann::json choice = {{"index", 0}, {"finish_reason", "stop"}};
    put_chat_message(choice, t, ChatParsing{std::nullopt, parse ? std::optional(ToolCallFormat::kHermes) : std::nullopt});
    if (finish) *finish = choice["finish_reason"];
    return choice["message"];
  };
  std::string finish;
  nlohmann::json plain = message(text, false, &finish);
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(plain["content"], text);
  EXPECT_EQ(plain["tool_calls"], nlohmann::json::array());
  nlohmann::json m = message(text, true, &finish);
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["content"], "Searching.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "search");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"q": "x"})");
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_TRUE(message("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", true)["content"].is_null());
  EXPECT_EQ(message("no calls", true, &finish)["content"], "no calls");
  EXPECT_EQ(finish, "stop");
  nlohmann::json choice = {{"index", 0}, {"finish_reason", "stop"}};  // another form: its parser, its ids
  put_chat_message(choice, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", ChatParsing{std::nullopt, ToolCallFormat::kMistral});
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"].get<std::string>().size(), 9u);
}

// The two JSON forms, without a tokenizer (tokens are "token_id:<id>"): -inf and anything
// below -9999 is -9999 (JSON has no infinity), offsets count characters and continue.
TEST(OpenAiRequest, LogprobsJsonHasOpenAisShape) {
  const std::vector<int32_t> ids = {7, 12};
  std::vector<StepLogprobs> lps(2);
  lps[0].logprob = -0.25f;
  lps[0].top = {{7, -0.25f}, {3, -1.5f}};
  lps[1].logprob = -std::numeric_limits<float>::infinity();
  lps[1].top = {{4, -0.01f}, {9, -1e6f}};
  size_t offset = 5;
  const nlohmann::json c = logprobs_json(nullptr, false, ids, lps, &offset);
  EXPECT_EQ(c["tokens"], nlohmann::json({"token_id:7", "token_id:12"}));
  EXPECT_EQ(c["token_logprobs"][0], -0.25);
  EXPECT_EQ(c["token_logprobs"][1], -9999.0);
  EXPECT_EQ(c["text_offset"], nlohmann::json({5, 5 + 10}));
  EXPECT_EQ(offset, 5u + 10 + 11);
  // The taken token and the top ones (so up to logprobs + 1 entries).
  EXPECT_EQ(c["top_logprobs"][0], nlohmann::json({{"token_id:7", -0.25}, {"token_id:3", -1.5}}));
  EXPECT_EQ(c["top_logprobs"][1].size(), 3u);
  EXPECT_EQ(c["top_logprobs"][1]["token_id:9"], -9999.0);

  const nlohmann::json ch = logprobs_json(nullptr, true, ids, lps, nullptr);
  ASSERT_EQ(ch["content"].size(), 2u);
  const nlohmann::json& e = ch["content"][0];
  EXPECT_EQ(e["token"], "token_id:7");
  EXPECT_EQ(e["logprob"], -0.25);
  EXPECT_EQ(e["bytes"], nlohmann::json({'t', 'o', 'k', 'e', 'n', '_', 'i', 'd', ':', '7'}));
  ASSERT_EQ(e["top_logprobs"].size(), 2u);
  EXPECT_EQ(e["top_logprobs"][1]["token"], "token_id:3");
  EXPECT_EQ(e["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_FALSE(e["top_logprobs"][1].contains("top_logprobs"));
  EXPECT_EQ(ch["content"][1]["logprob"], -9999.0);
}

TEST(OpenAiRequest, ErrorsMapToHttpStatusAndOpenAiBodies) {
  EXPECT_EQ(http_status(ErrorCode::kInvalidArgument), 400);
  EXPECT_EQ(http_status(ErrorCode::kUnsupported), 400);
  EXPECT_EQ(http_status(ErrorCode::kNotFound), 404);
  EXPECT_EQ(http_status(ErrorCode::kOutOfMemory), 503);
  EXPECT_EQ(http_status(ErrorCode::kInternal), 500);
  const nlohmann::json j = error_json(Error{ErrorCode::kNotFound, "no model"});
  EXPECT_EQ(j["error"]["message"], "no model");
  EXPECT_EQ(j["error"]["code"], 404);
  EXPECT_EQ(j["error"]["type"], "not_found_error");
}

class CompletionTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::load_dir(testing::tinystories_dir());
    ASSERT_TRUE(t.ok()) << t.error().message;
    tok_ = std::move(*t);
  }
  std::vector<int32_t> ids(const std::string& text) {
    auto r = tok_->encode(text, false);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::vector<int32_t>{};
  }
  // Streams `toks` one by one: the concatenated pieces, which must equal text().
  std::string stream(CompletionText& ct, const std::vector<int32_t>& toks, const std::vector<bool>& ends = {}) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += ct.push(toks[i], i < ends.size() && ends[i]);
    out += ct.finish();
    EXPECT_EQ(out, ct.text());
    return out;
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(CompletionTextTest, StopStringsCutTheTextWhereverTokensSplitThem) {
  const std::vector<int32_t> toks = ids("The dog ran home. Then the cat slept.");
  ASSERT_GT(toks.size(), 8u);
  {
    CompletionText ct(*tok_, {}, true);
    EXPECT_EQ(stream(ct, toks), tok_->decode(toks));
    EXPECT_FALSE(ct.matched_stop());
  }
  for (const std::string& stop : {std::string("home."), std::string("e. Th"), std::string("cat"), std::string("T")}) {
    CompletionText ct(*tok_, {"zzz", stop}, true);
    const std::string full = tok_->decode(toks);
    EXPECT_EQ(stream(ct, toks), full.substr(0, full.find(stop))) << stop;
    ASSERT_TRUE(ct.matched_stop());
    EXPECT_EQ(*ct.matched_stop(), stop);
  }
  // The earliest of several stop strings wins, whichever is listed first.
  CompletionText ct(*tok_, {"cat", "dog"}, true);
  stream(ct, toks);
  EXPECT_EQ(*ct.matched_stop(), "dog");
}

// min_tokens: a stop string is looked for only in text the min_tokens-th token or a later one
// added (vLLM's rule); streamed or not, the same text.
TEST_F(CompletionTextTest, StopStringsWaitForMinTokens) {
  const std::vector<int32_t> toks = ids("The dog ran home. Then the cat slept. The end.");
  auto text_with = [&](int min_tokens) {
    CompletionText ct(*tok_, {"."}, true, -1, min_tokens);
    const std::string streamed = stream(ct, toks);
    return ct.text();
  };
  EXPECT_EQ(text_with(0), "The dog ran home");
  // The first period's token is among the first min_tokens: the next period stops it.
  size_t first_period = 0;
  for (size_t i = 0; i < toks.size(); ++i)
    if (tok_->decode({toks.begin(), toks.begin() + static_cast<long>(i) + 1}).find('.') != std::string::npos) {
      first_period = i;
      break;
    }
  EXPECT_EQ(text_with(static_cast<int>(first_period) + 2), "The dog ran home. Then the cat slept");
  EXPECT_EQ(text_with(static_cast<int>(first_period) + 1), "The dog ran home");  // that token is the min_tokens-th
  EXPECT_EQ(text_with(static_cast<int>(toks.size()) + 5), tok_->decode(toks));  // never armed: no stop
}

TEST_F(CompletionTextTest, NothingThatMayBecomeAStopStringIsShownEarly) {
  const std::vector<int32_t> toks = ids("one two three");
  CompletionText ct(*tok_, {"two three four"}, true);
  std::string shown;
  for (int32_t t : toks) {
    shown += ct.push(t);
    // What is shown never includes a prefix of the stop string that a later token could complete.
    EXPECT_EQ(shown.find("two"), std::string::npos) << shown;
  }
  shown += ct.finish();
  EXPECT_EQ(shown, tok_->decode(toks));  // it never completed: all of it is shown at the end
}

TEST_F(CompletionTextTest, SpecialTokensAndTheStopIdAreLeftOut) {
  std::vector<int32_t> toks = ids("Hi there");
  const int32_t eos = tok_->eos_id();
  ASSERT_GE(eos, 0);
  ASSERT_TRUE(tok_->is_special(eos));
  std::vector<int32_t> with_eos = toks;
  with_eos.insert(with_eos.begin() + 1, eos);
  CompletionText skip(*tok_, {}, true);
  EXPECT_EQ(stream(skip, with_eos), tok_->decode(toks));
  // skip_special_tokens off shows a special token, but never the stop id that ended generation.
  CompletionText keep(*tok_, {}, false);
  const std::string kept = stream(keep, with_eos);
  EXPECT_NE(kept, tok_->decode(toks));
  std::vector<int32_t> ended = toks;
  ended.push_back(eos);
  std::vector<bool> ends(ended.size(), false);
  ends.back() = true;
  CompletionText stop_id(*tok_, {}, false);
  EXPECT_EQ(stream(stop_id, ended, ends), tok_->decode(toks));
}

// vLLM's bad_words as ids: each word as it starts the text and, when that is another token
// sequence of the same length, after a space; every sequence decodes back to the word.
TEST_F(CompletionTextTest, BadWordsAreTokenizedWithAndWithoutALeadingSpace) {
  auto words = bad_word_ids(*tok_, {"dog", "  little girl", "\t"});
  ASSERT_TRUE(words.ok()) << words.error().message;
  ASSERT_GE(words->size(), 2u);
  size_t dog = 0, girl = 0;
  for (const std::vector<int32_t>& w : *words) {
    ASSERT_FALSE(w.empty());
    std::string text = tok_->decode(w);
    text.erase(0, text.find_first_not_of(' '));
    if (text == "dog") ++dog;
    else if (text == "little girl") ++girl;
    else ADD_FAILURE() << "'" << tok_->decode(w) << "' is not one of the words";
  }
  EXPECT_GE(dog, 1u);
  EXPECT_GE(girl, 1u);
  // A word alone decodes as the text's start would; an added spaced form differs in its first token.
  EXPECT_EQ((*words)[0], ids("dog"));
}

// The bad-words rule on one row (AgentSession::shape_logits): a word's last id is out only when
// the generated tokens end with the rest of it; a one-token word always.
TEST(BadWords, ALastIdIsOutWhenTheGeneratedTokensEndWithTheRestOfTheWord) {
  AgentDecode dec;
  dec.bad_words = {{5}, {3, 7}, {1, 2, 9}};
  auto out_after = [&](std::vector<int32_t> generated) {
    std::vector<float> row(12, 0.f);
    AgentSession::shape_logits(row, dec, generated, /*before_penalties=*/true);
    std::vector<int32_t> out;
    for (size_t i = 0; i < row.size(); ++i)
      if (std::isinf(row[i])) out.push_back(static_cast<int32_t>(i));
    return out;
  };
  EXPECT_EQ(out_after({}), (std::vector<int32_t>{5}));
  EXPECT_EQ(out_after({3}), (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(out_after({3, 4}), (std::vector<int32_t>{5}));
  EXPECT_EQ(out_after({0, 1, 2}), (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(out_after({2}), (std::vector<int32_t>{5}));  // 1 2 9 needs both before it
}

// A thinking budget on one row: from the budget on, until the marker is written, only its next
// id can be picked; a marker the model wrote itself ends it.
TEST(ThinkingBudget, TheMarkerIsForcedOnceTheBudgetIsSpent) {
  AgentDecode dec;
  dec.reasoning_budget = 2;
  dec.reasoning_end = {7, 8};
  auto kept_after = [&](std::vector<int32_t> generated) {
    std::vector<float> row(12, 0.5f);
    AgentSession::shape_logits(row, dec, generated, /*before_penalties=*/true);
    std::vector<int32_t> kept;
    for (size_t i = 0; i < row.size(); ++i)
      if (!std::isinf(row[i])) kept.push_back(static_cast<int32_t>(i));
    return kept;
  };
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(kept_after({1}), all);
  EXPECT_EQ(kept_after({1, 2}), (std::vector<int32_t>{7}));
  EXPECT_EQ(kept_after({1, 2, 7}), (std::vector<int32_t>{8}));
  EXPECT_EQ(kept_after({1, 2, 7, 8}), all);
  EXPECT_EQ(kept_after({7, 8, 3}), all);  // closed before the budget
  EXPECT_EQ(kept_after({3, 7, 8, 4, 5}), all);
  dec.reasoning_budget = 0;
  EXPECT_EQ(kept_after({}), (std::vector<int32_t>{7}));

  // With a start marker (6), as vLLM counts: the block opens after the newest start; an end
  // closes it and a later start opens another, counted afresh; no block open, no budget.
  dec.reasoning_budget = 2;
  dec.reasoning_start = {6};
  EXPECT_EQ(kept_after({1, 2, 3}), (std::vector<int32_t>{7}));  // the step starts inside (open 0)
  dec.reasoning_open = -1;                                         // the step starts outside
  EXPECT_EQ(kept_after({1, 2, 3}), all);
  EXPECT_EQ(kept_after({1, 6, 2}), all);
  EXPECT_EQ(kept_after({1, 6, 2, 3}), (std::vector<int32_t>{7}));
  EXPECT_EQ(kept_after({1, 6, 2, 3, 7}), (std::vector<int32_t>{8}));
  EXPECT_EQ(kept_after({6, 2, 3, 7, 8, 4, 5}), all);
  EXPECT_EQ(kept_after({6, 2, 7, 8, 6, 4}), all);
  EXPECT_EQ(kept_after({6, 2, 7, 8, 6, 4, 5}), (std::vector<int32_t>{7}));
  dec.reasoning_open = 1;  // the prompt ended in "<think>\n": one token in the block already
  EXPECT_EQ(kept_after({}), all);
  EXPECT_EQ(kept_after({1}), (std::vector<int32_t>{7}));
  EXPECT_EQ(kept_after({1, 6}), all);  // the model's own start restarts the count

  // What the server passes as reasoning_open: the prompt's open block (vLLM), -1 when closed.
  const std::vector<int32_t> start = {6}, end = {7, 8};
  EXPECT_EQ(thinking_tokens(std::vector<int32_t>{1, 6, 2, 3}, start, end, -1), 2);
  EXPECT_EQ(thinking_tokens(std::vector<int32_t>{1, 6, 2, 7, 8, 3}, start, end, -1), -1);
  EXPECT_EQ(thinking_tokens(std::vector<int32_t>{1, 2}, start, end, -1), -1);
  EXPECT_EQ(thinking_tokens(std::vector<int32_t>{1, 2}, start, end, 3), 5);
  EXPECT_EQ(thinking_tokens(std::vector<int32_t>{6, 7}, start, end, -1), 1);  // half a marker closes nothing
  EXPECT_TRUE(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "thinking_token_budget": -2})")
                  .error()
                  .message.find("thinking_token_budget") != std::string::npos);
  EXPECT_EQ(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "thinking_token_budget": 0})")
                ->req.thinking_token_budget,
            0);
}

// vLLM's include_stop_str_in_output: the text ends after the stop string that ended it (and
// nothing past it), and a stop id that ended it is shown unless it is a skipped special token.
TEST_F(CompletionTextTest, IncludeStopStrKeepsTheStopStringAndTheStopId) {
  EXPECT_TRUE(parse_completion_request(R"({"prompt": "a", "include_stop_str_in_output": true})")->include_stop_str_in_output);
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "a"})")->include_stop_str_in_output);
  const std::vector<int32_t> toks = ids("The dog ran home. Then the cat slept.");
  const std::string full = tok_->decode(toks);
  for (const std::string& stop : {std::string("home."), std::string("e. Th"), std::string("cat"), std::string("slept.")}) {
    CompletionText ct(*tok_, {"zzz", stop}, true, -1, 0, /*include_stop=*/true);
    EXPECT_EQ(stream(ct, toks), full.substr(0, full.find(stop) + stop.size())) << stop;
    ASSERT_TRUE(ct.matched_stop());
    EXPECT_EQ(*ct.matched_stop(), stop);
  }
  // A stop id: a plain token ("." here, as stop_token_ids may name) is shown, EOS only when
  // special tokens are.
  std::vector<int32_t> ended = ids("The dog ran home.");
  const std::vector<int32_t> before(ended.begin(), ended.end() - 1);
  ASSERT_EQ(tok_->decode(before) + ".", tok_->decode(ended));  // the last token is the period
  std::vector<bool> ends(ended.size(), false);
  ends.back() = true;
  CompletionText shown(*tok_, {}, true, -1, 0, true);
  EXPECT_EQ(stream(shown, ended, ends), tok_->decode(ended));
  CompletionText hidden(*tok_, {}, true);
  EXPECT_EQ(stream(hidden, ended, ends), tok_->decode(before));
  ended.back() = tok_->eos_id();
  CompletionText eos_skipped(*tok_, {}, true, -1, 0, true);
  EXPECT_EQ(stream(eos_skipped, ended, ends), tok_->decode(before));
  CompletionText eos_kept(*tok_, {}, false, -1, 0, true);
  const std::string kept = stream(eos_kept, ended, ends);
  EXPECT_GT(kept.size(), tok_->decode(before).size());  // EOS's text after it
  EXPECT_EQ(kept.rfind(tok_->decode(before), 0), 0u);
}

}  // namespace
}  // namespace lragent::server
