// Device-side token pick (sampling.cuh): the rules of backend/sampling_ref.h, one block per
// logits row, no sorting. A row is read from global memory (L2-resident after the first pass)
// once per step below:
//   1. row statistics: the largest and smallest finite logit, the finite count, and the greedy
//      pick (argmax_rows_kernel's rule), which greedy rows and rows without a finite logit take;
//   2. top-k: the k-th largest finite logit by binary search over the ordered-int encoding of
//      f32 (at most 32 rounds, each a block-wide count of the logits >= the candidate);
//   3. top-p: the kept mass W (f64), then the lowest kept logit by the same binary search (each
//      round a block-wide f64 sum of the kept weights strictly above the candidate);
//   4. the pick: each thread owns a contiguous run of ids, so a block-wide exclusive scan of the
//      per-thread kept sums gives every id its inclusive prefix in id order; the smallest id
//      with a positive weight whose prefix exceeds u · W' wins.
// Every reduction combines its partials in a fixed order, so a row always gives the same id
// (a replayed graph picks what the eager pass picked). Searches compare values as floats (the
// keys only order the candidates), so -0 and +0 stay one logit.
#include "backend/cuda/sampling.cuh"

#include <cmath>

namespace lragent::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// f32 -> int32 with the same order (negative floats have their magnitude bits flipped) and back.
__device__ __forceinline__ int32_t order_key(float f) {
  const int32_t b = __float_as_int(f);
  return b < 0 ? b ^ 0x7fffffff : b;
}
__device__ __forceinline__ float key_float(int32_t k) { return __int_as_float(k < 0 ? k ^ 0x7fffffff : k); }

// The weight of a kept logit: the host reference's f32 expression (accurate expf: this file is
// built without fast math).
__device__ __forceinline__ float weight(float v, float max, float temperature) { return expf((v - max) / temperature); }

// (value, index) pairs, argmax_rows_kernel's rule: the larger value wins, on equal values the
// lower index; NaN loses.
__device__ __forceinline__ bool arg_better(float v, int64_t i, float bv, int64_t bi) {
  if (v != v) return false;
  if (bv != bv) return true;
  return v > bv || (v == bv && i < bi);
}

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <class T>
  __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct Max {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

// Block-wide reduction; every thread gets the result. Lanes combine by butterfly (a + b and
// b + a are the same float), warps in index order: the same inputs always give the same bits.
// smem: [kWarps] of T, any reduction's (the leading barrier waits for its previous readers).
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* smem) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  T r = smem[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, smem[w]);
  return r;
}

// Exclusive prefix sum of v over the threads in index order; *total = the sum of all (the
// same additions as the last thread's prefix plus its own v). smem: [kWarps].
__device__ double block_exclusive_sum(double v, double* smem, double* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += n;
  }
  double excl = __shfl_up_sync(kFull, incl, 1);
  if (lane == 0) excl = 0.0;
  __syncthreads();
  if (lane == 31) smem[warp] = incl;
  __syncthreads();
  double base = 0.0, all = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) base = all;
    all += smem[w];
  }
  *total = all;
  return base + excl;
}

