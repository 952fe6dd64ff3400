// v6: v5's wgmma prefill, warp-specialised: a producer warpgroup fills a ring of K/V(/LRv) tiles
// with cp.async and per-stage mbarriers, and two consumer warpgroups (64 GQA-packed rows each)
// only compute, taking turns at the tensor cores (FA3's ping-pong).
//
// Why: v5 is latency-bound, not tensor-bound (ncu: tensor pipe ~33%). Both of its warpgroups
// meet at a block barrier every tile, so they issue S = Q·K^T together, wait together and run
// their softmax together while the tensor cores idle; its copies and their address arithmetic
// also sit in the same warps as the math. Here no block-wide barrier remains in the loop:
//   - the producer warpgroup (registers cut to 56 by setmaxnreg) copies tile t into stage
//     t % kStages once the consumers have released that stage (the `empty` mbarrier), and each
//     producer thread's copies arrive on the stage's `full` mbarrier when they land
//     (cp.async.mbarrier.arrive.noinc);
//   - a consumer warpgroup waits on `full`, issues S(t) only in its turn (two named barriers:
//     warpgroup 0 issues, signals warpgroup 1, which issues and signals back), so while one
//     warpgroup runs its softmax the other's products run; P·V(t) is issued after the softmax
//     and waited together with S(t+1), after which the stage of tile t is released.
// The math (S = Q·K^T as 8 m64n64k16, P from registers, [O | O_lr] += P·[V | LRv] as 4
// m64n128k16 or m64n144k16, the Flash-LoRA expansion after the loop, the epilogue and v3's split
// plan) is v5's. The default prefill kernel. Scope: v5's without the K residual (its in-place
// key rebuild needs every warp between the copy and the product): head_dim 128, V rank 8/16 with
// 16-byte rows (or none), no K term, no agents, prefill (> 64 rows per sequence), an sm_90a
// build on an sm_90 device. Everything else runs v5 (and from there v4 / v3 / ...).
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/attention_wgmma_common.cuh"
#include "backend/cuda/wgmma.cuh"

namespace lragent::cuda {
namespace {

using namespace detail;
using namespace wg;

constexpr int kThreads = 384;  // warpgroup 0: producer; 1, 2: consumers
constexpr int kStages = 4;
constexpr float kLazyLog2 = 8.f;  // lazy-rescale headroom (log2 units): P <= 256
// The producer keeps 56 registers: at 40 its page-table loads and addresses for a tile did not
// stay in flight together (ncu: long-scoreboard stalls 1.7x plain's with the LRv copies) and
// Flash-LoRA ran 1.16-1.19x plain's time; at 56 it is 1.08-1.09x, plain unchanged (H100).
// The pool setmaxnreg.inc draws from is what the block got at launch, 384 threads x 168 registers
// (__launch_bounds__(384, 1): 65536 / 384 rounded down to a multiple of 8), not the register
// file: a split asking for more (96 / 208, say) leaves the consumers waiting in setmaxnreg
// forever (seen on the H100: the kernel hung).
constexpr int kEntryRegs = 168;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kEntryRegs,
              "setmaxnreg split exceeds the registers the block was launched with");
static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0, "setmaxnreg counts are multiples of 8");
// Named barriers (0 is __syncthreads): the consumers' turns, then each consumer's Q barrier.
constexpr int kTurnBar = 1, kQBar = 3;

// Shared memory, byte offsets from a 1024-aligned base: Q [2 column blocks][128 rows][128 B],
// then per stage K, V [2 column blocks][64 keys][128 B] and (kLr) LRv [64 keys][128 B] (v5's
// layout: the third column block of the P·[V | LRv] operand, 16 rank columns used), then the
// mbarriers full[kStages], empty[kStages] (8 bytes each).
template <bool kLr>
struct Smem {
  static constexpr int kStage = 2 * kKVBytes + (kLr ? kLrBytes : 0);  // 32768 / 40960
  static constexpr int kBars = kQBytes + kStages * kStage;
  static constexpr int kBytes = kBars + 2 * kStages * 8 + 1024;  // + alignment slack
  static_assert(kStage % 1024 == 0 && kQBytes % 1024 == 0, "tiles must keep the 1024-byte swizzle period");
  static_assert(kBytes <= 232448, "more shared memory than an sm_90 block can opt into");
};

