// The backend interface: the handful of ops the model needs, implemented once per device
// (cpu/, cuda/). Model code only talks to this interface. Every op works on TensorViews
// whose memory lives on the backend's device; activations are f32 on every backend. Weights
// may be f32/f16/bf16: the CPU keeps them in their file dtype (mmap), a GPU backend holds
// copies in its weight_dtype(). Caches are in cache_dtype(): f32 on the CPU, bf16 or f32 on CUDA.
// Host arrays passed to ops (ids, positions, slots, block tables, inv_freq) are host memory;
// a GPU backend uploads them (stream-ordered, deduplicated by content).
#pragma once

#include <cassert>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "backend/random.h"
#include "backend/sampling_ref.h"
#include "core/tensor.h"

namespace lragent {

// One layer of a paged cache: token t lives at
//   data + table[t / page_size] * block_stride + (t % page_size) * row_stride
// (block_stride 0 means page_size * row_stride: the layer's blocks are one contiguous
// [n_blocks, page_size, row_stride] slice; a KvArena's blocks hold every layer, so their stride is larger).
struct PagedView {
  void* data = nullptr;            // block 0's rows of this layer, backend memory
  DType dtype = DType::kF32;       // element type of the cache
  const int32_t* table = nullptr;  // [ceil(n_tokens / page_size)] block ids (host)
  int page_size = 1;
  int64_t row_stride = 0;          // elements per token row
  int64_t block_stride = 0;        // elements from block b to block b + 1 (0: page_size * row_stride)
  int64_t block_step() const { return block_stride ? block_stride : static_cast<int64_t>(page_size) * row_stride; }
  int64_t row_offset(int64_t t) const {
    return static_cast<int64_t>(table[t / page_size]) * block_step() + (t % page_size) * row_stride;
  }
  // Host-memory f32 caches only (the CPU backend).
  float* row(int64_t t) const {
    assert(dtype == DType::kF32 && "PagedView::row() reads f32 caches; this one is not");
    return static_cast<float*>(data) + row_offset(t);
  }
};

// Low-rank (LoRA) term that attention adds to the base cache without materialising it:
//   V_j = V_base_j + LR_j · B_eff,  B_eff = scale · B^T   (K likewise, RoPE'd after the expand)
struct LowRankTerm {
  PagedView lr;              // [n_ctx, rank] rows of X·A, K-side pre-RoPE
  const void* b = nullptr;   // [n_kv_heads * head_dim, rank] lora_B of this agent (row-major), backend memory
  int rank = 0;
  float scale = 0.f;         // lora_alpha / r (or / sqrt(r))
  DType b_dtype = DType::kF32;
  bool active() const { return b != nullptr && rank > 0; }
  const float* b_f32() const {
    assert(b_dtype == DType::kF32 && "LowRankTerm::b_f32() on a non-f32 B");
    return static_cast<const float*>(b);
  }
};

struct AttentionParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float softmax_scale = 0.f;   // 1 / sqrt(head_dim)
  int n_q = 0;                 // query tokens of this sequence
  const float* q = nullptr;    // [n_q, n_heads, head_dim], RoPE applied
  const int32_t* q_pos = nullptr;  // [n_q] absolute positions; query i attends keys 0..q_pos[i]
  int n_ctx = 0;               // keys/values available (>= max(q_pos) + 1)
  PagedView k, v;              // [n_ctx, n_kv_heads, head_dim]; K RoPE'd
  LowRankTerm k_lr, v_lr;      // optional adapter terms (see LowRankTerm)
  const float* inv_freq = nullptr;  // [head_dim / 2], needed when k_lr is active (deferred RoPE)
  float* out = nullptr;        // [n_q, n_heads, head_dim]
};

