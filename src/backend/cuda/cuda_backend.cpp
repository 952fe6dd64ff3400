// The CUDA backend: creation, device memory, passes and CUDA graphs, host transfers, the
// token pick (greedy or sampled). The class and its helpers: cuda_backend_impl.h.
#include "backend/cuda/cuda_backend_impl.h"

namespace lragent::cuda_impl {

Result<std::unique_ptr<Backend>> CudaBackend::create(const CudaBackendOptions& o) {
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
  int prefill_version = o.prefill_attention;
  if (const char* k = std::getenv("LRAGENT_CUDA_PREFILL_KERNEL"); k && *k) {
    const std::string v = k;
    if (v != "v5" && v != "v6")
      return make_error(ErrorCode::kInvalidArgument, "LRAGENT_CUDA_PREFILL_KERNEL={}: expected v6 (the default) or v5", v);
    prefill_version = v[1] - '0';
  }
  if (prefill_version != 5 && prefill_version != 6)
    return make_error(ErrorCode::kInvalidArgument, "prefill attention kernel v{}: expected 5 or 6", prefill_version);
  const auto prefill_kernel =
      prefill_version == 6 ? lragent::cuda::AttnKernel::kV6WgmmaWs : lragent::cuda::AttnKernel::kV5Wgmma;
  if (g_stream)
    return make_error(ErrorCode::kUnsupported, "only one CUDA backend per process is supported");
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->dtype_ = o.dtype;
  be->device_ = o.device;
  const char* env_graphs = std::getenv("LRAGENT_CUDA_GRAPHS");  // "0": eager, as --enforce-eager
  const char* env_sampling = std::getenv("LRAGENT_CUDA_DEVICE_SAMPLING");  // "0": pick on the host
  be->device_sampling_ = !(env_sampling && std::string(env_sampling) == "0");
  be->attn_kernel_ = prefill_kernel;
  if (const char* b = std::getenv("LRAGENT_CUDA_BATCH_ATTENTION"); b && std::string(b) == "0")
    be->batch_attention_ = false;  // one launch per sequence, as before attention_batch (measuring)
  if (const char* m = std::getenv("LRAGENT_CUDA_SHARED_PREFIX_MIN_KEYS"); m && *m)
    be->shared_prefix_min_keys_ = std::max<int64_t>(std::atoll(m), 0);  // 0: off (measuring; tests: 1)
  if (const char* m = std::getenv("LRAGENT_CUDA_SAME_KEYS_MIN_KEYS"); m && *m)
    be->same_keys_min_keys_ = std::max<int64_t>(std::atoll(m), 0);  // 0: off (measuring)
  if (const char* m = std::getenv("LRAGENT_CUDA_MATERIALIZE_K"); m && std::string(m) == "0")
    be->materialize_k_ = false;  // prefill rebuilds K per tile in the kernel, as before (measuring)
  if (const char* f = std::getenv("LRAGENT_CUDA_FUSE_ROPE_ATTENTION"); f && std::string(f) == "0")
    be->fuse_rope_attention_ = false;  // a rope_store launch before each decode attention (measuring)
  if (const char* f = std::getenv("LRAGENT_CUDA_FUSE_QK_NORM"); f && std::string(f) == "0")
    be->fuse_qk_norm_ = false;  // Qwen3's q/k norm a launch of its own in decode passes (measuring)
  if (const char* g = std::getenv("LRAGENT_CUDA_GRAPH_MAX_ROWS"); g && *g)
    be->graph_max_rows_ = be->graph_max_mixed_rows_ = std::max<int64_t>(std::atoll(g), 0);
  if (const char* g = std::getenv("LRAGENT_CUDA_GRAPH_SPLIT"); g && *g) be->split_ops_ = std::max<int64_t>(std::atoll(g), 0);
  if (const char* g = std::getenv("LRAGENT_CUDA_GRAPH_SPLIT_BUSY"); g && *g) be->split_busy_ = std::atoi(g) != 0;
  if (const char* f = std::getenv("LRAGENT_CUDA_INJECT_FAULT")) {
    const std::string spec = f;
    const size_t colon = spec.find(':');
    std::string op = spec.substr(0, colon);
    const int64_t n = colon == std::string::npos ? 1 : std::max<int64_t>(std::atoll(spec.c_str() + colon + 1), 1);
    // "<op>@run": the Nth time the op runs fails (eagerly, or while a graph of its pass is
    // captured), not the Nth time it is launched or recorded.
    if (op.size() > 4 && op.compare(op.size() - 4, 4, "@run") == 0) {
      be->inject_run_ = op.substr(0, op.size() - 4);
      be->inject_run_count_ = n;
    } else {
      be->inject_fault_ = op;
      be->inject_count_ = n;
    }
  }
  be->graphs_ = o.graphs && !be->prof_.enabled() && !(env_graphs && std::string(env_graphs) == "0");
  if (cudaSetDevice(o.device) != cudaSuccess || cudaStreamCreateWithFlags(&be->stream_, cudaStreamNonBlocking) != cudaSuccess)
    return make_error(ErrorCode::kUnsupported, "--device cuda:{}: cannot create a CUDA stream", o.device);
  g_stream = be->stream_;
  cudaMemPool_t pool = nullptr;
  int pools_supported = 0;
  uint64_t keep = UINT64_MAX;  // keep freed memory cached in the pool: no release at syncs
  if (cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, o.device) != cudaSuccess ||
      !pools_supported || cudaDeviceGetDefaultMemPool(&pool, o.device) != cudaSuccess ||
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
    cudaGetLastError();
    return make_error(ErrorCode::kUnsupported,
                      "cuda:{}: no stream-ordered memory pool (cudaMallocAsync) on this device or driver", o.device);
  }
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
  // Zeroed on our (non-blocking) stream and waited for, so the first decode kernels see zeros.
  if (cudaMalloc(reinterpret_cast<void**>(&be->split_counters_), kSplitCounters * sizeof(unsigned int)) != cudaSuccess ||
      cudaMemsetAsync(be->split_counters_, 0, kSplitCounters * sizeof(unsigned int), be->stream_) != cudaSuccess ||
      cudaStreamSynchronize(be->stream_) != cudaSuccess) {
    cudaFree(be->split_counters_);  // no counters: decode attention runs v1 (slower, same result)
    be->split_counters_ = nullptr;
    cudaGetLastError();
  }
  be->tape_ = std::make_unique<lc::GraphTape>(be->stream_);
  return std::unique_ptr<Backend>(std::move(be));
}

