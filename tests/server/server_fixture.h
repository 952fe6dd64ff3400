// The fixture of the `lragent serve` tests over HTTP (server_test.cpp, server_http_test.cpp,
// server_memory_test.cpp): tinystories-656k with the plan/action/reflect adapters served in a
// chosen sharing mode, and what those tests read back (metrics, streams, raw sockets).
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "server/http_fixture.h"
#include "server/server.h"

namespace lragent::server {

using nlohmann::json;
using testing::sse_events;

// The server's address on this machine, for tests that speak raw TCP to it.
inline sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A socket connected to the server, whose reads and writes give up after 10 s (so a stalled
// exchange fails the test within seconds instead of at ctest's timeout); -1 when it cannot connect.
inline int connect_with_timeout(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const sockaddr_in addr = loopback(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The value of an unlabelled series in a /metrics text (-1 when it is absent).
inline double metric_value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
}

class ServerTest : public testing::HttpServerTest {
 protected:
  void start(ShareMode mode, ServerOptions o = {}) {
    o.pool.replay.sharing.mode = mode;
    HttpServerTest::start(o);
  }
  std::pair<int, json> complete(const json& body) { return post("/v1/completions", body.dump()); }
  // The value of an unlabelled series in the server's /metrics now (-1 when it cannot be read).
  double metric(const std::string& series) {
    auto r = httplib::Client("127.0.0.1", port_).Get("/metrics");
    return r ? metric_value(r->body, series) : -1.0;
  }
  // Waits (~4 s at most) until the series is `want` (or, with at_least, at least that); whether it got there.
  bool wait_for(const std::string& series, double want, bool at_least = false) {
    auto there = [&] { const double v = metric(series); return at_least ? v >= want : v == want; };
    for (int i = 0; i < 2000 && !there(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return there();
  }
  // A completion request body parsed as the server parses it (for Server::complete).
  static CompletionRequest request(const json& body) {
    auto r = parse_completion_request(body.dump());
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? *r : CompletionRequest{};
  }
  // The KV memory one agent's caches take at their cap (a server started with 8 trajectories
  // reserved: an eighth of its memory, and in none a quarter of that, four agents' private caches).
  double agent_cap_bytes(ShareMode mode) {
    httplib::Client c("127.0.0.1", port_);
    return json::parse(c.Get("/lragent/sessions")->body)["kv_memory"]["bytes"].get<double>() / 8 /
           (mode == ShareMode::kNone ? 4 : 1);
  }
  // The completion of `generate`'s greedy tokens for a prompt (BOS added), stopping at EOS as
  // the server does: the text they add to the prompt's (as vLLM's completion text is).
  std::string generate_text(const std::string& prompt, const std::string& adapter, int max_tokens) {
    GenerateRequest req;
    auto ids = tok_->encode(prompt, true);
    EXPECT_TRUE(ids.ok());
    req.prompt = *ids;
    req.max_tokens = max_tokens;
    req.adapter = adapter.empty() ? nullptr : reg_.find(adapter);
    req.stop_ids = model_->config().eos_token_ids;
    Generator gen(*model_, EngineOptions{});
    auto r = gen.run({req});
    EXPECT_TRUE(r.ok());
    std::vector<int32_t> out = (*r)[0].output;
    if ((*r)[0].finish_reason == "stop") out.pop_back();
    std::vector<int32_t> all = req.prompt;
    all.insert(all.end(), out.begin(), out.end());
    const std::string head = tok_->decode(req.prompt), whole = tok_->decode(all);
    EXPECT_EQ(whole.rfind(head, 0), 0u) << "the prompt's text is not a prefix of prompt + completion";
    return whole.substr(head.size());
  }

};

// The text of a stream: its deltas per choice, finish reasons, and the usage chunk.
struct Streamed {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  std::map<int, json> logprobs;  // the events' completions logprobs, their lists joined
  json usage;
  bool done = false;
};
inline Streamed parse_sse(const std::string& body) {
  Streamed s;
  for (const json& j : testing::sse_events(body, &s.done)) {
    if (j.contains("usage")) s.usage = j["usage"];
    for (const json& c : j["choices"]) {
      s.text[c["index"].get<int>()] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) s.finish[c["index"].get<int>()] = c["finish_reason"];
      if (!c["logprobs"].is_null()) {
        json& all = s.logprobs[c["index"].get<int>()];
        for (const char* list : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (const json& e : c["logprobs"][list]) all[list].push_back(e);
      }
    }
  }
  return s;
}
}  // namespace lragent::server
