// Speculative decoding by n-gram lookup (ReplayOptions::speculative) on tinystories-656k with the
// plan/action/reflect adapters: in every sharing mode, agents that speculate pick exactly the
// tokens they pick one pass a token, leave the same per-agent counts, and leave caches from which
// the next agents pick the same again; passes batched across trajectories too. The stories repeat
// names and phrases, so drafts are found and kept (the tests check that they are).
#include <gtest/gtest.h>

#include <memory>

#include "agents/agent_turn.h"
#include "engine/guide/token_guide.h"
#include "tiny_agents.h"

namespace lragent {
namespace {

class SpeculativeTurnTest : public testing::TinyAgentsTest {
 protected:
  static SpeculativeOptions spec(int tokens = 4) {
    SpeculativeOptions o;
    o.num_tokens = tokens;
    o.lookup_min = 1;
    o.lookup_max = 3;
    return o;
  }
  std::unique_ptr<AgentSession> session(ShareMode mode, SpeculativeOptions so) {
    ReplayOptions o;
    o.sharing.max_tokens = 512;
    o.speculative = so;
    return agents_session(mode, o);
  }
  // A session holding BOS and the start of the Lily story the steps continue.
  std::unique_ptr<AgentSession> lily_session(ShareMode mode, SpeculativeOptions so) {
    auto s = session(mode, so);
    if (s) {
      s->append({1});
      s->append(encode("Once upon a time, there was a little girl named Lily. Lily loved her red ball. One day, Lily"));
    }
    return s;
  }
  std::vector<int32_t> encode(const std::string& text) {
    auto ids = tok_->encode(text, false);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
  // A trajectory the agents take turns on: prompt, plan, an observation, action, reflect, plan.
  struct Run {
    std::vector<StepResult> steps;
    std::vector<int32_t> trajectory;
    std::vector<int64_t> computed;
  };
  Run run(ShareMode mode, SpeculativeOptions so) {
    Run out;
    auto s = lily_session(mode, so);
    if (!s) return out;
    const std::pair<const char*, int> turns[] = {{"plan", 30}, {"action", 24}, {"reflect", 20}, {"plan", 16}};
    int i = 0;
    for (const auto& [agent, n] : turns) {
      AgentDecode dec;
      dec.stop_ids = {2};
      auto r = s->run_agent(agent, n, {}, {}, &dec);
      EXPECT_TRUE(r.ok()) << r.error().message;
      if (!r.ok()) return out;
      out.steps.push_back(std::move(*r));
      if (i++ == 1) s->append(encode(" Lily said, \"My red ball!\" and the red ball"));
    }
    out.trajectory = s->trajectory();
    out.computed = s->computed_per_agent();
    return out;
  }
};

TEST_F(SpeculativeTurnTest, EveryModePicksTheTokensOfOnePassAToken) {
  int64_t kept = 0, drafted = 0;
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kFull, ShareMode::kBase, ShareMode::kBaseLr, ShareMode::kDroidSpeak,
                         ShareMode::kIcarus}) {
    SCOPED_TRACE(share_mode_name(mode));
    const Run plain = run(mode, {});
    const Run fast = run(mode, spec());
    ASSERT_EQ(fast.steps.size(), plain.steps.size());
    ASSERT_EQ(plain.steps.size(), 4u);
    for (size_t i = 0; i < plain.steps.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(fast.steps[i].output_tokens, plain.steps[i].output_tokens);
      EXPECT_EQ(fast.steps[i].finish_reason, plain.steps[i].finish_reason);
      EXPECT_EQ(fast.steps[i].prefilled_tokens, plain.steps[i].prefilled_tokens);
      EXPECT_EQ(plain.steps[i].drafts.passes, 0);
      EXPECT_LE(fast.steps[i].drafts.accepted, fast.steps[i].drafts.drafted);
      EXPECT_LE(fast.steps[i].drafts.drafted, 4 * fast.steps[i].drafts.passes);
      kept += fast.steps[i].drafts.accepted;
      drafted += fast.steps[i].drafts.drafted;
    }
    EXPECT_EQ(fast.trajectory, plain.trajectory);
    EXPECT_EQ(fast.computed, plain.computed);  // the kept positions only
  }
  // The drafts were found and some were right (else the test would compare plain decoding only).
  EXPECT_GT(drafted, 20);
  EXPECT_GT(kept, 10);
}

// The suffix method (vLLM's "suffix", engine/suffix_decoding.h): the same tokens in every mode, and
// a corpus of finished outputs that another trajectory drafts from: a second trajectory on the
// same prompt keeps most of its tokens from the first one's output.
TEST_F(SpeculativeTurnTest, SuffixMethodPicksTheTokensOfOnePassATokenAndDraftsFromEarlierOutputs) {
  SpeculativeOptions suffix;
  suffix.method = SpeculativeMethod::kSuffix;
  suffix.num_tokens = 8;
  int64_t kept = 0;
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr, ShareMode::kFull}) {
    SCOPED_TRACE(share_mode_name(mode));
    const Run plain = run(mode, {});
    const Run fast = run(mode, suffix);
    ASSERT_EQ(plain.steps.size(), 4u);
    ASSERT_EQ(fast.steps.size(), 4u);
    for (size_t i = 0; i < plain.steps.size(); ++i) {
      EXPECT_EQ(fast.steps[i].output_tokens, plain.steps[i].output_tokens) << i;
      kept += fast.steps[i].drafts.accepted;
    }
    EXPECT_EQ(fast.trajectory, plain.trajectory);
    EXPECT_EQ(fast.computed, plain.computed);
  }
  EXPECT_GT(kept, 4);  // the comparison covers kept drafts
  // Two trajectories, one corpus (the server's way): the second step repeats the first's output.
  SuffixCorpus corpus(100);
  suffix.corpus = &corpus;
  std::vector<StepResult> steps;
  for (int t = 0; t < 2; ++t) {
    auto s = session(ShareMode::kBaseLr, suffix);
    ASSERT_NE(s, nullptr);
    s->append({1});
    s->append(encode("Once upon a time, there was a big bear who lived in the woods. The bear"));
    auto r = s->run_agent("reflect", 40, {}, {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    steps.push_back(std::move(*r));
  }
  EXPECT_EQ(corpus.outputs(), 2);
  EXPECT_EQ(steps[1].output_tokens, steps[0].output_tokens);
  EXPECT_GT(steps[1].drafts.accepted, steps[0].drafts.accepted);
  EXPECT_GE(steps[1].drafts.accepted * 2, static_cast<int64_t>(steps[1].output_tokens.size()))
      << "most of the repeated output comes from drafts";
  EXPECT_LT(steps[1].drafts.passes * 3, static_cast<int64_t>(steps[1].output_tokens.size()));
}

// A greedy step that asks for each token's log-probabilities speculates too: its rows come to the
// host, and each kept token's log-probabilities are those one pass a token gives (the same top
// ids; values within f32 rounding of a multi-row pass). Its prompt's log-probabilities (from the
// catch-up, which checks no drafts) are the same too.
TEST_F(SpeculativeTurnTest, LogprobsAreThoseOfOnePassAToken) {
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr}) {
    SCOPED_TRACE(share_mode_name(mode));
    std::vector<StepResult> runs;
    for (bool speculate : {false, true}) {
      auto s = lily_session(mode, speculate ? spec() : SpeculativeOptions{});
      ASSERT_NE(s, nullptr);
      AgentDecode dec;
      dec.logprobs = 3;
      dec.prompt_logprobs = 2;  // the catch-up's rows, then decode passes with drafts
      std::vector<float> streamed;  // on_token's log-probabilities, as a server streams them
      dec.on_token = [&streamed](int32_t, const StepLogprobs* lp) {
        streamed.push_back(lp ? lp->logprob : 1.f);
        return true;
      };
      auto r = s->run_agent("action", 40, {}, {}, &dec);
      ASSERT_TRUE(r.ok()) << r.error().message;
      ASSERT_EQ(streamed.size() + (r->finish_reason == "stop" ? 1 : 0), r->output_tokens.size());
      for (size_t k = 0; k < streamed.size(); ++k) EXPECT_EQ(streamed[k], r->logprobs[k].logprob) << k;
      runs.push_back(std::move(*r));
    }
    const StepResult &plain = runs[0], &fast = runs[1];
    EXPECT_EQ(plain.drafts.passes, 0);
    EXPECT_GT(fast.drafts.accepted, 0);
    EXPECT_EQ(fast.output_tokens, plain.output_tokens);
    ASSERT_EQ(fast.prompt_logprobs.size(), plain.prompt_logprobs.size());
    ASSERT_GT(plain.prompt_logprobs.size(), 10u);
    for (size_t k = 0; k < plain.prompt_logprobs.size(); ++k)
      EXPECT_EQ(fast.prompt_logprobs[k].logprob, plain.prompt_logprobs[k].logprob) << k;
    ASSERT_EQ(fast.logprobs.size(), plain.logprobs.size());
    for (size_t k = 0; k < plain.logprobs.size(); ++k) {
      SCOPED_TRACE(k);
      EXPECT_NEAR(fast.logprobs[k].logprob, plain.logprobs[k].logprob, 1e-4);
      ASSERT_EQ(fast.logprobs[k].top.size(), 3u);
      for (size_t t = 0; t < 3; ++t) EXPECT_EQ(fast.logprobs[k].top[t].id, plain.logprobs[k].top[t].id);
    }
  }
}