CudaBackend::~CudaBackend() {
  if (tape_ && tape_->recording()) end_pass();
  for (void* p : overflow_done_) free_async(p);
  overflow_done_.clear();
  cudaStreamSynchronize(stream_);
  if (tape_ && std::getenv("LRAGENT_CUDA_GRAPH_STATS")) {
    const lc::TapeStats& t = tape_->stats();
    fmt::print(stderr,
               "CUDA graphs: {} recorded passes ({} run in two segments): {} replayed, {} captured, {} updated, "
               "{} eager, {} capture failures (segments included); {:.1f} ms building graphs; {} attention launches "
               "served {} sequences at once; {} prefill attentions materialised K; {} RoPEs launched with their K/V "
               "stores; {} store launches computed LoRA expands; {} decode attentions did their RoPE and stores; {} q/k "
               "norms were done by the kernel after them; {} shared-prefix attentions served {} sequences; {} "
               "attentions over the same keys served {} sequences\n",
               t.passes, t.segments, t.replayed, t.captured, t.updated, t.eager, t.capture_failures, t.build_ms,
               batched_attn_, batched_attn_seqs_, materialized_k_, fused_rope_stores_, fused_lora_stores_,
               fused_rope_attention_, fused_qk_norms_, shared_prefix_attn_, shared_prefix_seqs_, same_keys_attn_,
               same_keys_seqs_);
  }
  if (rec_prof_ && !rec_ms_.empty()) {
    double total = 0;
    for (const auto& [name, v] : rec_ms_) total += v.second;
    fmt::print(stderr, "host time of recorded passes by op ({:.3f} ms in all):\n", total);
    for (const auto& [name, v] : rec_ms_)
      fmt::print(stderr, "  {:<24} {:>8} ops  {:>9.3f} ms  {:>7.3f} us/op  {:>5.1f}%\n", name, v.first, v.second,
                 v.second * 1e3 / static_cast<double>(v.first), 100.0 * v.second / total);
  }
  tape_.reset();
  if (prof_.enabled()) {
    prof_.flush();
    prof_.print();
  }
  scratch_.clear();
  free_async(attn_workspace_);
  free_async(act_arena_);
  free_async(fed_ids_dev_);
  gemm_.reset();  // both free stream-ordered: before the stream goes
  args_.reset();
  cudaStreamSynchronize(stream_);
  if (g_ids_host_) cudaFreeHost(g_ids_host_);
  if (picks_host_) cudaFreeHost(picks_host_);

  for (cudaEvent_t e : picks_ev_)
    if (e) cudaEventDestroy(e);
  if (split_counters_) cudaFree(split_counters_);
  cudaStreamDestroy(stream_);
  g_stream = nullptr;
}

