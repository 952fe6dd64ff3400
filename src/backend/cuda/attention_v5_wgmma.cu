// v5: prefill on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a).
//
// Why: v3 (mma.sync, 4 warps x 32 rows, 2 blocks/SM) tops out near 300 TFLOP/s at the 8B prefill
// shapes, and the Flash-LoRA term's extra 16 mma per 256 (plus their ldmatrix) cost it 8-13%.
// wgmma reads Q, K and V straight from swizzled shared memory (no ldmatrix), one instruction
// covers 64 x N x 16 for a warpgroup, and it runs asynchronously.
//
// Shape: 2 warpgroups x 64 GQA-packed rows = 128 rows per block (v3's grid), 64-key tiles, 3-stage
// cp.async ring (paged K/V: each key row's page is looked up; TMA cannot gather pages of 1 token),
// one barrier per tile (two with the K term), 1 block per SM (132 KB of shared memory; 169 KB
// with both LoRA terms).
//   S = Q·K^T:             8 x wgmma m64n64k16, Q and K from shared memory (K-major, 128-byte
//                          swizzle).
//   [O | O_lr] += P·[V | LRv]: 4 x wgmma m64n128k16 (plain) or m64n144k16 (Flash-LoRA V, rank 8
//                          or 16), P from registers (the S accumulators packed to bf16: wgmma's
//                          accumulator layout is mma.sync's, so they are A fragments as they
//                          stand), V and LRv from shared memory MN-major (transposed B). LRv is a
//                          third 64-column block after V's two, of which 16 columns are used: the
//                          LoRA term is 16 more output columns of the same instruction, so it costs
//                          12.5% of P·V's MMA time and no extra instructions (a separate m64n16
//                          wgmma or mma.sync per warp cost 15-30%: small-N products are inefficient).
//   O += (s·O_lr)·B_v^T:   once per block after the loop (mma.sync per warp, B from global).
//   K residual (ForkKV's deferred RoPE, rank 8 or 16): each tile's keys are rebuilt in place in
//                          the swizzled K tile, K_base + RoPE(s·LRk·B_k^T) (mma.sync per warp,
//                          v2's split), then published to wgmma by a proxy fence and a barrier.
// Issue is the limit at this size, not the tensor cores: the loop was ~900 instructions per warp
// and tile at first (address arithmetic; descriptors moved from regular to uniform registers per
// wgmma); building descriptors once from a warp-uniform warpgroup index, one page lookup per key
// row for K and V, and precomputed row positions took it to ~750 and +10% speed.
// Pipelining: tile t+1's copies are issued right after the barrier of tile t; P·V(t) stays in
// flight across the next barrier and is waited for together with S(t+1) (the stage it reads is
// refilled two tiles later). Tried and dropped (slower): issuing S(t+1) before softmax(t) so
// softmax overlaps P·V (FA3's intra-warpgroup overlap; the extra copies of S cost more than the
// overlap won at this instruction count), and replacing the barrier by per-stage mbarriers so
// the warpgroups drift apart.
// Scope: head_dim 128, no agents mode, K and V ranks 8 or 16 with 16-byte LR rows (or none),
// more than 64 rows per sequence (prefill), an sm_90 device. Everything else runs v4 (decode) /
// v3 / v2 / v1.
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/attention_wgmma_common.cuh"
#include "backend/cuda/wgmma.cuh"

namespace lragent::cuda {

// LR rows copied as 16-byte chunks: rank 8 or 16, rows and blocks 16-byte aligned.
bool attention_lr_rows_16b(const DevLowRank& t) {
  return t.rank <= 16 && attention_lr_copy_chunk(t) == 8;
}

// True when this process's device is a Hopper (sm_90) GPU: the wgmma instructions exist only there.
bool attention_device_is_sm90() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
    return major == 9 && minor == 0;
  }();
  return ok;
}

