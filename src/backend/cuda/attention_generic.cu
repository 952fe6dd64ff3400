// The generic attention (see ops.cuh): any head_dim <= 256 and LoRA rank <= 128, f32 or bf16
// paged caches, one block per (query, head) with an exact online softmax. The CUDA backend's
// fallback for shapes the tuned kernels (attention*.cu) do not take.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/ops.cuh"
#include "backend/cuda/ops_common.cuh"

namespace lragent::cuda {
namespace {

constexpr int kAttnThreads = 128;  // keys per tile = threads
constexpr int kMaxHeadDim = 256, kMaxRank = 128;

__global__ void __launch_bounds__(kAttnThreads) attention_generic_kernel(const GenericAttnParams p) {
  __shared__ float q_s[kMaxHeadDim];    // [head_dim] this query's head
  __shared__ float acc_s[kMaxHeadDim];  // [head_dim] Σ p_j · V_base_j (unnormalised)
  __shared__ float olr_s[kMaxRank];     // [rank_v] Σ p_j · LRv_j
  __shared__ float p_s[kAttnThreads];   // [tile] probabilities of the tile's keys
  __shared__ float red[32];
  const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int hd = p.head_dim, half = hd / 2;
  const int g = h / (p.n_heads / p.n_kv_heads);
  const int64_t n_keys = static_cast<int64_t>(p.q_pos[i]) + 1;
  const bool k_lr = p.k_lr.b != nullptr && p.k_lr.rank > 0;
  const bool v_lr = p.v_lr.b != nullptr && p.v_lr.rank > 0;
  for (int d = tid; d < hd; d += kAttnThreads) {
    q_s[d] = p.q[(static_cast<int64_t>(i) * p.n_heads + h) * hd + d];
    acc_s[d] = 0.f;
  }
  for (int r = tid; r < p.v_lr.rank && v_lr; r += kAttnThreads) olr_s[r] = 0.f;
  __syncthreads();

  float m = -FLT_MAX, l = 0.f;
  for (int64_t t0 = 0; t0 < n_keys; t0 += kAttnThreads) {
    const int64_t j = t0 + tid;
    float s = -FLT_MAX;
    if (j < n_keys) {
      const int64_t krow = paged_row(p.k, j) + static_cast<int64_t>(g) * hd;
      float dot = 0.f;
      if (!k_lr) {
        for (int d = 0; d < hd; ++d) dot += q_s[d] * load_elem(p.k.data, p.k.dtype, krow + d);
      } else {
        // K_j = K_base_j + RoPE_j(s · LRk_j · B_k^T), one rotation pair (d, d + half) at a time.
        const int64_t lrow = paged_row(p.k_lr.lr, j);
        for (int d = 0; d < half; ++d) {
          float da = 0.f, db = 0.f;
          const int64_t ba = (static_cast<int64_t>(g) * hd + d) * p.k_lr.rank;
          const int64_t bb = ba + static_cast<int64_t>(half) * p.k_lr.rank;
          for (int r = 0; r < p.k_lr.rank; ++r) {
            const float x = load_elem(p.k_lr.lr.data, p.k_lr.lr.dtype, lrow + r);
            da += x * load_elem(p.k_lr.b, p.k_lr.b_dtype, ba + r);
            db += x * load_elem(p.k_lr.b, p.k_lr.b_dtype, bb + r);
          }
          da *= p.k_lr.scale;
          db *= p.k_lr.scale;
          float sn, cs;
          sincosf(static_cast<float>(j) * p.inv_freq[d], &sn, &cs);
          const float ka = load_elem(p.k.data, p.k.dtype, krow + d) + (da * cs - db * sn);
          const float kb = load_elem(p.k.data, p.k.dtype, krow + d + half) + (db * cs + da * sn);
          dot += q_s[d] * ka + q_s[d + half] * kb;
        }
      }
      s = dot * p.softmax_scale;
    }
    const float m_new = fmaxf(m, block_max(s, red));
    const float pj = j < n_keys ? expf(s - m_new) : 0.f;
    const float tile_sum = block_sum(pj, red);
    const float corr = expf(m - m_new);
    l = l * corr + tile_sum;
    m = m_new;
    p_s[tid] = pj;
    __syncthreads();
    const int n_tile = static_cast<int>(n_keys - t0 < kAttnThreads ? n_keys - t0 : kAttnThreads);
    for (int d = tid; d < hd; d += kAttnThreads) {
      float a = acc_s[d] * corr;
      for (int jj = 0; jj < n_tile; ++jj)
        a += p_s[jj] * load_elem(p.v.data, p.v.dtype, paged_row(p.v, t0 + jj) + static_cast<int64_t>(g) * hd + d);
      acc_s[d] = a;
    }
    if (v_lr) {
      for (int r = tid; r < p.v_lr.rank; r += kAttnThreads) {
        float a = olr_s[r] * corr;
        for (int jj = 0; jj < n_tile; ++jj)
          a += p_s[jj] * load_elem(p.v_lr.lr.data, p.v_lr.lr.dtype, paged_row(p.v_lr.lr, t0 + jj) + r);
        olr_s[r] = a;
      }
    }
    __syncthreads();
  }
  // O = (Σ p·V_base + s·(Σ p·LRv)·B_v^T) / Σ p: the low-rank term expanded once per query.
  const float inv_l = 1.0f / l;
  for (int d = tid; d < hd; d += kAttnThreads) {
    float o = acc_s[d];
    if (v_lr) {
      const int64_t brow = (static_cast<int64_t>(g) * hd + d) * p.v_lr.rank;
      float e = 0.f;
      for (int r = 0; r < p.v_lr.rank; ++r) e += olr_s[r] * load_elem(p.v_lr.b, p.v_lr.b_dtype, brow + r);
      o += p.v_lr.scale * e;
    }
    p.out[(static_cast<int64_t>(i) * p.n_heads + h) * hd + d] = o * inv_l;
  }
}

}  // namespace

cudaError_t attention_generic(const GenericAttnParams& p, cudaStream_t s) {
  if (p.head_dim <= 0 || p.head_dim > kMaxHeadDim || p.head_dim % 2 != 0 || p.v_lr.rank > kMaxRank ||
      p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0)
    return cudaErrorInvalidValue;
  if (p.k_lr.b && p.k_lr.rank > 0 && !p.inv_freq) return cudaErrorInvalidValue;
  if (p.n_q == 0) return cudaSuccess;
  attention_generic_kernel<<<dim3(static_cast<unsigned>(p.n_q), static_cast<unsigned>(p.n_heads)), kAttnThreads, 0,
                             s>>>(p);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
