// The arithmetic of one LoRA expand element, shared by lora_expand_kernel (lora.cu) and the K/V
// stores that compute a held-back expand's rows on the fly (ops.cu, StoreJobDev::lora): both
// must give the same bits, so the sum runs in rank order with explicit FMAs in one place.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/ops.cuh"

namespace lragent::cuda {

// b[o, k] of job jb as f32 (bf16 or f32 storage).
__device__ __forceinline__ float lora_b_at(const LoraJob& jb, int64_t o, int k) {
  return jb.b_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(jb.b)[o * jb.ldb + k])
                   : static_cast<const float*>(jb.b)[o * jb.ldb + k];
}

// y[r, o] of job jb: base[r, o] (or y's own value when base is null) + scale · Σ_k xa[r, k] · b[o, k].
// b_at(k) gives b[o, k] (registers in the expand kernel, a load in the stores).
template <class BAt>
__device__ __forceinline__ float lora_expand_value(const LoraJob& jb, int r, int64_t o, BAt b_at) {
  float acc = 0.f;
  if (jb.xa) {
    const float* xr = jb.xa + r * jb.ldxa;
#pragma unroll
    for (int k = 0; k < kMaxLoraRank; ++k)
      if (k < jb.rank) acc = fmaf(__ldg(xr + k), b_at(k), acc);
  }
  const float prev = jb.base ? jb.base[r * jb.ldbase + o] : jb.y[r * jb.ldy + o];
  return fmaf(jb.scale, acc, prev);
}

}  // namespace lragent::cuda
