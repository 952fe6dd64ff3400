// The ReAct workflow on tinystories-656k with the plan/action/reflect adapters: it terminates
// under every sharing mode whatever the tiny model writes, records every turn, and each turn's
// catch-up (prefilled tokens) is what its mode prescribes. Plus `lragent run` end to end.
#include <gtest/gtest.h>


#include <algorithm>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "agents/workflow.h"
#include "encode_util.h"
#include "model/lora.h"
#include "cli_runner.h"
#include "test_util.h"

namespace lragent {
namespace {

using testing::must_encode;

constexpr int64_t kContext = 512;  // tinystories-656k's max_position_embeddings

class Workflow : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(2);
    auto m = LlamaModel::load(testing::tinystories_dir(), *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    auto t = Tokenizer::load_dir(testing::tinystories_dir());
    ASSERT_TRUE(t.ok()) << t.error().message;
    tok_ = std::move(*t);
    for (const char* role : {"plan", "action", "reflect"}) {
      auto a = load_lora_adapter(role, testing::adapters_dir() + "/qv-shared-a-r8/" + role, model_->config());
      ASSERT_TRUE(a.ok()) << a.error().message;
      adapters_.push_back(std::move(*a));
    }
  }
  // Replay options for `mode` (droidspeak keeps layer 1 private).
  static ReplayOptions replay_options(ShareMode mode) {
    ReplayOptions o;
    o.sharing.mode = mode;
    if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {1};
    return o;
  }
  std::unique_ptr<AgentSession> session(ShareMode mode, int n_agents = 3) {
    return session(replay_options(mode), n_agents);
  }
  // The first n_agents of plan, action, reflect; null (a failed expectation) if create fails.
  std::unique_ptr<AgentSession> session(const ReplayOptions& o, int n_agents = 3) {
    std::vector<std::string> names;
    std::vector<const LoraAdapter*> ads;
    for (int i = 0; i < n_agents; ++i) {
      names.push_back(adapters_[static_cast<size_t>(i)]->name);
      ads.push_back(adapters_[static_cast<size_t>(i)].get());
    }
    auto s = AgentSession::create(*model_, tok_.get(), names, ads, o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  static ReactOptions options() {
    ReactOptions o;
    o.max_steps = 4;
    o.system_prompt = kReactCompactPrompt;  // the full prompt alone exceeds the 512-token context
    o.max_context_tokens = kContext;
    return o;
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::unique_ptr<LoraAdapter>> adapters_;  // plan, action, reflect (shared A)
};

// Replays the catch-up rule of a mode over the recorded turns: per-agent modes recompute every
// position the agent has not run forward on itself; shared modes only positions no agent has.
void expect_prefill_follows_mode(const WorkflowReport& r, bool per_agent, const char* mode) {
  std::map<std::string, int64_t> processed, computed;  // agent -> positions forwarded / tokens computed
  int64_t shared = 0;
  for (size_t i = 0; i < r.turns.size(); ++i) {
    const WorkflowTurn& t = r.turns[i];
    const int64_t start = per_agent ? processed[t.agent] : shared;
    EXPECT_EQ(t.prefilled_tokens, t.context_tokens - start) << mode << " turn " << i << " (" << t.agent << ")";
    ASSERT_GE(t.decoded_tokens, 1);
    const int64_t end = t.context_tokens + t.decoded_tokens - 1;  // the last decoded token waits for the next agent
    processed[t.agent] = end;
    shared = std::max(shared, end);
    computed[t.agent] += t.prefilled_tokens + t.decoded_tokens - 1;
  }
  for (const AgentTotals& a : r.agents) EXPECT_EQ(a.computed_tokens, computed[a.agent]) << mode << " " << a.agent;
}

TEST_F(Workflow, EveryModeTerminatesRecordsTurnsAndPrefillsAsTheModeSays) {
  std::map<ShareMode, WorkflowReport> reports;
  for (ShareMode mode : kAllShareModes) {
    auto s = session(mode);
    ASSERT_TRUE(s);
    ToolEnv env(builtin_question());
    ReactOptions o = options();
    std::vector<std::string> seen;  // agents in the order on_turn reported them
    o.on_turn = [&](const WorkflowTurn& t) { seen.push_back(t.agent); };
    // The tiny model never writes Finish by itself: step 2's action is forced to, so that a
    // reflect turn runs in every mode.
    o.forced_turn = [](int step, const std::string& agent) -> std::optional<std::string> {
      if (step == 2 && agent == "action") return std::string(" Finish[Seine]");
      return std::nullopt;
    };
    auto r = run_react(*s, *tok_, env, o);
    ASSERT_TRUE(r.ok()) << share_mode_name(mode) << ": " << r.error().message;
    const char* name = share_mode_name(mode);

    ASSERT_FALSE(r->turns.empty()) << name;
    EXPECT_TRUE(r->stop_reason == "finished" || r->stop_reason == "max_steps" || r->stop_reason == "context_full")
        << r->stop_reason;
    EXPECT_GE(r->steps, 1);
    EXPECT_LE(r->steps, o.max_steps);
    EXPECT_EQ(r->trajectory_tokens, static_cast<int64_t>(s->trajectory().size()));
    EXPECT_LE(r->trajectory_tokens, kContext);
    EXPECT_EQ(r->question, builtin_question().question);
    EXPECT_EQ(r->gold_answer, "Seine");
    EXPECT_GT(r->wall_seconds, 0);
    ASSERT_EQ(seen.size(), r->turns.size());
    // Turns go plan, action[, reflect after a Finish], plan, ... with rising step numbers.
    for (size_t i = 0; i < r->turns.size(); ++i) {
      const WorkflowTurn& t = r->turns[i];
      EXPECT_EQ(seen[i], t.agent);
      EXPECT_GT(t.context_tokens, 0);
      EXPECT_LE(t.decoded_tokens, t.agent == "plan"     ? o.thought_tokens
                                  : t.agent == "action" ? o.action_tokens
                                                        : o.reflect_tokens);
      EXPECT_GE(t.seconds, 0);
      EXPECT_EQ(t.text.find('\n'), std::string::npos);
      if (i == 0) {
        EXPECT_EQ(t.agent, "plan");
        EXPECT_EQ(t.step, 1);
        continue;
      }
      const WorkflowTurn& prev = r->turns[i - 1];
      if (t.agent == "action") {
        EXPECT_EQ(prev.agent, "plan");
        EXPECT_EQ(t.step, prev.step);
        EXPECT_FALSE(t.tool.observation.empty()) << "every action gets an observation, valid or not";
      } else if (t.agent == "reflect") {
        EXPECT_EQ(prev.tool.tool, "Finish");
      } else {
        EXPECT_EQ(t.agent, "plan");
        EXPECT_EQ(t.step, prev.step + 1);
      }
    }
    const auto reflects = std::count_if(r->turns.begin(), r->turns.end(),
                                        [](const WorkflowTurn& t) { return t.agent == "reflect"; });
    std::string turns_text;  // for failure messages
    for (const WorkflowTurn& t : r->turns) turns_text += t.agent + " " + std::to_string(t.step) + ": " + t.text + " | ";
    ASSERT_GE(reflects, 1) << name << ": the forced Finish is followed by a reflect turn; " << r->stop_reason << "; "
                           << turns_text;
    EXPECT_EQ(r->turns[3].text, "Finish[Seine]") << name;
    EXPECT_EQ(r->turns[3].tool.tool, "Finish") << name;
    int64_t prefilled = 0, decoded = 0;
    int turns = 0;
    ASSERT_EQ(r->agents.size(), 3u);
    for (const AgentTotals& a : r->agents) {
      prefilled += a.prefilled_tokens;
      decoded += a.decoded_tokens;
      turns += a.turns;
    }
    EXPECT_EQ(turns, static_cast<int>(r->turns.size()));
    int64_t turn_prefilled = 0, turn_decoded = 0;
    for (const WorkflowTurn& t : r->turns) turn_prefilled += t.prefilled_tokens, turn_decoded += t.decoded_tokens;
    EXPECT_EQ(prefilled, turn_prefilled);
    EXPECT_EQ(decoded, turn_decoded);

    const bool per_agent = mode == ShareMode::kNone || mode == ShareMode::kBase || mode == ShareMode::kDroidSpeak;
    expect_prefill_follows_mode(*r, per_agent, name);
    const CacheBytes& b = r->cache;
    const bool base_modes = mode == ShareMode::kBase || mode == ShareMode::kBaseLr;
    EXPECT_EQ(b.base > 0, base_modes) << name;
    EXPECT_EQ(b.lr > 0, base_modes) << name;
    EXPECT_EQ(b.full > 0, !base_modes) << name;
    EXPECT_GE(b.allocated, b.total()) << name;
    reports[mode] = std::move(*r);
  }
  auto total_prefilled = [](const WorkflowReport& r) {
    int64_t n = 0;
    for (const AgentTotals& a : r.agents) n += a.prefilled_tokens;
    return n;
  };
  // Non-Shared and BaseShared catch each agent up on the whole trajectory; BaseLRShared (and
  // FullShared) compute each token once, whichever agent gets to it first.
  const WorkflowReport &none = reports[ShareMode::kNone], &base = reports[ShareMode::kBase],
                       &base_lr = reports[ShareMode::kBaseLr];
  for (const WorkflowReport* r : {&none, &base}) {
    for (const char* role : {"action", "reflect"}) {
      const auto first = std::find_if(r->turns.begin(), r->turns.end(),
                                      [&](const WorkflowTurn& t) { return t.agent == role; });
      ASSERT_NE(first, r->turns.end()) << role;
      EXPECT_EQ(first->prefilled_tokens, first->context_tokens) << role << "'s first turn computes everything before it";
    }
  }
  EXPECT_LT(total_prefilled(base_lr), total_prefilled(none));
  EXPECT_LT(total_prefilled(base_lr), total_prefilled(base));
  EXPECT_LT(base_lr.cache.total(), none.cache.total());
}

// Decode lookahead (AgentSession, the default) against step-by-step decoding in every mode:
// the same tokens, trajectory, per-agent compute and cache bytes, with stop strings that end
// most steps early (each drops a launched pass and leaves its position to the next agent), a
// forced step and a step of one token; then the same logits for a last step over the caches.
TEST_F(Workflow, DecodeLookaheadKeepsTokensCachesAndCounts) {
  const std::vector<int32_t> prompt = must_encode(*tok_, "Question: where does the river flow? Answer:", false);
  for (ShareMode mode : kAllShareModes) {
    const char* name = share_mode_name(mode);
    std::vector<std::unique_ptr<AgentSession>> s;
    for (bool lookahead : {false, true}) {
      ReplayOptions o = replay_options(mode);
      o.decode_lookahead = lookahead;
      s.push_back(session(o));
      ASSERT_TRUE(s.back());
      s.back()->append(prompt);
    }
    int stopped_early = 0;
    for (int round = 0; round < 3; ++round) {
      struct Call {
        const char* agent;
        int n;
        std::vector<int32_t> forced;
        std::vector<std::string> stop;
      };
      const std::vector<Call> calls = {
          {"plan", 12, {}, {"e", "."}},
          {"action", 6, {}, {"a"}},
          {"action", 0, {5, 300, 7 + round}, {}},
          {"reflect", 1, {}, {}},
          {"reflect", 9, {}, {}},
      };
      for (const Call& c : calls) {
        std::vector<StepResult> out;
        for (auto& sess : s) {
          auto r = sess->run_agent(c.agent, c.n, c.forced, c.stop);
          ASSERT_TRUE(r.ok()) << name << ": " << r.error().message;
          out.push_back(std::move(*r));
        }
        EXPECT_EQ(out[1].output_tokens, out[0].output_tokens) << name << " round " << round << " " << c.agent;
        EXPECT_EQ(out[1].prefilled_tokens, out[0].prefilled_tokens) << name << " " << c.agent;
        stopped_early += c.n > 0 && static_cast<int>(out[0].output_tokens.size()) < c.n;
      }
    }
    EXPECT_GE(stopped_early, 2) << name << ": the stop strings must end some steps early";
    EXPECT_EQ(s[1]->trajectory(), s[0]->trajectory()) << name;
    EXPECT_EQ(s[1]->computed_per_agent(), s[0]->computed_per_agent()) << name;
    EXPECT_EQ(s[1]->cache_bytes().total(), s[0]->cache_bytes().total()) << name;
    EXPECT_EQ(s[1]->cache_bytes().allocated, s[0]->cache_bytes().allocated) << name << ": no block kept past the trajectory";
    std::vector<std::vector<float>> last;
    for (auto& sess : s) {
      sess->keep_logits(true);
      auto r = sess->run_agent("plan", 2, {}, {});
      ASSERT_TRUE(r.ok()) << r.error().message;
      ASSERT_EQ(r->logits.size(), 2u);
      last.push_back(r->logits[0]);
    }
    EXPECT_EQ(last[1], last[0]) << name << ": the caches must hold the same entries";
  }
}

// Under a KV memory small enough to drop private caches, decode lookahead evicts exactly what
// step-by-step decoding does: its speculative pass (thrown away when a stop string ends the step)
// may not drop another agent's cache for room, and gives back what it reserved past the
// trajectory. One-token pages make every speculative pass reserve a block.
TEST_F(Workflow, DecodeLookaheadEvictsAsStepByStep) {
  const std::vector<int32_t> prompt = must_encode(*tok_, "Question: where does the river flow? Answer:", false);
  // (base's private LR rows are too small beside its shared base cache, in this tiny model's
  // slabs, for a memory size that evicts and still fits every pass.)
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kDroidSpeak}) {
    const char* name = share_mode_name(mode);
    auto make = [&](bool lookahead, int64_t arena_bytes) {
      ReplayOptions o = replay_options(mode);
      o.sharing.page_size = 1;
      o.sharing.max_tokens = kContext;
      o.sharing.arena_bytes = arena_bytes;
      o.decode_lookahead = lookahead;
      auto r = session(o);
      if (r) r->append(prompt);
      return r;
    };
    // Every agent speaks in turn, each step ended early by a stop string.
    auto run = [&](AgentSession& s, std::vector<std::vector<int32_t>>& outputs) -> Status {
      for (int round = 0; round < 4; ++round)
        for (const char* agent : {"plan", "action", "reflect"}) {
          LRA_ASSIGN_OR_RETURN(StepResult r, s.run_agent(agent, 12, {}, {"e", "a", "."}));
          outputs.push_back(r.output_tokens);
        }
      return Status::Ok();
    };
    std::vector<std::vector<int32_t>> free_out;
    auto unlimited = make(false, 0);
    ASSERT_TRUE(unlimited);
    ASSERT_TRUE(run(*unlimited, free_out).ok());
    // The smallest tenth of what the caches reach unlimited that step by step gets through (the
    // shared caches cannot be dropped): evictions, and room for any one pass.
    std::vector<std::unique_ptr<AgentSession>> s;
    std::vector<std::vector<std::vector<int32_t>>> out(2);
    for (int tenths = 3; tenths < 10 && s.empty(); ++tenths) {
      auto step = make(false, unlimited->cache_bytes().allocated * tenths / 10);
      ASSERT_TRUE(step);
      out[0].clear();
      const Status st = run(*step, out[0]);
      if (st.ok()) s.push_back(std::move(step));
    }
    ASSERT_EQ(s.size(), 1u) << name << ": no KV memory size between 30% and 90% ran step by step";
    s.push_back(make(true, s[0]->cache_bytes().reserved));
    ASSERT_TRUE(s.back());
    const Status st = run(*s.back(), out[1]);
    ASSERT_TRUE(st.ok()) << name << " lookahead: " << st.error().message;
    const KvUsage a = s[0]->kv().usage(), b = s[1]->kv().usage();
    EXPECT_GT(a.evictions, 0) << name << ": the KV memory must be tight enough to evict";
    EXPECT_EQ(b.evictions, a.evictions) << name;
    EXPECT_EQ(b.evicted_tokens, a.evicted_tokens) << name;
    EXPECT_EQ(b.peak.allocated, a.peak.allocated) << name;
    EXPECT_EQ(out[1], out[0]) << name;
    EXPECT_EQ(s[1]->trajectory(), s[0]->trajectory()) << name;
    EXPECT_EQ(s[1]->computed_per_agent(), s[0]->computed_per_agent()) << name;
    EXPECT_EQ(s[1]->cache_bytes().allocated, s[0]->cache_bytes().allocated) << name;
    EXPECT_EQ(s[1]->cache_bytes().total(), s[0]->cache_bytes().total()) << name;
  }
}

// DroidSpeak recomputing layer 0 of this 2-layer model: an agent's catch-up over positions the
// shared layer already holds runs layer 0 only (TrajectoryKv::catchup_layers). Its private
// entries, and so every logit and token, are those of the catch-up through every layer.
TEST_F(Workflow, DroidSpeakCatchUpRunsOnlyUpToItsRecomputeLayers) {
  const std::vector<int32_t> prompt = must_encode(*tok_, "Question: where does the river flow? Answer:", false);
  const std::vector<int32_t> obs = must_encode(*tok_, " Observation: the river flows to the sea.", false);
  struct Run {
    std::vector<StepResult> steps;
    std::unique_ptr<AgentSession> s;
    int64_t shrink_rows = 0;  // rows multiplied by some lora_A: one per token, adapted module and layer run
  };
  auto run = [&](std::vector<int> recompute, bool partial) {
    Run r;
    ReplayOptions o = replay_options(ShareMode::kDroidSpeak);
    o.sharing.recompute_layers = std::move(recompute);
    o.sharing.partial_catchup = partial;
    o.keep_logits = true;
    r.s = session(o);
    if (!r.s) return r;
    r.s->append(prompt);
    const int64_t rows_before = model_->stats().lora_shrink_rows;
    for (int round = 0; round < 3; ++round)
      for (const char* agent : {"plan", "action", "reflect"}) {
        auto st = r.s->run_agent(agent, 5, {}, {});
        EXPECT_TRUE(st.ok()) << st.error().message;
        if (!st.ok()) return r;
        r.steps.push_back(std::move(*st));
        r.s->append(obs);
      }
    r.shrink_rows = model_->stats().lora_shrink_rows - rows_before;
    return r;
  };
  const int L = model_->config().num_layers;
  ASSERT_EQ(L, 2);
  const Run full = run({0}, false), part = run({0}, true);
  ASSERT_TRUE(full.s && part.s);
  ASSERT_EQ(full.steps.size(), 9u);
  ASSERT_EQ(part.steps.size(), full.steps.size());
  EXPECT_EQ(full.s->kv().catchup_layers(), L);
  EXPECT_EQ(part.s->kv().catchup_layers(), 1);
  double worst = 0;
  for (size_t i = 0; i < full.steps.size(); ++i) {
    const StepResult &a = full.steps[i], &b = part.steps[i];
    EXPECT_EQ(b.output_tokens, a.output_tokens) << "step " << i;
    EXPECT_EQ(b.prefilled_tokens, a.prefilled_tokens) << "step " << i << ": the catch-up covers the same positions";
    ASSERT_EQ(b.logits.size(), a.logits.size()) << "step " << i;
    for (size_t t = 0; t < a.logits.size(); ++t)
      for (size_t v = 0; v < a.logits[t].size(); ++v)
        worst = std::max(worst, static_cast<double>(std::abs(a.logits[t][v] - b.logits[t][v])) /
                                    (1.0 + std::abs(a.logits[t][v])));
  }
  EXPECT_LE(worst, 1e-5) << "the partial catch-up's layer-0 entries differ from the full one's";
  EXPECT_EQ(part.s->trajectory(), full.s->trajectory());
  EXPECT_EQ(part.s->cache_bytes().total(), full.s->cache_bytes().total());
  EXPECT_EQ(part.s->cache_bytes().allocated, full.s->cache_bytes().allocated);
  // Every catch-up position runs once either way, through layer 0 only or through both layers.
  int64_t partial_sum = 0;
  for (size_t a = 0; a < 3; ++a) {
    EXPECT_EQ(full.s->partial_per_agent()[a], 0);
    EXPECT_EQ(part.s->computed_per_agent()[a] + part.s->partial_per_agent()[a], full.s->computed_per_agent()[a])
        << "agent " << a;
    partial_sum += part.s->partial_per_agent()[a];
  }
  EXPECT_GT(partial_sum, 0) << "action and reflect catch up on positions plan computed";
  // q and v are adapted in both layers: a partial position saves one layer's two shrinks.
  EXPECT_EQ(full.shrink_rows - part.shrink_rows, 2 * partial_sum) << "the partial passes ran layer 1";

  // Recomputing the last layer needs every layer: nothing runs partially.
  const Run last = run({1}, true);
  ASSERT_TRUE(last.s);
  EXPECT_EQ(last.s->kv().catchup_layers(), L);
  for (int64_t n : last.s->partial_per_agent()) EXPECT_EQ(n, 0);
}

// A step that runs into the model's context (512 positions) fails as step-by-step decoding
// does: the same error at the same token, the same trajectory, and no launched pass left behind
// whose pick a later take_picks would mistake for its own.
TEST_F(Workflow, DecodeLookaheadFailsAtTheContextAsStepByStep) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 500; ++i) prompt.push_back(5 + (i * 7) % 300);
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr}) {
    std::vector<std::vector<int32_t>> traj;
    std::vector<std::string> errors;
    for (bool lookahead : {false, true}) {
      ReplayOptions o;
      o.sharing.mode = mode;
      o.decode_lookahead = lookahead;
      std::vector<std::string> names;
      std::vector<const LoraAdapter*> ads;
      for (auto& a : adapters_) names.push_back(a->name), ads.push_back(a.get());
      auto s = AgentSession::create(*model_, tok_.get(), names, ads, o);
      ASSERT_TRUE(s.ok()) << s.error().message;
      (*s)->append(prompt);
      auto r = (*s)->run_agent("plan", 40, {}, {});
      ASSERT_FALSE(r.ok()) << share_mode_name(mode) << ": 540 positions cannot fit 512";
      EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << r.error().message;
      // The pass that would hold 513 positions is refused, whichever loop launched it.
      EXPECT_NE(r.error().message.find("context of 513 tokens exceeds the model's max_position_embeddings (512)"),
                std::string::npos)
          << r.error().message;
      errors.push_back(r.error().message);
      traj.push_back((*s)->trajectory());
      EXPECT_EQ(model_->pending_picks(), 0u) << share_mode_name(mode);
    }
    EXPECT_EQ(errors[1], errors[0]) << share_mode_name(mode);
    EXPECT_EQ(traj[1], traj[0]) << share_mode_name(mode);
  }
}

