// Decode GEMV, version 3: y[r, o] = alpha · Σ_k x[r, k] · w[o, k] + beta · y[r, o] for 2 to 8
// rows of x (a batched decode step, an ICaRus step's base and decoder rows, a speculative pass's
// drafts), bf16 weights, f32 activations, through tensor cores.
//
// Why: versions 1 and 2 (gemv.cu) do R FMAs per weight on CUDA cores and re-read x from L1 or
// shared memory for every row, so past one row they fall behind the weight stream (H200: 0.13-0.50
// of the copy bandwidth at 3-8 rows, bench/results/kernels-nvidia-h200-20261202.md). Batched steps
// therefore took cuBLASLt, whose small projections run at 0.59-0.70 of it at any row count
// (bench/results/lt-small-m-nvidia-h200-20261128.md) and which cannot fold RMSNorm or SwiGLU in:
// an ICaRus step (two rows) took 6.44 ms against 4.57 for one row with the same adapter.
//
// Layout: a warp computes a 16-row tile of w against all 8 (zero-padded) rows of x with
// mma.sync m16n8k16, w as the A operand and x as B ("swap AB": no MMA rows are wasted on padding).
// Each lane's A fragment holds whole 16-byte chunks of weight rows g and g + 8 (g = lane / 4): the
// sum over k may run in any order, so chunk q of each 32-value block of k goes to lane q of the
// group (q = lane % 4), its 8 values becoming the fragment's logical columns {2q, 2q+1, 2q+8,
// 2q+9} of two k16 steps, and the lane's B fragment takes x's values at the same k (x row g).
// Precision: each x value is split into bf16 hi and lo = bf16(x - hi), both multiplied (two MMAs
// a step), so x keeps ~16 bits of mantissa (f32 accumulation) where a plain bf16 x would keep 8;
// the MMAs are far from limiting (each k16 step: 512 bytes of weights, 2 MMAs a warp).
// No norm mode (RMSNorm folded in, as version 2 has for one row): tried, with the B operand h · g
// and 1/rms(h) scaling the finished dot, the sum of h² gathered from the same loads; the folded
// SwiGLU GEMV then took 125 µs against 77 µs unfolded (H200, 8B shapes, 2 rows), more than the
// RMSNorm kernel it saves.
// Loads: cp.async into a ring of kStages batches per warp (shared memory, not registers), so
// each warp keeps ~10 KiB of weights in flight at 16 warps an SM; each copy instruction reads
// whole 128-byte lines of 4 rows (the first try had each lane copy its own fragment, 64 bytes of
// 8 rows an instruction: 0.63-0.67 of the copy bandwidth on the 4096 x 4096 projections).
// Work split: a tile's k range is split over 1, 2, 4 or 8 warps of a block (tiles per block
// 8 / split), the pieces summed through shared memory, like version 2's rows.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <vector>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/device_props.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda {
namespace {

constexpr int kWarps = 8;   // per block
constexpr int kUnroll = 2;  // 32-value blocks of k per batch (4 16-byte copies a lane)
constexpr int kStages = 6;  // batches in a warp's ring (kStages - 1 in flight)
constexpr int kTileRows = 16;  // weight rows per warp (the MMA's M)
constexpr int kXRows = 8;      // rows of x (the MMA's N)
// Dynamic shared memory of a block: the warps' rings (96 KiB: two blocks an SM).
constexpr int kRingBytes = kWarps * kStages * kTileRows * kUnroll * 64;

struct V3Args {
  GemvArgs g;
  int rows;                    // rows of x, 1..8
  int n_units;                 // tiles (SwiGLU: gate tiles, each paired with the same up tile)
  int tile_end[kMaxGemvSegs];  // prefix sums of the segments' tiles
  int chunks;                  // 16-byte chunks of a weight row (in / 8)
};

// acc += w · x over one k16 step: a0..a3 the A fragment, x the lane's 4 values of x at the
// fragment's k (b0: the first two, b1: the last two), split into bf16 hi + lo.
__device__ __forceinline__ void mma_step(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         const float4& x) {
  const uint32_t hi0 = detail::pack_bf16(x.x, x.y), hi1 = detail::pack_bf16(x.z, x.w);
  const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi0));
  const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi1));
  const uint32_t lo0 = detail::pack_bf16(x.x - f0.x, x.y - f0.y), lo1 = detail::pack_bf16(x.z - f1.x, x.w - f1.y);
  const uint32_t a[4] = {a0, a1, a2, a3};
  detail::mma_bf16(acc, a, hi0, hi1);
  detail::mma_bf16(acc, a, lo0, lo1);
}

