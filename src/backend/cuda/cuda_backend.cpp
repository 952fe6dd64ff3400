// The CUDA backend: the Backend interface on one NVIDIA GPU.
//   memory   stream-ordered allocator (cudaMallocAsync on the backend's stream, pool kept
//            cached), so the per-forward activations cost no cudaMalloc/cudaFree syncs;
//   GEMM     cuBLASLt (lt_gemm.h) for prefill-sized products; the decode GEMV (gemv.cu) for <= 8 rows;
//   ops      ops.cu (RMSNorm, RoPE, SwiGLU, embedding, paged stores, ...); the token pick
//            (temperature, top-k, top-p) in sampling.cu;
//   attention  the tuned kernels of attention.cuh for bf16 caches with head_dim 64/128, else
//            the generic kernel of ops.cu (f32 caches, other head dims);
//   host arrays passed to ops (ids, positions, slots, block tables, inv_freq): host_args.h.
//   graphs   passes of at most kGraphMaxRows rows (decode steps) are recorded on a GraphTape and
//            replayed as CUDA graphs (graph_tape.h); --enforce-eager / options.graphs=false
//            turns this off.
// Host C++ (compiled by the host compiler, not nvcc): only launchers from the .cu files.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
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

namespace lragent {
namespace {

namespace lc = lragent::cuda;

// The stream every op and allocation of the (single) CUDA backend is ordered on; Tensor's free
// function is a plain function pointer, so it reaches the stream through this global.
cudaStream_t g_stream = nullptr;

void free_async(void* p) {
  if (p) cudaFreeAsync(p, g_stream);
}

// Tensors handed out from the per-pass activation arena: nothing to free, but the count of live
// ones tells whether the arena may be reset (a tensor kept past its pass would be overwritten).
int64_t g_arena_live = 0;
void arena_release(void*) { --g_arena_live; }

// Appends the fields of the launch structs to a tape signature (field by field: padding bytes
// are indeterminate and must never reach it).
void sig_of(lc::GraphTape& t, const lc::PagedDev& d) {
  t.sig(d.data, d.dtype, d.table, d.page_size, d.row_stride, d.block_stride);
}
void sig_of(lc::GraphTape& t, const lc::LowRankDev& d) {
  sig_of(t, d.lr);
  t.sig(d.b, d.b_dtype, d.rank, d.scale);
}
void sig_of(lc::GraphTape& t, const lc::DevPagedView& d) {
  t.sig(d.data, d.table, d.table_stride, d.page_size, d.row_stride, d.block_stride);
}
void sig_of(lc::GraphTape& t, const lc::DevLowRank& d) {
  sig_of(t, d.lr);
  t.sig(d.b, d.b_agent_stride, d.rank, d.scale);
}
void sig_of(lc::GraphTape& t, const lc::AttnParams& a) {
  t.sig(a.n_heads, a.n_kv_heads, a.head_dim, a.softmax_scale, a.n_seqs, a.q_start, a.ctx_len, a.max_q, a.max_ctx,
        a.agents, a.q, a.inv_freq, a.out, a.out_f32, a.workspace, a.workspace_bytes, a.num_splits);
  sig_of(t, a.k);
  sig_of(t, a.v);
  sig_of(t, a.k_lr);
  sig_of(t, a.v_lr);
}
void sig_of(lc::GraphTape& t, const lc::GenericAttnParams& g) {
  t.sig(g.n_heads, g.n_kv_heads, g.head_dim, g.softmax_scale, g.n_q, g.q, g.q_pos, g.inv_freq, g.out);
  sig_of(t, g.k);
  sig_of(t, g.v);
  sig_of(t, g.k_lr);
  sig_of(t, g.v_lr);
}

lc::Elem elem_of(DType t) {
  switch (t) {
    case DType::kF32: return lc::Elem::kF32;
    case DType::kBF16: return lc::Elem::kBF16;
    case DType::kF16: return lc::Elem::kF16;
    default: assert(false && "CUDA backend ops take f32/bf16/f16 tensors"); return lc::Elem::kF32;
  }
}


int64_t row_stride_of(const TensorView& t) { return t.strides.empty() ? t.dim(1) : t.strides[0]; }

uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> create(const CudaBackendOptions& o) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      return make_error(ErrorCode::kUnsupported, "--device cuda: no usable NVIDIA GPU ({}); use --device cpu",
                        e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    if (o.device < 0 || o.device >= n)
      return make_error(ErrorCode::kInvalidArgument, "--device cuda:{}: this machine has {} GPU(s) (0-{})", o.device,
                        n, n - 1);
    if (o.dtype != DType::kBF16 && o.dtype != DType::kF32)
      return make_error(ErrorCode::kInvalidArgument, "--dtype: the CUDA backend runs bf16 or f32");
    if (g_stream)
      return make_error(ErrorCode::kUnsupported, "only one CUDA backend per process is supported");
    std::unique_ptr<CudaBackend> be(new CudaBackend());
    be->dtype_ = o.dtype;
    be->device_ = o.device;
    const char* env_graphs = std::getenv("LRAGENT_CUDA_GRAPHS");  // "0": eager, as --enforce-eager
    if (const char* f = std::getenv("LRAGENT_CUDA_INJECT_FAULT")) {
      const std::string spec = f;
      const size_t colon = spec.find(':');
      be->inject_fault_ = spec.substr(0, colon);
      be->inject_count_ = colon == std::string::npos ? 1 : std::max<int64_t>(std::atoll(spec.c_str() + colon + 1), 1);
    }
    be->graphs_ = o.graphs && !be->prof_.enabled() && !(env_graphs && std::string(env_graphs) == "0");
    if (cudaSetDevice(o.device) != cudaSuccess || cudaStreamCreateWithFlags(&be->stream_, cudaStreamNonBlocking) != cudaSuccess)
      return make_error(ErrorCode::kUnsupported, "--device cuda:{}: cannot create a CUDA stream", o.device);
    g_stream = be->stream_;
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, o.device);
    uint64_t keep = UINT64_MAX;  // keep freed memory cached in the pool: no release at syncs
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    be->pool_ = pool;
    be->gemm_ = std::make_unique<lc::LtGemm>();
    if (!be->gemm_->init(be->stream_))
      return make_error(ErrorCode::kUnsupported, "cuBLASLt initialisation failed on cuda:{}", o.device);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, o.device);
    be->gpu_name_ = prop.name;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    be->capacity_ = static_cast<int64_t>(total_b);
    be->args_ = std::make_unique<lc::HostArgs>();
    if (const cudaError_t ae = be->args_->init(be->stream_); ae != cudaSuccess)
      return make_error(ErrorCode::kOutOfMemory, "cuda:{}: cannot allocate the argument upload buffers ({})", o.device,
                        cudaGetErrorString(ae));
    if (cudaHostAlloc(reinterpret_cast<void**>(&be->g_ids_host_), kMaxIdsHost * 4, cudaHostAllocDefault) != cudaSuccess)
      return make_error(ErrorCode::kOutOfMemory, "cannot allocate pinned host memory for sampled ids");
    be->tape_ = std::make_unique<lc::GraphTape>(be->stream_);
    return std::unique_ptr<Backend>(std::move(be));
  }

  ~CudaBackend() override {
    if (tape_ && tape_->recording()) end_pass();
    cudaStreamSynchronize(stream_);
    if (tape_ && std::getenv("LRAGENT_CUDA_GRAPH_STATS")) {
      const lc::TapeStats& t = tape_->stats();
      fmt::print(stderr, "CUDA graphs: {} recorded passes: {} replayed, {} captured, {} eager, {} capture failures\n",
                 t.passes, t.replayed, t.captured, t.eager, t.capture_failures);
    }
    tape_.reset();
    if (prof_.enabled()) {
      prof_.flush();
      prof_.print();
    }
    scratch_.clear();
    free_async(attn_workspace_);
    free_async(act_arena_);
    gemm_.reset();  // both free stream-ordered: before the stream goes
    args_.reset();
    cudaStreamSynchronize(stream_);
    if (g_ids_host_) cudaFreeHost(g_ids_host_);
    cudaStreamDestroy(stream_);
    g_stream = nullptr;
  }

  std::string name() const override { return fmt::format("cuda:{} ({}, {})", device_, gpu_name_, dtype_name(dtype_)); }
  Device device() const override { return Device::kCuda; }
  DType weight_dtype() const override { return dtype_; }
  DType cache_dtype() const override { return dtype_; }

  Tensor alloc(DType t, std::vector<int64_t> shape) override {
    TensorView v(t, std::move(shape), nullptr, Device::kCuda);
    if (tape_->recording()) {
      v.data = pass_alloc(v.nbytes());
      if (v.data == nullptr && v.nbytes() > 0) return Tensor();
      wrote(v.data, v.nbytes());  // a reused arena address must not match a stale shadow
      ++g_arena_live;
      return Tensor::adopt(std::move(v), &arena_release);
    }
    v.data = raw_alloc(v.nbytes());
    wrote(v.data, v.nbytes());  // a recycled address must not match a stale shadow
    if (!v.data && v.nbytes() > 0) return Tensor();  // exhausted: callers check data
    return Tensor::adopt(std::move(v), &free_async);
  }

  Tensor upload(const TensorView& host, DType dtype) override {
    assert(host.device == Device::kCpu && "upload takes a host tensor");
    const int64_t rows = host.rank() >= 1 ? host.dim(0) : 1, cols = host.numel() / std::max<int64_t>(rows, 1);
    const int64_t ld = host.rank() == 2 ? row_stride_of(host) : cols;
    Tensor out = alloc(dtype, host.shape);
    if (!out.view().data || rows * cols == 0) return out;
    const size_t esz = dtype_size(host.dtype), row_bytes = static_cast<size_t>(cols) * esz;
    // Raw bytes to the device (packed), then convert there.
    void* raw = host.dtype == dtype ? out.view().data : raw_alloc(static_cast<size_t>(rows) * row_bytes);
    if (!raw) return Tensor();  // no room to stage the conversion: out of memory, as alloc()
    if (ld == cols) {
      check(cudaMemcpyAsync(raw, host.data, static_cast<size_t>(rows) * row_bytes, cudaMemcpyHostToDevice, stream_));
    } else {
      check(cudaMemcpy2DAsync(raw, row_bytes, host.data, static_cast<size_t>(ld) * esz, row_bytes,
                              static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream_));
    }
    if (raw != out.view().data) {
      check(lc::convert_rows(raw, elem_of(host.dtype), cols, out.view().data, elem_of(dtype), cols, rows, cols, stream_));
      free_async(raw);
    }
    // The host buffer may be released (mmap closed) right after: finish before returning.
    check(cudaStreamSynchronize(stream_));
    if (failed_) return Tensor();  // the error waits in take_error()
    return out;
  }

  void fill_random(TensorView& t, uint64_t seed, float stddev) override {
    wrote(t.data, t.nbytes());
    const auto et = elem_of(t.dtype);
    const int64_t n = t.numel();
    void* d = t.data;
    rec("fill_random", d, et, n, seed, stddev);
    launch("fill_random", [=, this] { return lc::fill_random(d, et, n, seed, stddev, stream_); });
  }
  void fill(TensorView& t, float value) override {
    wrote(t.data, t.nbytes());
    const auto et = elem_of(t.dtype);
    const int64_t n = t.numel();
    void* d = t.data;
    rec("fill", d, et, n, value);
    launch("fill", [=, this] { return lc::fill_value(d, et, n, value, stream_); });
  }
  void synchronize() override {
    if (tape_->recording()) flush_tape();
    check(cudaStreamSynchronize(stream_));
    if (prof_.enabled()) prof_.flush();
  }
  Status take_error() override {
    if (!failed_) return Status::Ok();
    Status e = error_;
    // Our own failures (no memory for scratch, a full upload buffer) leave the device usable; a
    // sticky CUDA error (an illegal address) does not, and is reported again on every call.
    const cudaError_t st = cudaStreamSynchronize(stream_);
    if (st == cudaSuccess) {
      (void)cudaGetLastError();
      failed_ = false;
      error_ = Status::Ok();
    }
    return e;
  }

  MemoryStats memory_stats() const override {
    MemoryStats m;
    uint64_t cur = 0, high = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &cur);
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &high);
    m.in_use = static_cast<int64_t>(cur);
    m.peak = static_cast<int64_t>(high);
    m.capacity = capacity_;
    return m;
  }
  void reset_peak_memory() override {
    uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero);
  }

  void begin_pass(int64_t n_rows) override {
    if (tape_->recording()) flush_tape();  // nested or unterminated pass: run what was recorded
    if (failed_) return;  // ops are skipped until take_error(): nothing to record
    if (!graphs_ || n_rows > kGraphMaxRows || n_rows <= 0) return;
    if (g_arena_live != 0) return;  // a previous pass's activation is still alive: no reset
    if (arena_want_ > act_bytes_) {
      // Grow the arena; graphs baked the old addresses in.
      tape_->clear_graphs();
      free_async(act_arena_);
      act_bytes_ = std::max(arena_want_, kArenaMin);
      act_arena_ = raw_alloc(act_bytes_);
      if (!act_arena_) {  // no memory for it: stay eager
        act_bytes_ = 0;
        graphs_ = false;
        return;
      }
    }
    // The previous pass's argument copy must have left the staging buffer before it is rewritten.
    check(args_->begin_pass());
    act_off_ = 0;
    tape_->begin();
  }
  void end_pass() override {
    if (tape_->recording()) flush_tape();
  }
  void set_matmul_only_outputs(bool on) override { matmul_only_ = on; }
  GraphStats graph_stats() const override {
    const lc::TapeStats& t = tape_->stats();
    return {t.passes, t.replayed, t.captured, t.eager};
  }

  void copy(const TensorView& src, TensorView& dst) override {
    assert(src.is_contiguous() && dst.is_contiguous() && src.nbytes() == dst.nbytes() && "copy: shapes differ");
    wrote(dst.data, dst.nbytes());
    void* d = dst.data;
    const void* sp = src.data;
    const size_t bytes = src.nbytes();
    rec("copy", d, sp, bytes);
    launch("copy", [=, this] { return cudaMemcpyAsync(d, sp, bytes, cudaMemcpyDeviceToDevice, stream_); });
  }

  void gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) override {
    const int64_t row_bytes =
        static_cast<int64_t>(src.numel() / std::max<int64_t>(src.dim(0), 1)) * static_cast<int64_t>(dtype_size(src.dtype));
    wrote(dst.data, static_cast<size_t>(n * row_bytes));
    const void* sp = src.data;
    void* d = dst.data;
    const int32_t* r = dev_ints(rows, n);
    rec("gather_rows", sp, row_bytes, r, n, d);
    launch("gather_rows", [=, this] { return lc::gather_rows(sp, row_bytes, r, n, d, stream_); });
  }

  Tensor to_host(const TensorView& src) override {
    if (tape_->recording()) flush_tape();
    Tensor out = Tensor::empty(src.dtype, src.shape);
    if (failed_) {  // nothing valid to copy: zeros, and the error waits in take_error()
      std::memset(out.view().data, 0, out.view().nbytes());
      return out;
    }
    check(cudaMemcpyAsync(out.view().data, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    check(cudaStreamSynchronize(stream_));
    return out;
  }

  void argmax_rows(const TensorView& x, int32_t* out) override {
    assert(x.rank() == 2 && x.dtype == DType::kF32 && "argmax_rows takes f32 [rows, cols]");
    const int64_t rows = x.dim(0), cols = x.dim(1), ldx = row_stride_of(x);
    if (rows == 0) return;
    if (failed_) {  // see to_host
      std::fill(out, out + rows, 0);
      return;
    }
    const float* xd = x.f32();
    auto* ids = rows <= kMaxIdsHost ? static_cast<int32_t*>(try_scratch(4, static_cast<size_t>(rows) * 4)) : nullptr;
    if (!ids) {  // no device memory for the ids (or a huge all-logits pass): pick on the host
      Backend::argmax_rows(x, out);
      return;
    }
    rec("argmax_rows", xd, ldx, rows, cols, ids);
    launch("argmax", [=, this] { return lc::argmax_rows(xd, ldx, rows, cols, ids, stream_); });
    read_ids(ids, rows, out);
  }

  void sample_rows(const TensorView& logits, std::span<const RowSampling> params, int32_t* out) override {
    assert(logits.rank() == 2 && logits.dtype == DType::kF32 && "sample_rows takes f32 [rows, vocab]");
    assert(params.size() == static_cast<size_t>(logits.dim(0)) && "sample_rows takes one RowSampling per row");
    const int64_t rows = logits.dim(0);
    if (rows == 0) return;
    if (failed_) {  // see to_host
      std::fill(out, out + rows, 0);
      return;
    }
    if (std::all_of(params.begin(), params.end(), [](const RowSampling& r) { return !(r.temperature > 0.f); })) {
      argmax_rows(logits, out);  // all greedy: the cheaper kernel, the same ids
      return;
    }
    auto* ids = rows <= kMaxIdsHost ? static_cast<int32_t*>(try_scratch(4, static_cast<size_t>(rows) * 4)) : nullptr;
    if (!ids) {  // as argmax_rows: no device memory for the ids, pick on the host
      Backend::sample_rows(logits, params, out);
      return;
    }
    lc::SampleRowsParams sp;
    sp.logits = logits.f32();
    sp.ld = row_stride_of(logits);
    sp.rows = rows;
    sp.vocab = logits.dim(1);
    // u changes every step: through the upload path (a recorded pass's argument region), never
    // by value into the signature, so a decode step's graph replays with each step's draws.
    sp.params = static_cast<const RowSampling*>(dev_bytes(params.data(), params.size_bytes()));
    sp.out = ids;
    rec("sample_rows", sp.logits, sp.ld, sp.rows, sp.vocab, sp.params, sp.out);
    launch("sample", [=, this] { return lc::sample_rows(sp, stream_); });
    read_ids(ids, rows, out);
  }

  void matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y, float alpha,
              float beta) override {
    assert(x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && "matmul takes 2-D tensors");
    const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
    assert(w.dim(1) == in && y.dim(0) == n && y.dim(1) == out && "matmul shape mismatch");
    assert(x.dtype == DType::kF32 && y.dtype == DType::kF32 && "activations are f32");
    if (n == 0 || out == 0) return;
    const void* xb = x.data;
    int64_t ldx = row_stride_of(x);
    const int64_t ldy = row_stride_of(y);
    wrote(y.data, static_cast<size_t>((n - 1) * ldy + out) * 4);
    if (w.dtype == DType::kBF16 && lc::gemv_bf16_ok(w.data, row_stride_of(w), x.f32(), ldx, n, in)) {
      // Decode-sized: a bandwidth-bound GEMV on the f32 activations beats cuBLASLt's GEMM here.
      const void* wd = w.data;
      const int64_t ldw = row_stride_of(w);
      const float* xd = x.f32();
      float* yd = y.f32();
      rec("gemv", wd, ldw, xd, ldx, yd, ldy, n, in, out, alpha, beta);
      launch("matmul.gemv", [=, this] { return lc::gemv_bf16(wd, ldw, xd, ldx, yd, ldy, n, in, out, alpha, beta, stream_); });
      add_bias_if(bias, y, n, out);
      return;
    }
    if (w.dtype != DType::kF32) {
      // Tensor cores take both operands in the weight's 16-bit type: use the bf16 shadow the
      // producing op left (RMSNorm, SwiGLU) or convert x once into scratch.
      if (w.dtype == DType::kBF16 && shadow_.f32 == x.data && shadow_.rows == n && shadow_.cols == in && ldx == in) {
        xb = shadow_.bf16;
      } else {
        void* xs = scratch(0, static_cast<size_t>(n * in) * 2);
        convert(x.data, lc::Elem::kF32, ldx, xs, elem_of(w.dtype), in, n, in);
        xb = xs;
      }
      ldx = in;
    }
    gemm(w, xb, ldx, y.data, ldy, n, in, out, alpha, beta);
    add_bias_if(bias, y, n, out);
  }

  void matmul_group(const TensorView& x, std::span<const MatmulOut> outs) override {
    // Decode-sized bf16 projections that read the same x: one grouped GEMV launch.
    const int64_t n = x.dim(0), in = x.dim(1);
    const int64_t ldx = row_stride_of(x);
    bool grouped = outs.size() >= 2 && outs.size() <= static_cast<size_t>(lc::kMaxGemvSegs) && n > 0;
    for (const MatmulOut& o : outs)
      grouped = grouped && o.w->dtype == DType::kBF16 && o.w->dim(1) == in &&
                lc::gemv_bf16_ok(o.w->data, row_stride_of(*o.w), x.f32(), ldx, n, in);
    if (!grouped) {
      Backend::matmul_group(x, outs);
      return;
    }
    std::array<lc::GemvSeg, lc::kMaxGemvSegs> segs{};
    const int n_segs = static_cast<int>(outs.size());
    for (int i = 0; i < n_segs; ++i) {
      const MatmulOut& o = outs[static_cast<size_t>(i)];
      const int64_t ldy = row_stride_of(*o.y);
      wrote(o.y->data, static_cast<size_t>((n - 1) * ldy + o.w->dim(0)) * 4);
      lc::GemvSeg& sg = segs[static_cast<size_t>(i)];
      sg = {o.w->data, row_stride_of(*o.w), o.y->f32(), ldy, o.w->dim(0)};
      rec("gemv_seg", sg.w, sg.ldw, sg.y, sg.ldy, sg.out);
    }
    const float* xd = x.f32();
    rec("gemv_group", xd, ldx, n, in, n_segs);
    launch("matmul.gemv", [=, this] { return lc::gemv_bf16_grouped(segs.data(), n_segs, xd, ldx, n, in, 1.f, 0.f, stream_); });
    for (const MatmulOut& o : outs) add_bias_if(o.bias, *o.y, n, o.w->dim(0));
  }

  void add_bias_if(const TensorView* bias, TensorView& y, int64_t n, int64_t out) {
    if (!bias) return;
    assert(bias->dtype == DType::kF32 && "biases are uploaded as f32");
    float* yd = y.f32();
    const int64_t ldy = row_stride_of(y);
    const float* b = bias->f32();
    rec("add_bias", yd, ldy, b, n, out);
    launch("add_bias", [=, this] { return lc::add_bias(yd, ldy, b, n, out, stream_); });
  }

  void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) override {
    const int64_t n = x.dim(0), d = x.dim(1);
    wrote(y.data, static_cast<size_t>((n - 1) * row_stride_of(y) + d) * 4);
    void* y16 = make_shadow(y, n, d);
    const float* xd = x.f32();
    const int64_t ldx = row_stride_of(x), ldy = row_stride_of(y);
    const void* wd = weight.data;
    const auto wt = elem_of(weight.dtype);
    float* yd = matmul_only_ && y16 ? nullptr : y.f32();  // only the GEMMs read it: the bf16 copy does
    rec("rms_norm", xd, ldx, wd, wt, eps, yd, ldy, n, d, y16);
    launch("rms_norm", [=, this] { return lc::rms_norm(xd, ldx, wd, wt, eps, yd, ldy, n, d, y16, stream_); });
  }

  void add_rms_norm(TensorView& h, const TensorView& x, const TensorView& weight, float eps, TensorView& y) override {
    const int64_t n = h.dim(0), d = h.dim(1);
    if (d > 16384 || x.dim(0) != n || x.dim(1) != d) {
      Backend::add_rms_norm(h, x, weight, eps, y);
      return;
    }
    wrote(h.data, static_cast<size_t>((n - 1) * row_stride_of(h) + d) * 4);
    wrote(y.data, static_cast<size_t>((n - 1) * row_stride_of(y) + d) * 4);
    void* y16 = make_shadow(y, n, d);
    float* hd = h.f32();
    const float* xd = x.f32();
    const int64_t ldh = row_stride_of(h), ldx = row_stride_of(x), ldy = row_stride_of(y);
    const void* wd = weight.data;
    const auto wt = elem_of(weight.dtype);
    float* yd = matmul_only_ && y16 ? nullptr : y.f32();
    rec("add_rms_norm", hd, ldh, xd, ldx, wd, wt, eps, yd, ldy, n, d, y16);
    launch("add_rms_norm",
           [=, this] { return lc::add_rms_norm(hd, ldh, xd, ldx, wd, wt, eps, yd, ldy, n, d, y16, stream_); });
  }

  void rope(TensorView& x, const int32_t* positions, const float* inv_freq) override {
    assert(x.rank() == 3 && x.is_contiguous() && "rope takes contiguous [n, heads, head_dim]");
    const int64_t n = x.dim(0);
    const int hd = static_cast<int>(x.dim(2));
    wrote(x.data, x.nbytes());
    float* xd = x.f32();
    const int heads = static_cast<int>(x.dim(1));
    const int32_t* pos = dev_ints(positions, n);
    const float* inv = dev_floats(inv_freq, hd / 2);
    rec("rope", xd, n, heads, hd, pos, inv);
    launch("rope", [=, this] { return lc::rope(xd, n, heads, hd, pos, inv, stream_); });
  }

  void rope_pair(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq) override {
    assert(a.rank() == 3 && b.rank() == 3 && a.is_contiguous() && b.is_contiguous() && a.dim(0) == b.dim(0) &&
           a.dim(2) == b.dim(2) && "rope_pair takes contiguous [n, heads, head_dim] of the same tokens");
    const int64_t n = a.dim(0);
    const int hd = static_cast<int>(a.dim(2));
    wrote(a.data, a.nbytes());
    wrote(b.data, b.nbytes());
    float *xa = a.f32(), *xb = b.f32();
    const int ha = static_cast<int>(a.dim(1)), hb = static_cast<int>(b.dim(1));
    const int32_t* pos = dev_ints(positions, n);
    const float* inv = dev_floats(inv_freq, hd / 2);
    // bf16 caches: the tuned attention takes q in bf16; write that copy here instead of converting
    // q again before attention (q_shadow_, found by address in run_fast_attention).
    void* a16 = nullptr;
    q_shadow_ = {};
    if (dtype_ == DType::kBF16 && (hd == 64 || hd == 128)) {
      a16 = try_scratch(3, static_cast<size_t>(a.numel()) * 2);
      if (a16) q_shadow_ = {a.data, a.numel(), 0, a16};
    }
    rec("rope_pair", xa, ha, xb, hb, n, hd, pos, inv, a16);
    launch("rope", [=, this] { return lc::rope_pair(xa, ha, xb, hb, n, hd, pos, inv, a16, stream_); });
  }

  void silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) override {
    wrote(out.data, out.nbytes());
    void* o16 = out.rank() == 2 && out.is_contiguous() ? make_shadow(out, out.dim(0), out.dim(1)) : nullptr;
    const float *g = gate.f32(), *u = up.f32();
    float* o = matmul_only_ && o16 ? nullptr : out.f32();
    const int64_t n = gate.numel();
    rec("silu_mul", g, u, o, n, o16);
    launch("silu_mul", [=, this] { return lc::silu_mul(g, u, o, n, o16, stream_); });
  }

  void add(TensorView& y, const TensorView& x) override {
    wrote(y.data, y.nbytes());
    float* yd = y.f32();
    const float* xd = x.f32();
    const int64_t n = y.numel();
    rec("add", yd, xd, n);
    launch("add", [=, this] { return lc::add(yd, xd, n, stream_); });
  }

  void embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) override {
    wrote(out.data, out.nbytes());
    const void* t = table.data;
    const auto et = elem_of(table.dtype);
    const int64_t d = table.dim(1);
    const int32_t* di = dev_ints(ids, n);
    float* o = out.f32();
    rec("embedding", t, et, d, di, n, o);
    launch("embedding", [=, this] { return lc::embedding(t, et, d, di, n, o, stream_); });
  }

  void store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) override {
    const StoreJob job{rows, dst, slots};
    store_rows_multi(std::span<const StoreJob>(&job, 1));
  }

  void store_rows_multi(std::span<const StoreJob> jobs) override {
    if (jobs.size() > static_cast<size_t>(lc::kMaxStoreJobs)) {
      Backend::store_rows_multi(jobs);  // one launch per kMaxStoreJobs would do; no caller has more
      return;
    }
    std::array<lc::StoreJobDev, lc::kMaxStoreJobs> dj{};
    int nj = 0;
    for (const StoreJob& j : jobs) {
      const int64_t n = j.rows.dim(0), width = j.rows.numel() / std::max<int64_t>(n, 1);
      if (n == 0) continue;
      int64_t max_slot = 0;
      for (int64_t i = 0; i < n; ++i) max_slot = std::max<int64_t>(max_slot, j.slots[i]);
      lc::StoreJobDev& d = dj[static_cast<size_t>(nj++)];
      d.rows = j.rows.f32();
      d.n = n;
      d.width = width;
      d.dst = paged(j.dst, max_slot + 1);
      d.slots = dev_ints(j.slots, n);
      if (tape_->recording()) {
        rec("store_job", d.rows, d.n, d.width, d.slots);
        sig_of(*tape_, d.dst);
      }
    }
    if (nj == 0) return;
    rec("store_rows_multi", nj);
    launch("store_rows", [=, this] { return lc::store_rows_multi(dj.data(), nj, stream_); });
  }

  void attention(const AttentionParams& p) override {
    if (p.n_q == 0) return;
    wrote(p.out, static_cast<size_t>(p.n_q) * p.n_heads * p.head_dim * 4);
    if (fast_attention_ok(p)) {
      run_fast_attention(p);
      return;
    }
    lc::GenericAttnParams g;
    g.n_heads = p.n_heads;
    g.n_kv_heads = p.n_kv_heads;
    g.head_dim = p.head_dim;
    g.softmax_scale = p.softmax_scale;
    g.n_q = p.n_q;
    g.q = p.q;
    g.q_pos = dev_ints(p.q_pos, p.n_q);
    g.k = paged(p.k, p.n_ctx);
    g.v = paged(p.v, p.n_ctx);
    g.k_lr = low_rank(p.k_lr, p.n_ctx);
    g.v_lr = low_rank(p.v_lr, p.n_ctx);
    g.inv_freq = p.k_lr.active() ? dev_floats(p.inv_freq, p.head_dim / 2) : nullptr;
    g.out = p.out;
    if (tape_->recording()) {
      rec("attention_generic");
      sig_of(*tape_, g);
    }
    launch("attention", [=, this] { return lc::attention_generic(g, stream_); });
  }

 private:
  // Graphs: passes of at most this many rows are recorded (decode steps, agent batches).
  static constexpr int64_t kGraphMaxRows = lc::kGemvMaxRows;
  static constexpr size_t kArenaMin = 64u << 20;   // activations of one recorded pass

  // ids [rows] (device) -> out (host), after running a recorded pass: the caller reads them now.
  void read_ids(const int32_t* ids, int64_t rows, int32_t* out) {
    if (tape_->recording()) flush_tape();
    if (failed_) {  // see to_host
      std::fill(out, out + rows, 0);
      return;
    }
    check(cudaMemcpyAsync(g_ids_host_, ids, static_cast<size_t>(rows) * 4, cudaMemcpyDeviceToHost, stream_));
    check(cudaStreamSynchronize(stream_));
    std::memcpy(out, g_ids_host_, static_cast<size_t>(rows) * 4);
  }

  // ---- op dispatch: run now, or append to the tape while a pass is recorded
  // Signature values of the op about to be launched (only while recording).
  template <class... T>
  void rec(const char* op, const T&... v) {
    if (tape_->recording()) tape_->sig(static_cast<const void*>(op), v...);
  }
  template <class F>
  void launch(const char* name, F&& f) {
    if (failed_) return;  // an earlier op failed: its outputs are garbage, run nothing more
    if (!inject_fault_.empty() && inject_fault_ == name && --inject_count_ == 0) {  // tests of the error path
      inject_fault_.clear();
      fail(fmt::format("injected fault in op '{}' (LRAGENT_CUDA_INJECT_FAULT)", name));
      return;
    }
    if (tape_->recording()) {
      tape_->push(std::forward<F>(f));
      return;
    }
    lc::OpProfiler::Scope pr(prof_, name, stream_);
    check(f());
  }
  void convert(const void* src, lc::Elem st, int64_t lds, void* dst, lc::Elem dt, int64_t ldd, int64_t rows,
               int64_t cols) {
    rec("convert", src, st, lds, dst, dt, ldd, rows, cols);
    launch("convert", [=, this] { return lc::convert_rows(src, st, lds, dst, dt, ldd, rows, cols, stream_); });
  }

  // Runs the recorded pass: its host arrays go up in one copy, then the tape (graph or eager).
  void flush_tape() {
    if (failed_) {  // an op of the pass failed while it was recorded: run none of it
      tape_->discard();
      for (void* p : overflow_) free_async(p);
      overflow_.clear();
      return;
    }
    check(args_->flush_pass());
    const cudaError_t e = tape_->run();
    if (e != cudaSuccess) fail(fmt::format("recorded pass: {}", cudaGetErrorString(e)));
    for (void* p : overflow_) free_async(p);  // stream-ordered after the ops that used them
    overflow_.clear();
  }
  // Memory for one recorded pass: bump-allocated from the arena (the same addresses every time
  // the same pass is recorded), else a plain allocation that makes the pass ungraphable.
  void* pass_alloc(size_t bytes) {
    const size_t need = (bytes + 255) / 256 * 256;
    if (need == 0) return nullptr;
    if (act_arena_ && act_off_ + need <= act_bytes_) {
      void* p = static_cast<char*>(act_arena_) + act_off_;
      act_off_ += need;
      return p;
    }
    arena_want_ = std::max(arena_want_, (act_off_ + need) * 2);
    tape_->mark_not_graphable();
    void* p = raw_alloc(bytes);
    if (p) overflow_.push_back(p);  // freed after the pass ran
    return p;
  }
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
  void* make_shadow(const TensorView& y, int64_t rows, int64_t cols) {
    shadow_ = {};
    if (dtype_ != DType::kBF16 || row_stride_of(y) != cols || rows <= lc::kGemvMaxRows) return nullptr;
    // Optional: without memory for it the GEMMs convert instead.
    void* b = try_scratch(2, static_cast<size_t>(rows * cols) * 2);
    if (b) shadow_ = {y.data, rows, cols, b};
    return b;
  }
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

  void* raw_alloc(size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, stream_) != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      return nullptr;
    }
    return p;
  }

  // Reusable scratch buffer `slot`, grown on demand (stream order makes reuse safe); null when
  // the device is out of memory.
  void* try_scratch(int slot, size_t bytes) {
    if (tape_->recording()) return pass_alloc(bytes);
    auto& s = scratch_[slot];
    if (s.view().nbytes() < bytes) {
      s = Tensor();  // release the old buffer first: it may be what makes room
      s = alloc(DType::kU8, {static_cast<int64_t>(bytes)});
    }
    return s.view().data;
  }
  void* scratch(int slot, size_t bytes) {
    void* p = try_scratch(slot, bytes);
    if (!p) fail(ErrorCode::kOutOfMemory, fmt::format("out of device memory for {} bytes of scratch", bytes));
    return p;
  }

  // ---- host arrays passed to ops (host_args.h): the recorded pass's region while recording,
  // else the eager ring; `padded` zero-fills to a bucket's size (recorded passes only).
  const void* dev_bytes(const void* host, size_t bytes, size_t padded = 0) {
    if (tape_->recording()) {
      if (const void* d = args_->recorded(host, bytes, padded)) return d;
      tape_->mark_not_graphable();  // the pass's argument region is full: upload through the ring
    }
    const void* d = args_->eager(host, bytes, padded);
    if (!d)
      fail(ErrorCode::kOutOfMemory,
           fmt::format("cannot upload an op argument of {} bytes to the device", std::max(bytes, padded)));
    return d;
  }
  const int32_t* dev_ints(const int32_t* host, int64_t n) {
    return static_cast<const int32_t*>(dev_bytes(host, static_cast<size_t>(n) * 4));
  }
  const float* dev_floats(const float* host, int64_t n) {
    return static_cast<const float*>(dev_bytes(host, static_cast<size_t>(n) * 4));
  }

  // A device view of a paged cache layer holding `n_tokens` tokens.
  lc::PagedDev paged(const PagedView& v, int64_t n_tokens) {
    lc::PagedDev d;
    d.data = v.data;
    d.dtype = elem_of(v.dtype);
    d.page_size = v.page_size;
    d.row_stride = v.row_stride;
    d.block_stride = v.block_step();
    d.table = dev_table(v, n_tokens);
    return d;
  }
  // The block table of a cache holding n_tokens, padded to the bucket while recording.
  const int32_t* dev_table(const PagedView& v, int64_t n_tokens) {
    const int64_t pages = (n_tokens + v.page_size - 1) / v.page_size;
    const int64_t padded = (sized_ctx(n_tokens) + v.page_size - 1) / v.page_size;
    return static_cast<const int32_t*>(
        dev_bytes(v.table, static_cast<size_t>(pages) * 4, static_cast<size_t>(padded) * 4));
  }
  lc::LowRankDev low_rank(const LowRankTerm& t, int64_t n_tokens) {
    lc::LowRankDev d;
    if (!t.active()) return d;
    d.lr = paged(t.lr, n_tokens);
    d.b = t.b;
    d.b_dtype = elem_of(t.b_dtype);
    d.rank = t.rank;
    d.scale = t.scale;
    return d;
  }

  // ---- tuned attention (attention.cuh): bf16 caches, head_dim 64/128, the shapes it supports
  static bool pow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }
  static bool lr_fast_ok(const LowRankTerm& t) {
    return !t.active() || (t.b_dtype == DType::kBF16 && t.lr.dtype == DType::kBF16 && t.rank <= 64 && t.rank % 4 == 0 &&
                           t.lr.row_stride % 4 == 0 && t.lr.block_step() % 4 == 0 && pow2(t.lr.page_size));
  }
  bool fast_attention_ok(const AttentionParams& p) const {
    if (p.k.dtype != DType::kBF16 || p.v.dtype != DType::kBF16) return false;
    if (p.head_dim != 64 && p.head_dim != 128) return false;
    if (!pow2(p.k.page_size) || !pow2(p.v.page_size) || p.k.row_stride % 8 || p.v.row_stride % 8 ||
        p.k.block_step() % 8 || p.v.block_step() % 8)
      return false;
    if (!lr_fast_ok(p.k_lr) || !lr_fast_ok(p.v_lr)) return false;
    // The kernels place query i at n_ctx - n_q + i (a causal chunk at the end of the context).
    for (int i = 0; i < p.n_q; ++i)
      if (p.q_pos[i] != p.n_ctx - p.n_q + i) return false;
    return true;
  }

  lc::DevPagedView dev_view(const PagedView& v, int64_t n_tokens) {
    lc::DevPagedView d;
    d.data = static_cast<const lc::bf16*>(v.data);
    d.table = dev_table(v, n_tokens);
    d.table_stride = 0;
    d.page_size = v.page_size;
    d.row_stride = v.row_stride;
    d.block_stride = v.block_step();
    return d;
  }

  void run_fast_attention(const AttentionParams& p) {
    const int64_t q_elems = static_cast<int64_t>(p.n_q) * p.n_heads * p.head_dim;
    lc::bf16* qb = nullptr;
    const auto q0 = reinterpret_cast<uintptr_t>(q_shadow_.f32), qp = reinterpret_cast<uintptr_t>(p.q);
    if (q_shadow_.f32 && qp >= q0 && (qp - q0) % 4 == 0 &&
        static_cast<int64_t>((qp - q0) / 4) + q_elems <= q_shadow_.rows) {
      qb = static_cast<lc::bf16*>(q_shadow_.bf16) + (qp - q0) / 4;  // rope_pair wrote it
    } else {
      qb = static_cast<lc::bf16*>(scratch(1, static_cast<size_t>(q_elems) * 2));
      convert(p.q, lc::Elem::kF32, q_elems, qb, lc::Elem::kBF16, q_elems, 1, q_elems);
    }
    const int32_t meta[3] = {0, p.n_q, p.n_ctx};  // q_start[0..1], ctx_len[0]
    const auto* dmeta = dev_ints(meta, 3);
    lc::AttnParams a;
    a.n_heads = p.n_heads;
    a.n_kv_heads = p.n_kv_heads;
    a.head_dim = p.head_dim;
    a.softmax_scale = p.softmax_scale;
    a.n_seqs = 1;
    a.q_start = dmeta;
    a.ctx_len = dmeta + 2;
    a.max_q = p.n_q;
    a.max_ctx = static_cast<int>(sized_ctx(p.n_ctx));  // grid sizing; the kernels read ctx_len
    a.q = qb;
    a.k = dev_view(p.k, p.n_ctx);
    a.v = dev_view(p.v, p.n_ctx);
    for (auto [src, dst] : {std::pair{&p.k_lr, &a.k_lr}, std::pair{&p.v_lr, &a.v_lr}}) {
      if (!src->active()) continue;
      dst->lr = dev_view(src->lr, p.n_ctx);
      dst->b = static_cast<const lc::bf16*>(src->b);
      dst->rank = src->rank;
      dst->scale = src->scale;
    }
    if (p.k_lr.active()) a.inv_freq = dev_floats(p.inv_freq, p.head_dim / 2);
    a.out_f32 = p.out;
    a.stream = stream_;
    // Workspace for the split count the kernel will pick (a prefill chunk runs unsplit; sizing
    // for the maximum splits x queries would ask for gigabytes).
    a.workspace = &attn_ws_bytes_;  // any non-null pointer: "unlimited" for the query below
    a.workspace_bytes = SIZE_MAX;
    const int splits = lc::attention_num_splits(a);
    const size_t ws = splits > 1 ? lc::attention_workspace_bytes(a, splits) : 0;
    if (tape_->recording()) {
      a.workspace = ws > 0 ? pass_alloc(ws) : nullptr;
      a.workspace_bytes = a.workspace ? ws : 0;
      rec("attention");
      sig_of(*tape_, a);
      launch("attention", [a] { return lc::attention(a); });
      return;
    }
    if (ws > attn_ws_bytes_) {
      free_async(attn_workspace_);
      attn_workspace_ = raw_alloc(ws);
      attn_ws_bytes_ = attn_workspace_ ? ws : 0;  // out of memory: run unsplit rather than fail
    }
    a.workspace = ws > 0 && attn_ws_bytes_ >= ws ? attn_workspace_ : nullptr;
    a.workspace_bytes = a.workspace ? attn_ws_bytes_ : 0;
    launch("attention", [a] { return lc::attention(a); });
  }

  // ---- cuBLASLt (lt_gemm.h)
  // y[n, out] (ld ldy, f32) = alpha · x[n, in] (ld ldx, w's type) · w[out, in]^T + beta · y.
  // Column-major view: Y^T[out, n] = W (k=in x m=out, op T) x X^T (in x n).
  void gemm(const TensorView& w, const void* x, int64_t ldx, void* y, int64_t ldy, int64_t n, int64_t in, int64_t out,
            float alpha, float beta) {
    const int64_t ldw = row_stride_of(w);
    const uint32_t al = std::min({alignment_of(w.data), alignment_of(x), alignment_of(y)});
    std::string err;
    const lc::LtGemm::Plan* pl = gemm_->plan(w.dtype, n, in, out, ldw, ldx, ldy, al, &err);
    if (!pl) {
      fail(err);
      return;
    }
    const void* wd = w.data;
    rec("gemm", pl, wd, x, y, alpha, beta);
    launch("matmul.gemm", [=, this] {
      const cublasStatus_t st = gemm_->run(pl, alpha, wd, x, beta, y);
      if (st != CUBLAS_STATUS_SUCCESS)
        fail(fmt::format("cublasLtMatmul [{}x{}]·[{}x{}]^T failed (status {})", n, in, out, in, static_cast<int>(st)));
      return cudaSuccess;
    });
  }

  DType dtype_ = DType::kBF16;
  int device_ = 0;
  bool failed_ = false;  // an op failed: later ops are skipped until take_error()
  // LRAGENT_CUDA_INJECT_FAULT=<op>[:N]: the Nth (default 1st) launch of that op fails (tests).
  std::string inject_fault_;
  int64_t inject_count_ = 0;
  Status error_;         // the first failure, for take_error()
  std::string gpu_name_;
  int64_t capacity_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::unique_ptr<lc::LtGemm> gemm_;
  std::unique_ptr<lc::HostArgs> args_;
  void* attn_workspace_ = nullptr;
  size_t attn_ws_bytes_ = 0;
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
  std::vector<void*> overflow_;
  bool matmul_only_ = false;  // set_matmul_only_outputs
  static constexpr int64_t kMaxIdsHost = 1 << 16;
  int32_t* g_ids_host_ = nullptr;  // pinned [kMaxIdsHost] ids coming back from argmax_rows / sample_rows
  lc::OpProfiler prof_{std::getenv("LRAGENT_CUDA_PROFILE") != nullptr};
};

}  // namespace

bool cuda_compiled() { return true; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts) { return CudaBackend::create(opts); }

}  // namespace lragent