// ---- mbarrier, named barrier and register-count wrappers (sm_90) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` once all of this thread's earlier cp.async copies have landed; `noinc`: the
// arrival is one of the count given at init.
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <bool kLr>
__global__ void __launch_bounds__(kThreads, 1) attn_v6_kernel(const AttnParams p, const Launch x) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStage = Smem<kLr>::kStage;
  constexpr int kNo = kLr ? 72 : 64;  // accumulator registers: O (64) then O_lr (8)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  unsigned char* const sm = smem_raw + (base - raw_addr);
  const uint32_t full_bar = base + Smem<kLr>::kBars, empty_bar = full_bar + kStages * 8;

  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int s = blockIdx.z / x.n_splits, split = blockIdx.z % x.n_splits;
  const int g = blockIdx.y;
  const int G = p.n_heads / p.n_kv_heads;
  const SeqInfo si = seq_info(p, s);
  const int n_rows = si.n_q * G;
  const int row0 = block_row0();
  if (row0 >= n_rows) return;  // the whole block

  const int i_last = (min(row0 + kBM, n_rows) - 1) / G;
  const int kb = split * x.tiles_per_split * kBN;
  const int ke = min(min(si.ctx, query_pos(p, si, i_last) + 1), kb + x.tiles_per_split * kBN);
  const int n_tiles = ke > kb ? (ke - kb + kBN - 1) / kBN : 0;

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full_bar + 8 * i, 128);  // one cp.async arrival per producer thread
      mbar_init(empty_bar + 8 * i, 8);   // one arrival per consumer warp
    }
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    regs_dec<kProducerRegs>();
    // Thread (ld_row, ld_ch) copies chunk ld_ch of keys ld_row + 8·i of K and V (in pairs 8 apart:
    // one table load for both, PagedRows::offset_pair), and one LRv chunk (key tid / 2, chunk
    // tid % 2; chunk 1 of a rank-8 row is zero-filled).
    const int ld_row = tid >> 4, ld_ch = tid & 15;
    const PagedRows kv_rows(p.k, s, x.kshift), v_rows(p.v, s, x.vshift);
    const bf16* const gK = p.k.data + g * kD + ld_ch * 8;
    const bf16* const gV = p.v.data + g * kD + ld_ch * 8;
    const PagedRows lr_rows(kLr ? p.v_lr.lr : p.v, s, kLr ? x.lvshift : x.vshift);  // LRv rows (kLr)
    // Block ids one tile ahead: the loads for tile t + 1 are issued before tile t's copies, so
    // their latency hides behind the copies and the `empty` wait instead of heading the next
    // tile. With K and V on one table and pages of >= 16 tokens (the engine's caches) the K/V
    // pairs of step j all sit in page (key0 + 16 j) >> shift, the same 4 ids for every thread;
    // other layouts look their ids up per tile as before. The LRv key is this thread's own.
    const bool ahead = x.kv_same && kv_rows.shift >= 4;
    const int lr_kr = tid >> 1, lr_ch = tid & 1;
    uint32_t ids[kBN / 16] = {}, lr_id = 0;  // tile t's K/V block ids [step j] (ahead), LRv block id (kLr)
    auto fetch_ids = [&](int t, uint32_t(&out)[kBN / 16], uint32_t& out_lr) {
      const int key0 = kb + t * kBN;
      if (ahead) {
#pragma unroll
        for (int j = 0; j < kBN / 16; ++j) {
          const int k = key0 + 16 * j;
          out[j] = t < n_tiles && k < ke ? static_cast<uint32_t>(__ldg(kv_rows.table + (k >> kv_rows.shift))) : 0u;
        }
      }
      if constexpr (kLr) {
        const int k = key0 + lr_kr;
        out_lr = t < n_tiles && k < ke ? static_cast<uint32_t>(__ldg(lr_rows.table + (k >> lr_rows.shift))) : 0u;
      }
    };
    fetch_ids(0, ids, lr_id);
    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kStages, round = t / kStages;
      uint32_t next[kBN / 16] = {}, next_lr = 0;  // tile t + 1's ids, in flight during this tile (zero: unused)
      fetch_ids(t + 1, next, next_lr);
      if (round > 0) mbar_wait(empty_bar + 8 * stage, (round - 1) & 1);
      unsigned char* st = sm + kQBytes + stage * kStage;
      const int key0 = kb + t * kBN;
