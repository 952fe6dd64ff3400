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
#include "server/http_fixture.h"
#include "server/openai_api.h"
#include "server/template_fixture.h"
#include "test_util.h"

namespace lragent::server {
namespace {

using nlohmann::ordered_json;

// strftime of the goldens' pinned time (2026-11-30 13:45:00), as the script pins transformers'.
std::string pinned_strftime(const std::string& format) { return testing::strftime_at(format, 2026, 11, 30, 13, 45, 0); }

using testing::config_for;
using testing::templates_dir;

TEST(ChatTemplateJinja, EveryRealTemplateRendersAsTransformersDoes) {
  const auto goldens = ordered_json::parse(testing::read_file(testing::fixtures_dir() + "/goldens/chat_templates_jinja.json"));
  const auto tokens = testing::template_tokens();
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
        if (want.rfind("TemplateError", 0) == 0) {
          EXPECT_NE(got.error().message.find(words), std::string::npos) << got.error().message;
        }
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
  const auto tokens = testing::template_tokens();
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

// End to end over HTTP with an interpreted template (Qwen2.5's, on the tiny model: the plumbing,
// not the model's chat skill): the conversation is rendered as the template renders it and
// completed as /v1/completions completes the rendered text; /tokenize counts the same tokens; a
// conversation the template refuses (Mistral-Nemo's alternation rule) is a 400 in its words, and
// the server goes on.
class ChatJinjaServerTest : public testing::HttpServerTest {};

TEST_F(ChatJinjaServerTest, AnInterpretedTemplateServesChatAndItsRefusalsAre400) {
  const auto tokens = testing::template_tokens();
  auto t = ChatTemplate::from_tokenizer_config(config_for("qwen2_5", tokens), "qwen2_5");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ(t->format, ChatFormat::kJinja);
  ServerOptions o;
  o.chat_template = *t;
  start(o);
  const nlohmann::json messages = nlohmann::json::array({{{"role", "system"}, {"content", "You plan."}},
                                                         {{"role", "user"}, {"content", "Once upon a time"}}});
  auto [st, chat] = post("/v1/chat/completions",
                         {{"model", "plan"}, {"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << chat.dump();
  const std::string rendered = *t->render(*parse_chat_messages(ordered_json::parse(messages.dump())), true);
  EXPECT_NE(rendered.find("<|im_start|>system\nYou plan.<|im_end|>"), std::string::npos) << rendered;
  const std::vector<int32_t> ids = *tok_->encode(rendered, /*add_special_tokens=*/false);
  EXPECT_EQ(chat["usage"]["prompt_tokens"].get<size_t>(), ids.size());
  auto [st2, plain] = post("/v1/completions", {{"model", "plan"}, {"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(st2, 200) << plain.dump();
  EXPECT_EQ(chat["choices"][0]["message"]["content"], plain["choices"][0]["text"]);
  auto [st3, counted] = post("/tokenize", {{"model", "plan"}, {"messages", messages}});
  ASSERT_EQ(st3, 200) << counted.dump();
  EXPECT_EQ(counted["count"].get<size_t>(), ids.size());

  server_->stop();
  thread_.join();
  auto m = ChatTemplate::from_tokenizer_config(config_for("mistral_nemo", tokens), "mistral_nemo");
  ASSERT_TRUE(m.ok()) << m.error().message;
  o.chat_template = *m;
  start(o);
  auto [st4, refused] = post("/v1/chat/completions",
                             {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}});
  EXPECT_EQ(st4, 400) << refused.dump();
  EXPECT_NE(refused.dump().find("roles must alternate"), std::string::npos) << refused.dump();
  auto [st5, fine] = post("/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 2}});
  EXPECT_EQ(st5, 200) << fine.dump();
}

}  // namespace
}  // namespace lragent::server
