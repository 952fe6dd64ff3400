// `lragent serve`'s HTTP edge and its clients: bad requests get OpenAI error bodies while the
// server keeps serving, bodies in any framing, API keys, clients that leave (streaming or not,
// waiting or running), concurrent and batched clients get what they would get one at a time,
// stopping with requests in flight, one server per port, bursts of clients.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <latch>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/server_fixture.h"
#include "test_util.h"
#include "tiny_agents.h"

namespace lragent::server {
namespace {

TEST_F(ServerTest, BadRequestsGetOpenAiErrorsAndTheServerKeepsServing) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  start(ShareMode::kBaseLr, o);
  auto expect = [&](int want, const std::pair<int, json>& got, const std::string& words) {
    EXPECT_EQ(got.first, want) << got.second.dump();
    ASSERT_TRUE(got.second.is_object() && got.second.contains("error")) << got.second.dump();
    EXPECT_EQ(got.second["error"]["code"], want);
    EXPECT_NE(got.second["error"]["message"].get<std::string>().find(words), std::string::npos) << got.second.dump();
  };
  expect(400, post("/v1/completions", "{not json"), "not valid JSON");
  expect(404, complete({{"model", "nobody"}, {"prompt", "x"}}), "plan");  // the error lists the served names
  expect(400, complete({{"prompt", "x"}, {"max_tokens", 600}}), "maximum context length is 512");
  expect(400, complete({{"prompt", std::vector<int>{1, 999999}}}), "outside the vocabulary");
  expect(400, complete({{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}}), "not available");
  expect(400, post("/v1/chat/completions", R"({"messages": []})"), "/v1/completions");
  expect(413, post("/v1/completions", json{{"prompt", std::string(8000, 'a')}}.dump()), "larger");
  expect(404, post("/v1/nothing", "{}"), "no route");
  // Still serving, with the right answer.
  auto [status, j] = complete({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(status, 200);
  EXPECT_EQ(j["choices"][0]["text"], generate_text("Once upon a time", "plan", 8));
}

// `curl -d BODY` (the README's example) sends Content-Type application/x-www-form-urlencoded:
// the body is still read as JSON, up to max_body_bytes like any other (httplib by itself parses
// such a body as form fields and refuses one over 8 KB with 413).
TEST_F(ServerTest, AJsonBodySentAsFormDataIsReadAsJsonWhateverItsSize) {
  start(ShareMode::kBaseLr);
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(120, 0);
  const std::string body = json{{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}}.dump();
  const std::string padded = body + std::string(9000, ' ');  // JSON may end in whitespace
  for (const std::string& b : {body, padded}) {
    auto r = c.Post("/v1/completions", b, "application/x-www-form-urlencoded");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << b.size() << " bytes: " << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], generate_text("Once upon a time", "plan", 4));
  }
  auto t = c.Post("/tokenize", json{{"prompt", "Hello"}}.dump() + std::string(9000, ' '),
                  "application/x-www-form-urlencoded");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->status, 200) << t->body;
  // A multipart form is no JSON: 400 with an OpenAI error body, and the server keeps serving.
  auto m = c.Post("/v1/completions", httplib::MultipartFormDataItems{{"prompt", "Once", "", ""}});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 400) << m->body;
  EXPECT_NE(m->body.find("not valid JSON"), std::string::npos) << m->body;
  EXPECT_EQ(complete({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 4}}).first, 200);
}

