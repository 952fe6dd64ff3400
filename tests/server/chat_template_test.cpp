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
  // One byte away from a known template is not that template.
  const std::string path = fixture_config("llama3");
  if (std::filesystem::exists(path)) {
    json cfg = json::parse(testing::read_file(path));
    cfg["chat_template"] = cfg["chat_template"].get<std::string>() + " ";
    auto edited = ChatTemplate::from_tokenizer_config(cfg.dump(), "cfg.json");
    ASSERT_FALSE(edited.ok());
    EXPECT_EQ(edited.error().code, ErrorCode::kUnsupported);
    EXPECT_NE(edited.error().message.find("/v1/completions"), std::string::npos);
  }
  // A final newline after a block tag renders nothing (trim_blocks): Qwen3's template with one is
  // Qwen3's; after an expression ("}}", Llama-3's last) it would be output, so that is not Llama-3's.
  for (const char* name : {"qwen3", "llama3"}) {
    const std::string p = fixture_config(name);
    if (!std::filesystem::exists(p)) continue;
    json cfg = json::parse(testing::read_file(p));
    cfg["chat_template"] = cfg["chat_template"].get<std::string>() + "\n";
    EXPECT_EQ(ChatTemplate::from_tokenizer_config(cfg.dump(), "cfg.json").ok(), std::string(name) == "qwen3") << name;
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
            ErrorCode::kUnsupported);
  auto parts = parse_chat_messages(json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
      {"type": "text", "text": "b"}]}])"));
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(parts->at(0).content, "a\nb");
}

}  // namespace
}  // namespace lragent::server