// Steps that sample, penalize, shape or follow a guide speculate too: each row of a pass with
// drafts is picked on the host (or on the device, with its own draw) as decoding a token a pass
// picks it, with the draw, the penalties' counts, min_tokens and the guide's state the tokens
// before it leave. A sampled draft is then kept exactly when the target's draw picks it. The
// same seed thus gives the same tokens with and without drafts.
TEST_F(SpeculativeTurnTest, SampledPenalizedAndGuidedStepsPickTheTokensOfOnePassAToken) {
  auto trie = guide::VocabTrie::build(*tok_);
  auto guide = guide::TokenGuide::compile("[A-Za-z ,.]{40,400}", *trie);
  ASSERT_TRUE(guide.ok()) << guide.error().message;
  struct Case {
    const char* name;
    AgentDecode dec;
  };
  std::vector<Case> cs;
  {
    AgentDecode d;  // sampled on the device (only ids come back)
    d.sampling = {0.3f, 0, 1.f, 11};
    cs.push_back({"sampled", d});
    d.sampling = {1.f, 3, 1.f, 12};  // from the 3 likeliest
    cs.push_back({"top-k", d});
    d.sampling = {0.3f, 0, 0.9f, 13};
    d.logprobs = 2;  // the rows come to the host
    cs.push_back({"sampled with logprobs", d});
    AgentDecode p;
    p.penalties.frequency = 0.2f;
    p.penalties.repetition = 1.05f;
    p.min_tokens = 30;
    cs.push_back({"greedy with penalties and min_tokens", p});
    p.penalties.frequency = 0.f;
    p.penalties.presence = 0.05f;
    p.penalties.repetition = 1.f;
    p.min_tokens = 0;
    p.sampling = {0.2f, 20, 1.f, 14};
    p.min_p = 0.05f;
    cs.push_back({"sampled with penalties and min_p", p});
    AgentDecode g;
    g.guide = guide->get();
    cs.push_back({"guided", g});
    g.sampling = {0.3f, 0, 1.f, 15};
    cs.push_back({"guided and sampled", g});
  }
  for (Case& c : cs) {
    SCOPED_TRACE(c.name);
    c.dec.stop_ids = {2};
    int64_t kept = 0;
    for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr}) {
      SCOPED_TRACE(share_mode_name(mode));
      std::vector<StepResult> runs;
      for (bool speculate : {false, true}) {
        auto s = lily_session(mode, speculate ? spec() : SpeculativeOptions{});
        ASSERT_NE(s, nullptr);
        std::vector<int32_t> streamed;
        AgentDecode dec = c.dec;
        dec.on_token = [&streamed](int32_t t, const StepLogprobs*) {
          streamed.push_back(t);
          return true;
        };
        auto r = s->run_agent("plan", 64, {}, {}, &dec);
        ASSERT_TRUE(r.ok()) << r.error().message;
        const bool stop_id = !r->output_tokens.empty() && r->output_tokens.back() == 2;  // not given to on_token
        EXPECT_EQ(streamed.size() + (stop_id ? 1 : 0), r->output_tokens.size());
        runs.push_back(std::move(*r));
      }
      const StepResult &plain = runs[0], &fast = runs[1];
      EXPECT_EQ(fast.output_tokens, plain.output_tokens);
      EXPECT_EQ(fast.finish_reason, plain.finish_reason);
      ASSERT_EQ(fast.logprobs.size(), plain.logprobs.size());
      for (size_t k = 0; k < plain.logprobs.size(); ++k) EXPECT_NEAR(fast.logprobs[k].logprob, plain.logprobs[k].logprob, 1e-4);
      EXPECT_GT(fast.drafts.passes, 0);
      kept += fast.drafts.accepted;
    }
    EXPECT_GT(kept, 0) << "no draft was kept: the comparison would not cover speculation";
  }
}

