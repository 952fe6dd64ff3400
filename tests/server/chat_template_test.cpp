// Chat templates against transformers' apply_chat_template (tests/fixtures/goldens/
// chat_templates.json, from scripts/goldens/chat_template_goldens.py) for the Llama-3 and Qwen3
// templates of the npm tokenizer fixtures; unknown templates and bad messages are refused.
#include <gtest/gtest.h>

#include <filesystem>

#include "server/chat_template.h"
#include "test_util.h"

namespace lragent::server {
namespace {

using nlohmann::json;

std::string fixture_config(const std::string& name) {
  return testing::fetched_fixtures_dir() + "/" + name + "/tokenizer_config.json";
}

TEST(ChatTemplate, RendersAsTransformersDoes) {
  const json goldens = json::parse(testing::read_file(testing::fixtures_dir() + "/goldens/chat_templates.json"));
  int checked = 0;
  for (const std::string name : {"llama3", "llama3-agp", "qwen3"}) {
    const std::string path = fixture_config(name.substr(0, name.find('-')));
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing: run scripts/fetch-fixtures.sh";
    json cfg = json::parse(testing::read_file(path));
    // The second Llama-3 revision, as transformers rendered it (its text is in the goldens).
    if (name == "llama3-agp") cfg["chat_template"] = goldens["llama3_agp_template"];
    auto t = ChatTemplate::from_tokenizer_config(cfg.dump(), path);
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(chat_format_name(t->format), name.substr(0, name.find('-')));
    for (const json& c : goldens["cases"]) {
      if (c["tokenizer"] != name) continue;
      auto msgs = parse_chat_messages(c["messages"]);
      ASSERT_TRUE(msgs.ok()) << msgs.error().message;
      auto text = t->render(*msgs, c["add_generation_prompt"].get<bool>(), c.value("enable_thinking", true));
      ASSERT_TRUE(text.ok()) << text.error().message;
      EXPECT_EQ(*text, c["text"].get<std::string>()) << name << " " << c["conversation"] << " " << c.dump();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 77);
}

TEST(ChatTemplate, UnknownTemplatesAndBadMessagesAreRefused) {
  auto none = ChatTemplate::from_tokenizer_config(R"({"bos_token": "<s>"})", "cfg.json");
  EXPECT_EQ(none.error().code, ErrorCode::kNotFound);
  // One byte away from a known template is not that template: it is interpreted (and renders
  // that byte), as is an unparsable one refused with where it fails.
  const std::string path = fixture_config("llama3");
  if (std::filesystem::exists(path)) {
    json cfg = json::parse(testing::read_file(path));
    cfg["chat_template"] = cfg["chat_template"].get<std::string>() + " ";
    auto edited = ChatTemplate::from_tokenizer_config(cfg.dump(), "cfg.json");
    ASSERT_TRUE(edited.ok()) << edited.error().message;
    EXPECT_EQ(edited->format, ChatFormat::kJinja);
    auto text = edited->render({{"user", "hi"}}, true);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(text->back(), ' ');
    cfg["chat_template"] = cfg["chat_template"].get<std::string>() + "{% if %}";
    auto broken = ChatTemplate::from_tokenizer_config(cfg.dump(), "cfg.json");
    ASSERT_FALSE(broken.ok());
    EXPECT_EQ(broken.error().code, ErrorCode::kCorrupt);
    EXPECT_NE(broken.error().message.find("/v1/completions"), std::string::npos);
  }
  // A final newline after a block tag renders nothing (trim_blocks): Qwen3's template with one is
  // Qwen3's; after an expression ("}}", Llama-3's last) it would be output, so that is not Llama-3's
  // built-in one (it is interpreted).
  for (const char* name : {"qwen3", "llama3"}) {
    const std::string p = fixture_config(name);
    if (!std::filesystem::exists(p)) continue;
    json cfg = json::parse(testing::read_file(p));
    cfg["chat_template"] = cfg["chat_template"].get<std::string>() + "\n";
    auto t = ChatTemplate::from_tokenizer_config(cfg.dump(), "cfg.json");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->format, std::string(name) == "qwen3" ? ChatFormat::kQwen3 : ChatFormat::kJinja) << name;
  }
  EXPECT_EQ(ChatTemplate::from_tokenizer_config("{", "cfg.json").error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(R"({"chat_template": 5})", "cfg.json").error().code, ErrorCode::kCorrupt);

  EXPECT_FALSE(parse_chat_messages(json::array()).ok());
  EXPECT_FALSE(parse_chat_messages(json::parse(R"([{"content": "x"}])")).ok());
  EXPECT_FALSE(parse_chat_messages(json::parse(R"([{"role": "robot", "content": "x"}])")).ok());
  EXPECT_FALSE(parse_chat_messages(json::parse(R"([{"role": "user", "content": 5}])")).ok());
  EXPECT_EQ(parse_chat_messages(json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])")).error().code,
            ErrorCode::kUnsupported);
  EXPECT_EQ(parse_chat_messages(json::parse(R"([{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}])"))
                .error()
                .code,
            ErrorCode::kInvalidArgument);  // a call without function name and arguments
  EXPECT_FALSE(parse_chat_messages(json::parse(
                   R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}])"))
                   .ok());
  EXPECT_FALSE(parse_chat_messages(json::parse(
                   R"([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}])"))
                   .ok());
  // A call without arguments ("", null or none) has {} as vLLM reads it.
  for (const char* args : {R"("arguments": "")", R"("arguments": null)", R"("x": 1)"}) {
    auto m = parse_chat_messages(json::parse(std::string(R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", )") +
                                             args + "}}]}]"));
    ASSERT_TRUE(m.ok()) << args << ": " << m.error().message;
    EXPECT_EQ(m->at(0).tool_calls.at(0).arguments, "{}") << args;
  }
  auto parts = parse_chat_messages(json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
      {"type": "text", "text": "b"}]}])"));
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(parts->at(0).content, "a\nb");
}

