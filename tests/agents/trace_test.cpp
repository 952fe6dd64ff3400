// Benchmark traces (agents/trace.h): exact final lengths, the real step structure, observations
// scaled in proportion, the pseudo tokenizer, determinism, and the trajectory file's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "agents/trace.h"
#include "test_util.h"

namespace lragent {
namespace {

constexpr int kVocab = 128256;
const std::vector<int64_t> kPosterLengths = {1900, 3000, 5000, 9100, 17300, 33700, 66400};

const TrajectoryBundle& bundle() {
  static const TrajectoryBundle b = [] {
    auto r = load_trajectory_bundle(testing::source_dir() + "/bench/trace/trajectories.json");
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(*r) : TrajectoryBundle{};
  }();
  return b;
}

int64_t appended(const Trace& t, const std::string& label) {
  int64_t n = 0;
  for (const TraceStep& s : t.steps)
    if (s.kind == TraceStep::Kind::kAppend && s.label == label) n += static_cast<int64_t>(s.tokens.size());
  return n;
}

TEST(PseudoTokenizer, FourBytesPerTokenHashedIntoTheVocabulary) {
  EXPECT_TRUE(pseudo_tokenize("", 512).empty());
  EXPECT_EQ(pseudo_tokenize("abc", 512).size(), 1u);
  EXPECT_EQ(pseudo_tokenize("abcd", 512).size(), 1u);
  EXPECT_EQ(pseudo_tokenize("abcde", 512).size(), 2u);
  EXPECT_EQ(pseudo_token_count("abcde"), 2);
  const auto same = pseudo_tokenize("abcdabcdwxyz", kVocab);
  ASSERT_EQ(same.size(), 3u);
  EXPECT_EQ(same[0], same[1]) << "equal chunks are equal tokens";
  EXPECT_NE(same[0], same[2]);
  std::set<int32_t> ids;
  for (int32_t id : pseudo_tokenize(bundle().trajectories.at(0).system_prompt, 512)) {
    EXPECT_GE(id, 3) << "ids 0-2 stay free for pad / BOS / EOS";
    EXPECT_LT(id, 512);
    ids.insert(id);
  }
  EXPECT_GT(ids.size(), 100u) << "hashing must spread the chunks over the vocabulary";
}

TEST(Trace, EveryTrajectoryHitsEveryPosterLengthExactly) {
  ASSERT_GE(bundle().trajectories.size(), 5u);
  for (const SourceTrajectory& src : bundle().trajectories) {
    std::vector<int64_t> lengths = kPosterLengths;
    const int64_t min = trace_min_tokens(src);
    for (int64_t extra : {0, 1, 7, 300}) lengths.push_back(min + extra);
    for (int64_t len : lengths) {
      auto t = make_trace(src, len, kVocab);
      ASSERT_TRUE(t.ok()) << src.id << " @ " << len << ": " << t.error().message;
      EXPECT_EQ(t->final_tokens(), len) << src.id;
      EXPECT_EQ(t->target_tokens, len);
      for (const TraceStep& s : t->steps)
        for (int32_t id : s.tokens) ASSERT_TRUE(id >= 3 && id < kVocab) << src.id;
    }
    auto too_short = make_trace(src, min - 1, kVocab);
    ASSERT_FALSE(too_short.ok()) << src.id;
    EXPECT_EQ(too_short.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(too_short.error().message.find("use at least " + std::to_string(min)), std::string::npos)
        << too_short.error().message;
  }
}

TEST(Trace, StepStructureIsTheRealEpisodes) {
  const SourceTrajectory& src = bundle().trajectories.at(0);
  auto t = make_trace(src, 9100, kVocab);
  ASSERT_TRUE(t.ok()) << t.error().message;
  // Header, then per round: Thought prefix, the plan (or reflect) call, Action prefix, the action
  // call, the observation.
  ASSERT_GE(t->steps.size(), 4u);
  EXPECT_EQ(t->steps[0].label, "system");
  EXPECT_EQ(t->steps[1].label, "question");
  std::map<std::string, int> calls;
  int observations = 0, k_plan = 0, k_reflect = 0;
  for (const TraceRound& r : src.rounds) (r.agent == "plan" ? k_plan : k_reflect)++;
  std::vector<std::string> order;
  for (const TraceStep& s : t->steps) {
    if (s.kind == TraceStep::Kind::kCall) {
      ++calls[s.agent];
      order.push_back(s.agent);
      const TraceRound& r = src.rounds.at(static_cast<size_t>(s.round - 1));
      // Decode lengths are the real texts' lengths at 4 bytes per token.
      const std::string real = s.agent == "plan"     ? " " + r.thought + "\n"
                               : s.agent == "action" ? " " + r.action + "\n"
                                                     : fmt::format(" {}\nAction {}: {}\n", r.thought, s.round, r.action);
      EXPECT_EQ(s.generate, pseudo_token_count(real)) << s.agent << " of round " << s.round;
    } else if (s.label == "observation") {
      ++observations;
    }
  }
  EXPECT_EQ(calls["plan"], k_plan);
  EXPECT_EQ(calls["action"], k_plan);
  EXPECT_EQ(calls["reflect"], k_reflect);
  EXPECT_GE(k_reflect, 1) << "the default trajectory ends with the reflect agent";
  EXPECT_EQ(order.back(), "reflect");
  EXPECT_EQ(order.front(), "plan");
  EXPECT_EQ(t->agent_calls(), 2 * k_plan + k_reflect);
  EXPECT_EQ(observations, static_cast<int>(std::count_if(src.rounds.begin(), src.rounds.end(),
                                                         [](const TraceRound& r) { return !r.observation.empty(); })));
  // Plan, action and reflect alternate as in the episode: plan is always followed by action.
  for (size_t i = 0; i + 1 < order.size(); ++i)
    if (order[i] == "plan") EXPECT_EQ(order[i + 1], "action");
}

TEST(Trace, OnlyRetrievalObservationsGrowAndInProportion) {
  const SourceTrajectory& src = bundle().trajectories.at(0);
  auto small = make_trace(src, 1900, kVocab);
  auto big = make_trace(src, 66400, kVocab);
  ASSERT_TRUE(small.ok() && big.ok());
  // Everything but the retrieval contents is fixed.
  EXPECT_EQ(small->system_tokens, small->system_tokens_full) << "1.9k keeps the whole system prompt";
  EXPECT_EQ(big->system_tokens, big->system_tokens_full);
  EXPECT_EQ(small->generated_tokens(), big->generated_tokens());
  EXPECT_EQ(small->agent_calls(), big->agent_calls());
  EXPECT_EQ(big->observation_tokens - small->observation_tokens, 66400 - 1900);
  EXPECT_EQ(appended(*big, "question"), appended(*small, "question"));
  // Retrieval contents are proportional to the real ones (largest remainder: within one token).
  std::vector<int64_t> real, scaled;
  for (const TraceStep& s : big->steps) {
    if (s.label != "observation") continue;
    const TraceRound& r = src.rounds.at(static_cast<size_t>(s.round - 1));
    const int64_t fixed = pseudo_token_count(fmt::format("Observation {}: ", s.round)) + 1;
    const int64_t content = static_cast<int64_t>(s.tokens.size()) - fixed;
    if (r.retrieval) {
      real.push_back(pseudo_token_count(r.observation));
      scaled.push_back(content);
    } else {
      EXPECT_EQ(content, pseudo_token_count(r.observation)) << "tool messages keep their size, round " << s.round;
    }
  }
  ASSERT_GE(real.size(), 2u);
  int64_t real_sum = 0, scaled_sum = 0;
  for (size_t i = 0; i < real.size(); ++i) real_sum += real[i], scaled_sum += scaled[i];
  EXPECT_EQ(scaled_sum, big->observation_tokens);
  for (size_t i = 0; i < real.size(); ++i) {
    const double exact = 1.0 + static_cast<double>(scaled_sum - static_cast<int64_t>(real.size())) *
                                   static_cast<double>(real[i]) / static_cast<double>(real_sum);
    EXPECT_NEAR(static_cast<double>(scaled[i]), exact, 1.0) << "observation " << i;
  }
}

TEST(Trace, ShortTargetsShrinkThePromptWithTheObservations) {
  const SourceTrajectory& src = bundle().trajectories.at(0);
  auto t = make_trace(src, 300, 512);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->final_tokens(), 300);
  EXPECT_LT(t->system_tokens, t->system_tokens_full);
  EXPECT_GE(t->observation_tokens, 1);
  // The prompt keeps its first tokens.
  const auto full = pseudo_tokenize(src.system_prompt, 512);
  ASSERT_EQ(t->steps[0].label, "system");
  EXPECT_TRUE(std::equal(t->steps[0].tokens.begin(), t->steps[0].tokens.end(), full.begin()));
  auto min = make_trace(src, trace_min_tokens(src), 512);
  ASSERT_TRUE(min.ok()) << min.error().message;
  EXPECT_EQ(min->system_tokens, 0);
  EXPECT_NE(min->steps[0].label, "system") << "an empty system prompt is no step";
}

TEST(Trace, DeterministicAndAReplayScript) {
  const SourceTrajectory& src = bundle().trajectories.at(1);
  auto a = make_trace(src, 5000, kVocab), b = make_trace(src, 5000, kVocab);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->to_json(), b->to_json());
  auto other_vocab = make_trace(src, 5000, 131072);
  ASSERT_TRUE(other_vocab.ok());
  EXPECT_NE(a->to_json()["steps"][0], other_vocab->to_json()["steps"][0]) << "ids depend on the vocabulary";
  // The JSON form is a `lragent replay` script with the same steps.
  nlohmann::json script = {{"steps", a->to_json()["steps"]}};
  auto steps = parse_replay_script(script.dump(), "trace.json");
  ASSERT_TRUE(steps.ok()) << steps.error().message;
  const auto direct = a->replay_steps();
  ASSERT_EQ(steps->size(), direct.size());
  for (size_t i = 0; i < direct.size(); ++i) {
    EXPECT_EQ((*steps)[i].kind, direct[i].kind);
    EXPECT_EQ((*steps)[i].tokens, direct[i].tokens);
    EXPECT_EQ((*steps)[i].generate, direct[i].generate);
    EXPECT_EQ((*steps)[i].agent, direct[i].agent);
  }
}

TEST(TrajectoryBundle, ErrorsNameTheFileAndTheField) {
  auto bad_json = parse_trajectory_bundle("{", "t.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(bad_json.error().message.find("t.json"), std::string::npos);
  auto no_list = parse_trajectory_bundle("{\"x\": 1}", "t.json");
  ASSERT_FALSE(no_list.ok());
  EXPECT_NE(no_list.error().message.find("\"trajectories\""), std::string::npos);
  const std::string bad_agent = R"({"trajectories": [{"id": "a", "question": "q", "system_prompt": "s", "rounds": [
      {"agent": "critic", "thought": "t", "action": "a", "observation": "o", "retrieval": false}]}]})";
  auto agent = parse_trajectory_bundle(bad_agent, "t.json");
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.error().message.find("trajectory 0 round 1"), std::string::npos) << agent.error().message;
  EXPECT_NE(agent.error().message.find("critic"), std::string::npos);
  auto missing = load_trajectory_bundle("/nonexistent/trajectories.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  // A trajectory without retrieval observations cannot be scaled.
  const std::string no_retrieval = R"({"trajectories": [{"id": "a", "question": "q", "system_prompt": "s", "rounds": [
      {"agent": "plan", "thought": "t", "action": "Finish[x]", "observation": "Please reflect your answer.", "retrieval": false}]}]})";
  auto nr = parse_trajectory_bundle(no_retrieval, "t.json");
  ASSERT_TRUE(nr.ok());
  auto t = make_trace(nr->trajectories[0], 100, 512);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("no retrieval observation"), std::string::npos);
}

}  // namespace
}  // namespace lragent