namespace {

using namespace detail;
using namespace wg;

constexpr int kThreads = 256;
constexpr int kStages = 3;

// Shared memory, byte offsets from a 1024-aligned base (the swizzle pattern's period).
// Q [2 column blocks][128 rows][128 B]; per stage K, V [2 column blocks][64 keys][128 B] and, with
// the Flash-LoRA term, LRv [64 keys][128 B] right after V (a third column block of the P·[V | LRv]
// operand; only its first 32 bytes per row, the 16 rank columns, are written and read), then with
// the K term LRk [64 keys][24] (unswizzled, rows padded for ldmatrix). A 128-byte row holds 64
// bf16; its 16-byte chunk c sits at chunk c ^ (row % 8) (128-byte swizzle).
constexpr int kLkRS = 24;               // LRk tile row stride (elements): 16 + 8, conflict-free ldmatrix
constexpr int kLkBytes = 4096;          // LRk [64 keys][kLkRS] = 3072 B, padded to keep 1024-byte stages
template <bool kLr, bool kK>
struct Smem {
  static constexpr int kLk = 2 * kKVBytes + (kLr ? kLrBytes : 0);  // LRk tile offset in a stage
  static constexpr int kStage = kLk + (kK ? kLkBytes : 0);         // 32768 / 40960 (+ 4096)
  static constexpr int kBytes = kQBytes + kStages * kStage + 1024;  // + alignment slack
  static_assert(kStage % 1024 == 0 && kQBytes % 1024 == 0, "tiles must keep the 1024-byte swizzle period");
};

// kLr: the Flash-LoRA V term (rank 8 or 16) rides in the P·V product as 16 more B columns.
// kK: the K-side residual (rank 8 or 16): each tile's keys are rebuilt in place in shared memory,
// K_j = K_base_j + RoPE_j(s_k · LRk_j · B_k^T), before S = Q·K^T reads them.
template <bool kLr, bool kK>
__global__ void __launch_bounds__(kThreads, 1) attn_v5_kernel(const AttnParams p, const Launch x) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStage = Smem<kLr, kK>::kStage;
  constexpr int kNo = kLr ? 72 : 64;  // accumulator registers: O (64) then O_lr (8)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  unsigned char* const sm = smem_raw + (base - raw_addr);

  // wg through a shuffle: provably warp-uniform, so the descriptors built from it stay in uniform
  // registers (each wgmma takes them from there).
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), lane = tid & 31, wq = (tid >> 5) & 3;
  const int gq = lane >> 2, tq = lane & 3;
  const int s = blockIdx.z / x.n_splits, split = blockIdx.z % x.n_splits;
  const int g = blockIdx.y;
  const int G = p.n_heads / p.n_kv_heads;
  const SeqInfo si = seq_info(p, s);
  const int n_rows = si.n_q * G;
  const int row0 = block_row0();
  if (row0 >= n_rows) return;

  const int i_last = (min(row0 + kBM, n_rows) - 1) / G;
  const int kb = split * x.tiles_per_split * kBN;
  const int ke = min(min(si.ctx, query_pos(p, si, i_last) + 1), kb + x.tiles_per_split * kBN);
  const int n_tiles = ke > kb ? (ke - kb + kBN - 1) / kBN : 0;

  // This warpgroup's 64 rows and this thread's two (hh = 0, 1).
  const WgRows w = wg_rows(p, si, row0, wg, n_rows, G);
  const int wr0 = w.wr0, wg_first_pos = w.first_pos, wg_last_pos = w.last_pos;
  const bool wg_active = w.active;
  const int rpos[2] = {thread_row_pos(p, si, wr0, wq, gq, 0, n_rows, G), thread_row_pos(p, si, wr0, wq, gq, 1, n_rows, G)};
  const float scale_log2 = p.softmax_scale * kLog2e;

  // [kNo / 4 column tiles of 8][4]: this thread's part of the warpgroup's 64 x 128 O, then (kLr)
  // of its 64 x 16 O_lr = P·LRv.
  float o[kNo];
