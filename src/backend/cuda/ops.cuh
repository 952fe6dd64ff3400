// Launchers for the CUDA backend's non-GEMM ops (ops.cu, ops_rope_store.cu, ops_argmax.cu,
// attention_generic.cu): conversions, RMSNorm, RoPE, SwiGLU, residual add, embedding, row
// gather, paged cache stores, synthetic-weight fill, and the generic paged attention (any
// head_dim, f32 or bf16 caches) that serves the f32 path and the shapes the tuned kernels
// (attention.cuh) do not cover.
// Plain types only: the host-compiled backend (cuda_backend.cpp) includes this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lragent::cuda {

enum class Elem : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// dst[r, c] = convert(src[r, c]) for a [rows, cols] matrix with row strides (elements).
cudaError_t convert_rows(const void* src, Elem src_t, int64_t ld_src, void* dst, Elem dst_t, int64_t ld_dst,
                         int64_t rows, int64_t cols, cudaStream_t s);
// dst[i] = stddev · random_normal_at(seed, i)   (backend/random.h)
cudaError_t fill_random(void* dst, Elem t, int64_t n, uint64_t seed, float stddev, cudaStream_t s);
cudaError_t fill_value(void* dst, Elem t, int64_t n, float value, cudaStream_t s);

// RMSNorm of `rows` rows, optionally after the residual add:
//   h[i, :] += x[i, :]  (when x is set; rms_norm takes no x), then y[i, :] = h[i, :] / rms(h[i, :]) · w
struct RmsNormCall {
  float* h = nullptr;  // [rows, ldh] f32: the rows normed (written only by add_rms_norm's add)
  int64_t ldh = 0;
  const float* x = nullptr;  // [rows, ldx] f32 added to h first, or null (y = rms_norm(h), h not written)
  int64_t ldx = 0;
  const void* w = nullptr;  // [d] f32/bf16/f16
  Elem w_t = Elem::kF32;
  float eps = 0.f;
  // [rows, ldy] f32: may alias x (add_rms_norm) or h (rms_norm in place, each value read before
  // it is written); may be null when y16 is given (the GEMMs are the only readers:
  // Backend::set_matmul_only_outputs).
  float* y = nullptr;
  int64_t ldy = 0;
  // Optional, [rows, d] bf16 contiguous: the same rows for the next GEMM's tensor-core operand
  // (saves a conversion pass).
  void* y16 = nullptr;
  int64_t rows = 0, d = 0;
  cudaStream_t stream = nullptr;
};
// y = rms_norm(h) (c.x must be null); any d.
cudaError_t rms_norm(const RmsNormCall& c);
// The residual add and the next norm in one pass (values held in registers). d <= 16384, else
// cudaErrorInvalidValue.
cudaError_t add_rms_norm(const RmsNormCall& c);

// Skinny GEMM for decode (rows <= gemv_max_rows()): y[r, o] = alpha · Σ_k x[r, k] · w[o, k] + beta · y[r, o]
// with bf16 w [out, in] (row stride ldw), f32 x and y. Reads each weight once at full bandwidth;
// x is f32 as the model keeps it (no conversion pass). Needs in % 8 == 0, ldw % 8 == 0, ldx % 4 == 0
// and 16-byte aligned w and x; returns cudaErrorInvalidValue otherwise (callers fall back to cuBLASLt).
// Versions 1 and 2 (CUDA cores) take up to kGemvMaxRows rows; version 3 (tensor cores,
// from gemv_v3_min_rows() rows) up to kGemvV3MaxRows, reading x past kGemvMaxRows rows from x16:
// the same rows in bf16, [rows, in] contiguous and 16-byte aligned (the entry points below return
// cudaErrorInvalidValue without it there; x is not read then).
constexpr int kGemvMaxRows = 8;
constexpr int kGemvV3MaxRows = 16;
// Rows of a decode pass whose small ops run fused (the LoRA expands in one launch, RoPE with q's
// LoRA term, the stores with k's RoPE and the held-back v expands, Qwen3's q/k norms with q's
// LoRA term): the passes version 3 serves.
constexpr int kDecodePassMaxRows = kGemvV3MaxRows;
int64_t gemv_v3_min_rows();
// Rows up to which gemv_bf16 takes x: kGemvV3MaxRows (past kGemvMaxRows always version 3), or
// kGemvMaxRows where LRAGENT_GEMV_V3_ROWS turns version 3 off (more than kGemvV3MaxRows).
inline int64_t gemv_max_rows() { return gemv_v3_min_rows() <= kGemvV3MaxRows ? kGemvV3MaxRows : kGemvMaxRows; }
// Whether gemv_bf16 takes these operands (host-side check, no launch).
inline bool gemv_bf16_ok(const void* w, int64_t ldw, const float* x, int64_t ldx, int64_t rows, int64_t in) {
  return rows >= 1 && rows <= gemv_max_rows() && in % 8 == 0 && ldw % 8 == 0 && ldx % 4 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}
