// Prompt log-probabilities (vLLM's prompt_logprobs, and OpenAI's echo with logprobs), checked
// against HF transformers + PEFT goldens (tests/fixtures/goldens/tinystories-*.json):
//   - each golden's prompt followed by its greedy output, given as one prompt: every output
//     token is the argmax of the row before it (rank 1 and the top entry), and the last row's
//     log-probabilities are log_softmax of the golden's last_logits;
//   - the same positions' log-probabilities as a generation reports them (logprobs of the greedy
//     output), however the prompt is chunked, for the base model and for an adapter under every
//     sharing mode;
//   - over HTTP: the forms of both APIs, a prompt another request left cached still computed
//     whole, and what is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "agents/agent_turn.h"
#include "server/http_fixture.h"
#include "server/openai_api.h"
#include "server/server.h"
#include "test_util.h"
#include "tiny_agents.h"

namespace lragent {
namespace {

using nlohmann::json;

// log_softmax of `logits` in double.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  std::vector<double> out;
  for (float v : logits) out.push_back(static_cast<double>(v) - mx - std::log(sum));
  return out;
}

class PromptLogprobsTest : public testing::TinyAgentsTest {
 protected:
  // A fresh session of the three agents under `mode`.
  std::unique_ptr<AgentSession> session(ShareMode mode) {
    ReplayOptions o;
    o.sharing.mode = mode;
    o.sharing.max_tokens = 512;
    auto s = AgentSession::create(*model_, tok_.get(), names_, ptrs_, o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  // Agent `agent` (empty: the base model is not an agent here, use "plan" etc.) over `prompt`:
  // its prompt log-probabilities (top k), the prompt computed in passes of `chunk` tokens.
  Result<StepResult> prompt_step(AgentSession& s, const std::string& agent, const std::vector<int32_t>& prompt,
                                 int n_generate, int k, int64_t chunk, int logprobs = -1) {
    s.truncate(0);
    s.append(prompt);
    AgentDecode dec;
    dec.prompt_logprobs = k;
    dec.logprobs = logprobs;
    auto turn = AgentTurn::start(s, agent, n_generate, {}, {}, dec);
    if (!turn.ok()) return turn.error();
    AgentTurn* const t[1] = {turn->get()};
    while (!(*turn)->done()) {
      const TurnStep step = step_turns(*model_, t, chunk, chunk);
      if (!step.status.front().ok()) return step.status.front().error();
    }
    return (*turn)->result();
  }
};

// The base model's goldens need a session whose agent is the base model.
TEST_F(PromptLogprobsTest, GreedyOutputsAreRankOneAndTheLastRowIsTheGoldensForBaseAndAdapter) {
  struct Case {
    std::string golden, agent;
  };
  for (const Case& c : {Case{"tinystories-base", "base"}, Case{"tinystories-qv-shared-a-r8-plan", "plan"},
                        Case{"tinystories-qv-shared-a-r8-reflect", "reflect"}}) {
    SCOPED_TRACE(c.golden);
    const json g = json::parse(testing::read_file(testing::fixtures_dir() + "/goldens/" + c.golden + ".json"));
    ReplayOptions o;
    o.sharing.mode = ShareMode::kBaseLr;
    o.sharing.max_tokens = 512;
    std::vector<std::string> names = names_;
    std::vector<const LoraAdapter*> ptrs = ptrs_;
    if (c.agent == "base") {
      names = {"base"};
      ptrs = {nullptr};
      o.sharing.mode = ShareMode::kNone;
    }
    auto s = AgentSession::create(*model_, tok_.get(), names, ptrs, o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    for (const json& cs : g["cases"]) {
      const auto prompt = cs["prompt_tokens"].get<std::vector<int32_t>>();
      const auto out = cs["output_tokens"].get<std::vector<int32_t>>();
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), out.begin(), out.end() - 1);  // the last output token is the last row's pick
      auto r = prompt_step(**s, c.agent, all, 1, 5, 1 << 20);
      ASSERT_TRUE(r.ok()) << r.error().message;
      ASSERT_EQ(r->prompt_logprobs.size(), all.size() - 1);
      EXPECT_EQ(r->output_tokens.front(), out.back());
      for (size_t i = prompt.size(); i < all.size(); ++i) {  // output token i - prompt.size()
        const StepLogprobs& lp = r->prompt_logprobs[i - 1];
        EXPECT_EQ(lp.rank, 1) << "position " << i;
        ASSERT_FALSE(lp.top.empty());
        EXPECT_EQ(lp.top.front().id, all[i]) << "position " << i;
        EXPECT_FLOAT_EQ(lp.top.front().logprob, lp.logprob);
      }
      // Every prompt token's rank is that of its log-probability among the top entries.
      for (size_t i = 0; i < r->prompt_logprobs.size(); ++i) {
        const StepLogprobs& lp = r->prompt_logprobs[i];
        ASSERT_EQ(lp.top.size(), 5u);
        EXPECT_GE(lp.rank, 1);
        EXPECT_LE(lp.logprob, 0.f);
        if (lp.rank <= 5) EXPECT_EQ(lp.top[static_cast<size_t>(lp.rank - 1)].id, all[i + 1]) << "position " << i + 1;
        else EXPECT_LT(lp.logprob, lp.top.back().logprob);
      }
      // The last prompt position's row (it picks the first output token): the golden's
      // last_logits, as a prompt token's and as a generated token's log-probabilities.
      const auto last_logits = cs["last_logits"].get<std::vector<float>>();
      const std::vector<double> ref = log_softmax(last_logits);
      const StepLogprobs want = step_logprobs(last_logits, out.front(), 5);
      auto gen = prompt_step(**s, c.agent, prompt, 1, -1, 1 << 20, /*logprobs=*/5);
      ASSERT_TRUE(gen.ok()) << gen.error().message;
      ASSERT_EQ(gen->logprobs.size(), 1u);
      for (const StepLogprobs* got : {&r->prompt_logprobs[prompt.size() - 1], &gen->logprobs[0]}) {
        EXPECT_NEAR(got->logprob, ref[static_cast<size_t>(out.front())], 1e-4);
        ASSERT_EQ(got->top.size(), 5u);
        for (size_t k = 0; k < 5; ++k) {
          EXPECT_EQ(got->top[k].id, want.top[k].id) << k;
          EXPECT_NEAR(got->top[k].logprob, want.top[k].logprob, 1e-4) << k;
        }
      }
      // The whole sequence as a prompt with nothing to generate: the last output token too.
      all.push_back(out.back());
      auto whole = prompt_step(**s, c.agent, all, 0, 5, 1 << 20);
      ASSERT_TRUE(whole.ok()) << whole.error().message;
      ASSERT_EQ(whole->prompt_logprobs.size(), all.size() - 1);
      EXPECT_TRUE(whole->output_tokens.empty());
      EXPECT_EQ(whole->prompt_logprobs.back().rank, 1);
      EXPECT_EQ(whole->prompt_logprobs.back().top.front().id, out.back());
    }
  }
}

TEST_F(PromptLogprobsTest, EqualTheGenerationsLogprobsInEveryModeAndChunking) {
  const std::vector<int32_t> prompt = *tok_->encode("Once upon a time, there was a little girl named Lily. She", true);
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kFull, ShareMode::kBase, ShareMode::kBaseLr, ShareMode::kIcarus}) {
    SCOPED_TRACE(share_mode_name(mode));
    auto s = session(mode);
    ASSERT_TRUE(s);
    // A greedy generation with its log-probabilities.
    auto gen = prompt_step(*s, "action", prompt, 12, -1, 1 << 20, /*logprobs=*/4);
    ASSERT_TRUE(gen.ok()) << gen.error().message;
    EXPECT_TRUE(gen->prompt_logprobs.empty());
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen->output_tokens.begin(), gen->output_tokens.end());
    std::vector<StepLogprobs> first;
    for (int64_t chunk : {int64_t{1} << 20, int64_t{7}, int64_t{1}}) {
      SCOPED_TRACE(chunk);
      auto r = prompt_step(*s, "action", all, 0, 4, chunk);
      ASSERT_TRUE(r.ok()) << r.error().message;
      ASSERT_EQ(r->prompt_logprobs.size(), all.size() - 1);
      EXPECT_EQ(r->prefilled_tokens, static_cast<int64_t>(all.size()));
      for (size_t i = 0; i < gen->output_tokens.size(); ++i) {
        const StepLogprobs& p = r->prompt_logprobs[prompt.size() - 1 + i];
        const StepLogprobs& q = gen->logprobs[i];
        EXPECT_NEAR(p.logprob, q.logprob, 1e-4) << "output token " << i;
        ASSERT_EQ(p.top.size(), q.top.size());
        for (size_t k = 0; k < p.top.size(); ++k) {
          EXPECT_EQ(p.top[k].id, q.top[k].id);
          EXPECT_NEAR(p.top[k].logprob, q.top[k].logprob, 1e-4);
        }
      }
      if (first.empty()) first = r->prompt_logprobs;
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_NEAR(r->prompt_logprobs[i].logprob, first[i].logprob, 1e-4);
        EXPECT_EQ(r->prompt_logprobs[i].rank, first[i].rank);
      }
    }
    // A trajectory the agent has partly computed cannot give them (the caller must start fresh).
    ASSERT_TRUE(prompt_step(*s, "action", prompt, 2, -1, 1 << 20).ok());
    AgentDecode dec;
    dec.prompt_logprobs = 1;
    s->append({42});
    auto turn = AgentTurn::start(*s, "action", 1, {}, {}, dec);
    ASSERT_FALSE(turn.ok());
    EXPECT_NE(turn.error().message.find("computes from its start"), std::string::npos) << turn.error().message;
  }
}

}  // namespace

