#include "backend/sampling_ref.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace lragent {

int32_t argmax_row(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
  return static_cast<int32_t>(std::max<int64_t>(best, 0));
}

int32_t sample_row(const float* l, int64_t vocab, const RowSampling& p) {
  if (!(p.temperature > 0.f)) return argmax_row(l, vocab);
  float m = -std::numeric_limits<float>::infinity();
  int64_t n_finite = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isfinite(l[i])) {
      m = std::max(m, l[i]);
      ++n_finite;
    }
  if (n_finite == 0) return argmax_row(l, vocab);
  const float t = p.temperature;
  // f32, exactly the expression the device evaluates (see the header).
  auto weight = [m, t](float v) { return std::exp((v - m) / t); };

  // top-k: the k-th largest finite logit (with multiplicity) is the lowest one kept.
  float lowest = -std::numeric_limits<float>::infinity();  // kept: finite and >= lowest
  if (p.top_k > 0 && p.top_k < n_finite) {
    std::vector<float> fin;  // [n_finite]
    fin.reserve(static_cast<size_t>(n_finite));
    for (int64_t i = 0; i < vocab; ++i)
      if (std::isfinite(l[i])) fin.push_back(l[i]);
    std::nth_element(fin.begin(), fin.begin() + (p.top_k - 1), fin.end(), std::greater<float>());
    lowest = fin[static_cast<size_t>(p.top_k - 1)];
  }

  // top-p: walk the kept logits from the largest down, one group of equal logits at a time;
  // a group stays while the mass strictly above it is below top_p · W.
  if (p.top_p < 1.f) {
    std::vector<float> kept;  // [kept ids] their logits, sorted descending below
    double w_all = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (std::isfinite(l[i]) && l[i] >= lowest) {
        kept.push_back(l[i]);
        w_all += weight(l[i]);
      }
    std::sort(kept.begin(), kept.end(), std::greater<float>());
    const double limit = static_cast<double>(p.top_p) * w_all;
    double above = 0;  // mass of the groups with larger logits
    float top_p_lowest = m;  // the maximal logit(s) always stay
    for (size_t g = 0; g < kept.size();) {
      if (!(above < limit)) break;
      top_p_lowest = kept[g];
      size_t e = g;
      for (; e < kept.size() && kept[e] == kept[g]; ++e) above += weight(kept[e]);
      g = e;
    }
    lowest = top_p_lowest;
  }

  // The pick: prefix sums of the kept weights in id order.
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isfinite(l[i]) && l[i] >= lowest) total += weight(l[i]);
  const double target = static_cast<double>(p.u) * total;
  double run = 0;
  int64_t last_positive = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(l[i]) || l[i] < lowest) continue;
    const float w = weight(l[i]);
    run += w;
    if (w > 0.f) {
      if (run > target) return static_cast<int32_t>(i);
      last_positive = i;
    }
  }
  // Only reachable when u·W' rounds to W' or beyond (u >= 1 or NaN from a caller); the maximal
  // logit has weight 1, so some kept id has a positive weight.
  return static_cast<int32_t>(last_positive);
}

}  // namespace lragent
