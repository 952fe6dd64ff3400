#include "engine/sampler.h"

namespace lragent {

RowSampling Sampler::next_row() {
  RowSampling r{p_.temperature, p_.top_k, p_.top_p, 0.f};
  // The top 24 bits of one draw: every value is an exact f32 below 1 (a wider draw rounded to
  // f32 could become 1.0).
  if (!greedy()) r.u = static_cast<float>(rng_() >> 40) * 0x1.0p-24f;
  return r;
}

int32_t Sampler::sample(const float* logits, int vocab) { return sample_row(logits, vocab, next_row()); }

}  // namespace lragent
