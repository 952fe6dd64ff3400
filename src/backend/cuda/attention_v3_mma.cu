// v3: prefill kernel with FA2's d=128 layout: 4 warps x 32 rows (two m16 tiles per warp).
//
// What changed against v2 (attention_v2_mma.cu, which v3 falls back to for everything else):
//   * Each warp owns 32 consecutive GQA-packed rows (two m16 tiles) instead of 16, so every K
//     fragment (ldmatrix) and V fragment (ldmatrix.trans) read from shared memory feeds two mmas
//     instead of one. v2 at 1 block/SM was bound by shared-memory bandwidth: per 16 rows and 64
//     keys a warp read the whole K and V tile (32 KB) for 128 mma; v3 reads K + V + Q (40 KB)
//     for 256 mma, i.e. 20 KB per 128 mma (-37.5%).
//   * Q no longer lives in registers (the O accumulators for 32 rows take 128 registers): its
//     A fragments are re-read from shared memory per k-step (the 8 KB above).
//   * 128 threads per block, 128 rows per block (same grid as v2), 2 blocks per SM
//     (__launch_bounds__(128, 2): <= 255 registers), 2-stage cp.async ring with one barrier per
//     tile (v2's ring with S = 2): ~104 KB (plain) / ~110 KB (rank 16) of shared memory per block.
//   * No K-side LoRA term and no agents mode: those (and head_dim 64, rank > 16, decode) run v2,
//     which itself sends decode to v1. v3 is thus the prefill path for plain and Flash-LoRA V.
// Template: R = padded rank capacity (0: no LR term, 16). D = 128 only. kFastLr (v3.1, R = 16
// only): LRv rows allow 16-byte chunks (rank 8/16), one straight-line chunk per thread per tile and
// the LR term compile-time on; ranks 4/12 keep the generic loader (kFastLr = false).
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/device_props.h"

#include <algorithm>