// One GEMV's operands (gemv_bf16 and its numbered versions), as above.
struct GemvCall {
  const void* w = nullptr;  // bf16 [out, ldw]
  int64_t ldw = 0;
  const float* x = nullptr;  // f32 [rows, ldx]
  int64_t ldx = 0;
  float* y = nullptr;  // f32 [rows, ldy]
  int64_t ldy = 0;
  int64_t rows = 0, in = 0, out = 0;
  float alpha = 1.f, beta = 0.f;
  const void* x16 = nullptr;  // bf16 [rows, in]: x as version 3 reads it past kGemvMaxRows rows
  cudaStream_t stream = nullptr;
};
// The current versions (gemv.cu: v2 for one row, v3 past it); v1 (ops.cu; ignores x16) and the
// v2/v3 entry points are kept for the benchmark and tests. Version 3 (gemv_v3_mma.cu, tensor
// cores) runs at any row count through its entry point; gemv_bf16 takes it from
// gemv_v3_min_rows() rows (2 unless LRAGENT_GEMV_V3_ROWS says).
cudaError_t gemv_bf16(const GemvCall& c);
cudaError_t gemv_bf16_v1(const GemvCall& c);
cudaError_t gemv_bf16_v2(const GemvCall& c);
cudaError_t gemv_bf16_v3(const GemvCall& c);
// Several weight matrices that read the same x (q/k/v, gate/up) in one launch of v2.
constexpr int kMaxGemvSegs = 8;
struct GemvSeg {
  const void* w = nullptr;  // bf16 [out, ldw]
  int64_t ldw = 0;
  float* y = nullptr;  // f32 [rows, ldy]
  int64_t ldy = 0;
  int64_t out = 0;
};
// Norm mode of the grouped GEMV and of gemv_bf16_swiglu: x is the residual stream h, and the
// weights read its RMSNorm without it being written, y = alpha · (h / sqrt(mean(h²) + eps) · g) · w^T
// + beta · y, the mean over the `in` columns. g [in] f32 or bf16, 16-byte aligned; w null: no
// norm mode.
struct GemvNorm {
  const void* w = nullptr;  // g
  Elem t = Elem::kF32;
  float eps = 0.f;
};
// Floats of one normed row as norm mode stages it in shared memory (in rounded up to groups of
// 32 chunks; the layout is in gemv.cu).
constexpr int64_t gemv_norm_row_floats(int64_t in) { return (in + 255) / 256 * 256; }
// Bytes the staged rows may take: a launch gets 48 KiB of shared memory without opting in, static
// and dynamic together, and the staging kernel's reduction buffer ([8 warps][rows] floats, at
// most this much; gemv.cu asserts it) takes its share. 12288 staged floats (Ministral-8B's down
// projection) are exactly 48 KiB and failed the launch with "invalid argument" before this.
constexpr int64_t kGemvStaticSmemBytes = 8 * kGemvMaxRows * 4;
constexpr int64_t kGemvStageBytes = 48 * 1024 - kGemvStaticSmemBytes;
// Whether `rows` rows of `in` values fit the staging (norm mode, stream mode).
constexpr bool gemv_stage_fits(int64_t rows, int64_t in) {
  return rows * gemv_norm_row_floats(in) * 4 <= kGemvStageBytes;
}
// Rows up to which version 2's staged kernel (norm mode; stream mode) takes a launch whose x fits
// the staging, although version 3 takes plain launches of that many rows: what
// LRAGENT_GEMV_NORM_ROWS (default 2) / LRAGENT_GEMV_STREAM_ROWS (default 1) say (gemv.cu), and
// every row count below gemv_v3_min_rows().
int64_t gemv_norm_max_rows();
int64_t gemv_stream_max_rows();
// Whether norm mode takes g for `rows` rows of `in` values (version 2 only).
inline bool gemv_norm_ok(const GemvNorm& n, int64_t rows, int64_t in) {
  return n.w && (n.t == Elem::kF32 || n.t == Elem::kBF16) && reinterpret_cast<uintptr_t>(n.w) % 16 == 0 &&
         rows <= gemv_norm_max_rows() && gemv_stage_fits(rows, in);
}
// One grouped launch: segs[0..n_segs) all read x (each segment's operands as gemv_bf16's), the
// segments' rows numbered one after another. Held by value, so a launch recorded for later (a
// CUDA graph's capture) keeps its own copy.
struct GemvGroupCall {
  GemvSeg segs[kMaxGemvSegs] = {};
  int n_segs = 0;
  const float* x = nullptr;  // f32 [rows, ldx]
  int64_t ldx = 0;
  int64_t rows = 0, in = 0;
  float alpha = 1.f, beta = 0.f;
  GemvNorm norm;              // norm.w set: norm mode
  const void* x16 = nullptr;  // bf16 [rows, in], as GemvCall's
  cudaStream_t stream = nullptr;
};
cudaError_t gemv_bf16_grouped(const GemvGroupCall& c);
// LoRA expand of decode-sized jobs (lora.cu): for each job and row r < rows,
//   y[r, o] = (base ? base[r, o] : y[r, o]) + scale · Σ_k xa[r, k] · b[o, k]   (xa null: y = base)
// up to kMaxLoraJobs jobs in one launch (a stage's q/k/v expands of every adapter in the batch).
constexpr int kMaxLoraJobs = 8;
constexpr int kMaxLoraRank = 64;
constexpr int kLoraExpandMaxRows = kDecodePassMaxRows;
struct LoraJob {
  const float* xa;     // [rows, ldxa] f32, or null (copy only)
  const void* b;       // [out, ldb] bf16 (b_bf16) or f32
  float* y;            // [rows, ldy] f32
  const float* base;   // [rows, ldbase] f32, or null (accumulate into y)
  int64_t ldxa, ldb, ldy, ldbase;
  int64_t out;
  int32_t rows, rank;  // rows <= kLoraExpandMaxRows, rank <= kMaxLoraRank
  float scale;
  int32_t b_bf16;
};
cudaError_t lora_expand(const LoraJob* jobs, int n_jobs, cudaStream_t s);
// y[r, o] = silu(x·w_gate^T)[r, o] · (x·w_up^T)[r, o] for o < out, in one launch of v2 (the gate
// and up dots of a row meet in one block): the decode MLP's first half without its SwiGLU kernel.
// Same operand rules as gemv_bf16 for both weights; y [rows, ldy] f32 must not alias x. norm.w
// set: x is h and both products read its RMSNorm (see GemvNorm).
struct GemvSwigluCall {
  const void* w_gate = nullptr;  // bf16 [out, ldg]
  int64_t ldg = 0;
  const void* w_up = nullptr;  // bf16 [out, ldu]
  int64_t ldu = 0;
  const float* x = nullptr;  // f32 [rows, ldx]
  int64_t ldx = 0;
  float* y = nullptr;  // f32 [rows, ldy]
  int64_t ldy = 0;
  int64_t rows = 0, in = 0, out = 0;
  GemvNorm norm;
  const void* x16 = nullptr;  // bf16 [rows, in], as GemvCall's
  cudaStream_t stream = nullptr;
};
cudaError_t gemv_bf16_swiglu(const GemvSwigluCall& c);
// Warps v2 gives each output row for this shape (1, 2, 4 or 8: the reduction is split among them).
int gemv_bf16_v2_warps_per_row(int64_t in, int64_t out);
// In-place rotate-half RoPE on x [n, heads, head_dim] f32; pos [n], inv_freq [head_dim/2] on the device.
cudaError_t rope(float* x, int64_t n, int heads, int head_dim, const int32_t* pos, const float* inv_freq,
                 cudaStream_t s);
