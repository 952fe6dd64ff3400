// Decode GEMV, version 3: y[r, o] = alpha · Σ_k x[r, k] · w[o, k] + beta · y[r, o] for 2 to 16
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
// Past 8 rows x is two such tiles (NT = 2: rows 0-7 and 8-15), each weight fragment read once from
// shared memory for both: serving 9-16 clients keeps the pass structure of 8 (one launch for q/k/v
// and the LoRA shrinks, SwiGLU in the epilogue) where it took ~9 cuBLASLt GEMMs a layer
// (bench/results/serve-profile-8-vs-16-clients-nvidia-h200-20261203.md).
// Each lane's A fragment holds whole 16-byte chunks of weight rows g and g + 8 (g = lane / 4): the
// sum over k may run in any order, so chunk q of each 32-value block of k goes to lane q of the
// group (q = lane % 4), its 8 values becoming the fragment's logical columns {2q, 2q+1, 2q+8,
// 2q+9} of two k16 steps, and the lane's B fragment takes x's values at the same k (x row g).
// Precision: up to 8 rows each x value is split into bf16 hi and lo = bf16(x - hi), both multiplied
// (two MMAs a step), so x keeps ~16 bits of mantissa (f32 accumulation) where a plain bf16 x would
// keep 8; the MMAs are far from limiting (each k16 step: 512 bytes of weights, 2 MMAs a warp).
// Past 8 rows x comes in bf16 (x16, as cuBLASLt's GEMM takes it there): see XFrag.
// No norm mode (RMSNorm folded in, as version 2 has for one and two rows): tried twice, with the B operand
// h · g and 1/rms(h) scaling the finished dot, the sum of h² gathered from the same loads. In the
// tile schedule the folded SwiGLU GEMV took 125 µs against 77 µs unfolded (H200, 8B shapes, 2
// rows). In the cluster schedule (session 55; a split unit's pieces carrying their sums of squares
// to the finishing warp; every CUDA test passed) whole steps were slower than with the RMSNorm
// kernels: a 5-row speculative pass 5.87 ms against 5.47, an ICaRus step 5.80 against 5.36, with g
// and the squares applied after the weights' wait (a first form that used x before issuing the
// next batch's copies: 6.30 against 5.37); lragent serve, 8 clients 0.90 s against 0.84.
// Loads: cp.async into a ring of S batches per warp (kStagesOf) (shared memory, not registers), so
// each warp keeps ~10 KiB of weights in flight at 16 warps an SM; each copy instruction reads
// whole 128-byte lines of 4 rows (the first try had each lane copy its own fragment, 64 bytes of
// 8 rows an instruction: 0.63-0.67 of the copy bandwidth on the 4096 x 4096 projections).
// Work split, two schedules (gemv_v3_launch picks one per launch):
// - Tile: a warp per 16-row tile, a tile's k range split over 1, 2, 4 or 8 warps of one block
//   (tiles per block 8 / split), the pieces summed through shared memory, like version 2's rows.
//   Its tail is cheap, but its grid is whole blocks of tiles: the 8B gate/up (896 tile pairs, 4 a
//   block) gives 224 blocks, so of 132 SMs with two slots each 92 get two blocks and 40 one
//   (H200, 2 rows: 0.76 of the copy bandwidth).
// - Cluster (stream-K within clusters of two blocks): the units (16-row tiles; SwiGLU: a gate
//   tile and its up tile) are dealt out whole to the clusters, as evenly as whole units go, and a
//   cluster's 16 warps split its units' batches (2 blocks of k each) evenly, crossing unit
//   boundaries with their copy rings still full. A unit wholly in one warp's share is written by
//   that warp; a warp whose share ends inside a unit stores its piece straight into the shared
//   memory of the block where the unit ends (an inbox beside the rings; the peer block's through
//   distributed shared memory), and after one cluster barrier the warp where the unit ends adds
//   the pieces in share order, so the sums do not depend on timing. H200, 2 rows: the 8B gate/up
//   0.92 of the copy bandwidth (tile schedule 0.84), lm_head 0.96 (0.94); its tail still costs
//   ~1.5 us where the tile schedule's one wave is already even (q/o 12.8 us against 11.2).
//   Tried before it: the pieces put into the rings' memory after a block barrier, then two cluster
//   barriers around the finishers' remote reads (q/o 14.6 us; gate alone 0.86 of the copy
//   bandwidth at 2 rows against 0.88); splitting units between any blocks through a workspace in
//   global memory (the last block to finish a unit counted by an atomic): 3-6 us a launch in
//   fences, atomics and reloads (q/o 17.5 us); with its tail left out (wrong sums, for timing)
//   gate/up streamed at 0.96, the bound on what an even split can reach.

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/device_props.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_v3_split.h"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda {
namespace {

constexpr int kWarps = 8;   // per block
constexpr int kUnroll = 2;  // 32-value blocks of k per batch (4 16-byte copies a lane)
constexpr int kTileRows = 16;  // weight rows per warp (the MMA's M)
constexpr int kXTile = 8;      // rows of x an MMA takes (its N); NT such tiles, 1 or 2
// Batches in a warp's ring (S - 1 in flight): 6 at one x tile, 5 at two (below).
template <int NT>
constexpr int kStagesOf = NT == 1 ? 6 : 5;
// Floats of a tile's dots (a warp's accumulator fragments).
template <int NT>
constexpr int kFragOf = kTileRows * kXTile * NT;
// Dynamic shared memory of a block: the warps' rings (96 KiB at 6 stages: two blocks an SM).
template <int NT>
constexpr int kRingBytesOf = kWarps * kStagesOf<NT> * kTileRows * kUnroll * 64;

constexpr int kCluster = 2;                 // blocks a cluster (cluster schedule)
constexpr int kClusterWarps = kCluster * kWarps;
// The cluster schedule's block also holds an inbox of split units' pieces (a warp's accumulators,
// gate and up): 96 + 16 KiB at one x tile, 80 + 32 at two (hence 5 stages there), still two blocks
// an SM (2 x (112 + 1 reserved) of 228 KiB).
template <int NT>
constexpr int kClusterSmemBytesOf = kRingBytesOf<NT> + kClusterWarps * 2 * kFragOf<NT> * 4;
static_assert(kClusterSmemBytesOf<1> <= 112 * 1024 && kClusterSmemBytesOf<2> <= 112 * 1024,
              "two cluster-schedule blocks an SM");

struct V3Args {
  GemvArgs g;
  int rows;                    // rows of x, 1..16 (past 8 read from g.x16)
  int n_units;                 // tiles (SwiGLU: gate tiles, each paired with the same up tile)
  int tile_end[kMaxGemvSegs];  // prefix sums of the segments' tiles
  int chunks;                  // 16-byte chunks of a weight row (in / 8)
  // Cluster schedule:
  int kblocks;                 // 32-value blocks of k: (chunks + 3) / 4
  int ubatches;                // batches of a unit (SwiGLU: gate and up batches alternating)
  int clusters;                // clusters of the grid: at most n_units (none is left empty)
};

// x for the B fragments, a batch at a time. One tile (NT = 1, up to 8 rows): f32 x, each value
// split into bf16 hi and lo = bf16(x - hi), both multiplied (two MMAs a k16 step), so x keeps ~16
// bits of mantissa (f32 accumulation) where a plain bf16 x would keep 8. Two tiles (NT = 2, 9-16
// rows): x16, x already in bf16 (one MMA a step), as cuBLASLt takes it: every warp reads x for its
// k range from L2, and f32 x at 16 rows would be twice the bytes of the weights it meets (the 8B
// gate/up: ~470 MB through L2 against 117 MB of weights), which held 16 rows at 0.65 of the copy
// bandwidth where 8 rows stream at 0.84 (H200; without the lo MMAs 0.66: not the MMAs).
template <int NT>
struct XFrag;
template <>
struct XFrag<1> {
  float4 lo[kUnroll], hi[kUnroll];  // [u] chunk q of block kb + u: values 0-3, 4-7
};
template <>
struct XFrag<2> {
  uint4 b[2][kUnroll];  // [tile][u] chunk q of block kb + u, 8 bf16 values
};

// The lane's rows of x (g, and g + 8 for the second tile), and whether each is a row or padding.
template <int NT>
struct XRows;
template <>
struct XRows<1> {
  const float* r;
  bool live;
  __device__ XRows(const GemvArgs& a, int rows, int g) : r(a.x + (g < rows ? g : 0) * a.ldx), live(g < rows) {}
  // x at blocks kb .. kb + kUnroll - 1 of k (L1 / L2), chunk q of each; zeros past kb_end or the
  // row's chunks, or for padding.
  __device__ __forceinline__ void load(int q, int kb, int kb_end, int chunks, XFrag<1>& x) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = kb + u, c = k * 4 + q;
      x.lo[u] = x.hi[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (live && k < kb_end && c < chunks) {
        x.lo[u] = __ldg(reinterpret_cast<const float4*>(r + int64_t{c} * 8));
        x.hi[u] = __ldg(reinterpret_cast<const float4*>(r + int64_t{c} * 8 + 4));
      }
    }
  }
};
template <>
struct XRows<2> {
  const uint4* r[2];  // [tile] row g + 8·tile of x16 ([rows, in] bf16), as 16-byte chunks
  bool live[2];
  __device__ XRows(const GemvArgs& a, int rows, int g) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      live[j] = g + kXTile * j < rows;
      r[j] = reinterpret_cast<const uint4*>(a.x16 + (live[j] ? g + kXTile * j : 0) * a.in);
    }
  }
  __device__ __forceinline__ void load(int q, int kb, int kb_end, int chunks, XFrag<2>& x) const {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = kb + u, c = k * 4 + q;
        x.b[j][u] = make_uint4(0u, 0u, 0u, 0u);
        if (live[j] && k < kb_end && c < chunks) x.b[j][u] = __ldg(r[j] + c);
      }
  }
};