#pragma unroll
      for (int j = 0; j < kBN / 16; ++j) {
        const int kr = ld_row + 16 * j, key = key0 + kr;  // and kr + 8
        uint64_t offk[2], offv[2];
        if (ahead) {
          offk[0] = kv_rows.offset_in(ids[j], key);
          offk[1] = offk[0] + 8ull * kv_rows.row_stride;
          offv[0] = offk[0];
          offv[1] = offk[1];
        } else {
          kv_rows.offset_pair(key, ke, offk);
          if (x.kv_same) {
            offv[0] = offk[0];
            offv[1] = offk[1];
          } else {
            v_rows.offset_pair(key, ke, offv);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = key + 8 * h < ke;
          const uint32_t off = sw128(kr + 8 * h, ld_ch, kBN);
          cp_async16(st + off, ok ? gK + offk[h] : p.k.data, ok ? 16 : 0);
          cp_async16(st + kKVBytes + off, ok ? gV + offv[h] : p.v.data, ok ? 16 : 0);
        }
      }
      if constexpr (kLr) {
        const int key = key0 + lr_kr;
        const bool ok = key < ke && lr_ch * 8 < p.v_lr.rank;
        const bf16* src = ok ? p.v_lr.lr.data + lr_rows.offset_in(lr_id, key) + lr_ch * 8 : p.v_lr.lr.data;
        cp_async16(st + 2 * kKVBytes + lr_kr * 128 + ((lr_ch ^ (lr_kr & 7)) << 4), src, ok ? 16 : 0);
      }
      mbar_arrive_cp_async(full_bar + 8 * stage);
#pragma unroll
      for (int j = 0; j < kBN / 16; ++j) ids[j] = next[j];
      lr_id = next_lr;
    }
    // Nothing may still target shared memory when these threads leave: commit first, since
    // wait_group only covers committed groups (the copies above were tracked by mbarriers only).
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumers ----------------
  regs_inc<kConsumerRegs>();
  const int c = wg - 1, wtid = tid & 127, lane = tid & 31, wq = (tid >> 5) & 3;
  const int gq = lane >> 2, tq = lane & 3;
  // (v5's wg_rows / thread_row_pos would do, but with them ptxas schedules this kernel
  // differently from the build measured on the H100; kept inline until it is re-measured.)
  const int wr0 = row0 + c * 64;
  const bool wg_active = wr0 < n_rows;
  const int wg_first_pos = wg_active ? query_pos(p, si, wr0 / G) : -1;
  const int wg_last_pos = wg_active ? query_pos(p, si, (min(wr0 + 64, n_rows) - 1) / G) : -1;
  auto row_pos = [&](int hh) {
    const int r = wr0 + wq * 16 + gq + hh * 8;
    return r < n_rows ? query_pos(p, si, r / G) : -1;
  };
  const int rpos[2] = {row_pos(0), row_pos(1)};  // this thread's two rows' positions (-1: none)
  const float scale_log2 = p.softmax_scale * kLog2e;

  // [kNo / 4 column tiles of 8][4]: this thread's part of the warpgroup's 64 x 128 O, then (kLr)
  // of its 64 x 16 O_lr = P·LRv.
  float o[kNo];
