// The built-in synthetic model (random weights, a byte tokenizer: every text is spellable) served
// over HTTP with Qwen2.5's real chat template and three role adapters (plan, action, reflect),
// for the API translations' end-to-end tests (Responses, Messages), and a way to drive it with an
// official client SDK (a node script, skipped when node or the SDK fixture is missing).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/synthetic.h"
#include "server/chat_template.h"
#include "server/server.h"
#include "server/template_fixture.h"
#include "test_util.h"

namespace lragent::testing {

class SyntheticChatServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(2);
    auto m = make_synthetic_model(SyntheticSpec{}, *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    tok_ = make_byte_tokenizer();
    for (auto& a : make_synthetic_adapters(model_->config())) ASSERT_TRUE(reg_.add(std::move(a)).ok());
    start({});
  }
  // Serves with `o`'s options (the template, base-lr and 2048 tokens a trajectory set here), in
  // place of the server before.
  void start(server::ServerOptions o) {
    TearDown();
    auto t = server::ChatTemplate::from_tokenizer_config(config_for("qwen2_5", template_tokens()), "qwen2_5");
    ASSERT_TRUE(t.ok()) << t.error().message;
    o.base_name = "tiny";
    o.chat_template = *t;
    o.pool.replay.sharing.mode = ShareMode::kBaseLr;
    o.pool.replay.sharing.max_tokens = 2048;
    auto s = server::Server::create(*model_, tok_.get(), &reg_, o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    server_ = std::move(*s);
    auto port = server_->bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.error().message;
    port_ = *port;
    thread_ = std::thread([this] { (void)server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  // POST: the status and the body (-1 when nothing came back).
  std::pair<int, std::string> post(const char* path, const nlohmann::json& body) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto res = c.Post(path, body.dump(), "application/json");
    return res ? std::pair<int, std::string>{res->status, res->body} : std::pair<int, std::string>{-1, ""};
  }
  // The /v1/chat/completions answer a translated API's answer is checked against: `messages`
  // with the sampling fields (null, and a failure, when it is not a 200).
  nlohmann::json chat_reference(const char* model, const nlohmann::json& messages, int max_tokens,
                                const nlohmann::json& sampling) const {
    nlohmann::json body = {{"model", model}, {"messages", messages}, {"max_tokens", max_tokens}};
    body.update(sampling);
    auto [status, text] = post("/v1/chat/completions", body);
    if (status != 200) {
      ADD_FAILURE() << "chat reference: " << status << " " << text;
      return nullptr;
    }
    return nlohmann::json::parse(text);
  }
  // logit_bias keeping the text ASCII: the byte tokenizer hands out a character's bytes one by
  // one, and each event's JSON would replace a split one.
  static nlohmann::json ascii_only() {
    nlohmann::json bias = nlohmann::json::object();
    for (int b = 0x80; b < 0x100; ++b) bias[std::to_string(3 + b)] = -100;
    return bias;
  }
  // Runs `node tests/server/<script> <sdk entry> <base URL> plan` and expects it to print "ok";
  // skips without node or without the SDK (scripts/fetch-fixtures.sh fetches it into .fixtures/<sdk>).
  void run_sdk_script(const std::string& script, const std::string& sdk, const std::string& base_url) {
    const std::string entry = fetched_fixtures_dir() + "/" + sdk + "/package/index.mjs";
    if (!std::ifstream(entry)) GTEST_SKIP() << "no " << sdk << " SDK at " << entry << " (scripts/fetch-fixtures.sh)";
    if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no node on PATH";
    const std::string cmd = fmt::format("node {}/tests/server/{} {} {} plan 2>&1", source_dir(), script, entry, base_url);
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("ok"), std::string::npos) << out;
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tok_;
  AdapterRegistry reg_;
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lragent::testing
