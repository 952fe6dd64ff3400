// CUDA attention for lragent: paged causal flash attention (prefill chunk and batched
// decode), Flash-LoRA V term (O = P·V_base + (P·LRv)·s·B_v^T, expanded once per query
// block), K-side LoRA residual reconstructed per tile in shared memory with deferred RoPE,
// and shared-base multi-agent decode. Device-side mirror of AttentionParams (backend.h).
//
// Semantics (per sequence s, query i, q head h, kv head g = h / (n_heads / n_kv_heads)):
//   K_j = K_base_j + RoPE_j(s_k · LRk_j · B_k[g]^T)          (when k_lr is active)
//   V_j = V_base_j + s_v · LRv_j · B_v[g]^T                   (when v_lr is active)
//   O_i = softmax(q_i · K_j^T · softmax_scale, j <= pos_i) · V
// Query i of sequence s sits at pos_i = ctx_len[s] - n_q[s] + i (a causal chunk at the end
// of the context: prefill chunk or decode with n_q = 1). In agents mode every query of a
// sequence sits at ctx_len[s] - 1 and query i uses adapter a = q_start[s] + i (B + a·b_agent_stride,
// or b_seq[a]): N agents decoding one token each over the same base and LR pages, numbered
// through the sequences when several groups of agents share one launch (each group a sequence,
// their tables the same pages: the groups of a shared prefix's forks, read in one pass).
//
// Layouts (bf16 unless noted):
//   q   [total_q, n_heads, head_dim]   rows q_start[s] .. q_start[s+1]-1 belong to sequence s
//   out [total_q, n_heads, head_dim]   bf16 and/or f32 (either pointer may be null)
//   paged cache: token t of sequence s lives at
//     data + (table[s·table_stride + t / page_size] · page_size + t % page_size) · row_stride
//   K/V rows hold n_kv_heads·head_dim values (head g at offset g·head_dim); LR rows hold rank.
//   B (lora_B as PEFT stores it) [n_kv_heads·head_dim, rank] row-major; inv_freq f32 [head_dim/2].
// Requirements: head_dim ∈ {64, 128}; page_size a power of two; rank ≤ 64 and rank % 4 == 0;
// K/V row_stride % 8 == 0 and 16-byte aligned data; LR row_stride % 4 == 0 (8-byte aligned).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define LRAGENT_HD __host__ __device__
#else
#define LRAGENT_HD
#endif