// Tool definitions and calls against transformers (Qwen3; the tools and arguments in vLLM's
// form, as vLLM hands them to the template: tests/fixtures/goldens/chat_templates.json's
// tool_cases), read in order (the template writes keys as the client sent them).
TEST(ChatTemplate, ToolsRenderAsVllmHandsThemToTransformers) {
  const std::string path = fixture_config("qwen3");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing: run scripts/fetch-fixtures.sh";
  auto t = ChatTemplate::from_tokenizer_config(testing::read_file(path), path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->supports_tools());
  const auto goldens =
      nlohmann::ordered_json::parse(testing::read_file(testing::fixtures_dir() + "/goldens/chat_templates.json"));
  int checked = 0;
  for (const auto& c : goldens["tool_cases"]) {
    auto msgs = parse_chat_messages(c["messages"]);
    ASSERT_TRUE(msgs.ok()) << msgs.error().message;
    auto tools = parse_chat_tools(c["tools"]);
    ASSERT_TRUE(tools.ok()) << tools.error().message;
    auto text = t->render(*msgs, c["add_generation_prompt"].get<bool>(), true, *tools);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, c["text"].get<std::string>()) << c["conversation"];
    ++checked;
  }
  EXPECT_EQ(checked, 8);

  // Llama-3's templates have no place for tools: refused, not dropped.
  const std::string llama = fixture_config("llama3");
  if (std::filesystem::exists(llama)) {
    auto l = ChatTemplate::from_tokenizer_config(testing::read_file(llama), llama);
    ASSERT_TRUE(l.ok());
    auto msgs = parse_chat_messages(json::parse(R"([{"role": "user", "content": "x"}])"));
    EXPECT_EQ(l->render(*msgs, true, true, {"{}"}).error().code, ErrorCode::kUnsupported);
    auto calls = parse_chat_messages(json::parse(
        R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}])"));
    ASSERT_TRUE(calls.ok());
    EXPECT_EQ(l->render(*calls, true).error().code, ErrorCode::kUnsupported);
  }
  EXPECT_FALSE(parse_chat_tools(nlohmann::ordered_json::parse(R"([{"type": "function"}])")).ok());
  EXPECT_FALSE(parse_chat_tools(nlohmann::ordered_json::parse(R"([{"type": "web", "function": {"name": "f"}}])")).ok());
  EXPECT_FALSE(parse_chat_tools(nlohmann::ordered_json::parse(R"({"name": "f"})")).ok());
}

