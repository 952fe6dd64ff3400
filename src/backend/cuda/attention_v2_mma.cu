// v2: v1's FA2-style kernel (mma.sync m16n8k16 bf16 -> f32), reorganised for prefill.
//
// What changed against v1 (attention_v1_mma.cu, kept as the reference):
//   * 8 warps x 16 rows = 128 GQA-packed rows per block (v1: 4 x 16 = 64). Every K/V tile that
//     reaches shared memory now serves twice the rows: half the L2->SM traffic, half the cp.async
//     and page-table work per mma. One block per SM (Q fragments stay in registers: ~180 regs).
//   * 3-stage cp.async ring (2 stages when R = 64, for shared memory) with ONE __syncthreads per
//     tile: the barrier at the top of iteration t both publishes tile t and frees the stage of
//     tile t-1, which is refilled right after it with tile t+2.
//   * Softmax on raw scores: the max is taken before scaling and p = 2^(s·c - m·c) is one FFMA +
//     one MUFU.EX2 (ex2.approx.ftz; exp2f adds the denormal-range fix-up instructions).
//   * Warps skip tiles that lie entirely past their last query (causal tail), and the mask only
//     runs on tiles that cross the diagonal or the end of the split.
//   * K residual: RoPE cos/sin per (key, frequency) computed once per tile into a shared table by
//     all 256 threads (angle = f32(pos)·inv_freq as the CPU, reduced modulo 2π with a two-term
//     Cody-Waite FMA reduction, then MUFU sin/cos: no sincosf slow path, no stack frame). The
//     table is reused by every adapter in agents mode. The 64-key x D rebuild is split over all
//     8 warps (16 keys x D/2 each) instead of 4 warps x 16 keys x D.
// Decode shapes without the K term (rows per sequence <= 64) go to v1, which already reaches the
// memory-bandwidth target there and runs 2 blocks of 4 warps per SM.
// Template: D = head_dim (64, 128), R = padded rank capacity (0: no LR term, 16, 64).
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/device_props.h"

#include <algorithm>