template <bool kSwiGLU>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_v3_kernel(const V3Args v) {
  const GemvArgs& a = v.g;
  extern __shared__ uint4 wsm[];                  // [kWarps] rings of weight chunks (see slot)
  __shared__ float part[kWarps][kTileRows][kXRows];   // [warp][tile row][x row] the pieces' dots
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int tpb = kWarps / a.wpr;  // tiles per block
  const int lt = warp / a.wpr, piece = warp % a.wpr;
  // This warp's tile: its segment and its index within the segment.
  int seg = 0, t;
  if constexpr (kSwiGLU) {
    const int half = tpb / 2;
    seg = lt / half;
    t = blockIdx.x * half + lt % half;
  } else {
    t = blockIdx.x * tpb + lt;
    while (seg + 1 < a.n_segs && t >= v.tile_end[seg]) ++seg;
  }
  const bool live = t < v.n_units;
  const int tl = kSwiGLU || seg == 0 ? t : t - v.tile_end[seg - 1];
  const int64_t height = a.end[seg] - (seg > 0 ? a.end[seg - 1] : 0);
  const uint4* wsafe = reinterpret_cast<const uint4*>(a.w[0]);  // a valid address for zero-fills
  const int chunks = v.chunks;
  const int kblocks = (chunks + 3) / 4;
  const int per = (kblocks + a.wpr - 1) / a.wpr;
  const int kb0 = piece * per, kb1 = min(kblocks, kb0 + per);
  // Batch b of the piece: blocks kb0 + b·kUnroll .. + kUnroll - 1 of the tile's 16 rows, 128
  // contiguous bytes a row, copied by cp.async into the warp's ring of kStages batches. Copy
  // instruction i takes rows 4i .. 4i + 3, 8 lanes a row (four whole 128-byte lines): a lane's
  // fragment (chunks q and 4 + q of rows g and g + 8) is then read back from shared memory. Odd
  // rows keep their two 64-byte halves swapped, so that the 8 lanes of a read phase (rows 2m and
  // 2m + 1, four chunks each) hit 8 distinct 16-byte bank groups. Registers hold no weights in
  // flight: a warp keeps kStages - 1 batches outstanding at a small kernel's occupancy.
  static_assert(kUnroll == 2, "the batch layout: 8 chunks (128 bytes) a row");
  uint4* ring = wsm + warp * kStages * kTileRows * 8;  // [kStages][16 rows][8 chunk slots]
  auto slot = [&](int b, int row, int cc) { return ring + ((b % kStages) * kTileRows + row) * 8 + (cc ^ ((row & 1) << 2)); };
  const uint4* wrow[4];  // [i] the weight row this lane copies in instruction i, or null past the tile
  for (int i = 0; i < 4; ++i) {
    const int64_t r = int64_t{tl} * kTileRows + 4 * i + lane / 8;
    wrow[i] = live && r < height ? reinterpret_cast<const uint4*>(a.w[seg] + r * a.ldw[seg]) : nullptr;
  }
  const int batches = live && kb1 > kb0 ? (kb1 - kb0 + kUnroll - 1) / kUnroll : 0;
  auto issue = [&](int b) {
    const int cc = lane % 8, kb = kb0 + b * kUnroll + cc / 4, c = (kb0 + b * kUnroll) * 4 + cc;
    const bool inside = kb < kb1 && c < chunks;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // src size 0 zero-fills the slot and reads nothing (the address only has to be valid).
      const bool ok = inside && wrow[i];
      detail::cp_async16(slot(b, 4 * i + lane / 8, cc), ok ? wrow[i] + c : wsafe, ok ? 16 : 0);
    }
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // (row g, x rows 2q, 2q+1), (row g + 8, the same)
  // The first weights do not depend on the previous kernel: with programmatic dependent launch
  // they are in flight while it finishes; x is read only after griddepcontrol.wait.
  for (int b = 0; b < kStages - 1; ++b) {
    if (b < batches) issue(b);
    detail::cp_async_commit();  // one group a batch, empty or not: wait_group counts them
  }
  pdl_wait();
  pdl_release();
  const bool xrow = g < v.rows;
  const float* xr = a.x + (xrow ? g : 0) * a.ldx;
  for (int b = 0; b < batches; ++b) {
    // x at this batch's k (L1 / L2), fetched while its weights may still be arriving.
    float4 xlo[kUnroll], xhi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kb = kb0 + b * kUnroll + u, c = kb * 4 + q;
      xlo[u] = xhi[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (xrow && kb < kb1 && c < chunks) {
        xlo[u] = __ldg(reinterpret_cast<const float4*>(xr + int64_t{c} * 8));
        xhi[u] = __ldg(reinterpret_cast<const float4*>(xr + int64_t{c} * 8 + 4));
      }
    }
    __syncwarp();  // every lane is done reading the slot the next copy overwrites (batch b - 1's)
    if (b + kStages - 1 < batches) issue(b + kStages - 1);
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();  // this lane's copies of batch b have landed
    __syncwarp();                          // and every other lane's
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4 ca = *slot(b, g, 4 * u + q), cb = *slot(b, g + 8, 4 * u + q);
      mma_step(acc, ca.x, cb.x, ca.y, cb.y, xlo[u]);  // chunk values 0-3
      mma_step(acc, ca.z, cb.z, ca.w, cb.w, xhi[u]);  // chunk values 4-7
    }
  }
  detail::cp_async_wait<0>();
  part[warp][g][2 * q] = acc[0];
  part[warp][g][2 * q + 1] = acc[1];
  part[warp][g + 8][2 * q] = acc[2];
  part[warp][g + 8][2 * q + 1] = acc[3];
  __syncthreads();
  auto dot = [&](int w, int row, int n) {
    float d = 0.f;
    for (int p = 0; p < a.wpr; ++p) d += part[w + p][row][n];
    return d;
  };
  // Every thread of the block writes finished values: output (row, n) of local tile et, n-major
  // so that neighbouring threads write neighbouring columns of y.
  if constexpr (kSwiGLU) {
    const int half = tpb / 2;
    for (int idx = threadIdx.x; idx < half * kTileRows * kXRows; idx += kWarps * 32) {
      const int et = idx / (kTileRows * kXRows), n = idx / kTileRows % kXRows, row = idx % kTileRows;
      const int tt = blockIdx.x * half + et;
      const int64_t o = int64_t{tt} * kTileRows + row;
      if (n >= v.rows || tt >= v.n_units || o >= a.end[0]) continue;
      const float gd = dot(et * a.wpr, row, n), ud = dot((half + et) * a.wpr, row, n);
      a.y[0][n * a.ldy[0] + o] = gd / (1.0f + expf(-gd)) * ud;  // silu_mul_kernel's expression
    }
  } else {
    for (int idx = threadIdx.x; idx < tpb * kTileRows * kXRows; idx += kWarps * 32) {
      const int et = idx / (kTileRows * kXRows), n = idx / kTileRows % kXRows, row = idx % kTileRows;
      const int tt = blockIdx.x * tpb + et;
      if (n >= v.rows || tt >= v.n_units) continue;
      int s = 0;
      while (s + 1 < a.n_segs && tt >= v.tile_end[s]) ++s;
      const int64_t o = int64_t{s > 0 ? tt - v.tile_end[s - 1] : tt} * kTileRows + row;
      if (o >= a.end[s] - (s > 0 ? a.end[s - 1] : 0)) continue;
      const float d = dot(et * a.wpr, row, n);
      float* yo = a.y[s] + n * a.ldy[s] + o;
      *yo = a.beta == 0.f ? a.alpha * d : a.alpha * d + a.beta * *yo;
    }
  }
}

