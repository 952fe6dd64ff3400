// v4's shared pieces (attention_v4_decode.cu): tile constants, the shared-memory layout of
// attn_v4_decode_kernel, its launch description, the addressing of a kv head's rows, and the split
// merge (the last block's and attn_v4_merge_kernel's). Included by attention_v4_decode.cu only.
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda::v4 {

using namespace ::lragent::cuda::detail;

constexpr int kKeyWarps = 4;   // warps that split a key tile (16 keys each) for one row tile
constexpr int kBN = 64;        // keys per tile
constexpr int kTileRows = 16;  // one m16 tile
constexpr int kMaxRowTiles = 2;
static_assert(kTileRows * kMaxRowTiles == kAgentsMaxRows, "attention.cuh states v4's agents-mode row limit");
constexpr int kMaxSplits = 128;  // splits of one kv head (the merge's weights: [kMaxSplits, rows] f32)
constexpr int kStages = 2;
// The K term's kernels (attn_v4_decode_kernel's kK).
constexpr int kKNone = 0, kKInPlace = 1, kKPerAgent = 2;
// Blocks an SM the launch bounds ask for: three at one row tile (registers <= 168), two at two
// row tiles or with the in-place K term, one for the per-agent K term at two row tiles (eight
// warps that hold a residual's registers beside O).
constexpr int v4_min_blocks(int mt, int kk) {
  if (kk == kKPerAgent) return mt == 1 ? 2 : 1;
  return mt == 1 && kk == kKNone ? 3 : 2;
}

template <int D, int R, int MT, bool kKTerm = false>
struct Smem {
  static constexpr int kRows = kTileRows * MT;  // the block's query rows (agents x G heads)
  static constexpr int kWarps = kKeyWarps * MT;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int KS = D + 8;  // padded row (elements): conflict-free ldmatrix
  static constexpr int RS = R + 8;
  // One row tile loads its Q fragments straight into registers (no Q tile: 4 KB less, which with
  // olr_s below fits three blocks of the LR kernel on an SM); two re-read theirs every key tile.
  static constexpr bool kQRegs = MT == 1;
  static constexpr int kQ = 0;                              // [kRows, KS] (two row tiles)
  static constexpr int kK = kQ + (kQRegs ? 0 : kRows * KS);  // [kStages, kBN, KS]
  static constexpr int kV = kK + kStages * kBN * KS;        // [kStages, kBN, KS]
  static constexpr int kLv = kV + kStages * kBN * KS;       // [kStages, kBN, RS] (R > 0)
  static constexpr int kLk = kLv + (R > 0 ? kStages * kBN * RS : 0);  // [kStages, kBN, RS] (kKTerm)
  static constexpr int kEnd = kLk + (kKTerm ? kStages * kBN * RS : 0);
  static constexpr size_t bytes = static_cast<size_t>(kEnd) * sizeof(bf16);
  // After the key loop the merges reuse the whole buffer (Q included: the last tile's barrier has
  // passed every read of it) as f32: [kKeyWarps, kRows, D + 4] O + [kKeyWarps, kRows, 16] O_lr
  // + [kRows, 16] merged O_lr.
  static constexpr int kDP = D + 4;  // f32 row stride: rows gq land on different banks
  static constexpr int kMergeFloats = kKeyWarps * kRows * (kDP + (R > 0 ? 16 : 0)) + (R > 0 ? kRows * 16 : 0);
  static_assert(kMergeFloats * sizeof(float) <= bytes, "the warp merge fits in shared memory");
  static_assert(kMaxSplits * kRows * sizeof(float) <= bytes, "the split merge's weights fit in shared memory");
};

struct V4Launch {
  int n_splits = 1;  // a sequence's keys split evenly over them (the kernel's tps)
  // One sequence (batch-1 steps, agents mode); LRAGENT_ATTN_V4_EVEN_SPLIT=0 (measuring) and
  // batches: every sequence's splits take plan_tps tiles, the split size of max_ctx.
  bool even_split = true;
  int plan_tps = 1;

  int kshift = 0, vshift = 0, lvshift = 0, lkshift = 0;
  // K and V share table, page size and strides, with pages of >= 16 tokens (the engine's caches):
  // a tile's keys sit in 64 >> kshift pages whose block ids load one tile ahead (TileIds).
  bool ids_ahead = false;
  float* part_o = nullptr;    // [n_splits, n_seqs, max_q, n_heads, D] normalised partials
  float* part_lse = nullptr;  // [n_splits, n_seqs, max_q, n_heads] log2-sum-exp
  // The partials are merged by attn_v4_merge_kernel, launched after this one, instead of by each
  // (sequence, kv head)'s last block (agents mode; see merge_kernel_mode).
  bool merge_kernel = false;
  // The step's RoPE and K/V stores done by this launch (attention_decode_rope_store; inactive:
  // q is p.q, already rotated, and the new key's rows are in the caches).
  DecodeRopeStore rs;
};

// ---- rows of a (sequence s, kv head g): row r is query r / G's head g·G + r % G (G = n_heads /
// n_kv_heads, which callers compute once; agents mode: query = agent). The attention kernel and
// attn_v4_merge_kernel both address q, the output and the split partials through these. ----
// Row r's row in q and the output ([n_tokens, n_heads, D]).
__device__ __forceinline__ int64_t v4_out_row(const AttnParams& p, const SeqInfo& si, int g, int G, int r) {
  return static_cast<int64_t>(si.q0 + r / G) * p.n_heads + g * G + r % G;
}
// Row r's row in one split's partials ([n_seqs, max_q, n_heads, D] each).
__device__ __forceinline__ int64_t v4_part_row(const AttnParams& p, int s, int g, int G, int r) {
  return (static_cast<int64_t>(s) * p.max_q + r / G) * p.n_heads + g * G + r % G;
}
// Rows from one split's partials to the next's.
__device__ __forceinline__ int64_t v4_split_stride(const AttnParams& p) {
  return static_cast<int64_t>(p.n_seqs) * p.max_q * p.n_heads;
}

// ---- a row of the split merge: the last block's merge and attn_v4_merge_kernel both use these ----
// On entry w[sp · stride] (sp < n) holds split sp's log2-sum-exp of one row; on return its merge
// weight 2^(lse - max) / Σ (0 for an empty split). A warp does a row: every lane calls it, and
// every lane gets the merged row's log2-sum-exp (AttnParams::lse_out; -inf for no keys).
__device__ __forceinline__ float split_weights(float* w, int stride, int n, int lane) {
  float mx = -INFINITY;
  for (int sp = lane; sp < n; sp += 32) mx = fmaxf(mx, w[sp * stride]);
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float den = 0.f;
  for (int sp = lane; sp < n; sp += 32) {
    const float l = w[sp * stride];
    const float e = l == -INFINITY ? 0.f : exp2f(l - mx);
    w[sp * stride] = e;
    den += e;
  }
  for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
  const float inv = den > 0.f ? 1.f / den : 0.f;
  __syncwarp();
  for (int sp = lane; sp < n; sp += 32) w[sp * stride] *= inv;
  __syncwarp();
  return den > 0.f ? mx + log2f(den) : -INFINITY;
}
// Σ over the n splits of w[sp · stride] · src[sp · src_stride4]: four dimensions of a row, 16-byte
// loads through L2 (the partials were written by other blocks).
__device__ __forceinline__ float4 merge_column(const float4* src, int64_t src_stride4, const float* w, int stride,
                                               int n) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16
  for (int sp = 0; sp < n; ++sp) {
    const float ws = w[sp * stride];
    const float4 v = __ldcg(src + sp * src_stride4);
    acc.x += ws * v.x;
    acc.y += ws * v.y;
    acc.z += ws * v.z;
    acc.w += ws * v.w;
  }
  return acc;
}
// Four merged dimensions to the outputs, at element offset off.
__device__ __forceinline__ void store_merged(const AttnParams& p, int64_t off, const float4& acc) {
  if (p.out) {
    *reinterpret_cast<__nv_bfloat162*>(p.out + off) = __floats2bfloat162_rn(acc.x, acc.y);
    *reinterpret_cast<__nv_bfloat162*>(p.out + off + 2) = __floats2bfloat162_rn(acc.z, acc.w);
  }
  if (p.out_f32) *reinterpret_cast<float4*>(p.out_f32 + off) = acc;
}

