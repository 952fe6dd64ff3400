// `lragent serve` in a bounded KV memory: requests capped by it, preempted when it runs out (and
// each still gets what it gets alone), resumed on the trajectory they extended, a client gone
// while preempted, stall reports, and a planned memory bounding the passes.
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

// A KV memory smaller than the context caps max_model_len at what one trajectory holds (as vLLM
// caps it to its cache): a longer request is refused up front (400), and one of exactly that
// length runs to its end instead of running out of room there.
TEST_F(ServerTest, AKvMemorySmallerThanTheContextCapsTheRequests) {
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    ServerOptions o;
    o.pool.replay.sharing.arena_bytes = 64 << 10;  // a couple of hundred tokens of this model's caches
    start(mode, o);
    const int64_t cap = server_->max_model_len();
    EXPECT_GT(cap, 16);
    EXPECT_LT(cap, 512);
    httplib::Client c("127.0.0.1", port_);
    EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"][1]["max_model_len"], cap);
    const int64_t prompt = static_cast<int64_t>(tok_->encode("Once upon a time", true)->size());
    auto [too_long, j] = complete({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", cap - prompt + 1},
                                   {"ignore_eos", true}, {"temperature", 0}});
    EXPECT_EQ(too_long, 400) << j.dump();
    EXPECT_NE(j["error"]["message"].get<std::string>().find("maximum context length is " + std::to_string(cap)),
              std::string::npos) << j.dump();
    // Every agent in turn, each reading the others' trajectory, to the very end.
    for (const char* model : {"plan", "action", "tiny"}) {
      auto [status, full] = complete({{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", cap - prompt},
                                      {"ignore_eos", true}, {"temperature", 0}});
      EXPECT_EQ(status, 200) << model << ": " << full.dump();
      EXPECT_EQ(full["usage"]["completion_tokens"], cap - prompt) << model;
    }
    stop();
  }
}

