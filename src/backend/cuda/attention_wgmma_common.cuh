// Shared by the Hopper wgmma prefill kernels, v5 (attention_v5_wgmma.cu) and v6
// (attention_v6_wgmma_ws.cu): their tile format, launch plan, paged row addressing, the masked
// row maximum, the Flash-LoRA expansion after the key loop and the epilogue. The two differ only
// in how tiles reach shared memory and how the warpgroups are scheduled, so everything that does
// not depend on that lives here once.
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/wgmma.cuh"

namespace lragent::cuda::wg {

using namespace detail;

constexpr int kD = 128;  // head_dim
constexpr int kBM = 128;  // rows per block (2 warpgroups x 64)
constexpr int kBN = 64;   // keys per tile
// Tile bytes: Q [2 column blocks][128 rows][128 B]; K, V [2 column blocks][64 keys][128 B]; LRv
// [64 keys][128 B] (the third column block of the P·[V | LRv] operand, 16 rank columns used).
constexpr int kQBytes = kBM * kD * 2;   // 32768
constexpr int kKVBytes = kBN * kD * 2;  // 16384 (one K or V tile)
constexpr int kLrBytes = kBN * 128;     // 8192

// Per-launch constants: v3's split plan and the views' page shifts.
struct Launch {
  int n_splits = 1, tiles_per_split = 1;
  int kshift = 0, vshift = 0, lvshift = 0, lkshift = 0;
  bool kv_same = false;  // K and V views share table, page size and strides: one address per row
  float* part_o = nullptr;    // f32 [n_splits, n_seqs, max_q, n_heads, 128], normalised per split
  float* part_lse = nullptr;  // f32 [n_splits, n_seqs, max_q, n_heads], log2-sum-exp
};

// v3's grid (128 GQA-packed rows x 64-key tiles per block) and partial format.
inline Launch plan_launch(const AttnParams& p) {
  Launch x;
  x.n_splits = attention_prefill_splits(p);
  const int tiles = (p.max_ctx + kBN - 1) / kBN;
  x.tiles_per_split = (tiles + x.n_splits - 1) / x.n_splits;
  x.kshift = ilog2(p.k.page_size);
  x.vshift = ilog2(p.v.page_size);
  x.kv_same = kv_share_rows(p);
  if (p.v_lr.active()) x.lvshift = ilog2(p.v_lr.lr.page_size);
  if (p.k_lr.active()) x.lkshift = ilog2(p.k_lr.lr.page_size);
  if (x.n_splits > 1) {
    const size_t rows = static_cast<size_t>(x.n_splits) * p.n_seqs * p.max_q * p.n_heads;
    x.part_o = static_cast<float*>(p.workspace);
    x.part_lse = x.part_o + rows * p.head_dim;
  }
  return x;
}

// One sequence's rows of a paged view: element offset of token t = block(t) · block_stride +
// (t mod page_size) · row_stride.
struct PagedRows {
  const int32_t* table;  // this sequence's block ids
  uint32_t block_stride, row_stride, page_mask;
  int shift;
  __device__ __forceinline__ PagedRows(const DevPagedView& v, int s, int page_shift)
      : table(v.table + static_cast<int64_t>(s) * v.table_stride),
        block_stride(static_cast<uint32_t>(v.block_stride)),
        row_stride(static_cast<uint32_t>(v.row_stride)),
        page_mask(static_cast<uint32_t>(v.page_size - 1)),
        shift(page_shift) {}
  __device__ __forceinline__ uint64_t offset(int t) const {
    return offset_in(static_cast<uint32_t>(__ldg(table + (t >> shift))), t);
  }
  // Offset of token t in block `blk` (table[t >> shift], looked up by the caller ahead of time).
  __device__ __forceinline__ uint64_t offset_in(uint32_t blk, int t) const {
    return static_cast<uint64_t>(blk) * block_stride + (static_cast<uint32_t>(t) & page_mask) * row_stride;
  }
  // Offsets of tokens t and t + 8 (0 for one at or past `end`), where t % 16 < 8: with pages of
  // >= 16 tokens both sit in one page, so one table load serves the two. (v6's producer
  // warpgroup stalled on its table loads, ncu: long scoreboard; halving them took its plain
  // prefill from 383-425 to 449-500 TFLOP/s on the H100. A per-warp copy of the tile's entries
  // handed out by shuffle measured slower: its load sits at the head of every tile.)
  __device__ __forceinline__ void offset_pair(int t, int end, uint64_t (&o)[2]) const {
    o[0] = t < end ? offset(t) : 0;
    o[1] = shift >= 4 ? o[0] + 8ull * row_stride : t + 8 < end ? offset(t + 8) : 0;
  }
};

// The block's first row: row tiles run longest first (block x = 0 takes the last tile, whose
// causal range is the longest), so a causal square does not end on a wave of its longest tiles
// (8k square, H100, one run: v5 358 -> 378 TFLOP/s, v6 398 -> 423).
__device__ __forceinline__ int block_row0() { return static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBM; }

// Byte offset of 16-byte chunk `ch` (0..15 over head_dim 128) of row `row` in a [2][rows][128 B]
// 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t sw128(int row, int ch, int rows) {
  return static_cast<uint32_t>((ch >> 3) * rows * 128 + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
}

// A warpgroup's 64 rows (row0 + 64·wgi ...): their query positions decide the causal mask and
// which key tiles the warpgroup needs.
struct WgRows {
  int wr0;        // the warpgroup's first row
  bool active;    // it has a row below n_rows
  int first_pos;  // position of its first row's query (-1 when inactive)
  int last_pos;   // position of its last row's query (-1 when inactive)
};
__device__ __forceinline__ WgRows wg_rows(const AttnParams& p, const SeqInfo& si, int row0, int wgi, int n_rows, int G) {
  WgRows w;
  w.wr0 = row0 + wgi * 64;
  w.active = w.wr0 < n_rows;
  w.first_pos = w.active ? query_pos(p, si, w.wr0 / G) : -1;
  w.last_pos = w.active ? query_pos(p, si, (min(w.wr0 + 64, n_rows) - 1) / G) : -1;
  return w;
}
// Position of this thread's row hh (0, 1: rows wr0 + 16·wq + gq + 8·hh), -1 past n_rows.
__device__ __forceinline__ int thread_row_pos(const AttnParams& p, const SeqInfo& si, int wr0, int wq, int gq, int hh,
                                              int n_rows, int G) {
  const int r = wr0 + wq * 16 + gq + hh * 8;
  return r < n_rows ? query_pos(p, si, r / G) : -1;
}

// The causal/length mask on a 64 x 64 S tile of a warpgroup and this thread's two row maxima
// (before the quad reduction). sc: [8 column tiles of 8 keys][4], this thread's part of the tile.
// Keys past `ke` or past a row's position (rpos, -1 for no row) become -inf; tiles entirely
// below every row's position and inside the range skip the mask.
__device__ __forceinline__ void mask_and_row_max(float (&sc)[32], float (&mx)[2], int key0, int ke, int first_pos,
                                                 const int (&rpos)[2], int tq) {
  const bool need_mask = key0 + kBN > ke || key0 + kBN - 1 > first_pos;
  mx[0] = mx[1] = -INFINITY;
  if (need_mask) {
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hh = e >> 1;
        const int key = key0 + n * 8 + 2 * tq + (e & 1);
        const bool ok = key < ke && key <= rpos[hh];
        const float v = ok ? sc[4 * n + e] : -INFINITY;
        sc[4 * n + e] = v;
        mx[hh] = fmaxf(mx[hh], v);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sc[i]);
  }
}