// How a backend ran its recorded passes (begin_pass): CUDA graphs for decode steps.
struct GraphStats {
  int64_t recorded = 0;  // passes recorded
  int64_t replayed = 0;  // ... launched as a cached graph
  int64_t captured = 0;  // ... captured into a new graph
  int64_t eager = 0;     // ... run op by op (first sight of a shape, or not capturable)
  int64_t updated = 0;   // ... captured into a cached graph of the same shape (new addresses)
  double record_host_ms = 0;  // host time spent recording those passes (the forward code itself)
  // Token picks (rows) a GPU backend made on the host from copied logits instead of on the
  // device: LRAGENT_CUDA_DEVICE_SAMPLING=0, or a fallback (no device memory for the ids).
  int64_t host_picks = 0;
  // Captures discarded (an op failed or did something a capture forbids): that shape then runs
  // op by op.
  int64_t capture_failures = 0;
  // Attention launches that served several sequences at once (attention_batch), and those sequences.
  int64_t batched_attention = 0, batched_attention_seqs = 0;
  // Prefill attentions whose K-side LoRA term was materialised (K_full written once, then plain
  // attention) instead of rebuilt per tile inside the kernel.
  int64_t materialized_k = 0;
  // Decode passes' RoPE launched together with the layer's K/V stores (one kernel for two).
  int64_t fused_rope_stores = 0;
  // Passes run in two segments (the GPU starting on the first ops while the rest is recorded);
  // replayed / captured / eager / updated count each segment.
  int64_t segments = 0;
  // Store launches of decode passes that computed LoRA expands (a private cache's v_full) instead
  // of reading them from a launch of their own.
  int64_t fused_lora_stores = 0;
  // Decode attentions that did their pass's RoPE and K/V stores themselves (no rope_store launch
  // before them: a batch-1 step's layers on bf16 caches).
  int64_t fused_rope_attention = 0;
  // Qwen3 q/k norms of decode passes done by the kernel after them (the decode attention or the
  // RoPE-and-stores launch) instead of a launch of their own.
  int64_t fused_qk_norms = 0;
  // Decode rows of attention_batch whose sequences share their first keys (the same blocks at the
  // start of every block table: forks of one trajectory) served by one pass over those keys for
  // all of them, then each sequence's own keys, merged (shared-prefix attention); and the rows.
  int64_t shared_prefix_attention = 0, shared_prefix_seqs = 0;
  // Decode rows of attention_batch that read the very same keys (an ICaRus step's base-model row
  // and decoder row over one cache) served by one pass over them, nothing to merge; and the rows.
  int64_t same_keys_attention = 0, same_keys_seqs = 0;
};

// Device memory in use by a backend (0 on the CPU, where the OS accounts for it).
struct MemoryStats {
  int64_t in_use = 0;    // bytes allocated now
  int64_t peak = 0;      // most bytes allocated at once since creation or reset_peak()
  int64_t capacity = 0;  // device memory size
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // The dtype a non-CPU backend keeps weights in (LlamaModel uploads them so); caches' dtype.
  virtual DType weight_dtype() const { return DType::kF32; }
  virtual DType cache_dtype() const { return DType::kF32; }

  // A copy of a host tensor (any float dtype, rows may be strided) in this backend's memory,
  // contiguous and converted to `dtype` (f32/bf16/f16).
  virtual Tensor upload(const TensorView& host, DType dtype) = 0;
  // Fills t (f32/bf16, backend memory, contiguous) with normal(0, stddev) numbers that depend only
  // on (seed, element index): every backend produces the same values (synthetic weights on device).
  virtual void fill_random(TensorView& t, uint64_t seed, float stddev) = 0;
  // Fills t (f32/bf16, contiguous) with `value`.
  virtual void fill(TensorView& t, float value) = 0;
  // Waits for queued work (timing); a no-op on the CPU.
  virtual void synchronize() {}
  // The first error an op met since the last call, then clears it. Ops return nothing (the CPU's
  // cannot fail), so a GPU backend records its first failure (a failed launch or copy, out of
  // device memory for scratch, a cuBLASLt error), skips the ops after it (their outputs are then
  // unspecified) and reports it here; LlamaModel checks after every forward pass and returns it.
  // After a sticky CUDA error (an illegal address) the device stays unusable: every later call
  // reports the error again, and the process lives on to say so.
  virtual Status take_error() { return Status::Ok(); }
  virtual MemoryStats memory_stats() const { return {}; }
  virtual void reset_peak_memory() {}

  // Bracket one forward pass over `n_rows` token rows of `n_seqs` sequences (LlamaModel::forward
  // does; use PassScope; n_seqs 0: not said). A GPU backend may record the ops of a small pass (a
  // decode step: a row a sequence) and launch them as one CUDA graph when the pass ends or its
  // results are read (to_host, synchronize); results are the same as op by op. Tensors allocated
  // inside a pass must not outlive it.
  virtual void begin_pass(int64_t n_rows, int64_t n_seqs = 0) { (void)n_rows, (void)n_seqs; }
  virtual void end_pass() {}
  virtual GraphStats graph_stats() const { return {}; }
  // While on: the outputs of rms_norm / add_rms_norm (y) and silu_mul (out) are read by nothing but
  // the x operand of matmul / matmul_group, and rope_pair's rotated `a` (q) by nothing but
  // attention's q, before they are overwritten (a forward pass without LoRA terms or hooks). A
  // backend that feeds its GEMMs a bf16 copy may then skip the f32 values; one whose attention
  // rotates q itself may leave q unrotated.
  virtual void set_matmul_only_outputs(bool on) { (void)on; }

