// Internal: the CUDA backend class, shared by its .cpp files (not part of the public API).
// The CUDA backend: the Backend interface on one NVIDIA GPU.
//   memory   stream-ordered allocator (cudaMallocAsync on the backend's stream, pool kept
//            cached), so the per-forward activations cost no cudaMalloc/cudaFree syncs;
//   GEMM     cuBLASLt (lt_gemm.h), but the decode GEMV (gemv.cu) for one row;
//   ops      ops.cu, ops_rope_store.cu, ops_argmax.cu (RMSNorm, RoPE, SwiGLU, embedding, paged
//            stores, ...); the token pick (temperature, top-k, top-p) in sampling.cu;
//   attention  the tuned kernels of attention.cuh for bf16 caches with head_dim 64/128, else
//            the generic kernel of attention_generic.cu (f32 caches, other head dims);
//   host arrays passed to ops (ids, positions, slots, block tables, inv_freq): host_args.h.
//   graphs   passes of at most kGraphMaxRows rows (decode steps) are recorded on a GraphTape and
//            replayed as CUDA graphs (graph_tape.h); --enforce-eager / options.graphs=false
//            turns this off.
// Host C++ (compiled by the host compiler, not nvcc): only launchers from the .cu files.
// Files: this header (the class, its state, the recording/dispatch helpers every op uses);
// cuda_backend.cpp (creation, memory, passes and graphs, host transfers, the token pick);
// cuda_backend_ops.cpp (GEMM/GEMV, norms, RoPE, SwiGLU, embedding);
// cuda_backend_attention.cpp (paged stores and attention: the tuned kernels or the generic one).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/core.h>

#include "backend/backend.h"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/graph_tape.h"
#include "backend/cuda/host_args.h"
#include "backend/cuda/lt_gemm.h"
#include "backend/cuda/op_profiler.h"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/sampling.cuh"

namespace lragent::cuda_impl {

namespace lc = lragent::cuda;

// The stream every op and allocation of the (single) CUDA backend is ordered on; Tensor's free
// function is a plain function pointer, so it reaches the stream through this global.
inline cudaStream_t g_stream = nullptr;

inline void free_async(void* p) {
  if (p) cudaFreeAsync(p, g_stream);
}

// Tensors handed out from the per-pass activation arena: nothing to free, but the count of live
// ones tells whether the arena may be reset (a tensor kept past its pass would be overwritten).
inline int64_t g_arena_live = 0;
inline void arena_release(void*) { --g_arena_live; }

inline lc::Elem elem_of(DType t) {
  switch (t) {
    case DType::kF32: return lc::Elem::kF32;
    case DType::kBF16: return lc::Elem::kBF16;
    case DType::kF16: return lc::Elem::kF16;
    default: assert(false && "CUDA backend ops take f32/bf16/f16 tensors"); return lc::Elem::kF32;
  }
}

inline int64_t row_stride_of(const TensorView& t) { return t.strides.empty() ? t.dim(1) : t.strides[0]; }

inline uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> create(const CudaBackendOptions& o);

  ~CudaBackend() override;

  std::string name() const override { return fmt::format("cuda:{} ({}, {})", device_, gpu_name_, dtype_name(dtype_)); }
  Device device() const override { return Device::kCuda; }
  DType weight_dtype() const override { return dtype_; }
  DType cache_dtype() const override { return dtype_; }

  Tensor alloc(DType t, Dims shape) override;

  Tensor upload(const TensorView& host, DType dtype) override;

  void fill_random(TensorView& t, uint64_t seed, float stddev) override;
  void fill(TensorView& t, float value) override;
  void synchronize() override;
  Status take_error() override;

  MemoryStats memory_stats() const override;
  void reset_peak_memory() override;

  void begin_pass(int64_t n_rows, int64_t n_seqs = 0) override;
  void end_pass() override {
    pass_open_ = false;
    if (tape_->recording()) flush_tape();
  }
  void set_matmul_only_outputs(bool on) override { matmul_only_ = on; }
  GraphStats graph_stats() const override {
    const lc::TapeStats& t = tape_->stats();
    return {t.passes,     t.replayed,         t.captured,          t.eager,
            t.updated,    t.record_ms,        host_picks_,         t.capture_failures,
            batched_attn_, batched_attn_seqs_, materialized_k_, fused_rope_stores_, t.segments,
            fused_lora_stores_, fused_rope_attention_, fused_qk_norms_, shared_prefix_attn_,
            shared_prefix_seqs_, same_keys_attn_, same_keys_seqs_};
  }