namespace lragent::cuda {

using bf16 = __nv_bfloat16;

// One layer of a paged cache on the device.
struct DevPagedView {
  const bf16* data = nullptr;      // block 0's rows of this layer ([n_blocks, page_size, row_stride] when contiguous)
  const int32_t* table = nullptr;  // [n_seqs, table_stride] block ids
  int64_t table_stride = 0;        // entries per sequence; 0: every sequence shares one table
  int page_size = 1;               // power of two
  int64_t row_stride = 0;          // elements per token row
  // Elements from block b to b + 1: page_size · row_stride for one contiguous layer slice, larger
  // in a KvArena. Always set (no 0 default to resolve in the kernels' address arithmetic).
  int64_t block_stride = 0;
};

// Low-rank adapter term (see LowRankTerm in backend.h).
struct DevLowRank {
  DevPagedView lr;             // [n_ctx, rank] rows of X·A, K side pre-RoPE
  const bf16* b = nullptr;     // [n_kv_heads·head_dim, rank] lora_B (row-major)
  int64_t b_agent_stride = 0;  // agents mode: elements between agents' B matrices
  // Decode batches of sequences with different adapters: device [n_seqs] B of each sequence
  // (used instead of b, which must still be set); in agents mode [total_q], each agent's B. Only
  // the v4 decode kernel takes it, on the V side alone or on both sides (a K side's b_seq needs
  // the V side's, and in agents mode with a K term the V side's needs the K side's);
  // attention() refuses it where v4 would not run (attention_v4_applies).
  const bf16* const* b_seq = nullptr;
  int rank = 0;
  float scale = 0.f;
  LRAGENT_HD bool active() const { return b != nullptr && rank > 0; }
};

struct AttnParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float softmax_scale = 0.f;  // 1 / sqrt(head_dim)
  int n_seqs = 0;
  const int32_t* q_start = nullptr;  // device [n_seqs + 1] prefix sums of queries per sequence
  const int32_t* ctx_len = nullptr;  // device [n_seqs] keys available per sequence (>= n_q)
  int max_q = 0;                     // host: max queries of one sequence (grid sizing)
  int max_ctx = 0;                   // host: max ctx_len (grid sizing)
  bool agents = false;               // shared-position multi-agent mode (see top)
  const bf16* q = nullptr;
  DevPagedView k, v;
  DevLowRank k_lr, v_lr;
  const float* inv_freq = nullptr;  // needed when k_lr is active
  // The K term's RoPE puts key j of every sequence's view at position k_pos0 + j (a fork's own keys
  // after a shared prefix of k_pos0 keys, read through tables that start there). v4 only.
  int k_pos0 = 0;
  bf16* out = nullptr;              // may be null
  float* out_f32 = nullptr;         // may be null
  // Optional, [n_tokens, n_heads] like the output's rows: each row's log2 Σ_j exp(softmax_scale ·
  // q·k_j) over the keys it attended, so that the outputs of disjoint key ranges merge exactly
  // (attention_merge: a shared prefix in agents mode, each sequence's own keys after it). Only
  // v4's decode kernel writes it: attention() refuses it wherever another kernel would run.
  float* lse_out = nullptr;
  // Split-K (flash-decoding) scratch; null disables splitting.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int num_splits = 0;  // 0: heuristic; >0: force (clamped to what fits)
  // v4 decode's split-K merge: [split_counters_capacity] counters, zero at rest (the kernel sets
  // each back to zero after use), one per (sequence, kv head). Null: decode runs v3's path.
  unsigned int* split_counters = nullptr;
  int64_t split_counters_capacity = 0;
  cudaStream_t stream = nullptr;
};

// Agents mode on v4 takes at most this many query rows (agents x n_heads / n_kv_heads) a kv head.
constexpr int kAgentsMaxRows = 32;

// Kernel versions (llm.c style: each one kept, numbered, testable against the CPU reference).
enum class AttnKernel {
  kV0Naive = 0,  // one block per (query, head), scalar f32, exact online softmax: the oracle
  kV1Mma = 1,    // FA2-style mma.sync m16n8k16 bf16, ldmatrix, cp.async double buffering,
                 // GQA-packed rows, split-K + combine, Flash-LoRA + K residual in the loop
  kV2Mma = 2,    // v1 reorganised for prefill: 128 rows / 8 warps per block, 3-stage ring with
                 // one barrier per tile, FFMA+EX2 softmax, shared RoPE table for the K term;
                 // decode without the K term (<= 64 rows per sequence) runs v1.
  kV3Mma = 3,    // FA2's d=128 layout for prefill: 4 warps x 32 rows (two m16 tiles per warp, each
                 // K/V smem fragment feeds two mmas), 2 blocks/SM, 2-stage ring. Plain and Flash-LoRA
                 // V (rank <= 16) at d=128; everything else (K term, agents, d=64, rank > 16) runs v2,
                 // which sends decode to v1.
  kV4Decode = 4,  // v3 plus a decode kernel (one query per sequence, or agents mode; N·G <= 32
                  // rows as one or two m16 tiles; V rank <= 16; a K term of rank <= 16 beside a
                  // V term, agents mode included): four warps per row tile split each
                  // key tile, split-K merged by the last block of each kv head (needs split_counters).
  kV5Wgmma = 5,   // v4 plus a Hopper wgmma prefill kernel (2 warpgroups x 64 rows, Q/K/V read by
                  // wgmma from swizzled shared memory, P from registers) at d=128 with K and V
                  // ranks 8/16 (or none), no agents; elsewhere (and without an sm_90a build or
                  // device) it is v4.
  kV6WgmmaWs = 6,  // v5 warp-specialised: a producer warpgroup fills a 4-stage ring (cp.async +
                   // mbarriers), two consumer warpgroups take turns at the tensor cores. Plain
                   // and Flash-LoRA V prefill at d=128; everything else is v5. The default.
};