// rope_pair (RopeArgs, below) with r.lora: the LoRA term of xa's rows added before the rotation,
// a decode step's q expand without a launch of its own. Token t (< n <= kDecodePassMaxRows) with
// lr[t] non-null gets
//   xa[t, h, d] += scale[t] · Σ_k lr[t][k] · b[t][h·head_dim + d, k]
// Narrow fields: it rides in rope_store's parameters, which stay within 4 KB (ops_rope_store.cu).
struct RopeLora {
  const float* lr[kDecodePassMaxRows];  // [rank] x·A of token t, or null
  const void* b[kDecodePassMaxRows];    // [heads_a·head_dim, ldb]: bf16 when b_bf16, else f32
  int32_t ldb[kDecodePassMaxRows];
  int32_t rank[kDecodePassMaxRows];
  float scale[kDecodePassMaxRows];
  uint8_t b_bf16[kDecodePassMaxRows];
};
// Qwen3's per-head RMSNorms of q [n, hq, hd] and k [n, hk, hd] in place, in one launch: each
// head row x = x / rms(x) · w (wq for q's rows, wk for k's, both of type wt, [hd]). With lora,
// token t's q rows first get its LoRA term as rope_pair adds it (RopeArgs::lora) (n <= kDecodePassMaxRows). hd <= 256.
struct QkNormArgs {
  float* q = nullptr;
  float* k = nullptr;
  const void* wq = nullptr;
  const void* wk = nullptr;
  Elem wt = Elem::kF32;
  int hq = 0, hk = 0, hd = 0;
  int64_t n = 0;
  float eps = 0.f;
};
inline constexpr int kQkNormMaxHeadDim = 256;
cudaError_t qk_norm(const QkNormArgs& a, const RopeLora* lora, cudaStream_t s);
// out = silu(gate) · up, elementwise over n values (out may alias gate); out16 (optional) gets
// the same values in bf16; out may be null when out16 is given.
cudaError_t silu_mul(const float* gate, const float* up, float* out, int64_t n, void* out16, cudaStream_t s);
// y += x over n values.
cudaError_t add(float* y, const float* x, int64_t n, cudaStream_t s);
// y[i, j] += bias[j] for a [rows, cols] f32 matrix with row stride ldy; bias f32.
cudaError_t add_bias(float* y, int64_t ldy, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
// out[i, :] = f32(table[ids[i], :]); ids on the device.
cudaError_t embedding(const void* table, Elem t, int64_t d, const int32_t* ids, int64_t n, float* out,
                      cudaStream_t s);
// embedding with row i's id feed[i] >= 0 ? picks[feed[i]] : ids[i] (decode lookahead: the
// previous pass's picks, still on the device).
cudaError_t embedding_fed(const void* table, Elem t, int64_t d, const int32_t* ids, const int32_t* feed,
                          const int32_t* picks, int64_t n, float* out, cudaStream_t s);
// dst[i, :] = src[rows[i], :] for rows of `row_bytes` bytes; rows on the device.
cudaError_t gather_rows(const void* src, int64_t row_bytes, const int32_t* rows, int64_t n, void* dst,
                        cudaStream_t s);

// out[r] = index of the largest value of row r of x [rows, cols] (row stride ldx); ties: lowest
// index; NaN never picked (all-NaN row: 0). One block per row.
cudaError_t argmax_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, int32_t* out, cudaStream_t s);