Tensor CudaBackend::alloc(DType t, Dims shape) {
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

Tensor CudaBackend::upload(const TensorView& host, DType dtype) {
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

void CudaBackend::fill_random(TensorView& t, uint64_t seed, float stddev) {
  wrote(t.data, t.nbytes());
  const auto et = elem_of(t.dtype);
  const int64_t n = t.numel();
  void* d = t.data;
  rec("fill_random", d, et, n, seed, stddev);
  launch("fill_random", [=, this] { return lc::fill_random(d, et, n, seed, stddev, stream_); });
}

void CudaBackend::fill(TensorView& t, float value) {
  wrote(t.data, t.nbytes());
  const auto et = elem_of(t.dtype);
  const int64_t n = t.numel();
  void* d = t.data;
  rec("fill", d, et, n, value);
  launch("fill", [=, this] { return lc::fill_value(d, et, n, value, stream_); });
}

void CudaBackend::synchronize() {
  if (tape_->recording()) flush_tape();
  check(cudaStreamSynchronize(stream_));
  if (prof_.enabled()) prof_.flush();
}

Status CudaBackend::take_error() {
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

MemoryStats CudaBackend::memory_stats() const {
  MemoryStats m;
  uint64_t cur = 0, high = 0;
  cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &cur);
  cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &high);
  m.in_use = static_cast<int64_t>(cur);
  m.peak = static_cast<int64_t>(high);
  m.capacity = capacity_;
  return m;
}

void CudaBackend::reset_peak_memory() {
  uint64_t zero = 0;
  cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero);
}

void CudaBackend::begin_pass(int64_t n_rows, int64_t n_seqs) {
  if (tape_->recording()) flush_tape();  // nested or unterminated pass: run what was recorded
  pass_open_ = true;
  prefix_memo_key_.clear();  // the tables may have changed since the last pass
  for (void* p : overflow_done_) free_async(p);  // the previous passes' overflow, read by now (stream order)
  overflow_done_.clear();
  if (failed_) return;  // ops are skipped until take_error(): nothing to record
  if (!graphs_ || n_rows <= 0 || n_rows > (n_rows == n_seqs ? graph_max_rows_ : graph_max_mixed_rows_)) return;
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
  // Split only a pass the GPU waits for: one recorded while the previous still runs (decode
  // lookahead) has its recording hidden already, and a split would add a graph launch.
  split_armed_ = false;
  if (split_ops_ > 0) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaErrorNotReady) cudaGetLastError();  // not an error: the stream is busy
    split_armed_ = q == cudaSuccess || split_busy_;
  }
  tape_->begin();
  if (rec_prof_) rec_last_ = std::chrono::steady_clock::now();
}

void CudaBackend::copy(const TensorView& src, TensorView& dst) {
  assert(src.is_contiguous() && dst.is_contiguous() && src.nbytes() == dst.nbytes() && "copy: shapes differ");
  wrote(dst.data, dst.nbytes());
  void* d = dst.data;
  const void* sp = src.data;
  const size_t bytes = src.nbytes();
  rec("copy", d, sp, bytes);
  launch("copy", [=, this] { return cudaMemcpyAsync(d, sp, bytes, cudaMemcpyDeviceToDevice, stream_); });
}

void CudaBackend::gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) {
  const int64_t row_bytes =
      static_cast<int64_t>(src.numel() / std::max<int64_t>(src.dim(0), 1)) * static_cast<int64_t>(dtype_size(src.dtype));
  wrote(dst.data, static_cast<size_t>(n * row_bytes));
  const void* sp = src.data;
  void* d = dst.data;
  const int32_t* r = dev_ints(rows, n);
  rec("gather_rows", sp, row_bytes, r, n, d);
  launch("gather_rows", [=, this] { return lc::gather_rows(sp, row_bytes, r, n, d, stream_); });
}