// Runs attention. Returns cudaErrorInvalidValue for unsupported shapes, else the launch status.
// `kernel` is the newest version allowed: each version hands the shapes it does not cover to an
// older one (see the enum), so the kernel that runs may be older.
cudaError_t attention(const AttnParams& p, AttnKernel kernel = AttnKernel::kV6WgmmaWs);

// Whether attention() accepts p: the shape and alignment checks it runs first, without launching
// (tests check each rejected field against a params set this accepts).
bool attention_params_ok(const AttnParams& p);
// Whether p runs v4's decode kernel (one query per sequence or agents mode, no K-side term,
// V rank <= 16, split counters and aligned outputs/workspace): the kernel that takes b_seq.
bool attention_v4_applies(const AttnParams& p);

// A batch-1 decode step's RoPE of q and k and its K/V cache stores, done by the v4 decode launch
// that reads them (attention_decode_rope_store) instead of by a rope_store kernel before it: one
// kernel boundary fewer per layer. The launch leaves every buffer as rope_store followed by
// attention would, bit for bit:
//   * each block rotates its own heads' rows of q (f32) into its bf16 query fragments; with
//     write_q, the block that merges a kv head's splits (the last to finish) writes them back
//     rotated into q and q16 (the other blocks have read them by then). Without it q keeps its
//     unrotated values and q16 is not written: for callers whose q is read by this attention
//     alone (Backend::set_matmul_only_outputs), which then skip that last block's extra work;
//   * the block whose keys hold the new token (key ctx_len - 1) rotates k's row of its kv head
//     in place, stores it and v's row into the caches at that key (p.k, p.v), and uses the same
//     values for that key from shared memory (its copy of the row from the cache may predate
//     them).
// Rotation angle: pos[0] · inv_freq[i] for the pair (i, i + head_dim / 2) (rope_math.cuh).
struct DecodeRopeStore {
  float* q = nullptr;               // [n_heads, head_dim] f32 before RoPE: rotated in place
  bf16* q16 = nullptr;              // [n_heads, head_dim] the rotated q in bf16; p.q must be q16
  float* k = nullptr;               // [n_kv_heads, head_dim] f32 before RoPE: rotated in place
  const float* v = nullptr;         // [n_kv_heads, head_dim] f32
  const int32_t* pos = nullptr;     // [1] device: the token's position
  const float* inv_freq = nullptr;  // [head_dim / 2] device
  bool write_q = true;              // leave q and q16 rotated (see above)
  // Qwen3 (optional): q's and k's head rows RMS-normed before the RoPE, with qk_norm's bits
  // (ops.cuh): x = w · (x / rms(x)), q's rows by q_norm_w, k's by k_norm_w ([head_dim] each, bf16
  // when norm_w_bf16, else f32). q and k then hold the normed, rotated rows, as after qk_norm and
  // rope_store.
  const void* q_norm_w = nullptr;
  const void* k_norm_w = nullptr;
  bool norm_w_bf16 = false;
  float norm_eps = 0.f;
  LRAGENT_HD bool active() const { return q != nullptr; }
  LRAGENT_HD bool normed() const { return q_norm_w != nullptr; }
};
// Whether p takes a DecodeRopeStore: v4's decode kernel at one row tile, one sequence with one
// query, no LoRA term, its split merge in the last block (not attn_v4_merge_kernel).
bool attention_decode_rope_store_applies(const AttnParams& p);
// attention(p) with rs's RoPE and stores done by the same launch; cudaErrorInvalidValue where
// attention_decode_rope_store_applies(p) does not hold or rs is incomplete.
cudaError_t attention_decode_rope_store(const AttnParams& p, const DecodeRopeStore& rs);

