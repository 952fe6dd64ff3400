// The arithmetic of one RoPE rotation pair and of Qwen3's per-head q/k RMSNorm, shared by the
// RoPE and norm kernels (ops_rope_store.cu) and the v4 decode kernel that norms and rotates a decode step's
// q and k itself (attention_v4_decode.cu, DecodeRopeStore): both must give the same bits, so the
// products and sums are written as explicit roundings instead of leaving their contraction to
// the compiler at each call site.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lragent::cuda {

// sin and cos of the rotation angle pos · inv_freq (inv_freq: the pair's frequency, llama3
// scaling already applied by the host).
__device__ __forceinline__ void rope_sincos(int32_t pos, float inv_freq, float& sn, float& cs) {
  sincosf(__fmul_rn(static_cast<float>(pos), inv_freq), &sn, &cs);
}

// Elements i and i + head_dim / 2 of a row (a, b), rotated: (a·cos − b·sin, b·cos + a·sin).
__device__ __forceinline__ float2 rope_rotate(float a, float b, float cs, float sn) {
  return make_float2(__fmaf_rn(a, cs, -__fmul_rn(b, sn)), __fmaf_rn(b, cs, __fmul_rn(a, sn)));
}

// 1 / rms of one head row held by a warp, lane l holding elements l + 32u (u < kPer; zeros past
// head_dim hd), on every lane: the sum of squares in u order, then the xor tree over the lanes.
template <int kPer>
__device__ __forceinline__ float warp_inv_rms(const float (&v)[kPer], int hd, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) ss = __fmaf_rn(v[u], v[u], ss);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, off));
  return 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);  // as the CPU's rms_norm
}

// Element j of a [head_dim] norm weight stored as bf16 (bf) or f32.
__device__ __forceinline__ float norm_weight(const void* w, bool bf, int j) {
  return bf ? __bfloat162float(static_cast<const __nv_bfloat16*>(w)[j]) : static_cast<const float*>(w)[j];
}

// A normed element: w · (x · inv).
__device__ __forceinline__ float normed(float x, float inv, float w) { return __fmul_rn(w, __fmul_rn(x, inv)); }

}  // namespace lragent::cuda