#pragma unroll
  for (int i = 0; i < kNo; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // [rows gq, gq + 8]: running max, scaled log2 units
  float l_run[2] = {0.f, 0.f};              // [rows gq, gq + 8]: this thread's part of the row sums

  if (n_tiles > 0) {
    // This warpgroup's 64 Q rows (8 chunks per thread), published to wgmma.
    {
      const int ld_row = wtid >> 4, ld_ch = wtid & 15;  // this warpgroup's thread
#pragma unroll
      for (int i = 0; i < 64 / 8; ++i) {
        const int rr = c * 64 + ld_row + 8 * i, r = row0 + rr;
        const bool ok = r < n_rows;
        const bf16* src =
            ok ? p.q + (static_cast<int64_t>(si.q0 + r / G) * p.n_heads + g * G + r % G) * kD + ld_ch * 8 : p.q;
        cp_async16(sm + sw128(rr, ld_ch, kBM), src, ok ? 16 : 0);
      }
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async();
      named_sync(kQBar + c, 128);
    }
    // Descriptor bases (v5's): Q and K K-major, V MN-major with LRv as its third column block.
    const uint64_t dq0 = wgmma_desc_sw128(base + c * 64 * 128, 16, 1024);
    const uint64_t dk0 = wgmma_desc_sw128(base + kQBytes, 16, 1024);
    const uint64_t dv0 = wgmma_desc_sw128(base + kQBytes + kKVBytes, kBN * 128, 1024);

    // Turns: consumer 0 goes first (consumer 1's arrive below opens its first turn); each issues
    // S in its turn and then hands the turn over.
    if (c == 1) named_arrive(kTurnBar + 0, 256);
    int pending = -1;  // the stage whose P·V may still be in flight (released after the next wait)
    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kStages;
      mbar_wait(full_bar + 8 * stage, (t / kStages) & 1);
      // The producers' copies, acquired through the mbarrier, ordered before this thread's wgmma
      // (async proxy). CUTLASS's and FA3's cp.async producers feeding wgmma do without; kept as
      // the cheap, strict side.
      fence_proxy_async();
      const int key0 = kb + t * kBN;
      const bool skip = !wg_active || key0 > wg_last_pos;  // causal tail: nothing for these rows
      const uint32_t st_enc = (stage * kStage) >> 4;

      float sc[32];  // S, then P in f32: [8 column tiles of 8 keys][4], this thread's part of 64 x 64
      named_sync(kTurnBar + c, 256);
      if (!skip) {
        wgmma_fence_operand(o);
        issue_qk(sc, dq0, dk0, st_enc);
      }
      // Consumer 1 skips its last hand-over: its arrive before the loop already gave consumer 0
      // one, so both barriers see as many arrives as syncs.
      if (c == 0 || t + 1 < n_tiles) named_arrive(kTurnBar + (1 - c), 256);
      wgmma_wait<0>();  // S(t), and P·V(t-1) into O
      wgmma_fence_operand(o);
      if (pending >= 0 && lane == 0) mbar_arrive(empty_bar + 8 * pending);
      pending = -1;
      if (skip) {
        if (lane == 0) mbar_arrive(empty_bar + 8 * stage);
        continue;
      }
      wgmma_fence_operand(sc);

      // ---- mask + online softmax on raw scores (scale > 0 keeps the order) ----
      float mx[2];  // [rows gq, gq + 8]: this tile's row maxima (raw scores)
      mask_and_row_max(sc, mx, key0, ke, wg_first_pos, rpos, tq);
      // Lazy rescale: a row's running max moves only when its tile max exceeds it by more than
      // kLazyLog2 (so P <= 2^kLazyLog2: no overflow, bf16's relative precision unchanged; O and l keep the same
      // stale max, so the quotient is unchanged). One vote per warp: once the maxima settle,
      // whole warps skip the O rescale and its dependency on the new max.
      bool move = false;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
        move = move || mx[hh] * scale_log2 > m_run[hh] + kLazyLog2;
      }
      if (__any_sync(0xffffffffu, move)) {
        float alpha[2];  // [rows gq, gq + 8]: O and l scale
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float m_new = fmaxf(m_run[hh], mx[hh] * scale_log2);
          alpha[hh] = fast_exp2(m_run[hh] - (m_new == -INFINITY ? 0.f : m_new));
          m_run[hh] = m_new;
          l_run[hh] *= alpha[hh];
        }
#pragma unroll
        for (int i = 0; i < kNo; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      float mneg[2], rs[2];  // [rows gq, gq + 8]: -max (0 before any key), this tile's row sums
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) mneg[hh] = m_run[hh] == -INFINITY ? 0.f : -m_run[hh];
      exp_rows(sc, mneg, scale_log2, rs);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) l_run[hh] += rs[hh];

      // ---- [O | O_lr] += P·[V | LRv] (async; waited with the next tile's S) ----
      uint32_t pa[kBN / 16][4];  // P as bf16x2 A fragments: [16-key step][4]
      pack_p(pa, sc);
      issue_pv<kLr>(o, pa, dv0, st_enc);
      pending = stage;
    }
    wgmma_wait<0>();
    wgmma_fence_operand(o);

    // ---- Flash-LoRA expansion: O += (s_v · O_lr) · B_v^T, once per block (mma.sync per warp) ----
    if constexpr (kLr) {
      if (wg_active) flash_lora_expand(o, p, g, gq, tq);
    }
  }

  // ---- epilogue (v5's) ----
  store_rows(p, x, si, RowsOut{s, split, g, G, n_rows, wr0, wq, gq, tq}, o, l_run, m_run);
