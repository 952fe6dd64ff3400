// v4: a decode kernel (one query per sequence) in front of v3, which keeps every other shape.
//
// Why: in a batch-1 decode step the earlier versions ran v1, whose blocks own 64 GQA-packed rows
// and a range of keys. A decode query of one kv head has only G (4 for Llama-3) rows, so three of
// v1's four warps idled and the fourth walked every 64-key tile alone; over a 4k context (8 kv
// heads, 22 splits of 3 tiles) the kernel took 17.5 us per layer on an H100 for 16.8 MB of K/V
// (0.32 of copy bandwidth), and its split-K combine, a second kernel of 32 blocks, 6.3 us more
// (ncu, isolated launches): 0.76 ms of a 6.5 ms 8B decode step.
//
// What v4 does instead:
//   * The rows of one (sequence, kv head) are one m16 tile (G <= 16) shared by the four warps,
//     and the warps split every 64-key tile: warp w takes keys 16w..16w+15 (QK^T: two n8 tiles,
//     P·V: one k16 step), so all four compute and no key is walked serially by one warp.
//   * Each warp keeps its own online-softmax state; at the end of its key range the block merges
//     the four states in shared memory, adds the Flash-LoRA term once ((s_v·O_lr)·B_v^T with
//     f32 FMAs: G rows x D x rank), and normalises.
//   * Split-K without a second kernel: every block of a (sequence, kv head) writes its normalised
//     partial and log2-sum-exp, then counts itself in `split_counters`; the block that arrives
//     last merges all partials into the output and sets the counter back to zero, so the buffer
//     is zero again after every launch (CUDA graph replays reuse it). Agents mode instead merges
//     in attn_v4_merge_kernel, launched after it over every SM (see merge_kernel_mode).
//   * Grid (splits, kv heads, sequences) sized for the blocks resident per SM (three at one row
//     tile: 69 KB of shared memory at D = 128 without LR, 75 KB with, a 2-stage K/V/LRv ring, Q in
//     registers; choose_splits says when it fills every slot and when it aims at two a SM);
//     one sequence's actual context is split evenly over the splits (the grid is planned for
//     max_ctx, a recorded pass's context bucket); pdl_release() first thing, so the
//     PDL-launched o-projection GEMV after it starts fetching weights while attention finishes.
//   * Block ids one tile ahead (K and V on one table, pages of >= 16 tokens): a tile's copies do
//     not wait on a table lookup; in registers, or in the LR kernel in shared memory, copied
//     there with the tile two before (session 29; H200, the 8B step at 32k with lookahead 5.38
//     against 6.23 ms together with the even split, base-lr LoRA 5.69 against 6.78).
//   * Agents mode (N agents' decode queries over one shared base and LR cache, each with its own
//     B_v): the rows are the agents' heads, and each row expands its own agent's B_v.
//   * Two row tiles (17..32 rows of a kv head: 8 agents at G = 4, or G = 32): eight warps, two
//     sets of four, one m16 tile each; both sets read the same K/V stages, so the pages are read
//     once for all 32 rows. Each warp keeps one tile's state, as with one tile (earlier tries that
//     read the K/V once per tile, or gave each of four warps both tiles, were no faster than v1:
//     docs/cuda.md). Q fragments are re-read from shared memory every key tile at two tiles: the
//     eight warps' registers must fit two blocks per SM.
//   * A batch-1 decode step's RoPE and K/V stores in the same launch (DecodeRopeStore, session
//     28): each block rotates its q rows itself, and the block holding the new key stores that
//     key's k and v rows and patches them into its shared-memory tile; the rope_store kernel
//     before it, and its boundary, go (H200, 8B step at 4k: -0.036 ms with decode lookahead).
//   * The K term (session 33; base-lr's k_proj adapters): each warp rebuilds its 16 keys of a
//     landed tile in place from an LRk ring, B_k's operands held in registers (kKInPlace; 8 x 32k
//     private caches 0.511 against v2's 1.000 ms, H200). Agents mode (session 34, kKPerAgent):
//     the keys differ by agent, so each warp adds every agent's K term to its rows' scores from
//     residual keys built in registers (agents_k_scores).
// Shapes: a K-side term only of rank <= 16 beside a V term (one row tile without agents), V-side
// rank <= 16, one query per sequence (max_q 1) or agents mode, with
// rows (N·G, or G) <= 32, D in {64, 128}, split_counters present with room for n_seqs x
// n_kv_heads. Everything else runs v3 (which sends decode without those conditions on to v2 and
// v1). Template: D = head_dim, R = rank capacity (0: no LR term, 16), MT = m16 row tiles (1, 2).
// The shared-memory layout, launch description, row addressing and split merge are in
// attention_v4_common.cuh; the per-agent K term's device code in attention_v4_kterm.cuh.
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/attention_v4_common.cuh"
#include "backend/cuda/attention_v4_kterm.cuh"
#include "backend/cuda/device_props.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_math.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace lragent::cuda {
namespace {

using namespace detail;
using namespace v4;  // attention_v4_common.cuh, attention_v4_kterm.cuh

// Three blocks per SM at one row tile (registers <= 168; shared memory: Smem), two at two.
// kNorm: x.rs norms q and k too (DecodeRopeStore::normed; R == 0 and MT == 1 only). An
// instantiation of its own: in the plain kernel its code cost 5 registers and ~0.4% of a Llama
// decode step (H200, 4 interleaved rounds).
// kK: the K term (base-lr's k_proj adapters), K_j = K_base_j + RoPE_j(s_k·LRk_j·B_k^T) (the CPU
// reference's deferred RoPE), with a V term (R == 16); an instantiation of its own.
//   kKInPlace (one adapter, one row tile, two blocks an SM): each warp rebuilds its 16 keys of a
//     tile in place before its QK.
//   kKPerAgent (agents mode, one or two row tiles): the adapters differ by row, so K_base stays as
//     loaded and each warp adds, per agent of its row tile, Q_a·RoPE(s_k·LRk·B_k^a^T)^T to the
//     scores: the residual keys are built in registers (agents_k_scores) and never stored.
template <int D, int R, int MT, bool kNorm = false, int kK = kKNone>
__global__ void __launch_bounds__(Smem<D, R, MT, kK != kKNone>::kThreads, v4_min_blocks(MT, kK))
    attn_v4_decode_kernel(const AttnParams p, const V4Launch x) {
  constexpr bool kKTerm = kK != kKNone;
  using L = Smem<D, R, MT, kKTerm>;
  static_assert(!kKTerm || (R > 0 && !kNorm), "the K term: the LR kernel");
  static_assert(kK != kKInPlace || MT == 1, "the in-place K term: one row tile");
  constexpr int KS = L::KS, RS = L::RS;
  constexpr int kRows = L::kRows, kWarps = L::kWarps, kThreads = L::kThreads;
  constexpr int KT_D = D / 16;  // k-steps of QK^T over head_dim
  constexpr int NT_D = D / 8;   // n-tiles of P·V over head_dim
  constexpr int CPR = D / 8;    // 16-byte chunks per K/V row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const sm = reinterpret_cast<bf16*>(smem_raw);
  __shared__ float m_s[kKeyWarps][kRows], l_s[kKeyWarps][kRows];  // per key-warp softmax state of each row
  __shared__ bool last_s;
  pdl_release();  // the PDL-launched o-projection may be scheduled; it waits for our completion

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int kw = warp % kKeyWarps;           // this warp's 16 keys of every tile
  const int r0 = (warp / kKeyWarps) * kTileRows;  // its row tile's first row
  const int split = blockIdx.x, g = blockIdx.y, s = blockIdx.z;
  const int G = p.n_heads / p.n_kv_heads;
  const SeqInfo si = seq_info(p, s);
  // This block's rows r < RB of kv head g: query r / G (an agent; 0 without agents), head
  // g·G + r % G.
  const int RB = (p.agents ? si.n_q : min(si.n_q, 1)) * G;
  if (RB == 0) return;  // whole grid of this sequence: the counter is never touched
  // Offsets of row r: its (query, head) row in q/out, and its row in the split partials.
  auto out_row = [&](int r) { return v4_out_row(p, si, g, G, r); };
  auto part_row = [&](int r) { return v4_part_row(p, s, g, G, r); };
  // One sequence's keys split evenly over the grid's splits (x.even_split). The grid is sized for
  // max_ctx, which in a recorded pass is the context's bucket (up to 1.5x the context: 4097 ->
  // 6144), so a split size from max_ctx left the last splits without keys and gave the others
  // more tiles each (the 8B step at 32k: 21 of 32 splits a kv head busy, 24 tiles each, not 16).
  const int tps = x.even_split ? static_cast<int>((static_cast<unsigned>(si.ctx + kBN - 1) / kBN + x.n_splits - 1) /
                                                  static_cast<unsigned>(x.n_splits))
                               : x.plan_tps;  // tiles per split
  const int kb = split * tps * kBN;
  const int ke = min(si.ctx, kb + tps * kBN);  // decode: every key < ctx is visible
  const int n_tiles = ke > kb ? (ke - kb + kBN - 1) / kBN : 0;
  const float scale_log2 = p.softmax_scale * kLog2e;
  // DecodeRopeStore (one row tile without an LR term only): the rotations of this step's pairs
  // (i, i + D/2) are computed before the wait (the position and the frequencies come from the
  // host, like the block table); the block whose keys hold the new token (key ctx - 1) stores its
  // k and v rows. The tables exist only where a launch may be fused: 512 more bytes in the LR
  // kernel would leave two of its blocks on an SM instead of three.
  constexpr bool kRopeStore = MT == 1 && R == 0;
  static_assert(!kNorm || kRopeStore, "the q/k norms come with a fused RoPE and store");
  const bool fused_rs = kRopeStore && x.rs.active();
  const int kpos = si.ctx - 1;
  const bool owner = fused_rs && kpos >= kb && kpos < ke;
  __shared__ float rope_cs[kRopeStore ? D / 2 : 1], rope_sn[kRopeStore ? D / 2 : 1];
  if (fused_rs && tid < D / 2) rope_sincos(__ldg(x.rs.pos), __ldg(x.rs.inv_freq + tid), rope_sn[tid], rope_cs[tid]);

  // Tile loads: every address (page-table lookup) first, then the copies, so a thread's lookups
  // are in flight together instead of one dependent round trip per copy. Consecutive threads
  // copy consecutive 16-byte chunks of a row (a warp covers two whole rows per instruction:
  // whole DRAM bursts; a thread-per-half-row loader was 25% slower over 8 x 8k private caches).
  constexpr int LPT = kBN * CPR / kThreads;  // K (and V) chunks per thread per tile
  constexpr int RPI = kThreads / CPR;        // rows covered per loader step
  constexpr int LR_CH = R > 0 ? R / 4 : 1;   // 8-byte chunks per LRv row (rank <= 16; 1: unused)
  constexpr int LR_PT = R > 0 ? kBN * LR_CH / kThreads : 0;
  const int ld_row = tid / CPR, ld_ch = tid % CPR;
  struct TileAddr {  // global sources of one tile's copies (null: past the split's end)
    const bf16* k[LPT];
    const bf16* v[LPT];
    const bf16* l[LR_PT > 0 ? LR_PT : 1];
    const bf16* lk[kKTerm ? LR_PT : 1];  // LRk (kKTerm)
  };
  auto tile_addr = [&](int t, TileAddr& a) {
    const int key0 = kb + t * kBN;
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
      const int key = key0 + ld_row + i * RPI;
      const bool ok = key < ke;
      a.k[i] = ok ? p.k.data + paged_offset(p.k, s, key, x.kshift) + g * D + ld_ch * 8 : nullptr;
      a.v[i] = ok ? p.v.data + paged_offset(p.v, s, key, x.vshift) + g * D + ld_ch * 8 : nullptr;
    }
#pragma unroll
    for (int i = 0; i < LR_PT; ++i) {
      const int c = tid + i * kThreads, kr = c / LR_CH, ch = c % LR_CH, key = key0 + kr;
      const bool ok = key < ke && ch * 4 < p.v_lr.rank;
      a.l[i] = ok ? p.v_lr.lr.data + paged_offset(p.v_lr.lr, s, key, x.lvshift) + ch * 4 : nullptr;
    }
    if constexpr (kKTerm) {
#pragma unroll
      for (int i = 0; i < LR_PT; ++i) {
        const int c = tid + i * kThreads, kr = c / LR_CH, ch = c % LR_CH, key = key0 + kr;
        const bool ok = key < ke && ch * 4 < p.k_lr.rank;
        a.lk[i] = ok ? p.k_lr.lr.data + paged_offset(p.k_lr.lr, s, key, x.lkshift) + ch * 4 : nullptr;
      }
    }
  };
  auto tile_issue = [&](int t, const TileAddr& a) {
    const int st = t % kStages;
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
      const int row = st * kBN + ld_row + i * RPI;
      cp_async16(sm + L::kK + row * KS + ld_ch * 8, a.k[i] ? a.k[i] : p.k.data, a.k[i] ? 16 : 0);
      cp_async16(sm + L::kV + row * KS + ld_ch * 8, a.v[i] ? a.v[i] : p.v.data, a.v[i] ? 16 : 0);
    }
    // LRv columns past the rank are zero-filled: the P·LRv mma reads zeros there.
#pragma unroll
    for (int i = 0; i < LR_PT; ++i) {
      const int c = tid + i * kThreads, kr = c / LR_CH, ch = c % LR_CH;
      cp_async8(sm + L::kLv + (st * kBN + kr) * RS + ch * 4, a.l[i] ? a.l[i] : p.v_lr.lr.data, a.l[i] ? 8 : 0);
    }
    if constexpr (kKTerm) {  // LRk columns past the rank likewise: the rebuild's mma reads zeros there
#pragma unroll
      for (int i = 0; i < LR_PT; ++i) {
        const int c = tid + i * kThreads, kr = c / LR_CH, ch = c % LR_CH;
        cp_async8(sm + L::kLk + (st * kBN + kr) * RS + ch * 4, a.lk[i] ? a.lk[i] : p.k_lr.lr.data, a.lk[i] ? 8 : 0);
      }
    }
  };
  auto load_tile = [&](int t) {
    TileAddr a;
    tile_addr(t, a);
    tile_issue(t, a);
  };
  // With x.ids_ahead, the block ids of tile t + 1 are loaded while tile t is computed, so a
  // tile's copies issue without a dependent table lookup in front of them. A tile's 64 keys sit
  // in 64 >> kshift <= 4 pages, the same for every thread: kv[j] holds the page of keys key0 +
  // (j << kshift)..; an id past the split's end is 0 and never used. The LR kernel keeps them in
  // shared memory instead (ids_s below): four registers held through its key loop made it spill
  // (it is at 168, the cap of three blocks an SM).
  const bool ahead = R == 0 && x.ids_ahead;
  // LR kernel, x.ids_ahead (and LR pages of >= 16 tokens): the block ids of tile u, for K/V
  // ([u % 4][0..3]), LRv ([u % 4][4..7]) and with the K term LRk ([u % 4][8..11]), copied into
  // shared memory by threads 0..kIdThreads-1 with the copies of tile u - 2 (tiles 0 and 1: before
  // the wait), so they have landed, and a barrier has passed, by the time tile u is issued.
  constexpr int kIdThreads = kKTerm ? 12 : 8;
  const bool ahead_s = R > 0 && x.ids_ahead && x.lvshift >= 4 && (!kKTerm || x.lkshift >= 4);
  __shared__ uint32_t ids_s[R > 0 ? 4 : 1][kIdThreads];
  auto ids_async = [&](int u) {  // threads 0..kIdThreads-1
    const int key0 = kb + u * kBN, j = tid & 3, kind = tid >> 2;  // kind: K/V, LRv, LRk
    const int sh = kind == 0 ? x.kshift : kind == 1 ? x.lvshift : x.lkshift;
    const DevPagedView& v = kind == 0 ? p.k : kind == 1 ? p.v_lr.lr : p.k_lr.lr;
    const int key = key0 + (j << sh);
    const bool ok = u < n_tiles && key < ke && key < key0 + kBN;
    const int32_t* src = v.table + static_cast<int64_t>(s) * v.table_stride + (ok ? key >> sh : 0);
    cp_async4(&ids_s[u % 4][tid], src, ok ? 4 : 0);
  };
  // Tile t's K and V copies from block ids known ahead: blk(jj) is the id of the tile's page jj
  // (keys key0 + (jj << kshift)..); K and V share the table and row layout (x.ids_ahead).
  auto issue_kv_ahead = [&](int t, auto blk) {
    const int st = t % kStages, key0 = kb + t * kBN;
    const uint32_t pmask = static_cast<uint32_t>(p.k.page_size - 1);
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
      const int r = ld_row + i * RPI, key = key0 + r;  // r >> kshift < 4: pages >= 16
      const int64_t off = static_cast<int64_t>(blk(r >> x.kshift)) * p.k.block_stride +
                          static_cast<int64_t>(static_cast<uint32_t>(key) & pmask) * p.k.row_stride + g * D + ld_ch * 8;
      const bool ok = key < ke;
      const int row = st * kBN + r;
      cp_async16(sm + L::kK + row * KS + ld_ch * 8, ok ? p.k.data + off : p.k.data, ok ? 16 : 0);
      cp_async16(sm + L::kV + row * KS + ld_ch * 8, ok ? p.v.data + off : p.v.data, ok ? 16 : 0);
    }
  };
  auto tile_issue_s = [&](int t) {  // K, V and LRv from ids_s (ahead_s)
    const int key0 = kb + t * kBN;
    const uint32_t* ids = ids_s[t % 4];
    issue_kv_ahead(t, [&](int jj) { return ids[jj]; });
    const int st = t % kStages;
    // One LR term's rows of the tile (ids: its pages' block ids) into its ring at element `dst`.
    auto issue_lr = [&](const DevLowRank& term, const uint32_t* tids, int shift, int dst) {
      const DevPagedView& lv = term.lr;
#pragma unroll
      for (int i = 0; i < LR_PT; ++i) {
        const int c = tid + i * kThreads, kr = c / LR_CH, ch = c % LR_CH, key = key0 + kr;
        const bool ok = key < ke && ch * 4 < term.rank;
        const int64_t off = static_cast<int64_t>(tids[kr >> shift]) * lv.block_stride +
                            static_cast<int64_t>(key & (lv.page_size - 1)) * lv.row_stride + ch * 4;
        cp_async8(sm + dst + (st * kBN + kr) * RS + ch * 4, ok ? lv.data + off : lv.data, ok ? 8 : 0);
      }
    };
    issue_lr(p.v_lr, ids + 4, x.lvshift, L::kLv);
    if constexpr (kKTerm) issue_lr(p.k_lr, ids + 8, x.lkshift, L::kLk);
    if (tid < kIdThreads) ids_async(t + 2);
  };
  struct TileIds {
    uint32_t kv[4];
  };
  auto tile_ids = [&](int t, TileIds& d) {
    const int key0 = kb + t * kBN;
    const int32_t* kt = p.k.table + static_cast<int64_t>(s) * p.k.table_stride;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = key0 + (j << x.kshift);
      d.kv[j] = t < n_tiles && key < ke && key < key0 + kBN ? static_cast<uint32_t>(__ldg(kt + (key >> x.kshift))) : 0u;
    }
  };
  auto tile_issue_ids = [&](int t, const TileIds& d) {  // K and V only (ahead: R == 0)
    // Selects, not d.kv[jj]: a register array indexed at run time would go to local memory.
    issue_kv_ahead(t, [&](int jj) { return jj == 0 ? d.kv[0] : jj == 1 ? d.kv[1] : jj == 2 ? d.kv[2] : d.kv[3]; });
  };

  // Launched with PDL: the page-table lookups of the first tile (the table and the sequence
  // geometry come from the host) overlap the previous kernel, which stores this step's K/V rows;
  // everything it wrote (K, V, LRv rows) is read after the wait, and nothing is written before.
  // The LR kernel looks tile 0 up after the wait: its 36 address registers held across it, with
  // the split size computed from the context, spilled.
  TileAddr a0;
  TileIds d0, d1;  // ahead: tiles 0 and 1 (then the tile after the one last issued)
  if (ahead) {
    tile_ids(0, d0);
    tile_ids(1, d1);
  } else if (ahead_s) {
    if (tid < kIdThreads) {
      ids_async(0);
      ids_async(1);
    }
    cp_async_commit();
  } else if (n_tiles > 0 && R == 0) {
    tile_addr(0, a0);
  }
  pdl_wait();
  if (ahead_s) cp_async_wait<0>();
  // DecodeRopeStore with Qwen3's norms: 1 / rms of this block's q rows (rows 0..RB-1) and, in the
  // owner, of the new key's k row of kv head g (row RB), a warp per row as qk_norm computes them.
  __shared__ float norm_inv[kNorm ? kRows + 1 : 1];
  if (kNorm && fused_rs) {
    for (int r = warp; r <= RB; r += kWarps) {
      if (r == RB && !owner) break;
      const float* row = r < RB ? x.rs.q + out_row(r) * D : x.rs.k + g * D;
      float v[D / 32];
#pragma unroll
      for (int u = 0; u < D / 32; ++u) v[u] = row[lane + 32 * u];
      const float inv = warp_inv_rms(v, D, x.rs.norm_eps);
      if (lane == 0) norm_inv[r] = inv;
    }
  }
  if (fused_rs || ahead_s) __syncthreads();  // rope_cs / rope_sn, norm_inv; ids_s of tiles 0 and 1

  float o[NT_D][4];  // this warp's O for rows r0 + gq, r0 + gq + 8 (unnormalised)