// One layer of a paged cache on the device (table on the device).
struct PagedDev {
  void* data = nullptr;  // block 0's rows of this layer (see PagedView)
  Elem dtype = Elem::kF32;
  const int32_t* table = nullptr;
  int page_size = 1;
  int64_t row_stride = 0;
  int64_t block_stride = 0;  // elements from block b to b + 1 (never 0 here: the backend resolves it)
};

// Writes rows [n, width] (f32) into a paged cache at token slots[i] (on the device), converting;
// up to kMaxStoreJobs such stores in one launch (a layer's K and V, base and LR rows, of every
// sequence of a pass: Backend::begin_store_batch).
constexpr int kMaxStoreJobs = 16;
struct StoreJobDev {
  const float* rows = nullptr;  // [n, width] f32
  int64_t n = 0, width = 0;
  PagedDev dst;
  const int32_t* slots = nullptr;  // [n] on the device
  // >= 0: rows are the output y of StoreLoras::job[lora], a LoRA expand held back by the backend
  // (a private cache's v_full = v_base + s·(x·A)·B of a decode pass): the store computes each
  // element as the expand would (lora_expand.cuh) instead of reading it, and, when lora_writes_y,
  // writes it to y too, so y holds what the expand kernel would have left there.
  int32_t lora = -1;
  int32_t lora_writes_y = 0;
};
// The held-back expands a launch of stores computes (StoreJobDev::lora). Each job has a base
// (v_base), rows <= kDecodePassMaxRows and a contiguous y ([rows, out], ldy == out).
constexpr int kMaxStoreLora = 4;
struct StoreLoras {
  LoraJob job[kMaxStoreLora];
  int n = 0;
};
// loras: null, or the expands the jobs' `lora` fields index.
cudaError_t store_rows_multi(const StoreJobDev* jobs, int n_jobs, const StoreLoras* loras, cudaStream_t s);