// P = exp2(S·scale_log2 - m) in place, with this thread's two row sums. mneg: -m per row (0 for
// a row with no key yet).
__device__ __forceinline__ void exp_rows(float (&sc)[32], const float (&mneg)[2], float scale_log2, float (&rs)[2]) {
  rs[0] = rs[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float pv = fast_exp2(fmaf(sc[i], scale_log2, mneg[(i >> 1) & 1]));
    sc[i] = pv;
    rs[(i >> 1) & 1] += pv;
  }
}

// P (f32, the S accumulator layout) to bf16x2 A fragments of P·V: [16-key step][4]. wgmma's
// accumulator layout is mma.sync's, so they are A fragments as they stand.
__device__ __forceinline__ void pack_p(uint32_t (&pa)[kBN / 16][4], const float (&sc)[32]) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    pa[kk][0] = pack_bf16(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}

// S = Q·K^T for a warpgroup's 64 rows and a 64-key tile (async, committed as one group): 8 x
// m64n64k16 from shared memory. dq0: this warpgroup's Q descriptor; dk0 + st_enc: the stage's K.
__device__ __forceinline__ void issue_qk(float (&sc)[32], uint64_t dq0, uint64_t dk0, uint32_t st_enc) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t col = (kk >> 2), in_row = (kk & 3) * 32;
    const uint64_t da = dq0 + ((col * kBM * 128 + in_row) >> 4);
    const uint64_t db = dk0 + st_enc + ((col * kBN * 128 + in_row) >> 4);
    wgmma_m64n64k16_ss(sc, da, db, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// [O | O_lr] += P·[V | LRv] (async, one group): 4 x m64n128k16, or m64n144k16 with the LRv block
// (kLr); P from registers, V MN-major at dv0 + st_enc. o: [kNo / 4 column tiles of 8][4].
template <bool kLr, int kNo>
__device__ __forceinline__ void issue_pv(float (&o)[kNo], const uint32_t (&pa)[kBN / 16][4], uint64_t dv0,
                                         uint32_t st_enc) {
  wgmma_fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    const uint64_t db = dv0 + st_enc + ((kk * 16 * 128) >> 4);
    if constexpr (kLr)
      wgmma_m64n144k16_rs_tb(o, pa[kk], db, 1);
    else
      wgmma_m64n128k16_rs_tb(o, pa[kk], db, 1);
  }
  wgmma_commit();
}