namespace lragent::cuda {
namespace {

using namespace detail;

constexpr int kWarps = 8;
constexpr int kBM = 16 * kWarps;  // rows per block
constexpr int kBN = 64;           // keys per tile
constexpr int kThreads = 32 * kWarps;

template <int D, int R>
struct Smem {
  static constexpr int S = R == 64 ? 2 : 3;  // pipeline stages
  static constexpr int KS = D + 8;           // padded row (elements): conflict-free ldmatrix
  static constexpr int RS = R + 8;
  static constexpr int kQ = 0;                  // Q tile (kBM rows), later reused as Kx (kBN rows)
  static constexpr int kK = kQ + kBM * KS;      // S stages
  static constexpr int kV = kK + S * kBN * KS;  // S stages
  static constexpr int kLk = kV + S * kBN * KS;
  static constexpr int kLv = kLk + (R > 0 ? S * kBN * RS : 0);
  // RoPE table (R > 0): float2 (cos, sin) [D/2][CSS]; frequency-major with a 68-entry row so the
  // rebuild's reads (8 keys x 4 frequencies per warp instruction) are conflict-free.
  static constexpr int CSS = kBN + 4;
  static constexpr int kCs = kLv + (R > 0 ? S * kBN * RS : 0);
  static constexpr size_t bytes =
      static_cast<size_t>(kCs) * sizeof(bf16) + (R > 0 ? static_cast<size_t>(D / 2) * CSS * sizeof(float2) : 0);
};

struct V2Launch {
  int n_splits = 1, tiles_per_split = 1;
  int kshift = 0, vshift = 0, lkshift = 0, lvshift = 0;
  int lk_chunk = 8, lv_chunk = 8;
  float* part_o = nullptr;
  float* part_lse = nullptr;
};

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

template <int D, int R>
__global__ void __launch_bounds__(kThreads, 1) attn_v2_kernel(const AttnParams p, const V2Launch x) {
  using L = Smem<D, R>;
  constexpr int S = L::S;
  constexpr int KS = L::KS, RS = L::RS;
  constexpr int NT_D = D / 8;
  constexpr int KT_D = D / 16;
  constexpr int NT_N = kBN / 8;
  constexpr int NT_R = R / 8;
  constexpr int KT_R = R / 16;
  constexpr int CPR = D / 8;                       // 16-byte chunks per K/V row
  constexpr int LPT = kBN * CPR / kThreads;        // chunks per thread per K (or V) tile
  constexpr int RPI = kThreads / CPR;              // rows covered per loader iteration
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const sm = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sQ = sm + L::kQ;
  bf16* const sKx = sm + L::kQ;
  float2* const sCs = reinterpret_cast<float2*>(sm + L::kCs);

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

  int r_i[2], r_h[2], r_pos[2];
  bool r_ok[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = row0 + warp * 16 + gq + hh * 8;
    r_ok[hh] = r < n_rows;
    r_i[hh] = r / G;
    r_h[hh] = g * G + r % G;
    r_pos[hh] = r_ok[hh] ? query_pos(p, si, r_i[hh]) : -1;
  }
  const int wr0 = row0 + warp * 16;
  const bool warp_active = wr0 < n_rows;
  // Last key any row of this warp can see (causal tail: later tiles are skipped by the warp).
  const int w_last_pos = warp_active ? query_pos(p, si, (min(wr0 + 16, n_rows) - 1) / G) : -1;

  const bool klr = (R > 0) && p.k_lr.active();
  const bool vlr = (R > 0) && p.v_lr.active();
  const float scale_log2 = p.softmax_scale * kLog2e;

  float o[NT_D][4];
#pragma unroll
  for (int n = 0; n < NT_D; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float olr[NT_R > 0 ? NT_R : 1][4];
#pragma unroll
  for (int n = 0; n < (NT_R > 0 ? NT_R : 1); ++n) olr[n][0] = olr[n][1] = olr[n][2] = olr[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // m_run in scaled log2 units

  if (n_tiles > 0) {
    // ---- prologue: Q (group 0), tiles 0..S-2 (one group each) ----
    for (int c = tid; c < kBM * CPR; c += kThreads) {
      const int rr = c / CPR, ch = c % CPR, r = row0 + rr;
      const bool ok = r < n_rows;
      const bf16* src = ok ? p.q + (static_cast<int64_t>(si.q0 + r / G) * p.n_heads + g * G + r % G) * D + ch * 8 : p.q;
      cp_async16(sQ + rr * KS + ch * 8, src, ok ? 16 : 0);
    }
    cp_async_commit();
    if constexpr (R > 0) {
      for (int e = tid; e < 2 * S * kBN * RS; e += kThreads) sm[L::kLk + e] = __float2bfloat16(0.f);
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
        if (klr) load_lr_tile<R>(sm + L::kLk + st * kBN * RS, p.k_lr, s, key0, ke, x.lkshift, x.lk_chunk);
        if (vlr) load_lr_tile<R>(sm + L::kLv + st * kBN * RS, p.v_lr, s, key0, ke, x.lvshift, x.lv_chunk);
      }
    };
#pragma unroll
    for (int t = 0; t < S - 1; ++t) {
      load_tile(t);
      cp_async_commit();
    }

    cp_async_wait<S - 1>();  // Q landed
    __syncthreads();
    uint32_t qf[KT_D][4];
#pragma unroll
    for (int kk = 0; kk < KT_D; ++kk)
      ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * KS + kk * 16 + (lane >> 4) * 8);
    // sQ becomes Kx after the first loop barrier (every warp has its Q fragments by then).

    const int a_lo = p.agents ? i_first : 0, a_hi = p.agents ? i_last : 0;
    const int wa_lo = p.agents ? wr0 / G : 0;
    const int wa_hi = p.agents ? (min(wr0 + 16, n_rows) - 1) / G : 0;

    for (int t = 0; t < n_tiles; ++t) {
      const int st = t % S;
      cp_async_wait<S - 2>();  // tile t landed (this thread's copies)
      __syncthreads();         // ... everyone's; and every warp is done with tile t-1's stage
      load_tile(t + S - 1);    // refill the stage tile t-1 used
      cp_async_commit();

      const int key0 = kb + t * kBN;
      const bf16* cK = sm + L::kK + st * kBN * KS;
      const bf16* cV = sm + L::kV + st * kBN * KS;
      const bool warp_work = warp_active && key0 <= w_last_pos;

      float sc[NT_N][4];
#pragma unroll
      for (int n = 0; n < NT_N; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;

      auto qk = [&](const bf16* kbuf, bool mlo, bool mhi) {
#pragma unroll
        for (int kk = 0; kk < KT_D; ++kk) {
          uint32_t a[4];
          a[0] = mlo ? qf[kk][0] : 0u;
          a[1] = mhi ? qf[kk][1] : 0u;
          a[2] = mlo ? qf[kk][2] : 0u;
          a[3] = mhi ? qf[kk][3] : 0u;
#pragma unroll
          for (int np = 0; np < NT_N / 2; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, kbuf + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * KS + kk * 16 + ((lane >> 3) & 1) * 8);
            mma_bf16(sc[2 * np], a, b[0], b[1]);
            mma_bf16(sc[2 * np + 1], a, b[2], b[3]);
          }
        }
      };

      if constexpr (R > 0) {
        if (klr) {
          // RoPE table for this tile: sCs[i][kl] = (cos, sin)(f32(key0 + kl) · inv_freq[i]).
          for (int e = tid; e < kBN * (D / 2); e += kThreads) {
            const int i = e / kBN, kl = e % kBN;
            float sn, cs;
            rope_sincos(static_cast<float>(key0 + kl) * __ldg(p.inv_freq + i), &sn, &cs);
            sCs[i * L::CSS + kl] = make_float2(cs, sn);
          }
          __syncthreads();
          const bf16* cLk = sm + L::kLk + st * kBN * RS;
          const int rank = p.k_lr.rank;
          const int kw = warp & 3;        // keys 16·kw .. 16·kw + 15
          const int pr0 = (warp >> 2) * (D / 32);  // pairs pr0 .. pr0 + D/32 - 1 (of D/16)
          uint32_t la[KT_R][4];
#pragma unroll
          for (int kk = 0; kk < KT_R; ++kk)
            ldmatrix_x4(la[kk], cLk + (kw * 16 + (lane & 15)) * RS + kk * 16 + (lane >> 4) * 8);
          // Agents mode: adapter a's keys go to Kx buffer (a - a_lo) % 2 (the Q tile holds two), so one
          // barrier per adapter suffices: a warp's rebuild of a + 1 starts after the barrier that
          // follows every warp's QK of a - 1, the last reader of that buffer.
          static_assert(kBM * KS >= 2 * kBN * KS, "the Q tile holds two Kx buffers");
          for (int a = a_lo; a <= a_hi; ++a) {
            bf16* const kx = sKx + ((a - a_lo) & 1) * kBN * KS;
            const bf16* bk = p.k_lr.b + agent_of(p, si, a) * p.k_lr.b_agent_stride + static_cast<int64_t>(g) * D * rank;
#pragma unroll 2
            for (int pr = pr0; pr < pr0 + D / 32; ++pr) {
              float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
              const bf16* b1row = bk + (pr * 8 + gq) * rank;
              const bf16* b2row = bk + (D / 2 + pr * 8 + gq) * rank;
#pragma unroll
              for (int kk = 0; kk < KT_R; ++kk) {
                const int k0 = kk * 16 + 2 * tq;
                if (kk * 16 < rank) {
                  mma_bf16(c1, la[kk], ld_b32_guard(b1row + k0, k0 < rank),
                           ld_b32_guard(b1row + k0 + 8, k0 + 8 < rank));
                  mma_bf16(c2, la[kk], ld_b32_guard(b2row + k0, k0 < rank),
                           ld_b32_guard(b2row + k0 + 8, k0 + 8 < rank));
                }
              }
              const int d0 = pr * 8 + 2 * tq;
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const int kl = kw * 16 + gq + hh * 8;
                float y1[2], y2[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const float2 csn = sCs[(d0 + e) * L::CSS + kl];
                  const float x1 = c1[hh * 2 + e] * p.k_lr.scale, x2 = c2[hh * 2 + e] * p.k_lr.scale;
                  y1[e] = x1 * csn.x - x2 * csn.y;
                  y2[e] = x2 * csn.x + x1 * csn.y;
                }
                const __nv_bfloat162 k1 = *reinterpret_cast<const __nv_bfloat162*>(cK + kl * KS + d0);
                const __nv_bfloat162 k2 = *reinterpret_cast<const __nv_bfloat162*>(cK + kl * KS + d0 + D / 2);
                *reinterpret_cast<__nv_bfloat162*>(kx + kl * KS + d0) =
                    __floats2bfloat162_rn(__low2float(k1) + y1[0], __high2float(k1) + y1[1]);
                *reinterpret_cast<__nv_bfloat162*>(kx + kl * KS + d0 + D / 2) =
                    __floats2bfloat162_rn(__low2float(k2) + y2[0], __high2float(k2) + y2[1]);
              }
            }
            __syncthreads();  // Kx of a is whole
            if (warp_work && a >= wa_lo && a <= wa_hi) {
              const bool mlo = !p.agents || r_i[0] == a, mhi = !p.agents || r_i[1] == a;
              qk(kx, mlo, mhi);
            }
          }
        } else if (warp_work) {
          qk(cK, true, true);
        }
      } else {
        if (warp_work) qk(cK, true, true);
      }
      if (warp_work) {
        // ---- mask + online softmax on raw scores (scale > 0 keeps the order) ----
        const bool need_mask = key0 + kBN > ke || key0 + kBN - 1 > pos_first;
        float mx[2] = {-INFINITY, -INFINITY};
        if (need_mask) {
#pragma unroll
          for (int n = 0; n < NT_N; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int hh = e >> 1;
              const int key = key0 + n * 8 + 2 * tq + (e & 1);
              const bool ok = key < ke && key <= r_pos[hh];
              const float v = ok ? sc[n][e] : -INFINITY;
              sc[n][e] = v;
              mx[hh] = fmaxf(mx[hh], v);
            }
          }
        } else {
#pragma unroll
          for (int n = 0; n < NT_N; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
          }
        }
        float alpha[2], mneg[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
          mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
          const float m_new = fmaxf(m_run[hh], mx[hh] * scale_log2);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          alpha[hh] = fast_exp2(m_run[hh] - m_use);
          m_run[hh] = m_new;
          mneg[hh] = -m_use;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < NT_N; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float pv = fast_exp2(fmaf(sc[n][e], scale_log2, mneg[e >> 1]));
            sc[n][e] = pv;
            rs[e >> 1] += pv;
          }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) l_run[hh] = l_run[hh] * alpha[hh] + rs[hh];
#pragma unroll
        for (int n = 0; n < NT_D; ++n) {
          o[n][0] *= alpha[0];
          o[n][1] *= alpha[0];
          o[n][2] *= alpha[1];
          o[n][3] *= alpha[1];
        }
        if constexpr (R > 0) {
#pragma unroll
          for (int n = 0; n < NT_R; ++n) {
            olr[n][0] *= alpha[0];
            olr[n][1] *= alpha[0];
            olr[n][2] *= alpha[1];
            olr[n][3] *= alpha[1];
          }
        }

        // ---- O += P·V, O_lr += P·LRv ----
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) {
          uint32_t pa[4];
          pa[0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
          pa[1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
          pa[2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
          pa[3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, cV + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + dp * 16 + (lane >> 4) * 8);
            mma_bf16(o[2 * dp], pa, b[0], b[1]);
            mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
          }
          if constexpr (R > 0) {
            if (vlr) {
              const bf16* cLv = sm + L::kLv + st * kBN * RS;
#pragma unroll
              for (int rp = 0; rp < R / 16; ++rp) {
                uint32_t b[4];
                ldmatrix_x4_trans(
                    b, cLv + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RS + rp * 16 + (lane >> 4) * 8);
                mma_bf16(olr[2 * rp], pa, b[0], b[1]);
                mma_bf16(olr[2 * rp + 1], pa, b[2], b[3]);
              }
            }
          }
        }
      }  // warp_work
    }
    cp_async_wait<0>();  // no copy may still target shared memory when the block exits

