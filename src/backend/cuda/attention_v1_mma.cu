// v1: FA2-style paged flash attention on tensor cores (mma.sync m16n8k16 bf16 -> f32).
//
// One block = 4 warps = 64 "rows" x one kv head x one key split of one sequence. Rows are
// GQA-packed (row = query·G + head-in-group), so a K/V tile loaded once serves all G query
// heads of its kv head; prefill, batched decode (n_q = 1, rows = G) and shared-base multi-agent
// decode (rows = agents·G, all at the same position) are the same kernel. Per 64-key tile:
//   cp.async (zero-filled past the end) K, V, LRk, LRv tiles into a 2-stage ring;
//   [K residual]  Kx = K_base + RoPE_j(s_k·LRk·B_k^T) rebuilt in shared memory with mma
//                 (per adapter in agents mode; other rows masked out of the Q operand);
//   S = Q·K^T (Q fragments in registers), causal/split mask, online softmax (exp2);
//   O += P·V_base and O_lr += P·LRv (P reused from the S accumulators as the A operand).
// End: O += (s_v·O_lr)·B_v^T with one more mma per (adapter, 16 ranks), then /l, or a
// normalised partial + log-sum-exp for the split-K combine kernel.
// Template: D = head_dim (64, 128), R = padded rank capacity (0: no LR term, 16, 64).
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/device_props.h"
#include "backend/cuda/pdl.cuh"

#include <algorithm>