#pragma unroll
  for (int n = 0; n < NT_D; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float olr[2][4] = {};  // this warp's P·LRv, ranks 0..15
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // log2 units; l: this lane's part

  if (n_tiles > 0) {
    // Q fragments of this warp's row tile (rows RB.. zero): at one tile loaded from global memory
    // into registers once, in the m16k16 A layout (a0: row gq, keys 2tq..; a1: row gq + 8; a2, a3:
    // the same 8 columns on); at two, a Q tile in shared memory (one group with tile 0), re-read
    // every key tile (ldmatrix is cheap next to the K/V loads; the eight warps' registers are not).
    constexpr bool kQRegs = L::kQRegs;
    // Tile 0's copies first: they go to DRAM, the q loads below to L2, and the RoPE of a fused
    // launch consumes its q values at once.
    if (ahead)
      tile_issue_ids(0, d0);
    else if (ahead_s)
      tile_issue_s(0);
    else if (R == 0)
      tile_issue(0, a0);
    else
      load_tile(0);
    uint32_t qf[KT_D][4];
    if constexpr (kQRegs) {
      const int ra = r0 + gq, rb = ra + 8;
      if (fused_rs) {
        // q is f32 before RoPE: each fragment element is rotated here as rope_store would have
        // written it into q16. Columns i, i + 1 (k-step kk < KT_D / 2) pair with i + D/2, i + 1
        // + D/2 (k-step kk + KT_D / 2): both halves of a rotation land in this thread.
        constexpr int H = KT_D / 2;
        const float* fq[2] = {ra < RB ? x.rs.q + out_row(ra) * D : nullptr,
                              rb < RB ? x.rs.q + out_row(rb) * D : nullptr};
        constexpr bool nq = kNorm;
        const float inv[2] = {nq && ra < RB ? norm_inv[ra] : 1.f, nq && rb < RB ? norm_inv[rb] : 1.f};
#pragma unroll
        for (int kk = 0; kk < H; ++kk)
#pragma unroll
          for (int c8 = 0; c8 < 2; ++c8) {
            const int i = 16 * kk + 2 * tq + 8 * c8;
            float w[4] = {};  // the q norm's weights of columns i, i + 1, i + D/2, i + 1 + D/2
            if (nq) {
              w[0] = norm_weight(x.rs.q_norm_w, x.rs.norm_w_bf16, i);
              w[1] = norm_weight(x.rs.q_norm_w, x.rs.norm_w_bf16, i + 1);
              w[2] = norm_weight(x.rs.q_norm_w, x.rs.norm_w_bf16, i + D / 2);
              w[3] = norm_weight(x.rs.q_norm_w, x.rs.norm_w_bf16, i + 1 + D / 2);
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const float* f = fq[rr];
              float2 lo = f ? *reinterpret_cast<const float2*>(f + i) : make_float2(0.f, 0.f);
              float2 hi = f ? *reinterpret_cast<const float2*>(f + i + D / 2) : make_float2(0.f, 0.f);
              if (nq) {
                lo = make_float2(normed(lo.x, inv[rr], w[0]), normed(lo.y, inv[rr], w[1]));
                hi = make_float2(normed(hi.x, inv[rr], w[2]), normed(hi.y, inv[rr], w[3]));
              }
              const float2 e0 = rope_rotate(lo.x, hi.x, rope_cs[i], rope_sn[i]);
              const float2 e1 = rope_rotate(lo.y, hi.y, rope_cs[i + 1], rope_sn[i + 1]);
              qf[kk][rr + 2 * c8] = f ? pack_bf16(e0.x, e1.x) : 0u;
              qf[kk + H][rr + 2 * c8] = f ? pack_bf16(e0.y, e1.y) : 0u;
            }
          }
      } else {
        const uint32_t* qa = ra < RB ? reinterpret_cast<const uint32_t*>(p.q + out_row(ra) * D) : nullptr;
        const uint32_t* qb = rb < RB ? reinterpret_cast<const uint32_t*>(p.q + out_row(rb) * D) : nullptr;
#pragma unroll
        for (int kk = 0; kk < KT_D; ++kk) {
          const int c = kk * 8 + tq;  // bf16 pair index of columns 16kk + 2tq, +1
          qf[kk][0] = qa ? qa[c] : 0u;
          qf[kk][1] = qb ? qb[c] : 0u;
          qf[kk][2] = qa ? qa[c + 4] : 0u;
          qf[kk][3] = qb ? qb[c + 4] : 0u;
        }
      }
    } else {
      for (int c = tid; c < kRows * CPR; c += kThreads) {
        const int r = c / CPR, ch = c % CPR;
        const bool ok = r < RB;
        const bf16* src = ok ? p.q + out_row(r) * D + ch * 8 : p.q;
        cp_async16(sm + L::kQ + r * KS + ch * 8, src, ok ? 16 : 0);
      }
    }
    cp_async_commit();  // tile 0 (and at two row tiles the Q tile) as one group
    // DecodeRopeStore, the owner: the new token's k (rotated, pair tid / tid + D/2) and v
    // (element tid) of kv head g into the caches, and kept for the tile that reads that key.
    bf16 nk0 = __float2bfloat16(0.f), nk1 = nk0, nv = nk0;
    int new_tile = -1, new_row = 0;
    if (owner) {
      new_tile = (kpos - kb) / kBN;
      new_row = (kpos - kb) % kBN;
      if (tid < D / 2) {
        float* kr = x.rs.k + g * D;
        float ka = kr[tid], kb2 = kr[tid + D / 2];
        if constexpr (kNorm) {
          ka = normed(ka, norm_inv[RB], norm_weight(x.rs.k_norm_w, x.rs.norm_w_bf16, tid));
          kb2 = normed(kb2, norm_inv[RB], norm_weight(x.rs.k_norm_w, x.rs.norm_w_bf16, tid + D / 2));
        }
        const float2 r = rope_rotate(ka, kb2, rope_cs[tid], rope_sn[tid]);
        kr[tid] = r.x;
        kr[tid + D / 2] = r.y;
        nk0 = __float2bfloat16(r.x);
        nk1 = __float2bfloat16(r.y);
        bf16* kd = const_cast<bf16*>(p.k.data) + paged_offset(p.k, s, kpos, x.kshift) + g * D;
        kd[tid] = nk0;
        kd[tid + D / 2] = nk1;
      }
      if (tid < D) {
        nv = __float2bfloat16(x.rs.v[g * D + tid]);
        bf16* vd = const_cast<bf16*>(p.v.data) + paged_offset(p.v, s, kpos, x.vshift) + g * D;
        vd[tid] = nv;
      }
    }
    const bf16* const qs = sm + L::kQ + (r0 + (lane & 15)) * KS + (lane >> 4) * 8;
    // kKInPlace: this lane's B_k operands of every pair group (the same every tile), in registers.
    uint4 bkf[kK == kKInPlace ? D / 16 : 1];
    if constexpr (kK == kKInPlace) {
      // A batch of sequences with different adapters: this block's sequence's B_k (b_seq).
      const bf16* bk = (p.k_lr.b_seq ? p.k_lr.b_seq[s] : p.k_lr.b) + static_cast<int64_t>(g) * D * p.k_lr.rank;
#pragma unroll
      for (int pr = 0; pr < D / 16; ++pr) bkf[pr] = bk_fragment<D>(bk, p.k_lr.rank, pr, lane);
    }
    // kKPerAgent: every agent's B_k in fragment order after the stages (read after the key loop's
    // first barrier), and the agents of this warp's rows.
    const uint4* const bk_frags = reinterpret_cast<const uint4*>(sm + L::kEnd);
    AgentRows agents;
    if constexpr (kK == kKPerAgent) {
      fill_bk_frags<D>(p, reinterpret_cast<uint4*>(sm + L::kEnd), si.q0, RB / G, g, tid, kThreads);
      agents = agent_rows(r0, RB, G, gq);
    }
    for (int t = 0; t < n_tiles; ++t) {
      if (t + 1 < n_tiles) {  // stage (t+1) % 2 was freed by the barrier that ended tile t-1
        if (ahead) {
          tile_issue_ids(t + 1, d1);
          cp_async_commit();
          if (t + 2 < n_tiles) tile_ids(t + 2, d1);  // in flight while tile t is computed
        } else if (ahead_s) {
          tile_issue_s(t + 1);
          cp_async_commit();
        } else {
          load_tile(t + 1);
          cp_async_commit();
        }
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const int st = t % kStages;
      if (t == new_tile) {  // (block-uniform) the new key's row as stored, not as copied
        bf16* const row = sm + (st * kBN + new_row) * KS;
        if (tid < D / 2) {
          row[L::kK + tid] = nk0;
          row[L::kK + tid + D / 2] = nk1;
        }
        if (tid < D) row[L::kV + tid] = nv;
        __syncthreads();
      }
      const int key0 = kb + t * kBN + kw * 16;  // this warp's first key
      const bf16* cK = sm + L::kK + (st * kBN + kw * 16) * KS;
      const bf16* cV = sm + L::kV + (st * kBN + kw * 16) * KS;
      if constexpr (kK == kKInPlace) {
        // This warp's 16 keys, in place: K_j += RoPE_j(s_k·LRk_j·B_k^T). The rows are the warp's
        // own (its QK reads no other's), so a warp barrier orders the writes before the reads.
        bf16* const kr = sm + L::kK + (st * kBN + kw * 16) * KS;
        const bf16* cLk = sm + L::kLk + (st * kBN + kw * 16) * RS;
        uint32_t la[4];  // LRk rows of the 16 keys (A operand, ranks 0..15; zero past the rank)
        ldmatrix_x4(la, cLk + (lane & 15) * RS + (lane >> 4) * 8);
#pragma unroll
        for (int pr = 0; pr < D / 16; ++pr) {
          float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
          mma_bf16(c1, la, bkf[pr].x, bkf[pr].y);
          mma_bf16(c2, la, bkf[pr].z, bkf[pr].w);
          const int d0 = pr * 8 + 2 * tq;
          const float f[2] = {__ldg(p.inv_freq + d0), __ldg(p.inv_freq + d0 + 1)};
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int kl = gq + hh * 8;
            float y1[2], y2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float sn, cs;
              detail::rope_sincos(static_cast<float>(p.k_pos0 + key0 + kl) * f[e], &sn, &cs);
              const float x1 = c1[hh * 2 + e] * p.k_lr.scale, x2 = c2[hh * 2 + e] * p.k_lr.scale;
              y1[e] = x1 * cs - x2 * sn;
              y2[e] = x2 * cs + x1 * sn;
            }
            __nv_bfloat162* k1 = reinterpret_cast<__nv_bfloat162*>(kr + kl * KS + d0);
            __nv_bfloat162* k2 = reinterpret_cast<__nv_bfloat162*>(kr + kl * KS + d0 + D / 2);
            const __nv_bfloat162 b1 = *k1, b2 = *k2;
            *k1 = __floats2bfloat162_rn(__low2float(b1) + y1[0], __high2float(b1) + y1[1]);
            *k2 = __floats2bfloat162_rn(__low2float(b2) + y2[0], __high2float(b2) + y2[1]);
          }
        }
        __syncwarp();
      }

      // S = Q·K^T over this warp's 16 keys (n8 tiles: keys 0..7, 8..15).
      float sc[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < KT_D; ++kk) {
        if (!kQRegs) ldmatrix_x4(qf[kk], qs + kk * 16);
        uint32_t b[4];
        ldmatrix_x4(b, cK + ((lane >> 4) * 8 + (lane & 7)) * KS + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(sc[0], qf[kk], b[0], b[1]);
        mma_bf16(sc[1], qf[kk], b[2], b[3]);
      }
      if constexpr (kK == kKPerAgent)
        agents_k_scores<D, RS, kAgentsPerPass<MT>>(p, sm + L::kLk + (st * kBN + kw * 16) * RS, bk_frags, qf, agents,
                                                   p.k_pos0 + key0, lane, sc);
      // Mask keys past the split's end (zero-filled rows), online softmax on raw scores.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + n * 8 + 2 * tq + (e & 1);
          if (key >= ke) sc[n][e] = -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
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
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pv = fast_exp2(fmaf(sc[n][e], scale_log2, mneg[e >> 1]));
          sc[n][e] = pv;
          rs[e >> 1] += pv;
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
      // O += P·V, O_lr += P·LRv (P from the score accumulators as the A operand, k = 16 keys).
      uint32_t pa[4];
      pa[0] = pack_bf16(sc[0][0], sc[0][1]);
      pa[1] = pack_bf16(sc[0][2], sc[0][3]);
      pa[2] = pack_bf16(sc[1][0], sc[1][1]);
      pa[3] = pack_bf16(sc[1][2], sc[1][3]);
      const int voff = (((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (lane >> 4) * 8;
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, cV + voff + dp * 16);
        mma_bf16(o[2 * dp], pa, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
      }
      if constexpr (R > 0) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          olr[n][0] *= alpha[0];
          olr[n][1] *= alpha[0];
          olr[n][2] *= alpha[1];
          olr[n][3] *= alpha[1];
        }
        const bf16* cLv = sm + L::kLv + (st * kBN + kw * 16) * RS;
        uint32_t b[4];
        ldmatrix_x4_trans(b, cLv + (((lane >> 3) & 1) * 8 + (lane & 7)) * RS + (lane >> 4) * 8);
        mma_bf16(olr[0], pa, b[0], b[1]);
        mma_bf16(olr[1], pa, b[2], b[3]);
      }
      __syncthreads();  // every warp is done with stage t % 2 before tile t + 2 refills it
    }
  }

  // ---- merge the four key warps of each row: O = Σ_w 2^(m_w - M) O_w, l = Σ_w 2^(m_w - M) l_w ----
  // Only the RB real rows are written (rows r0 + gq and r0 + gq + 8 of each warp), at a padded stride.
  constexpr int DP = L::kDP;
  float* const oacc = reinterpret_cast<float*>(sm);   // [kKeyWarps, kRows, DP]
  float* const lacc = oacc + kKeyWarps * kRows * DP;  // [kKeyWarps, kRows, 16] (R > 0)
  float (*const olr_s)[16] = reinterpret_cast<float (*)[16]>(lacc + kKeyWarps * kRows * 16);  // [kRows, 16] merged
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = l_run[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (tq == 0) {
      m_s[kw][r0 + gq + hh * 8] = m_run[hh];
      l_s[kw][r0 + gq + hh * 8] = l;
    }
  }
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r0 + gq + hh * 8;
    if (r >= RB) continue;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w) mm = fmaxf(mm, m_s[w][r]);
    const float f = m_run[hh] == -INFINITY ? 0.f : fast_exp2(m_run[hh] - mm);
    float* row = oacc + (kw * kRows + r) * DP + 2 * tq;