namespace lragent::cuda {
namespace {

using namespace detail;

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 32;
constexpr int kBM = kRowsPerWarp * kWarps;  // rows per block
constexpr int kBN = 64;                     // keys per tile
constexpr int kThreads = 32 * kWarps;
constexpr int kD = 128;

template <int R>
struct Smem {
  static constexpr int S = 2;       // pipeline stages (2 blocks per SM)
  static constexpr int KS = kD + 8;  // padded row (elements): conflict-free ldmatrix
  static constexpr int RS = R + 8;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kBM * KS;
  static constexpr int kV = kK + S * kBN * KS;
  static constexpr int kLv = kV + S * kBN * KS;
  static constexpr int kEnd = kLv + (R > 0 ? S * kBN * RS : 0);
  static constexpr size_t bytes = static_cast<size_t>(kEnd) * sizeof(bf16);
};

struct V3Launch {
  int n_splits = 1, tiles_per_split = 1;
  int kshift = 0, vshift = 0, lvshift = 0;
  int lv_chunk = 8;
  float* part_o = nullptr;
  float* part_lse = nullptr;
};

// v3.1 fast LRv tile load (R = 16, rank 8 or 16 with 16-byte aligned rows): one 16-byte chunk
// per thread (64 keys x 2 chunks = 128 threads), straight-line, no runtime division, so its page
// table lookup issues together with K/V's instead of adding a second exposed latency per tile.
// Chunk 1 of a rank-8 row is zero-filled (columns rank..15 must read as zero in the P·LRv mma).
template <int R>
__device__ __forceinline__ void load_lr_tile_fast(bf16* dst, const DevLowRank& t, int s, int key0, int ke,
                                                  int shift) {
  static_assert(R == 16 && kBN * 2 == kThreads, "fast LRv load: one 16-byte chunk per thread");
  constexpr int RS = R + 8;
  const int kr = threadIdx.x >> 1, ch = threadIdx.x & 1, key = key0 + kr;
  const bool ok = key < ke && ch * 8 < t.rank;
  const bf16* src = ok ? t.lr.data + paged_offset(t.lr, s, key, shift) + ch * 8 : t.lr.data;
  cp_async16(dst + kr * RS + ch * 8, src, ok ? 16 : 0);
}

template <int R>
__device__ __forceinline__ void load_lr_tile(bf16* dst, const DevLowRank& t, int s, int key0, int ke, int shift,
                                             int chunk) {
  constexpr int RS = R + 8;
  const int nch = t.rank / chunk;
  for (int c = threadIdx.x; c < kBN * nch; c += kThreads) {
    const int kr = c / nch, ch = c % nch, key = key0 + kr;
    const bool ok = key < ke;
    const bf16* src = ok ? t.lr.data + paged_offset(t.lr, s, key, shift) + ch * chunk : t.lr.data;
    if (chunk == 8)
      cp_async16(dst + kr * RS + ch * 8, src, ok ? 16 : 0);
    else
      cp_async8(dst + kr * RS + ch * 4, src, ok ? 8 : 0);
  }
}

template <int R, bool kFastLr>
__global__ void __launch_bounds__(kThreads, 2) attn_v3_kernel(const AttnParams p, const V3Launch x) {
  using L = Smem<R>;
  constexpr int D = kD;
  constexpr int S = L::S;
  constexpr int KS = L::KS, RS = L::RS;
  constexpr int NT_D = D / 8;
  constexpr int KT_D = D / 16;
  constexpr int NT_N = kBN / 8;
  constexpr int NT_R = R / 8;
  constexpr int KT_R = R / 16;
  constexpr int CPR = D / 8;                 // 16-byte chunks per K/V row
  constexpr int LPT = kBN * CPR / kThreads;  // chunks per thread per K (or V) tile
  constexpr int RPI = kThreads / CPR;        // rows covered per loader iteration
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const sm = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sQ = sm + L::kQ;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int s = blockIdx.z / x.n_splits, split = blockIdx.z % x.n_splits;
  const int g = blockIdx.y;
  const int G = p.n_heads / p.n_kv_heads;
  const SeqInfo si = seq_info(p, s);
  const int n_rows = si.n_q * G;
  const int row0 = blockIdx.x * kBM;
  if (row0 >= n_rows) return;

  const int i_first = row0 / G;
  const int i_last = (min(row0 + kBM, n_rows) - 1) / G;
  const int pos_first = query_pos(p, si, i_first);
  const int kb = split * x.tiles_per_split * kBN;
  const int ke = min(min(si.ctx, query_pos(p, si, i_last) + 1), kb + x.tiles_per_split * kBN);
  const int n_tiles = ke > kb ? (ke - kb + kBN - 1) / kBN : 0;

  // Row of (m-tile mt, half hh): row0 + warp·32 + mt·16 + hh·8 + gq. Its query position is
  // recomputed where the mask needs it (diagonal tiles only): registers are the tight resource.
  auto row_pos = [&](int mt, int hh) {
    const int r = row0 + warp * kRowsPerWarp + mt * 16 + gq + hh * 8;
    return r < n_rows ? query_pos(p, si, r / G) : -1;
  };
  const int wr0 = row0 + warp * kRowsPerWarp;
  const bool warp_active = wr0 < n_rows;
  const int w_last_pos = warp_active ? query_pos(p, si, (min(wr0 + kRowsPerWarp, n_rows) - 1) / G) : -1;
  // First key that needs masking for this warp: its first row's position + 1 (causal diagonal).
  const int w_first_pos = warp_active ? query_pos(p, si, wr0 / G) : -1;
  (void)pos_first;

  // R > 0 is only launched with an active V-side term (attention_v3 picks launch<16> on
  // p.v_lr.active()), so the LR work is compile-time, not a per-tile runtime branch (v3.1).
  const bool vlr = kFastLr || ((R > 0) && p.v_lr.active());
  const float scale_log2 = p.softmax_scale * kLog2e;

  float o[2][NT_D][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < NT_D; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  float olr[2][NT_R > 0 ? NT_R : 1][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < (NT_R > 0 ? NT_R : 1); ++n) olr[mt][n][0] = olr[mt][n][1] = olr[mt][n][2] = olr[mt][n][3] = 0.f;
  float m_run[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};  // scaled log2 units
  float l_run[2][2] = {{0.f, 0.f}, {0.f, 0.f}};

  if (n_tiles > 0) {
    // ---- prologue: Q + tile 0 (one group) ----
    for (int c = tid; c < kBM * CPR; c += kThreads) {
      const int rr = c / CPR, ch = c % CPR, r = row0 + rr;
      const bool ok = r < n_rows;
      const bf16* src = ok ? p.q + (static_cast<int64_t>(si.q0 + r / G) * p.n_heads + g * G + r % G) * D + ch * 8 : p.q;
      cp_async16(sQ + rr * KS + ch * 8, src, ok ? 16 : 0);
    }
    if constexpr (R > 0 && !kFastLr) {  // the fast load writes all 16 columns of every row itself
      // Rows of LRv past the rank are read by the P·LRv mma (rank < 16 impossible here: rank % 4
      // == 0 and R = 16 only when rank <= 16; columns rank..15 must be zero).
      for (int e = tid; e < S * kBN * RS; e += kThreads) sm[L::kLv + e] = __float2bfloat16(0.f);
      __syncthreads();
    }

    const int ld_row = tid / CPR, ld_ch = tid % CPR;
    auto load_tile = [&](int t) {
      if (t >= n_tiles) return;
      const int st = t % S;
      const int key0 = kb + t * kBN;
      bf16* dK = sm + L::kK + st * kBN * KS + ld_row * KS + ld_ch * 8;
      bf16* dV = sm + L::kV + st * kBN * KS + ld_row * KS + ld_ch * 8;
      const bf16* gK = p.k.data + g * D + ld_ch * 8;
      const bf16* gV = p.v.data + g * D + ld_ch * 8;
#pragma unroll
      for (int i = 0; i < LPT; ++i) {
        const int key = key0 + ld_row + i * RPI;
        const bool ok = key < ke;
        const bf16* srck = ok ? gK + paged_offset(p.k, s, key, x.kshift) : p.k.data;
        const bf16* srcv = ok ? gV + paged_offset(p.v, s, key, x.vshift) : p.v.data;
        cp_async16(dK + i * RPI * KS, srck, ok ? 16 : 0);
        cp_async16(dV + i * RPI * KS, srcv, ok ? 16 : 0);
      }
      if constexpr (R > 0) {
        if constexpr (kFastLr) {
          load_lr_tile_fast<R>(sm + L::kLv + st * kBN * RS, p.v_lr, s, key0, ke, x.lvshift);
        } else {
          if (vlr) load_lr_tile<R>(sm + L::kLv + st * kBN * RS, p.v_lr, s, key0, ke, x.lvshift, x.lv_chunk);
        }
      }
    };
    load_tile(0);
    cp_async_commit();

    // Per-lane ldmatrix offsets (elements).
    const bf16* qbase = sQ + (warp * kRowsPerWarp + (lane & 15)) * KS + (lane >> 4) * 8;
    const int koff = ((lane >> 4) * 8 + (lane & 7)) * KS + ((lane >> 3) & 1) * 8;
    const int voff = (((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (lane >> 4) * 8;

    for (int t = 0; t < n_tiles; ++t) {
      const int st = t % S;
      cp_async_wait<0>();  // tile t (and Q) landed (this thread's copies)
      __syncthreads();     // ... everyone's; and every warp is done with tile t-1's stage
      load_tile(t + 1);    // refill the stage tile t-1 used
      cp_async_commit();

      const int key0 = kb + t * kBN;
      const bf16* cK = sm + L::kK + st * kBN * KS;
      const bf16* cV = sm + L::kV + st * kBN * KS;
      if (!warp_active || key0 > w_last_pos) continue;  // causal tail: nothing for this warp

      // ---- S = Q·K^T for both m-tiles; each K fragment feeds two mmas ----
      float sc[2][NT_N][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < NT_N; ++n) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KT_D; ++kk) {
        uint32_t a0[4], a1[4];
        ldmatrix_x4(a0, qbase + kk * 16);
        ldmatrix_x4(a1, qbase + 16 * KS + kk * 16);
#pragma unroll
        for (int np = 0; np < NT_N / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, cK + np * 16 * KS + koff + kk * 16);
          mma_bf16(sc[0][2 * np], a0, b[0], b[1]);
          mma_bf16(sc[0][2 * np + 1], a0, b[2], b[3]);
          mma_bf16(sc[1][2 * np], a1, b[0], b[1]);
          mma_bf16(sc[1][2 * np + 1], a1, b[2], b[3]);
        }
      }

      // ---- mask + online softmax on raw scores (scale > 0 keeps the order) ----
      const bool need_mask = key0 + kBN > ke || key0 + kBN - 1 > w_first_pos;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float mx[2] = {-INFINITY, -INFINITY};
        if (need_mask) {
          const int rp[2] = {row_pos(mt, 0), row_pos(mt, 1)};
#pragma unroll
          for (int n = 0; n < NT_N; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int hh = e >> 1;
              const int key = key0 + n * 8 + 2 * tq + (e & 1);
              const bool ok = key < ke && key <= rp[hh];
              const float v = ok ? sc[mt][n][e] : -INFINITY;
              sc[mt][n][e] = v;
              mx[hh] = fmaxf(mx[hh], v);
            }
          }
        } else {
#pragma unroll
          for (int n = 0; n < NT_N; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sc[mt][n][e]);
          }
        }
        float alpha[2], mneg[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
          mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
          const float m_new = fmaxf(m_run[mt][hh], mx[hh] * scale_log2);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          alpha[hh] = fast_exp2(m_run[mt][hh] - m_use);
          m_run[mt][hh] = m_new;
          mneg[hh] = -m_use;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < NT_N; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float pv = fast_exp2(fmaf(sc[mt][n][e], scale_log2, mneg[e >> 1]));
            sc[mt][n][e] = pv;
            rs[e >> 1] += pv;
          }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) l_run[mt][hh] = l_run[mt][hh] * alpha[hh] + rs[hh];
#pragma unroll
        for (int n = 0; n < NT_D; ++n) {
          o[mt][n][0] *= alpha[0];
          o[mt][n][1] *= alpha[0];
          o[mt][n][2] *= alpha[1];
          o[mt][n][3] *= alpha[1];
        }
        if constexpr (R > 0) {
#pragma unroll
          for (int n = 0; n < NT_R; ++n) {
            olr[mt][n][0] *= alpha[0];
            olr[mt][n][1] *= alpha[0];
            olr[mt][n][2] *= alpha[1];
            olr[mt][n][3] *= alpha[1];
          }
        }
      }

      // ---- O += P·V, O_lr += P·LRv; each V fragment feeds two mmas ----
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t pa[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          pa[mt][0] = pack_bf16(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
          pa[mt][1] = pack_bf16(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
          pa[mt][2] = pack_bf16(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
          pa[mt][3] = pack_bf16(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, cV + kk * 16 * KS + voff + dp * 16);
          mma_bf16(o[0][2 * dp], pa[0], b[0], b[1]);
          mma_bf16(o[0][2 * dp + 1], pa[0], b[2], b[3]);
          mma_bf16(o[1][2 * dp], pa[1], b[0], b[1]);
          mma_bf16(o[1][2 * dp + 1], pa[1], b[2], b[3]);
        }
        if constexpr (R > 0) {
          if (vlr) {
            const bf16* cLv =
                sm + L::kLv + st * kBN * RS + (((lane >> 3) & 1) * 8 + (lane & 7)) * RS + (lane >> 4) * 8;
#pragma unroll
            for (int rp = 0; rp < R / 16; ++rp) {
              uint32_t b[4];
              ldmatrix_x4_trans(b, cLv + kk * 16 * RS + rp * 16);
              mma_bf16(olr[0][2 * rp], pa[0], b[0], b[1]);
              mma_bf16(olr[0][2 * rp + 1], pa[0], b[2], b[3]);
              mma_bf16(olr[1][2 * rp], pa[1], b[0], b[1]);
              mma_bf16(olr[1][2 * rp + 1], pa[1], b[2], b[3]);
            }
          }
        }
      }
    }
    cp_async_wait<0>();  // no copy may still target shared memory when the block exits

    // ---- Flash-LoRA expansion: O += (s_v · O_lr) · B_v^T, once per query block ----
    if constexpr (R > 0) {
      if (vlr && warp_active) {
        const int rank = p.v_lr.rank;
        const bf16* bv = p.v_lr.b + static_cast<int64_t>(g) * D * rank;
        const float sv = p.v_lr.scale;
#pragma unroll
        for (int kk = 0; kk < KT_R; ++kk) {
          uint32_t pa[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            pa[mt][0] = pack_bf16(olr[mt][2 * kk][0] * sv, olr[mt][2 * kk][1] * sv);
            pa[mt][1] = pack_bf16(olr[mt][2 * kk][2] * sv, olr[mt][2 * kk][3] * sv);
            pa[mt][2] = pack_bf16(olr[mt][2 * kk + 1][0] * sv, olr[mt][2 * kk + 1][1] * sv);
            pa[mt][3] = pack_bf16(olr[mt][2 * kk + 1][2] * sv, olr[mt][2 * kk + 1][3] * sv);
          }
          const int k0 = kk * 16 + 2 * tq;
#pragma unroll
          for (int n = 0; n < NT_D; ++n) {
            const bf16* brow = bv + (n * 8 + gq) * rank;
            const uint32_t b0 = ld_b32_guard(brow + k0, k0 < rank), b1 = ld_b32_guard(brow + k0 + 8, k0 + 8 < rank);
            mma_bf16(o[0][n], pa[0], b0, b1);
            mma_bf16(o[1][n], pa[1], b0, b1);
          }
        }
      }
    }
  }

  // ---- epilogue ----
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = l_run[mt][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = row0 + warp * kRowsPerWarp + mt * 16 + gq + hh * 8;
      if (r >= n_rows) continue;
      const int ri = r / G, rh = g * G + r % G;
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      if (x.n_splits == 1) {
        const int64_t off = (static_cast<int64_t>(si.q0 + ri) * p.n_heads + rh) * D;
#pragma unroll
        for (int n = 0; n < NT_D; ++n) {
          const int d = n * 8 + 2 * tq;
          const float v0 = o[mt][n][hh * 2] * inv_l, v1 = o[mt][n][hh * 2 + 1] * inv_l;
          if (p.out) *reinterpret_cast<__nv_bfloat162*>(p.out + off + d) = __floats2bfloat162_rn(v0, v1);
          if (p.out_f32) *reinterpret_cast<float2*>(p.out_f32 + off + d) = make_float2(v0, v1);
        }
      } else {
        const int64_t prow = ((static_cast<int64_t>(split) * p.n_seqs + s) * p.max_q + ri) * p.n_heads + rh;
#pragma unroll
        for (int n = 0; n < NT_D; ++n) {
          const int d = n * 8 + 2 * tq;
          *reinterpret_cast<float2*>(x.part_o + prow * D + d) =
              make_float2(o[mt][n][hh * 2] * inv_l, o[mt][n][hh * 2 + 1] * inv_l);
        }
        if (tq == 0) x.part_lse[prow] = l > 0.f ? m_run[mt][hh] + log2f(l) : -INFINITY;
      }
    }
  }
}

// Split-K combine (same as v1's / v2's).
__global__ void attn_v3_combine_kernel(const AttnParams p, const V3Launch x) {
  const int i = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const int q0 = p.q_start[s], n_q = p.q_start[s + 1] - q0;
  if (i >= n_q) return;
  const int D = p.head_dim;
  const int64_t stride = static_cast<int64_t>(p.n_seqs) * p.max_q * p.n_heads;
  const int64_t base = (static_cast<int64_t>(s) * p.max_q + i) * p.n_heads + h;
  float mx = -INFINITY;
  for (int sp = 0; sp < x.n_splits; ++sp) mx = fmaxf(mx, x.part_lse[sp * stride + base]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int sp = 0; sp < x.n_splits; ++sp) {
      const float lse = x.part_lse[sp * stride + base];
      if (lse == -INFINITY) continue;
      const float w = exp2f(lse - mx);
      num += w * x.part_o[(sp * stride + base) * D + d];
      den += w;
    }
    const float v = den > 0.f ? num / den : 0.f;
    const int64_t off = (static_cast<int64_t>(q0 + i) * p.n_heads + h) * D + d;
    if (p.out) p.out[off] = __float2bfloat16(v);
    if (p.out_f32) p.out_f32[off] = v;
  }
}

