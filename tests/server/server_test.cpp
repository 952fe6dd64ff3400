// `lragent serve` over HTTP on tinystories-656k with the plan/action/reflect adapters: a
// greedy completion is `generate`'s, agents whose prompts extend one trajectory share it,
// streaming gives the non-streamed text, bad requests get OpenAI error bodies while the
// server keeps serving, and concurrent clients get what they would get one at a time.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

#include "engine/generator.h"
#include "server/server.h"
#include "server/http_fixture.h"
#include "test_util.h"
#include "tiny_agents.h"

namespace lragent::server {
namespace {

using nlohmann::json;

// The server's address on this machine, for tests that speak raw TCP to it.
sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A socket connected to the server, whose reads and writes give up after 10 s (so a stalled
// exchange fails the test within seconds instead of at ctest's timeout); -1 when it cannot connect.
int connect_with_timeout(int port) {
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
double metric_value(const std::string& text, const std::string& series) {
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

// A server-sent-event body's events, parsed, up to "data: [DONE]" (*done says whether it came).
std::vector<json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<json> events;
  if (done) *done = false;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      if (done) *done = true;
      break;
    }
    events.push_back(json::parse(data));
  }
  return events;
}

// The text of a stream: its deltas per choice, finish reasons, and the usage chunk.
struct Streamed {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  std::map<int, json> logprobs;  // the events' completions logprobs, their lists joined
  json usage;
  bool done = false;
};
Streamed parse_sse(const std::string& body) {
  Streamed s;
  for (const json& j : sse_events(body, &s.done)) {
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
  expect(400, complete({{"prompt", "x"}, {"logprobs", 1}, {"echo", true}, {"stream", true}}), "not streamed");
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
  EXPECT_EQ(c.Get("/health")->status, 200);  // health needs no key
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