// Flash-LoRA expansion, once per block after the key loop: O += (s_v · O_lr) · B_v^T (mma.sync
// per warp, B_v fragments from global memory). o: [18 column tiles of 8][4], O (64) then O_lr (8).
__device__ __forceinline__ void flash_lora_expand(float (&o)[72], const AttnParams& p, int g, int gq, int tq) {
  const int rank = p.v_lr.rank;
  const bf16* bv = p.v_lr.b + static_cast<int64_t>(g) * kD * rank;
  const float sv = p.v_lr.scale;
  uint32_t a[4];
  a[0] = pack_bf16(o[64] * sv, o[65] * sv);
  a[1] = pack_bf16(o[66] * sv, o[67] * sv);
  a[2] = pack_bf16(o[68] * sv, o[69] * sv);
  a[3] = pack_bf16(o[70] * sv, o[71] * sv);
  const int k0 = 2 * tq;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    const bf16* brow = bv + (n * 8 + gq) * rank;
    const uint32_t b0 = ld_b32_guard(brow + k0, k0 < rank), b1 = ld_b32_guard(brow + k0 + 8, k0 + 8 < rank);
    float acc[4] = {o[4 * n], o[4 * n + 1], o[4 * n + 2], o[4 * n + 3]};
    mma_bf16(acc, a, b0, b1);
    o[4 * n] = acc[0];
    o[4 * n + 1] = acc[1];
    o[4 * n + 2] = acc[2];
    o[4 * n + 3] = acc[3];
  }
}

// Where a thread's two rows go: the block's sequence, split and kv head, and the thread's place
// in its warpgroup (rows wr0 + 16·wq + gq and + 8).
struct RowsOut {
  int s, split, g, G, n_rows;
  int wr0, wq, gq, tq;
};

// Epilogue: O / l to out (bf16 and/or f32) or, split-K, the normalised partial and its
// log2-sum-exp. o: [kNo / 4 column tiles of 8][4] (the first 64 are O); l_run, m_run per row.
template <int kNo>
__device__ __forceinline__ void store_rows(const AttnParams& p, const Launch& x, const SeqInfo& si, const RowsOut& ro,
                                           const float (&o)[kNo], const float (&l_run)[2], const float (&m_run)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = l_run[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = ro.wr0 + ro.wq * 16 + ro.gq + hh * 8;
    if (r >= ro.n_rows) continue;
    const int ri = r / ro.G, rh = ro.g * ro.G + r % ro.G;
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    if (x.n_splits == 1) {
      const int64_t off = (static_cast<int64_t>(si.q0 + ri) * p.n_heads + rh) * kD;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        const int d = n * 8 + 2 * ro.tq;
        const float v0 = o[4 * n + hh * 2] * inv_l, v1 = o[4 * n + hh * 2 + 1] * inv_l;
        if (p.out) *reinterpret_cast<__nv_bfloat162*>(p.out + off + d) = __floats2bfloat162_rn(v0, v1);
        if (p.out_f32) *reinterpret_cast<float2*>(p.out_f32 + off + d) = make_float2(v0, v1);
      }
    } else {
      const int64_t prow = ((static_cast<int64_t>(ro.split) * p.n_seqs + ro.s) * p.max_q + ri) * p.n_heads + rh;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        const int d = n * 8 + 2 * ro.tq;
        *reinterpret_cast<float2*>(x.part_o + prow * kD + d) =
            make_float2(o[4 * n + hh * 2] * inv_l, o[4 * n + hh * 2 + 1] * inv_l);
      }
      if (ro.tq == 0) x.part_lse[prow] = l > 0.f ? m_run[hh] + log2f(l) : -INFINITY;
    }
  }
}

}  // namespace lragent::cuda::wg