#pragma unroll
    for (int n = 0; n < NT_D; ++n)
      *reinterpret_cast<float2*>(row + n * 8) = make_float2(o[n][hh * 2] * f, o[n][hh * 2 + 1] * f);
    if constexpr (R > 0) {
      float* lrow = lacc + (kw * kRows + r) * 16 + 2 * tq;
#pragma unroll
      for (int n = 0; n < 2; ++n)
        *reinterpret_cast<float2*>(lrow + n * 8) = make_float2(olr[n][hh * 2] * f, olr[n][hh * 2 + 1] * f);
    }
  }
  // Row scalars once: 1/l and the log2-sum-exp of the block's partial.
  __shared__ float inv_l_s[kRows], lse_s[kRows];
  if (tid < RB) {
    float mm = -INFINITY, l = 0.f;
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w) mm = fmaxf(mm, m_s[w][tid]);
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w)
      l += m_s[w][tid] == -INFINITY ? 0.f : fast_exp2(m_s[w][tid] - mm) * l_s[w][tid];
    inv_l_s[tid] = l > 0.f ? 1.f / l : 0.f;
    lse_s[tid] = l > 0.f ? mm + log2f(l) : -INFINITY;
  }
  __syncthreads();
  if constexpr (R > 0) {
    for (int e = tid; e < RB * 16; e += kThreads) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) v += lacc[(w * kRows + e / 16) * 16 + e % 16];
      olr_s[e / 16][e % 16] = v * p.v_lr.scale;
    }
    __syncthreads();
  }

  const bool split_out = x.n_splits > 1;
  const int64_t split_stride = v4_split_stride(p);
  // Row r's element d, normalised: to this split's partial, or to the output.
  auto finish = [&](int r, int d, float v) {
    const float out = v * inv_l_s[r];
    if (split_out) {
      const int64_t prow = split * split_stride + part_row(r);
      x.part_o[prow * D + d] = out;
      if (d == 0) x.part_lse[prow] = lse_s[r];
    } else {
      const int64_t off = out_row(r) * D + d;
      if (p.out) p.out[off] = __float2bfloat16(out);
      if (p.out_f32) p.out_f32[off] = out;
      if (d == 0 && p.lse_out) p.lse_out[out_row(r)] = lse_s[r];
    }
  };
  constexpr int kEB = 4;
  // B_v row (g·D + d) of `agent` as bf16 pairs (ranks 0..15; zero past the rank).
  auto load_bv = [&](int64_t agent, int d, uint32_t (&bw)[8]) {
    const int rank = p.v_lr.rank;
#pragma unroll
    for (int k = 0; k < 8; ++k) bw[k] = 0u;
    const int a = agent_of(p, si, static_cast<int>(agent));
    const bf16* b = p.v_lr.b_seq ? p.v_lr.b_seq[p.agents ? a : s] : p.v_lr.b + a * p.v_lr.b_agent_stride;
    const bf16* brow = b + (static_cast<int64_t>(g) * D + d) * rank;
    if (rank == 16 && reinterpret_cast<uintptr_t>(brow) % 16 == 0) {
      const uint4 w0 = __ldg(reinterpret_cast<const uint4*>(brow));
      const uint4 w1 = __ldg(reinterpret_cast<const uint4*>(brow) + 1);
      bw[0] = w0.x, bw[1] = w0.y, bw[2] = w0.z, bw[3] = w0.w;
      bw[4] = w1.x, bw[5] = w1.y, bw[6] = w1.z, bw[7] = w1.w;
    } else {  // B rows start 4-byte aligned (b is, and rank % 4 == 0): bf16 pairs
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (2 * k < rank) bw[k] = __ldg(reinterpret_cast<const unsigned int*>(brow) + k);
    }
  };
  // Σ over the key warps of row r's element d, plus its LR expansion with B_v row bw.
  auto element = [&](int r, int d, const uint32_t (&bw)[8]) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w) v += oacc[(w * kRows + r) * DP + d];
    if constexpr (R > 0) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bw[k]));
        v = fmaf(olr_s[r][2 * k], f.x, fmaf(olr_s[r][2 * k + 1], f.y, v));
      }
    }
    return v;
  };
  const int n_pairs = RB / G * D;  // (query, dimension) pairs: a query's G rows share a B_v row
  if (R > 0 && n_pairs >= kThreads) {
    // A thread per (query, dimension): one B_v row serves the query's G heads, and a thread's
    // rows all load in one batch. Per (row, dimension), 8 agents' 16 elements a thread took
    // four batches, each an L2 round trip at the end of every block.
    for (int c0 = tid; c0 < n_pairs; c0 += kEB * kThreads) {
      uint32_t bw[kEB][8];
#pragma unroll
      for (int i = 0; i < kEB; ++i) {
        const int c = c0 + i * kThreads;
        if (c < n_pairs) load_bv(p.agents ? c / D : 0, c % D, bw[i]);
      }
#pragma unroll
      for (int i = 0; i < kEB; ++i) {
        const int c = c0 + i * kThreads, q = c / D, d = c % D;
        if (c >= n_pairs) break;
        for (int h = 0; h < G; ++h) finish(q * G + h, d, element(q * G + h, d, bw[i]));
      }
    }
  } else {
    // Thread per (row, dimension) of the RB real rows: sum the warps, add the LR expansion (the
    // row's agent's B_v in agents mode), normalise. A thread's elements go in batches of kEB whose
    // B_v rows are all loaded before any is used: one L2 round trip per batch instead of one per
    // element (which cost the 8-agent Flash-LoRA decode, 16 elements a thread, more than its
    // K/V reads).
    for (int e0 = tid; e0 < RB * D; e0 += kEB * kThreads) {
      uint32_t bw[kEB][8] = {};
      if constexpr (R > 0) {
#pragma unroll
        for (int i = 0; i < kEB; ++i) {
          const int e = e0 + i * kThreads;
          if (e < RB * D) load_bv(p.agents ? e / D / G : 0, e % D, bw[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kEB; ++i) {
        const int e = e0 + i * kThreads;
        if (e >= RB * D) break;
        finish(e / D, e % D, element(e / D, e % D, bw[i]));
      }
    }
  }
  // DecodeRopeStore: q (f32) and q16 rotated, written once every block of this kv head has read q.
  auto write_q = [&] {
    for (int e = tid; e < RB * (D / 2); e += kThreads) {
      const int r = e / (D / 2), i = e % (D / 2);
      float* qr = x.rs.q + out_row(r) * D;
      bf16* qh = x.rs.q16 + out_row(r) * D;
      float qa = qr[i], qb = qr[i + D / 2];
      if constexpr (kNorm) {
        qa = normed(qa, norm_inv[r], norm_weight(x.rs.q_norm_w, x.rs.norm_w_bf16, i));
        qb = normed(qb, norm_inv[r], norm_weight(x.rs.q_norm_w, x.rs.norm_w_bf16, i + D / 2));
      }
      const float2 v = rope_rotate(qa, qb, rope_cs[i], rope_sn[i]);
      qr[i] = v.x;
      qr[i + D / 2] = v.y;
      qh[i] = __float2bfloat16(v.x);
      qh[i + D / 2] = __float2bfloat16(v.y);
    }
  };
  if (!split_out || x.merge_kernel) {
    if (fused_rs && x.rs.write_q && !split_out) write_q();  // the kv head's only block (merge_kernel: never fused)
    return;
  }

  // ---- split-K: the last block of this (sequence, kv head) merges every split's partial ----
  __threadfence();  // our partial is visible device-wide before we are counted
  __syncthreads();
  if (tid == 0) {
    unsigned int* ctr = p.split_counters + static_cast<int64_t>(s) * p.n_kv_heads + g;
    last_s = atomicAdd(ctr, 1u) == static_cast<unsigned>(x.n_splits - 1);
    if (last_s) *ctr = 0u;  // every block of this launch has counted: ready for the next one
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  // Every row at once (a row at a time was four serial chains of L2 round trips): the weights
  // 2^(lse - max) / Σ of all (split, row) pairs in shared memory, a warp per row; then one
  // thread per 4 dimensions of a row sums the splits with 16-byte loads.
  float* const wts = reinterpret_cast<float*>(sm);  // [n_splits, RB]
  for (int e = tid; e < x.n_splits * RB; e += kThreads)
    wts[e] = __ldcg(x.part_lse + (e / RB) * split_stride + part_row(e % RB));
  __syncthreads();
  for (int r = warp; r < RB; r += kWarps) {
    const float lse = split_weights(wts + r, RB, x.n_splits, lane);
    if (lane == 0 && p.lse_out) p.lse_out[out_row(r)] = lse;
  }
  __syncthreads();
  for (int e = tid; e < RB * (D / 4); e += kThreads) {
    const int r = e / (D / 4), c4 = e % (D / 4);
    const float4* src = reinterpret_cast<const float4*>(x.part_o + part_row(r) * D) + c4;
    store_merged(p, out_row(r) * D + 4 * c4, merge_column(src, split_stride * (D / 4), wts + r, RB, x.n_splits));
  }
  if (fused_rs && x.rs.write_q) write_q();
}

// LRAGENT_ATTN_V4_WAVES: blocks per SM the split count aims for, overriding the rule in
// choose_splits (a tuning knob read once, for measuring alternatives without rebuilding; 0 or
// unset: the rule).
double split_waves_override() {
  static const double w = [] {
    const char* v = std::getenv("LRAGENT_ATTN_V4_WAVES");
    const double d = v ? std::atof(v) : 0.0;
    return d > 0 ? d : 0.0;
  }();
  return w;
}

// LRAGENT_ATTN_V4_MERGE_KERNEL (measuring): 0, every split launch merges in its last blocks, as
// before attn_v4_merge_kernel; 1 (the default), agents mode runs the merge kernel; 2, every split
// launch does, the batch-1 step's too. H200, --decode-only, 2 interleaved rounds: 3 agents over
// one 32k cache (one row tile) 0.053 / 0.058 ms (plain / Flash-LoRA V) with the kernel against
// 0.055 / 0.059; one 4k decode 18 against 16 us, and the 8B step at 4k 4.588 against 4.513 ms:
// there the second launch costs more than the one block's merge of 4 rows.
int merge_kernel_mode() {
  static const int mode = [] {
    const char* v = std::getenv("LRAGENT_ATTN_V4_MERGE_KERNEL");
    return v ? std::clamp(std::atoi(v), 0, 2) : 1;
  }();
  return mode;
}

// Query rows of one (sequence, kv head): the agents' heads, or the G heads of one decode query.
int v4_rows(const AttnParams& p) { return (p.agents ? p.max_q : 1) * (p.n_heads / p.n_kv_heads); }

// The K term (session 33): beside a V term of rank <= 16 (the LR kernel's instantiation), K rank
// <= 16. Without agents one sequence's G heads (or a batch's, each sequence's B_k by b_seq beside
// its B_v) in one row tile (kKInPlace); agents mode at one or two row tiles, one B per agent
// (kKPerAgent; b + a·b_agent_stride, or b_seq[a] beside the V side's per-agent B; attention()
// checks what its 4-byte B_k loads need: b 4-byte aligned, agents' B matrices an even number of
// elements apart). k_pos0 shifts the keys' RoPE positions in both.
bool v4_takes_k_term(const AttnParams& p) {
  const bool shape = p.agents || (v4_rows(p) <= kTileRows && !p.k_lr.b_seq == !p.v_lr.b_seq);
  return shape && p.k_lr.rank <= 16 && p.inv_freq != nullptr && p.v_lr.active();
}

bool use_v4(const AttnParams& p) {
  return (!p.k_lr.active() || v4_takes_k_term(p)) && (!p.v_lr.active() || p.v_lr.rank <= 16) &&
         (p.agents || p.max_q == 1) &&
         v4_rows(p) <= kMaxRowTiles * kTileRows && p.split_counters != nullptr &&
         p.split_counters_capacity >= static_cast<int64_t>(p.n_seqs) * p.n_kv_heads &&
         // the merge's 16-byte loads and stores
         reinterpret_cast<uintptr_t>(p.out_f32) % 16 == 0 && reinterpret_cast<uintptr_t>(p.out) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0;
}

size_t split_bytes(const AttnParams& p, int n_splits) {
  const size_t rows = static_cast<size_t>(n_splits) * p.n_seqs * p.max_q * p.n_heads;
  return rows * p.head_dim * sizeof(float) + rows * sizeof(float) + 256;
}

// One instantiation's launch setup, done once: its shared memory allowed (ok), and the blocks
// that then fit on one SM (per_sm; 2, the launch bound, should the occupancy query fail).
struct KernelSetup {
  bool ok = false;
  int per_sm = 2;
};
// A launch's dynamic shared memory: the stages (Smem), and with the per-agent K term every agent's
// B_k in fragment order after them (fill_bk_frags: D x 32 bytes an agent).
template <int D, int R, int MT, int kK>
size_t v4_smem_bytes(int n_agents) {
  return Smem<D, R, MT, kK != kKNone>::bytes + (kK == kKPerAgent ? static_cast<size_t>(n_agents) * D * 32 : 0);
}
template <int D, int R, int MT, bool kNorm = false, int kK = kKNone>
const KernelSetup& kernel_setup() {
  using L = Smem<D, R, MT, kK != kKNone>;
  static const KernelSetup k = [] {
    KernelSetup s;
    const size_t most = v4_smem_bytes<D, R, MT, kK>(MT * kTileRows);  // the most agents its rows hold
    s.ok = cudaFuncSetAttribute(attn_v4_decode_kernel<D, R, MT, kNorm, kK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(most)) == cudaSuccess;
    int per_sm = 0;
    if (!s.ok || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attn_v4_decode_kernel<D, R, MT, kNorm, kK>,
                                                               L::kThreads, L::bytes) != cudaSuccess)
      (void)cudaGetLastError();  // the failure is reported by ok (the launch) or loses only the tuning
    else
      s.per_sm = std::max(per_sm, 1);
    return s;
  }();
  return k;
}
template <int D, int R, int MT, int kK = kKNone>
int resident_blocks_of() {
  return kernel_setup<D, R, MT, false, kK>().per_sm;
}
// The per-agent K term's blocks an SM for n_agents agents (its shared memory grows with them),
// asked once per count.
template <int D, int MT>
int per_agent_resident_blocks(int n_agents) {
  static std::atomic<int> known[kMaxRowTiles * kTileRows + 1] = {};  // 0: not asked yet
  n_agents = std::clamp(n_agents, 1, MT * kTileRows);
  int n = known[n_agents].load(std::memory_order_relaxed);
  if (n > 0) return n;
  constexpr auto kernel = attn_v4_decode_kernel<D, 16, MT, false, kKPerAgent>;
  n = 1;
  int per_sm = 0;
  if (kernel_setup<D, 16, MT, false, kKPerAgent>().ok &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Smem<D, 16, MT, true>::kThreads,
                                                    v4_smem_bytes<D, 16, MT, kKPerAgent>(n_agents)) == cudaSuccess)
    n = std::max(per_sm, 1);
  else
    (void)cudaGetLastError();  // loses only the tuning
  known[n_agents].store(n, std::memory_order_relaxed);
  return n;
}

// Blocks of this launch's kernel that fit on one SM at once (its shared memory and registers):
// 3 at one row tile on Hopper (D = 128: 69 KB each, 75 KB with the LR stage ring), 2 at two.
int resident_blocks(const AttnParams& p) {
  const bool lr = p.v_lr.active(), two = v4_rows(p) > kTileRows;
  if (p.k_lr.active() && p.agents) {  // the K term's own instantiations (use_v4: with a V term)
    if (p.head_dim == 64)
      return two ? per_agent_resident_blocks<64, 2>(p.max_q) : per_agent_resident_blocks<64, 1>(p.max_q);
    return two ? per_agent_resident_blocks<128, 2>(p.max_q) : per_agent_resident_blocks<128, 1>(p.max_q);
  }
  if (p.k_lr.active())
    return p.head_dim == 64 ? resident_blocks_of<64, 16, 1, kKInPlace>() : resident_blocks_of<128, 16, 1, kKInPlace>();
  if (p.head_dim == 64) {
    if (lr) return two ? resident_blocks_of<64, 16, 2>() : resident_blocks_of<64, 16, 1>();
    return two ? resident_blocks_of<64, 0, 2>() : resident_blocks_of<64, 0, 1>();
  }
  if (lr) return two ? resident_blocks_of<128, 16, 2>() : resident_blocks_of<128, 16, 1>();
  return two ? resident_blocks_of<128, 0, 2>() : resident_blocks_of<128, 0, 1>();
}

// Split count: every split gets the same whole number of 64-key tiles, at least one, and the
// grid (splits x kv heads x sequences) aims at
//   * every resident slot once (resident_blocks per SM: one full wave) when each split still
//     streams >= kLongSplitTiles tiles: long splits are bandwidth-bound, and every slot's loads in
//     flight count (H200, 8 x 32k plain: 6 splits, 384 of 396 slots, 0.276 ms against 0.301 at 4,
//     and 0.379 at 8, whose 512 blocks run 1.3 waves; with LR, 2 blocks per SM, 4 splits fill the
//     wave and 6 run 1.45 waves: 0.434 ms against 0.327);
//   * else two blocks per SM: short splits are bound by their start and the last block's merge
//     of every partial, which more splits lengthen (one 32k sequence: 32 splits 49 us, 47 51 us).
constexpr int kLongSplitTiles = 32;

int choose_splits(const AttnParams& p) {
  const int tiles = (p.max_ctx + kBN - 1) / kBN;
  const int per_split_row = p.n_kv_heads * p.n_seqs;  // blocks per split
  int n = p.num_splits;
  if (n <= 0) {
    auto splits_at = [&](double blocks_per_sm) {
      return std::max(1, static_cast<int>(blocks_per_sm * sm_count()) / per_split_row);
    };
    if (const double w = split_waves_override(); w > 0) {
      n = splits_at(w);
    } else {
      n = splits_at(resident_blocks(p));
      if ((tiles + n - 1) / n < kLongSplitTiles) n = std::min(n, splits_at(2.0));
    }
  }
  n = std::max(1, std::min({n, tiles, kMaxSplits}));
  if (!p.workspace) return 1;
  while (n > 1 && split_bytes(p, n) > p.workspace_bytes) --n;
  const int tps = (tiles + n - 1) / n;
  return (tiles + tps - 1) / tps;
}

template <int D, int R, int MT, bool kNorm = false, int kK = kKNone>
cudaError_t launch_tiles(const AttnParams& p, const V4Launch& x) {
  using L = Smem<D, R, MT, kK != kKNone>;
  if (!kernel_setup<D, R, MT, kNorm, kK>().ok) return cudaErrorInvalidConfiguration;
  const dim3 grid(x.n_splits, p.n_kv_heads, p.n_seqs);
  const size_t bytes = v4_smem_bytes<D, R, MT, kK>(p.agents ? p.max_q : 1);
  return launch_pdl(attn_v4_decode_kernel<D, R, MT, kNorm, kK>, grid, dim3(L::kThreads), bytes, p.stream, p, x);
}

template <int D, int R>
cudaError_t launch(const AttnParams& p, const V4Launch& x) {
  if constexpr (R == 0) {  // attention_decode_rope_store_applies: one row tile, its merge in the last block
    if (x.rs.active() && x.rs.normed()) return launch_tiles<D, 0, 1, true>(p, x);
  }
  cudaError_t e;
  if constexpr (R > 0) {
    if (p.k_lr.active() && p.agents)
      e = v4_rows(p) <= kTileRows ? launch_tiles<D, R, 1, false, kKPerAgent>(p, x)
                                  : launch_tiles<D, R, 2, false, kKPerAgent>(p, x);
    else if (p.k_lr.active())  // use_v4: one row tile, no agents
      e = launch_tiles<D, R, 1, false, kKInPlace>(p, x);
    else
      e = v4_rows(p) <= kTileRows ? launch_tiles<D, R, 1>(p, x) : launch_tiles<D, R, 2>(p, x);
  } else {
    e = v4_rows(p) <= kTileRows ? launch_tiles<D, R, 1>(p, x) : launch_tiles<D, R, 2>(p, x);
  }
  if (e != cudaSuccess || !x.merge_kernel) return e;
  const dim3 grid((v4_rows(p) + kMergeWarps - 1) / kMergeWarps, p.n_kv_heads, p.n_seqs);
  return launch_pdl(attn_v4_merge_kernel<D>, grid, dim3(32 * kMergeWarps), 0, p.stream, p, x);
}

// Switches for measuring (env_switch.h): LRAGENT_ATTN_V4_EVEN_SPLIT=0 (V4Launch::even_split),
// LRAGENT_ATTN_V4_IDS_AHEAD=0 (block ids looked up per tile).
bool even_split_enabled() {
  static const bool on = env_switch_on("LRAGENT_ATTN_V4_EVEN_SPLIT");
  return on;
}
bool ids_ahead_enabled() {
  static const bool on = env_switch_on("LRAGENT_ATTN_V4_IDS_AHEAD");
  return on;
}

cudaError_t run_v4(const AttnParams& p, const DecodeRopeStore& rs) {
  note_attention_kernel(AttnKernel::kV4Decode);
  V4Launch x;
  x.rs = rs;
  x.n_splits = choose_splits(p);
  // Batches keep the plan's split size: 16 clients of `lragent serve` (contexts ~600, batched
  // decode) ran 1.30-1.33 s with the even split against 1.22-1.26 without (H200, session 29).
  // Agents mode's sequences (groups of a shared prefix's forks) read the same keys: split evenly.
  x.even_split = even_split_enabled() && (p.n_seqs == 1 || p.agents);
  x.plan_tps = ((p.max_ctx + kBN - 1) / kBN + x.n_splits - 1) / x.n_splits;
  x.kshift = ilog2(p.k.page_size);
  x.vshift = ilog2(p.v.page_size);
  if (p.v_lr.active()) x.lvshift = ilog2(p.v_lr.lr.page_size);
  if (p.k_lr.active()) x.lkshift = ilog2(p.k_lr.lr.page_size);
  x.ids_ahead = ids_ahead_enabled() && x.kshift >= 4 && kv_share_rows(p);
  if (x.n_splits > 1) {
    const size_t rows = static_cast<size_t>(x.n_splits) * p.n_seqs * p.max_q * p.n_heads;
    x.part_o = static_cast<float*>(p.workspace);
    x.part_lse = x.part_o + rows * p.head_dim;
    const int mode = merge_kernel_mode();
    x.merge_kernel = mode == 2 || (mode == 1 && p.agents);
  }
  const bool lr = p.v_lr.active();
  if (p.head_dim == 64) return lr ? launch<64, 16>(p, x) : launch<64, 0>(p, x);
  return lr ? launch<128, 16>(p, x) : launch<128, 0>(p, x);
}

}  // namespace