// The operands of rope_pair as one struct (a RoPE the backend may hold back to
// launch with the stores after it: rope_store).
struct RopeArgs {
  float* xa = nullptr;  // [n, ha, hd] rotated in place (q)
  int ha = 0;
  float* xb = nullptr;  // [n, hb, hd] rotated in place (k)
  int hb = 0;
  int64_t n = 0;
  int hd = 0;
  const int32_t* pos = nullptr;       // [n] on the device
  const float* inv_freq = nullptr;    // [hd / 2] on the device
  void* xa16 = nullptr;               // [n, ha, hd] bf16 copy of the rotated xa, or null
  bool lora = false;                  // rl holds q's LoRA terms (added before the rotation)
  RopeLora rl{};
  // Qwen3: xa and xb are normed per head as qk_norm(norm) norms them before they rotate, q's LoRA
  // term (lora) added before the norm (q_norm reads q with it). The CUDA backend holds a decode
  // pass's norm back for the kernel after it: rope_store does all three in one launch (head_dim
  // 64, 128 or 256; others launch qk_norm first), the v4 decode attention (DecodeRopeStore)
  // without a LoRA term; the RoPE alone (rope_pair*) takes no norm.
  bool normed = false;
  QkNormArgs norm{};  // norm.q == xa, norm.k == xb, the same shapes
};
// RoPE of xa [n, ha, hd] and xb [n, hb, hd] (q and k) in one launch, with q's LoRA terms when
// r.lora (n <= kDecodePassMaxRows); xa16 (optional) receives the rotated xa in bf16 too. No norm:
// r.normed gives cudaErrorInvalidValue (launch qk_norm first).
cudaError_t rope_pair(const RopeArgs& r, cudaStream_t s);
// rope_pair(_lora) and store_rows_multi in one launch (a decode pass's RoPE of q and k, then the
// layer's K/V stores, some of which read the rotated k). Job j with tok0[j] >= 0 stores k's rows
// (width hb · hd): its row i is token tok0[j] + i, and the thread that rotates a pair of k writes
// it into that job's cache too. The other jobs (tok0[j] < 0) read nothing the RoPE writes.
// n <= kDecodePassMaxRows, n_jobs <= kMaxStoreJobs.
// Jobs storing k's rows take no expand (their lora is -1).
// With r.normed, Qwen3's q/k norms (and q's LoRA term before them) as well: in the same kernel
// where rope_store_norms(head_dim), else qk_norm launched first.
cudaError_t rope_store(const RopeArgs& r, const StoreJobDev* jobs, const int64_t* tok0, int n_jobs,
                       const StoreLoras* loras, cudaStream_t s);
inline bool rope_store_norms(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

struct LowRankDev {
  PagedDev lr;             // [n_ctx, rank] rows of x·A
  const void* b = nullptr; // [n_kv_heads · head_dim, rank]
  Elem b_dtype = Elem::kF32;
  int rank = 0;
  float scale = 0.f;
};

// Generic causal attention of one sequence (the semantics of AttentionParams in backend.h):
// one block per (query, head), exact online softmax in f32, Flash-LoRA V term in rank space,
// K-side LoRA rebuilt per key with deferred RoPE. head_dim <= 256, rank <= 128.
struct GenericAttnParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float softmax_scale = 0.f;
  int n_q = 0;
  const float* q = nullptr;         // [n_q, n_heads, head_dim]
  const int32_t* q_pos = nullptr;   // [n_q] (device)
  PagedDev k, v;                    // [n_ctx, n_kv_heads · head_dim]
  LowRankDev k_lr, v_lr;            // b == nullptr: inactive
  const float* inv_freq = nullptr;  // [head_dim / 2] (device)
  float* out = nullptr;             // [n_q, n_heads, head_dim]
};
cudaError_t attention_generic(const GenericAttnParams& p, cudaStream_t s);

}  // namespace lragent::cuda
