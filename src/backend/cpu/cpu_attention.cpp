// CPU reference attention. Exact two-pass softmax in f32; the low-rank terms are applied
// in the Flash-LoRA order (attend in rank space, expand once per query) so this is both the
// fast CPU path and the reference the CUDA kernels are checked against.
#include "backend/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace lragent {

void cpu_rope_rows(float* x, int64_t heads, int64_t head_dim, int32_t pos, const float* inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // Same rounding as HF: the angle is an f32 product, cos/sin in f32.
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

namespace {

// K_eff[j, g, :] = K_base[j, g, :] + RoPE_j(scale · LRk_j · B_k^T[g]) for all context tokens:
// the deferred-RoPE reconstruction of K-side LoRA (exact by linearity of RoPE).
std::vector<float> reconstruct_keys(const AttentionParams& p, ThreadPool& pool) {
  const int64_t width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  std::vector<float> keys(static_cast<size_t>(p.n_ctx * width));  // [n_ctx, n_kv_heads, head_dim]
  const LowRankTerm& t = p.k_lr;
  pool.parallel_for(p.n_ctx, 16, [&](int64_t b, int64_t e) {
    std::vector<float> delta(static_cast<size_t>(width));  // [n_kv_heads, head_dim]
    for (int64_t j = b; j < e; ++j) {
      const float* lr = t.lr.row(j);  // [rank]
      for (int64_t o = 0; o < width; ++o) {
        const float* brow = t.b_f32() + o * t.rank;
        float acc = 0.f;
        for (int r = 0; r < t.rank; ++r) acc += lr[r] * brow[r];
        delta[static_cast<size_t>(o)] = t.scale * acc;
      }
      cpu_rope_rows(delta.data(), p.n_kv_heads, p.head_dim, static_cast<int32_t>(j), p.inv_freq);
      const float* kb = p.k.row(j);
      float* dst = keys.data() + j * width;
      for (int64_t o = 0; o < width; ++o) dst[o] = kb[o] + delta[static_cast<size_t>(o)];
    }
  });
  return keys;
}

}  // namespace

void cpu_attention(const AttentionParams& p, ThreadPool& pool) {
  const int hd = p.head_dim;
  const int group = p.n_heads / p.n_kv_heads;
  const int64_t width = static_cast<int64_t>(p.n_kv_heads) * hd;
  std::vector<float> keys;
  if (p.k_lr.active()) keys = reconstruct_keys(p, pool);
  auto key_row = [&](int64_t j) -> const float* { return keys.empty() ? p.k.row(j) : keys.data() + j * width; };

  const int64_t tasks = static_cast<int64_t>(p.n_q) * p.n_heads;
  pool.parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores(static_cast<size_t>(p.n_ctx));      // [n_ctx]
    std::vector<float> o_lr(static_cast<size_t>(p.v_lr.rank));    // [rank]
    for (int64_t task = b; task < e; ++task) {
      const int64_t i = task / p.n_heads;
      const int h = static_cast<int>(task % p.n_heads);
      const int g = h / group;
      const float* q = p.q + (i * p.n_heads + h) * hd;
      const int64_t n_keys = static_cast<int64_t>(p.q_pos[i]) + 1;
      assert(n_keys <= p.n_ctx && "query position beyond the cached context");
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* k = key_row(j) + g * hd;
        float s = 0.f;
        for (int d = 0; d < hd; ++d) s += q[d] * k[d];
        s *= p.softmax_scale;
        scores[static_cast<size_t>(j)] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < n_keys; ++j) {
        float& s = scores[static_cast<size_t>(j)];
        s = std::exp(s - mx);
        sum += s;
      }
      const float inv_sum = 1.0f / sum;
      float* out = p.out + (i * p.n_heads + h) * hd;
      std::fill(out, out + hd, 0.f);
      for (int64_t j = 0; j < n_keys; ++j) {
        const float w = scores[static_cast<size_t>(j)];
        const float* v = p.v.row(j) + g * hd;
        for (int d = 0; d < hd; ++d) out[d] += w * v[d];
      }
      if (p.v_lr.active()) {
        // O += (P · LRv) · (scale · B_v^T): attend in rank space, expand once.
        const LowRankTerm& t = p.v_lr;
        std::fill(o_lr.begin(), o_lr.end(), 0.f);
        for (int64_t j = 0; j < n_keys; ++j) {
          const float w = scores[static_cast<size_t>(j)];
          const float* lr = t.lr.row(j);
          for (int r = 0; r < t.rank; ++r) o_lr[static_cast<size_t>(r)] += w * lr[r];
        }
        for (int d = 0; d < hd; ++d) {
          const float* brow = t.b_f32() + (static_cast<int64_t>(g) * hd + d) * t.rank;
          float acc = 0.f;
          for (int r = 0; r < t.rank; ++r) acc += o_lr[static_cast<size_t>(r)] * brow[r];
          out[d] += t.scale * acc;
        }
      }
      for (int d = 0; d < hd; ++d) out[d] *= inv_sum;
    }
  });
}

}  // namespace lragent