// acc += w · x over one k16 step: a the A fragment, x the lane's 4 values of x at the fragment's k
// (b0: the first two, b1: the last two), split into bf16 hi + lo.
__device__ __forceinline__ void mma_split(float (&acc)[4], const uint32_t (&a)[4], const float4& x) {
  const uint32_t hi0 = detail::pack_bf16(x.x, x.y), hi1 = detail::pack_bf16(x.z, x.w);
  const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi0));
  const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi1));
  const uint32_t lo0 = detail::pack_bf16(x.x - f0.x, x.y - f0.y), lo1 = detail::pack_bf16(x.z - f1.x, x.w - f1.y);
  detail::mma_bf16(acc, a, hi0, hi1);
  detail::mma_bf16(acc, a, lo0, lo1);
}

// A warp's ring of S batches of weights in shared memory, [S][16 rows][8 chunk slots],
// both schedules' (a batch: kUnroll 32-value blocks of k of a 16-row tile, 128 contiguous bytes a
// row). Odd rows keep their two 64-byte halves swapped, so that the 8 lanes of a read phase (rows
// 2m and 2m + 1, four chunks each) hit 8 distinct 16-byte bank groups.
template <int S>
__device__ __forceinline__ uint4* ring_slot(uint4* ring, int b, int row, int cc) {
  return ring + ((b % S) * kTileRows + row) * 8 + (cc ^ ((row & 1) << 2));
}
// The first S - 1 batches' copies (issue(b) copies batch b). They do not depend on the previous
// kernel: with programmatic dependent launch they are in flight while it finishes; x and y are
// touched only after griddepcontrol.wait, which ends this.
template <int S, class Issue>
__device__ __forceinline__ void ring_start(int batches, Issue&& issue) {
  for (int b = 0; b < S - 1; ++b) {
    if (b < batches) issue(b);
    detail::cp_async_commit();  // one group a batch, empty or not: wait_group counts them
  }
  pdl_wait();
  pdl_release();
}
// Batch b's copies landed for the whole warp, batch b + S - 1's issued into the slot that batch
// b - 1 freed.
template <int S, class Issue>
__device__ __forceinline__ void ring_advance(int b, int batches, Issue&& issue) {
  __syncwarp();  // every lane is done reading the slot the next copy overwrites (batch b - 1's)
  if (b + S - 1 < batches) issue(b + S - 1);
  detail::cp_async_commit();
  detail::cp_async_wait<S - 1>();  // this lane's copies of batch b have landed
  __syncwarp();                          // and every other lane's
}
// acc[j] += batch b's weights (the lane's fragments: chunks q and 4 + q of rows g and g + 8) · x
// tile j, each fragment read once from shared memory for all NT tiles.
template <int S, int NT>
__device__ __forceinline__ void ring_mma(uint4* ring, int b, int g, int q, const XFrag<NT>& x, float (&acc)[NT][4]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint4 ca = *ring_slot<S>(ring, b, g, 4 * u + q), cb = *ring_slot<S>(ring, b, g + 8, 4 * u + q);
    const uint32_t a0[4] = {ca.x, cb.x, ca.y, cb.y}, a1[4] = {ca.z, cb.z, ca.w, cb.w};  // values 0-3, 4-7
    if constexpr (NT == 1) {
      mma_split(acc[0], a0, x.lo[u]);
      mma_split(acc[0], a1, x.hi[u]);
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        detail::mma_bf16(acc[j], a0, x.b[j][u].x, x.b[j][u].y);
        detail::mma_bf16(acc[j], a1, x.b[j][u].z, x.b[j][u].w);
      }
    }
  }
}

