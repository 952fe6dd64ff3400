// `lragent serve` over HTTP on tinystories-656k with the plan/action/reflect adapters: a
// greedy completion is `generate`'s, agents whose prompts extend one trajectory share it,
// streaming gives the non-streamed text, log-probabilities and sampling controls are vLLM's,
// /tokenize and /metrics, chat completions. HTTP edge cases and clients: server_http_test.cpp;
// KV memory and preemption: server_memory_test.cpp.
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

TEST_F(ServerTest, ModelsListTheBaseModelAndEveryAdapter) {
  start(ShareMode::kBaseLr);
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 4u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_TRUE(j["data"][0]["parent"].is_null());
  EXPECT_EQ(j["data"][1]["id"], "plan");
  EXPECT_EQ(j["data"][1]["parent"], "tiny");
  EXPECT_EQ(j["data"][3]["max_model_len"], 512);
}

// vLLM's --served-model-name A B: a request may name the base model by any of its names, the
// answer names the first; /v1/models lists each; no adapter may take one of them.
TEST_F(ServerTest, TheBaseModelAnswersToEachOfItsServedNames) {
  ServerOptions o;
  o.base_aliases = {"tiny-alias", "llama"};
  start(ShareMode::kBaseLr, o);
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  for (const char* name : {"tiny", "tiny-alias", "llama"}) {
    auto [status, j] = complete({{"model", name}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}});
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["model"], "tiny") << name;
    EXPECT_EQ(j["choices"][0]["text"], generate_text(prompt, "", 8)) << name;
  }
  httplib::Client c("127.0.0.1", port_);
  const json models = json::parse(c.Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 6u) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][1]["id"], "tiny-alias");
  EXPECT_EQ(models["data"][2]["id"], "llama");
  EXPECT_TRUE(models["data"][2]["parent"].is_null());
  EXPECT_EQ(models["data"][3]["parent"], "tiny");
  auto [missing, err] = complete({{"model", "gpt-4"}, {"prompt", prompt}, {"max_tokens", 2}});
  EXPECT_EQ(missing, 404);
  EXPECT_NE(err.dump().find("tiny, tiny-alias, llama, plan"), std::string::npos) << err.dump();
  stop();
  // An adapter under a served name of the base model is refused at startup.
  ServerOptions clash;
  clash.base_aliases = {"plan"};
  clash.base_name = "tiny";
  auto s = Server::create(*model_, tok_.get(), &reg_, clash);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("adapter 'plan' has one of the base model's served names"), std::string::npos)
      << s.error().message;
}

