// step_logprobs against log_softmax worked out here in long double, and its edge rules: ties
// (lower id first), NaN (never a top entry), +inf (shares all the mass), a top count over the
// vocabulary, a token outside it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/sampler.h"

namespace lragent {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(StepLogprobs, AreLogSoftmaxWithTheTopEntriesInOrder) {
  const std::vector<float> logits = {1.f, 3.f, -2.f, 2.5f, 0.f};
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x));
  auto want = [&](int i) { return static_cast<double>(logits[static_cast<size_t>(i)] - std::log(sum)); };
  const StepLogprobs lp = step_logprobs(logits, 0, 3);
  EXPECT_NEAR(lp.logprob, want(0), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  const int order[] = {1, 3, 0};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lp.top[i].id, order[i]);
    EXPECT_NEAR(lp.top[i].logprob, want(order[i]), 1e-6);
  }
  // The probabilities sum to 1.
  double total = 0;
  for (int i = 0; i < 5; ++i) total += std::exp(step_logprobs(logits, i, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_TRUE(step_logprobs(logits, 2, 0).top.empty());
}

// Large logits: computed around the maximum, no overflow.
TEST(StepLogprobs, LargeLogitsDoNotOverflow) {
  const std::vector<float> logits = {1000.f, 999.f, -1000.f};
  const StepLogprobs lp = step_logprobs(logits, 1, 1);
  const double lse = 1000.0 + std::log(1.0 + std::exp(-1.0));
  EXPECT_NEAR(lp.logprob, 999.0 - lse, 1e-4);
  EXPECT_NEAR(lp.top[0].logprob, 1000.0 - lse, 1e-4);
  EXPECT_LT(step_logprobs(logits, 2, 0).logprob, -1999.f);
}

TEST(StepLogprobs, EdgeRules) {
  // Ties: the lower id first.
  StepLogprobs lp = step_logprobs(std::vector<float>{0.5f, 2.f, 2.f, 2.f}, 3, 2);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].id, 1);
  EXPECT_EQ(lp.top[1].id, 2);
  EXPECT_FLOAT_EQ(lp.logprob, lp.top[0].logprob);
  // NaN is -inf: never a top entry, no share of the mass.
  lp = step_logprobs(std::vector<float>{std::nanf(""), 0.f, 0.f}, 0, 3);
  EXPECT_EQ(lp.logprob, -kInf);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].id, 1);
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(lp.top[2].id, 0);
  EXPECT_EQ(lp.top[2].logprob, -kInf);
  // +inf logits share all the mass.
  lp = step_logprobs(std::vector<float>{kInf, 0.f, kInf}, 2, 3);
  EXPECT_NEAR(lp.logprob, std::log(0.5), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].id, 0);
  EXPECT_EQ(lp.top[2].logprob, -kInf);
  // All -inf: every log-probability is -inf, nothing is NaN.
  lp = step_logprobs(std::vector<float>{-kInf, -kInf}, 0, 2);
  EXPECT_EQ(lp.logprob, -kInf);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[1].logprob, -kInf);
  // A top count over the vocabulary gives the whole vocabulary; a token outside it is -inf.
  EXPECT_EQ(step_logprobs(std::vector<float>{1.f, 2.f}, 0, 50).top.size(), 2u);
  EXPECT_EQ(step_logprobs(std::vector<float>{1.f, 2.f}, 7, 0).logprob, -kInf);
  EXPECT_EQ(step_logprobs(std::vector<float>{1.f, 2.f}, -1, 0).logprob, -kInf);
}

}  // namespace
}  // namespace lragent