// Tuning knobs, read once (for measuring on the device without rebuilding):
//   LRAGENT_GEMV3_WAVES  fraction of an SM's 64 warps the split aims for (default 0.25: a tile's
//                        k range is split while the tiles give fewer warps than that)
//   LRAGENT_GEMV3_MINK   32-value blocks of k a piece keeps at least (default 8)
struct Knobs3 {
  double waves = [] {
    const char* e = std::getenv("LRAGENT_GEMV3_WAVES");
    return e ? std::atof(e) : 0.25;
  }();
  int min_blocks = [] {
    const char* e = std::getenv("LRAGENT_GEMV3_MINK");
    return e ? std::max(1, std::atoi(e)) : 8;
  }();
};
const Knobs3& knobs3() {
  static const Knobs3 k;
  return k;
}

}  // namespace

cudaError_t gemv_v3_launch(GemvArgs& a, int64_t rows, bool swiglu, bool pdl, cudaStream_t s) {
  // No norm mode: passes of more than one row do not fold RMSNorm in (CudaBackend::folds_rms_norm).
  if (rows < 1 || rows > kXRows || a.in / 8 > INT_MAX / 2 || a.norm_w) return cudaErrorInvalidValue;
  V3Args v{};
  v.rows = static_cast<int>(rows);
  v.chunks = static_cast<int>(a.in / 8);
  int64_t tiles = 0;
  for (int i = 0; i < a.n_segs; ++i) {
    const int64_t height = a.end[i] - (i > 0 ? a.end[i - 1] : 0);
    tiles += (height + kTileRows - 1) / kTileRows;
    if (tiles > INT_MAX / kWarps) return cudaErrorInvalidValue;
    v.tile_end[i] = static_cast<int>(tiles);
  }
  // SwiGLU: both segments have the same height; a unit is a gate tile and its up tile.
  v.n_units = swiglu ? v.tile_end[0] : static_cast<int>(tiles);
  const int64_t warp_units = swiglu ? 2 * int64_t{v.n_units} : v.n_units;
  const int64_t kblocks = (a.in / 8 + 3) / 4;
  const int64_t target = static_cast<int64_t>(knobs3().waves * sm_count() * 64);
  int wpt = 1;
  const int max_wpt = swiglu ? kWarps / 2 : kWarps;  // a SwiGLU block holds at least one pair
  while (wpt < max_wpt && warp_units * wpt < target && kblocks / (wpt * 2) >= knobs3().min_blocks) wpt *= 2;
  a.wpr = wpt;
  v.g = a;
  const int tpb = kWarps / wpt, per_block = swiglu ? tpb / 2 : tpb;
  const auto grid = static_cast<unsigned>((v.n_units + per_block - 1) / per_block);
  if (grid == 0) return cudaSuccess;
  auto go = [&](auto kernel) -> cudaError_t {
    // Past 48 KiB a kernel must opt in to its dynamic shared memory, once per kernel.
    static thread_local std::vector<const void*> opted;
    const void* fn = reinterpret_cast<const void*>(kernel);
    if (std::find(opted.begin(), opted.end(), fn) == opted.end()) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes);
      if (e != cudaSuccess) return e;
      opted.push_back(fn);
    }
    if (pdl) return launch_pdl(kernel, dim3(grid), dim3(kWarps * 32), kRingBytes, s, v);
    kernel<<<grid, kWarps * 32, kRingBytes, s>>>(v);
    return cudaGetLastError();
  };
  return swiglu ? go(gemv_v3_kernel<true>) : go(gemv_v3_kernel<false>);
}

}  // namespace lragent::cuda