#else
  __trap();  // built without sm_90a: use_v6 is false then (LRAGENT_CUDA_SM90A), v6 is never launched
#endif
}

bool use_v6(const AttnParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  if (p.head_dim != kD || p.agents || p.k_lr.active()) return false;
  if (p.v_lr.active() && !attention_lr_rows_16b(p.v_lr)) return false;
  if (p.max_q * G <= 64) return false;  // decode shapes
#if defined(LRAGENT_CUDA_SM90A)
  return attention_device_is_sm90();
#else
  return false;  // the library was not built for sm_90a: the kernel body is a trap
#endif
}

template <bool kLr>
cudaError_t launch(const AttnParams& p, const Launch& x) {
  // Once per process. If the shared memory cannot be granted, clear the error; the caller runs v5.
  static const bool configured = [] {
    if (cudaFuncSetAttribute(attn_v6_kernel<kLr>, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<kLr>::kBytes) ==
        cudaSuccess)
      return true;
    (void)cudaGetLastError();
    return false;
  }();
  if (!configured) return cudaErrorNotSupported;
  const dim3 grid(attention_prefill_row_tiles(p), p.n_kv_heads, p.n_seqs * x.n_splits);
  attn_v6_kernel<kLr><<<grid, kThreads, Smem<kLr>::kBytes, p.stream>>>(p, x);
  return cudaGetLastError();
}

}  // namespace

int attention_v6_num_splits(const AttnParams& p) {
  return use_v6(p) ? attention_prefill_splits(p) : attention_v5_num_splits(p);
}

cudaError_t attention_v6(const AttnParams& p) {
  if (!use_v6(p)) return attention_v5(p);
  const Launch x = plan_launch(p);  // v3's grid and partial format
  const cudaError_t err = p.v_lr.active() ? launch<true>(p, x) : launch<false>(p, x);
  if (err == cudaErrorNotSupported) return attention_v5(p);  // no shared memory for the ring
  note_attention_kernel(AttnKernel::kV6WgmmaWs);
  if (err != cudaSuccess || x.n_splits == 1) return err;
  return attention_split_combine(p, x.part_o, x.part_lse, x.n_splits);
}

}  // namespace lragent::cuda