// Where a unit's weights are: segment, tile within it, the segment's rows.
struct UnitLoc {
  int seg, tl;
  int64_t height;
};
template <bool kSwiGLU>
__device__ __forceinline__ UnitLoc locate(const V3Args& v, int u) {
  const GemvArgs& a = v.g;
  if constexpr (kSwiGLU) return {0, u, a.end[0]};  // up: segment 1, same tile, same height
  int s = 0;
  while (s + 1 < a.n_segs && u >= v.tile_end[s]) ++s;
  const int64_t lo = s > 0 ? a.end[s - 1] : 0;
  return {s, s > 0 ? u - v.tile_end[s - 1] : u, a.end[s] - lo};
}

// Output (n, o) of segment seg from its finished dot d (SwiGLU: the gate's, du the up's).
template <bool kSwiGLU>
__device__ __forceinline__ void store_y(const GemvArgs& a, int seg, int n, int64_t o, float d, float du) {
  if constexpr (kSwiGLU) {
    a.y[0][n * a.ldy[0] + o] = d / (1.0f + expf(-d)) * du;  // silu_mul_kernel's expression
  } else {
    float* yo = a.y[seg] + n * a.ldy[seg] + o;
    *yo = a.beta == 0.f ? a.alpha * d : a.alpha * d + a.beta * *yo;
  }
}

