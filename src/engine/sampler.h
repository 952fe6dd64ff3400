// Next-token sampling: greedy, temperature, top-k, top-p (HF order: temperature, top-k, top-p).
#pragma once

#include <cstdint>
#include <random>

namespace lragent {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;        // 1: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams p) : p_(p), rng_(p.seed) {}
  // logits: [vocab]. Greedy ties go to the lowest id (torch.argmax does the same).
  int32_t sample(const float* logits, int vocab);
  static int32_t argmax(const float* logits, int vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace lragent