    // ---- Flash-LoRA expansion: O += (s_v · O_lr) · B_v^T, once per query block ----
    if constexpr (R > 0) {
      if (vlr && warp_active) {
        const int rank = p.v_lr.rank;
        for (int a = wa_lo; a <= wa_hi; ++a) {
          const bool mlo = !p.agents || r_i[0] == a, mhi = !p.agents || r_i[1] == a;
          const bf16* bv = p.v_lr.b + agent_of(p, si, a) * p.v_lr.b_agent_stride + static_cast<int64_t>(g) * D * rank;
          const float sv = p.v_lr.scale;
#pragma unroll
          for (int kk = 0; kk < KT_R; ++kk) {
            if (kk * 16 >= rank) break;
            uint32_t pa[4];
            pa[0] = mlo ? pack_bf16(olr[2 * kk][0] * sv, olr[2 * kk][1] * sv) : 0u;
            pa[1] = mhi ? pack_bf16(olr[2 * kk][2] * sv, olr[2 * kk][3] * sv) : 0u;
            pa[2] = mlo ? pack_bf16(olr[2 * kk + 1][0] * sv, olr[2 * kk + 1][1] * sv) : 0u;
            pa[3] = mhi ? pack_bf16(olr[2 * kk + 1][2] * sv, olr[2 * kk + 1][3] * sv) : 0u;
            const int k0 = kk * 16 + 2 * tq;
#pragma unroll
            for (int n = 0; n < NT_D; ++n) {
              const bf16* brow = bv + (n * 8 + gq) * rank;
              mma_bf16(o[n], pa, ld_b32_guard(brow + k0, k0 < rank), ld_b32_guard(brow + k0 + 8, k0 + 8 < rank));
            }
          }
        }
      }
    }
  }

