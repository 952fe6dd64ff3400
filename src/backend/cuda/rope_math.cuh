// The arithmetic of one RoPE rotation pair, shared by the RoPE kernels (ops.cu) and the v4
// decode kernel that rotates a decode step's q and k itself (attention_v4_decode.cu,
// DecodeRopeStore): both must give the same bits, so the products and sums are written as
// explicit roundings instead of leaving their contraction to the compiler at each call site.
#pragma once

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

}  // namespace lragent::cuda