#pragma unroll
  for (int i = 0; i < kNo; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // scaled log2 units
  float l_run[2] = {0.f, 0.f};

  if (n_tiles > 0) {
    // ---- prologue: Q (8 chunks per thread) + tile 0 ----
    const int ld_row = tid >> 4, ld_ch = tid & 15;
#pragma unroll
    for (int i = 0; i < kBM / 16; ++i) {
      const int rr = ld_row + 16 * i, r = row0 + rr;
      const bool ok = r < n_rows;
      const bf16* src =
          ok ? p.q + (static_cast<int64_t>(si.q0 + r / G) * p.n_heads + g * G + r % G) * kD + ld_ch * 8 : p.q;
      cp_async16(sm + sw128(rr, ld_ch, kBM), src, ok ? 16 : 0);
    }
    // Tile t into `stage`: thread (ld_row, ld_ch) copies chunk ld_ch of keys ld_row + 16·i of K and
    // V; with the LR term the first 128 threads copy one LRv chunk each (key tid / 2, chunk tid % 2;
    // chunk 1 of a rank-8 row is zero-filled: the product reads all 16 columns).
    // Row addressing is on the path of every copy: this sequence's page tables and the views'
    // strides are hoisted, and offsets are unsigned 32 x 32 -> 64-bit products (block ids and
    // strides are non-negative and below 2^31, page_size · row_stride too; the launcher checks).
    const PagedRows kv_rows(p.k, s, x.kshift), v_rows(p.v, s, x.vshift);
    const bf16* const gK = p.k.data + g * kD + ld_ch * 8;
    const bf16* const gV = p.v.data + g * kD + ld_ch * 8;
    auto load_tile = [&](int t, int stage) {
      if (t >= n_tiles) return;
      unsigned char* st = sm + kQBytes + stage * kStage;
      const int key0 = kb + t * kBN;
#pragma unroll
      for (int i = 0; i < kBN / 16; ++i) {
        const int kr = ld_row + 16 * i, key = key0 + kr;
        const bool ok = key < ke;
        const uint64_t offk = ok ? kv_rows.offset(key) : 0;
        const uint64_t offv = !ok ? 0 : x.kv_same ? offk : v_rows.offset(key);
        const uint32_t off = sw128(kr, ld_ch, kBN);
        cp_async16(st + off, ok ? gK + offk : p.k.data, ok ? 16 : 0);
        cp_async16(st + kKVBytes + off, ok ? gV + offv : p.v.data, ok ? 16 : 0);
      }
      if constexpr (kLr) {
        if (tid < 2 * kBN) {  // warp-uniform: warps 0..3
          const int kr = tid >> 1, ch = tid & 1, key = key0 + kr;
          const PagedRows lr_rows(p.v_lr.lr, s, x.lvshift);
          const bool ok = key < ke && ch * 8 < p.v_lr.rank;
          const bf16* src = ok ? p.v_lr.lr.data + lr_rows.offset(key) + ch * 8 : p.v_lr.lr.data;
          cp_async16(st + 2 * kKVBytes + kr * 128 + ((ch ^ (kr & 7)) << 4), src, ok ? 16 : 0);
        }
      }
      if constexpr (kK) {
        if (tid >= 2 * kBN) {  // warps 4..7: one LRk chunk each, rows padded for ldmatrix
          const int kr = (tid - 2 * kBN) >> 1, ch = tid & 1, key = key0 + kr;
          const PagedRows lr_rows(p.k_lr.lr, s, x.lkshift);
          const bool ok = key < ke && ch * 8 < p.k_lr.rank;
          const bf16* src = ok ? p.k_lr.lr.data + lr_rows.offset(key) + ch * 8 : p.k_lr.lr.data;
          cp_async16(st + Smem<kLr, kK>::kLk + (kr * kLkRS + ch * 8) * 2, src, ok ? 16 : 0);
        }
      }
    };
    load_tile(0, 0);
    cp_async_commit();

    // Descriptor bases (encoded: the start address field counts 16-byte units, so an offset of b
    // bytes adds b >> 4; addresses stay below 2^18, no carry out of the field).
    // Q (A, K-major): this warpgroup's rows start 64 rows in; a k-step of 16 dims advances 32
    // bytes inside the 128-byte row; dims 64..127 are the next column block. K (B, K-major) alike.
    // V (B, MN-major): 16 keys = two 8-row groups (sbo 1024 B); column blocks (dims 64..127, then
    // LRv) lbo = kKVBytes / 2 apart.
    const uint64_t dq0 = wgmma_desc_sw128(base + wg * 64 * 128, 16, 1024);
    const uint64_t dk0 = wgmma_desc_sw128(base + kQBytes, 16, 1024);
    const uint64_t dv0 = wgmma_desc_sw128(base + kQBytes + kKVBytes, kBN * 128, 1024);

    // K residual: warp w rebuilds keys 16·(w % 4) .. +15 for rotation pairs (i, i + 64), i in
    // groups of 8 starting at 32·(w / 4) (v2's split). Its B_k fragments and inv_freq values are
    // the same for every tile: loaded once.
    [[maybe_unused]] uint32_t bk[4][4];  // [pair group j][b0, b1 of dims d; b0, b1 of dims d + 64] bf16x2
    [[maybe_unused]] float invf[4][2];   // [pair group j][dim d0, d0 + 1]
    [[maybe_unused]] const int warp = tid >> 5, kw = warp & 3, pr0 = (warp >> 2) * 4;
    if constexpr (kK) {
      const int rank = p.k_lr.rank;
      const bf16* bkg = p.k_lr.b + static_cast<int64_t>(g) * kD * rank;
      const int k0 = 2 * tq;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bf16* b1row = bkg + ((pr0 + j) * 8 + gq) * rank;
        const bf16* b2row = bkg + (kD / 2 + (pr0 + j) * 8 + gq) * rank;
        bk[j][0] = ld_b32_guard(b1row + k0, k0 < rank);
        bk[j][1] = ld_b32_guard(b1row + k0 + 8, k0 + 8 < rank);
        bk[j][2] = ld_b32_guard(b2row + k0, k0 < rank);
        bk[j][3] = ld_b32_guard(b2row + k0 + 8, k0 + 8 < rank);
        invf[j][0] = __ldg(p.inv_freq + (pr0 + j) * 8 + 2 * tq);
        invf[j][1] = __ldg(p.inv_freq + (pr0 + j) * 8 + 2 * tq + 1);
      }
    }

    int stage = 0, next_stage = 1;  // t % kStages, (t + 1) % kStages
    for (int t = 0; t < n_tiles; ++t, stage = next_stage, next_stage = next_stage + 1 == kStages ? 0 : next_stage + 1) {
      cp_async_wait<0>();   // tile t landed (this thread's copies) ...
      fence_proxy_async();  // ... visible to wgmma's async proxy ...
      __syncthreads();      // ... and everyone's; the stage of tile t-2 is free (its P·V waited)
      load_tile(t + 1, next_stage);
      cp_async_commit();

      const int key0 = kb + t * kBN;
      if constexpr (kK) {
        // Rebuild this tile's keys in place (every warp, whatever its rows: both warpgroups read
        // them), then publish them to wgmma's async proxy and to the other warps.
        unsigned char* kt = sm + kQBytes + stage * kStage;
        const bf16* lk = reinterpret_cast<const bf16*>(kt + Smem<kLr, kK>::kLk);
        uint32_t la[4];  // A fragment: LRk of this warp's 16 keys x 16 ranks
        ldmatrix_x4(la, lk + (kw * 16 + (lane & 15)) * kLkRS + (lane >> 4) * 8);
        const float sk = p.k_lr.scale;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
          mma_bf16(c1, la, bk[j][0], bk[j][1]);
          mma_bf16(c2, la, bk[j][2], bk[j][3]);
          const int d0 = (pr0 + j) * 8 + 2 * tq;  // dims d0, d0 + 1 and their partners + 64
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int kl = kw * 16 + gq + hh * 8;
            float y1[2], y2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float sn, cs;
              rope_sincos(static_cast<float>(key0 + kl) * invf[j][e], &sn, &cs);
              const float x1 = c1[hh * 2 + e] * sk, x2 = c2[hh * 2 + e] * sk;
              y1[e] = x1 * cs - x2 * sn;
              y2[e] = x2 * cs + x1 * sn;
            }
            // d0 and d0 + 64 sit at the same place of the two 64-column blocks.
            __nv_bfloat162* k1 = reinterpret_cast<__nv_bfloat162*>(kt + sw128(kl, d0 >> 3, kBN) + (d0 & 7) * 2);
            __nv_bfloat162* k2 = reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<unsigned char*>(k1) + kBN * 128);
            const __nv_bfloat162 b1 = *k1, b2 = *k2;
            *k1 = __floats2bfloat162_rn(__low2float(b1) + y1[0], __high2float(b1) + y1[1]);
            *k2 = __floats2bfloat162_rn(__low2float(b2) + y2[0], __high2float(b2) + y2[1]);
          }
        }
        fence_proxy_async();
        __syncthreads();
      }
      if (!wg_active || key0 > wg_last_pos) {  // causal tail: nothing for this warpgroup
        wgmma_wait<0>();                       // P·V(t-1) must finish before its stage is refilled
        wgmma_fence_operand(o);
        continue;
      }
      const uint32_t st_enc = (stage * kStage) >> 4;

      // ---- S = Q·K^T (64 x 64 per warpgroup) ----
      float sc[32];  // S, then P in f32: [8 column tiles of 8 keys][4], this thread's part of 64 x 64
      wgmma_fence_operand(o);
      issue_qk(sc, dq0, dk0, st_enc);
      wgmma_wait<0>();  // S(t), and P·V(t-1) into O
      wgmma_fence_operand(sc);
      wgmma_fence_operand(o);

      // ---- mask + online softmax on raw scores (scale > 0 keeps the order) ----
      float mx[2];
      mask_and_row_max(sc, mx, key0, ke, wg_first_pos, rpos, tq);
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
      float rs[2];
      exp_rows(sc, mneg, scale_log2, rs);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) l_run[hh] = l_run[hh] * alpha[hh] + rs[hh];