TEST_F(Workflow, StopsCleanlyWhenTheContextFills) {
  auto s = session(ShareMode::kBaseLr);
  ASSERT_TRUE(s);
  ToolEnv env(builtin_question());
  ReactOptions o = options();
  o.max_steps = 1000;  // only the context can end it
  auto r = run_react(*s, *tok_, env, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  // Greedy decoding on a fixed model: the tiny model never writes Finish, so the context ends it.
  ASSERT_EQ(r->stop_reason, "context_full");
  EXPECT_LE(r->trajectory_tokens, kContext);
}

TEST_F(Workflow, ClearErrorsForMissingAgentsBadOptionsAndAPromptTooLong) {
  {
    auto s = session(ShareMode::kNone, 2);  // plan and action only
    ToolEnv env(builtin_question());
    auto r = run_react(*s, *tok_, env, options());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
    EXPECT_NE(r.error().message.find("missing: reflect"), std::string::npos) << r.error().message;
  }
  {
    auto s = session(ShareMode::kNone);
    ToolEnv env(builtin_question());
    ReactOptions o = options();
    o.max_steps = 0;
    auto r = run_react(*s, *tok_, env, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("max_steps and the thought/action/reflect token budgets must be at least 1 (got 0,"),
              std::string::npos)
        << r.error().message;
  }
  {
    auto s = session(ShareMode::kNone);
    ToolEnv env(builtin_question());
    ReactOptions o = options();
    o.system_prompt = kReactSystemPrompt;
    auto r = run_react(*s, *tok_, env, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("the context holds 512"), std::string::npos) << r.error().message;
    EXPECT_LE(s->trajectory().size(), 1u) << "nothing is appended when the first turn cannot fit";
  }
  {
    auto s = session(ShareMode::kNone);
    s->append({5, 6, 7});
    ToolEnv env(builtin_question());
    auto r = run_react(*s, *tok_, env, options());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("needs a fresh session (its trajectory holds 4 tokens)"), std::string::npos)
        << r.error().message;
  }
}

