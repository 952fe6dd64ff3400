// What the small-op kernels of ops.cu, ops_rope_store.cu, ops_argmax.cu and
// attention_generic.cu share: the grid-stride launch size, element loads and stores by Elem,
// block-wide reductions and paged row addressing. Internal linkage (an unnamed namespace), as
// when they were one file: each .cu compiles its own copy, and the code is what it was.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/ops.cuh"

namespace lragent::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 32 ? (b < 1 ? 1 : b) : 65535 * 32);
}

__device__ __forceinline__ float load_elem(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return __half2float(static_cast<const __half*>(p)[i]);
  }
}

__device__ __forceinline__ void store_elem(void* p, Elem t, int64_t i, float v) {
  switch (t) {
    case Elem::kF32: static_cast<float*>(p)[i] = v; break;
    case Elem::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); break;
    default: static_cast<__half*>(p)[i] = __float2half(v); break;
  }
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  __syncthreads();  // `red` may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < n_warps; ++w) t += red[w];
  return t;
}

__device__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = -FLT_MAX;
  for (int w = 0; w < n_warps; ++w) t = fmaxf(t, red[w]);
  return t;
}


// Element offset of token t's row in a paged cache view (PagedDev, ops.cuh).
__device__ __forceinline__ int64_t paged_row(const PagedDev& v, int64_t t) {
  return static_cast<int64_t>(v.table[t / v.page_size]) * v.block_stride + (t % v.page_size) * v.row_stride;
}

}  // namespace
}  // namespace lragent::cuda
