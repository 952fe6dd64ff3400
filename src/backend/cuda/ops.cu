// The CUDA backend's elementwise and small ops (see ops.cuh): conversions, fills, RMSNorm, the
// version-1 GEMV, SwiGLU, adds, embeddings and row gathers. Memory-bound kernels: one thread per
// element (grid-stride), one block per row for reductions. Accumulation in f32. The RoPE, q/k
// norms and cache stores are in ops_rope_store.cu, the argmax in ops_argmax.cu, the generic
// attention in attention_generic.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/random.h"

namespace lragent::cuda {
namespace {

__global__ void convert_kernel(const void* src, Elem st, int64_t lds, void* dst, Elem dt, int64_t ldd, int64_t rows,
                               int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    store_elem(dst, dt, r * ldd + c, load_elem(src, st, r * lds + c));
  }
}

__global__ void fill_random_kernel(void* dst, Elem t, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    store_elem(dst, t, i, stddev * random_normal_at(seed, static_cast<uint64_t>(i)));
}

__global__ void fill_kernel(void* dst, Elem t, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    store_elem(dst, t, i, v);
}

__global__ void rms_norm_kernel(const float* x, int64_t ldx, const void* w, Elem wt, float eps, float* y, int64_t ldy,
                                int64_t d, __nv_bfloat16* y16) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  ss = block_sum(ss, red);
  // Same expression as the CPU backend (and HF): x · (1 / sqrt(mean(x²) + eps)) · w.
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  __nv_bfloat16* y16r = y16 ? y16 + blockIdx.x * d : nullptr;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = load_elem(w, wt, j) * (xr[j] * inv);
    if (y) yr[j] = v;
    if (y16r) y16r[j] = __float2bfloat16(v);
  }
}

// Fused residual add + RMSNorm for rows of d <= K · blockDim values: every thread keeps its K
// values in registers between the sum of squares and the scaling, and the K loads are unrolled
// (the generic kernel above walks d with a dependent loop: 5.5 us for one 4096-wide row).
// x null: plain RMSNorm of h (h is not written). Else h += x first and the new h is stored.
// y may alias x (each value is read and written by the same thread); y null: only y16 is written.
template <int K>
__global__ void add_rms_norm_kernel(float* h, int64_t ldh, const float* x, int64_t ldx, const void* w, Elem wt,
                                    float eps, float* y, int64_t ldy, int64_t d, __nv_bfloat16* y16) {
  __shared__ float red[32];
  pdl_release();  // a PDL-launched GEMV may be scheduled now (it waits for our completion)
  float* hr = h + blockIdx.x * ldh;
  const float* xr = x ? x + blockIdx.x * ldx : nullptr;
  float v[K], wk[K];  // this thread's values of h and of the norm weight
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = threadIdx.x + int64_t{k} * blockDim.x;
    v[k] = j < d ? hr[j] : 0.f;
    wk[k] = j < d ? load_elem(w, wt, j) : 0.f;  // loaded with h: no dependent round trip later
  }
  if (xr) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = threadIdx.x + int64_t{k} * blockDim.x;
      if (j < d) {
        v[k] += xr[j];
        hr[j] = v[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) ss += v[k] * v[k];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  float* yr = y ? y + blockIdx.x * ldy : nullptr;
  __nv_bfloat16* y16r = y16 ? y16 + blockIdx.x * d : nullptr;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = threadIdx.x + int64_t{k} * blockDim.x;
    if (j < d) {
      const float o = wk[k] * (v[k] * inv);
      if (yr) yr[j] = o;
      if (y16r) y16r[j] = __float2bfloat16(o);
    }
  }
}

// GEMV version 1: one warp per output o, all rows at once: lanes stride the reduction
// dimension 8 bf16 (16 B) at a time, two loads in flight per lane, then a warp reduction.
// (Version 2, the default, is in gemv.cu.)
template <int R>
__global__ void __launch_bounds__(128) gemv_bf16_kernel(const __nv_bfloat16* __restrict__ w, int64_t ldw,
                                                        const float* __restrict__ x, int64_t ldx, float* y,
                                                        int64_t ldy, int64_t in, int64_t out, float alpha,
                                                        float beta) {
  const int lane = threadIdx.x % 32;
  const int64_t o = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (o >= out) return;
  const __nv_bfloat16* wr = w + o * ldw;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 2
  for (int64_t k = lane * 8; k < in; k += 256) {
    float wf[8];
    bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(wr + k)), wf);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4 a = *reinterpret_cast<const float4*>(x + r * ldx + k);
      const float4 b = *reinterpret_cast<const float4*>(x + r * ldx + k + 4);
      acc[r] += dot8(wf, a, b);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) {
      float* yo = y + r * ldy + o;
      *yo = beta == 0.f ? alpha * v : alpha * v + beta * *yo;
    }
  }
}

// o may be null (only o16 written).
__global__ void silu_mul_kernel(const float* g, const float* u, float* o, int64_t n, __nv_bfloat16* o16) {
  pdl_release();  // a PDL-launched GEMV may be scheduled now (it waits for our completion)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = g[i] / (1.0f + expf(-g[i])) * u[i];
    if (o) o[i] = v;
    if (o16) o16[i] = __float2bfloat16(v);
  }
}

