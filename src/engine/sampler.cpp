#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace lragent {

RowSampling Sampler::next_row() {
  RowSampling r{p_.temperature, p_.top_k, p_.top_p, 0.f};
  // The top 24 bits of one draw: every value is an exact f32 below 1 (a wider draw rounded to
  // f32 could become 1.0).
  if (!greedy()) r.u = static_cast<float>(rng_() >> 40) * 0x1.0p-24f;
  return r;
}

std::vector<RowSampling> Sampler::peek_rows(int n) const {
  Sampler ahead(*this);  // a copy of the generator's state: the draws are made on it
  std::vector<RowSampling> rows;
  for (int i = 0; i < n; ++i) rows.push_back(ahead.next_row());
  return rows;
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt, std::span<const int32_t> generated,
                     const PenaltyParams& p) {
  if (!p.active()) return;
  const auto vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> count(logits.size(), 0);  // [vocab] occurrences among the generated tokens
  std::vector<char> seen(logits.size(), 0);      // [vocab] occurs in the prompt or the generated tokens
  for (int32_t t : prompt)
    if (t >= 0 && t < vocab) seen[static_cast<size_t>(t)] = 1;
  for (int32_t t : generated)
    if (t >= 0 && t < vocab) {
      seen[static_cast<size_t>(t)] = 1;
      ++count[static_cast<size_t>(t)];
    }
  for (size_t t = 0; t < logits.size(); ++t) {
    float& x = logits[t];
    if (seen[t] && p.repetition != 1.f) x = x > 0 ? x / p.repetition : x * p.repetition;
    if (count[t] > 0) x -= p.frequency * static_cast<float>(count[t]) + p.presence;
  }
}

StepLogprobs step_logprobs(std::span<const float> logits, int32_t token, int top, bool with_rank) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto value = [&](size_t t) { return std::isnan(logits[t]) ? neg_inf : logits[t]; };
  float mx = neg_inf;
  for (size_t t = 0; t < logits.size(); ++t) mx = std::max(mx, value(t));
  // +inf logits share all the mass; else the usual log-sum-exp. All -inf (or empty): every
  // log-probability is -inf.
  const bool has_inf = std::isinf(mx) && mx > 0;
  double sum = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    if (has_inf) sum += value(t) == mx ? 1.0 : 0.0;
    else if (mx > neg_inf) sum += std::exp(static_cast<double>(value(t)) - mx);
  }
  const double lse = mx > neg_inf ? (has_inf ? 0.0 : static_cast<double>(mx)) + std::log(sum)
                                  : std::numeric_limits<double>::infinity();
  auto lp = [&](float x) {
    if (std::isnan(x)) return neg_inf;
    if (has_inf) return x == mx ? static_cast<float>(-lse) : neg_inf;
    return static_cast<float>(static_cast<double>(x) - lse);
  };
  StepLogprobs out;
  out.logprob = token >= 0 && static_cast<size_t>(token) < logits.size() ? lp(logits[static_cast<size_t>(token)]) : neg_inf;
  const size_t k = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (k > 0) {
    std::vector<int32_t> ids(logits.size());  // [vocab]
    for (size_t t = 0; t < ids.size(); ++t) ids[t] = static_cast<int32_t>(t);
    auto higher = [&](int32_t a, int32_t b) {
      const float va = value(static_cast<size_t>(a)), vb = value(static_cast<size_t>(b));
      return va != vb ? va > vb : a < b;
    };
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), higher);
    for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], lp(value(static_cast<size_t>(ids[i])))});
  }
  if (with_rank && token >= 0 && static_cast<size_t>(token) < logits.size()) {
    const float v = value(static_cast<size_t>(token));
    out.rank = 1;
    for (size_t t = 0; t < logits.size(); ++t) out.rank += value(t) > v ? 1 : 0;
  }
  return out;
}

int32_t Sampler::sample(const float* logits, int vocab) { return sample_row(logits, vocab, next_row()); }

}  // namespace lragent
