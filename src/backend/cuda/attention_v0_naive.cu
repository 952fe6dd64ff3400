// v0: the CUDA oracle. One 128-thread block per (query, head, sequence); scalar f32
// arithmetic, online softmax over chunks of 128 keys (one key per thread), the K residual
// reconstructed per key (deferred RoPE) and the V low-rank term attended in rank space and
// expanded once at the end, exactly as cpu_attention does. Slow, obviously right; every
// faster version is tested against the CPU reference and can be diffed against this one.
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"

#include <cmath>

namespace lragent::cuda {
namespace {

using namespace detail;

constexpr int kV0Threads = 128;
constexpr int kMaxRank = 64;

__device__ float block_reduce(float v, bool is_max, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red[] may still be read from the previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kV0Threads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

template <int D>
__global__ void __launch_bounds__(kV0Threads) attn_v0_kernel(const AttnParams p) {
  const int i = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const SeqInfo si = seq_info(p, s);
  if (i >= si.n_q) return;
  const int tid = threadIdx.x;
  const int group = p.n_heads / p.n_kv_heads, g = h / group;
  const int n_keys = query_pos(p, si, i) + 1;
  const int adapter = agent_of(p, si, i);
  const bool klr = p.k_lr.active(), vlr = p.v_lr.active();
  const int kshift = ilog2(p.k.page_size), vshift = ilog2(p.v.page_size);
  const int lkshift = klr ? ilog2(p.k_lr.lr.page_size) : 0, lvshift = vlr ? ilog2(p.v_lr.lr.page_size) : 0;

  __shared__ float q_s[D];
  __shared__ float p_s[kV0Threads];
  __shared__ float olr_s[kMaxRank];
  __shared__ float red[kV0Threads / 32];

  const bf16* qrow = p.q + (static_cast<int64_t>(si.q0 + i) * p.n_heads + h) * D;
  for (int d = tid; d < D; d += kV0Threads) q_s[d] = __bfloat162float(qrow[d]);
  __syncthreads();

  const bf16* bk =
      klr ? p.k_lr.b + adapter * p.k_lr.b_agent_stride + static_cast<int64_t>(g) * D * p.k_lr.rank : nullptr;
  const bf16* bv =
      vlr ? p.v_lr.b + adapter * p.v_lr.b_agent_stride + static_cast<int64_t>(g) * D * p.v_lr.rank : nullptr;

  float m = -INFINITY, l = 0.f, acc = 0.f, acc_lr = 0.f;
  for (int c0 = 0; c0 < n_keys; c0 += kV0Threads) {
    const int j = c0 + tid;
    float sc = -INFINITY;
    if (j < n_keys) {
      const bf16* kb = p.k.data + paged_offset(p.k, s, j, kshift) + g * D;
      float dot = 0.f;
      if (klr) {
        const bf16* lr = p.k_lr.lr.data + paged_offset(p.k_lr.lr, s, j, lkshift);
        const int rank = p.k_lr.rank;
        for (int d = 0; d < D / 2; ++d) {
          float x1 = 0.f, x2 = 0.f;
          for (int r = 0; r < rank; ++r) {
            const float a = __bfloat162float(lr[r]);
            x1 += a * __bfloat162float(bk[d * rank + r]);
            x2 += a * __bfloat162float(bk[(d + D / 2) * rank + r]);
          }
          x1 *= p.k_lr.scale;
          x2 *= p.k_lr.scale;
          const float angle = static_cast<float>(j) * p.inv_freq[d];
          float sn, cs;
          sincosf(angle, &sn, &cs);
          const float k1 = __bfloat162float(kb[d]) + (x1 * cs - x2 * sn);
          const float k2 = __bfloat162float(kb[d + D / 2]) + (x2 * cs + x1 * sn);
          dot += q_s[d] * k1 + q_s[d + D / 2] * k2;
        }
      } else {
        for (int d = 0; d < D; ++d) dot += q_s[d] * __bfloat162float(kb[d]);
      }
      sc = dot * p.softmax_scale;
    }
    const float m_new = fmaxf(m, block_reduce(sc, true, red));  // finite: key c0 is valid
    const float alpha = expf(m - m_new);
    const float pj = j < n_keys ? expf(sc - m_new) : 0.f;
    l = l * alpha + block_reduce(pj, false, red);
    m = m_new;
    p_s[tid] = pj;
    __syncthreads();
    const int cnt = min(kV0Threads, n_keys - c0);
    if (tid < D) {
      float a = 0.f;
      for (int jj = 0; jj < cnt; ++jj)
        a += p_s[jj] * __bfloat162float(p.v.data[paged_offset(p.v, s, c0 + jj, vshift) + g * D + tid]);
      acc = acc * alpha + a;
    }
    if (vlr && tid < p.v_lr.rank) {
      float a = 0.f;
      for (int jj = 0; jj < cnt; ++jj)
        a += p_s[jj] * __bfloat162float(p.v_lr.lr.data[paged_offset(p.v_lr.lr, s, c0 + jj, lvshift) + tid]);
      acc_lr = acc_lr * alpha + a;
    }
    __syncthreads();
  }
  if (vlr) {
    if (tid < p.v_lr.rank) olr_s[tid] = acc_lr;
    __syncthreads();
    if (tid < D) {
      float e = 0.f;
      for (int r = 0; r < p.v_lr.rank; ++r) e += olr_s[r] * __bfloat162float(bv[tid * p.v_lr.rank + r]);
      acc += p.v_lr.scale * e;
    }
  }
  if (tid < D) {
    const float o = acc / l;
    const int64_t off = (static_cast<int64_t>(si.q0 + i) * p.n_heads + h) * D + tid;
    if (p.out) p.out[off] = __float2bfloat16(o);
    if (p.out_f32) p.out_f32[off] = o;
  }
}

}  // namespace

cudaError_t attention_v0(const AttnParams& p) {
  note_attention_kernel(AttnKernel::kV0Naive);
  const dim3 grid(p.max_q, p.n_heads, p.n_seqs);
  if (p.head_dim == 64) {
    attn_v0_kernel<64><<<grid, kV0Threads, 0, p.stream>>>(p);
  } else {
    attn_v0_kernel<128><<<grid, kV0Threads, 0, p.stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace lragent::cuda