// Merges two attentions of the same query rows over disjoint key ranges, each normalised over its
// own keys with its lse_out: for each of `rows` rows of head_dim values,
//   out = (2^(lse_a - m) · o_a + 2^(lse_b - m) · o_b) / (2^(lse_a - m) + 2^(lse_b - m)),
// m = max(lse_a, lse_b) (a row with no keys has lse -inf and weight 0). out may be o_b (in place).
// o_a, o_b, out: [rows, head_dim] f32, 16-byte aligned; lse_a, lse_b: [rows].
struct AttnMerge {
  const float* o_a = nullptr;
  const float* lse_a = nullptr;
  const float* o_b = nullptr;
  const float* lse_b = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int head_dim = 0;  // a multiple of 4, at most 256
};
cudaError_t attention_merge(const AttnMerge& m, cudaStream_t stream);

// The version whose kernel the calling thread's latest attention() call launched (tests and
// diagnostics: a test asking for v6 can check that v6, not a fallback, was what it checked).
AttnKernel attention_last_kernel();

// Workspace bytes that let `attention` use up to `max_splits` splits for these shapes (any version).
size_t attention_workspace_bytes(const AttnParams& p, int max_splits = 64);

// The split count `kernel` would use for p (after clamping to the workspace).
int attention_num_splits(const AttnParams& p, AttnKernel kernel = AttnKernel::kV6WgmmaWs);

// The plan half of a launch: the split count `kernel` picks for p when given a workspace of any
// size (16-byte aligned, as every device allocation is), and the bytes that workspace needs (0
// when unsplit). p.workspace and p.workspace_bytes are ignored: the plan depends on the shapes
// and the other pointers only, never on where a caller's placeholder happens to lie.
struct AttnPlan {
  int splits = 1;
  size_t workspace_bytes = 0;
};
AttnPlan attention_plan(const AttnParams& p, AttnKernel kernel = AttnKernel::kV6WgmmaWs);

// Materialise-then-attend baseline, step 1: writes V_full = V_base + s_v·LRv·B_v^T for tokens
// 0..ctx_len[s]-1 of every sequence into `v_full`, a paged buffer with p.v's layout (same
// table, page size and row stride). Adapter 0 only (not agents mode).
cudaError_t materialize_v(const AttnParams& p, bf16* v_full);

// The K side's materialisation, used for prefill chunks (where the per-tile rebuild of the fused
// K term costs more than the chunk's attention; docs/cuda.md): writes
//   k_full[t, g·D + c] = K_base[t, g·D + c] + RoPE_t(s_k·LRk_t·B_k^T)[g·D + c]
// for tokens t < ctx_len[0] of the one sequence (n_seqs == 1) into the dense, row-major
// [max_ctx, n_kv_heads·head_dim] buffer k_full (bf16), rotating pairs (c, c + D/2) by t·inv_freq.
// v_dense (optional, same shape): V's rows copied alongside, so that the attention after it finds
// K and V under one block table (the prefill kernels address both with one lookup then; a dense K
// beside a paged V ran the Flash-LoRA V kernel 1.6x slower on an H200).
// Needs what materialize_k_applies() checks: an active K term of rank <= kMaterializeKMaxRank,
// one sequence, inv_freq, and n_kv_heads·head_dim / 2 rotation pairs of at most 256, or a
// multiple of 256 up to 1024.
constexpr int kMaterializeKMaxRank = 16;
bool materialize_k_applies(const AttnParams& p);
cudaError_t materialize_k(const AttnParams& p, bf16* k_full, bf16* v_dense = nullptr);

}  // namespace lragent::cuda