  // An uninitialised tensor in this backend's memory.
  virtual Tensor alloc(DType t, Dims shape) = 0;
  // dst = src: same element count, both contiguous and in this backend's memory.
  virtual void copy(const TensorView& src, TensorView& dst) = 0;
  // dst[i, :] = src[rows[i], :] for i < n; `rows` is a host array.
  virtual void gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) = 0;
  // A host copy of a tensor in this backend's memory.
  virtual Tensor to_host(const TensorView& src) = 0;
  // out[r] (host) = the index of the largest value of row r of x [rows, cols] (f32, this backend's
  // memory); ties go to the lowest index, NaNs are never picked (as Sampler::argmax). Greedy
  // sampling on the device: only rows ints come back instead of the logits.
  virtual void argmax_rows(const TensorView& x, int32_t* out);
  // out[r] (host) = sample_row(row r of logits, params[r]) (backend/sampling_ref.h: temperature,
  // top-k, top-p, the pick by params[r].u); logits [rows, vocab] f32 in this backend's memory,
  // params.size() == rows. Sampling on the device: only rows ints come back. By default the
  // logits are copied to the host and the reference runs there (the CPU backend's way).
  virtual void sample_rows(const TensorView& logits, std::span<const RowSampling> params, int32_t* out);
  // Decode lookahead (LlamaModel::launch_sample): a pass's picks may stay on the backend while the
  // host records and launches the next pass, whose input tokens are read from them on the device
  // (embedding_fed); the host's work for step t+1 then overlaps the device's step t.
  //   sample_rows_deferred: sample_rows, its ids queued instead of returned (at most
  //     kMaxDeferredPicks passes queued);
  //   take_picks: the oldest queued ids (rows of them), waiting for them;
  //   embedding_fed: embedding, row i's id being picks[feed[i]] of the latest sample_rows_deferred
  //     (taken or not) when feed[i] >= 0, else ids[i].
  // The defaults pick at once, on the host's copy of the logits (the CPU backend's way).
  static constexpr size_t kMaxDeferredPicks = 2;
  virtual void sample_rows_deferred(const TensorView& logits, std::span<const RowSampling> params);
  virtual void take_picks(int32_t* out, int64_t rows);
  virtual void embedding_fed(const TensorView& table, const int32_t* ids, const int32_t* feed, int n,
                             TensorView& out);
 protected:
  // embedding_fed with the latest deferred picks on the host: row i's id is picks[feed[i]] when
  // feed[i] >= 0, else ids[i]; then embedding (the default's way, and a GPU backend's when it
  // picked on the host).
  void embedding_from_host_picks(const TensorView& table, const int32_t* ids, const int32_t* feed, int n,
                                 const std::vector<int32_t>& picks, TensorView& out);

 public:

  // y[n, out] = alpha · x[n, in] · w[out, in]^T + beta · y (+ bias[out] when given).
  // w may be f32/f16/bf16 and may be strided along rows (a slice of a larger matrix).
  virtual void matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y,
                      float alpha = 1.f, float beta = 0.f) = 0;
  // One output of matmul_group: y = x · w^T (+ bias).
  struct MatmulOut {
    const TensorView* w = nullptr;
    const TensorView* bias = nullptr;  // may be null
    TensorView* y = nullptr;
  };
  // Several matmuls that read the same x (q/k/v, gate/up projections), alpha 1, beta 0. A backend
  // may run them as one kernel (the CUDA decode GEMV does); by default they run one by one.
  virtual void matmul_group(const TensorView& x, std::span<const MatmulOut> outs) {
    for (const MatmulOut& o : outs) matmul(x, *o.w, o.bias, *o.y);
  }
  // One LoRA expand of lora_expand: y = (base or y) + scale · xa · b^T, over the job's rows.
  //   xa [rows, r] f32 (x·A of those rows; no data: no LoRA term, the job is a copy of base)
  //   b  [out, r] in the weight dtype (PEFT's lora_B)
  //   y  [rows, out] f32; base [rows, out] f32 or no data (then y accumulates in place)
  struct LoraExpandJob {
    TensorView xa;
    TensorView b;
    float scale = 0.f;
    TensorView y;
    TensorView base;
  };
  // Every job of one projection stage (q/k/v for each adapter in the batch, say). A backend may
  // run them in one kernel (the CUDA backend does for decode-sized jobs); by default copy + matmul
  // per job. Jobs must not write overlapping rows.
  virtual void lora_expand(std::span<const LoraExpandJob> jobs) {
    for (const LoraExpandJob& j : jobs) {
      TensorView y = j.y;
      if (j.base.data) copy(j.base, y);
      if (j.xa.data) matmul(j.xa, j.b, nullptr, y, j.scale, 1.f);
    }
  }
  // y[n, d] = x / rms(x) · weight[d]
  virtual void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) = 0;
  // In place, each head of x [n, heads, head_dim] (contiguous): x = x / rms(x) · weight[head_dim]
  // (Qwen3's q_norm and k_norm). Unlike rms_norm's output, x is read by more than GEMMs (RoPE,
  // the cache stores, attention), so set_matmul_only_outputs does not apply.
  virtual void head_rms_norm(TensorView& x, const TensorView& weight, float eps) {
    assert(x.rank() == 3 && x.is_contiguous() && "head_rms_norm takes contiguous [n, heads, head_dim]");
    TensorView rows = x;
    rows.shape = {x.dim(0) * x.dim(1), x.dim(2)};
    rows.strides.clear();
    rms_norm(rows, weight, eps, rows);
  }
  // Qwen3's q and k norms of one layer, both in place: q [n, hq, hd] first gets the LoRA expands
  // q_lora (jobs writing rows of q in place, as rope_pair_lora takes them), then q_w per head;
  // k [n, hk, hd] gets k_w per head. One op so that a backend can run it as one launch, the
  // decode step's q expand included.
  virtual void qk_rms_norm(TensorView& q, const TensorView& q_w, TensorView& k, const TensorView& k_w, float eps,
                           std::span<const LoraExpandJob> q_lora) {
    if (!q_lora.empty()) lora_expand(q_lora);
    head_rms_norm(q, q_w, eps);
    head_rms_norm(k, k_w, eps);
  }
  // h += x, then y = h / rms(h) · weight (the residual add and the next norm; y may alias x).
  virtual void add_rms_norm(TensorView& h, const TensorView& x, const TensorView& weight, float eps, TensorView& y) {
    add(h, x);
    rms_norm(h, weight, eps, y);
  }
  // In-place rotate-half RoPE on x[n, n_heads, head_dim] with positions[n] and inv_freq[head_dim/2].
  virtual void rope(TensorView& x, const int32_t* positions, const float* inv_freq) = 0;
  // rope on two tensors of the same tokens (q and k); a backend may do both in one kernel.
  virtual void rope_pair(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq) {
    rope(a, positions, inv_freq);
    rope(b, positions, inv_freq);
  }
  // rope_pair after the LoRA expands `a_lora` into a (in place: jobs without base, writing rows of
  // a viewed as [n, heads·head_dim]). A backend may add those terms inside its RoPE kernel (the
  // CUDA backend does for decode-sized passes: a decode step's q expand needs no launch then).
  virtual void rope_pair_lora(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq,
                              std::span<const LoraExpandJob> a_lora) {
    if (!a_lora.empty()) lora_expand(a_lora);
    rope_pair(a, b, positions, inv_freq);
  }
  // out[n, d] = silu(gate) * up
  virtual void silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) = 0;
  // The MLP's first half: gate[n, inter] = silu(x · w_gate^T) * (x · w_up^T). `up` [n, inter] is
  // scratch (its contents afterwards are unspecified). A backend may compute it in one kernel
  // without writing the two projections (the CUDA decode GEMV does); by default: matmul_group,
  // then silu_mul.
  virtual void matmul_swiglu(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                             TensorView& up) {
    const MatmulOut outs[] = {{&w_gate, nullptr, &gate}, {&w_up, nullptr, &up}};
    matmul_group(x, outs);
    silu_mul(gate, up, gate);
  }
  // RMSNorm folded into the products that read it: whether rms_norm_matmul_group and
  // rms_norm_matmul_swiglu compute from h directly, never writing the normed rows, for passes of
  // `rows` rows (the CUDA decode GEMVs do: an 8B decode step then runs no norm kernel). A model
  // uses the two only when this holds; it then adds the residual inside the o and down
  // projections (matmul's beta = 1) instead of add_rms_norm.
  virtual bool folds_rms_norm(int64_t rows) const {
    (void)rows;
    return false;
  }
  // outs = (h / rms(h) · norm_w) · w^T (matmul_group of the normed rows). By default rms_norm into
  // the scratch xn [rows, d], then matmul_group; xn's contents afterwards are unspecified.
  virtual void rms_norm_matmul_group(const TensorView& h, const TensorView& norm_w, float eps, TensorView& xn,
                                     std::span<const MatmulOut> outs) {
    rms_norm(h, norm_w, eps, xn);
    matmul_group(xn, outs);
  }
  // matmul_swiglu of the normed rows of h (xn and up: scratch, as above).
  virtual void rms_norm_matmul_swiglu(const TensorView& h, const TensorView& norm_w, float eps, TensorView& xn,
                                      const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                                      TensorView& up) {
    rms_norm(h, norm_w, eps, xn);
    matmul_swiglu(xn, w_gate, w_up, gate, up);
  }
  // y += x (same shape)
  virtual void add(TensorView& y, const TensorView& x) = 0;
  // out[n, d] = table[ids[n], :] (table in any float dtype)
  virtual void embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) = 0;
  // Writes rows[i] into the paged cache at token slot slots[i].
  virtual void store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) = 0;
  // Several store_rows at once (a layer's K and V, base and LR rows); a backend may run them as one
  // kernel. The views and slot arrays must stay valid for the call only.
  struct StoreJob {
    TensorView rows;
    PagedView dst;
    const int32_t* slots = nullptr;
  };
  virtual void store_rows_multi(std::span<const StoreJob> jobs) {
    for (const StoreJob& j : jobs) store_rows(j.rows, j.dst, j.slots);
  }
  // Between these, a backend may hold the stores back and run them together at the end (one
  // launch for the stores of every sequence of a pass); the rows and their slots are read when
  // store_rows(_multi) is called, so the callers' arrays need not outlive that call. Nothing may
  // read those caches before end_store_batch().
  virtual void begin_store_batch() {}
  virtual void end_store_batch() {}
  // Causal attention of one sequence over its paged cache (see AttentionParams).
  virtual void attention(const AttentionParams& p) = 0;
  // The attention of every sequence of a pass (each its own caches and adapter); a backend may
  // run several as one launch (the CUDA backend: decode rows of sequences in different
  // trajectories and agents). The same results as attention() on each, up to summation order.
  virtual void attention_batch(std::span<const AttentionParams> ps) {
    for (const AttentionParams& p : ps) attention(p);
  }

 private:
  std::deque<std::vector<int32_t>> deferred_picks_;  // the default lookahead's queue, oldest first
  std::vector<int32_t> latest_picks_;                 // the default's latest deferred ids (embedding_fed)
};