  // ---- epilogue ----
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l_run[hh] += __shfl_xor_sync(0xffffffffu, l_run[hh], 1);
    l_run[hh] += __shfl_xor_sync(0xffffffffu, l_run[hh], 2);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (!r_ok[hh]) continue;
    const float inv_l = l_run[hh] > 0.f ? 1.f / l_run[hh] : 0.f;
    if (x.n_splits == 1) {
      const int64_t off = (static_cast<int64_t>(si.q0 + r_i[hh]) * p.n_heads + r_h[hh]) * D;
#pragma unroll
      for (int n = 0; n < NT_D; ++n) {
        const int d = n * 8 + 2 * tq;
        const float v0 = o[n][hh * 2] * inv_l, v1 = o[n][hh * 2 + 1] * inv_l;
        if (p.out) *reinterpret_cast<__nv_bfloat162*>(p.out + off + d) = __floats2bfloat162_rn(v0, v1);
        if (p.out_f32) *reinterpret_cast<float2*>(p.out_f32 + off + d) = make_float2(v0, v1);
      }
    } else {
      const int64_t prow = ((static_cast<int64_t>(split) * p.n_seqs + s) * p.max_q + r_i[hh]) * p.n_heads + r_h[hh];
#pragma unroll
      for (int n = 0; n < NT_D; ++n) {
        const int d = n * 8 + 2 * tq;
        *reinterpret_cast<float2*>(x.part_o + prow * D + d) =
            make_float2(o[n][hh * 2] * inv_l, o[n][hh * 2 + 1] * inv_l);
      }
      if (tq == 0) x.part_lse[prow] = l_run[hh] > 0.f ? m_run[hh] + log2f(l_run[hh]) : -INFINITY;
    }
  }
}