bool attention_v4_applies(const AttnParams& p) { return use_v4(p); }

int attention_v4_num_splits(const AttnParams& p) { return use_v4(p) ? choose_splits(p) : attention_v3_num_splits(p); }

cudaError_t attention_v4(const AttnParams& p) {
  if (!use_v4(p)) return attention_v3(p);
  return run_v4(p, DecodeRopeStore{});
}

bool attention_decode_rope_store_applies(const AttnParams& p) {
  // One sequence's one query (rows: its G heads, one row tile) whose splits merge in the last
  // block (write_q runs there); no V term (base-lr's LRv row of the new key is another store).
  return use_v4(p) && !p.agents && p.n_seqs == 1 && p.max_q == 1 && v4_rows(p) <= kTileRows && !p.v_lr.active() &&
         merge_kernel_mode() != 2;  // the kernel's kRopeStore instantiations
}

cudaError_t attention_decode_rope_store(const AttnParams& p, const DecodeRopeStore& rs) {
  const bool complete = rs.q && rs.q16 && rs.k && rs.v && rs.pos && rs.inv_freq && p.q == rs.q16 &&
                        (rs.q_norm_w == nullptr) == (rs.k_norm_w == nullptr);
  if (!complete || !attention_params_ok(p) || !attention_decode_rope_store_applies(p))
    return cudaErrorInvalidValue;
  return run_v4(p, rs);
}

}  // namespace lragent::cuda
