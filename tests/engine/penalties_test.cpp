// vLLM's penalties on a row of logits, against values worked out by hand from vLLM's rules.
#include <gtest/gtest.h>

#include <vector>

#include "engine/sampler.h"

namespace lragent {
namespace {

TEST(Penalties, FollowVllmsRules) {
  // ids:                          0     1     2     3     4
  std::vector<float> logits = {2.f, -1.f, 3.f, 0.5f, -2.f};
  const std::vector<int32_t> prompt = {0, 1, 99};   // 99: outside the vocabulary, ignored
  const std::vector<int32_t> generated = {2, 2, 1};  // counts: 1 -> 1, 2 -> 2
  PenaltyParams p;
  p.repetition = 2.f;
  p.frequency = 0.5f;
  p.presence = 0.25f;
  apply_penalties(logits, prompt, generated, p);
  EXPECT_FLOAT_EQ(logits[0], 1.f);                      // prompt only: 2 / 2
  EXPECT_FLOAT_EQ(logits[1], -2.f - 0.5f - 0.25f);      // -1 * 2, then 1 x frequency + presence
  EXPECT_FLOAT_EQ(logits[2], 1.5f - 2 * 0.5f - 0.25f);  // 3 / 2, then 2 x frequency + presence
  EXPECT_FLOAT_EQ(logits[3], 0.5f);                     // never seen
  EXPECT_FLOAT_EQ(logits[4], -2.f);
}

TEST(Penalties, NeutralValuesChangeNothing) {
  std::vector<float> logits = {2.f, -1.f, 3.f};
  const std::vector<float> before = logits;
  PenaltyParams p;
  EXPECT_FALSE(p.active());
  apply_penalties(logits, std::vector<int32_t>{0, 1}, std::vector<int32_t>{2}, p);
  EXPECT_EQ(logits, before);
  p.presence = -0.5f;  // negative penalties reward repeats
  EXPECT_TRUE(p.active());
  apply_penalties(logits, std::vector<int32_t>{0, 1}, std::vector<int32_t>{2}, p);
  EXPECT_FLOAT_EQ(logits[2], 3.5f);
  EXPECT_FLOAT_EQ(logits[0], 2.f);  // presence counts generated tokens only
}

}  // namespace
}  // namespace lragent
