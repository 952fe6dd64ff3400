// The arithmetic of one LoRA expand element, shared by lora_expand_kernel (lora.cu) and the K/V
// stores that compute a held-back expand's rows on the fly (ops_rope_store.cu, StoreJobDev::lora): both
// must give the same bits, so the sum runs in rank order with explicit FMAs in one place. Also the
// loads of LoRA matrix rows those and the RoPE's q term (ops_rope_store.cu) use.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/ops.cuh"

namespace lragent::cuda {

// w[u] = m[i0 + u] for u < n (<= 16), 0 beyond: 16 values of a LoRA matrix row (a B row's ranks,
// or an x·A row) as f32, from bf16 (bf) or f32 storage. Whole, 16-byte-aligned chunks load as
// 16-byte vectors: in the decode kernels a warp's 32 threads read 32 consecutive B rows, and
// element-wise loads made every one of those 16 loads touch the warp's whole kilobyte again
// (16x the L1 wavefronts; the RoPE with a q LoRA term took 5.7 against 2.5 us a layer, H200).
// The values are the same either way.
__device__ __forceinline__ void lora_load16(const void* m, bool bf, int64_t i0, int n, float (&w)[16]) {
  if (bf) {
    const __nv_bfloat16* p = static_cast<const __nv_bfloat16*>(m) + i0;
    if (n == 16 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
      const uint4 c0 = *reinterpret_cast<const uint4*>(p), c1 = *reinterpret_cast<const uint4*>(p + 8);
      const __nv_bfloat162* h0 = reinterpret_cast<const __nv_bfloat162*>(&c0);
      const __nv_bfloat162* h1 = reinterpret_cast<const __nv_bfloat162*>(&c1);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float2 a = __bfloat1622float2(h0[u]), b = __bfloat1622float2(h1[u]);
        w[2 * u] = a.x;
        w[2 * u + 1] = a.y;
        w[8 + 2 * u] = b.x;
        w[8 + 2 * u + 1] = b.y;
      }
      return;
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) w[u] = u < n ? __bfloat162float(p[u]) : 0.f;
    return;
  }
  const float* p = static_cast<const float*>(m) + i0;
  if (n == 16 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float4 c = reinterpret_cast<const float4*>(p)[u];
      w[4 * u] = c.x;
      w[4 * u + 1] = c.y;
      w[4 * u + 2] = c.z;
      w[4 * u + 3] = c.w;
    }
    return;
  }
#pragma unroll
  for (int u = 0; u < 16; ++u) w[u] = u < n ? p[u] : 0.f;
}

// b[o, 0..rank) of job jb into bv (zeros past the rank), 16 ranks per lora_load16.
__device__ __forceinline__ void lora_b_row(const LoraJob& jb, int64_t o, float (&bv)[kMaxLoraRank]) {
  static_assert(kMaxLoraRank % 16 == 0, "ranks load 16 at a time");
#pragma unroll
  for (int c = 0; c < kMaxLoraRank / 16; ++c) {
    float w[16];
    const int n = jb.xa ? min(16, jb.rank - 16 * c) : 0;
    if (n > 0) {
      lora_load16(jb.b, jb.b_bf16 != 0, o * jb.ldb + 16 * c, n, w);
    } else {
#pragma unroll
      for (int u = 0; u < 16; ++u) w[u] = 0.f;
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) bv[16 * c + u] = w[u];
  }
}

// y[r, o] of job jb: base[r, o] (or y's own value when base is null) + scale · Σ_k xa[r, k] · b[o, k].
// b_at(k) gives b[o, k] (both callers: registers loaded by lora_b_row).
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
