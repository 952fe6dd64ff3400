// A server over HTTP on the tiny model (tests/tiny_agents.h) with its three role adapters, for
// tests that talk to it as a client does: start() with the options under test, post() a body.
#pragma once

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/server.h"
#include "tiny_agents.h"

namespace lragent::testing {

// Whether two JSON values are equal but for floats, which may differ by `tol`: the logprobs of a
// request and of a later one that reuses its cached prompt, whose last prompt row then runs as a
// one-row step rather than the last row of a batched prefill (the BLAS kernel sums in another
// order on some CPUs; 1e-6 apart on an AVX-512 machine).
inline ::testing::AssertionResult json_near(const nlohmann::json& a, const nlohmann::json& b, double tol = 1e-4,
                                            const std::string& at = "$") {
  if (a.is_number_float() || b.is_number_float()) {
    if (a.is_number() && b.is_number() && std::abs(a.get<double>() - b.get<double>()) <= tol)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << at << ": " << a.dump() << " vs " << b.dump();
  }
  if (a.type() != b.type() || a.size() != b.size())
    return ::testing::AssertionFailure() << at << ": " << a.dump() << " vs " << b.dump();
  if (a.is_array()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (auto r = json_near(a[i], b[i], tol, at + "[" + std::to_string(i) + "]"); !r) return r;
  } else if (a.is_object()) {
    for (const auto& [k, v] : a.items()) {
      if (!b.contains(k)) return ::testing::AssertionFailure() << at << ": no key " << k << " in " << b.dump();
      if (auto r = json_near(v, b[k], tol, at + "." + k); !r) return r;
    }
  } else if (a != b) {
    return ::testing::AssertionFailure() << at << ": " << a.dump() << " vs " << b.dump();
  }
  return ::testing::AssertionSuccess();
}

// A server-sent-event body's events, parsed, up to "data: [DONE]" (*done says whether it came).
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<nlohmann::json> events;
  if (done) *done = false;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      if (done) *done = true;
      break;
    }
    events.push_back(nlohmann::json::parse(data));
  }
  return events;
}

class HttpServerTest : public TinyAgentsTest {
 protected:
  void SetUp() override {
    TinyAgentsTest::SetUp();
    for (auto& a : adapters_) ASSERT_TRUE(reg_.add(std::move(a)).ok());
  }
  void TearDown() override { stop(); }
  // Serves "tiny" and the adapters on 512-token trajectories (the model's context), in `o`'s
  // sharing mode (base-lr unless set).
  void start(server::ServerOptions o = {}) {
    o.base_name = "tiny";
    o.pool.replay.sharing.max_tokens = 512;
    auto s = server::Server::create(*model_, tok_.get(), &reg_, o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    server_ = std::move(*s);
    auto port = server_->bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.error().message;
    port_ = *port;
    thread_ = std::thread([this] { (void)server_->serve(); });
    for (int i = 0; i < 200; ++i) {
      if (auto r = httplib::Client("127.0.0.1", port_).Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "the server did not come up";
  }
  void stop() {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  // POSTs `body`; the status and the parsed answer (the raw text as a JSON string when it is not
  // JSON; -1 and the client's error when nothing came back).
  std::pair<int, nlohmann::json> post(const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), h, body, "application/json");
    if (!r) return {-1, nlohmann::json(httplib::to_string(r.error()))};
    nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
    return {r->status, j.is_discarded() ? nlohmann::json(r->body) : j};
  }
  std::pair<int, nlohmann::json> post(const std::string& path, const char* body) { return post(path, std::string(body)); }
  std::pair<int, nlohmann::json> post(const std::string& path, const nlohmann::json& body) { return post(path, body.dump()); }

  AdapterRegistry reg_;
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lragent::testing