// silu_mul over n4 groups of 4 values (16-byte aligned f32, 8-byte aligned bf16): float4 loads.
__global__ void silu_mul_x4_kernel(const float4* g, const float4* u, float4* o, int64_t n4, __nv_bfloat162* o16) {
  pdl_release();  // the down-projection GEMV may be scheduled now
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4; i += int64_t{gridDim.x} * blockDim.x) {
    const float4 a = g[i], b = u[i];
    const float4 v = make_float4(a.x / (1.0f + expf(-a.x)) * b.x, a.y / (1.0f + expf(-a.y)) * b.y,
                                 a.z / (1.0f + expf(-a.z)) * b.z, a.w / (1.0f + expf(-a.w)) * b.w);
    if (o) o[i] = v;
    if (o16) {
      o16[2 * i] = __floats2bfloat162_rn(v.x, v.y);
      o16[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
  }
}

// f32 -> bf16 of n contiguous values, 4 per thread (n % 4 == 0, 16-byte aligned src, 8-byte dst):
// the generic convert_kernel divides a 64-bit index per element and ran at 1.5 TB/s.
__global__ void f32_to_bf16_x4_kernel(const float4* src, __nv_bfloat162* dst, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4; i += int64_t{gridDim.x} * blockDim.x) {
    const float4 v = src[i];
    dst[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    dst[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] += x[i];
}

__global__ void add_bias_kernel(float* y, int64_t ldy, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x)
    y[(e / cols) * ldy + e % cols] += bias[e % cols];
}

__global__ void embedding_kernel(const void* table, Elem t, int64_t d, const int32_t* ids, int64_t n, float* out) {
  const int64_t total = n * d;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x)
    out[e] = load_elem(table, t, static_cast<int64_t>(ids[e / d]) * d + e % d);
}

__global__ void embedding_fed_kernel(const void* table, Elem t, int64_t d, const int32_t* ids, const int32_t* feed,
                                     const int32_t* picks, int64_t n, float* out) {
  const int64_t total = n * d;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / d;
    const int32_t id = feed[row] >= 0 ? picks[feed[row]] : ids[row];
    out[e] = load_elem(table, t, static_cast<int64_t>(id) * d + e % d);
  }
}

// Word-wise copy when rows are 4-byte multiples (always, for f32/bf16-pair rows), else bytes.
__global__ void gather_words_kernel(const uint32_t* src, int64_t row_words, const int32_t* rows, int64_t n,
                                    uint32_t* dst) {
  const int64_t total = n * row_words;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x)
    dst[e] = src[static_cast<int64_t>(rows[e / row_words]) * row_words + e % row_words];
}

__global__ void gather_bytes_kernel(const uint8_t* src, int64_t row_bytes, const int32_t* rows, int64_t n,
                                    uint8_t* dst) {
  const int64_t total = n * row_bytes;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x)
    dst[e] = src[static_cast<int64_t>(rows[e / row_bytes]) * row_bytes + e % row_bytes];
}

}  // namespace

cudaError_t convert_rows(const void* src, Elem src_t, int64_t ld_src, void* dst, Elem dst_t, int64_t ld_dst,
                         int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return cudaSuccess;
  const int64_t n = rows * cols;
  if (src_t == Elem::kF32 && dst_t == Elem::kBF16 && (rows == 1 || (ld_src == cols && ld_dst == cols)) && n % 4 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
    f32_to_bf16_x4_kernel<<<blocks_for(n / 4), kThreads, 0, s>>>(static_cast<const float4*>(src),
                                                                 static_cast<__nv_bfloat162*>(dst), n / 4);
    return cudaGetLastError();
  }
  convert_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, src_t, ld_src, dst, dst_t, ld_dst, rows, cols);
  return cudaGetLastError();
}

cudaError_t fill_random(void* dst, Elem t, int64_t n, uint64_t seed, float stddev, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fill_random_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, t, n, seed, stddev);
  return cudaGetLastError();
}

cudaError_t fill_value(void* dst, Elem t, int64_t n, float value, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, t, n, value);
  return cudaGetLastError();
}

cudaError_t add_rms_norm(const RmsNormCall& c) {
  if (c.rows == 0) return cudaSuccess;
  // 1024 threads (4 values each for a 4096-wide row; 256 threads with 16 each measured slower:
  // 7.0 vs 5.7 us for one decode row on an H100).
  const int threads = c.d >= 1024 ? 1024 : static_cast<int>((c.d + 31) / 32 * 32);
  const int64_t k = (c.d + threads - 1) / threads;
  auto* y16b = static_cast<__nv_bfloat16*>(c.y16);
  const unsigned grid = static_cast<unsigned>(c.rows);
  auto go = [&](auto kernel) {
    kernel<<<grid, threads, 0, c.stream>>>(c.h, c.ldh, c.x, c.ldx, c.w, c.w_t, c.eps, c.y, c.ldy, c.d, y16b);
    return cudaGetLastError();
  };
  switch (k) {
    case 1: return go(add_rms_norm_kernel<1>);
    case 2: return go(add_rms_norm_kernel<2>);
    case 3:
    case 4: return go(add_rms_norm_kernel<4>);
    case 5: case 6: case 7:
    case 8: return go(add_rms_norm_kernel<8>);
    default:
      if (k > 16) return cudaErrorInvalidValue;  // wider than 16384: callers use add + rms_norm
      return go(add_rms_norm_kernel<16>);
  }
}