TEST_F(SpeculativeTurnTest, BatchedTurnsPickWhatEachPicksAlone) {
  // Three trajectories, one turn sampled, batched together.
  struct Case {
    ShareMode mode;
    const char* text;
    const char* agent;
    int n;
    AgentDecode dec;
  };
  AgentDecode sampled;
  sampled.sampling = {0.9f, 40, 0.95f, 7};
  const Case cs[] = {
      {ShareMode::kBaseLr, "Tom had a big dog. The big dog liked to run. Tom and the big dog", "action", 28, {}},
      {ShareMode::kNone, "Lily and Ben went to the park. Lily and Ben", "plan", 22, sampled},
      {ShareMode::kBase, "The cat sat on the mat. The cat was happy. The cat", "reflect", 25, {}},
  };
  auto prepare = [&](const Case& c, SpeculativeOptions so) {
    auto s = session(c.mode, so);
    if (s) {
      s->append({1});
      s->append(encode(c.text));
    }
    return s;
  };
  std::vector<StepResult> alone;
  for (const Case& c : cs) {
    auto s = prepare(c, {});
    ASSERT_NE(s, nullptr);
    auto r = s->run_agent(c.agent, c.n, {}, {}, &c.dec);
    ASSERT_TRUE(r.ok()) << r.error().message;
    alone.push_back(std::move(*r));
  }
  for (int cap : {0, 2}) {  // disable_by_batch_size 2: no drafts while three decode
    SCOPED_TRACE(cap);
    SpeculativeOptions so = spec(3);
    so.disable_by_batch_size = cap;
    std::vector<std::unique_ptr<AgentSession>> sessions;
    std::vector<std::unique_ptr<AgentTurn>> turns;
    for (const Case& c : cs) {
      sessions.push_back(prepare(c, so));
      ASSERT_NE(sessions.back(), nullptr);
      auto t = AgentTurn::start(*sessions.back(), c.agent, c.n, {}, {}, c.dec);
      ASSERT_TRUE(t.ok()) << t.error().message;
      EXPECT_TRUE((*t)->speculates());
      EXPECT_FALSE((*t)->speculates() && (*t)->looks_ahead());
      turns.push_back(std::move(*t));
    }
    int passes = 0;
    bool drafted_at_three = false;  // a pass that decoded all three checked drafts
    for (;;) {
      std::vector<AgentTurn*> live;
      for (auto& t : turns)
        if (!t->done()) live.push_back(t.get());
      if (live.empty()) break;
      int64_t before = 0, after = 0;
      for (AgentTurn* t : live) before += t->progress().drafts.passes;
      const bool three = live.size() == 3 && passes > 0;  // the first pass is the catch-ups
      const TurnStep step = step_turns(*model_, live, 64);
      for (const Status& st : step.status) ASSERT_TRUE(st.ok()) << st.error().message;
      for (AgentTurn* t : live) after += t->progress().drafts.passes;
      drafted_at_three = drafted_at_three || (three && after > before);
      ASSERT_LT(++passes, 1000);
    }
    int64_t draft_passes = 0, kept = 0;
    for (size_t i = 0; i < std::size(cs); ++i) {
      SCOPED_TRACE(i);
      const StepResult r = turns[i]->result();
      EXPECT_EQ(r.output_tokens, alone[i].output_tokens);
      EXPECT_EQ(r.finish_reason, alone[i].finish_reason);
      draft_passes += r.drafts.passes;
      kept += r.drafts.accepted;
    }
    if (cap == 0) {
      EXPECT_TRUE(drafted_at_three);
      EXPECT_GT(kept, 0);
      EXPECT_LT(passes, 28);  // fewer passes than the longest step's tokens
    } else {
      EXPECT_FALSE(drafted_at_three);  // more than 2 decoding: no drafts
      EXPECT_GT(draft_passes, 0);      // once two or fewer decode, drafts again
    }
  }
}

