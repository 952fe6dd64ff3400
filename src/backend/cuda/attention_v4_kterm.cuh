// v4's K term in agents mode (kKPerAgent, attention_v4_decode.cu): each warp adds the K terms of
// its row tile's agents to its scores from residual keys built in registers. Included by
// attention_v4_decode.cu only.
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_v4_common.cuh"

namespace lragent::cuda::v4 {

// ---- kKPerAgent: the K term of agents with different B_k, added to one warp's scores ----
// The scores of the warp's rows (r0 + gq, r0 + gq + 8) against its 16 keys (key0..) gain
//   s_k · q_r · RoPE_j(LRk_j · B_k^a^T)   for row r's agent a = r / G,
// the K term of K_j = K_base_j + RoPE_j(...) that the in-place kernel adds to the keys. Each agent
// of the row tile builds its residual keys in registers: one m16n8k16 MMA per 8 dimensions
// (LRk rows as A, B_k^a as B) gives keys gq and gq + 8 at dimensions 8pr + 2tq, +1 in this
// lane, and dimension d + D/2, its RoPE partner, from the MMA of pair group pr + D/16 lands in
// the same lane, so the rotation needs no exchange. The rotated accumulators are already the B
// operand of the QK MMA (k: dimensions, n: keys), whose A is the row tile's Q with the rows of
// the other agents giving terms that are dropped (a row takes only its own agent's sum). sin/cos
// of a (key, dimension) serve every agent of a pass; s_k scales the sum once. B_k comes from
// shared memory in fragment order (bk_frags), one 16-byte load per pair group and agent.
// Costs per 16 keys and agent: 8 + 8 MMAs for D = 128.
// Agents per pass of agents_k_scores: one at one row tile, four at two (H200, 8 x 32k, K and V
// terms r = 16: 3 agents at one tile 0.079 ms with one, 0.088 with four; 8 agents at two tiles
// 0.168 ms with four, 0.170 with one, 0.201 with two).
template <int MT>
constexpr int kAgentsPerPass = MT == 1 ? 1 : 4;
// The agents of one warp's row tile and of its lane's two rows (fixed for the whole key loop).
struct AgentRows {
  int first = 0, last = -1;  // agents with rows in the row tile (last < first: none)
  int lo = 0, hi = 0;        // agents of rows r0 + gq and r0 + gq + 8
};
__device__ __forceinline__ AgentRows agent_rows(int r0, int RB, int G, int gq) {
  AgentRows ar;
  if (r0 >= RB) return ar;
  ar.first = r0 / G;
  ar.last = (min(RB, r0 + kTileRows) - 1) / G;
  ar.lo = (r0 + gq) / G;
  ar.hi = (r0 + gq + 8) / G;
  return ar;
}
// The B operand of the K rebuild's MMAs for lane `lane` and pair group pr of one adapter's B_k
// (bk: its kv head's [D, rank] rows): {b0, b1} of dimension 8pr + gq and {b0, b1} of D/2 + 8pr +
// gq, b0 = ranks 2tq, 2tq + 1, b1 = ranks 2tq + 8, + 9, zero past the rank. The in-place kernel
// holds these in registers, the per-agent one in shared memory (fill_bk_frags).
template <int D>
__device__ __forceinline__ uint4 bk_fragment(const bf16* bk, int rank, int pr, int lane) {
  const int k0 = 2 * (lane & 3);
  const bf16* r1 = bk + (pr * 8 + (lane >> 2)) * rank;
  const bf16* r2 = r1 + (D / 2) * rank;
  return make_uint4(ld_b32_guard(r1 + k0, k0 < rank), ld_b32_guard(r1 + k0 + 8, k0 + 8 < rank),
                    ld_b32_guard(r2 + k0, k0 < rank), ld_b32_guard(r2 + k0 + 8, k0 + 8 < rank));
}
// Every agent's B_k fragments, filled once per block: [agent][pr < D/16][lane] (4 KB an agent at
// D = 128); the block's agents are agent0 .. agent0 + n_agents - 1 (agent_of).
template <int D>
__device__ __forceinline__ void fill_bk_frags(const AttnParams& p, uint4* frags, int agent0, int n_agents, int g,
                                              int tid, int n_threads) {
  const int rank = p.k_lr.rank;
  for (int e = tid; e < n_agents * (D / 16) * 32; e += n_threads) {
    const int ln = e % 32, pr = (e / 32) % (D / 16), a = e / (32 * (D / 16));
    const bf16* b = p.k_lr.b_seq ? p.k_lr.b_seq[agent0 + a]
                                 : p.k_lr.b + (agent0 + static_cast<int64_t>(a)) * p.k_lr.b_agent_stride;
    frags[e] = bk_fragment<D>(b + static_cast<int64_t>(g) * D * rank, rank, pr, ln);
  }
}
// APP: agents per pass, whose residual accumulators are held at once and share the pass's sin/cos.
// key0: the position of the warp's first key (k_pos0 included).
template <int D, int RS, int APP>
__device__ __forceinline__ void agents_k_scores(const AttnParams& p, const bf16* lk, const uint4* bk_frags,
                                                const uint32_t (&qf)[D / 16][4], const AgentRows& ar, int key0,
                                                int lane, float (&sc)[2][4]) {
  constexpr int H = D / 32;  // k-steps of QK over one half of head_dim
  const int gq = lane >> 2, tq = lane & 3;
  uint32_t la[4];  // LRk rows of the 16 keys (A operand, ranks 0..15; zero past the rank)
  ldmatrix_x4(la, lk + (lane & 15) * RS + (lane >> 4) * 8);
  const float ks = p.k_lr.scale;
  for (int a0 = ar.first; a0 <= ar.last; a0 += APP) {
    float sres[APP][2][4] = {};  // [agent of the pass][n8 key tile][C fragment]
#pragma unroll
    for (int kk = 0; kk < H; ++kk) {
      // cos and sin of keys key0 + gq + 8hh at dimensions 16kk + 8pp + 2tq + e.
      float cs[2][2][2], sn[2][2][2];  // [pp][e][hh]
#pragma unroll
      for (int pp = 0; pp < 2; ++pp)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float f = __ldg(p.inv_freq + 16 * kk + 8 * pp + 2 * tq + e);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            detail::rope_sincos(static_cast<float>(key0 + gq + 8 * hh) * f, &sn[pp][e][hh], &cs[pp][e][hh]);
        }
#pragma unroll
      for (int j = 0; j < APP; ++j) {
        const int a = a0 + j;
        if (a > ar.last) break;  // warp-uniform
        const uint4* fr = bk_frags + a * (D / 16) * 32 + lane;
        uint32_t k1[2][2], k2[2][2];  // QK B operands [n8 key tile][k half], dims 16kk.. / D/2 + 16kk..
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
          const uint4 w = fr[(2 * kk + pp) * 32];
          float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
          mma_bf16(c1, la, w.x, w.y);  // keys gq, gq + 8 x dims 16kk + 8pp + 2tq, +1
          mma_bf16(c2, la, w.z, w.w);  // the same at + D/2
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            float y1[2], y2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float x1 = c1[2 * hh + e], x2 = c2[2 * hh + e];
              y1[e] = x1 * cs[pp][e][hh] - x2 * sn[pp][e][hh];
              y2[e] = x2 * cs[pp][e][hh] + x1 * sn[pp][e][hh];
            }
            k1[hh][pp] = pack_bf16(y1[0], y1[1]);
            k2[hh][pp] = pack_bf16(y2[0], y2[1]);
          }
        }
        mma_bf16(sres[j][0], qf[kk], k1[0][0], k1[0][1]);
        mma_bf16(sres[j][1], qf[kk], k1[1][0], k1[1][1]);
        mma_bf16(sres[j][0], qf[kk + H], k2[0][0], k2[0][1]);
        mma_bf16(sres[j][1], qf[kk + H], k2[1][0], k2[1][1]);
      }
    }
    // Each row keeps its own agent's term (C fragment: e < 2 row gq, else row gq + 8).
#pragma unroll
    for (int j = 0; j < APP; ++j) {
      const int a = a0 + j;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if ((e < 2 ? ar.lo : ar.hi) == a) sc[n][e] = fmaf(ks, sres[j][n][e], sc[n][e]);
    }
  }
}

}  // namespace lragent::cuda::v4