// Tile schedule: a warp per (16-row tile, k piece), a tile's pieces in one block.
template <int NT, bool kSwiGLU>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_v3_tile_kernel(const V3Args v) {
  constexpr int S = kStagesOf<NT>, XR = kXTile * NT;
  const GemvArgs& a = v.g;
  extern __shared__ uint4 wsm[];                  // [kWarps] rings of weight chunks (see slot)
  __shared__ float part[kWarps][kTileRows][XR];   // [warp][tile row][x row] the pieces' dots
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int tpb = kWarps / a.wpr;  // tiles per block
  const int lt = warp / a.wpr, piece = warp % a.wpr;
  // This warp's tile: its unit (SwiGLU: the gate tile of the first half of the block's warps, the
  // same up tile of the second), its segment and its index within the segment.
  const int t = kSwiGLU ? blockIdx.x * (tpb / 2) + lt % (tpb / 2) : blockIdx.x * tpb + lt;
  const UnitLoc at = locate<kSwiGLU>(v, t);
  const int seg = kSwiGLU ? lt / (tpb / 2) : at.seg, tl = at.tl;
  const int64_t height = at.height;
  const bool live = t < v.n_units;
  const uint4* wsafe = reinterpret_cast<const uint4*>(a.w[0]);  // a valid address for zero-fills
  const int chunks = v.chunks;
  const int kblocks = (chunks + 3) / 4;
  const int per = (kblocks + a.wpr - 1) / a.wpr;
  const int kb0 = piece * per, kb1 = min(kblocks, kb0 + per);
  // Batch b of the piece: blocks kb0 + b·kUnroll .. + kUnroll - 1 of the tile's 16 rows, copied
  // by cp.async into the warp's ring (ring_slot). Copy instruction i takes rows 4i .. 4i + 3, 8
  // lanes a row (four whole 128-byte lines); a lane's fragment is then read back from shared
  // memory. Registers hold no weights in flight: a warp keeps S - 1 batches outstanding at a
  // small kernel's occupancy.
  static_assert(kUnroll == 2, "the batch layout: 8 chunks (128 bytes) a row");
  uint4* ring = wsm + warp * S * kTileRows * 8;  // [S][16 rows][8 chunk slots]
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
      detail::cp_async16(ring_slot<S>(ring, b, 4 * i + lane / 8, cc), ok ? wrow[i] + c : wsafe, ok ? 16 : 0);
    }
  };
  // acc[j]: (row g, x rows 8j + 2q, 8j + 2q + 1), (row g + 8, the same)
  float acc[NT][4] = {};
  ring_start<S>(batches, issue);
  const XRows<NT> xs(a, v.rows, g);
  for (int b = 0; b < batches; ++b) {
    // x at this batch's k (L1 / L2), fetched while its weights may still be arriving.
    XFrag<NT> xf;
    xs.load(q, kb0 + b * kUnroll, kb1, chunks, xf);
    ring_advance<S>(b, batches, issue);
    ring_mma<S, NT>(ring, b, g, q, xf, acc);
  }
  detail::cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    part[warp][g][kXTile * j + 2 * q] = acc[j][0];
    part[warp][g][kXTile * j + 2 * q + 1] = acc[j][1];
    part[warp][g + 8][kXTile * j + 2 * q] = acc[j][2];
    part[warp][g + 8][kXTile * j + 2 * q + 1] = acc[j][3];
  }
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
    for (int idx = threadIdx.x; idx < half * kTileRows * XR; idx += kWarps * 32) {
      const int et = idx / (kTileRows * XR), n = idx / kTileRows % XR, row = idx % kTileRows;
      const int tt = blockIdx.x * half + et;
      const int64_t o = int64_t{tt} * kTileRows + row;
      if (n >= v.rows || tt >= v.n_units || o >= a.end[0]) continue;
      store_y<true>(a, 0, n, o, dot(et * a.wpr, row, n), dot((half + et) * a.wpr, row, n));
    }
  } else {
    for (int idx = threadIdx.x; idx < tpb * kTileRows * XR; idx += kWarps * 32) {
      const int et = idx / (kTileRows * XR), n = idx / kTileRows % XR, row = idx % kTileRows;
      const int tt = blockIdx.x * tpb + et;
      if (n >= v.rows || tt >= v.n_units) continue;
      const UnitLoc ot = locate<false>(v, tt);
      const int64_t o = int64_t{ot.tl} * kTileRows + row;
      if (o >= ot.height) continue;
      store_y<false>(a, ot.seg, n, o, dot(et * a.wpr, row, n), 0.f);
    }
  }
}

