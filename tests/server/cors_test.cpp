// CORS (server/cors.h) as Starlette's CORSMiddleware answers for vLLM: which headers a
// cross-origin answer carries, what a preflight allows, and the flags' lists; then over HTTP: a
// preflight needs no API key, and every answer (streamed too) names what the page may read.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/cors.h"
#include "server/server_fixture.h"

namespace lragent::server {
namespace {

std::string header(const HeaderList& h, const std::string& name) {
  for (const auto& [k, v] : h)
    if (k == name) return v;
  return "<none>";
}

TEST(Cors, AnswersNameTheOriginsThatMayReadThem) {
  const CorsOptions any;  // vLLM's defaults: "*" everywhere, no credentials
  EXPECT_TRUE(cors_headers(any, "", false).empty());  // not a cross-origin request
  HeaderList h = cors_headers(any, "https://app.example", false);
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(h, "Vary"), "<none>");
  // A request with a cookie is answered with its origin, never "*".
  h = cors_headers(any, "https://app.example", true);
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(h, "Vary"), "Origin");

  CorsOptions listed;
  listed.allowed_origins = {"https://app.example"};
  listed.allow_credentials = true;
  h = cors_headers(listed, "https://app.example", false);
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(h, "Access-Control-Allow-Credentials"), "true");
  h = cors_headers(listed, "https://evil.example", false);
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "<none>");
}

TEST(Cors, PreflightsAllowWhatTheOptionsAllow) {
  CorsPreflight p = cors_preflight(CorsOptions{}, "https://app.example", "POST", "authorization, content-type");
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, "OK");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Methods"), "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Headers"), "authorization, content-type");  // "*": echoed
  EXPECT_EQ(header(p.headers, "Access-Control-Max-Age"), "600");

  CorsOptions strict;
  strict.allowed_origins = {"https://app.example"};
  strict.allowed_methods = {"GET", "POST"};
  strict.allowed_headers = {"Authorization"};
  p = cors_preflight(strict, "https://app.example", "POST", "Authorization, Content-Type");
  EXPECT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(p.headers, "Vary"), "Origin");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Headers"),
            "Accept, Accept-Language, Authorization, Content-Language, Content-Type");
  p = cors_preflight(strict, "https://evil.example", "DELETE", "x-secret");
  EXPECT_EQ(p.status, 400);
  EXPECT_EQ(p.body, "Disallowed CORS origin, method, headers");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Origin"), "<none>");
  EXPECT_EQ(cors_preflight(strict, "https://app.example", "GET", "").status, 200);
}

TEST(Cors, FlagListsAreJsonOrCommaSeparated) {
  EXPECT_EQ(*parse_cors_list(R"(["https://a.example", "https://b.example"])", "--allowed-origins"),
            (std::vector<std::string>{"https://a.example", "https://b.example"}));
  EXPECT_EQ(*parse_cors_list(" GET, POST ,", "--allowed-methods"), (std::vector<std::string>{"GET", "POST"}));
  EXPECT_EQ(*parse_cors_list("*", "--allowed-headers"), (std::vector<std::string>{"*"}));
  EXPECT_TRUE(parse_cors_list("[]", "--allowed-origins")->empty());
  auto bad = parse_cors_list("[1, 2]", "--allowed-origins");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--allowed-origins"), std::string::npos) << bad.error().message;
}

// Over HTTP: with an API key set, a browser's preflight is answered without one; the request it
// then sends (with the key) carries the origin's header, streamed or not; an origin that is not
// allowed gets a 400 preflight and answers without the header.
TEST_F(ServerTest, BrowsersOnOtherOriginsMayCallTheServer) {
  ServerOptions o;
  o.api_key = "sesame";
  o.cors.allowed_origins = {"https://app.example"};
  start(ShareMode::kBase, o);
  httplib::Client c("127.0.0.1", port_);
  auto pre = c.Options("/v1/chat/completions", {{"Origin", "https://app.example"},
                                                {"Access-Control-Request-Method", "POST"},
                                                {"Access-Control-Request-Headers", "authorization, content-type"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 200) << pre->body;
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  for (bool stream : {false, true}) {
    const std::string body = json{{"prompt", "Hi"}, {"max_tokens", 2}, {"stream", stream}}.dump();
    auto r = c.Post("/v1/completions", {{"Origin", "https://app.example"}, {"Authorization", "Bearer sesame"}}, body,
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "https://app.example") << stream;
    EXPECT_EQ(r->get_header_value("Vary"), "Origin");
  }
  // Without the key the page still reads the 401 (and so why).
  auto denied = c.Post("/v1/completions", {{"Origin", "https://app.example"}}, "{}", "application/json");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(denied->get_header_value("Access-Control-Allow-Origin"), "https://app.example");

  auto evil = c.Options("/v1/completions", {{"Origin", "https://evil.example"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(evil);
  EXPECT_EQ(evil->status, 400);
  EXPECT_EQ(evil->body, "Disallowed CORS origin");
  auto health = c.Get("/health", {{"Origin", "https://evil.example"}});
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_FALSE(health->has_header("Access-Control-Allow-Origin"));
  // A request from no other origin (curl, an SDK) gets none of it.
  EXPECT_FALSE(c.Get("/health")->has_header("Access-Control-Allow-Origin"));
}

}  // namespace
}  // namespace lragent::server