namespace lragent::cuda {
namespace {

using namespace detail;

constexpr int kBM = 64;  // rows per block (4 warps x 16)
constexpr int kBN = 64;  // keys per tile
constexpr int kThreads = 128;

template <int D, int R>
struct Smem {
  static constexpr int KS = D + 8;  // padded row (elements): conflict-free ldmatrix
  static constexpr int RS = R + 8;
  static constexpr int kQ = 0;                   // Q tile, later reused as Kx
  static constexpr int kK = kQ + kBM * KS;       // 2 stages
  static constexpr int kV = kK + 2 * kBN * KS;   // 2 stages
  static constexpr int kLk = kV + 2 * kBN * KS;  // 2 stages (R > 0)
  static constexpr int kLv = kLk + (R > 0 ? 2 * kBN * RS : 0);
  static constexpr int kEnd = kLv + (R > 0 ? 2 * kBN * RS : 0);
  static constexpr size_t bytes = static_cast<size_t>(kEnd) * sizeof(bf16);
};

// Launch-time constants computed on the host.
struct V1Launch {
  int n_splits = 1, tiles_per_split = 1;
  int kshift = 0, vshift = 0, lkshift = 0, lvshift = 0;
  int lk_chunk = 8, lv_chunk = 8;  // elements per cp.async of an LR row (8: 16 B, 4: 8 B)
  float* part_o = nullptr;         // [n_splits, n_seqs, max_q, n_heads, D] normalised partials
  float* part_lse = nullptr;       // [n_splits, n_seqs, max_q, n_heads] log2-sum-exp
};

// Async copy of one LR tile (BN rows x rank) into smem rows of RS elements.
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
__global__ void __launch_bounds__(kThreads) attn_v1_kernel(const AttnParams p, const V1Launch x) {
  using L = Smem<D, R>;
  constexpr int KS = L::KS, RS = L::RS;
  constexpr int NT_D = D / 8;    // n-tiles over head_dim
  constexpr int KT_D = D / 16;   // k-steps over head_dim
  constexpr int NT_N = kBN / 8;  // n-tiles over keys
  constexpr int NT_R = R / 8;
  constexpr int KT_R = R / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const sm = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sQ = sm + L::kQ;
  bf16* const sKx = sm + L::kQ;  // aliases Q once Q lives in registers

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int s = blockIdx.z / x.n_splits, split = blockIdx.z % x.n_splits;
  const int g = blockIdx.y;
  const int G = p.n_heads / p.n_kv_heads;
  const SeqInfo si = seq_info(p, s);
  const int n_rows = si.n_q * G;
  const int row0 = blockIdx.x * kBM;
  if (row0 >= n_rows) return;  // nothing to compute; the combine never reads these rows

  const int i_first = row0 / G;
  const int i_last = (min(row0 + kBM, n_rows) - 1) / G;
  const int pos_first = query_pos(p, si, i_first);  // smallest query position in the block
  const int kb = split * x.tiles_per_split * kBN;
  const int ke = min(min(si.ctx, query_pos(p, si, i_last) + 1), kb + x.tiles_per_split * kBN);
  const int n_tiles = ke > kb ? (ke - kb + kBN - 1) / kBN : 0;

  // This thread's two rows (accumulator rows gq and gq + 8 of the warp's 16).
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

  const bool klr = (R > 0) && p.k_lr.active();
  const bool vlr = (R > 0) && p.v_lr.active();
  const float scale_log2 = p.softmax_scale * kLog2e;

  float o[NT_D][4];
#pragma unroll
  for (int n = 0; n < NT_D; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float olr[NT_R > 0 ? NT_R : 1][4];
#pragma unroll
  for (int n = 0; n < (NT_R > 0 ? NT_R : 1); ++n) olr[n][0] = olr[n][1] = olr[n][2] = olr[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  if (n_tiles > 0) {
    // ---- prologue: Q (group 0), tile 0 (group 1) ----
    for (int c = tid; c < kBM * (D / 8); c += kThreads) {
      const int rr = c / (D / 8), ch = c % (D / 8), r = row0 + rr;
      const bool ok = r < n_rows;
      const bf16* src = ok ? p.q + (static_cast<int64_t>(si.q0 + r / G) * p.n_heads + g * G + r % G) * D + ch * 8 : p.q;
      cp_async16(sQ + rr * KS + ch * 8, src, ok ? 16 : 0);
    }
    cp_async_commit();
    if constexpr (R > 0) {
      // Columns rank..R-1 of the LR tiles are never written by cp.async: zero them once.
      for (int e = tid; e < 4 * kBN * RS; e += kThreads) sm[L::kLk + e] = __float2bfloat16(0.f);
      __syncthreads();
    }

    auto load_tile = [&](int t, int st) {
      const int key0 = kb + t * kBN;
      bf16* dK = sm + L::kK + st * kBN * KS;
      bf16* dV = sm + L::kV + st * kBN * KS;
      for (int c = tid; c < kBN * (D / 8); c += kThreads) {
        const int kr = c / (D / 8), ch = c % (D / 8), key = key0 + kr;
        const bool ok = key < ke;
        const bf16* srck = ok ? p.k.data + paged_offset(p.k, s, key, x.kshift) + g * D + ch * 8 : p.k.data;
        const bf16* srcv = ok ? p.v.data + paged_offset(p.v, s, key, x.vshift) + g * D + ch * 8 : p.v.data;
        cp_async16(dK + kr * KS + ch * 8, srck, ok ? 16 : 0);
        cp_async16(dV + kr * KS + ch * 8, srcv, ok ? 16 : 0);
      }
      if constexpr (R > 0) {
        if (klr) load_lr_tile<R>(sm + L::kLk + st * kBN * RS, p.k_lr, s, key0, ke, x.lkshift, x.lk_chunk);
        if (vlr) load_lr_tile<R>(sm + L::kLv + st * kBN * RS, p.v_lr, s, key0, ke, x.lvshift, x.lv_chunk);
      }
    };
    load_tile(0, 0);
    cp_async_commit();

    // Q fragments into registers (A operand, 16 rows x D per warp).
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[KT_D][4];
#pragma unroll
    for (int kk = 0; kk < KT_D; ++kk)
      ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * KS + kk * 16 + (lane >> 4) * 8);
    __syncthreads();  // sQ becomes Kx

    // Adapters present in this block / warp (agents mode); one shared adapter otherwise.
    const int a_lo = p.agents ? i_first : 0, a_hi = p.agents ? i_last : 0;
    const int wr0 = row0 + warp * 16;
    const int wa_lo = p.agents ? wr0 / G : 0;
    const int wa_hi = p.agents ? (min(wr0 + 16, n_rows) - 1) / G : 0;  // < wa_lo: warp has no rows
    // Warps whose 16 rows are all padding (decode: G < 64 rows) only help load and rebuild K.
    const bool warp_active = wr0 < n_rows;

    for (int t = 0; t < n_tiles; ++t) {
      const int st = t & 1;
      if (t + 1 < n_tiles) {
        load_tile(t + 1, st ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const int key0 = kb + t * kBN;
      const bf16* cK = sm + L::kK + st * kBN * KS;
      const bf16* cV = sm + L::kV + st * kBN * KS;

      float sc[NT_N][4];
#pragma unroll
      for (int n = 0; n < NT_N; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;

      // S += Qmasked · Kbuf^T
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
          const bf16* cLk = sm + L::kLk + st * kBN * RS;
          const int rank = p.k_lr.rank;
          for (int a = a_lo; a <= a_hi; ++a) {
            // Kx[key] = K[key] + RoPE_key(s_k · LRk[key] · B_k[a, g]^T); warp w rebuilds keys 16w..16w+15.
            const bf16* bk = p.k_lr.b + agent_of(p, si, a) * p.k_lr.b_agent_stride + static_cast<int64_t>(g) * D * rank;
            uint32_t la[KT_R][4];
#pragma unroll
            for (int kk = 0; kk < KT_R; ++kk)
              ldmatrix_x4(la[kk], cLk + (warp * 16 + (lane & 15)) * RS + kk * 16 + (lane >> 4) * 8);
#pragma unroll 2
            for (int pr = 0; pr < D / 16; ++pr) {
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
              const float f0 = __ldg(p.inv_freq + d0), f1 = __ldg(p.inv_freq + d0 + 1);
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const int kl = warp * 16 + gq + hh * 8;
                const float pos = static_cast<float>(key0 + kl);
                float y1[2], y2[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  float sn, cs;
                  sincosf(pos * (e ? f1 : f0), &sn, &cs);
                  const float x1 = c1[hh * 2 + e] * p.k_lr.scale, x2 = c2[hh * 2 + e] * p.k_lr.scale;
                  y1[e] = x1 * cs - x2 * sn;
                  y2[e] = x2 * cs + x1 * sn;
                }
                const __nv_bfloat162 k1 = *reinterpret_cast<const __nv_bfloat162*>(cK + kl * KS + d0);
                const __nv_bfloat162 k2 = *reinterpret_cast<const __nv_bfloat162*>(cK + kl * KS + d0 + D / 2);
                *reinterpret_cast<__nv_bfloat162*>(sKx + kl * KS + d0) =
                    __floats2bfloat162_rn(__low2float(k1) + y1[0], __high2float(k1) + y1[1]);
                *reinterpret_cast<__nv_bfloat162*>(sKx + kl * KS + d0 + D / 2) =
                    __floats2bfloat162_rn(__low2float(k2) + y2[0], __high2float(k2) + y2[1]);
              }
            }
            __syncthreads();
            if (warp_active && a >= wa_lo && a <= wa_hi) {
              const bool mlo = !p.agents || r_i[0] == a, mhi = !p.agents || r_i[1] == a;
              qk(sKx, mlo, mhi);
            }
            __syncthreads();  // Kx is rebuilt for the next adapter / tile
          }
        } else if (warp_active) {
          qk(cK, true, true);
        }
      } else {
        if (warp_active) qk(cK, true, true);
      }
      if (warp_active) {  // ---- softmax and P·V: warps with real rows only ----

        // ---- mask + online softmax (log2 domain) ----
        // Interior tiles (every key visible to every row of the block) skip the mask.
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
              const float v = ok ? sc[n][e] * scale_log2 : -INFINITY;
              sc[n][e] = v;
              mx[hh] = fmaxf(mx[hh], v);
            }
          }
        } else {
#pragma unroll
          for (int n = 0; n < NT_N; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float v = sc[n][e] * scale_log2;
              sc[n][e] = v;
              mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
          }
        }
        float alpha[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
          mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
          const float m_new = fmaxf(m_run[hh], mx[hh]);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          alpha[hh] = exp2f(m_run[hh] - m_use);
          m_run[hh] = m_new;
          mx[hh] = m_use;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < NT_N; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float pv = exp2f(sc[n][e] - mx[e >> 1]);
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
      }                 // warp_active
      __syncthreads();  // this stage is refilled by the next iteration's prefetch
    }

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

// Split-K combine: out = sum_s 2^(lse_s - lse_max) · O_s / sum_s 2^(lse_s - lse_max).
// The first warp turns the split LSEs into normalised weights in shared memory (lanes in
// parallel: a serial loop over 32+ splits was a chain of dependent global loads, 9 us per layer
// in a 4k decode); then every thread sums its dimension with the loads unrolled.
constexpr int kMaxSplits = 128;
__global__ void attn_combine_kernel(const AttnParams p, const V1Launch x) {
  __shared__ float w_s[kMaxSplits];  // [split] weight / sum of weights
  pdl_release();  // the o-projection GEMV may be scheduled now (it waits for our completion)
  const int i = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const int q0 = p.q_start[s], n_q = p.q_start[s + 1] - q0;
  if (i >= n_q) return;
  const int D = p.head_dim;
  const int n_splits = x.n_splits;
  const int64_t stride = static_cast<int64_t>(p.n_seqs) * p.max_q * p.n_heads;
  const int64_t base = (static_cast<int64_t>(s) * p.max_q + i) * p.n_heads + h;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float lse[kMaxSplits / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) {
      const int sp = lane + 32 * k;
      lse[k] = sp < n_splits ? x.part_lse[sp * stride + base] : -INFINITY;
      mx = fmaxf(mx, lse[k]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float den = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) {
      lse[k] = lse[k] == -INFINITY ? 0.f : exp2f(lse[k] - mx);
      den += lse[k];
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k)
      if (lane + 32 * k < n_splits) w_s[lane + 32 * k] = lse[k] * inv;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < n_splits; ++sp) v += w_s[sp] * x.part_o[(sp * stride + base) * D + d];
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

// Splits so that the grid fills about two waves of 2 blocks per SM (the plain kernels' occupancy)
// without spilling into a third, with at least 2 tiles per split: a batch-1 decode over 4k tokens
// (8 KV heads) then runs 32 splits, not 8 (the old floor of 8 tiles per split): with 8 the 64
// blocks left half the SMs idle and each walked 8 tiles serially (H100: 31 us per layer against
// ~6 us of bytes; 2 tiles per split: 14 us + 5.6 us combine; 1 tile: 15.6 + 8.4).
int choose_splits(const AttnParams& p) {
  const int tiles = (p.max_ctx + kBN - 1) / kBN;
  int n = p.num_splits;
  if (n <= 0) {
    const int blocks = row_tiles(p) * p.n_kv_heads * p.n_seqs;
    const int target = 4 * sm_count();
    n = std::max(1, target / blocks);
    n = std::min(n, std::max(1, tiles / 2));
    n = std::min(n, kMaxSplits);
  }
  n = std::max(1, std::min({n, tiles, kMaxSplits, max_grid_splits(p)}));
  if (!p.workspace) return 1;
  while (n > 1 && split_bytes(p, n) > p.workspace_bytes) --n;
  // Even out: every split gets the same whole number of tiles.
  const int tps = (tiles + n - 1) / n;
  return (tiles + tps - 1) / tps;
}

template <int D, int R>
cudaError_t launch(const AttnParams& p, const V1Launch& x) {
  using L = Smem<D, R>;
  static bool configured = [] {
    return cudaFuncSetAttribute(attn_v1_kernel<D, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(L::bytes)) == cudaSuccess;
  }();
  if (!configured) return cudaErrorInvalidConfiguration;
  const dim3 grid(row_tiles(p), p.n_kv_heads, p.n_seqs * x.n_splits);
  attn_v1_kernel<D, R><<<grid, kThreads, L::bytes, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace

int attention_v1_num_splits(const AttnParams& p) { return choose_splits(p); }

size_t attention_v1_workspace_bytes(const AttnParams& p, int max_splits) {
  return split_bytes(p, std::max(1, max_splits));
}

cudaError_t attention_v1(const AttnParams& p) {
  note_attention_kernel(AttnKernel::kV1Mma);
  V1Launch x;
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
  attn_combine_kernel<<<grid, p.head_dim, 0, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