namespace server {
namespace {

using nlohmann::json;

class PromptLogprobsHttpTest : public testing::HttpServerTest {
 protected:
  void SetUp() override {
    HttpServerTest::SetUp();
    ServerOptions o;
    o.pool.replay.sharing.mode = ShareMode::kBaseLr;
    o.max_batch_tokens = 16;  // the prompt in chunks
    o.max_pass_tokens = 16;
    start(o);
  }
};

const char* kPrompt = "Once upon a time, there was a little girl named Lily. She liked to play in the park with her";

TEST_F(PromptLogprobsHttpTest, EchoWithLogprobsAndPromptLogprobsInBothApis) {
  const std::vector<int32_t> ids = *tok_->encode(kPrompt, true);
  // A generation first leaves the prompt in a kept trajectory, read by every later request of
  // the plan agent: the prompt's log-probabilities are computed all the same.
  auto [st0, gen] = post("/v1/completions", {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", 4},
                                             {"temperature", 0}, {"logprobs", 2}});
  ASSERT_EQ(st0, 200) << gen.dump();
  // OpenAI's legacy form, as lm-evaluation-harness asks for a loglikelihood.
  auto [st, e] = post("/v1/completions", {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", 0},
                                         {"echo", true}, {"logprobs", 2}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << e.dump();
  const json& c = e["choices"][0];
  EXPECT_EQ(c["text"], kPrompt);
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(e["usage"]["completion_tokens"], 0);
  EXPECT_EQ(e["lragent"]["choices"][0]["prefilled_tokens"], static_cast<int64_t>(ids.size()));
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i], joined.size()) << i;  // ASCII prompt: characters are bytes
    joined += lp["tokens"][i].get<std::string>();
    if (i == 0) continue;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);  // the token and the 2 most likely
    EXPECT_TRUE(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>()));
  }
  // vLLM's form, on a chunked prompt (max_batch_tokens 16) with a generation after it: the same
  // values, and the generated tokens' log-probabilities those of the first request.
  auto [st2, v] = post("/v1/completions", {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", 4},
                                          {"prompt_logprobs", 3}, {"logprobs", 2}, {"temperature", 0}});
  ASSERT_EQ(st2, 200) << v.dump();
  const json& pl = v["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), ids.size());
  EXPECT_TRUE(pl[0].is_null());
  for (size_t i = 1; i < ids.size(); ++i) {
    const std::string key = std::to_string(ids[i]);
    ASSERT_TRUE(pl[i].contains(key)) << i;
    EXPECT_NEAR(pl[i][key]["logprob"].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-4) << i;
    EXPECT_GE(pl[i][key]["rank"].get<int>(), 1);
    EXPECT_EQ(pl[i][key]["decoded_token"], lp["tokens"][i]);
    EXPECT_GE(pl[i].size(), 3u);
    EXPECT_LE(pl[i].size(), 4u);
  }
  EXPECT_EQ(v["choices"][0]["text"], gen["choices"][0]["text"]);
  const json& a = v["choices"][0]["logprobs"]["token_logprobs"];
  const json& b = gen["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i].get<double>(), b[i].get<double>(), 1e-4);
  // echo + logprobs with a completion: the prompt's tokens, then the generated ones.
  auto [st3, both] = post("/v1/completions", {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", 4},
                                             {"echo", true}, {"logprobs", 2}, {"temperature", 0}});
  ASSERT_EQ(st3, 200) << both.dump();
  const json& bl = both["choices"][0]["logprobs"];
  ASSERT_EQ(bl["tokens"].size(), ids.size() + 4);
  EXPECT_EQ(both["choices"][0]["text"], std::string(kPrompt) + gen["choices"][0]["text"].get<std::string>());
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(bl["token_logprobs"][ids.size() + i].get<double>(), b[i].get<double>(), 1e-4);
  // Chat: once, for the conversation's prompt.
  auto [st4, ch] = post("/v1/chat/completions", {{"model", "plan"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                {"max_tokens", 2}, {"prompt_logprobs", 0}});
  if (st4 == 200) {
    ASSERT_TRUE(ch.contains("prompt_logprobs")) << ch.dump();
    EXPECT_TRUE(ch["prompt_logprobs"][0].is_null());
    for (size_t i = 1; i < ch["prompt_logprobs"].size(); ++i) EXPECT_EQ(ch["prompt_logprobs"][i].size(), 1u);
  } else {
    EXPECT_EQ(st4, 400) << ch.dump();  // tinystories has no chat template
  }
}

// A streamed choice's text and its logprobs object, its events' pieces joined.
std::pair<std::string, json> joined_stream(const json& raw, size_t choice) {
  EXPECT_TRUE(raw.is_string()) << raw.dump();
  bool done = false;
  const std::vector<json> events = testing::sse_events(raw.is_string() ? raw.get<std::string>() : "", &done);
  EXPECT_TRUE(done);
  std::string text;
  json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
             {"text_offset", json::array()}};
  for (const json& e : events)
    for (const json& c : e.value("choices", json::array())) {
      if (c["index"] != choice) continue;
      text += c["text"].get<std::string>();
      if (c["logprobs"].is_null()) continue;
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const json& v : c["logprobs"][key]) lp[key].push_back(v);
    }
  return {text, lp};
}