// Exact when the agent computes its prompt itself: a prompt no other agent has computed (any
// mode), or any prompt under none. (An agent reading another's shared entries differs slightly
// by design: that is the sharing's approximation, measured by `lragent fidelity`.)
TEST_F(ServerTest, GreedyCompletionsAreGeneratesForTheBaseModelAndEachAdapter) {
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    start(mode);
    const std::vector<std::string> prompts = {"Once upon a time, there was a little girl named Lily.",
                                              "Tom had a big red ball. He liked to play.",
                                              "The sun was hot and the grass was green."};
    for (size_t round = 0; round < 2; ++round) {
      for (size_t i = 0; i < 3; ++i) {
        const std::string model = std::vector<std::string>{"tiny", "plan", "action"}[i];
        // none: every model on every prompt; base-lr: each prompt by its first model only.
        const std::string& prompt = prompts[mode == ShareMode::kNone ? (i + round) % 3 : i];
        auto [status, j] = complete({{"model", model}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
        ASSERT_EQ(status, 200) << j.dump();
        EXPECT_EQ(j["object"], "text_completion");
        EXPECT_EQ(j["model"], model);
        EXPECT_EQ(j["choices"][0]["text"], generate_text(prompt, model == "tiny" ? "" : model, 24)) << model;
        const json& u = j["usage"];
        EXPECT_EQ(u["prompt_tokens"].get<int64_t>(), static_cast<int64_t>(tok_->encode(prompt, true)->size()));
        EXPECT_EQ(u["total_tokens"].get<int64_t>(),
                  u["prompt_tokens"].get<int64_t>() + u["completion_tokens"].get<int64_t>());
      }
    }
    stop();
  }
}

// on_idle runs on the engine thread once the requests have all ended (the CLI trims the heap
// there), not before the answer is ready, not while nothing has run.
TEST_F(ServerTest, TheIdleHookRunsOnceTheRequestsHaveEnded) {
  std::atomic<int> idle{0};
  ServerOptions o;
  o.on_idle = [&idle] { idle.fetch_add(1); };
  start(ShareMode::kBaseLr, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(idle.load(), 0) << "nothing ran yet";
  for (int round = 1; round <= 2; ++round) {
    auto [status, j] = complete({{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}});
    ASSERT_EQ(status, 200) << j.dump();
    for (int i = 0; i < 200 && idle.load() < round; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(idle.load(), round) << "one idle call per time the engine falls idle";
  }
  stop();
  EXPECT_EQ(idle.load(), 2);
}

// vLLM's cache_salt over HTTP: the same prompt under another salt is computed again on a
// trajectory of its own, and the same salt reads it back, giving the same greedy text.
TEST_F(ServerTest, ACacheSaltKeepsClientsApart) {
  start(ShareMode::kBaseLr);
  const json body = {{"model", "plan"}, {"prompt", "Question: where is the dog?\nThought 1:"}, {"max_tokens", 6},
                     {"temperature", 0}};
  auto salted = [&](const char* salt) {
    json b = body;
    b["cache_salt"] = salt;
    auto [status, j] = complete(b);
    EXPECT_EQ(status, 200) << j.dump();
    return j;
  };
  const json a = salted("a");
  const json b = salted("b");
  const json a2 = salted("a");
  const int64_t prompt = a["usage"]["prompt_tokens"];
  EXPECT_NE(b["lragent"]["choices"][0]["trajectory"], a["lragent"]["choices"][0]["trajectory"]);
  EXPECT_EQ(b["lragent"]["choices"][0]["prefilled_tokens"].get<int64_t>(), prompt);
  EXPECT_EQ(a2["lragent"]["choices"][0]["trajectory"], a["lragent"]["choices"][0]["trajectory"]);
  EXPECT_EQ(a2["lragent"]["choices"][0]["reused_tokens"].get<int64_t>(), prompt - 1);
  EXPECT_EQ(b["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_EQ(a2["choices"][0]["text"], a["choices"][0]["text"]);
  // A structured output compiled for one salt is not another's (its speed would tell).
  for (const char* salt : {"a", "b", "a"}) {
    json g = body;
    g["cache_salt"] = salt;
    g["guided_choice"] = {" Tom", " Lily"};
    auto [status, j] = complete(g);
    EXPECT_EQ(status, 200) << j.dump();
  }
  EXPECT_EQ(server_->cached_guides(), 2u);
}

TEST_F(ServerTest, AgentsWhosePromptsExtendATrajectoryShareItsCache) {
  start(ShareMode::kBaseLr);
  std::string traj = "Question: where is the dog?\nThought 1:";
  auto [s1, plan] = complete({{"model", "plan"}, {"prompt", traj}, {"max_tokens", 12}, {"temperature", 0}, {"stop", "\n"}});
  ASSERT_EQ(s1, 200) << plan.dump();
  const int64_t first_prompt = plan["usage"]["prompt_tokens"];
  EXPECT_EQ(plan["lragent"]["choices"][0]["prefilled_tokens"].get<int64_t>(), first_prompt);
  traj += plan["choices"][0]["text"].get<std::string>() + "\nAction 1:";
  auto [s2, action] = complete({{"model", "action"}, {"prompt", traj}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(s2, 200) << action.dump();
  const json& lr = action["lragent"]["choices"][0];
  EXPECT_EQ(lr["trajectory"], plan["lragent"]["choices"][0]["trajectory"]);
  EXPECT_GE(lr["reused_tokens"].get<int64_t>(), first_prompt);
  // base-lr: the action agent computes only the tokens no agent had computed.
  const int64_t prompt2 = action["usage"]["prompt_tokens"];
  EXPECT_LE(lr["prefilled_tokens"].get<int64_t>(), prompt2 - first_prompt + 1);
  // The sessions route shows one trajectory holding both agents' work.
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Get("/lragent/sessions");
  ASSERT_TRUE(r);
  json sessions = json::parse(r->body);
  EXPECT_EQ(sessions["kv_share"], "base-lr");
  bool found = false;
  for (const json& s : sessions["sessions"])
    if (s["id"] == lr["trajectory"]) {
      found = true;
      EXPECT_GT(s["computed_tokens"]["plan"].get<int64_t>(), 0);
      EXPECT_GT(s["computed_tokens"]["action"].get<int64_t>(), 0);
      EXPECT_GT(s["cache"]["lr_bytes"].get<int64_t>(), 0);
    }
  EXPECT_TRUE(found) << sessions.dump();
  // Every trajectory draws from one KV memory (copies share pages): its use is listed.
  ASSERT_TRUE(sessions["kv_memory"].is_object()) << sessions.dump();
  EXPECT_GT(sessions["kv_memory"]["used_bytes"].get<int64_t>(), 0);
  EXPECT_LE(sessions["kv_memory"]["used_bytes"].get<int64_t>(), sessions["kv_memory"]["bytes"].get<int64_t>());
}

TEST_F(ServerTest, StreamingGivesTheNonStreamedTextAndSeedsRepeat) {
  start(ShareMode::kBase);
  json req = {{"model", "reflect"}, {"prompt", "The cat sat on the mat. It was"}, {"max_tokens", 30},
              {"temperature", 0.9}, {"top_p", 0.95}, {"seed", 7}, {"n", 2}, {"stop", {"!", "."}}};
  auto [s1, plain] = complete(req);
  ASSERT_EQ(s1, 200) << plain.dump();
  ASSERT_EQ(plain["choices"].size(), 2u);
  auto [s2, again] = complete(req);
  EXPECT_EQ(again["choices"], plain["choices"]);  // the same seed: the same samples
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  Streamed st = parse_sse(r->body);
  EXPECT_TRUE(st.done);
  for (int i = 0; i < 2; ++i) {
    const json& choice = plain["choices"][static_cast<size_t>(i)];
    EXPECT_EQ(st.text[i], choice["text"].get<std::string>()) << i;
    EXPECT_EQ(st.finish[i], choice["finish_reason"].get<std::string>()) << i;
    // A stop string is never in the text.
    EXPECT_EQ(choice["text"].get<std::string>().find_first_of("!."), std::string::npos);
  }
  EXPECT_EQ(st.usage, plain["usage"]);
}

// vLLM's return_tokens_as_token_ids: the same logprobs, each token named "token_id:<id>" (the
// server's --return-tokens-as-token-ids does it for every request).
TEST_F(ServerTest, LogprobsTokensAsTokenIds) {
  start(ShareMode::kNone);
  const json req = {{"prompt", "One day, a boy named Tim"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
  auto [s1, text] = complete(req);
  ASSERT_EQ(s1, 200) << text.dump();
  json as_ids_req = req;
  as_ids_req["return_tokens_as_token_ids"] = true;
  auto [s2, ids] = complete(as_ids_req);
  ASSERT_EQ(s2, 200) << ids.dump();
  const json& a = text["choices"][0]["logprobs"];
  const json& b = ids["choices"][0]["logprobs"];
  const std::vector<int32_t> tokens = ids["lragent"]["choices"][0]["token_ids"];
  ASSERT_EQ(b["tokens"].size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(b["tokens"][i], "token_id:" + std::to_string(tokens[i]));
    EXPECT_NEAR(b["token_logprobs"][i].get<double>(), a["token_logprobs"][i].get<double>(), 1e-4);
    ASSERT_EQ(b["top_logprobs"][i].size(), a["top_logprobs"][i].size());
    for (const auto& [key, v] : b["top_logprobs"][i].items()) EXPECT_EQ(key.rfind("token_id:", 0), 0u) << key;
  }
  stop();
  ServerOptions o;
  o.return_tokens_as_token_ids = true;
  start(ShareMode::kNone, o);
  auto [s3, by_flag] = complete(req);
  ASSERT_EQ(s3, 200) << by_flag.dump();
  EXPECT_EQ(by_flag["choices"][0]["logprobs"]["tokens"], b["tokens"]);
}

// vLLM's --max-logprobs: a request asking for more log-probabilities a token than the server's
// limit (20 by default) is refused with a reason; -1 lifts the limit (the vocabulary bounds it).
TEST_F(ServerTest, MaxLogprobsBoundsWhatARequestMayAskFor) {
  start(ShareMode::kNone);
  const json req = {{"prompt", "One day, a boy named Tim"}, {"max_tokens", 2}, {"temperature", 0}};
  auto ask = [&](const char* field, int n) {
    json r = req;
    r[field] = n;
    return complete(r);
  };
  EXPECT_EQ(ask("logprobs", 20).first, 200);
  for (const char* field : {"logprobs", "prompt_logprobs"}) {
    auto [st, e] = ask(field, 21);
    EXPECT_EQ(st, 400) << e.dump();
    EXPECT_NE(e.dump().find("--max-logprobs"), std::string::npos) << e.dump();
    EXPECT_NE(e.dump().find(std::string("'") + field + "'"), std::string::npos) << e.dump();
  }
  stop();
  ServerOptions o;
  o.max_logprobs = 3;
  start(ShareMode::kNone, o);
  EXPECT_EQ(ask("logprobs", 3).first, 200);
  EXPECT_EQ(ask("logprobs", 4).first, 400);
  stop();
  o.max_logprobs = -1;
  start(ShareMode::kNone, o);
  const int vocab = tok_->vocab_size();
  json every = req;  // every token of the vocabulary, no more (named by id: texts repeat)
  every["logprobs"] = vocab + 50;
  every["return_tokens_as_token_ids"] = true;
  auto [st, all] = complete(every);
  ASSERT_EQ(st, 200) << all.dump().substr(0, 300);
  EXPECT_EQ(all["choices"][0]["logprobs"]["top_logprobs"][0].size(), static_cast<size_t>(vocab));
}

// vLLM's truncate_prompt_tokens: the prompt's last k tokens, as if the client had sent only those.
TEST_F(ServerTest, TruncatePromptTokensKeepsThePromptsLastTokens) {
  start(ShareMode::kNone);
  const std::string prompt = "Once upon a time, there was a little girl named Lily. She liked to play with her ball. "
                             "One day, a boy named Tim went to the park";
  const std::vector<int32_t> ids = *tok_->encode(prompt, true);
  const size_t k = 9;
  ASSERT_GT(ids.size(), k + 5);
  const std::vector<int32_t> last(ids.end() - static_cast<long>(k), ids.end());
  auto [s1, cut] = complete({{"prompt", prompt}, {"truncate_prompt_tokens", k}, {"max_tokens", 12}, {"temperature", 0},
                             {"echo", true}});
  ASSERT_EQ(s1, 200) << cut.dump();
  auto [s2, given] = complete({{"prompt", last}, {"max_tokens", 12}, {"temperature", 0}, {"echo", true}});
  ASSERT_EQ(s2, 200) << given.dump();
  EXPECT_EQ(cut["choices"][0]["text"], given["choices"][0]["text"]);  // the echo is what the model read
  EXPECT_EQ(cut["usage"]["prompt_tokens"], k);
  // A prompt shorter than k, and -1 (the context length), leave it whole.
  for (int t : {static_cast<int>(ids.size()) + 1, -1}) {
    auto [s, whole] = complete({{"prompt", prompt}, {"truncate_prompt_tokens", t}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(s, 200) << whole.dump();
    EXPECT_EQ(whole["usage"]["prompt_tokens"], ids.size());
  }
  auto [s3, err] = complete({{"prompt", prompt}, {"truncate_prompt_tokens", 513}});
  EXPECT_EQ(s3, 400);
  EXPECT_NE(err.dump().find("'truncate_prompt_tokens' (513) is greater than this model's maximum context length (512)"),
            std::string::npos)
      << err.dump();
}

// vLLM's include_stop_str_in_output: the same samples with the stop string they ended at; and
// stream_options.continuous_usage_stats: each chunk carries its choice's usage so far.
TEST_F(ServerTest, StopStringsInTheOutputAndContinuousUsage) {
  start(ShareMode::kBase);
  const std::string prompt = "The cat sat on the mat. It was";
  json req = {{"model", "reflect"}, {"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0.9},
              {"seed", 7},          {"n", 2},           {"stop", {"!", "."}}};
  auto [s1, plain] = complete(req);
  ASSERT_EQ(s1, 200) << plain.dump();
  req["include_stop_str_in_output"] = true;
  auto [s2, with_stop] = complete(req);
  ASSERT_EQ(s2, 200) << with_stop.dump();
  int stopped = 0;
  for (size_t i = 0; i < 2; ++i) {
    const json& a = plain["choices"][i];
    const json& b = with_stop["choices"][i];
    EXPECT_EQ(b["stop_reason"], a["stop_reason"]);
    const std::string tail = a["stop_reason"].is_string() ? a["stop_reason"].get<std::string>() : "";
    stopped += !tail.empty();
    EXPECT_EQ(b["text"].get<std::string>(), a["text"].get<std::string>() + tail) << i;
  }
  EXPECT_GT(stopped, 0) << "no choice ended at a stop string: the check above tested nothing";

  req.erase("include_stop_str_in_output");
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const int64_t prompt_tokens = static_cast<int64_t>(tok_->encode(prompt, true)->size());
  std::map<int, int64_t> last;  // per choice: completion_tokens of its latest chunk
  size_t chunks = 0;
  for (const json& j : testing::sse_events(r->body)) {
    if (j["choices"].empty()) {  // the closing usage chunk: the request's totals
      EXPECT_EQ(j["usage"], plain["usage"]);
      continue;
    }
    ASSERT_TRUE(j.contains("usage")) << j.dump();
    const int index = j["choices"][0]["index"].get<int>();
    const json& u = j["usage"];
    EXPECT_EQ(u["prompt_tokens"], prompt_tokens);
    const int64_t done = u["completion_tokens"].get<int64_t>();
    EXPECT_GE(done, last[index]) << j.dump();
    EXPECT_EQ(u["total_tokens"].get<int64_t>(), prompt_tokens + done);
    last[index] = done;
    ++chunks;
  }
  EXPECT_GT(chunks, 4u);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0] + last[1], plain["usage"]["completion_tokens"].get<int64_t>());
  // Without include_usage it does nothing, as in vLLM.
  req["stream_options"] = {{"continuous_usage_stats", true}};
  r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  for (const json& j : testing::sse_events(r->body)) EXPECT_FALSE(j.contains("usage")) << j.dump();
}

// Log-probabilities are the model's: log_softmax of its logits, checked against HF transformers
// + PEFT (the golden's logits at the prompt's end, and its top-1 minus top-2 logit margin at
// every greedy step of 64).
TEST_F(ServerTest, LogprobsAreTheModelsAsHfComputesThem) {
  start(ShareMode::kBaseLr);
  const json g = json::parse(testing::read_file(testing::fixtures_dir() + "/goldens/tinystories-qv-shared-a-r8-plan.json"));
  const json& cs = g["cases"][0];
  CompletionRequest req;
  req.model = "plan";
  PromptInput p;
  p.tokens = cs["prompt_tokens"].get<std::vector<int32_t>>();
  p.is_tokens = true;
  req.prompts = {p};
  req.max_tokens = 64;
  req.sampling.temperature = 0;
  req.ignore_eos = true;  // as the golden: EOS does not stop
  req.logprobs = 5;
  auto r = server_->complete(req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const CompletionChoice& c = (*r)[0];
  ASSERT_EQ(c.token_ids, cs["output_tokens"].get<std::vector<int32_t>>());
  ASSERT_EQ(c.logprobs.size(), c.token_ids.size());
  const std::vector<double> hf = cs["last_logits"].get<std::vector<double>>();
  double mx = hf[0], sum = 0;
  for (double x : hf) mx = std::max(mx, x);
  for (double x : hf) sum += std::exp(x - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> order(hf.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return hf[a] > hf[b]; });
  ASSERT_EQ(c.logprobs[0].top.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(c.logprobs[0].top[k].id, order[k]) << k;
    EXPECT_NEAR(c.logprobs[0].top[k].logprob, hf[static_cast<size_t>(order[k])] - lse, 2e-4) << k;
  }
  const std::vector<double> margins = cs["top2_margins"].get<std::vector<double>>();
  for (size_t i = 0; i < c.token_ids.size(); ++i) {
    const StepLogprobs& lp = c.logprobs[i];
    EXPECT_EQ(lp.top[0].id, c.token_ids[i]) << i;  // greedy takes the most likely token
    EXPECT_EQ(lp.logprob, lp.top[0].logprob) << i;
    EXPECT_NEAR(lp.top[0].logprob - lp.top[1].logprob, margins[i], 1e-3) << i;
    EXPECT_LE(lp.top[1].logprob, lp.top[0].logprob);
  }
}

// Asking for log-probabilities never changes what is generated (they come from the host
// path, the tokens otherwise from the device's picks), and they are of the raw output: the
// distribution before penalties, as vLLM's default.
TEST_F(ServerTest, LogprobsChangeNoTokenAndAreTakenBeforePenalties) {
  start(ShareMode::kBaseLr);
  auto run = [&](const std::vector<int32_t>& prompt, int max_tokens, float temperature, int logprobs, float repetition) {
    CompletionRequest req;
    req.model = "action";
    PromptInput p;
    p.tokens = prompt;
    p.is_tokens = true;
    req.prompts = {p};
    req.max_tokens = max_tokens;
    req.sampling.temperature = temperature;
    req.sampling.seed = 11;
    req.seeded = true;
    req.ignore_eos = true;
    req.logprobs = logprobs;
    req.penalties.repetition = repetition;
    auto r = server_->complete(req);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? (*r)[0] : CompletionChoice{};
  };
  const std::vector<int32_t> prompt = *tok_->encode("The cat and the dog. The cat and the dog. The cat and the", true);
  const CompletionChoice sampled = run(prompt, 24, 0.9f, -1, 1.f);
  const CompletionChoice sampled_lp = run(prompt, 24, 0.9f, 3, 1.f);
  EXPECT_EQ(sampled_lp.token_ids, sampled.token_ids);
  ASSERT_EQ(sampled_lp.logprobs.size(), sampled.token_ids.size());
  EXPECT_TRUE(run(prompt, 24, 0.9f, 3, 1.f).logprobs[5].top[0].id == sampled_lp.logprobs[5].top[0].id);
  const CompletionChoice greedy = run(prompt, 24, 0.f, -1, 1.f);
  EXPECT_EQ(run(prompt, 24, 0.f, 2, 1.f).token_ids, greedy.token_ids);

  const CompletionChoice penalized = run(prompt, 12, 0.f, 20, 1.8f);
  ASSERT_EQ(penalized.logprobs.size(), 12u);
  EXPECT_NE(std::vector<int32_t>(greedy.token_ids.begin(), greedy.token_ids.begin() + 12), penalized.token_ids)
      << "the penalty changes nothing here: the check below would not tell raw from penalized";
  // Each step's distribution is the unpenalized model's at that point: the same prefix, run
  // without penalties for one token.
  std::vector<int32_t> prefix = prompt;
  for (size_t i = 0; i < penalized.token_ids.size(); ++i) {
    const CompletionChoice raw = run(prefix, 1, 0.f, 20, 1.f);
    ASSERT_EQ(raw.logprobs.size(), 1u);
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(penalized.logprobs[i].top[k].id, raw.logprobs[0].top[k].id) << i << " " << k;
      EXPECT_NEAR(penalized.logprobs[i].top[k].logprob, raw.logprobs[0].top[k].logprob, 1e-4) << i << " " << k;
    }
    for (const TokenLogprob& t : raw.logprobs[0].top)
      if (t.id == penalized.token_ids[i]) EXPECT_NEAR(penalized.logprobs[i].logprob, t.logprob, 1e-4) << i;
    prefix.push_back(penalized.token_ids[i]);
  }
}

// vLLM's logits processors, each checked by what it must do to the greedy choice: logit_bias
// moves the pick, min_tokens keeps a stop id (and a stop string) out, min_p = 1 leaves only the
// top token (so a sampled request is greedy), min_p = 0 changes nothing.
TEST_F(ServerTest, LogitBiasAllowedIdsMinTokensAndMinPDoWhatVllmsDo) {
  start(ShareMode::kBase);
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  auto run = [&](json extra) {
    json body = {{"model", "plan"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true},
                 {"logprobs", 2}};
    body.update(extra);
    auto [status, j] = complete(body);
    EXPECT_EQ(status, 200) << j.dump();
    return j;
  };
  const json greedy = run(json::object());
  const std::vector<int32_t> g = greedy["lragent"]["choices"][0]["token_ids"];
  // The first step's runner-up (top_logprobs has the taken token and the top 2; vocabulary
  // strings as keys, so find the id by decoding).
  std::vector<int32_t> first_top;
  const json first = run({{"max_tokens", 1}, {"logprobs", 2}});
  ASSERT_EQ(g[0], first["lragent"]["choices"][0]["token_ids"][0]);
  int32_t runner_up = -1;
  for (int32_t id = 0; id < model_->config().vocab_size && runner_up < 0; ++id)
    if (id != g[0] && first["choices"][0]["logprobs"]["top_logprobs"][0].contains(tok_->decode({id})) &&
        tok_->decode({id}) != tok_->decode({g[0]}))
      runner_up = id;
  ASSERT_GE(runner_up, 0);

  const json pushed = run({{"logit_bias", {{std::to_string(g[0]), -100}}}, {"max_tokens", 1}});
  EXPECT_EQ(pushed["lragent"]["choices"][0]["token_ids"][0], runner_up);
  const json forced = run({{"logit_bias", {{std::to_string(runner_up), 100}}}, {"max_tokens", 5}});
  EXPECT_EQ(forced["lragent"]["choices"][0]["token_ids"], json(std::vector<int32_t>(5, runner_up)));
  // logprobs stay the model's: the biased token's reported log-probability is its raw one.
  EXPECT_EQ(pushed["choices"][0]["logprobs"]["top_logprobs"][0], first["choices"][0]["logprobs"]["top_logprobs"][0]);

  // The greedy first token as a stop id: it ends at once, unless min_tokens keeps it out.
  const json stopped = run({{"stop_token_ids", {g[0]}}});
  EXPECT_EQ(stopped["usage"]["completion_tokens"], 1);
  const json held = run({{"stop_token_ids", {g[0]}}, {"min_tokens", 3}});
  const std::vector<int32_t> h = held["lragent"]["choices"][0]["token_ids"];
  ASSERT_GE(h.size(), 3u);
  EXPECT_EQ(h[0], runner_up);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(h[i], g[0]) << i;
  // A stop string in the first token's text: min_tokens delays it.
  const std::string word = greedy["choices"][0]["text"].get<std::string>().substr(0, 3);
  ASSERT_EQ(word.size(), 3u);
  EXPECT_LT(run({{"stop", word}})["choices"][0]["text"].get<std::string>().size(), 3u);
  EXPECT_GE(run({{"stop", word}, {"min_tokens", 4}})["usage"]["completion_tokens"], 4);

  const json sampled_top = run({{"temperature", 1.0}, {"seed", 3}, {"min_p", 1.0}});
  EXPECT_EQ(sampled_top["lragent"]["choices"][0]["token_ids"], greedy["lragent"]["choices"][0]["token_ids"]);
  const json sampled = run({{"temperature", 1.0}, {"seed", 3}});
  EXPECT_NE(sampled["lragent"]["choices"][0]["token_ids"], greedy["lragent"]["choices"][0]["token_ids"])
      << "this seed samples the greedy tokens: min_p = 1 above would prove nothing";
  EXPECT_EQ(run({{"temperature", 1.0}, {"seed", 3}, {"min_p", 0.0}})["lragent"]["choices"][0]["token_ids"],
            sampled["lragent"]["choices"][0]["token_ids"]);

  // allowed_token_ids: the greedy pick among the runner-up and one more id is the runner-up, every
  // step only those ids (the greedy first token left out).
  const json allowed = run({{"allowed_token_ids", {runner_up, 13}}});
  for (const json& id : allowed["lragent"]["choices"][0]["token_ids"]) EXPECT_TRUE(id == runner_up || id == 13) << id;
  EXPECT_EQ(allowed["lragent"]["choices"][0]["token_ids"][0], runner_up);
  auto [bad_id, bad_id_err] = complete({{"prompt", prompt}, {"allowed_token_ids", {999999}}});
  EXPECT_EQ(bad_id, 400) << bad_id_err.dump();

  auto [bad, err] = complete({{"prompt", prompt}, {"logit_bias", {{"999999", 5}}}});
  EXPECT_EQ(bad, 400);
  EXPECT_NE(err["error"]["message"].get<std::string>().find("logit_bias"), std::string::npos);
}

// Over HTTP: the completions and chat forms, and a stream's events carry, joined, the
// non-streamed log-probabilities (offsets continued across events).
TEST_F(ServerTest, LogprobsOverHttpStreamedOrNot) {
  start(ShareMode::kBase);
  json req = {{"model", "reflect"}, {"prompt", "The cat sat on the mat. It was"}, {"max_tokens", 20}, {"temperature", 0}};
  // A stop string of 6 characters from the middle of the greedy text: the stream holds text
  // back while it could still become that string, so tokens go out before their text.
  auto [s_free, free_run] = complete(req);
  ASSERT_EQ(s_free, 200);
  const std::string free_text = free_run["choices"][0]["text"];
  ASSERT_GE(free_text.size(), 20u) << free_text;
  req["stop"] = free_text.substr(10, 6);
  req["logprobs"] = 2;
  auto [status, plain] = complete(req);
  ASSERT_EQ(status, 200) << plain.dump();
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  const json& lp = plain["choices"][0]["logprobs"];
  const std::vector<int32_t> ids = plain["lragent"]["choices"][0]["token_ids"];
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string token = tok_->decode({ids[i]});
    EXPECT_EQ(lp["tokens"][i], token);
    EXPECT_EQ(lp["text_offset"][i], offset);  // non-streamed: the token strings' running length
    offset += utf8_chars(token);
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    EXPECT_EQ(lp["top_logprobs"][i][token], lp["token_logprobs"][i]);
  }
  auto [s0, none] = complete({{"model", "reflect"}, {"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_TRUE(none["choices"][0]["logprobs"].is_null());

  req["stream"] = true;
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  // Each event's offsets start at the characters streamed before it (vLLM's previous_text_lens).
  std::string streamed;
  std::vector<std::string> tokens;
  std::vector<double> values;
  bool ahead = false;  // an event carried tokens whose text was not out yet
  size_t token_chars = 0;
  for (const json& event : sse_events(r->body)) {
    const json& choice = event["choices"][0];
    if (!choice["logprobs"].is_null()) {
      const json& l = choice["logprobs"];
      size_t expect = utf8_chars(streamed);
      for (size_t k = 0; k < l["tokens"].size(); ++k) {
        EXPECT_EQ(l["text_offset"][k], expect) << event.dump();
        expect += utf8_chars(l["tokens"][k].get<std::string>());
        tokens.push_back(l["tokens"][k]);
        values.push_back(l["token_logprobs"][k]);
        token_chars += l["tokens"][k].get<std::string>().size();
      }
    }
    streamed += choice["text"].get<std::string>();
    ahead |= token_chars > streamed.size() + 3;
  }
  EXPECT_EQ(streamed, plain["choices"][0]["text"]);
  EXPECT_TRUE(ahead) << "no event sent tokens ahead of their text: the held-back case is not exercised";
  EXPECT_EQ(json(tokens), lp["tokens"]);
  ASSERT_EQ(values.size(), ids.size());
  // The values within f32 noise (the stream's prompt is read from the cache the first request
  // left, computed in other passes).
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_NEAR(values[i], lp["token_logprobs"][i].get<double>(), 1e-4) << i;
}

// vLLM's /tokenize and /detokenize: the tokenizer's ids (BOS as asked), vocabulary strings,
// decode back to the text; errors name the cause.
TEST_F(ServerTest, TokenizeAndDetokenizeAreTheTokenizers) {
  start(ShareMode::kBaseLr);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  auto [s1, t] = post("/tokenize", json{{"model", "plan"}, {"prompt", text}}.dump());
  ASSERT_EQ(s1, 200) << t.dump();
  const std::vector<int32_t> with_bos = *tok_->encode(text, true);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), with_bos);
  EXPECT_EQ(t["count"], with_bos.size());
  EXPECT_EQ(t["max_model_len"], 512);
  EXPECT_TRUE(t["token_strs"].is_null());
  auto [s2, plain] = post("/tokenize", json{{"prompt", text}, {"add_special_tokens", false}, {"return_token_strs", true}}.dump());
  ASSERT_EQ(s2, 200) << plain.dump();
  const std::vector<int32_t> ids = *tok_->encode(text, false);
  EXPECT_EQ(plain["tokens"].get<std::vector<int32_t>>(), ids);
  ASSERT_EQ(plain["token_strs"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(plain["token_strs"][i], tok_->id_to_token(ids[i]));
  auto [s3, back] = post("/detokenize", json{{"model", "action"}, {"tokens", ids}}.dump());
  ASSERT_EQ(s3, 200) << back.dump();
  EXPECT_EQ(back["prompt"], text);

  auto expect = [](std::pair<int, json> got, int status, const std::string& words) {
    EXPECT_EQ(got.first, status) << got.second.dump();
    EXPECT_NE(got.second.dump().find(words), std::string::npos) << got.second.dump();
  };
  expect(post("/tokenize", json{{"prompt", "x"}, {"messages", json::array()}}.dump()), 400, "not both");
  expect(post("/tokenize", json{{"prompt", 5}}.dump()), 400, "'prompt'");
  expect(post("/tokenize", json{{"model", "nobody"}, {"prompt", "x"}}.dump()), 404, "nobody");
  expect(post("/tokenize", json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}.dump()), 400, "chat template");
  expect(post("/detokenize", json{{"tokens", {1, 999999}}}.dump()), 400, "outside the vocabulary");
  expect(post("/detokenize", json{{"tokens", "abc"}}.dump()), 400, "'tokens'");
  expect(post("/detokenize", "{}"), 400, "'tokens'");
  httplib::Client c("127.0.0.1", port_);
  EXPECT_EQ(c.Get("/tokenize")->status, 405);
}

// GET /metrics counts what the requests did, as their responses reported it: tokens per model,
// the prompt tokens a trajectory already held, the agent's catch-up, finish reasons, HTTP
// answers, and the KV bytes the trajectories keep.
TEST_F(ServerTest, MetricsCountWhatTheRequestsDid) {
  start(ShareMode::kBaseLr);
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  auto [s1, plan] = complete({{"model", "plan"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(s1, 200);
  // The action agent reads the plan's trajectory: its prompt extends it.
  const std::vector<int32_t> next = [&, &first = plan] {  // clang 14 captures no structured binding
    std::vector<int32_t> v = *tok_->encode(prompt, true);
    for (const json& id : first["lragent"]["choices"][0]["token_ids"]) v.push_back(id.get<int32_t>());
    return v;
  }();
  auto [s2, action] = complete({{"model", "action"}, {"prompt", next}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(s2, 200) << action.dump();
  const int64_t reused = action["lragent"]["choices"][0]["reused_tokens"];
  EXPECT_GT(reused, 0);
  auto [s3, missing] = post("/v1/nothing", "{}");
  EXPECT_EQ(s3, 404);
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/plain; version=0.0.4"), std::string::npos);
  const std::string& t = r->body;
  auto value = [&](const std::string& series) {
    const size_t at = t.find("\n" + series + " ");
    EXPECT_NE(at, std::string::npos) << series << "\n" << t;
    return at == std::string::npos ? -1.0 : std::stod(t.substr(at + series.size() + 2));
  };
  EXPECT_EQ(value("lragent:prompt_tokens_total{model_name=\"plan\"}"), plan["usage"]["prompt_tokens"].get<double>());
  EXPECT_EQ(value("lragent:generation_tokens_total{model_name=\"plan\"}"), plan["usage"]["completion_tokens"].get<double>());
  EXPECT_EQ(value("lragent:prompt_tokens_total{model_name=\"action\"}"), static_cast<double>(next.size()));
  EXPECT_EQ(value("lragent:prompt_tokens_reused_total{model_name=\"action\"}"), static_cast<double>(reused));
  // One request at a time: a pass per generated token (the prompt's pass picks the first), each serving one request.
  const double generated = plan["usage"]["completion_tokens"].get<double>() + action["usage"]["completion_tokens"].get<double>();
  EXPECT_EQ(value("lragent:engine_passes_total"), generated);
  EXPECT_EQ(value("lragent:engine_pass_sequences_total"), generated);
  EXPECT_EQ(value("lragent:iteration_tokens_total_count"), generated);
  EXPECT_EQ(value("lragent:prefill_tokens_total{model_name=\"action\"}"),
            action["lragent"]["choices"][0]["prefilled_tokens"].get<double>());
  EXPECT_EQ(value("lragent:request_success_total{model_name=\"action\",finished_reason=\"length\"}"), 1);
  EXPECT_EQ(value("lragent:time_to_first_token_seconds_count{model_name=\"plan\"}"), 1);
  EXPECT_EQ(value("lragent:http_requests_total{route=\"/v1/completions\",status=\"200\"}"), 2);
  EXPECT_EQ(value("lragent:http_requests_total{route=\"other\",status=\"404\"}"), 1);
  EXPECT_EQ(value("lragent:num_requests_running"), 0);
  EXPECT_EQ(value("lragent:trajectories"), 1);  // one trajectory shared by both agents
  EXPECT_GT(value("lragent:kv_cache_bytes{kind=\"base\"}"), 0);
  EXPECT_GT(value("lragent:kv_cache_bytes{kind=\"lr\"}"), 0);
  EXPECT_EQ(c.Post("/metrics", "", "text/plain")->status, 405);
  // The KV gauges follow a running request, not only the ended ones: a streamed request on a
  // new trajectory shows its first slab by its second token (the first comes out of the pass that
  // takes the slab, before the engine publishes it).
  const std::string used = "lragent:kv_memory_used_bytes";
  const double before = value(used);
  double seen = -1;
  CompletionRequest req = *parse_completion_request(
      json{{"model", "reflect"}, {"prompt", "The dog"}, {"max_tokens", 20}, {"ignore_eos", true}}.dump());
  size_t tokens = 0;
  auto streamed = server_->complete(req, [&](const CompletionDelta& d) {
    tokens += d.token_ids.size();
    if (seen < 0 && tokens >= 2) seen = metric_value(httplib::Client("127.0.0.1", port_).Get("/metrics")->body, used);
    return true;
  });
  ASSERT_TRUE(streamed.ok()) << streamed.error().message;
  EXPECT_GT(seen, before) << "the KV memory gauge did not move while the request ran";
}

// vLLM's rules found by review: the completion's first word keeps its space (echo shows prompt +
// completion), list prompts each count in usage, a stop id is the stop_reason, a stop string
// is matched in the shown text only (a special token's text never stops), wrong methods are 405.
TEST_F(ServerTest, CompletionDetailsFollowVllm) {
  start(ShareMode::kNone);
  const std::string prompt = "Once upon a time";
  auto [s1, plain] = complete({{"model", "plan"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(s1, 200);
  const std::string text = plain["choices"][0]["text"];
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text[0], ' ') << text;  // decoded after the prompt, not as a sequence start
  auto [s2, echo] = complete({{"model", "plan"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"echo", true}});
  EXPECT_EQ(echo["choices"][0]["text"], prompt + text);

  auto [s3, two] = complete({{"model", "plan"}, {"prompt", {prompt, prompt}}, {"max_tokens", 2}, {"temperature", 0}, {"n", 2}});
  ASSERT_EQ(s3, 200) << two.dump();
  EXPECT_EQ(two["choices"].size(), 4u);
  EXPECT_EQ(two["usage"]["prompt_tokens"].get<int64_t>(), 2 * plain["usage"]["prompt_tokens"].get<int64_t>());

  // The first greedy token as a stop id: one token, finish "stop", stop_reason that id.
  GenerateRequest g;
  g.prompt = *tok_->encode(prompt, true);
  g.max_tokens = 1;
  g.adapter = reg_.find("plan");
  Generator gen(*model_, EngineOptions{});
  const int32_t first = gen.run({g}).value()[0].output.at(0);
  auto [s4, by_id] = complete({{"model", "plan"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0},
                               {"stop_token_ids", {first}}});
  ASSERT_EQ(s4, 200) << by_id.dump();
  EXPECT_EQ(by_id["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(by_id["choices"][0]["stop_reason"], first);
  EXPECT_EQ(by_id["usage"]["completion_tokens"], 1);

  // This greedy run emits the end-of-story token (ignore_eos goes on past it); its text is not
  // shown, so a stop string of that text never matches.
  const std::string eos_text = tok_->id_to_token(model_->config().eos_token_ids.at(0));
  json story = {{"model", "plan"}, {"prompt", "Once upon a time, there was a cat"}, {"max_tokens", 200},
                {"temperature", 0}, {"ignore_eos", true}, {"skip_special_tokens", false}};
  auto [s5, shown] = complete(story);
  ASSERT_EQ(s5, 200);
  ASSERT_NE(shown["choices"][0]["text"].get<std::string>().find(eos_text), std::string::npos)
      << "the fixture no longer emits " << eos_text;
  story["skip_special_tokens"] = true;
  story["stop"] = {eos_text};
  auto [s6, skipped] = complete(story);
  EXPECT_EQ(skipped["choices"][0]["finish_reason"], "length") << skipped.dump();
  EXPECT_EQ(skipped["usage"]["completion_tokens"], 200);

  httplib::Client c("127.0.0.1", port_);
  EXPECT_EQ(c.Get("/v1/completions")->status, 405);
  EXPECT_EQ(c.Delete("/v1/chat/completions")->status, 405);
  EXPECT_EQ(c.Put("/v1/completions", "{}", "application/json")->status, 405);
  EXPECT_EQ(c.Post("/v1/models", "{}", "application/json")->status, 405);
}

// /v1/chat/completions renders the conversation with the model's template (here Llama-3's, on
// the tiny model: the plumbing, not the model's chat skill) and completes it as
// /v1/completions completes the rendered text; chat objects and streaming chunks as OpenAI's.
TEST_F(ServerTest, ChatCompletionsRenderTheTemplateAndCompleteIt) {
  const std::string cfg_path = testing::fetched_fixtures_dir() + "/llama3/tokenizer_config.json";
  if (!std::filesystem::exists(cfg_path)) GTEST_SKIP() << cfg_path << " missing: run scripts/fetch-fixtures.sh";
  auto t = ChatTemplate::from_tokenizer_config(testing::read_file(cfg_path), cfg_path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  t->bos_token = "<|start_story|>";  // the tiny model's BOS, written as text as Llama-3 writes its own
  ServerOptions o;
  o.chat_template = *t;
  start(ShareMode::kBaseLr, o);
  const json messages = json::array({{{"role", "system"}, {"content", "You plan."}},
                                     {{"role", "user"}, {"content", "Once upon a time"}}});
  auto [status, chat] = post("/v1/chat/completions", json{{"model", "plan"}, {"messages", messages},
                                                          {"max_tokens", 12}, {"temperature", 0}}.dump());
  ASSERT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  const std::string rendered = *t->render(*parse_chat_messages(messages), true);
  const std::vector<int32_t> ids = *tok_->encode(rendered, /*add_special_tokens=*/false);
  EXPECT_EQ(ids.front(), tok_->bos_id());  // the template's BOS text became the BOS token, once
  EXPECT_EQ(chat["usage"]["prompt_tokens"].get<size_t>(), ids.size());
  auto [s2, plain] = complete({{"model", "plan"}, {"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(chat["choices"][0]["message"]["content"], plain["choices"][0]["text"]);

  // Without max_tokens a chat completion may use the rest of the context.
  auto [s3, open_ended] = post("/v1/chat/completions", json{{"model", "plan"}, {"messages", messages},
                                                            {"temperature", 0}, {"ignore_eos", true}}.dump());
  ASSERT_EQ(s3, 200) << open_ended.dump();
  EXPECT_EQ(open_ended["usage"]["total_tokens"], 512);

  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/v1/chat/completions",
                  json{{"model", "plan"}, {"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(r && r->status == 200);
  std::string streamed;
  bool role_first = false, finished = false;
  size_t events = 0;
  for (const json& j : sse_events(r->body)) {
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    const json& d = j["choices"][0]["delta"];
    if (events++ == 0) role_first = d.value("role", "") == "assistant";
    if (d.contains("content")) streamed += d["content"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finished = true;
  }
  EXPECT_TRUE(role_first);
  EXPECT_TRUE(finished);
  EXPECT_EQ(streamed, chat["choices"][0]["message"]["content"]);

  // Chat's logprobs form, streamed or not; ids as the completion of the rendered text gives them.
  const json lp_req = {{"model", "plan"}, {"messages", messages}, {"max_tokens", 8}, {"temperature", 0},
                       {"logprobs", true}, {"top_logprobs", 3}};
  auto [s6, with_lp] = post("/v1/chat/completions", lp_req.dump());
  ASSERT_EQ(s6, 200) << with_lp.dump();
  const json& content = with_lp["choices"][0]["logprobs"]["content"];
  auto [s7, plain_lp] = complete({{"model", "plan"}, {"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 3}});
  ASSERT_EQ(content.size(), plain_lp["choices"][0]["logprobs"]["tokens"].size());
  for (size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(content[i]["token"], plain_lp["choices"][0]["logprobs"]["tokens"][i]);
    EXPECT_EQ(content[i]["logprob"], plain_lp["choices"][0]["logprobs"]["token_logprobs"][i]);
    EXPECT_EQ(content[i]["top_logprobs"].size(), 3u);
    EXPECT_EQ(content[i]["bytes"].size(), content[i]["token"].get<std::string>().size());
  }
  json lp_stream = lp_req;
  lp_stream["stream"] = true;
  auto rs = c.Post("/v1/chat/completions", lp_stream.dump(), "application/json");
  ASSERT_TRUE(rs && rs->status == 200);
  json joined = json::array();
  for (const json& event : sse_events(rs->body)) {
    const json& l = event["choices"][0]["logprobs"];
    if (!l.is_null())
      for (const json& e : l["content"]) joined.push_back(e);
  }
  ASSERT_EQ(joined.size(), content.size());
  for (size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(joined[i]["token"], content[i]["token"]) << i;
    EXPECT_NEAR(joined[i]["logprob"].get<double>(), content[i]["logprob"].get<double>(), 1e-4) << i;
  }

  auto [s4, bad] = post("/v1/chat/completions", json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}.dump());
  EXPECT_EQ(s4, 400);
  auto [s5, tools] = post("/v1/chat/completions", json{{"messages", messages}, {"tools", {{{"type", "function"}}}}}.dump());
  EXPECT_EQ(s5, 400);
  EXPECT_NE(tools["error"]["message"].get<std::string>().find("tools"), std::string::npos);
}

// Tools with Qwen3's template (on the tiny model: the plumbing): the definitions are in the
// prompt (/tokenize with the same messages and tools counts what usage counts), the message has
// its tool_calls list, and a request that forces a call is refused.
TEST_F(ServerTest, ChatToolsAreRenderedIntoThePrompt) {
  const std::string cfg_path = testing::fetched_fixtures_dir() + "/qwen3/tokenizer_config.json";
  if (!std::filesystem::exists(cfg_path)) GTEST_SKIP() << cfg_path << " missing: run scripts/fetch-fixtures.sh";
  auto t = ChatTemplate::from_tokenizer_config(testing::read_file(cfg_path), cfg_path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ServerOptions o;
  o.chat_template = *t;
  start(ShareMode::kBaseLr, o);
  const json messages = json::array({{{"role", "user"}, {"content", "Once upon a time"}}});
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "search"}, {"parameters", {{"type", "object"}}}}}}});
  auto [s1, with_tools] = post("/v1/chat/completions", json{{"model", "action"}, {"messages", messages}, {"tools", tools},
                                                             {"max_tokens", 4}, {"temperature", 0}}.dump());
  ASSERT_EQ(s1, 200) << with_tools.dump();
  auto [s2, count] = post("/tokenize", json{{"messages", messages}, {"tools", tools}}.dump());
  ASSERT_EQ(s2, 200) << count.dump();
  EXPECT_EQ(with_tools["usage"]["prompt_tokens"], count["count"]);
  auto [s3, bare] = post("/tokenize", json{{"messages", messages}}.dump());
  EXPECT_GT(count["count"].get<int>(), bare["count"].get<int>() + 20);  // the tool block is in the prompt
  EXPECT_TRUE(with_tools["choices"][0]["message"]["tool_calls"].is_array());
  // Streamed with tools: the content joined is the non-streamed content, the same finish.
  httplib::Client c("127.0.0.1", port_);
  auto rs = c.Post("/v1/chat/completions",
                   json{{"model", "action"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 4},
                        {"temperature", 0}, {"stream", true}}.dump(),
                   "application/json");
  ASSERT_TRUE(rs && rs->status == 200);
  std::string content, finish;
  for (const json& event : sse_events(rs->body)) {
    const json& ch = event["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content, with_tools["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, with_tools["choices"][0]["finish_reason"]);
  auto [s4, forced] = post("/v1/chat/completions", json{{"messages", messages}, {"tools", tools},
                                                        {"tool_choice", "required"}}.dump());
  // Forcing a call needs a "{", which tinystories' vocabulary cannot spell (StructuredOutputTest
  // forces calls on a model whose can).
  EXPECT_EQ(s4, 400);
  EXPECT_NE(forced["error"]["message"].get<std::string>().find("no token of the vocabulary"), std::string::npos)
      << forced.dump();
}

}  // namespace
}  // namespace lragent::server