// A KV memory (--kv-cache-memory) smaller than --max-sessions trajectories at their caps: the
// requests run at once on what they hold, and when it fills the request that came last is
// preempted (its trajectory dropped) and resumes by recomputing its prompt and tokens once there
// is room. Each request still gets what it gets alone: greedy, seeded sampling (the resumed
// sampler skips the draws it made), logprobs, penalties, a streamed text without repeats.
TEST_F(ServerTest, AKvMemoryTooSmallForEveryRequestPreemptsAndEachGetsWhatItGetsAlone) {
  const std::vector<json> bodies = {
      {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 300}, {"ignore_eos", true}, {"temperature", 0}},
      {{"model", "action"}, {"prompt", "The little dog ran"}, {"max_tokens", 300}, {"ignore_eos", true},
       {"temperature", 0.8}, {"seed", 5}},
      {{"model", "reflect"}, {"prompt", "Lily and Ben went to the park. They"}, {"max_tokens", 300},
       {"ignore_eos", true}, {"temperature", 0}, {"logprobs", 2}},
      {{"model", "tiny"}, {"prompt", "A big red ball"}, {"max_tokens", 300}, {"ignore_eos", true}, {"temperature", 0}},
      {{"model", "plan"}, {"prompt", "Tom had a toy car."}, {"max_tokens", 300}, {"ignore_eos", true},
       {"temperature", 0}, {"presence_penalty", 0.5}},
      {{"model", "action"}, {"prompt", "The sun was hot and"}, {"max_tokens", 300}, {"ignore_eos", true},
       {"temperature", 1.0}, {"seed", 9}},
      {{"model", "reflect"}, {"prompt", "Sam found a shell"}, {"max_tokens", 300}, {"ignore_eos", true},
       {"temperature", 0.7}, {"seed", 3}, {"n", 2}},  // two choices, the second on a copy of the first's trajectory
  };
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    ServerOptions o;
    o.pool.max_sessions = 8;
    start(mode, o);
    std::vector<std::vector<CompletionChoice>> alone;
    for (const json& b : bodies) {
      auto r = server_->complete(request(b));
      ASSERT_TRUE(r.ok()) << r.error().message;
      alone.push_back(*r);
    }
    // One trajectory at its cap (512 tokens) is an eighth of the memory reserved for 8, and one
    // agent's caches all of it in base-lr, a quarter in none (four agents' private caches); a
    // request here ends at ~310 tokens. 1.5 agents' caps hold ~2.5 of the 8 choices.
    const double per = agent_cap_bytes(mode);
    stop();
    o.pool.pool_bytes = static_cast<int64_t>(1.5 * per);
    start(mode, o);
    EXPECT_EQ(server_->max_model_len(), 512);  // one request alone fits its cap
    std::vector<std::optional<std::vector<CompletionChoice>>> got(bodies.size());
    std::string streamed;
    std::vector<std::thread> threads;
    std::latch ready(static_cast<std::ptrdiff_t>(bodies.size()));  // sent together
    for (size_t i = 0; i < bodies.size(); ++i)
      threads.emplace_back([&, i] {
        ready.arrive_and_wait();
        DeltaFn on_delta;
        if (i == 1)
          on_delta = [&streamed](const CompletionDelta& d) {
            streamed += d.text;
            return true;
          };
        auto r = server_->complete(request(bodies[i]), on_delta);
        EXPECT_TRUE(r.ok()) << r.error().message;
        if (r.ok()) got[i] = *r;
      });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < bodies.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_TRUE(got[i]);
      ASSERT_EQ(got[i]->size(), alone[i].size());
      for (size_t k = 0; k < alone[i].size(); ++k) {
        const CompletionChoice &g = (*got[i])[k], &a = alone[i][k];
        EXPECT_EQ(g.token_ids, a.token_ids);
        EXPECT_EQ(g.text, a.text);
        EXPECT_EQ(g.finish_reason, "length");
        EXPECT_EQ(g.completion_tokens, 300);
        ASSERT_EQ(g.logprobs.size(), a.logprobs.size());
        for (size_t l = 0; l < a.logprobs.size(); ++l) EXPECT_NEAR(g.logprobs[l].logprob, a.logprobs[l].logprob, 1e-4);
      }
    }
    EXPECT_NE(alone[6][0].token_ids, alone[6][1].token_ids);
    EXPECT_EQ(streamed, alone[1][0].text);
    EXPECT_EQ(alone[2][0].logprobs.size(), 300u);
    httplib::Client c2("127.0.0.1", port_);
    auto m = c2.Get("/metrics");
    ASSERT_TRUE(m);
    auto value = [&](const std::string& series) { return metric_value(m->body, series); };
    const double preempted = value("lragent:num_preemptions_total");
    EXPECT_GT(preempted, 0) << "the KV memory never filled: the test shows nothing";
    EXPECT_LE(value("lragent:kv_memory_bytes"), 1.5 * per);
    EXPECT_EQ(json::parse(c2.Get("/lragent/sessions")->body)["preempted_requests"].get<double>(), preempted);
    // A preempted request computed its tokens again: more prefilled than its prompt.
    double prefilled = 0, prompts = 0;
    for (const auto& g : got)
      for (const CompletionChoice& c : *g) {
        prefilled += static_cast<double>(c.prefilled_tokens);
        prompts += static_cast<double>(c.prompt_tokens - c.reused_tokens);
      }
    EXPECT_GT(prefilled, prompts);
    // Too small for one request at its cap: --max-model-len is what one holds alone.
    stop();
    o.pool.pool_bytes = static_cast<int64_t>(0.4 * per);
    start(mode, o);
    EXPECT_LT(server_->max_model_len(), 512);
    EXPECT_GT(server_->max_model_len(), 16);
    stop();
  }
}