int row_tiles(const AttnParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  return (p.max_q * G + kBM - 1) / kBM;
}

size_t split_bytes(const AttnParams& p, int n_splits) {
  const size_t rows = static_cast<size_t>(n_splits) * p.n_seqs * p.max_q * p.n_heads;
  return rows * p.head_dim * sizeof(float) + rows * sizeof(float) + 256;
}

// v3 takes d = 128 prefill-shaped work without the K term or agents mode, rank <= 16.
bool use_v3(const AttnParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  if (p.head_dim != kD || p.agents || p.k_lr.active()) return false;
  if (p.v_lr.active() && p.v_lr.rank > 16) return false;
  return p.max_q * G > 64;  // decode shapes stay on v2 -> v1
}

// Two blocks per SM: about two waves of them, at least 8 tiles per split.
int choose_splits(const AttnParams& p) {
  const int tiles = (p.max_ctx + kBN - 1) / kBN;
  int n = p.num_splits;
  if (n <= 0) {
    const int blocks = row_tiles(p) * p.n_kv_heads * p.n_seqs;
    const int target = 2 * sm_count();
    n = std::max(1, target / blocks);
    n = std::min(n, std::max(1, tiles / 8));
    n = std::min(n, 128);
  }
  n = std::max(1, std::min({n, tiles, max_grid_splits(p)}));
  if (!p.workspace) return 1;
  while (n > 1 && split_bytes(p, n) > p.workspace_bytes) --n;
  const int tps = (tiles + n - 1) / n;
  return (tiles + tps - 1) / tps;
}

