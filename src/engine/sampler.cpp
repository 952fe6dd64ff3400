#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace lragent {

int32_t Sampler::argmax(const float* logits, int vocab) {
  // The rule of Backend::argmax_rows (the device-side greedy pick): lowest id on ties, NaN never
  // picked (an all-NaN row gives 0).
  int32_t best = -1;
  for (int i = 0; i < vocab; ++i)
    if (logits[i] == logits[i] && (best < 0 || logits[i] > logits[best])) best = i;
  return best < 0 ? 0 : best;
}

int32_t Sampler::sample(const float* logits, int vocab) {
  if (p_.temperature <= 0.f) return argmax(logits, vocab);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));  // [vocab] candidate ids, best first
  std::iota(idx.begin(), idx.end(), 0);
  size_t keep = idx.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) keep = static_cast<size_t>(p_.top_k);
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep), idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  idx.resize(keep);
  std::vector<double> prob(keep);  // [keep] softmax(logits / T) over the kept ids
  const double mx = logits[idx[0]] / p_.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += prob[i] = std::exp(logits[idx[i]] / p_.temperature - mx);
  for (double& v : prob) v /= sum;
  if (p_.top_p < 1.f) {
    // Smallest prefix whose mass reaches top_p (always at least one token).
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += prob[n++];
      if (cum >= p_.top_p) break;
    }
    prob.resize(n);
  }
  std::discrete_distribution<size_t> dist(prob.begin(), prob.end());
  return idx[dist(rng_)];
}

}  // namespace lragent