// ---- `lragent run` ----

using testing::CliRun;

std::string quote(const std::string& s) { return testing::shell_quote(s); }

CliRun run_cli(const std::string& args) { return testing::run_lragent("run " + args); }

std::string agents_args() {
  const std::string a = testing::adapters_dir() + "/qv-shared-a-r8/";
  return "--model " + quote(testing::tinystories_dir()) + " --adapter plan=" + quote(a + "plan") +
         " --adapter action=" + quote(a + "action") + " --adapter reflect=" + quote(a + "reflect");
}

TEST(WorkflowCli, NamesTheMissingAdapters) {
  const CliRun r = run_cli("--workflow react --question 'Who?'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--adapter plan=DIR --adapter action=DIR --adapter reflect=DIR"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--model DIR"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(WorkflowCli, JsonRunOnAFileQuestion) {
  const std::string file = testing::shared_dir() + "/data/hotpotqa/questions-easy-medium-hard.json";
  const CliRun r =
      run_cli(agents_args() + " --kv-share base-lr --system-prompt compact --max-steps 2 --json --questions " +
              quote(file) + " --question-id 5a7a06935542990198eaf050");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["workflow"], "react");
  EXPECT_EQ(j["mode"], "base-lr");
  EXPECT_EQ(j["question"]["gold_answer"], "Arthur's Magazine");
  ASSERT_GE(j["turns"].size(), 2u);
  EXPECT_EQ(j["turns"][0]["agent"], "plan");
  EXPECT_TRUE(j["turns"][1].contains("tool"));
  ASSERT_EQ(j["agents"].size(), 3u);
  EXPECT_GT(j["cache"]["base_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["cache"]["lr_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["cache"]["full_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["trajectory_tokens"].get<int64_t>(), 0);
  EXPECT_LE(j["steps"].get<int>(), 2);
}

// --kv-memory below the private caches of none: agents' caches are dropped and recomputed; the
// turns are those of the unbudgeted run and the JSON counts the evictions.
TEST(WorkflowCli, KvMemoryEvictsAndKeepsTheTurns) {
  const std::string file = testing::shared_dir() + "/data/hotpotqa/questions-easy-medium-hard.json";
  const std::string args = agents_args() + " --kv-share none --system-prompt compact --max-steps 2 --json --questions " +
                           quote(file) + " --question-id 5a7a06935542990198eaf050";
  const CliRun free_run = run_cli(args);
  const CliRun budget = run_cli(args + " --kv-memory 0.00025");
  ASSERT_EQ(free_run.code, 0) << free_run.err;
  ASSERT_EQ(budget.code, 0) << budget.err;
  const auto f = nlohmann::json::parse(free_run.out), b = nlohmann::json::parse(budget.out);
  EXPECT_EQ(f["evictions"], 0);
  EXPECT_GT(b["evictions"].get<int64_t>(), 0);
  EXPECT_GT(b["evicted_tokens"].get<int64_t>(), 0);
  EXPECT_LT(b["cache_peak_total_bytes"].get<int64_t>(), f["cache_peak_total_bytes"].get<int64_t>());
  EXPECT_EQ(b["trajectory_tokens"], f["trajectory_tokens"]);
  ASSERT_EQ(b["turns"].size(), f["turns"].size());
  for (size_t i = 0; i < f["turns"].size(); ++i) EXPECT_EQ(b["turns"][i]["text"], f["turns"][i]["text"]) << "turn " << i;
  int64_t computed_free = 0, computed_budget = 0;
  for (const auto& a : f["agents"]) computed_free += a["computed_tokens"].get<int64_t>();
  for (const auto& a : b["agents"]) computed_budget += a["computed_tokens"].get<int64_t>();
  EXPECT_GT(computed_budget, computed_free) << "dropped caches are computed again";
}

TEST(WorkflowCli, PrintsTurnsAndASummaryTable) {
  const CliRun r = run_cli(agents_args() + " --kv-share none --system-prompt compact --max-steps 1 --question " +
                           quote(builtin_question().question));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("question (builtin-seine, easy)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1 plan   ] prefilled"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("agent    | turns | prefilled"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cache (none): base 0 B, lr 0 B, full "), std::string::npos) << r.out;
}

// A system prompt and question that cannot fit the context: the advice names the flags that
// help, --max-context only while the model's own 512 positions are not what binds.
TEST(WorkflowCli, ContextErrorsAdviseTheFlagsThatHelp) {
  const std::string q = " --kv-share none --max-steps 1 --question " + quote(builtin_question().question);
  CliRun r = run_cli(agents_args() + q);  // the built-in full prompt
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("the context holds 512; the built-in full prompt is long: try --system-prompt compact, or a "
                       "smaller --thought-tokens (the model's context is 512 positions)"),
            std::string::npos)
      << r.err;
  r = run_cli(agents_args() + q + " --system-prompt compact --max-context 40");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("the context holds 40; use a shorter system prompt or question, or a smaller "
                       "--thought-tokens, or a larger --max-context"),
            std::string::npos)
      << r.err;
}

// run_replay hands each step to on_step as it completes: every step once, in order, with the
// result it then returns.
TEST_F(Workflow, ReplayReportsEachStepAsItCompletes) {
  auto steps = parse_replay_script(R"({"steps": [{"append": "Once upon a time"}, {"agent": "plan", "generate": 3},
      {"append": " there was"}, {"agent": "action", "generate": 2}, {"agent": "plan", "force_tokens": [5, 6]}]})",
                                   "s.json");
  ASSERT_TRUE(steps.ok()) << steps.error().message;
  ReplayOptions o;
  o.sharing.mode = ShareMode::kBaseLr;
  std::vector<std::pair<size_t, StepResult>> seen;
  o.on_step = [&](size_t i, const StepResult& r) { seen.emplace_back(i, r); };
  std::vector<std::string> names;
  std::vector<const LoraAdapter*> ads;
  for (const auto& a : adapters_) {
    names.push_back(a->name);
    ads.push_back(a.get());
  }
  auto res = run_replay(*model_, tok_.get(), names, ads, *steps, o);
  ASSERT_TRUE(res.ok()) << res.error().message;
  ASSERT_EQ(seen.size(), steps->size());
  ASSERT_EQ(res->steps.size(), steps->size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, i);
    EXPECT_EQ(seen[i].second.agent, res->steps[i].agent) << i;
    EXPECT_EQ(seen[i].second.output_tokens, res->steps[i].output_tokens) << i;
    EXPECT_EQ(seen[i].second.prefilled_tokens, res->steps[i].prefilled_tokens) << i;
  }
  EXPECT_EQ(seen[1].second.output_tokens.size(), 3u);
  EXPECT_EQ(seen[4].second.output_tokens, (std::vector<int32_t>{5, 6}));
}

TEST(WorkflowCli, BadQuestionInputIsOneErrorLine) {
  const std::string dir = testing::temp_dir("workflow-cli-bad");
  CliRun r = run_cli(agents_args() + " --questions " + quote(dir + "/absent.json") + " --question-id x");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.err.find("absent.json: cannot open the questions file"), std::string::npos) << r.err;
  r = run_cli(agents_args() + " --question-id nope");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.err.find("no question has id 'nope' (ids: builtin-seine)"), std::string::npos) << r.err;
  r = run_cli(agents_args() + " --question 'Who?'");  // the full prompt does not fit 512 tokens
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--system-prompt compact"), std::string::npos) << r.err;
  r = run_cli(agents_args());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("exactly one of --question TEXT and --question-id ID"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lragent
