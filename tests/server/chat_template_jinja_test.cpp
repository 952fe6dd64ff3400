// Interpreted chat templates (ChatFormat::kJinja) against HF transformers' own renderer
// (tests/fixtures/goldens/chat_templates_jinja.json, from scripts/goldens/jinja_chat_goldens.py
// on transformers 5.17): the real templates of tests/fixtures/chat_templates/ (Llama-3, 3.1,
// 3.2 with tools, Qwen2.5, Qwen3, Mistral-Nemo, Gemma-3, DeepSeek-V3, InternLM2) over
// conversations given in the OpenAI API's form, parsed as the server parses a request. Where
// transformers' render raised (a template refusing the conversation), lragent must refuse too.
// The templates lragent also renders in C++ (both Llama-3-Instruct revisions, Qwen3) are checked both ways.
#include <gtest/gtest.h>

#include <ctime>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_template.h"
#include "server/openai_api.h"
#include "test_util.h"

namespace lragent::server {
namespace {

using nlohmann::ordered_json;

// strftime of the goldens' pinned time (2026-11-30 13:45:00), as the script pins transformers'.
std::string pinned_strftime(const std::string& format) {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 30;
  tm.tm_hour = 13;
  tm.tm_min = 45;
  tm.tm_wday = 1;   // a Monday
  tm.tm_yday = 333;
  char buf[256];
  const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
  return std::string(buf, n);
}

std::string templates_dir() { return testing::fixtures_dir() + "/chat_templates"; }

// The tokenizer_config.json a model with this template would have.
std::string config_for(const std::string& name, const ordered_json& tokens) {
  ordered_json cfg = ordered_json::object();
  for (const auto& [key, value] : tokens[name].items())
    if (key != "package" && !value.is_null()) cfg[key] = value;
  cfg["chat_template"] = testing::read_file(templates_dir() + "/" + name + ".jinja");
  return cfg.dump();
}

TEST(ChatTemplateJinja, EveryRealTemplateRendersAsTransformersDoes) {
  const auto goldens = ordered_json::parse(testing::read_file(testing::fixtures_dir() + "/goldens/chat_templates_jinja.json"));
  const auto tokens = ordered_json::parse(testing::read_file(templates_dir() + "/tokens.json"));
  std::map<std::string, ChatTemplate> interpreted, builtin;
  int rendered = 0, refused = 0, compared_builtin = 0;
  for (const ordered_json& c : goldens["cases"]) {
    const std::string name = c["template"].get<std::string>(), conv = c["conversation"].get<std::string>();
    SCOPED_TRACE(name + " / " + conv + " / " + c.dump().substr(0, 160));
    if (!interpreted.count(name)) {
      auto t = ChatTemplate::from_tokenizer_config(config_for(name, tokens), name, /*builtin=*/false);
      ASSERT_TRUE(t.ok()) << t.error().message;
      EXPECT_EQ(t->format, ChatFormat::kJinja);
      t->strftime_now = pinned_strftime;
      interpreted.emplace(name, std::move(*t));
      auto b = ChatTemplate::from_tokenizer_config(config_for(name, tokens), name);
      ASSERT_TRUE(b.ok()) << b.error().message;
      if (b->format != ChatFormat::kJinja) builtin.emplace(name, std::move(*b));
    }
    const ordered_json& conversation = goldens["conversations"][conv];
    auto messages = parse_chat_messages(conversation["messages"]);
    ASSERT_TRUE(messages.ok()) << messages.error().message;
    std::vector<std::string> tools;
    if (!conversation["tools"].is_null()) {
      auto t = parse_chat_tools(conversation["tools"]);
      ASSERT_TRUE(t.ok()) << t.error().message;
      tools = std::move(*t);
    }
    const bool agp = c["add_generation_prompt"].get<bool>();
    const bool thinking = c.value("enable_thinking", true);
    auto got = interpreted.at(name).render(*messages, agp, thinking, tools);
    if (c.contains("error")) {
      EXPECT_FALSE(got.ok()) << "transformers refused (" << c["error"].get<std::string>() << "), lragent rendered:\n"
                             << *got;
      if (!got.ok()) {
        EXPECT_EQ(got.error().code, ErrorCode::kInvalidArgument);
        // The template's own message, as transformers raised it.
        const std::string want = c["error"].get<std::string>();
        const std::string words = want.substr(want.find(": ") + 2);
        if (want.rfind("TemplateError", 0) == 0)
          EXPECT_NE(got.error().message.find(words), std::string::npos) << got.error().message;
        ++refused;
      }
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got, c["text"].get<std::string>());
    ++rendered;
    if (builtin.count(name) && (tools.empty() || builtin.at(name).supports_tools())) {
      auto b = builtin.at(name).render(*messages, agp, thinking, tools);
      ASSERT_TRUE(b.ok()) << b.error().message;
      EXPECT_EQ(*b, c["text"].get<std::string>()) << "the C++ renderer of " << name;
      ++compared_builtin;
    }
  }
  EXPECT_EQ(interpreted.size(), 9u);
  EXPECT_EQ(builtin.size(), 3u);  // llama3 (its first revision), llama3_1 (its second: the same family) and qwen3
  EXPECT_GT(rendered, 400);
  EXPECT_GT(refused, 30);
  EXPECT_GT(compared_builtin, 60);
}

TEST(ChatTemplateJinja, ABrokenTemplateIsRefusedWithWhereAndASpecialTokenObjectIsItsContent) {
  auto bad = ChatTemplate::from_tokenizer_config(R"({"chat_template": "{% for m in messages %}{{ m.content }"})", "cfg");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(bad.error().message.find("cfg: its chat_template cannot be used"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("line 1"), std::string::npos) << bad.error().message;

  auto t = ChatTemplate::from_tokenizer_config(
      R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "model_max_length": 8,
          "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}{% if tools is none %}!{% endif %}"})",
      "cfg");
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto text = t->render({{"user", "hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text, "<s>[user] hi</s>!");
  // Tools go to the template, which decides what to write of them (here: that there are some).
  EXPECT_TRUE(t->supports_tools());
  auto with_tools = t->render({{"user", "hi"}}, true, true, {R"({"type": "function", "function": {"name": "f"}})"});
  ASSERT_TRUE(with_tools.ok()) << with_tools.error().message;
  EXPECT_EQ(*with_tools, "<s>[user] hi</s>");
  // A template's raise_exception is the client's 400, in the template's words.
  auto strict = ChatTemplate::from_tokenizer_config(
      R"({"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('user first, please') }}{% endif %}ok"})",
      "cfg");
  ASSERT_TRUE(strict.ok()) << strict.error().message;
  auto refused = strict->render({{"assistant", "hi"}}, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(refused.error().message, "the chat template refused the conversation: user first, please");
}

// chat_template_kwargs reach an interpreted template as variables, as vLLM passes them (Llama-3.2's
// date_string; a kwarg cannot replace the messages).
TEST(ChatTemplateJinja, ChatTemplateKwargsAreTheTemplatesVariables) {
  const auto tokens = ordered_json::parse(testing::read_file(templates_dir() + "/tokens.json"));
  auto t = ChatTemplate::from_tokenizer_config(config_for("llama3_2", tokens), "llama3_2");
  ASSERT_TRUE(t.ok()) << t.error().message;
  t->strftime_now = pinned_strftime;
  auto req = parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}],
      "chat_template_kwargs": {"date_string": "01 Jan 2025", "messages": [], "enable_thinking": true}})");
  ASSERT_TRUE(req.ok()) << req.error().message;
  EXPECT_EQ(req->template_kwargs.size(), 3u);
  auto with = t->render(req->messages, true, req->enable_thinking, req->tools, req->template_kwargs);
  ASSERT_TRUE(with.ok()) << with.error().message;
  EXPECT_NE(with->find("Today Date: 01 Jan 2025"), std::string::npos) << *with;
  EXPECT_NE(with->find("hi<|eot_id|>"), std::string::npos) << *with;  // the messages are the request's
  auto without = t->render(req->messages, true);
  ASSERT_TRUE(without.ok()) << without.error().message;
  EXPECT_NE(without->find("Today Date: 30 Nov 2026"), std::string::npos) << *without;  // strftime_now's
}

}  // namespace
}  // namespace lragent::server