// begin_pass / end_pass for a scope, also on early returns.
class PassScope {
 public:
  PassScope(Backend& be, int64_t n_rows, int64_t n_seqs = 0) : be_(be) { be_.begin_pass(n_rows, n_seqs); }
  ~PassScope() { be_.end_pass(); }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

 private:
  Backend& be_;
};

// The CPU backend with `n_threads` threads (0: all cores). fold_norms: folds_rms_norm holds for
// every pass, so a model runs the pass structure of the CUDA decode path (norms through
// rms_norm_matmul_*, residual adds inside the o and down projections) with this backend's default
// implementations: the CPU reference for that structure in tests.
std::unique_ptr<Backend> make_cpu_backend(int n_threads = 0, bool fold_norms = false);

struct CudaBackendOptions {
  int device = 0;
  DType dtype = DType::kBF16;  // weights and caches: kBF16 (fast path) or kF32 (bit-faithful to the CPU)
  bool graphs = true;          // CUDA graphs for decode-sized passes (false: --enforce-eager)
  // Attention kernel version for prefill: 6 (the default, warp-specialised) or 5 (docs/cuda.md).
  // The environment variable LRAGENT_CUDA_PREFILL_KERNEL=v5|v6, when set, wins.
  int prefill_attention = 6;
};
// The CUDA backend; an error naming the cause when this build has no CUDA or no GPU is usable.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts);
// Whether this binary was built with -DLRAGENT_CUDA=ON.
bool cuda_compiled();


}  // namespace lragent
