#include "model/rope.h"

#include <cmath>
#include <numbers>

namespace lragent {

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in f32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(cfg.head_dim);
    const float p = std::pow(static_cast<float>(cfg.rope_theta), expo);
    inv[static_cast<size_t>(i)] = 1.0f / p;
  }
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "linear") {
    for (auto& f : inv) f = static_cast<float>(f / rs.factor);
  } else if (rs.type == "llama3") {
    const double old_ctx = rs.original_max_position_embeddings;
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rs.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / rs.factor + smooth * f);
      }
    }
  }
  return inv;
}

}  // namespace lragent