TEST_F(SpeculativeTurnTest, NoDraftsPastTheTokenBudget) {
  // A one-token step checks no drafts; a step of n tokens never gets more than n.
  for (int n : {1, 2, 5}) {
    SCOPED_TRACE(n);
    auto s = session(ShareMode::kBaseLr, spec(8));
    ASSERT_NE(s, nullptr);
    s->append({1});
    s->append(encode("The red ball. The red ball. The red ball. The red ball. The red"));
    auto r = s->run_agent("plan", n, {}, {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(static_cast<int>(r->output_tokens.size()), n);
    EXPECT_LE(r->drafts.drafted, std::max(0, n - 1) * r->drafts.passes);
    if (n == 1) EXPECT_EQ(r->drafts.passes, 0);
  }
}

TEST_F(SpeculativeTurnTest, FailsAtTheContextAsOnePassATokenDoes) {
  // A repetitive prompt near the model's 512 positions: drafts are found up to the end, and none
  // may take a pass past it before decoding a token a pass would get there.
  std::vector<int32_t> prompt = {1};
  while (prompt.size() < 490) {
    const auto more = encode(" The red ball went up and the red ball came down.");
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  prompt.resize(490);
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr}) {
    SCOPED_TRACE(share_mode_name(mode));
    std::vector<std::string> errors;
    std::vector<std::vector<int32_t>> traj;
    int64_t kept = 0;
    for (bool speculate : {false, true}) {
      auto s = session(mode, speculate ? spec(8) : SpeculativeOptions{});
      ASSERT_NE(s, nullptr);
      s->append(prompt);
      // The step runs into the context's end, which fails it.
      auto r = s->run_agent("plan", 40, {}, {});
      ASSERT_FALSE(r.ok()) << "530 positions cannot fit 512";
      errors.push_back(r.error().message);
      traj.push_back(s->trajectory());
      AgentDecode dec;
      auto short_step = session(mode, speculate ? spec(8) : SpeculativeOptions{});
      short_step->append(prompt);
      auto fits = short_step->run_agent("plan", 20, {}, {}, &dec);  // 510 positions: fits
      ASSERT_TRUE(fits.ok()) << fits.error().message;
      kept += fits->drafts.accepted;
      traj.push_back(short_step->trajectory());
    }
    EXPECT_EQ(errors[1], errors[0]);
    EXPECT_EQ(traj[2], traj[0]);
    EXPECT_EQ(traj[3], traj[1]);
    EXPECT_GT(kept, 0);
  }
}

}  // namespace
}  // namespace lragent
