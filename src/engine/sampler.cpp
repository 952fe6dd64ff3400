#include "engine/sampler.h"

#include <vector>

namespace lragent {

RowSampling Sampler::next_row() {
  RowSampling r{p_.temperature, p_.top_k, p_.top_p, 0.f};
  // The top 24 bits of one draw: every value is an exact f32 below 1 (a wider draw rounded to
  // f32 could become 1.0).
  if (!greedy()) r.u = static_cast<float>(rng_() >> 40) * 0x1.0p-24f;
  return r;
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

int32_t Sampler::sample(const float* logits, int vocab) { return sample_row(logits, vocab, next_row()); }

}  // namespace lragent