#pragma unroll
      for (int i = 0; i < kNo; ++i) o[i] *= alpha[(i >> 1) & 1];

      // ---- [O | O_lr] += P·[V | LRv] (async; waited with the next tile's S) ----
      uint32_t pa[kBN / 16][4];  // P as bf16x2 A fragments: [16-key step][4]
      pack_p(pa, sc);
      issue_pv<kLr>(o, pa, dv0, st_enc);
    }
    wgmma_wait<0>();
    wgmma_fence_operand(o);
    cp_async_wait<0>();  // no copy may still target shared memory when the block exits

    // ---- Flash-LoRA expansion: O += (s_v · O_lr) · B_v^T, once per block (mma.sync per warp) ----
    if constexpr (kLr) {
      if (wg_active) flash_lora_expand(o, p, g, gq, tq);
    }
  }

  // ---- epilogue ----
  store_rows(p, x, si, RowsOut{s, split, g, G, n_rows, wr0, wq, gq, tq}, o, l_run, m_run);
#else
  __trap();  // built without sm_90a: use_v5 is false then (LRAGENT_CUDA_SM90A), v5 is never launched
#endif
}

bool use_v5(const AttnParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  if (p.head_dim != kD || p.agents) return false;
  if (p.v_lr.active() && !attention_lr_rows_16b(p.v_lr)) return false;
  if (p.k_lr.active() && (!attention_lr_rows_16b(p.k_lr) || !p.inv_freq)) return false;
  // Decode shapes: v4; but chunks of 2..64/G queries with a K term, which v4 does not take (one
  // query only), run here rather than on v2: the K rebuild per key tile costs the same at 32 rows
  // as at 128, and v5's costs less than v2's (H200, 8B shapes, 32k keys: 8 queries ran 0.161 ms
  // on v2 against 0.110 for 32 queries here).
  if (p.max_q * G <= 64 && !(p.k_lr.active() && p.max_q > 1)) return false;
#if defined(LRAGENT_CUDA_SM90A)
  return attention_device_is_sm90();
#else
  return false;  // the library was not built for sm_90a: the kernel body is a trap
#endif
}