TEST_F(PromptLogprobsHttpTest, StreamedEchoWithLogprobsLeadsWithThePromptsTokens) {
  const size_t n_prompt = tok_->encode(kPrompt, true)->size();
  // vLLM serves it: the first chunk carries the prompt and its tokens' log-probabilities, then
  // the generated tokens come as usual. Joined, the stream says what the whole answer says.
  for (int max_tokens : {0, 1, 6}) {
    for (int n : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "max_tokens " << max_tokens << ", n " << n);
      json body = {{"model", "plan"}, {"prompt", kPrompt}, {"max_tokens", max_tokens}, {"echo", true},
                   {"logprobs", 2}, {"temperature", 0}, {"n", n}};
      auto [st, whole] = post("/v1/completions", body);
      ASSERT_EQ(st, 200) << whole.dump();
      body["stream"] = true;
      auto [sst, raw] = post("/v1/completions", body);
      ASSERT_EQ(sst, 200) << raw.dump();
      for (int i = 0; i < n; ++i) {
        const json& want = whole["choices"][i];
        auto [text, lp] = joined_stream(raw, static_cast<size_t>(i));
        EXPECT_EQ(text, want["text"].get<std::string>());
        ASSERT_EQ(lp["tokens"].size(), n_prompt + static_cast<size_t>(max_tokens)) << lp.dump();
        EXPECT_TRUE(lp["token_logprobs"][0].is_null());
        EXPECT_TRUE(testing::json_near(lp, want["logprobs"], 1e-4));
      }
      // The first event of each choice holds its whole prompt.
      const std::vector<json> events = testing::sse_events(raw.get<std::string>());
      ASSERT_FALSE(events.empty());
      const json& first = events.front()["choices"][0];
      EXPECT_EQ(first["text"].get<std::string>().rfind(kPrompt, 0), 0u) << first.dump();
      EXPECT_GE(first["logprobs"]["tokens"].size(), n_prompt) << first.dump();
    }
  }
}