cudaError_t rms_norm(const RmsNormCall& c) {
  if (c.x) return cudaErrorInvalidValue;  // the residual add is add_rms_norm's
  if (c.rows == 0) return cudaSuccess;
  if (c.d <= 16384) return add_rms_norm(c);  // the register-resident kernel; h is only read (no x)
  rms_norm_kernel<<<static_cast<unsigned>(c.rows), c.d >= 1024 ? 1024 : (c.d >= 256 ? 256 : 64), 0, c.stream>>>(
      c.h, c.ldh, c.w, c.w_t, c.eps, c.y, c.ldy, c.d, static_cast<__nv_bfloat16*>(c.y16));
  return cudaGetLastError();
}

cudaError_t gemv_bf16(const GemvCall& c) {
  GemvGroupCall g;  // v2 for one row, v3 for more (gemv_v3_min_rows)
  g.segs[0] = {c.w, c.ldw, c.y, c.ldy, c.out};
  g.n_segs = 1;
  g.x = c.x;
  g.ldx = c.ldx;
  g.rows = c.rows;
  g.in = c.in;
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.x16 = c.x16;
  g.stream = c.stream;
  return gemv_bf16_grouped(g);
}

cudaError_t gemv_bf16_v1(const GemvCall& c) {
  if (c.rows > kGemvMaxRows || !gemv_bf16_ok(c.w, c.ldw, c.x, c.ldx, c.rows, c.in)) return cudaErrorInvalidValue;
  if (c.out == 0) return cudaSuccess;
  const auto* wb = static_cast<const __nv_bfloat16*>(c.w);
  const unsigned grid = static_cast<unsigned>((c.out + 3) / 4);
  switch (c.rows) {
#define LRA_GEMV_CASE(R)                                                                                          \
  case R:                                                                                                         \
    gemv_bf16_kernel<R><<<grid, 128, 0, c.stream>>>(wb, c.ldw, c.x, c.ldx, c.y, c.ldy, c.in, c.out, c.alpha, c.beta); \
    break;
    LRA_GEMV_CASE(1) LRA_GEMV_CASE(2) LRA_GEMV_CASE(3) LRA_GEMV_CASE(4)
    LRA_GEMV_CASE(5) LRA_GEMV_CASE(6) LRA_GEMV_CASE(7) LRA_GEMV_CASE(8)
#undef LRA_GEMV_CASE
  }
  return cudaGetLastError();
}

cudaError_t silu_mul(const float* gate, const float* up, float* out, int64_t n, void* out16, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  auto al = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (n % 4 == 0 && al(gate, 16) && al(up, 16) && al(out, 16) && al(out16, 8)) {
    silu_mul_x4_kernel<<<blocks_for(n / 4), kThreads, 0, s>>>(
        reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up), reinterpret_cast<float4*>(out),
        n / 4, static_cast<__nv_bfloat162*>(out16));
    return cudaGetLastError();
  }
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, out, n, static_cast<__nv_bfloat16*>(out16));
  return cudaGetLastError();
}

cudaError_t add(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, int64_t ldy, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(y, ldy, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t embedding(const void* table, Elem t, int64_t d, const int32_t* ids, int64_t n, float* out,
                      cudaStream_t s) {
  if (n * d == 0) return cudaSuccess;
  embedding_kernel<<<blocks_for(n * d), kThreads, 0, s>>>(table, t, d, ids, n, out);
  return cudaGetLastError();
}

cudaError_t embedding_fed(const void* table, Elem t, int64_t d, const int32_t* ids, const int32_t* feed,
                          const int32_t* picks, int64_t n, float* out, cudaStream_t s) {
  if (n * d == 0) return cudaSuccess;
  embedding_fed_kernel<<<blocks_for(n * d), kThreads, 0, s>>>(table, t, d, ids, feed, picks, n, out);
  return cudaGetLastError();
}

cudaError_t gather_rows(const void* src, int64_t row_bytes, const int32_t* rows, int64_t n, void* dst,
                        cudaStream_t s) {
  if (n * row_bytes == 0) return cudaSuccess;
  const bool words = row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(dst) % 4 == 0;
  if (words) {
    gather_words_kernel<<<blocks_for(n * row_bytes / 4), kThreads, 0, s>>>(
        static_cast<const uint32_t*>(src), row_bytes / 4, rows, n, static_cast<uint32_t*>(dst));
  } else {
    gather_bytes_kernel<<<blocks_for(n * row_bytes), kThreads, 0, s>>>(static_cast<const uint8_t*>(src), row_bytes,
                                                                        rows, n, static_cast<uint8_t*>(dst));
  }
  return cudaGetLastError();
}

}  // namespace lragent::cuda