// A warp's piece of a unit: lane (g, q) holds rows g and g + 8 of the tile against x rows
// 8j + 2q and 8j + 2q + 1 of tile j (the MMA's accumulator layout); SwiGLU: the gate dots, then
// the up dots.
template <int NT>
struct Piece {
  float d[NT][4], du[NT][4];
};

// A finished unit into y.
template <int NT, bool kSwiGLU>
__device__ __forceinline__ void write_unit(const V3Args& v, int u, int lane, const Piece<NT>& p) {
  const GemvArgs& a = v.g;
  const UnitLoc at = locate<kSwiGLU>(v, u);
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = kXTile * j + 2 * q + (e & 1);
      const int64_t o = int64_t{at.tl} * kTileRows + g + (e >> 1) * 8;
      if (n >= v.rows || o >= at.height) continue;
      store_y<kSwiGLU>(a, at.seg, n, o, p.d[j][e], p.du[j][e]);
    }
}

// Cluster barrier halves (PTX barrier.cluster), every thread of both blocks taking part. The
// kernel arrives (relaxed) at its start and waits before its first remote store: a block may write
// into its peer's shared memory only once the peer has started. The second phase (release /
// acquire) makes the stores visible to the block that reads them.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

template <int NT, bool kSwiGLU>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_v3_cluster_kernel(const V3Args v) {
  namespace cg = cooperative_groups;
  constexpr int S = kStagesOf<NT>;
  const GemvArgs& a = v.g;
  // [kWarps] rings of weight chunks (see slot), then the inbox: [kClusterWarps][2 · kFragOf<NT> / 4]
  // float4, the pieces other warps send to this block's finishing warps, by sender.
  extern __shared__ uint4 wsm[];
  cluster_arrive_relaxed();  // this block has started (waited on before the first remote store)
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int U = v.ubatches;
  // This cluster's units, as even as whole units go; its warp wc the wc-th sixteenth of their
  // batches (the batches of unit u: u·U .. u·U + U - 1). The bookkeeping: gemv_v3_split.h.
  const ClusterSplit<kClusterWarps> cs(static_cast<int>(blockIdx.x) / kCluster, v.n_units, v.clusters, U);
  const int wc = rank * kWarps + warp;
  const WarpShare sh(cs.base + cs.begin(wc), cs.base + cs.begin(wc + 1), U);
  const int64_t j0 = sh.j0;
  const int count = sh.count(), first_unit = sh.first, last_unit = sh.last;
  // Batch b of a unit: blocks 2b, 2b + 1 of the tile's 16 rows (SwiGLU: b / 2 of the gate tile
  // for even b, of the up tile for odd b), copied by cp.async into the warp's ring (ring_slot),
  // as the tile schedule copies them; a warp keeps S - 1 batches outstanding.
  static_assert(kUnroll == 2, "the batch layout: 8 chunks (128 bytes) a row");
  uint4* ring = wsm + warp * S * kTileRows * 8;  // [S][16 rows][8 chunk slots]
  const uint4* wsafe = reinterpret_cast<const uint4*>(a.w[0]);  // a valid address for zero-fills
  // The copy cursor runs S - 1 batches ahead of the compute cursor, across units.
  int iu = first_unit, ib = static_cast<int>(j0 - int64_t{first_unit} * U);
  UnitLoc iat = locate<kSwiGLU>(v, iu);
  auto issue = [&](int n) {  // the cursor's batch into ring slot n, then the cursor to the next batch
    const int seg = kSwiGLU ? (ib & 1) : iat.seg, kb2 = kSwiGLU ? ib >> 1 : ib;
    const int cc = lane % 8, c16 = kb2 * 8 + cc;
    const bool inside = kb2 * 2 + cc / 4 < v.kblocks && c16 < v.chunks;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = int64_t{iat.tl} * kTileRows + 4 * i + lane / 8;
      const bool ok = inside && r < iat.height;
      // src size 0 zero-fills the slot and reads nothing (the address only has to be valid).
      const uint4* src = ok ? reinterpret_cast<const uint4*>(a.w[seg] + r * a.ldw[seg]) + c16 : wsafe;
      detail::cp_async16(ring_slot<S>(ring, n, 4 * i + lane / 8, cc), src, ok ? 16 : 0);
    }
    if (++ib == U) {
      ib = 0;
      if (++iu < v.n_units) iat = locate<kSwiGLU>(v, iu);
    }
  };
  ring_start<S>(count, issue);
  const XRows<NT> xs(a, v.rows, g);
  Piece<NT> acc{}, head{}, tail{};  // the unit being summed; this warp's split first and last units
  int cu = first_unit, cb = static_cast<int>(j0 - int64_t{first_unit} * U);
  for (int n = 0; n < count; ++n) {
    const int kb2 = kSwiGLU ? cb >> 1 : cb;
    // x at this batch's k (L1 / L2), fetched while its weights may still be arriving.
    XFrag<NT> xf;
    xs.load(q, kb2 * kUnroll, v.kblocks, v.chunks, xf);
    ring_advance<S>(n, count, issue);
    if (kSwiGLU && (cb & 1))
      ring_mma<S, NT>(ring, n, g, q, xf, acc.du);
    else
      ring_mma<S, NT>(ring, n, g, q, xf, acc.d);
    if (cb + 1 < U && n + 1 < count) {
      ++cb;
      continue;
    }
    // The unit ends here or this warp's share does. A unit wholly in the share is written now;
    // a split one is kept for the end (at most two: the share's first and last units).
    if (sh.holds(cu))
      write_unit<NT, kSwiGLU>(v, cu, lane, acc);
    else if (cu == first_unit)
      head = acc;
    else
      tail = acc;
    acc = Piece<NT>{};
    ++cu;
    cb = 0;
  }
  detail::cp_async_wait<0>();
  // Split units. A cluster holds whole units, so a split unit ends in one of its warps' shares, and
  // that warp (for which it is the first unit) finishes it. A warp whose last unit goes on past its
  // share sends its piece (its only piece not yet written) straight into the finishing warp's
  // block, at its own slot of the inbox: the inbox lies apart from the rings, so no block barrier
  // is needed first, and after one cluster barrier every finisher reads only its own block.
  auto* inbox = reinterpret_cast<float4*>(wsm + kRingBytesOf<NT> / 16);
  // float4 a piece: the gate (or only) dots of each x tile, then up's; lane l's of tile j at
  // 32j + l (up: 32 (NT + j) + l).
  constexpr int kSlot = 2 * kFragOf<NT> / 4;
  cluster_wait();  // the peer has started (its arrival at the kernel's start)
  if (sh.sends()) {
    // The share's only unit, or its last (element by element: selecting whole register arrays by
    // reference could put them in local memory).
    const bool only = last_unit == first_unit;
    Piece<NT> p;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p.d[j][e] = only ? head.d[j][e] : tail.d[j][e];
        p.du[j][e] = only ? head.du[j][e] : tail.du[j][e];
      }
    const int f = sh.receiver(cs);
    float4* to = cluster.map_shared_rank(inbox, f / kWarps) + wc * kSlot;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      to[32 * j + lane] = make_float4(p.d[j][0], p.d[j][1], p.d[j][2], p.d[j][3]);
      if constexpr (kSwiGLU) to[32 * (NT + j) + lane] = make_float4(p.du[j][0], p.du[j][1], p.du[j][2], p.du[j][3]);
    }
  }
  cluster_arrive_release();
  cluster_wait();
  // The finisher adds the pieces of the warps before it that meet the unit (the first of them is
  // the one whose share holds the unit's first batch; empty shares sent nothing), in warp order,
  // then its own: the sums do not depend on timing.
  if (sh.finishes()) {
    Piece<NT> p{};
    for (int w = sh.first_sender(cs); w < wc; ++w) {
      if (cs.begin(w) == cs.begin(w + 1)) continue;  // an empty share (a unit of fewer batches than 16)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float4 t = inbox[w * kSlot + 32 * j + lane];
        p.d[j][0] += t.x, p.d[j][1] += t.y, p.d[j][2] += t.z, p.d[j][3] += t.w;
        if constexpr (kSwiGLU) {
          const float4 tu = inbox[w * kSlot + 32 * (NT + j) + lane];
          p.du[j][0] += tu.x, p.du[j][1] += tu.y, p.du[j][2] += tu.z, p.du[j][3] += tu.w;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) p.d[j][e] += head.d[j][e], p.du[j][e] += head.du[j][e];
    write_unit<NT, kSwiGLU>(v, first_unit, lane, p);
  }
}