Tensor CudaBackend::to_host(const TensorView& src) {
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

void CudaBackend::argmax_rows(const TensorView& x, int32_t* out) {
  assert(x.rank() == 2 && x.dtype == DType::kF32 && "argmax_rows takes f32 [rows, cols]");
  const int64_t rows = x.dim(0);
  if (rows == 0) return;
  // After a failed op, launch() runs nothing and read_ids / to_host hand back zeros.
  auto* ids = rows <= kMaxIdsHost ? static_cast<int32_t*>(try_scratch(4, static_cast<size_t>(rows) * 4)) : nullptr;
  if (!ids) {  // no device memory for the ids (or a huge all-logits pass): pick on the host
    host_picks_ += rows;
    Backend::argmax_rows(x, out);
    return;
  }
  launch_picks(x, {}, ids, nullptr, 0);
  read_ids(ids, rows, out);
}

void CudaBackend::launch_picks(const TensorView& logits, std::span<const RowSampling> params, int32_t* ids, void* ws,
                               size_t ws_bytes) {
  const float* xd = logits.f32();
  const int64_t rows = logits.dim(0), vocab = logits.dim(1), ld = row_stride_of(logits);
  if (params.empty()) {
    rec("argmax_rows", xd, ld, rows, vocab, ids);
    launch("argmax", [=, this] { return lc::argmax_rows(xd, ld, rows, vocab, ids, stream_); });
    return;
  }
  lc::SampleRowsParams sp;
  sp.logits = xd;
  sp.ld = ld;
  sp.rows = rows;
  sp.vocab = vocab;
  sp.workspace = ws;
  sp.workspace_bytes = ws_bytes;
  // u changes every step: through the upload path (a recorded pass's argument region), never
  // by value into the signature, so a decode step's graph replays with each step's draws.
  sp.params = static_cast<const RowSampling*>(dev_bytes(params.data(), params.size_bytes()));
  sp.out = ids;
  rec("sample_rows", sp.logits, sp.ld, sp.rows, sp.vocab, sp.params, sp.out, sp.workspace, sp.workspace_bytes);
  launch("sample", [=, this] { return lc::sample_rows(sp, stream_); });
}

void CudaBackend::sample_rows(const TensorView& logits, std::span<const RowSampling> params, int32_t* out) {
  assert(logits.rank() == 2 && logits.dtype == DType::kF32 && "sample_rows takes f32 [rows, vocab]");
  assert(params.size() == static_cast<size_t>(logits.dim(0)) && "sample_rows takes one RowSampling per row");
  const int64_t rows = logits.dim(0);
  if (rows == 0) return;
  if (std::all_of(params.begin(), params.end(), [](const RowSampling& r) { return !(r.temperature > 0.f); })) {
    argmax_rows(logits, out);  // all greedy: the cheaper kernel, the same ids
    return;
  }
  if (!device_sampling_) {  // LRAGENT_CUDA_DEVICE_SAMPLING=0: logits to the host (to_host runs the pass)
    host_picks_ += rows;
    Backend::sample_rows(logits, params, out);
    return;
  }
  auto* ids = rows <= kMaxIdsHost ? static_cast<int32_t*>(try_scratch(4, static_cast<size_t>(rows) * 4)) : nullptr;
  if (!ids) {  // as argmax_rows: no device memory for the ids, pick on the host
    host_picks_ += rows;
    Backend::sample_rows(logits, params, out);
    return;
  }
  const int64_t vocab = logits.dim(1);
  const size_t ws_bytes = lc::sample_rows_workspace_bytes(rows, vocab);
  void* ws = try_scratch(5, ws_bytes);
  if (!ws) {  // as the ids: no device memory for the kernels' scratch, pick on the host
    host_picks_ += rows;
    Backend::sample_rows(logits, params, out);
    return;
  }
  launch_picks(logits, params, ids, ws, ws_bytes);
  read_ids(ids, rows, out);
}

bool CudaBackend::deferred_buffers() {
  // The deferred picks' device buffer (fixed: recorded passes bake its address in), their pinned
  // host slots and events, made on first use. Without them the picks are made on the host.
  // Each piece is made once: a call after a partial failure makes only what is still missing.
  if (fed_ids_dev_) return true;
  if (!picks_host_ && cudaHostAlloc(reinterpret_cast<void**>(&picks_host_), kMaxDeferredPicks * kMaxIdsHost * 4,
                                    cudaHostAllocDefault) != cudaSuccess) {
    picks_host_ = nullptr;
    cudaGetLastError();
    return false;
  }
  for (cudaEvent_t& e : picks_ev_)
    if (!e && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      e = nullptr;
      cudaGetLastError();
      return false;
    }
  fed_ids_dev_ = static_cast<int32_t*>(raw_alloc(kMaxIdsHost * 4));
  return fed_ids_dev_ != nullptr;
}

void CudaBackend::sample_rows_deferred(const TensorView& logits, std::span<const RowSampling> params) {
  assert(logits.rank() == 2 && logits.dtype == DType::kF32 && "sample_rows_deferred takes f32 [rows, vocab]");
  assert(params.size() == static_cast<size_t>(logits.dim(0)) && "sample_rows_deferred takes one RowSampling per row");
  assert(deferred_.size() < kMaxDeferredPicks && "take_picks before queueing more passes");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  const bool greedy =
      std::all_of(params.begin(), params.end(), [](const RowSampling& r) { return !(r.temperature > 0.f); });
  size_t ws_bytes = 0;
  void* ws = nullptr;
  bool on_device = rows <= kMaxIdsHost && (greedy || device_sampling_) && deferred_buffers();
  if (on_device && !greedy) {
    ws_bytes = lc::sample_rows_workspace_bytes(rows, vocab);
    ws = try_scratch(5, ws_bytes);
    on_device = ws != nullptr;
  }
  if (!on_device) {  // picked now, on the host's copy of the logits (as sample_rows would)
    Deferred d;
    d.rows = rows;
    d.host.resize(static_cast<size_t>(rows));
    sample_rows(logits, params, d.host.data());
    if (failed_) return;  // nothing queued: LlamaModel::launch_sample reports the error, queues nothing
    fed_host_ = d.host;
    fed_on_device_ = false;
    deferred_.push_back(std::move(d));
    return;
  }
  // The picks go to fed_ids_dev_: the next pass's embedding_fed reads them there, on the device.
  int32_t* ids = fed_ids_dev_;
  launch_picks(logits, greedy ? std::span<const RowSampling>() : params, ids, ws, ws_bytes);
  if (tape_->recording()) flush_tape();
  // An op of the pass failed: queue nothing. LlamaModel::launch_sample sees the error in
  // take_error() and queues nothing either, so both queues stay in step.
  if (failed_) return;
  Deferred d;
  d.rows = rows;
  d.slot = next_picks_slot_;
  next_picks_slot_ = (next_picks_slot_ + 1) % static_cast<int>(kMaxDeferredPicks);
  check(cudaMemcpyAsync(picks_host_ + static_cast<int64_t>(d.slot) * kMaxIdsHost, ids, static_cast<size_t>(rows) * 4,
                        cudaMemcpyDeviceToHost, stream_));
  check(cudaEventRecord(picks_ev_[d.slot], stream_));
  if (failed_) return;
  fed_on_device_ = true;
  deferred_.push_back(std::move(d));
}

void CudaBackend::take_picks(int32_t* out, int64_t rows) {
  assert(!deferred_.empty() && deferred_.front().rows == rows && "take_picks: no queued pass of that many rows");
  Deferred d = std::move(deferred_.front());
  deferred_.pop_front();
  if (d.slot < 0) {
    std::copy(d.host.begin(), d.host.end(), out);
    return;
  }
  if (failed_) {  // see to_host
    std::fill(out, out + rows, 0);
    return;
  }
  check(cudaEventSynchronize(picks_ev_[d.slot]));
  std::memcpy(out, picks_host_ + static_cast<int64_t>(d.slot) * kMaxIdsHost, static_cast<size_t>(rows) * 4);
}

void CudaBackend::embedding_fed(const TensorView& table, const int32_t* ids, const int32_t* feed, int n,
                                TensorView& out) {
  if (!fed_on_device_) {  // the latest deferred picks were made on the host
    embedding_from_host_picks(table, ids, feed, n, fed_host_, out);
    return;
  }
  wrote(out.data, out.nbytes());
  const void* t = table.data;
  const auto et = elem_of(table.dtype);
  const int64_t d = table.dim(1);
  const int32_t* di = dev_ints(ids, n);
  const int32_t* df = dev_ints(feed, n);
  const int32_t* picks = fed_ids_dev_;
  float* o = out.f32();
  rec("embedding_fed", t, et, d, di, df, picks, n, o);
  launch("embedding", [=, this] { return lc::embedding_fed(t, et, d, di, df, picks, n, o, stream_); });
}

void CudaBackend::read_ids(const int32_t* ids, int64_t rows, int32_t* out) {
  if (tape_->recording()) flush_tape();
  if (failed_) {  // see to_host
    std::fill(out, out + rows, 0);
    return;
  }
  check(cudaMemcpyAsync(g_ids_host_, ids, static_cast<size_t>(rows) * 4, cudaMemcpyDeviceToHost, stream_));
  check(cudaStreamSynchronize(stream_));
  std::memcpy(out, g_ids_host_, static_cast<size_t>(rows) * 4);
}

void CudaBackend::flush_tape() {
  flush_norm();
  flush_rope_store();
  flush_expand();
  flush_rope();
  if (rec_prof_ && !failed_) rec_prof_tick("(pass end)");
  // Its arguments (positions, slots, block tables) must be up before anything of it runs: else
  // its ops would read the previous pass's and store K/V rows at that pass's slots.
  if (!failed_) check(args_->flush_pass());
  if (failed_) {  // an op of the pass failed while it was recorded, or its upload did: run none of it
    tape_->discard();
    retire_overflow();
    return;
  }
  const cudaError_t e = tape_->run();
  if (e != cudaSuccess) fail(fmt::format("recorded pass: {}", tape_error(e)));
  retire_overflow();
}

void CudaBackend::split_pass() {
  split_armed_ = false;
  // A RoPE, LoRA expands or a rope_store held back for the ops after them stay held: their
  // signatures are in the pass's key already, and they are launched in the next segment.
  if (failed_) return;  // flush_tape drops the rest
  check(args_->flush_pass());
  if (failed_) return;
  const cudaError_t e = tape_->run_segment();
  if (e != cudaSuccess) fail(fmt::format("recorded pass (first segment): {}", tape_error(e)));
}

std::string CudaBackend::tape_error(cudaError_t e) const {
  const char* op = tape_->failed_op();
  if (!op) return cudaGetErrorString(e);  // a graph's launch or replay: no one op to name
  return fmt::format("op '{}' failed when it ran: {}", op, cudaGetErrorString(e));
}

void CudaBackend::retire_overflow() {
  // Not freed yet: the caller may still enqueue reads of the pass's outputs (ids, logits) that
  // live there; they are freed at the next pass's start, stream-ordered after those reads.
  overflow_done_.insert(overflow_done_.end(), overflow_.begin(), overflow_.end());
  overflow_.clear();
}

void* CudaBackend::pass_alloc(size_t bytes) {
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

void* CudaBackend::raw_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (cudaMallocAsync(&p, bytes, stream_) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    return nullptr;
  }
  return p;
}

void* CudaBackend::try_scratch(int slot, size_t bytes) {
  if (tape_->recording()) return pass_alloc(bytes);
  auto& s = scratch_[slot];
  // An unallocated slot is a default Tensor, whose view (a scalar f32) reports 4 bytes: test
  // the data too, or a request of <= 4 bytes (one row's id) got a null buffer.
  if (!s.view().data || s.view().nbytes() < bytes) {
    s = Tensor();  // release the old buffer first: it may be what makes room
    s = alloc(DType::kU8, {static_cast<int64_t>(bytes)});
  }
  return s.view().data;
}

void* CudaBackend::scratch(int slot, size_t bytes) {
  void* p = try_scratch(slot, bytes);
  if (!p) fail(ErrorCode::kOutOfMemory, fmt::format("out of device memory for {} bytes of scratch", bytes));
  return p;
}

const void* CudaBackend::dev_bytes(const void* host, size_t bytes, size_t padded) {
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

}  // namespace lragent::cuda_impl

namespace lragent {

bool cuda_compiled() { return true; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts) {
  return cuda_impl::CudaBackend::create(opts);
}

}  // namespace lragent