// An agent extending another agent's kept trajectory alone in a KV memory that holds its own
// caches but not theirs too (none: every agent computes its own; the request fits alone, as
// --max-model-len promises): the trajectory's other caches give their memory back, and the
// request answers as on a server with memory to spare, not with "does not fit".
TEST_F(ServerTest, ARequestAloneInAKvMemoryFullOfItsTrajectorysOtherCachesRunsOnAFreshOne) {
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr}) {
    SCOPED_TRACE(share_mode_name(mode));
    ServerOptions o;
    o.pool.max_sessions = 8;
    start(mode, o);
    const double per = agent_cap_bytes(mode);
    // The plan's turn, then the action's over its whole trajectory (as a workflow's next agent).
    const json first = {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 380}, {"ignore_eos", true},
                        {"temperature", 0}};
    auto plan_alone = server_->complete(request(first));
    ASSERT_TRUE(plan_alone.ok()) << plan_alone.error().message;
    std::vector<int32_t> ids = *tok_->encode("Once upon a time", true);
    ids.insert(ids.end(), (*plan_alone)[0].token_ids.begin(), (*plan_alone)[0].token_ids.end());
    const json second = {{"model", "action"}, {"prompt", ids}, {"max_tokens", 100}, {"ignore_eos", true},
                         {"temperature", 0}, {"logprobs", 1}};
    auto action_alone = server_->complete(request(second));
    ASSERT_TRUE(action_alone.ok()) << action_alone.error().message;
    stop();
    // ~1.5 of one agent's caps: the plan's 385 tokens (0.75) and the action's 485 (0.95) do not fit together.
    o.pool.pool_bytes = static_cast<int64_t>(1.5 * per);
    start(mode, o);
    EXPECT_EQ(server_->max_model_len(), 512);
    auto plan = server_->complete(request(first));
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_EQ((*plan)[0].token_ids, (*plan_alone)[0].token_ids);
    auto action = server_->complete(request(second));
    ASSERT_TRUE(action.ok()) << action.error().message;
    EXPECT_EQ((*action)[0].token_ids, (*action_alone)[0].token_ids);
    ASSERT_EQ((*action)[0].logprobs.size(), 100u);
    for (size_t l = 0; l < 100; ++l)
      EXPECT_NEAR((*action)[0].logprobs[l].logprob, (*action_alone)[0].logprobs[l].logprob, 1e-4);
    // In none the action ran short beside the plan's caches and started again without them (a
    // preemption, its prompt computed twice); base-lr's action reads the plan's caches.
    auto m = httplib::Client("127.0.0.1", port_).Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric_value(m->body, "lragent:num_preemptions_total"), mode == ShareMode::kNone ? 1 : 0);
    if (mode == ShareMode::kNone) EXPECT_GT((*action)[0].prefilled_tokens, (*action)[0].prompt_tokens);
    // And the plan again, on whatever the memory kept: still what it gets alone.
    auto again = server_->complete(request(first));
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ((*again)[0].token_ids, (*plan_alone)[0].token_ids);
    stop();
  }
}

// The stall warning counts only time with requests admitted: a request that comes to an engine
// idle for longer than the warning's threshold, and whose first pass runs short of KV memory
// (the memory full of an idle trajectory, dropped for it), is no stall. The engine's idle wait
// once counted, and the GPU stress runs reported such requests as stalled.
TEST_F(ServerTest, AnIdleEngineIsNoStall) {
  ServerOptions o;
  o.pool.max_sessions = 8;
  start(ShareMode::kNone, o);
  const double per = agent_cap_bytes(ShareMode::kNone);
  stop();
  std::mutex mu;
  std::vector<std::string> warnings;
  o.warn = [&](const std::string& w) {
    std::lock_guard<std::mutex> lock(mu);
    warnings.push_back(w);
  };
  o.stall_warning = std::chrono::milliseconds(300);
  o.pool.pool_bytes = static_cast<int64_t>(per);  // one agent's caps
  start(ShareMode::kNone, o);
  // 385 tokens kept idle: three quarters of the memory.
  auto first = server_->complete(request({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 380},
                                          {"ignore_eos", true}, {"temperature", 0}}));
  ASSERT_TRUE(first.ok()) << first.error().message;
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  // ~300 prompt tokens of another conversation: its first pass does not fit beside them.
  std::string other;
  for (int i = 0; i < 27; ++i) other += "The sun was hot and the sky was blue. ";
  auto second = server_->complete(
      request({{"model", "action"}, {"prompt", other}, {"max_tokens", 8}, {"ignore_eos", true}, {"temperature", 0}}));
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_GE(metric("lragent:trajectories_evicted_total"), 1);  // it ran short and made room
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
}