template <int R, bool kFastLr = false>
cudaError_t launch(const AttnParams& p, const V3Launch& x) {
  using L = Smem<R>;
  static bool configured = [] {
    return cudaFuncSetAttribute(attn_v3_kernel<R, kFastLr>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(L::bytes)) == cudaSuccess;
  }();
  if (!configured) return cudaErrorInvalidConfiguration;
  const dim3 grid(row_tiles(p), p.n_kv_heads, p.n_seqs * x.n_splits);
  attn_v3_kernel<R, kFastLr><<<grid, kThreads, L::bytes, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attention_split_combine(const AttnParams& p, float* part_o, float* part_lse, int n_splits) {
  V3Launch x;
  x.n_splits = n_splits;
  x.part_o = part_o;
  x.part_lse = part_lse;
  const dim3 grid(p.max_q, p.n_heads, p.n_seqs);
  attn_v3_combine_kernel<<<grid, p.head_dim, 0, p.stream>>>(p, x);
  return cudaGetLastError();
}

int attention_prefill_row_tiles(const AttnParams& p) { return row_tiles(p); }
int attention_prefill_splits(const AttnParams& p) { return choose_splits(p); }

int attention_v3_num_splits(const AttnParams& p) {
  return use_v3(p) ? choose_splits(p) : attention_v2_num_splits(p);
}

cudaError_t attention_v3(const AttnParams& p) {
  if (!use_v3(p)) return attention_v2(p);
  note_attention_kernel(AttnKernel::kV3Mma);
  V3Launch x;
  x.n_splits = choose_splits(p);
  const int tiles = (p.max_ctx + kBN - 1) / kBN;
  x.tiles_per_split = (tiles + x.n_splits - 1) / x.n_splits;
  x.kshift = ilog2(p.k.page_size);
  x.vshift = ilog2(p.v.page_size);
  if (p.v_lr.active()) {
    x.lvshift = ilog2(p.v_lr.lr.page_size);
    x.lv_chunk = attention_lr_copy_chunk(p.v_lr);
  }
  if (x.n_splits > 1) {
    const size_t rows = static_cast<size_t>(x.n_splits) * p.n_seqs * p.max_q * p.n_heads;
    x.part_o = static_cast<float*>(p.workspace);
    x.part_lse = x.part_o + rows * p.head_dim;
  }
  cudaError_t err;
  if (!p.v_lr.active())
    err = launch<0>(p, x);
  else if (x.lv_chunk == 8)  // rank 8 or 16, 16-byte aligned rows (v3.1 fast LRv load)
    err = launch<16, true>(p, x);
  else
    err = launch<16>(p, x);
  if (err != cudaSuccess || x.n_splits == 1) return err;
  return attention_split_combine(p, x.part_o, x.part_lse, x.n_splits);
}

}  // namespace lragent::cuda