// Tuning knobs, read once (for measuring on the device without rebuilding):
//   LRAGENT_GEMV3_SCHED  tile, cluster or auto (default: the tile schedule where its grid fills one
//                        wave of the SMs almost evenly, else the cluster schedule; gemv_v3_launch)
//   LRAGENT_GEMV3_WAVES  tile schedule: fraction of an SM's 64 warps the split aims for (default
//                        0.25: a tile's k range is split while the tiles give fewer warps than that)
//   LRAGENT_GEMV3_MINK   tile schedule: 32-value blocks of k a piece keeps at least (default 8)
//   LRAGENT_GEMV3_MINB   cluster schedule: batches a warp's share holds at least (default 4)
struct Knobs3 {
  int sched = [] {  // 0 auto, 1 tile, 2 cluster
    const char* e = std::getenv("LRAGENT_GEMV3_SCHED");
    if (!e) return 0;
    const std::string s = e;
    return s == "tile" ? 1 : s == "cluster" ? 2 : 0;
  }();
  double waves = [] {
    const char* e = std::getenv("LRAGENT_GEMV3_WAVES");
    return e ? std::atof(e) : 0.25;
  }();
  int min_blocks = [] {
    const char* e = std::getenv("LRAGENT_GEMV3_MINK");
    return e ? std::max(1, std::atoi(e)) : 8;
  }();
  int min_batches = [] {
    const char* e = std::getenv("LRAGENT_GEMV3_MINB");
    return e ? std::max(1, std::atoi(e)) : 4;
  }();

};
const Knobs3& knobs3() {
  static const Knobs3 k;
  return k;
}