// A streaming client that goes away while its request is preempted (waiting to resume by
// recompute) is noticed before it resumes (Server::kAlivePoll, then abort_preempted): the request
// ends "abort" with the tokens it had, it never computes its prompt again, and the request it
// made room for answers as alone. The window is the running request's remaining ~300 tokens
// (~80 ms in the release build here, several times that with sanitizers; the server notices
// within a poll of 20 ms).
TEST_F(ServerTest, AStreamingClientGoneWhileItsRequestIsPreemptedIsNotResumed) {
  const json holder_body = {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 480},
                            {"ignore_eos", true}, {"temperature", 0}};
  std::string long_prompt;  // ~300 tokens: its catch-up brings the preemption soon after it starts
  for (int i = 0; i < 27; ++i) long_prompt += "The sun was hot and the sky was blue. ";
  ServerOptions o;
  o.pool.max_sessions = 8;
  start(ShareMode::kBaseLr, o);
  auto holder_alone = complete(holder_body);
  ASSERT_EQ(holder_alone.first, 200) << holder_alone.second.dump();
  const double per = agent_cap_bytes(ShareMode::kBaseLr);
  const int64_t streamed_prompt = static_cast<int64_t>(tok_->encode(long_prompt, true)->size());
  ASSERT_GT(streamed_prompt, 240);
  stop();
  o.pool.pool_bytes = static_cast<int64_t>(1.0 * per);  // one agent's cap: the two do not fit at once
  start(ShareMode::kBaseLr, o);
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> holder_done{false};
  Clock::time_point holder_end;
  std::pair<int, json> holder;
  std::thread holder_thread([&] {
    holder = complete(holder_body);
    holder_end = Clock::now();
    holder_done.store(true);
  });
  ASSERT_TRUE(wait_for("lragent:num_requests_running", 1, /*at_least=*/true)) << "the holder did not start";
  const std::string body = json{{"model", "action"}, {"prompt", long_prompt}, {"max_tokens", 150},
                                {"ignore_eos", true}, {"temperature", 0}, {"stream", true}}.dump();
  const int fd = connect_with_timeout(port_);
  ASSERT_GE(fd, 0);
  const std::string http = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  const bool preempted = wait_for("lragent:num_preemptions_total", 1, /*at_least=*/true);
  const bool holder_ran_on = !holder_done.load();
  ::close(fd);
  const Clock::time_point closed = Clock::now();
  holder_thread.join();
  ASSERT_TRUE(preempted) << "the KV memory never filled: the test shows nothing";
  ASSERT_EQ(holder.first, 200) << holder.second.dump();
  EXPECT_EQ(holder.second["choices"][0]["text"], holder_alone.second["choices"][0]["text"]);
  EXPECT_TRUE(wait_for("lragent:num_requests_running", 0)) << "the preempted request did not end";
  const double prefilled = metric("lragent:prefill_tokens_total{model_name=\"action\"}");
  const double aborted = metric("lragent:request_success_total{model_name=\"action\",finished_reason=\"abort\"}");
  if (prefilled > static_cast<double>(streamed_prompt)) {
    // It resumed (its prompt computed again) before the server saw the client gone: within a few
    // polls of the close that says nothing (a machine too fast for the test's timing, or threads
    // kept waiting on a loaded one). The release build here leaves ~80 ms, so it tells only a
    // broken server from a slow one in the sanitizer build, whose window is several times longer.
    const double after = std::chrono::duration<double>(holder_end - closed).count();
    if (!holder_ran_on || after < 5 * std::chrono::duration<double>(Server::kAlivePoll).count())
      GTEST_SKIP() << "the holder ended " << after << " s after the client left: too soon to tell";
    FAIL() << "the preempted request resumed " << after << " s after its client left";
  }
  EXPECT_EQ(aborted, 1) << "the preempted request did not end as aborted";
  EXPECT_GT(metric("lragent:generation_tokens_total{model_name=\"action\"}"), 0);
  // The server serves on, with the whole KV memory.
  auto [status, j] = complete(holder_body);
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], holder_alone.second["choices"][0]["text"]);
}