// Calls f(value, id) for the ids this thread visits: 16-byte loads of four logits when the row
// is 16-byte aligned (ids 4j..4j+3 for j = tid, tid + kThreads, ...; four loads in flight per
// round trip instead of one: the passes below are latency-bound), then the tail one by one.
template <class F>
__device__ __forceinline__ void for_row(const float* row, int64_t vocab, F&& f) {
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const int64_t n4 = vocab / 4;
    const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll 2
    for (int64_t j = threadIdx.x; j < n4; j += kThreads) {
      const float4 q = r4[j];
      f(q.x, 4 * j);
      f(q.y, 4 * j + 1);
      f(q.z, 4 * j + 2);
      f(q.w, 4 * j + 3);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < vocab; i += kThreads) f(row[i], i);
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const SampleRowsParams p) {
  // [kWarps] per-warp partials of block_reduce / block_exclusive_sum, one array per type
  __shared__ double red_d[kWarps];
  __shared__ float red_f[kWarps];
  __shared__ int red_i[kWarps];
  __shared__ long long red_l[kWarps];
  __shared__ float arg_v[kWarps];      // [kWarps] each warp's greedy (value, id)
  __shared__ long long arg_i[kWarps];
  const float* row = p.logits + static_cast<int64_t>(blockIdx.x) * p.ld;
  const RowSampling sp = p.params[blockIdx.x];
  const int64_t vocab = p.vocab;
  const int tid = threadIdx.x;

  // 1. Row statistics and the greedy pick.
  float mx = -INFINITY, mn = INFINITY, bv = __int_as_float(0x7fc00000);  // bv NaN: loses to any number
  long long bi = 0;
  int n_finite = 0;
  for_row(row, vocab, [&](float v, int64_t i) {
    if (arg_better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
    if (isfinite(v)) {
      mx = fmaxf(mx, v);
      mn = fminf(mn, v);
      ++n_finite;
    }
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFull, bv, o);
    const long long i = __shfl_xor_sync(kFull, bi, o);
    if (arg_better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  if (tid % 32 == 0) {
    arg_v[tid / 32] = bv;
    arg_i[tid / 32] = bi;
  }
  mx = block_reduce(mx, Max(), red_f);
  mn = block_reduce(mn, Min(), red_f);
  n_finite = block_reduce(n_finite, Sum(), red_i);  // its barriers also publish arg_v / arg_i
  if (!(sp.temperature > 0.f) || n_finite == 0) {
    if (tid == 0) {
      for (int w = 1; w < kWarps; ++w)
        if (arg_better(arg_v[w], arg_i[w], arg_v[0], arg_i[0])) {
          arg_v[0] = arg_v[w];
          arg_i[0] = arg_i[w];
        }
      p.out[blockIdx.x] = static_cast<int32_t>(arg_i[0]);
    }
    return;
  }
  const float t = sp.temperature;

  // 2. top-k: the largest key whose logit has at least k finite logits >= it (the k-th largest,
  // counted with multiplicity). The smallest finite logit qualifies, so the search has an answer.
  float lowest = mn;  // kept: finite and >= lowest
  if (sp.top_k > 0 && sp.top_k < n_finite) {
    int32_t lo = order_key(mn), hi = order_key(mx);
    while (lo < hi) {  // lo, hi are block-uniform: every thread runs the same rounds
      const int32_t mid = static_cast<int32_t>(lo + (static_cast<int64_t>(hi) - lo + 1) / 2);
      const float x = key_float(mid);
      int c = 0;
      for_row(row, vocab, [&](float v, int64_t) { c += isfinite(v) && v >= x; });
      if (block_reduce(c, Sum(), red_i) >= sp.top_k)
        lo = mid;
      else
        hi = mid - 1;
    }
    lowest = key_float(lo);
  }

  // 3. top-p: the smallest key whose kept mass strictly above it is below top_p · W. The largest
  // logit has nothing above it, so it qualifies whenever the limit is positive; a limit <= 0
  // (top_p <= 0) keeps only the largest logit(s).
  if (sp.top_p < 1.f) {
    double w = 0.0;
    for_row(row, vocab, [&](float v, int64_t) {
      if (isfinite(v) && v >= lowest) w += weight(v, mx, t);
    });
    const double limit = static_cast<double>(sp.top_p) * block_reduce(w, Sum(), red_d);
    int32_t lo = order_key(lowest), hi = order_key(mx);
    if (!(limit > 0.0)) lo = hi;
    while (lo < hi) {
      const int32_t mid = static_cast<int32_t>(lo + (static_cast<int64_t>(hi) - lo) / 2);
      const float x = key_float(mid);
      double s = 0.0;
      for_row(row, vocab, [&](float v, int64_t) {
        if (isfinite(v) && v >= lowest && v > x) s += weight(v, mx, t);
      });
      if (block_reduce(s, Sum(), red_d) < limit)
        hi = mid;
      else
        lo = mid + 1;
    }
    lowest = key_float(lo);
  }

  // 4. The pick. Thread tid owns ids [i0, i1): its kept sum, then the prefix before its run.
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t i0 = tid * chunk < vocab ? tid * chunk : vocab;
  const int64_t i1 = i0 + chunk < vocab ? i0 + chunk : vocab;
  double own = 0.0;
  long long last_positive = -1;
  for (int64_t i = i0; i < i1; ++i) {
    const float v = row[i];
    if (!isfinite(v) || v < lowest) continue;
    const float wi = weight(v, mx, t);
    own += wi;
    if (wi > 0.f) last_positive = i;
  }
  double total = 0.0;
  double run = block_exclusive_sum(own, red_d, &total);
  const double target = static_cast<double>(sp.u) * total;
  long long found = vocab;  // vocab: none in this thread's run
  for (int64_t i = i0; i < i1; ++i) {
    const float v = row[i];
    if (!isfinite(v) || v < lowest) continue;
    const float wi = weight(v, mx, t);
    run += wi;
    if (wi > 0.f && run > target) {
      found = i;
      break;
    }
  }
  found = block_reduce(found, Min(), red_l);
  // None: only when u · W' rounds to W' or beyond; the largest logit has weight 1, so some kept
  // id has a positive weight.
  if (found == vocab) found = block_reduce(last_positive, Max(), red_l);
  if (tid == 0) p.out[blockIdx.x] = static_cast<int32_t>(found);
}

}  // namespace

cudaError_t sample_rows(const SampleRowsParams& p, cudaStream_t s) {
  if (p.rows == 0) return cudaSuccess;
  if (p.vocab < 1 || p.rows < 0 || p.ld < p.vocab || !p.logits || !p.params || !p.out) return cudaErrorInvalidValue;
  sample_rows_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
