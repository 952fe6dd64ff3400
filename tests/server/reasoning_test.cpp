// A thinking model's <think>...</think> split from its answer as vLLM's qwen3 / deepseek_r1
// reasoning parsers split it, whole and streamed in every way of cutting the text into pieces,
// and then the tool calls parsed out of the answer alone.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/guide/byte_dfa.h"
#include "server/openai_api.h"
#include "server/reasoning.h"

namespace lragent::server {
namespace {

TEST(Reasoning, SplitAsVllmSplitsIt) {
  struct Case {
    std::string text;
    bool thinking;
    std::optional<std::string> reasoning, content;
  };
  const std::vector<Case> cases = {
      // Qwen3: the model opens and closes the block; the blank lines stay where they were written.
      {"<think>\nLet me see.\n</think>\n\nParis.", true, "\nLet me see.\n", "\n\nParis."},
      // DeepSeek-R1: the template opened it in the prompt.
      {"Hmm, 2+2.</think>4", true, "Hmm, 2+2.", "4"},
      // Stopped while thinking (max_tokens): all reasoning.
      {"<think>\nStill thinking", true, "\nStill thinking", std::nullopt},
      {"no tags at all", true, "no tags at all", std::nullopt},
      {"<think></think>", true, std::nullopt, std::nullopt},
      {"</think>answer only", true, std::nullopt, "answer only"},
      {"a</think>b</think>c", true, "a", "b</think>c"},  // the first close ends it
      {"<think>x<think>y</think>z", true, "x<think>y", "z"},  // only a leading open is dropped
      // Qwen3 with enable_thinking false: the template closed an empty block; all of it is content.
      {"Paris.", false, std::nullopt, "Paris."},
      {"<think>a</think>b", false, std::nullopt, "<think>a</think>b"},
      {"", false, std::nullopt, std::nullopt},
      {"", true, std::nullopt, std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text + (c.thinking ? " (thinking)" : " (not thinking)"));
    const ReasoningSplit s = split_reasoning(c.text, c.thinking);
    EXPECT_EQ(s.reasoning, c.reasoning);
    EXPECT_EQ(s.content, c.content);
  }
  EXPECT_EQ(*parse_reasoning_format("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(*parse_reasoning_format(reasoning_format_name(ReasoningFormat::kDeepSeekR1)), ReasoningFormat::kDeepSeekR1);
  EXPECT_FALSE(parse_reasoning_format("granite").ok());
}

// Streamed in pieces of every size and at random cuts, the reasoning and content that go out are
// the whole split's, and no piece of a tag goes out as reasoning before it is known not to be one.
TEST(Reasoning, StreamedPiecesJoinToTheWholeSplit) {
  const std::vector<std::string> fragments = {"<think>", "</think>", "<", "</", "</thi", "nk>", "think", "a", "\n", "é", " "};
  std::mt19937 rng(5);
  std::vector<std::string> texts = {"<think>\nplan\n</think>\n\nanswer", "<thi", "<think", "abc</thi", "x</think>", ""};
  for (int i = 0; i < 300; ++i) {
    std::string t;
    for (int k = rng() % 8; k > 0; --k) t += fragments[rng() % fragments.size()];
    texts.push_back(t);
  }
  for (const std::string& text : texts)
    for (bool thinking : {true, false})
      for (size_t step : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{0}}) {  // 0: random cuts
        SCOPED_TRACE(text + " step " + std::to_string(step) + (thinking ? "" : " (not thinking)"));
        ReasoningStream stream(thinking);
        std::string reasoning, content;
        for (size_t at = 0; at < text.size();) {
          const size_t n = std::min(text.size() - at, step ? step : 1 + rng() % 5);
          const ReasoningStream::Piece p = stream.push(text.substr(at, n));
          reasoning += p.reasoning;
          content += p.content;
          at += n;
          // Reasoning that went out never holds a whole or partial "</think>" it could not yet know.
          EXPECT_EQ(reasoning.find("</think>"), std::string::npos);
        }
        const ReasoningStream::Piece last = stream.finish();
        reasoning += last.reasoning;
        content += last.content;
        const ReasoningSplit whole = split_reasoning(text, thinking);
        EXPECT_EQ(reasoning, whole.reasoning.value_or(""));
        EXPECT_EQ(content, whole.content.value_or(""));
      }
}

// Reasoning first, then tool calls out of the answer alone: a <tool_call> written while thinking
// is not a call.
TEST(Reasoning, ToolCallsAreParsedFromTheAnswer) {
  const std::string text =
      "<think>\nI could write <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call> here.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
  const ChatParsing parsing{true, ToolCallFormat::kHermes};
  nlohmann::json choice = {{"index", 0}, {"finish_reason", "stop"}};
  put_chat_message(choice, text, parsing);
  const nlohmann::json& m = choice["message"];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(m["reasoning_content"], "\nI could write <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call> here.\n");
  EXPECT_EQ(m["reasoning"], m["reasoning_content"]);
  EXPECT_EQ(m["content"], "\n\n");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "search");

  // Streamed: the same reasoning, the content before the call, the call at the end.
  ChatStream stream(parsing);
  std::string reasoning, content;
  for (size_t at = 0; at < text.size(); at += 3) {
    const ChatStream::Delta d = stream.push(text.substr(at, 3));
    reasoning += d.reasoning;
    content += d.content;
  }
  const ChatStream::End end = stream.finish();
  reasoning += end.rest.reasoning;
  content += end.rest.content;
  EXPECT_EQ(reasoning, m["reasoning_content"].get<std::string>());
  EXPECT_EQ(content, "\n\n");
  ASSERT_EQ(end.tool_calls.size(), 1u);
  EXPECT_EQ(end.tool_calls[0]["function"], m["tool_calls"][0]["function"]);

  // Without a reasoning parser the message has no reasoning fields and the text is whole.
  nlohmann::json plain = {{"index", 0}, {"finish_reason", "stop"}};
  put_chat_message(plain, "<think>a</think>b", ChatParsing{});
  EXPECT_EQ(plain["message"]["content"], "<think>a</think>b");
  EXPECT_FALSE(plain["message"].contains("reasoning_content"));
  // Stopped while thinking: no content, reasoning only.
  nlohmann::json cut = {{"index", 0}, {"finish_reason", "length"}};
  put_chat_message(cut, "<think>hmm", ChatParsing{true, std::nullopt});
  EXPECT_TRUE(cut["message"]["content"].is_null());
  EXPECT_EQ(cut["message"]["reasoning_content"], "hmm");
}

// A structured output under a reasoning parser: any reasoning (that does not close the block),
// "</think>", whitespace, then the output. Checked on the regex's DFA against a plain search for
// the tag, over texts made of the tag's pieces.
TEST(Reasoning, StructuredOutputsComeAfterTheReasoning) {
  auto dfa = guide::ByteDfa::compile(after_reasoning("\\{[a-z]{1,3}\\}"));
  ASSERT_TRUE(dfa.ok()) << dfa.error().message;
  auto matches = [&](const std::string& text) {
    int32_t s = (*dfa)->start();
    for (unsigned char c : text) s = (*dfa)->next(s, c);
    return (*dfa)->accepting(s);
  };
  EXPECT_TRUE(matches("<think>\nLet me see.\n</think>\n\n{abc}"));
  EXPECT_TRUE(matches("</think>{a}"));                      // DeepSeek-R1: opened in the prompt
  EXPECT_TRUE(matches("a < b, </thin </think> {ab}"));      // tag-like text inside the reasoning
  EXPECT_FALSE(matches("{abc}"));                           // not before the reasoning ends
  EXPECT_FALSE(matches("<think>x</think>y</think>{a}"));    // the first "</think>" ends it
  EXPECT_FALSE(matches("<think>x</think>{abcd}"));
  const std::vector<std::string> pieces = {"<", "/", "t", "h", "i", "n", "k", ">", "</thin", "</think", "</think>", "<<", "a", "\n", "é"};
  std::mt19937 rng(9);
  for (int i = 0; i < 3000; ++i) {
    std::string r;
    for (int k = rng() % 7; k > 0; --k) r += pieces[rng() % pieces.size()];
    EXPECT_EQ(matches(r + "</think>{ab}"), r.find("</think>") == std::string::npos) << r;
    EXPECT_EQ(matches("<think>" + r + "</think> {ab}"), r.find("</think>") == std::string::npos) << r;
    EXPECT_FALSE(matches(r)) << r;
  }
}

}  // namespace
}  // namespace lragent::server