TEST_F(PromptLogprobsHttpTest, StreamingPromptLogprobsAndOutOfRangeAreRefused) {
  // vLLM's rule: a count above 0 with "stream" is refused; 0 is taken and shows nothing.
  {
    auto [st, raw] = post("/v1/completions", {{"prompt", kPrompt}, {"stream", true}, {"prompt_logprobs", 0},
                                             {"max_tokens", 2}});
    ASSERT_EQ(st, 200) << raw.dump();
    EXPECT_EQ(raw.get<std::string>().find("prompt_logprobs"), std::string::npos) << raw.dump();
  }
  for (const json& body : {json{{"prompt", kPrompt}, {"stream", true}, {"prompt_logprobs", 1}},
                           json{{"prompt", kPrompt}, {"prompt_logprobs", 21}},
                           json{{"prompt", kPrompt}, {"prompt_logprobs", -1}}}) {
    auto [st, e] = post("/v1/completions", body);
    EXPECT_EQ(st, 400) << body.dump() << " " << e.dump();
    EXPECT_NE(e.dump().find("prompt_logprobs"), std::string::npos) << e.dump();
  }
  // The server goes on.
  auto [st, ok] = post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 1}, {"prompt_logprobs", 0}});
  EXPECT_EQ(st, 200) << ok.dump();
}

}  // namespace
}  // namespace server
}  // namespace lragent