// A request preempted while it extends another agent's kept trajectory gives back only what it
// added (the trajectory is cut back to what it held before it, SessionPool::cut_and_release):
// it resumes on the other agent's entries, computing only its own tokens again, and answers as it
// does alone on them (in base-lr it reads entries the plan computed; recomputing those with its
// own adapter could change its tokens).
TEST_F(ServerTest, APreemptedRequestKeepsTheTrajectoryItExtendedAndResumesOnIt) {
  const json plan_body = {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 250},
                          {"ignore_eos", true}, {"temperature", 0}};
  const json other_body = {{"model", "reflect"}, {"prompt", "The little dog ran"}, {"max_tokens", 300},
                           {"ignore_eos", true}, {"temperature", 0}};
  ServerOptions o;
  o.pool.max_sessions = 8;
  start(ShareMode::kBaseLr, o);
  auto plan_alone = server_->complete(request(plan_body));
  ASSERT_TRUE(plan_alone.ok()) << plan_alone.error().message;
  std::vector<int32_t> trajectory = *tok_->encode("Once upon a time", true);
  trajectory.insert(trajectory.end(), (*plan_alone)[0].token_ids.begin(), (*plan_alone)[0].token_ids.end());
  const json action_body = {{"model", "action"}, {"prompt", trajectory}, {"max_tokens", 200}, {"ignore_eos", true},
                            {"temperature", 0}};
  auto action_alone = server_->complete(request(action_body));  // on the plan's trajectory
  ASSERT_TRUE(action_alone.ok()) << action_alone.error().message;
  auto other_alone = server_->complete(request(other_body));
  ASSERT_TRUE(other_alone.ok()) << other_alone.error().message;
  const double per = agent_cap_bytes(ShareMode::kBaseLr);
  stop();
  // 1.2 trajectories at their caps (~614 tokens): the plan's 255 tokens extended by the action's
  // 200 and the other request's 305 do not fit; the plan's and the other's do.
  o.pool.pool_bytes = static_cast<int64_t>(1.2 * per);
  start(ShareMode::kBaseLr, o);
  auto plan = server_->complete(request(plan_body));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  ASSERT_EQ((*plan)[0].token_ids, (*plan_alone)[0].token_ids);
  std::optional<std::vector<CompletionChoice>> other, action;
  std::thread first([&] {  // running before the action arrives: the action is the one preempted
    auto r = server_->complete(request(other_body));
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (r.ok()) other = *r;
  });
  for (int i = 0; i < 2000 && metric("lragent:num_requests_running") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto r = server_->complete(request(action_body));
  first.join();
  ASSERT_TRUE(r.ok()) << r.error().message;
  action = *r;
  ASSERT_TRUE(other);
  ASSERT_GE(metric("lragent:num_preemptions_total"), 1) << "the KV memory never filled: the test shows nothing";
  EXPECT_EQ((*other)[0].token_ids, (*other_alone)[0].token_ids);
  EXPECT_EQ((*action)[0].token_ids, (*action_alone)[0].token_ids);
  // It computed its prompt's last token and its own tokens (twice, at most 201), never the plan's 255.
  const auto& a = (*action)[0];
  EXPECT_EQ(a.reused_tokens, static_cast<int64_t>(trajectory.size()) - 1);
  EXPECT_GT(a.prefilled_tokens, 1) << "it was not the one preempted";
  EXPECT_LT(a.prefilled_tokens, static_cast<int64_t>(trajectory.size())) << "it computed the plan's tokens again";
}

// The KV memory's plan bounds every pass (a long prompt alone runs in chunks): the profiled
// pass's tokens, plus what the planned memory the KV memory left unused holds at that pass's
// bytes a token; an explicit bound wins. A prompt longer than the bound answers as without it.
TEST_F(ServerTest, APlannedMemoryBoundsThePassesByWhatItLeft) {
  const json body = {{"model", "plan"}, {"prompt", "Once upon a time, there was a little girl named Lily. She loved"},
                     {"max_tokens", 20}, {"temperature", 0}, {"ignore_eos", true}};
  start(ShareMode::kBaseLr);
  EXPECT_EQ(server_->max_pass_tokens(), 0);
  auto [status, unbounded] = complete(body);
  ASSERT_EQ(status, 200) << unbounded.dump();
  const int64_t kv = server_->kv_memory_bytes();
  ASSERT_GT(kv, 0);
  stop();
  ServerOptions o;
  KvMemoryPlan plan;
  plan.pass_tokens = 7;
  plan.pass_peak = 700;
  plan.kv_bytes = kv;  // the KV memory took all it was planned: the profiled size
  o.memory_plan = plan;
  start(ShareMode::kBaseLr, o);
  EXPECT_EQ(server_->max_pass_tokens(), 7);
  auto [status7, chunked] = complete(body);
  ASSERT_EQ(status7, 200) << chunked.dump();
  EXPECT_EQ(chunked["choices"][0]["text"], unbounded["choices"][0]["text"]);
  EXPECT_EQ(chunked["usage"], unbounded["usage"]);
  stop();
  plan.kv_bytes = kv + 3500;  // 3500 bytes unused: 35 more tokens at 100 bytes a token
  o.memory_plan = plan;
  start(ShareMode::kBaseLr, o);
  EXPECT_EQ(server_->max_pass_tokens(), 42);
  stop();
  o.max_pass_tokens = 5;
  start(ShareMode::kBaseLr, o);
  EXPECT_EQ(server_->max_pass_tokens(), 5);
}

}  // namespace
}  // namespace lragent::server