  void copy(const TensorView& src, TensorView& dst) override;

  void gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) override;

  Tensor to_host(const TensorView& src) override;

  void argmax_rows(const TensorView& x, int32_t* out) override;

  void sample_rows(const TensorView& logits, std::span<const RowSampling> params, int32_t* out) override;
  void sample_rows_deferred(const TensorView& logits, std::span<const RowSampling> params) override;
  void take_picks(int32_t* out, int64_t rows) override;
  void embedding_fed(const TensorView& table, const int32_t* ids, const int32_t* feed, int n,
                     TensorView& out) override;

  void matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y, float alpha,
              float beta) override;

  void matmul_group(const TensorView& x, std::span<const MatmulOut> outs) override;
  void lora_expand(std::span<const LoraExpandJob> jobs) override;

  void add_bias_if(const TensorView* bias, TensorView& y, int64_t n, int64_t out);

  void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) override;
  void head_rms_norm(TensorView& x, const TensorView& weight, float eps) override;
  void qk_rms_norm(TensorView& q, const TensorView& q_w, TensorView& k, const TensorView& k_w, float eps,
                   std::span<const LoraExpandJob> q_lora) override;

  void add_rms_norm(TensorView& h, const TensorView& x, const TensorView& weight, float eps, TensorView& y) override;

  void rope(TensorView& x, const int32_t* positions, const float* inv_freq) override;

  void rope_pair(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq) override;
  void rope_pair_lora(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq,
                      std::span<const LoraExpandJob> a_lora) override;

  void silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) override;
  void matmul_swiglu(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                     TensorView& up) override;
  bool folds_rms_norm(int64_t rows) const override;
  void rms_norm_matmul_group(const TensorView& h, const TensorView& norm_w, float eps, TensorView& xn,
                             std::span<const MatmulOut> outs) override;
  void rms_norm_matmul_swiglu(const TensorView& h, const TensorView& norm_w, float eps, TensorView& xn,
                              const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                              TensorView& up) override;

  void add(TensorView& y, const TensorView& x) override;

  void embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) override;

  void store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) override;

  void store_rows_multi(std::span<const StoreJob> jobs) override;

  void begin_store_batch() override { store_batching_ = true; }
  void end_store_batch() override;
  void attention(const AttentionParams& p) override;
  void attention_batch(std::span<const AttentionParams> ps) override;

 private:
  // Decode passes (a row a sequence) of up to this many rows are recorded as CUDA graphs; other
  // passes (a prompt's chunk, a catch-up, either beside decode rows) up to kGraphMaxMixedRows,
  // since their shapes seldom come back. Until session 36 both were 8: 32 had been measured
  // worse (16 requests decoding together: 2.50 s against 2.04 s eager, their passes re-captured
  // or updated ~1 in 6 steps). Since then, H200, Llama-3.1-8B shapes, serve-concurrency.py, two
  // rounds: 16 clients 1.12-1.13 s against 1.21-1.22 s with 8 (5 graphs captured, none
  // updated), 8 clients 0.93 against 0.95-0.96 s; 16 parallel agents on one 32k prompt 2.87 s
  // against 3.15 s. 64 (one run, 7749e40): 32 clients 1.51 s either way, 64 clients 2.35 against
  // 2.45 s with 32, within what two runs may differ by; not changed on one sample.
  static constexpr int64_t kGraphMaxRows = 32, kGraphMaxMixedRows = 8;
  int64_t graph_max_rows_ = kGraphMaxRows;  // LRAGENT_CUDA_GRAPH_MAX_ROWS overrides both (measuring)
  int64_t graph_max_mixed_rows_ = kGraphMaxMixedRows;
  // A recorded pass that begins on an idle GPU (a step not recorded ahead) runs its first
  // kGraphSplitOps ops as a segment of their own as soon as they are recorded (graph_tape.h), so
  // the GPU works while the host records the rest. 16 ops are two to three layers of an 8B decode
  // step (~0.3 ms of GPU time), more than the host takes to record the whole step (0.06-0.15 ms).
  // LRAGENT_CUDA_GRAPH_SPLIT overrides it (0: never split).
  static constexpr int64_t kGraphSplitOps = 16;
  int64_t split_ops_ = kGraphSplitOps;
  bool split_armed_ = false;  // this pass still runs its first segment at split_ops_ ops
  bool split_busy_ = false;   // LRAGENT_CUDA_GRAPH_SPLIT_BUSY=1: split passes that start on a busy GPU too
  // Runs the pass's ops recorded so far as its first segment (their arguments copied first).
  void split_pass();
  // A failed tape run's cause for the pass's error: the op whose launch failed, when known.
  std::string tape_error(cudaError_t e) const;
  bool store_batching_ = false;              // begin_store_batch .. end_store_batch
  std::vector<lc::StoreJobDev> pending_stores_;  // held back until end_store_batch
  // Per pending store job: the element offset of its row in the cache (dst.data) when it stores
  // one row, else -1 (from the host's block table; run_fast_attention compares it with the key it
  // reads last).
  std::vector<int64_t> pending_store_rows_;
  // Launches jobs in launches of up to lc::kMaxStoreJobs; with a RoPE pending, as one rope_store
  // launch when the jobs allow it, or held for the attention after it (pending_rope_attn_).
  // row_at: per job, as pending_store_rows_ (empty: unknown).
  void launch_stores(std::span<const lc::StoreJobDev> jobs, std::span<const int64_t> row_at = {});
  void launch_rope_store(const lc::RopeArgs& r, const lc::StoreJobDev* jobs, const int64_t* tok0, int nj,
                         const lc::StoreLoras* loras);
  // A recorded batch-1 decode pass's rope_store (the RoPE of q and k, then k's and v's one row
  // each into bf16 caches), held back in turn: when the attention after it reads q and those
  // caches with the new token as its last key, its v4 launch does the same work itself
  // (lc::attention_decode_rope_store): one kernel boundary fewer per layer. Any other op launched
  // first, and the end of the pass, launch it as rope_store (flush_rope_store).
  struct HeldRopeStore {
    lc::RopeArgs r;
    lc::StoreJobDev k_job, v_job;  // k's store (its row is xb's, which the RoPE rotates) and v's
    int64_t k_row = -1, v_row = -1;  // their element offsets in the caches (pending_store_rows_)
  };
  std::optional<HeldRopeStore> pending_rope_attn_;
  void flush_rope_store();
  // The held rope_store as the DecodeRopeStore of attention p (a: its launch parameters), or
  // nothing when p does not read exactly what it writes.
  std::optional<lc::DecodeRopeStore> rope_store_for(const AttentionParams& p, const lc::AttnParams& a) const;
  int64_t fused_rope_attention_ = 0;
  int64_t fused_qk_norms_ = 0;
  // A recorded decode pass's Qwen3 q/k norm (qk_rms_norm; with q's LoRA term when decode-sized),
  // held back for the RoPE of the same q and k, which carries it on (RopeArgs::normed): to the
  // rope_store launch that norms, rotates and stores, or the batch-1 decode attention that does
  // (without a LoRA term); before a RoPE launched alone it launches first. Any other op launched
  // first, and the end of the pass, launch it alone (flush_norm).
  struct HeldNorm {
    lc::QkNormArgs a;
    bool lora = false;  // rl: q's LoRA term, added before the norm
    lc::RopeLora rl{};
  };
  std::optional<HeldNorm> pending_norm_;
  // What a held norm reads and writes, as the RoPE of the same rows (for expand_overlaps and
  // overlaps): a held expand whose base is k (a full K = k_base + LoRA term) must read k before
  // the norm writes it, so such expands launch before a norm is held, and none is held after it.
  static lc::RopeArgs operands_of(const HeldNorm& h);
  void flush_norm();
  void launch_qk_norm(const lc::QkNormArgs& a, const lc::RopeLora* lora);
  bool fuse_qk_norm_ = true;  // pending_norm_ (LRAGENT_CUDA_FUSE_QK_NORM=0: off, as before session 33)
  // A recorded decode pass's RoPE of q and k (rope_pair_impl), held back so that the layer's K/V
  // stores that follow can run in the same launch (lc::rope_store: one kernel instead of two).
  // Any other op launched first, and the end of the pass, launch it alone (flush_rope).
  std::optional<lc::RopeArgs> pending_rope_;
  void flush_rope();
  // A recorded decode pass's LoRA expands with a base (lora_expand), held back likewise when the
  // next store batch may be what reads their outputs first: a private cache's v_full = v_base +
  // s·(x·A)·B, which the store kernel then computes as it stores it (lc::StoreJobDev::lora),
  // writing y too. Any other op launched first, a store batch that does not read every output
  // whole, and the end of the pass launch them alone (flush_expand). Never overlaps a held RoPE's
  // operands (checked when either is held), so the two may launch in either order.
  std::vector<lc::LoraJob> pending_expand_;
  void flush_expand();
  // The held expands as `loras`, each store job of `jobs` that reads an expand's whole output
  // pointed at it; false (nothing changed) when some job reads part of an output or an output is
  // read by no job.
  bool attach_expands(std::span<lc::StoreJobDev> jobs, lc::StoreLoras& loras) const;
  // Whether a held expand reads or writes memory the RoPE r reads or writes.
  bool expand_overlaps(const lc::RopeArgs& r) const;
  int64_t fused_lora_stores_ = 0;
  void launch_rope(const lc::RopeArgs& r);  // the RoPE alone (lc::rope_pair, with q's LoRA terms or not)
  // Grouped decode GEMV launches of `outs` (all GEMV-eligible), in norm mode when `norm` is given.
  void launch_gemv_group(const TensorView& x, std::span<const MatmulOut> outs, const lc::GemvNorm* norm);
  // The fused SwiGLU GEMV (norm mode when `norm` is given); false: the operands need the fallback.
  bool gemv_swiglu(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                   const lc::GemvNorm* norm);
  // The GEMV norm operand for the RMSNorm of h's rows by norm_w, or none when the pass does not
  // fold norms (folds_rms_norm) or the kernel cannot take norm_w.
  std::optional<lc::GemvNorm> gemv_norm_of(const TensorView& h, const TensorView& norm_w, float eps) const;
  bool batch_attention_ = true;             // attention_batch's shared launches (LRAGENT_CUDA_BATCH_ATTENTION=0: off)
  // run_shared_prefix's threshold: (sequences - 1) x shared keys, the key reads it saves per kv
  // head (LRAGENT_CUDA_SHARED_PREFIX_MIN_KEYS; 0: off). Launched one by one (`lragent_attention_bench`,
  // forks rows, H200, 8B shapes, 256 own keys a fork; batch / shared-prefix time, plain and
  // Flash-LoRA V) its three launches cost more than the batch's repeated reads below ~30k: 4k
  // shared x 8 forks 1.03 / 0.89, 32k x 2 1.12 / 1.02, 32k x 4 1.76 / 1.75, 32k x 8 2.91 / 2.68
  // (the batch reads the shared pages at L2 speed when its forks' blocks run together). In the
  // server's graphed decode steps the launches cost less: 8 agents on one 4096-token prompt
  // (base-lr) finished in 1.02 s with it at any size against 1.10 s with this threshold at 48k,
  // 3 agents 0.96 s either way (H200, serve-concurrency.py --shared-prompt).
  int64_t shared_prefix_min_keys_ = kSharedPrefixMinKeys;
  // run_shared_prefix's rows that read the very same keys (same_keys; an ICaRus step's two rows)
  // go through one agents-mode launch from this many keys on (LRAGENT_CUDA_SAME_KEYS_MIN_KEYS;
  // 0: off, such rows run as a decode batch or a shared prefix as before).
  int64_t same_keys_min_keys_ = 1;
  bool pass_open_ = false;                         // between begin_pass and end_pass
  std::vector<const void*> prefix_memo_key_;       // shared_prefix_keys' last question in this pass
  int64_t prefix_memo_keys_ = 0;                   // ... and its answer
  static constexpr int64_t kSharedPrefixMinKeys = 16384;
  bool materialize_k_ = true;               // prefill's K-side LoRA term materialised (LRAGENT_CUDA_MATERIALIZE_K=0: off)
  bool fuse_rope_attention_ = true;         // pending_rope_attn_ (LRAGENT_CUDA_FUSE_ROPE_ATTENTION=0: off)
  static constexpr size_t kArenaMin = 64u << 20;   // activations of one recorded pass
  // ids [rows] (device) -> out (host), after running a recorded pass: the caller reads them now.
  void read_ids(const int32_t* ids, int64_t rows, int32_t* out);
  // Records/launches the pick of every row of logits [rows, vocab] into ids (device [rows]):
  // argmax when params is empty, else the sampling kernels with their workspace ws [ws_bytes].
  void launch_picks(const TensorView& logits, std::span<const RowSampling> params, int32_t* ids, void* ws,
                    size_t ws_bytes);

  // ---- op dispatch: run now, or append to the tape while a pass is recorded
  // Signature values of the op about to be launched (only while recording).
  template <class... T>
  void rec(const char* op, const T&... v) {
    if (tape_->recording()) tape_->sig(static_cast<const void*>(op), v...);
  }
  template <class F>
  void launch(const char* name, F&& f) {
    if (pending_norm_) flush_norm();               // q and k, which no held op below touches (see operands_of)
    if (pending_rope_attn_) flush_rope_store();    // held first: older than the two below
    if (!pending_expand_.empty()) flush_expand();  // this op may read what they write
    if (pending_rope_) flush_rope();               // ... or what the RoPE writes
    launch_now(name, std::forward<F>(f));
  }
  // launch without launching the held-back ops first.
  template <class F>
  void launch_now(const char* name, F&& f) {
    if (failed_) return;  // an earlier op failed: its outputs are garbage, run nothing more
    if (!inject_fault_.empty() && inject_fault_ == name && --inject_count_ == 0) {  // tests of the error path
      inject_fault_.clear();
      fail(fmt::format("injected fault in op '{}' (LRAGENT_CUDA_INJECT_FAULT)", name));
      return;
    }
    if (!inject_run_.empty() && inject_run_ == name) {  // tests: fail when it runs
      // As a launch the GPU refuses: the error code alone, which the pass's error must name the
      // op of (flush_tape, split_pass).
      dispatch(name, [this, g = std::forward<F>(f)]() mutable -> cudaError_t {
        if (!inject_run_.empty() && --inject_run_count_ == 0) {
          inject_run_.clear();
          return cudaErrorInvalidValue;
        }
        return g();
      });
      return;
    }
    dispatch(name, std::forward<F>(f));
  }
  template <class F>
  void dispatch(const char* name, F&& f) {
    if (tape_->recording()) {
      tape_->push(name, std::forward<F>(f));
      if (rec_prof_) rec_prof_tick(name);
      if (split_armed_ && static_cast<int64_t>(tape_->size()) >= split_ops_) split_pass();
      return;
    }
    lc::OpProfiler::Scope pr(prof_, name, stream_);
    if (const cudaError_t e = f(); e != cudaSuccess) fail(fmt::format("op '{}': {}", name, cudaGetErrorString(e)));
  }
  // The decode-sized LoRA expands `jobs` onto rows of a [n, heads, hd] as a kernel takes them by
  // token (RopeLora: rope_pair_lora, qk_rms_norm); false when they cannot be (then rl is partial).
  bool row_lora(const TensorView& a, std::span<const LoraExpandJob> jobs, lc::RopeLora& rl) const;
  // rope_pair, with the LoRA terms of a's tokens when lora is given (rope_pair_lora).
  void rope_pair_impl(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq,
                      const lc::RopeLora* lora);
  void convert(const void* src, lc::Elem st, int64_t lds, void* dst, lc::Elem dt, int64_t ldd, int64_t rows,
               int64_t cols);
  // Runs the recorded pass: its host arrays go up in one copy, then the tape (graph or eager).
  void flush_tape();
  // Memory for one recorded pass: bump-allocated from the arena (the same addresses every time
  // the same pass is recorded), else a plain allocation that makes the pass ungraphable.
  void* pass_alloc(size_t bytes);
  // Context length the kernels of a recorded pass are sized for: rounded up to a quarter of its
  // power of two (>= 256), so consecutive decode steps share one graph; the true length is read
  // on the device.
  static int64_t ctx_bucket(int64_t n) {
    int64_t p2 = 256;
    while (p2 < n) p2 <<= 1;
    const int64_t step = std::max<int64_t>(256, p2 / 4);
    return (n + step - 1) / step * step;
  }
  int64_t sized_ctx(int64_t n) const { return tape_->recording() ? ctx_bucket(n) : n; }

  CudaBackend() = default;

  // ---- bf16 shadow of the last normalised / SwiGLU activation (bf16 mode): the next GEMMs read
  // it instead of converting the f32 matrix again (q, k, v share one; gate and up share one).
  struct Shadow {
    const void* f32 = nullptr;
    int64_t rows = 0, cols = 0;
    void* bf16 = nullptr;
  };
  void* make_shadow(const TensorView& y, int64_t rows, int64_t cols);
  // x [n, in] f32 as bf16 [n, in] for a tensor-core operand (the GEMMs; the decode GEMV past
  // kGemvMaxRows rows): the shadow the producing op left when it covers x, else converted into
  // scratch slot 0. Null (the backend failed) when out of memory.
  const void* bf16_rows(const TensorView& x, DType to);
  // An op is about to write [p, p + bytes): a shadow of that memory is stale from here on.
  void wrote(const void* p, size_t bytes) {
    if (!p) return;
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (Shadow* sh : {&shadow_, &q_shadow_}) {
      if (!sh->f32) continue;
      const auto s0 = reinterpret_cast<uintptr_t>(sh->f32);
      const uintptr_t s1 = s0 + static_cast<uintptr_t>(sh->rows * std::max<int64_t>(sh->cols, 1)) * 4;
      if (a < s1 && s0 < a + bytes) *sh = {};
    }
  }

  // Ops have no error channel (the CPU's cannot fail): the first failure is kept for
  // take_error() and the ops after it are skipped (launch() runs nothing while failed_).
  void fail(ErrorCode code, const std::string& what) {
    if (failed_) return;
    failed_ = true;
    error_ = make_error(code, "CUDA backend (cuda:{}): {}", device_, what);
  }
  void fail(const std::string& what) { fail(ErrorCode::kInternal, what); }
  void check(cudaError_t e) {
    if (e != cudaSuccess) fail(cudaGetErrorString(e));
  }

  void* raw_alloc(size_t bytes);
  // Reusable scratch buffer `slot`, grown on demand (stream order makes reuse safe); null when
  // the device is out of memory.
  void* try_scratch(int slot, size_t bytes);
  void* scratch(int slot, size_t bytes);
  // ---- host arrays passed to ops (host_args.h): the recorded pass's region while recording,
  // else the eager ring; `padded` zero-fills to a bucket's size (recorded passes only).
  const void* dev_bytes(const void* host, size_t bytes, size_t padded = 0);
  const int32_t* dev_ints(const int32_t* host, int64_t n) {
    return static_cast<const int32_t*>(dev_bytes(host, static_cast<size_t>(n) * 4));
  }
  const float* dev_floats(const float* host, int64_t n) {
    return static_cast<const float*>(dev_bytes(host, static_cast<size_t>(n) * 4));
  }
  // A device view of a paged cache layer holding `n_tokens` tokens.
  lc::PagedDev paged(const PagedView& v, int64_t n_tokens);
  // The block table of a cache holding n_tokens, padded to the bucket while recording.
  const int32_t* dev_table(const PagedView& v, int64_t n_tokens);
  lc::LowRankDev low_rank(const LowRankTerm& t, int64_t n_tokens);

  // ---- tuned attention (attention.cuh): bf16 caches, head_dim 64/128, the shapes it supports
  static bool pow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }
  static bool lr_fast_ok(const LowRankTerm& t);
  bool fast_attention_ok(const AttentionParams& p) const;

  // table: a device copy of v.table already made (K's, which V shares), else null to upload one.
  lc::DevPagedView dev_view(const PagedView& v, int64_t n_tokens, const int32_t* table = nullptr);

  void run_fast_attention(const AttentionParams& p);
  // A prefill chunk's K-side LoRA term, materialised: K_full (and V's copy) into a dense buffer,
  // `a` then reading them with no K term (see the .cpp). Leaves `a` alone where it does not apply.
  // Returns the buffer when the caller frees it after the attention's launch (eager passes; a
  // recorded pass's comes from its arena), else null.
  void* materialize_k_full(const AttentionParams& p, lc::AttnParams& a);
  // a.workspace for the split count `kernel` picks: the pass's arena when recording, else the
  // backend's attention workspace, grown as needed (none when out of memory: the launch runs unsplit).
  void set_attn_workspace(lc::AttnParams& a, lc::AttnKernel kernel);
  // A launch's fields that come from p and the backend: heads, head_dim, scale, stream, split
  // counters, and each active LoRA term's B, rank and scale (its rows' view, b_seq and the rest
  // are the caller's).
  lc::AttnParams attn_params_for(const AttentionParams& p) const;
  // q [elems] f32 as bf16 for the tuned kernels: the bf16 copy rope_pair made when it covers q
  // (q_shadow_), else converted into scratch.
  const lc::bf16* q_bf16(const float* q, int64_t elems);
  // Whether ps[k] can join a decode batch led by ps[0] (attention_batch): one query, the fast
  // kernels' layouts, the same shapes, K and V ranks/scales (and RoPE frequencies with a K term),
  // q and out rows following ps[0]'s.
  bool decode_batchable(const AttentionParams& first, const AttentionParams& p, size_t k) const;
  // ps (>= 2 decode_batchable rows) as one launch of v4's decode kernel: each sequence's block
  // tables rebased onto one base address per cache, its B from a per-sequence array. False when
  // that cannot be (addresses too far apart, v4 would not run): nothing was launched.
  bool run_decode_batch(std::span<const AttentionParams> ps);
  // The launch parameters of such a batch over each sequence's keys from `skip` on (a shared
  // prefix's pass covers those before), with lse_out as given; the tables staged, the workspace
  // not yet set. nullopt where v4 would not run or the tables cannot be rebased.
  // per > 1: every `per` consecutive rows read the same keys (same_keys) and are one sequence of
  // v4's agents mode, each row an agent with its own B (the tables, lengths and K-term positions
  // of each group's first row).
  std::optional<lc::AttnParams> decode_batch_params(std::span<const AttentionParams> ps, int64_t skip, float* lse,
                                                    int per = 1);
  // A run of decode rows in groups of equal size, each group reading the very same keys (several
  // sequences' ICaRus rows: each one's base-model row and decoder row over its own cache): one
  // agents-mode launch, a group a sequence, so each cache is read once for its group's rows.
  // False (nothing launched) when the run is not such groups (one group is run_shared_prefix's).
  bool run_same_key_groups(std::span<const AttentionParams> ps);
  // Keys [0, n) that every sequence of ps (decode_batchable rows) reads from the same blocks (K,
  // V and the LR rows of the V and K terms), whole pages of every cache, leaving each sequence at
  // least one key of its own; 0 when they differ.
  // Within a pass the block tables do not change (bindings reserve before it), and every layer
  // asks for the same sequences: the answer is kept for the pass, keyed by the tables and lengths.
  int64_t shared_prefix_keys(std::span<const AttentionParams> ps);
  // A run of decode rows whose first keys are the same blocks (shared_prefix_keys) as a
  // shared-prefix attention: v4's agents mode over the shared keys (each sequence's B_v and B_k by
  // b_seq; more forks than one agents-mode sequence takes, lc::kAgentsMaxRows query rows a kv
  // head, go in groups of about equal size, each group a sequence of the one launch over the same
  // pages, so the later groups read them from L2) and the decode batch over each one's own keys
  // (their K term's RoPE positions from k_pos0 on), both with their log-sum-exps, then
  // attention_merge into the outputs. Rows that read the very same keys (same_keys) take the
  // agents-mode launch alone, straight into the outputs. False (nothing launched) when nothing is
  // shared, too few keys are shared to pay for the two extra launches, or v4 takes neither shape.
  bool run_shared_prefix(std::span<const AttentionParams> ps);
  // Every sequence of ps (decode_batchable rows) has the same length and reads all its keys from
  // the same blocks of the same caches (K, V, the LR rows of the V and K terms), the last
  // partial page too: an ICaRus step's base-model row and decoder row over one cache.
  bool same_keys(std::span<const AttentionParams> ps) const;
  // ---- cuBLASLt (lt_gemm.h)
  // y[n, out] (ld ldy, f32) = alpha · x[n, in] (ld ldx, w's type) · w[out, in]^T + beta · y.
  // Column-major view: Y^T[out, n] = W (k=in x m=out, op T) x X^T (in x n).
  void gemm(const TensorView& w, const void* x, int64_t ldx, void* y, int64_t ldy, int64_t n, int64_t in, int64_t out,
            float alpha, float beta);

  DType dtype_ = DType::kBF16;
  int device_ = 0;
  bool failed_ = false;  // an op failed: later ops are skipped until take_error()
  bool device_sampling_ = true;  // non-greedy picks on the device (LRAGENT_CUDA_DEVICE_SAMPLING=0: host)
  // The attention kernel version for prefill (CudaBackendOptions::prefill_attention or
  // LRAGENT_CUDA_PREFILL_KERNEL=v5|v6; decode and the shapes a version does not take fall back
  // inside the launcher; docs/cuda.md).
  lragent::cuda::AttnKernel attn_kernel_ = lragent::cuda::AttnKernel::kV6WgmmaWs;
  // LRAGENT_CUDA_INJECT_FAULT=<op>[:N]: the Nth (default 1st) launch of that op fails (tests).
  std::string inject_fault_;
  int64_t inject_count_ = 0;
  // LRAGENT_CUDA_INJECT_FAULT=<op>@run[:N]: the Nth run of that op returns cudaErrorInvalidValue,
  // as a launch the GPU refuses (a capture included).
  std::string inject_run_;
  int64_t inject_run_count_ = 0;
  Status error_;         // the first failure, for take_error()
  std::string gpu_name_;
  int64_t capacity_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::unique_ptr<lc::LtGemm> gemm_;
  std::unique_ptr<lc::HostArgs> args_;
  void* attn_workspace_ = nullptr;
  size_t attn_ws_bytes_ = 0;
  // [kSplitCounters] the v4 decode kernel's split-K counters (attention.cuh), zeroed once here;
  // the kernel leaves them at zero. Null (allocation failed): decode runs the older kernels.
  static constexpr int64_t kSplitCounters = 1 << 14;
  unsigned int* split_counters_ = nullptr;
  std::map<int, Tensor> scratch_;
  Shadow shadow_;
  Shadow q_shadow_;  // bf16 copy of the last rope_pair's first tensor (q): rows = elements, cols = 0
  // Graphs (graph_tape.h): the tape and the recorded pass's activation arena (its host arrays
  // live in args_).
  std::unique_ptr<lc::GraphTape> tape_;
  bool graphs_ = true;
  void* act_arena_ = nullptr;
  size_t act_bytes_ = 0, act_off_ = 0;
  size_t arena_want_ = kArenaMin;
  std::vector<void*> overflow_;       // this pass's allocations beyond the arena
  std::vector<void*> overflow_done_;  // flushed passes' overflow: freed at the next begin_pass
  void retire_overflow();
  bool matmul_only_ = false;  // set_matmul_only_outputs
  static constexpr int64_t kMaxIdsHost = 1 << 16;
  int32_t* g_ids_host_ = nullptr;  // pinned [kMaxIdsHost] ids coming back from argmax_rows / sample_rows
  int64_t host_picks_ = 0;         // GraphStats::host_picks
  int64_t batched_attn_ = 0, batched_attn_seqs_ = 0;  // GraphStats::batched_attention(_seqs)
  int64_t shared_prefix_attn_ = 0, shared_prefix_seqs_ = 0;  // GraphStats::shared_prefix_attention(_seqs)
  int64_t same_keys_attn_ = 0, same_keys_seqs_ = 0;          // GraphStats::same_keys_attention(_seqs)
  int64_t materialized_k_ = 0;                        // GraphStats::materialized_k
  int64_t fused_rope_stores_ = 0;                     // GraphStats::fused_rope_stores
  // Identity block table [pages] (0, 1, 2, ...) of the dense K_full and V copies (materialize_k_full).
  std::vector<int32_t> dense_table_;
  // Decode lookahead (sample_rows_deferred): the latest deferred picks on the device (a fixed
  // buffer, so recorded passes bake its address in), the pinned slots they come back to and an
  // event per slot; the queue of passes whose picks are not taken.
  struct Deferred {
    int slot = -1;                // picks_host_ slot; -1: picked on the host, in `host`
    int64_t rows = 0;
    std::vector<int32_t> host;
  };
  int32_t* fed_ids_dev_ = nullptr;  // [kMaxIdsHost]
  int32_t* picks_host_ = nullptr;   // pinned [kMaxDeferredPicks, kMaxIdsHost]
  cudaEvent_t picks_ev_[kMaxDeferredPicks] = {};
  int next_picks_slot_ = 0;
  std::deque<Deferred> deferred_;
  bool fed_on_device_ = false;      // where the latest deferred picks are: fed_ids_dev_, or fed_host_
  std::vector<int32_t> fed_host_;
  bool deferred_buffers();  // fed_ids_dev_, picks_host_, picks_ev_ on first use
  lc::OpProfiler prof_{std::getenv("LRAGENT_CUDA_PROFILE") != nullptr};
  // LRAGENT_CUDA_PROFILE_RECORD=1: host time of recorded passes by op, printed at exit. Each op
  // is charged the host time since the previous op was recorded (the forward code between them
  // and the op's own recording); "(pass end)" is the last op to the pass's launch.
  bool rec_prof_ = std::getenv("LRAGENT_CUDA_PROFILE_RECORD") != nullptr;
  std::chrono::steady_clock::time_point rec_last_;
  std::map<std::string, std::pair<int64_t, double>> rec_ms_;  // op -> (count, host ms)
  void rec_prof_tick(const char* name) {
    const auto t = std::chrono::steady_clock::now();
    auto& [count, ms] = rec_ms_[name];
    ++count;
    ms += std::chrono::duration<double, std::milli>(t - rec_last_).count();
    rec_last_ = t;
  }
};

}  // namespace lragent::cuda_impl