// The split merge as a kernel of its own, for agents mode (first for two row tiles, 17-32 rows of
// a kv head; since session 27 at one tile too). At two tiles the last block's merge read 32
// splits x 32 rows (512 KB) from one SM at ~40 GB/s, ~13 of the 8-agent decode's 68 us, and
// neither more loads in flight, half the bytes, a tree of merges nor bulk copies made one SM
// faster (docs/cuda.md). Here a warp merges one row (lane c: its 16-byte column c), the rows of
// every kv head spread over all SMs. PDL-launched: its blocks wait for the attention kernel's
// partials, and the o projection after it for its output.
constexpr int kMergeWarps = 8;
template <int D>
__global__ void __launch_bounds__(32 * kMergeWarps) attn_v4_merge_kernel(const AttnParams p, const V4Launch x) {
  __shared__ float w_s[kMergeWarps][kMaxSplits];  // each warp's row: its splits' merge weights
  pdl_release();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = blockIdx.y, s = blockIdx.z;
  const int G = p.n_heads / p.n_kv_heads;
  const SeqInfo si = seq_info(p, s);
  const int r = blockIdx.x * kMergeWarps + warp;  // row: agent r / G's head g·G + r % G
  pdl_wait();  // the partials are the attention kernel's
  if (r >= si.n_q * G) return;
  const int64_t split_stride = v4_split_stride(p);
  const int64_t prow = v4_part_row(p, s, g, G, r);
  for (int sp = lane; sp < x.n_splits; sp += 32) w_s[warp][sp] = __ldcg(x.part_lse + sp * split_stride + prow);
  const float lse = split_weights(w_s[warp], 1, x.n_splits, lane);
  if (lane == 0 && p.lse_out) p.lse_out[v4_out_row(p, si, g, G, r)] = lse;
  if (lane >= D / 4) return;
  const float4* src = reinterpret_cast<const float4*>(x.part_o + prow * D) + lane;
  store_merged(p, v4_out_row(p, si, g, G, r) * D + 4 * lane,
               merge_column(src, split_stride * (D / 4), w_s[warp], 1, x.n_splits));
}

}  // namespace lragent::cuda::v4