// Split-K combine (same as v1's).
__global__ void attn_v2_combine_kernel(const AttnParams p, const V2Launch x) {
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

int rank_capacity(const AttnParams& p) {
  int r = 0;
  if (p.k_lr.active()) r = std::max(r, p.k_lr.rank);
  if (p.v_lr.active()) r = std::max(r, p.v_lr.rank);
  return r == 0 ? 0 : (r <= 16 ? 16 : 64);
}

int row_tiles(const AttnParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  return (p.max_q * G + kBM - 1) / kBM;
}

size_t split_bytes(const AttnParams& p, int n_splits) {
  const size_t rows = static_cast<size_t>(n_splits) * p.n_seqs * p.max_q * p.n_heads;
  return rows * p.head_dim * sizeof(float) + rows * sizeof(float) + 256;
}

// v1 keeps the shapes it is good at: no K term and at most 64 rows per sequence (decode).
bool use_v1(const AttnParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  return !p.k_lr.active() && p.max_q * G <= 64;
}

// One block per SM: about two waves, at least 8 tiles per split.
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

template <int D, int R>
cudaError_t launch(const AttnParams& p, const V2Launch& x) {
  using L = Smem<D, R>;
  static bool configured = [] {
    return cudaFuncSetAttribute(attn_v2_kernel<D, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(L::bytes)) == cudaSuccess;
  }();
  if (!configured) return cudaErrorInvalidConfiguration;
  const dim3 grid(row_tiles(p), p.n_kv_heads, p.n_seqs * x.n_splits);
  attn_v2_kernel<D, R><<<grid, kThreads, L::bytes, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace

int attention_v2_num_splits(const AttnParams& p) {
  return use_v1(p) ? attention_v1_num_splits(p) : choose_splits(p);
}

cudaError_t attention_v2(const AttnParams& p) {
  if (use_v1(p)) return attention_v1(p);
  note_attention_kernel(AttnKernel::kV2Mma);
  V2Launch x;
  x.n_splits = choose_splits(p);
  const int tiles = (p.max_ctx + kBN - 1) / kBN;
  x.tiles_per_split = (tiles + x.n_splits - 1) / x.n_splits;
  x.kshift = ilog2(p.k.page_size);
  x.vshift = ilog2(p.v.page_size);
  if (p.k_lr.active()) {
    x.lkshift = ilog2(p.k_lr.lr.page_size);
    x.lk_chunk = attention_lr_copy_chunk(p.k_lr);
  }
  if (p.v_lr.active()) {
    x.lvshift = ilog2(p.v_lr.lr.page_size);
    x.lv_chunk = attention_lr_copy_chunk(p.v_lr);
  }
  if (x.n_splits > 1) {
    const size_t rows = static_cast<size_t>(x.n_splits) * p.n_seqs * p.max_q * p.n_heads;
    x.part_o = static_cast<float*>(p.workspace);
    x.part_lse = x.part_o + rows * p.head_dim;
  }
  const int R = rank_capacity(p);
  cudaError_t err;
  if (p.head_dim == 64) {
    err = R == 0 ? launch<64, 0>(p, x) : R == 16 ? launch<64, 16>(p, x) : launch<64, 64>(p, x);
  } else {
    err = R == 0 ? launch<128, 0>(p, x) : R == 16 ? launch<128, 16>(p, x) : launch<128, 64>(p, x);
  }
  if (err != cudaSuccess || x.n_splits == 1) return err;
  const dim3 grid(p.max_q, p.n_heads, p.n_seqs);
  attn_v2_combine_kernel<<<grid, p.head_dim, 0, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