template <bool kLr, bool kK>
cudaError_t launch(const AttnParams& p, const Launch& x) {
  // Once per process (one device per process in the engine). If the shared memory cannot be
  // granted, clear the error and let the caller run v4 instead.
  static const bool configured = [] {
    if (cudaFuncSetAttribute(attn_v5_kernel<kLr, kK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Smem<kLr, kK>::kBytes) == cudaSuccess)
      return true;
    (void)cudaGetLastError();
    return false;
  }();
  if (!configured) return cudaErrorNotSupported;
  const dim3 grid(attention_prefill_row_tiles(p), p.n_kv_heads, p.n_seqs * x.n_splits);
  attn_v5_kernel<kLr, kK><<<grid, kThreads, Smem<kLr, kK>::kBytes, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace

int attention_v5_num_splits(const AttnParams& p) {
  return use_v5(p) ? attention_prefill_splits(p) : attention_v4_num_splits(p);
}

cudaError_t attention_v5(const AttnParams& p) {
  if (!use_v5(p)) return attention_v4(p);
  const Launch x = plan_launch(p);  // v3's grid and partial format
  const bool vlr = p.v_lr.active(), klr = p.k_lr.active();
  const cudaError_t err = vlr ? (klr ? launch<true, true>(p, x) : launch<true, false>(p, x))
                              : (klr ? launch<false, true>(p, x) : launch<false, false>(p, x));
  if (err == cudaErrorNotSupported) return attention_v4(p);  // no 1-block-per-SM shared memory
  note_attention_kernel(AttnKernel::kV5Wgmma);
  if (err != cudaSuccess || x.n_splits == 1) return err;
  return attention_split_combine(p, x.part_o, x.part_lse, x.n_splits);
}

}  // namespace lragent::cuda