// Past 48 KiB a kernel must opt in to its dynamic shared memory, once per kernel.
template <class K>
cudaError_t opt_in(K kernel, int smem) {
  static thread_local std::vector<const void*> opted;
  const void* fn = reinterpret_cast<const void*>(kernel);
  if (std::find(opted.begin(), opted.end(), fn) != opted.end()) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) opted.push_back(fn);
  return e;
}

// Clusters of two blocks the device holds at once (asked once a kernel; 0: the query failed).
template <class K>
int resident_clusters(K kernel, int smem) {
  struct Known {
    const void* fn;
    int n;
  };
  static thread_local std::vector<Known> known;
  const void* fn = reinterpret_cast<const void*>(kernel);
  for (const Known& k : known)
    if (k.fn == fn) return k.n;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(kCluster * sm_count()));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  known.push_back({fn, n});
  return n;
}

}  // namespace

cudaError_t gemv_v3_launch(GemvArgs& a, int64_t rows, bool swiglu, bool pdl, cudaStream_t s) {
  // No norm mode (see the top): norm mode's launches go to version 2 (gemv_norm_max_rows; 1-2
  // rows), larger passes do not fold RMSNorm in (CudaBackend::folds_rms_norm).
  if (rows < 1 || rows > kGemvV3MaxRows || a.in / 8 > INT_MAX / 2 || a.norm_w) return cudaErrorInvalidValue;
  static_assert(kGemvV3MaxRows == 2 * kXTile, "rows of x: one or two tiles");
  const bool two = rows > kXTile;  // NT = 2: x from x16
  if (two && (!a.x16 || reinterpret_cast<uintptr_t>(a.x16) % 16 != 0)) return cudaErrorInvalidValue;
  V3Args v{};
  v.rows = static_cast<int>(rows);
  v.chunks = static_cast<int>(a.in / 8);
  v.kblocks = (v.chunks + 3) / 4;
  int64_t tiles = 0;
  for (int i = 0; i < a.n_segs; ++i) {
    const int64_t height = a.end[i] - (i > 0 ? a.end[i - 1] : 0);
    tiles += (height + kTileRows - 1) / kTileRows;
    if (tiles > INT_MAX / kWarps) return cudaErrorInvalidValue;
    v.tile_end[i] = static_cast<int>(tiles);
  }
  // SwiGLU: both segments have the same height; a unit is a gate tile and its up tile.
  v.n_units = swiglu ? v.tile_end[0] : static_cast<int>(tiles);
  if (v.n_units == 0 || v.chunks == 0) return cudaSuccess;
  // Tile schedule: a tile's k range split over 1-8 warps of a block while the tiles give fewer
  // warps than `waves` of the SMs.
  const int64_t warp_units = swiglu ? 2 * int64_t{v.n_units} : v.n_units;
  const int64_t target = static_cast<int64_t>(knobs3().waves * sm_count() * 64);
  int wpt = 1;
  const int max_wpt = swiglu ? kWarps / 2 : kWarps;  // a SwiGLU block holds at least one pair
  while (wpt < max_wpt && warp_units * wpt < target && v.kblocks / (wpt * 2) >= knobs3().min_blocks) wpt *= 2;
  const int tpb = kWarps / wpt, per_block = swiglu ? tpb / 2 : tpb;
  const int64_t tile_grid = (v.n_units + per_block - 1) / per_block;
  // The tile schedule only where its blocks fill one wave of the SMs' slots (two resident blocks
  // an SM) almost evenly, at 0.9 or more: there its tail is the cheaper (H200, 2 rows: q/o and down,
  // 256 blocks for 264 slots, 11.2 us against 12.8 and 32.2 against 33.9). Elsewhere the cluster
  // schedule: grids of more than a wave (lm_head: 1002 blocks, 268 us against 263 at 2 rows, 305
  // against 292 at 8), unevenly filled ones (the 8B gate/up: 224 blocks, 67.6 us against 61.6) and
  // small ones (k alone: 64 blocks, 6.2 us against 5.6).
  const double waves = static_cast<double>(tile_grid) / (2.0 * sm_count());
  const bool tile_even = waves <= 1.0 && waves >= 0.9;
  const int sched = knobs3().sched != 0 ? knobs3().sched : tile_even ? 1 : 2;
  auto launch = [&](auto kernel, unsigned grid, bool cluster) -> cudaError_t {
    const int smem = cluster ? (two ? kClusterSmemBytesOf<2> : kClusterSmemBytesOf<1>)
                             : (two ? kRingBytesOf<2> : kRingBytesOf<1>);
    if (const cudaError_t e = opt_in(kernel, smem); e != cudaSuccess) return e;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(kWarps * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (cluster) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = kCluster;
      attr[n].val.clusterDim.y = 1;
      attr[n].val.clusterDim.z = 1;
      ++n;
    }
    if (pdl) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, v);
  };
  if (sched == 2) {
    auto kernel = two ? (swiglu ? gemv_v3_cluster_kernel<2, true> : gemv_v3_cluster_kernel<2, false>)
                      : (swiglu ? gemv_v3_cluster_kernel<1, true> : gemv_v3_cluster_kernel<1, false>);
    const int smem = two ? kClusterSmemBytesOf<2> : kClusterSmemBytesOf<1>;
    // The opt-in first: the occupancy query fails for a kernel not yet allowed its shared memory.
    if (const cudaError_t e = opt_in(kernel, smem); e != cudaSuccess) return e;
    const int resident = resident_clusters(kernel, smem);
    if (resident > 0) {
      v.ubatches = (v.kblocks + kUnroll - 1) / kUnroll * (swiglu ? 2 : 1);
      const int64_t total = int64_t{v.n_units} * v.ubatches;
      // Every resident cluster, unless that leaves a warp fewer than min_batches batches; at most
      // a cluster a unit.
      const int64_t want = (total + int64_t{kClusterWarps} * knobs3().min_batches - 1) /
                           (int64_t{kClusterWarps} * knobs3().min_batches);
      v.clusters = static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>(resident, v.n_units)));
      v.g = a;
      return launch(kernel, static_cast<unsigned>(v.clusters * kCluster), true);
    }
  }
  a.wpr = wpt;
  v.g = a;
  auto kernel = two ? (swiglu ? gemv_v3_tile_kernel<2, true> : gemv_v3_tile_kernel<2, false>)
                    : (swiglu ? gemv_v3_tile_kernel<1, true> : gemv_v3_tile_kernel<1, false>);
  return launch(kernel, static_cast<unsigned>(tile_grid), false);
}

}  // namespace lragent::cuda