TEST(ChatTemplate, PythonJsonDumpsMatchesPythons) {
  using oj = nlohmann::ordered_json;
  // Outputs of Python 3's json.dumps(json.loads(text), ensure_ascii=False).
  EXPECT_EQ(python_json_dumps(oj::parse(R"({"b": 1, "a": [true, null, 0.5, 1e-05, -3], "c": {}})")),
            R"({"b": 1, "a": [true, null, 0.5, 1e-05, -3], "c": {}})");
  EXPECT_EQ(python_json_dumps(oj::parse(R"({"s":"caf\u00e9\n\"q\"\\\u0001","e":[]})")),
            R"({"s": "café\n\"q\"\\\u0001", "e": []})");
  // Python's float repr, e.g. [repr(x) for x in (1e16, 2.0, 1e15, 1234567890123456.0, 0.0001, 1e-05, -0.5, 123.456, 1.5e300, 0.0)]
  EXPECT_EQ(python_json_dumps(oj::parse("1e16")), "1e+16");
  EXPECT_EQ(python_json_dumps(oj::parse("2.0")), "2.0");
  EXPECT_EQ(python_json_dumps(oj::parse("1e15")), "1000000000000000.0");
  EXPECT_EQ(python_json_dumps(oj::parse("1234567890123456.0")), "1234567890123456.0");
  EXPECT_EQ(python_json_dumps(oj::parse("0.0001")), "0.0001");
  EXPECT_EQ(python_json_dumps(oj::parse("0.00001")), "1e-05");
  EXPECT_EQ(python_json_dumps(oj::parse("-0.5")), "-0.5");
  EXPECT_EQ(python_json_dumps(oj::parse("123.456")), "123.456");
  EXPECT_EQ(python_json_dumps(oj::parse("1.5e300")), "1.5e+300");
  EXPECT_EQ(python_json_dumps(oj::parse("0.0")), "0.0");
  EXPECT_EQ(python_json_dumps(oj::parse("[12, -3]")), "[12, -3]");
}

}  // namespace
}  // namespace lragent::server

namespace lragent::server {
namespace {

// transformers' continue_final_message cut, case by case: after the message's whole text when the
// template keeps its spacing, after its stripped text when it trims it, at its last occurrence.
TEST(ContinueFinalMessage, CutsAfterTheFinalMessagesTextAsTransformersDoes) {
  const std::string head = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  auto cut = [](const std::string& rendered, const std::string& text) {
    auto r = continue_final_message(rendered, text);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? *r : std::string();
  };
  EXPECT_EQ(cut(head + "The answer<|im_end|>\n", "The answer"), head + "The answer");
  EXPECT_EQ(cut(head + "The answer<|im_end|>\n", "The answer "), head + "The answer");     // trimmed by the template
  EXPECT_EQ(cut(head + "The answer <|im_end|>\n", "The answer "), head + "The answer ");   // kept by it
  EXPECT_EQ(cut(head + "  Hi<|im_end|>\n", "  Hi"), head + "  Hi");                      // leading space: stripped text
  EXPECT_EQ(cut(head + "Hi<|im_end|>\n", "Hi"), head + "Hi");                            // the last "Hi", not the user's
  EXPECT_EQ(cut(head + "<|im_end|>\n", ""), head + "<|im_end|>\n");                      // nothing to cut after
  auto missing = continue_final_message(head + "Something else<|im_end|>\n", "The answer");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(missing.error().message.find("does not appear in the chat"), std::string::npos);
}

}  // namespace
}  // namespace lragent::server
