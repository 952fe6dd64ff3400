// vLLM's per-request "chat_template" (serve --trust-request-chat-template): refused unless the
// server trusts requests' templates; then the conversation is rendered with the request's
// template (and the server's special tokens), for /v1/chat/completions and /tokenize alike.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/synthetic_chat_fixture.h"

namespace lragent::server {
namespace {

using nlohmann::json;

class RequestTemplateTest : public testing::SyntheticChatServerTest {};

TEST_F(RequestTemplateTest, ARequestsOwnTemplateIsRenderedOnlyWhenTrusted) {
  const std::string tmpl =
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  const json messages = {{{"role", "user"}, {"content", "Hi there"}}};
  json chat = {{"model", "plan"}, {"messages", messages}, {"max_tokens", 3}, {"temperature", 0}, {"chat_template", tmpl}};
  auto [s, text] = post("/v1/chat/completions", chat);
  EXPECT_EQ(s, 400) << text;
  EXPECT_NE(text.find("--trust-request-chat-template"), std::string::npos) << text;

  ServerOptions o;
  o.trust_request_chat_template = true;
  start(o);
  // /tokenize renders it as the completion does: the same ids as the text it makes.
  const json asked = {{"model", "plan"}, {"messages", messages}, {"chat_template", tmpl}};
  auto [ts, tok] = post("/tokenize", asked);
  ASSERT_EQ(ts, 200) << tok;
  auto [ps, plain] = post("/tokenize", {{"model", "plan"}, {"prompt", "<user>Hi there\n<assistant>"},
                                        {"add_special_tokens", false}});
  ASSERT_EQ(ps, 200) << plain;
  EXPECT_EQ(json::parse(tok)["tokens"], json::parse(plain)["tokens"]);
  auto [cs, ctext] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cs, 200) << ctext;
  EXPECT_EQ(json::parse(ctext)["usage"]["prompt_tokens"], json::parse(tok)["count"]);
  // Without one, the model's template, as before; a template that does not parse is the request's error.
  chat.erase("chat_template");
  auto [ms, mtext] = post("/v1/chat/completions", chat);
  ASSERT_EQ(ms, 200) << mtext;
  EXPECT_NE(json::parse(mtext)["usage"]["prompt_tokens"], json::parse(tok)["count"]);
  chat["chat_template"] = "{% for m in messages %}";
  auto [bs, btext] = post("/v1/chat/completions", chat);
  EXPECT_EQ(bs, 400) << btext;
  EXPECT_NE(btext.find("the request's 'chat_template'"), std::string::npos) << btext;
  chat["chat_template"] = 7;
  EXPECT_EQ(post("/v1/chat/completions", chat).first, 400);
}

}  // namespace
}  // namespace lragent::server