// A POST with no Content-Length (`curl -X POST URL`) has no body: it is answered at once as an
// empty body, not read until the client hangs up.
TEST_F(ServerTest, APostWithoutABodyIsAnEmptyBody) {
  start(ShareMode::kBaseLr);
  const int fd = connect_with_timeout(port_);
  ASSERT_GE(fd, 0);
  const std::string http = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  std::string got;
  char buf[1024];
  for (ssize_t n; got.find("}}") == std::string::npos && (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  EXPECT_NE(got.find("not valid JSON"), std::string::npos) << got;
}

TEST_F(ServerTest, AnApiKeyIsRequiredWhenSet) {
  ServerOptions o;
  o.api_key = "sesame";
  start(ShareMode::kBase, o);
  const std::string body = json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump();
  EXPECT_EQ(post("/v1/completions", body).first, 401);
  EXPECT_EQ(post("/v1/completions", body, {{"Authorization", "Bearer nope"}}).first, 401);
  EXPECT_EQ(post("/v1/completions", body, {{"Authorization", "Bearer sesame"}}).first, 200);
  httplib::Client c("127.0.0.1", port_);
  EXPECT_EQ(c.Get("/health")->status, 200);  // health needs no key, nor do vLLM's /version and /ping
  auto v = c.Get("/version");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->status, 200);
  EXPECT_EQ(json::parse(v->body)["version"], LRAGENT_VERSION);
  EXPECT_EQ(c.Get("/ping")->status, 200);
  EXPECT_EQ(c.Post("/ping", "", "application/json")->status, 200);
}

// A client that goes away mid-stream abandons its request; the next one is served.
TEST_F(ServerTest, AClientLeavingMidStreamLeavesTheServerWell) {
  // Computed before the server runs: the abandoned stream may still be generating when the next
  // request is answered, and a model serves one caller at a time (the server's engine thread).
  const std::string want = generate_text("Once upon a time", "action", 6);
  start(ShareMode::kBaseLr);
  const std::string body = json{{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 400},
                                {"ignore_eos", true}, {"stream", true}}.dump();
  const int fd = connect_with_timeout(port_);
  ASSERT_GE(fd, 0);
  const std::string http = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  char buf[256];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0) << "no byte of the stream within 10 s";  // the stream started
  ::close(fd);
  auto [status, j] = complete({{"model", "action"}, {"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], want);
}

// A streaming client that goes away while its request waits (the one trajectory slot is held by a
// running request, and its prompt shares nothing with that one's) is noticed before the request
// starts (Server::kAlivePoll): it never runs (its model's prompt tokens stay 0), and the server
// serves on. Without the check it waited on, and ran once the slot came free, streaming into a
// closed socket. The holder's four choices run one after another in the one slot (~0.5 s).
TEST_F(ServerTest, AStreamingClientGoneWhileItsRequestWaitsIsNotServed) {
  ServerOptions o;
  o.pool.max_sessions = 1;
  start(ShareMode::kFull, o);
  // The slot holder: a long greedy completion.
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> holder_done{false};
  Clock::time_point holder_end;
  int holder_status = 0;
  std::thread holder([&] {
    holder_status = complete({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 480}, {"n", 4},
                              {"ignore_eos", true}, {"temperature", 0}})
                        .first;
    holder_end = Clock::now();
    holder_done.store(true);
  });
  ASSERT_TRUE(wait_for("lragent:num_requests_running", 1)) << "the holder did not start";
  const std::string body = json{{"model", "action"}, {"prompt", "The sun was hot and the sky was blue."},
                                {"max_tokens", 8}, {"stream", true}}.dump();
  const int fd = connect_with_timeout(port_);
  ASSERT_GE(fd, 0);
  const std::string http = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  const bool queued = wait_for("lragent:num_requests_waiting", 1);
  ::close(fd);
  const Clock::time_point closed = Clock::now();
  bool noticed = false;  // the waiting request ended while the holder still held the slot
  while (!holder_done.load() && !(noticed = metric("lragent:num_requests_waiting") == 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  holder.join();
  ASSERT_TRUE(queued) << "the second request was not waiting";
  EXPECT_EQ(holder_status, 200);
  if (!noticed) {
    // The slot came free first. Within a few polls that says nothing (a machine too fast for the
    // test's timing); later, the server had time to notice and did not.
    const double after = std::chrono::duration<double>(holder_end - closed).count();
    if (after < 5 * std::chrono::duration<double>(Server::kAlivePoll).count())
      GTEST_SKIP() << "the holder ended " << after << " s after the client left: too soon to tell";
    FAIL() << "the client's leaving was not noticed in the " << after << " s the request still waited";
  }
  EXPECT_EQ(metric("lragent:prompt_tokens_total{model_name=\"action\"}"), 0) << "the abandoned request ran";
  auto [status, j] = complete({{"model", "action"}, {"prompt", "The sun was hot"}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(status, 200) << j.dump();
}

// vLLM's --scheduling-policy priority: with the one trajectory slot held, a request of priority
// 5 and then one of priority -1 wait; the -1 starts first when the slot comes free, though it
// came later. Under fcfs (the default) a priority other than 0 is refused, naming the flag.
TEST_F(ServerTest, PrioritySchedulingStartsTheLowestValueFirst) {
  ServerOptions o;
  o.pool.max_sessions = 1;
  o.priority_scheduling = true;
  start(ShareMode::kFull, o);
  std::atomic<bool> holder_done{false};
  std::thread holder([&] {
    EXPECT_EQ(complete({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 480}, {"n", 4},
                        {"ignore_eos", true}, {"temperature", 0}})
                  .first,
              200);
    holder_done.store(true);
  });
  ASSERT_TRUE(wait_for("lragent:num_requests_running", 1)) << "the holder did not start";
  std::mutex mu;
  std::vector<int64_t> finished;  // the waiting requests' priorities, in the order they ended
  auto waiting = [&](int64_t priority) {
    return std::thread([&, priority] {
      auto [status, j] = complete({{"model", "action"}, {"prompt", "The sun was hot"}, {"max_tokens", 8},
                                   {"temperature", 0}, {"priority", priority}});
      EXPECT_EQ(status, 200) << j.dump();
      std::lock_guard<std::mutex> lock(mu);
      finished.push_back(priority);
    });
  };
  std::thread later = waiting(5);
  ASSERT_TRUE(wait_for("lragent:num_requests_waiting", 1));
  std::thread first = waiting(-1);
  ASSERT_TRUE(wait_for("lragent:num_requests_waiting", 2));
  const bool both_waited = !holder_done.load();
  holder.join();
  later.join();
  first.join();
  if (!both_waited) GTEST_SKIP() << "the holder ended before both requests waited: too fast a machine to tell";
  EXPECT_EQ(finished, (std::vector<int64_t>{-1, 5}));
}

// vLLM's request ids: X-Request-Id (else the body's request_id) names a completion ("cmpl-<id>",
// streamed chunks too); with --enable-request-id-headers every answer carries X-Request-Id.
TEST_F(ServerTest, ClientsNameTheirRequests) {
  ServerOptions o;
  o.request_id_headers = true;
  start(ShareMode::kBaseLr, o);
  httplib::Client c("127.0.0.1", port_);
  const json body = {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 3}};
  auto r = c.Post("/v1/completions", {{"X-Request-Id", "plan-step-7"}}, body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(json::parse(r->body)["id"], "cmpl-plan-step-7");
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "plan-step-7");
  json named = body;
  named["request_id"] = "from-body";
  r = c.Post("/v1/completions", named.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(json::parse(r->body)["id"], "cmpl-from-body");
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "from-body");
  r = c.Post("/v1/completions", {{"X-Request-Id", "header-wins"}}, named.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(json::parse(r->body)["id"], "cmpl-header-wins");
  // Streamed: every chunk carries it.
  json streamed = body;
  streamed["stream"] = true;
  r = c.Post("/v1/completions", {{"X-Request-Id", "s1"}}, streamed.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  const std::vector<json> events = testing::sse_events(r->body);
  ASSERT_FALSE(events.empty());
  for (const json& e : events) EXPECT_EQ(e["id"], "cmpl-s1");
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "s1");
  // Unnamed: a random id, the same in the header; other routes echo the request's or make one.
  r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  const std::string id = json::parse(r->body)["id"].get<std::string>();
  ASSERT_EQ(id.rfind("cmpl-", 0), 0u);
  EXPECT_EQ("cmpl-" + r->get_header_value("X-Request-Id"), id);
  auto m = c.Get("/v1/models", {{"X-Request-Id", "list"}});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->get_header_value("X-Request-Id"), "list");
  EXPECT_FALSE(c.Get("/health")->get_header_value("X-Request-Id").empty());
  // A header that cannot name a request is not taken; a request_id that cannot is refused.
  r = c.Post("/v1/completions", {{"X-Request-Id", std::string(300, 'x')}}, body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(json::parse(r->body)["id"].get<std::string>().size(), 5u + 16u);
  named["request_id"] = "has space";
  auto [status, err] = complete(named);
  EXPECT_EQ(status, 400);
  EXPECT_NE(err.dump().find("'request_id'"), std::string::npos) << err.dump();
}

TEST_F(ServerTest, APriorityNeedsThePriorityPolicy) {
  start(ShareMode::kFull);
  auto [status, j] = complete({{"prompt", "Once"}, {"max_tokens", 2}, {"priority", 3}});
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_NE(j.dump().find("--scheduling-policy priority"), std::string::npos) << j.dump();
  EXPECT_EQ(complete({{"prompt", "Once"}, {"max_tokens", 2}, {"priority", 0}}).first, 200);
  EXPECT_EQ(complete({{"prompt", "Once"}, {"max_tokens", 2}, {"priority", "high"}}).first, 400);
}

// A non-streaming client that goes away is noticed too (its connection's socket is found and
// peeked at, client_socket.h; httplib 0.11 tells a plain handler nothing): gone while its request
// runs, the request stops ("abort") instead of computing its 4 x 480 tokens (~0.5 s); gone while it
// waits for the one trajectory slot, it never runs. The server serves on.
TEST_F(ServerTest, ANonStreamingClientGoneStopsItsRequest) {
  ServerOptions o;
  o.pool.max_sessions = 1;
  start(ShareMode::kFull, o);
  // Sends a non-streaming request on a raw socket (closed by the caller, unread).
  auto send_request = [&](const json& body) {
    const int fd = connect_with_timeout(port_);
    EXPECT_GE(fd, 0);
    const std::string b = body.dump();
    const std::string http = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
    EXPECT_EQ(::send(fd, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
    return fd;
  };
  const json long_body = {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 480}, {"n", 4},
                          {"ignore_eos", true}, {"temperature", 0}};
  // Gone while it runs.
  int fd = send_request(long_body);
  ASSERT_TRUE(wait_for("lragent:num_requests_running", 1)) << "the request did not start";
  ::close(fd);
  ASSERT_TRUE(wait_for("lragent:num_requests_running", 0)) << "the request did not end";
  const double generated = metric("lragent:generation_tokens_total{model_name=\"plan\"}");
  EXPECT_LT(generated, 4 * 480) << "the request ran to its end after its client left";
  EXPECT_GE(metric("lragent:request_success_total{model_name=\"plan\",finished_reason=\"abort\"}"), 1);
  // Gone while it waits: a second client's request holds the one slot.
  std::thread holder([&] { EXPECT_EQ(complete(long_body).first, 200); });
  ASSERT_TRUE(wait_for("lragent:num_requests_running", 1)) << "the holder did not start";
  fd = send_request({{"model", "action"}, {"prompt", "The sun was hot and the sky was blue."}, {"max_tokens", 8}});
  const bool queued = wait_for("lragent:num_requests_waiting", 1);
  ::close(fd);
  bool noticed = false;  // it ended while the holder still held the slot
  for (int i = 0; i < 2000 && metric("lragent:num_requests_running") >= 1 && !noticed; ++i) {
    noticed = metric("lragent:num_requests_waiting") == 0;
    if (!noticed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  holder.join();
  ASSERT_TRUE(queued) << "the second request was not waiting";
  EXPECT_TRUE(noticed) << "the waiting request's client leaving was not noticed while the holder ran";
  EXPECT_EQ(metric("lragent:prompt_tokens_total{model_name=\"action\"}"), 0) << "the abandoned request ran";
  auto [status, j] = complete({{"model", "action"}, {"prompt", "The sun was hot"}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(status, 200) << j.dump();
}

// Requests from several clients at once each get what they would alone (none: no agent's output
// depends on another's entries), whichever order they run in and whatever they are batched with.
TEST_F(ServerTest, ConcurrentClientsGetTheirOwnAnswers) {
  start(ShareMode::kNone);
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Ben went", "A big red ball"};
  const std::vector<std::string> models = {"plan", "action", "reflect", "tiny"};
  std::vector<std::string> want;
  for (size_t i = 0; i < prompts.size(); ++i)
    want.push_back(generate_text(prompts[i], models[i] == "tiny" ? "" : models[i], 10));
  std::vector<std::string> got(prompts.size() * 3);
  std::vector<std::thread> clients;
  for (size_t k = 0; k < got.size(); ++k)
    clients.emplace_back([&, k] {
      const size_t i = k % prompts.size();
      auto [status, j] = complete({{"model", models[i]}, {"prompt", prompts[i]}, {"max_tokens", 10}, {"temperature", 0}});
      if (status == 200) got[k] = j["choices"][0]["text"];
    });
  for (auto& t : clients) t.join();
  for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], want[k % prompts.size()]) << k;
}

// Requests that arrive while another runs join its passes: each gets what it gets alone (greedy,
// seeded, with logprobs, streamed or not, on the base model or an adapter), a request for the
// trajectory the first one holds runs on a copy of it, and /metrics counts passes that served
// several and the copy.
TEST_F(ServerTest, RequestsArrivingTogetherRunBatchedAndEachGetsWhatItGetsAlone) {
  const std::vector<json> bodies = {
      {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 150}, {"ignore_eos", true}, {"temperature", 0}},
      {{"model", "action"}, {"prompt", "The little dog ran"}, {"max_tokens", 30}, {"temperature", 0.8}, {"seed", 5}},
      {{"model", "reflect"}, {"prompt", "Lily and Ben went to the park. They"}, {"max_tokens", 25}, {"temperature", 0},
       {"logprobs", 2}, {"ignore_eos", true}},
      {{"model", "tiny"}, {"prompt", "A big red ball"}, {"max_tokens", 20}, {"temperature", 0}},
      {{"model", "action"}, {"prompt", "Once upon a time"}, {"max_tokens", 15}, {"temperature", 0}},  // the first's trajectory
  };
  start(ShareMode::kBaseLr);
  std::vector<CompletionChoice> alone;
  for (const json& b : bodies) {
    auto r = server_->complete(request(b));
    ASSERT_TRUE(r.ok()) << r.error().message;
    alone.push_back((*r)[0]);
  }
  stop();
  start(ShareMode::kBaseLr);
  std::vector<std::optional<CompletionChoice>> got(bodies.size());
  std::vector<std::thread> later;
  std::string streamed;  // the first request's pieces
  auto run = [&](size_t i, const DeltaFn& on_delta) {
    auto r = server_->complete(request(bodies[i]), on_delta);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (r.ok()) got[i] = (*r)[0];
  };
  // The others are sent once the first has begun, with most of its 150 tokens to go.
  run(0, [&](const CompletionDelta& d) {
    if (later.empty())
      for (size_t i = 1; i < bodies.size(); ++i)
        later.emplace_back(run, i, i % 2 ? DeltaFn{} : DeltaFn([](const CompletionDelta&) { return true; }));
    streamed += d.text;
    return true;
  });
  for (auto& t : later) t.join();
  ASSERT_EQ(later.size(), bodies.size() - 1);
  for (size_t i = 0; i < bodies.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(got[i]);
    EXPECT_EQ(got[i]->token_ids, alone[i].token_ids);
    EXPECT_EQ(got[i]->text, alone[i].text);
    EXPECT_EQ(got[i]->finish_reason, alone[i].finish_reason);
    ASSERT_EQ(got[i]->logprobs.size(), alone[i].logprobs.size());
    for (size_t k = 0; k < alone[i].logprobs.size(); ++k)
      EXPECT_NEAR(got[i]->logprobs[k].logprob, alone[i].logprobs[k].logprob, 1e-4);
  }
  EXPECT_EQ(streamed, alone[0].text);
  EXPECT_EQ(alone[2].logprobs.size(), 25u);
  // The fifth (the first's prompt, another agent) ran beside the first on a copy of its
  // trajectory, reading the prompt entries the first computed (base-lr: it computed only the
  // prompt's last position), and got what it gets on the first's trajectory afterwards.
  EXPECT_NE(got[4]->trajectory, got[0]->trajectory);
  EXPECT_EQ(got[0]->reused_tokens, 1);  // a fresh trajectory: BOS
  EXPECT_EQ(got[4]->reused_tokens, got[4]->prompt_tokens - 1);
  EXPECT_EQ(got[4]->prefilled_tokens, 1);
  httplib::Client c("127.0.0.1", port_);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  auto value = [&](const std::string& series) { return metric_value(m->body, series); };
  const double passes = value("lragent:engine_passes_total"), served = value("lragent:engine_pass_sequences_total");
  double generated = 0;
  for (const auto& g : got) generated += static_cast<double>(g->completion_tokens);
  EXPECT_EQ(served, generated);  // a pass per request per generated token, however batched
  EXPECT_LT(passes + 10, served) << "the requests did not share passes";
  EXPECT_EQ(value("lragent:num_requests_running"), 0);
  EXPECT_EQ(value("lragent:num_requests_waiting"), 0);
  EXPECT_EQ(value("lragent:trajectories_copied_total"), 1);
  EXPECT_EQ(value("lragent:trajectory_copied_tokens_total"), static_cast<double>(got[4]->reused_tokens));
  // One KV memory for every trajectory: what is in use (a page the copy shares with its source
  // once) is above zero, within the memory, and below the pages the trajectories hold, counted
  // in each.
  const double used = value("lragent:kv_memory_used_bytes"), size = value("lragent:kv_memory_bytes");
  EXPECT_GT(used, 0);
  EXPECT_LE(used, size);
  EXPECT_GT(size, 0);
}

// A request's choices (n > 1) run at once, each on its own trajectory (a copy of the first's once
// it has computed the prompt, the same agent reading its entries), batched into the same passes,
// and each is what a request of its own with that choice's seed gives.
TEST_F(ServerTest, ChoicesOfOneRequestRunAtOnceEachAsARequestOfItsOwn) {
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    start(mode);
    httplib::Client c("127.0.0.1", port_);
    auto value = [&](const std::string& series) {
      auto m = c.Get("/metrics");
      return m ? metric_value(m->body, series) : -1.0;
    };
    json body = {{"model", "plan"},   {"prompt", "Once upon a time, there was a little dog"},
                 {"max_tokens", 40},  {"temperature", 0.9},
                 {"seed", 11},        {"n", 3},
                 {"ignore_eos", true}};
    const double passes0 = value("lragent:engine_passes_total");
    const double served0 = value("lragent:engine_pass_sequences_total");
    auto [st, many] = complete(body);
    ASSERT_EQ(st, 200) << many.dump();
    ASSERT_EQ(many["choices"].size(), 3u);
    const double passes = value("lragent:engine_passes_total") - passes0;
    const double served = value("lragent:engine_pass_sequences_total") - served0;
    EXPECT_EQ(served, 120);                  // 3 choices x 40 tokens, a pass per token each
    EXPECT_LT(passes, 60) << "the choices did not share passes";
    EXPECT_EQ(value("lragent:trajectories_copied_total"), 2);
    std::set<int64_t> trajectories;
    for (const json& ch : many["lragent"]["choices"]) trajectories.insert(ch["trajectory"].get<int64_t>());
    EXPECT_EQ(trajectories.size(), 3u);
    for (int j = 0; j < 3; ++j) {
      json one = body;
      one["n"] = 1;
      one["seed"] = 11 + j;
      auto [st1, alone] = complete(one);
      ASSERT_EQ(st1, 200);
      EXPECT_EQ(many["choices"][j]["index"], j);
      EXPECT_EQ(many["choices"][j]["text"], alone["choices"][0]["text"]) << j;
    }
    stop();
  }
}

// A server destroyed with a request running and one waiting for its trajectory ends both with an
// error, and nothing is used after it is gone (the sanitizer build checks).
TEST_F(ServerTest, StoppingWithRequestsInFlightEndsThemWithAnError) {
  ServerOptions o;
  o.pool.max_sessions = 1;  // the second request cannot run on a copy: it waits
  start(ShareMode::kBaseLr, o);
  Server* s = server_.get();
  auto request = [](const char* model) {
    CompletionRequest r;
    r.model = model;
    PromptInput p;
    p.text = "Once upon a time";
    r.prompts = {p};
    r.max_tokens = 400;
    r.ignore_eos = true;
    return r;
  };
  std::atomic<int> pieces{0};
  std::optional<Error> running, waiting;
  std::thread a([&] {
    auto r = s->complete(request("plan"), [&](const CompletionDelta&) {
      ++pieces;
      return true;
    });
    if (!r.ok()) running = r.error();
  });
  while (pieces.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread b([&] {
    auto r = s->complete(request("action"));  // the same prompt: waits for the first's trajectory
    if (!r.ok()) waiting = r.error();
  });
  // Stopped once the second is inside the server (waiting: the first holds its trajectory).
  httplib::Client c("127.0.0.1", port_);
  for (int i = 0; i < 5000; ++i) {
    auto m = c.Get("/metrics");
    if (m && m->body.find("\nlragent:num_requests_waiting 1\n") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The first one's trajectory is the one running.
  auto sessions = c.Get("/lragent/sessions");
  ASSERT_TRUE(sessions);
  int running_sessions = 0;
  const json listed = json::parse(sessions->body);
  for (const json& t : listed["sessions"]) running_sessions += t["running"].get<bool>() ? 1 : 0;
  EXPECT_EQ(running_sessions, 1) << sessions->body;
  stop();
  a.join();
  b.join();
  ASSERT_TRUE(running.has_value()) << "the 400-token request finished before the server stopped";
  EXPECT_NE(running->message.find("shutting down"), std::string::npos) << running->message;
  ASSERT_TRUE(waiting.has_value());
  EXPECT_NE(waiting->message.find("shutting down"), std::string::npos) << waiting->message;
}

// One server per port: a second one fails to bind (no SO_REUSEPORT sharing of connections),
// and idle keep-alive connections do not starve other clients of connection threads.
TEST_F(ServerTest, OneServerPerPortAndIdleConnectionsDoNotStarveOthers) {
  start(ShareMode::kBase);
  auto second = Server::create(*model_, tok_.get(), &reg_, ServerOptions{});
  ASSERT_TRUE(second.ok());
  auto bound = (*second)->bind("127.0.0.1", port_);
  EXPECT_FALSE(bound.ok());
  if (!bound.ok()) EXPECT_NE(bound.error().message.find("cannot listen"), std::string::npos);

  std::vector<int> idle;
  for (int i = 0; i < 24; ++i) {  // three times httplib's default thread count on 2 cores
    if (const int fd = connect_with_timeout(port_); fd >= 0) idle.push_back(fd);
  }
  EXPECT_EQ(idle.size(), 24u);
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(4, 0);  // starved, it would wait for the idle connections' 5 s read timeout
  auto r = c.Get("/health");
  EXPECT_TRUE(r && r->status == 200);
  for (int fd : idle) ::close(fd);
}

// A burst of clients connecting at once is queued by the kernel until the accept loop takes
// them. httplib listens with a backlog of 5 (compiled into Debian's libcpp-httplib): past it the
// kernel drops handshakes, and with SYN cookies some clients of a burst of 64 read "connection
// reset by peer". Bound but not serving yet (nothing accepts), every one of 64 connects at once
// must still complete its handshake, and each is answered once the server serves.
TEST_F(ServerTest, ABurstOfClientsIsQueuedNotDropped) {
  auto s = Server::create(*model_, tok_.get(), &reg_, ServerOptions{});
  ASSERT_TRUE(s.ok()) << s.error().message;
  server_ = std::move(*s);
  auto port = server_->bind("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message;
  port_ = *port;
  constexpr int kClients = 64;
  std::vector<int> fds;
  const sockaddr_in addr = loopback(port_);
  for (int i = 0; i < kClients; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    ASSERT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
  }
  // Established: writable with no error. A dropped handshake stays in progress (its SYN is
  // retransmitted after 1 s, then 3 s, ...).
  auto established = [&](int fd) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 500) != 1) return false;
    int err = 0;
    socklen_t len = sizeof(err);
    return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
  };
  int connected = 0;
  for (int fd : fds) connected += established(fd) ? 1 : 0;
  EXPECT_EQ(connected, kClients) << "the listen backlog drops a burst of clients";
  thread_ = std::thread([this] { (void)server_->serve(); });
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  int answered = 0;
  for (int fd : fds) {
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[64] = {};
    if (::send(fd, get.data(), get.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(get.size()) &&
        ::recv(fd, buf, sizeof(buf) - 1, 0) > 0 && std::string(buf).find(" 200 ") != std::string::npos)
      ++answered;
    ::close(fd);
  }
  EXPECT_EQ(answered, kClients);
}

}  // namespace
}  // namespace lragent::server
