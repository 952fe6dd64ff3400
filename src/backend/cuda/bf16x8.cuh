// Device helpers shared by the GEMV kernels (gemv.cu, ops.cu's v1): the 8 bf16 values of one
// 16-byte weight chunk as floats, and their dot with 8 activations (two float4s).
#pragma once

#include <cuda_bf16.h>

namespace lragent::cuda {

__device__ __forceinline__ void bf16x8_to_float(const uint4& raw, float (&f)[8]) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(w2[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// Σ w[i] · x[i] over the chunk, x = (lo, hi), in the kernels' one summation order.
__device__ __forceinline__ float dot8(const float (&w)[8], const float4& lo, const float4& hi) {
  return w[0] * lo.x + w[1] * lo.y + w[2] * lo.z + w[3] * lo.w + w[4] * hi.x + w[5] * hi.y + w[6] * hi.z + w[7] * hi.w;
}

}  // namespace lragent::cuda
