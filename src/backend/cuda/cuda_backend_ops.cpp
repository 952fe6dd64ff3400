// The CUDA backend's dense ops: GEMM (cuBLASLt) and the decode GEMV, norms, RoPE, SwiGLU,
// residual add, embedding; the bf16 shadows the GEMMs read. The class: cuda_backend_impl.h.
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/env_switch.h"

namespace lragent::cuda_impl {

namespace {
using lc::env_switch_on;
// LRAGENT_CUDA_FUSE_LORA=0: the LoRA terms as separate launches (each shrink x·A its own GEMV,
// each expand copy + GEMV, q's expand outside RoPE), the launch structure before the grouped
// LoRA path, for measuring it on the device.
bool fuse_lora() {
  static const bool on = env_switch_on("LRAGENT_CUDA_FUSE_LORA");
  return on;
}
// LRAGENT_CUDA_FUSE_ROPE_STORE=0: a decode pass's RoPE and its K/V stores as two launches.
bool fuse_rope_store() {
  static const bool on = env_switch_on("LRAGENT_CUDA_FUSE_ROPE_STORE");
  return on;
}
// LRAGENT_CUDA_FUSE_LORA_STORE=0: a decode pass's v_full expand launched alone before the stores.
bool fuse_lora_store() {
  static const bool on = env_switch_on("LRAGENT_CUDA_FUSE_LORA_STORE");
  return on;
}
// Byte ranges [p, p + bytes) of device memory.
struct Span {
  uintptr_t b = 0, e = 0;
  bool overlaps(const Span& o) const { return b < o.e && o.b < e; }
};
Span span_of(const void* p, int64_t floats) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  return {b, p ? b + static_cast<uintptr_t>(floats) * 4 : b};
}
// What an expand job writes (y) and reads (base, xa).
Span y_span(const lc::LoraJob& j) { return span_of(j.y, (j.rows - 1) * j.ldy + j.out); }
Span base_span(const lc::LoraJob& j) { return span_of(j.base, j.base ? (j.rows - 1) * j.ldbase + j.out : 0); }
Span xa_span(const lc::LoraJob& j) { return span_of(j.xa, j.xa ? (j.rows - 1) * j.ldxa + j.rank : 0); }
// Whether expand job j touches memory the RoPE r reads or writes (q, k, q's x·A rows).
bool overlaps(const lc::LoraJob& j, const lc::RopeArgs& r) {
  const Span q = span_of(r.xa, r.n * r.ha * r.hd), k = span_of(r.xb, r.n * r.hb * r.hd), y = y_span(j);
  for (const Span& s : {y, base_span(j), xa_span(j)})
    if (s.overlaps(q) || s.overlaps(k)) return true;
  if (r.lora)
    for (int64_t t = 0; t < r.n; ++t)
      if (r.rl.lr[t] && y.overlaps(span_of(r.rl.lr[t], r.rl.rank[t]))) return true;
  return false;
}
}  // namespace

namespace {
// Rows up to which weight products take the GEMV kernels rather than cuBLASLt's GEMM: all that
// they take (lc::gemv_max_rows(), 16). Past one row that is version 3 (tensor cores, gemv_v3_mma.cu).
// Before it the CUDA-core kernels re-read x from L1 for every row and fell behind cuBLASLt, so
// this was 1 (Llama-3.1-8B shapes through `lragent serve`, H200, scripts/serve-concurrency.py: 4
// requests decoding together 1.80 s with those kernels for 2-8 rows against 1.17 s with
// cuBLASLt). With version 3, same script and machine, 128 tokens each: 2 clients 0.70 s against
// 0.78 with cuBLASLt, 4 clients 0.76 against 0.82, 5 clients 0.79-0.80 against 0.87-0.88 and
// 8 clients 0.87-0.88 against 0.91-0.92 (two interleaved rounds), although its wide products
// alone fall behind cuBLASLt's at 8 rows (gate 0.70 and lm_head 0.83 of the copy bandwidth against
// 0.95 and 0.98): its SwiGLU mode saves the SwiGLU kernel and the passes' launches are fewer.
// LRAGENT_GEMV_MAX_ROWS (1..lc::gemv_max_rows(), read once) sets it, for measuring on the device.
int64_t gemv_max_rows() {
  static const int64_t n = [] {
    const char* v = std::getenv("LRAGENT_GEMV_MAX_ROWS");
    const int64_t k = v ? std::atoll(v) : lc::gemv_max_rows();
    return std::clamp<int64_t>(k, 1, lc::gemv_max_rows());
  }();
  return n;
}
bool weight_gemv_ok(const void* w, int64_t ldw, const float* x, int64_t ldx, int64_t rows, int64_t in) {
  return rows <= gemv_max_rows() && lc::gemv_bf16_ok(w, ldw, x, ldx, rows, in);
}
}  // namespace

void CudaBackend::matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y, float alpha,
            float beta) {
  assert(x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && "matmul takes 2-D tensors");
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  assert(w.dim(1) == in && y.dim(0) == n && y.dim(1) == out && "matmul shape mismatch");
  assert(x.dtype == DType::kF32 && y.dtype == DType::kF32 && "activations are f32");
  if (n == 0 || out == 0) return;
  const void* xb = x.data;
  int64_t ldx = row_stride_of(x);
  const int64_t ldy = row_stride_of(y);
  wrote(y.data, static_cast<size_t>((n - 1) * ldy + out) * 4);
  if (w.dtype == DType::kBF16 && weight_gemv_ok(w.data, row_stride_of(w), x.f32(), ldx, n, in)) {
    // Decode-sized: a bandwidth-bound GEMV on the f32 activations beats cuBLASLt's GEMM here
    // (past kGemvMaxRows rows on their bf16 copy).
    const void* x16 = n > lc::kGemvMaxRows ? bf16_rows(x, DType::kBF16) : nullptr;
    if (n > lc::kGemvMaxRows && !x16) return;  // out of memory: failed
    lc::GemvCall c;
    c.w = w.data;
    c.ldw = row_stride_of(w);
    c.x = x.f32();
    c.ldx = ldx;
    c.y = y.f32();
    c.ldy = ldy;
    c.rows = n;
    c.in = in;
    c.out = out;
    c.alpha = alpha;
    c.beta = beta;
    c.x16 = x16;
    c.stream = stream_;
    rec("gemv", c.w, c.ldw, c.x, c.ldx, c.y, c.ldy, n, in, out, alpha, beta, x16);
    launch("matmul.gemv", [c] { return lc::gemv_bf16(c); });
    add_bias_if(bias, y, n, out);
    return;
  }
  if (w.dtype != DType::kF32) {
    // Tensor cores take both operands in the weight's 16-bit type.
    xb = bf16_rows(x, w.dtype);
    if (!xb) return;  // out of memory: failed
    ldx = in;
  }
  gemm(w, xb, ldx, y.data, ldy, n, in, out, alpha, beta);
  add_bias_if(bias, y, n, out);
}

void CudaBackend::matmul_group(const TensorView& x, std::span<const MatmulOut> outs) {
  // Decode-sized bf16 projections that read the same x (q/k/v and the LoRA shrinks x·A beside
  // them): grouped GEMV launches of up to kMaxGemvSegs matrices each.
  const int64_t n = x.dim(0), in = x.dim(1);
  const int64_t ldx = row_stride_of(x);
  bool grouped = outs.size() >= 2 && n > 0;
  for (const MatmulOut& o : outs)
    grouped = grouped && o.w->dtype == DType::kBF16 && o.w->dim(1) == in &&
              weight_gemv_ok(o.w->data, row_stride_of(*o.w), x.f32(), ldx, n, in);
  if (!grouped) {
    Backend::matmul_group(x, outs);
    return;
  }
  if (!fuse_lora()) {  // LoRA shrinks (A: rank rows) as launches of their own
    std::vector<MatmulOut> big;
    for (const MatmulOut& o : outs) {
      if (o.w->dim(0) <= lc::kMaxLoraRank)
        matmul(x, *o.w, o.bias, *o.y, 1.f, 0.f);
      else
        big.push_back(o);
    }
    if (big.size() < outs.size()) {
      if (!big.empty()) matmul_group(x, big);
      return;
    }
  }
  launch_gemv_group(x, outs, nullptr);
}

void CudaBackend::launch_gemv_group(const TensorView& x, std::span<const MatmulOut> outs, const lc::GemvNorm* norm) {
  const int64_t n = x.dim(0), in = x.dim(1);
  const int64_t ldx = row_stride_of(x);
  const float* xd = x.f32();
  const void* x16 = n > lc::kGemvMaxRows ? bf16_rows(x, DType::kBF16) : nullptr;  // version 3's two x tiles
  if (n > lc::kGemvMaxRows && !x16) return;  // out of memory: failed
  const lc::GemvNorm nm = norm ? *norm : lc::GemvNorm{};
  assert(!norm || norm->w);  // gemv_norm_of's: g present (a null g would mean no norm mode)
  for (size_t first = 0; first < outs.size(); first += lc::kMaxGemvSegs) {
    const std::span<const MatmulOut> part = outs.subspan(first, std::min<size_t>(lc::kMaxGemvSegs, outs.size() - first));
    lc::GemvGroupCall c;
    c.n_segs = static_cast<int>(part.size());
    for (int i = 0; i < c.n_segs; ++i) {
      const MatmulOut& o = part[static_cast<size_t>(i)];
      const int64_t ldy = row_stride_of(*o.y);
      wrote(o.y->data, static_cast<size_t>((n - 1) * ldy + o.w->dim(0)) * 4);
      lc::GemvSeg& sg = c.segs[i];
      sg = {o.w->data, row_stride_of(*o.w), o.y->f32(), ldy, o.w->dim(0)};
      rec("gemv_seg", sg.w, sg.ldw, sg.y, sg.ldy, sg.out);
    }
    c.x = xd;
    c.ldx = ldx;
    c.rows = n;
    c.in = in;
    c.norm = nm;
    c.x16 = x16;
    c.stream = stream_;
    rec("gemv_group", xd, ldx, n, in, c.n_segs, nm.w, nm.t, nm.eps, x16);
    launch("matmul.gemv", [c] { return lc::gemv_bf16_grouped(c); });
  }
  for (const MatmulOut& o : outs) add_bias_if(o.bias, *o.y, n, o.w->dim(0));
}

namespace {
// LRAGENT_CUDA_FOLD_NORM=0: decode passes keep their RMSNorm kernels (for measuring the folding).
bool fold_norm_enabled() {
  static const bool on = env_switch_on("LRAGENT_CUDA_FOLD_NORM");
  return on;
}
}  // namespace

bool CudaBackend::folds_rms_norm(int64_t rows) const {
  // Version 3 of the GEMV (2-16 rows) has no norm mode: such passes run the RMSNorm kernels,
  // unless version 2's norm mode takes them (lc::gemv_norm_max_rows).
  return fold_norm_enabled() && dtype_ == DType::kBF16 && rows >= 1 && rows <= gemv_max_rows() &&
         rows <= lc::gemv_norm_max_rows();
}

std::optional<lc::GemvNorm> CudaBackend::gemv_norm_of(const TensorView& h, const TensorView& norm_w, float eps) const {
  if (!folds_rms_norm(h.rank() == 2 ? h.dim(0) : 0) || norm_w.numel() != h.dim(1)) return std::nullopt;
  const lc::GemvNorm nm{norm_w.data, elem_of(norm_w.dtype), eps};
  if (!lc::gemv_norm_ok(nm, h.dim(0), h.dim(1))) return std::nullopt;
  return nm;
}

void CudaBackend::rms_norm_matmul_group(const TensorView& h, const TensorView& norm_w, float eps, TensorView& xn,
                                        std::span<const MatmulOut> outs) {
  const int64_t n = h.dim(0), in = h.dim(1);
  const std::optional<lc::GemvNorm> nm = gemv_norm_of(h, norm_w, eps);
  bool ok = nm.has_value() && !outs.empty();
  for (const MatmulOut& o : outs)
    ok = ok && o.w->dtype == DType::kBF16 && o.w->dim(1) == in && o.y->data != h.data &&
         weight_gemv_ok(o.w->data, row_stride_of(*o.w), h.f32(), row_stride_of(h), n, in);
  if (!ok) {
    Backend::rms_norm_matmul_group(h, norm_w, eps, xn, outs);
    return;
  }
  shadow_ = {};  // no normed rows (nor their bf16 copy) are written
  launch_gemv_group(h, outs, &*nm);
}

void CudaBackend::lora_expand(std::span<const LoraExpandJob> jobs) {
  // Decode-sized jobs (<= kLoraExpandMaxRows rows, rank <= kMaxLoraRank): one kernel per
  // kMaxLoraJobs jobs; anything else (prefill chunks) by copy + cuBLASLt per job.
  bool fused = fuse_lora();
  for (const LoraExpandJob& j : jobs) {
    const int64_t rows = j.y.dim(0);
    fused = fused && rows >= 1 && rows <= lc::kLoraExpandMaxRows && j.y.dtype == DType::kF32 &&
            (!j.base.data || j.base.dtype == DType::kF32) &&
            (!j.xa.data || (j.xa.dtype == DType::kF32 && j.xa.dim(1) <= lc::kMaxLoraRank &&
                            (j.b.dtype == DType::kBF16 || j.b.dtype == DType::kF32)));
  }
  if (!fused) {
    Backend::lora_expand(jobs);
    return;
  }
  // A recorded decode pass holds back a few expands onto a base (v_full): the store batch that
  // follows may compute them (launch_stores).
  bool hold = fuse_lora_store() && tape_->recording() && !failed_ && !jobs.empty() &&
              jobs.size() <= static_cast<size_t>(lc::kMaxStoreLora);
  for (size_t first = 0; first < jobs.size(); first += lc::kMaxLoraJobs) {
    const size_t count = std::min<size_t>(lc::kMaxLoraJobs, jobs.size() - first);
    std::array<lc::LoraJob, lc::kMaxLoraJobs> lj{};
    for (size_t i = 0; i < count; ++i) {
      const LoraExpandJob& j = jobs[first + i];
      assert((!j.xa.data || (j.xa.dim(0) == j.y.dim(0) && j.b.dim(0) == j.y.dim(1) && j.b.dim(1) == j.xa.dim(1))) &&
             "lora_expand: shapes differ");
      assert((!j.base.data || (j.base.dim(0) == j.y.dim(0) && j.base.dim(1) == j.y.dim(1))) &&
             "lora_expand: base and y differ in shape");
      lc::LoraJob& d = lj[i];
      d.xa = j.xa.data ? j.xa.f32() : nullptr;
      d.ldxa = j.xa.data ? row_stride_of(j.xa) : 0;
      d.b = j.xa.data ? j.b.data : nullptr;
      d.ldb = j.xa.data ? row_stride_of(j.b) : 0;
      d.y = j.y.f32();
      d.ldy = row_stride_of(j.y);
      d.base = j.base.data ? j.base.f32() : nullptr;
      d.ldbase = j.base.data ? row_stride_of(j.base) : 0;
      d.out = j.y.dim(1);
      d.rows = static_cast<int32_t>(j.y.dim(0));
      d.rank = j.xa.data ? static_cast<int32_t>(j.xa.dim(1)) : 0;
      d.scale = j.scale;
      d.b_bf16 = j.xa.data && j.b.dtype == DType::kBF16 ? 1 : 0;
      wrote(d.y, static_cast<size_t>((d.rows - 1) * d.ldy + d.out) * 4);
      rec("lora_job", d.xa, d.ldxa, d.b, d.ldb, d.y, d.ldy, d.base, d.ldbase, d.out, d.rows, d.rank, d.scale,
          d.b_bf16);
      hold = hold && d.xa && d.base && d.ldy == d.out && d.rows <= lc::kDecodePassMaxRows;
      hold = hold && !(pending_rope_ && overlaps(d, *pending_rope_));  // see pending_expand_
      hold = hold && !(pending_norm_ && overlaps(d, operands_of(*pending_norm_)));
    }
    const int n_jobs = static_cast<int>(count);
    if (hold) {
      if (!pending_expand_.empty()) flush_expand();
      pending_expand_.assign(lj.begin(), lj.begin() + n_jobs);
      rec("lora_expand_held", n_jobs);
      return;
    }
    rec("lora_expand", n_jobs);
    launch("lora.expand", [=, this] { return lc::lora_expand(lj.data(), n_jobs, stream_); });
  }
}

void CudaBackend::add_bias_if(const TensorView* bias, TensorView& y, int64_t n, int64_t out) {
  if (!bias) return;
  assert(bias->dtype == DType::kF32 && "biases are uploaded as f32");
  float* yd = y.f32();
  const int64_t ldy = row_stride_of(y);
  const float* b = bias->f32();
  rec("add_bias", yd, ldy, b, n, out);
  launch("add_bias", [=, this] { return lc::add_bias(yd, ldy, b, n, out, stream_); });
}

void CudaBackend::head_rms_norm(TensorView& x, const TensorView& weight, float eps) {
  assert(x.rank() == 3 && x.is_contiguous() && x.dtype == DType::kF32 && "head_rms_norm takes contiguous f32 [n, heads, head_dim]");
  // One row per head, normed in place (the kernel reads each value before the same thread writes
  // it); always the f32 rows and no bf16 copy: RoPE, the stores and attention read them.
  const int64_t rows = x.dim(0) * x.dim(1), d = x.dim(2);
  float* xd = x.f32();
  wrote(xd, x.nbytes());
  const void* wd = weight.data;
  const auto wt = elem_of(weight.dtype);
  rec("head_rms_norm", xd, wd, wt, eps, rows, d);
  if (d <= lc::kQkNormMaxHeadDim) {  // a warp per head (qk_rms_norm's kernel, no k rows)
    lc::QkNormArgs a;
    a.q = xd;
    a.wq = wd;
    a.wt = wt;
    a.hq = static_cast<int>(x.dim(1));
    a.hd = static_cast<int>(d);
    a.n = x.dim(0);
    a.eps = eps;
    launch("head_rms_norm", [=, this] { return lc::qk_norm(a, nullptr, stream_); });
    return;
  }
  lc::RmsNormCall c;  // in place: y is h
  c.h = c.y = xd;
  c.ldh = c.ldy = d;
  c.w = wd;
  c.w_t = wt;
  c.eps = eps;
  c.rows = rows;
  c.d = d;
  c.stream = stream_;
  launch("head_rms_norm", [c] { return lc::rms_norm(c); });
}

void CudaBackend::qk_rms_norm(TensorView& q, const TensorView& q_w, TensorView& k, const TensorView& k_w, float eps,
                              std::span<const LoraExpandJob> q_lora) {
  assert(q.rank() == 3 && k.rank() == 3 && q.is_contiguous() && k.is_contiguous() && q.dim(0) == k.dim(0) &&
         q.dim(2) == k.dim(2) && "qk_rms_norm takes contiguous [n, heads, head_dim] of the same tokens");
  if (q.dtype != DType::kF32 || k.dtype != DType::kF32 || q_w.dtype != k_w.dtype || q.dim(2) > lc::kQkNormMaxHeadDim) {
    Backend::qk_rms_norm(q, q_w, k, k_w, eps, q_lora);
    return;
  }
  lc::RopeLora rl{};
  const bool lora = !q_lora.empty() && row_lora(q, q_lora, rl);
  if (!q_lora.empty() && !lora) lora_expand(q_lora);  // a prefill chunk's: expanded first, then one norm launch
  wrote(q.data, q.nbytes());
  wrote(k.data, k.nbytes());
  lc::QkNormArgs a;
  a.q = q.f32();
  a.k = k.f32();
  a.wq = q_w.data;
  a.wk = k_w.data;
  a.wt = elem_of(q_w.dtype);
  a.hq = static_cast<int>(q.dim(1));
  a.hk = static_cast<int>(k.dim(1));
  a.hd = static_cast<int>(q.dim(2));
  a.n = q.dim(0);
  a.eps = eps;
  rec("qk_rms_norm", a.q, a.k, a.wq, a.wk, a.wt, a.hq, a.hk, a.hd, a.n, eps, lora);
  if (lora)
    for (int64_t t = 0; t < a.n; ++t) {
      const auto i = static_cast<size_t>(t);
      rec("qk_norm_lora", rl.lr[i], rl.b[i], rl.ldb[i], rl.rank[i], rl.scale[i], rl.b_bf16[i]);
    }
  // A decode pass's norm: held for the RoPE after it (pending_norm_).
  if (fuse_qk_norm_ && fuse_rope_store() && tape_->recording() && !failed_ && a.n >= 1 && a.n <= lc::kDecodePassMaxRows &&
      (lora || q_lora.empty())) {
    if (pending_norm_) flush_norm();
    HeldNorm h{a, lora, rl};
    if (!pending_expand_.empty() && expand_overlaps(operands_of(h))) flush_expand();
    pending_norm_ = h;
    return;
  }
  launch("qk_rms_norm", [=, this] { return lc::qk_norm(a, lora ? &rl : nullptr, stream_); });
}

lc::RopeArgs CudaBackend::operands_of(const HeldNorm& h) {
  lc::RopeArgs r;
  r.xa = h.a.q;
  r.ha = h.a.hq;
  r.xb = h.a.k;
  r.hb = h.a.hk;
  r.n = h.a.n;
  r.hd = h.a.hd;
  r.lora = h.lora;
  r.rl = h.rl;
  return r;
}

void CudaBackend::launch_qk_norm(const lc::QkNormArgs& a, const lc::RopeLora* lora) {
  const bool has = lora != nullptr;
  const lc::RopeLora rl = has ? *lora : lc::RopeLora{};
  launch_now("qk_rms_norm", [=, this] { return lc::qk_norm(a, has ? &rl : nullptr, stream_); });
}

void CudaBackend::flush_norm() {
  if (!pending_norm_) return;
  const HeldNorm h = *pending_norm_;
  pending_norm_.reset();
  rec("qk_norm_alone");
  launch_qk_norm(h.a, h.lora ? &h.rl : nullptr);
}

void CudaBackend::rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) {
  const int64_t n = x.dim(0), d = x.dim(1);
  wrote(y.data, static_cast<size_t>((n - 1) * row_stride_of(y) + d) * 4);
  void* y16 = make_shadow(y, n, d);
  lc::RmsNormCall c;
  c.h = const_cast<float*>(x.f32());  // only read: rms_norm takes no residual
  c.ldh = row_stride_of(x);
  c.w = weight.data;
  c.w_t = elem_of(weight.dtype);
  c.eps = eps;
  c.y = matmul_only_ && y16 ? nullptr : y.f32();  // only the GEMMs read it: the bf16 copy does
  c.ldy = row_stride_of(y);
  c.y16 = y16;
  c.rows = n;
  c.d = d;
  c.stream = stream_;
  rec("rms_norm", c.h, c.ldh, c.w, c.w_t, eps, c.y, c.ldy, n, d, y16);
  launch("rms_norm", [c] { return lc::rms_norm(c); });
}

void CudaBackend::add_rms_norm(TensorView& h, const TensorView& x, const TensorView& weight, float eps, TensorView& y) {
  const int64_t n = h.dim(0), d = h.dim(1);
  if (d > 16384 || x.dim(0) != n || x.dim(1) != d) {
    Backend::add_rms_norm(h, x, weight, eps, y);
    return;
  }
  wrote(h.data, static_cast<size_t>((n - 1) * row_stride_of(h) + d) * 4);
  wrote(y.data, static_cast<size_t>((n - 1) * row_stride_of(y) + d) * 4);
  void* y16 = make_shadow(y, n, d);
  lc::RmsNormCall c;
  c.h = h.f32();
  c.ldh = row_stride_of(h);
  c.x = x.f32();
  c.ldx = row_stride_of(x);
  c.w = weight.data;
  c.w_t = elem_of(weight.dtype);
  c.eps = eps;
  c.y = matmul_only_ && y16 ? nullptr : y.f32();
  c.ldy = row_stride_of(y);
  c.y16 = y16;
  c.rows = n;
  c.d = d;
  c.stream = stream_;
  rec("add_rms_norm", c.h, c.ldh, c.x, c.ldx, c.w, c.w_t, eps, c.y, c.ldy, n, d, y16);
  launch("add_rms_norm", [c] { return lc::add_rms_norm(c); });
}

void CudaBackend::rope(TensorView& x, const int32_t* positions, const float* inv_freq) {
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

void CudaBackend::rope_pair(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq) {
  rope_pair_impl(a, b, positions, inv_freq, nullptr);
}

bool CudaBackend::row_lora(const TensorView& a, std::span<const LoraExpandJob> a_lora, lc::RopeLora& rl) const {
  const int64_t n = a.dim(0), width = a.dim(1) * a.dim(2);
  bool fused = fuse_lora() && !a_lora.empty() && n >= 1 && n <= lc::kDecodePassMaxRows && a.dtype == DType::kF32;
  rl = {};
  for (const LoraExpandJob& j : a_lora) {
    fused = fused && !j.base.data && j.xa.data && j.xa.dtype == DType::kF32 && j.xa.dim(1) <= lc::kMaxLoraRank &&
            (j.b.dtype == DType::kBF16 || j.b.dtype == DType::kF32) && j.y.dtype == DType::kF32 &&
            j.y.dim(1) == width && row_stride_of(j.y) == width && j.b.dim(0) == width &&
            row_stride_of(j.b) <= INT32_MAX;
    if (!fused) break;
    const auto off = reinterpret_cast<uintptr_t>(j.y.data) - reinterpret_cast<uintptr_t>(a.data);
    const auto row_bytes = static_cast<uintptr_t>(width) * 4;
    fused = reinterpret_cast<uintptr_t>(j.y.data) >= reinterpret_cast<uintptr_t>(a.data) && off % row_bytes == 0 &&
            static_cast<int64_t>(off / row_bytes) + j.y.dim(0) <= n;
    if (!fused) break;
    const auto first = static_cast<int64_t>(off / row_bytes);
    for (int64_t r = 0; r < j.y.dim(0); ++r) {
      const auto t = static_cast<size_t>(first + r);
      rl.lr[t] = j.xa.f32() + r * row_stride_of(j.xa);
      rl.b[t] = j.b.data;
      rl.ldb[t] = static_cast<int32_t>(row_stride_of(j.b));
      rl.rank[t] = static_cast<int32_t>(j.xa.dim(1));
      rl.scale[t] = j.scale;
      rl.b_bf16[t] = j.b.dtype == DType::kBF16 ? 1 : 0;
    }
  }
  return fused;
}

void CudaBackend::rope_pair_lora(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq,
                                 std::span<const LoraExpandJob> a_lora) {
  // Decode-sized: token t's LoRA term goes into the RoPE kernel (RopeLora, by token).
  const int64_t n = a.dim(0);
  lc::RopeLora rl{};
  if (!row_lora(a, a_lora, rl)) {
    Backend::rope_pair_lora(a, b, positions, inv_freq, a_lora);
    return;
  }
  for (int64_t t = 0; t < n; ++t) {
    const auto i = static_cast<size_t>(t);
    rec("rope_lora", rl.lr[i], rl.b[i], rl.ldb[i], rl.rank[i], rl.scale[i], rl.b_bf16[i]);
  }
  rope_pair_impl(a, b, positions, inv_freq, &rl);
}

void CudaBackend::flush_expand() {
  if (pending_expand_.empty()) return;
  std::array<lc::LoraJob, lc::kMaxStoreLora> lj{};
  const int n_jobs = static_cast<int>(pending_expand_.size());
  std::copy(pending_expand_.begin(), pending_expand_.end(), lj.begin());
  pending_expand_.clear();
  rec("lora_expand_alone", n_jobs);
  // Not launch(): a held RoPE stays held (the two touch disjoint memory), for its stores.
  launch_now("lora.expand", [=, this] { return lc::lora_expand(lj.data(), n_jobs, stream_); });
}

bool CudaBackend::expand_overlaps(const lc::RopeArgs& r) const {
  return std::any_of(pending_expand_.begin(), pending_expand_.end(),
                     [&](const lc::LoraJob& j) { return overlaps(j, r); });
}

bool CudaBackend::attach_expands(std::span<lc::StoreJobDev> jobs, lc::StoreLoras& loras) const {
  if (pending_expand_.size() > static_cast<size_t>(lc::kMaxStoreLora)) return false;
  std::array<int, lc::kMaxStoreLora> readers{};
  std::array<int32_t, lc::kMaxStoreJobs> lora{}, writes{};
  for (size_t j = 0; j < jobs.size(); ++j) {
    lora[j] = -1;
    writes[j] = 0;
    const Span rows = span_of(jobs[j].rows, jobs[j].n * jobs[j].width);
    for (size_t x = 0; x < pending_expand_.size(); ++x) {
      const lc::LoraJob& e = pending_expand_[x];
      if (!rows.overlaps(y_span(e))) continue;
      if (jobs[j].rows != e.y || jobs[j].n != e.rows || jobs[j].width != e.out || lora[j] >= 0) return false;
      lora[j] = static_cast<int32_t>(x);
      writes[j] = readers[x]++ == 0 ? 1 : 0;  // the first reader leaves the values in y
    }
  }
  for (size_t x = 0; x < pending_expand_.size(); ++x)
    if (readers[x] == 0) return false;
  for (size_t j = 0; j < jobs.size(); ++j) {
    jobs[j].lora = lora[j];
    jobs[j].lora_writes_y = writes[j];
  }
  loras = {};
  std::copy(pending_expand_.begin(), pending_expand_.end(), loras.job);
  loras.n = static_cast<int>(pending_expand_.size());
  return true;
}

void CudaBackend::flush_rope() {
  if (!pending_rope_) return;
  const lc::RopeArgs r = *pending_rope_;
  pending_rope_.reset();
  rec("rope_alone", r.lora);
  launch_rope(r);
}

void CudaBackend::launch_rope(const lc::RopeArgs& held) {
  lc::RopeArgs r = held;
  if (r.normed) {  // the norm (with q's LoRA term) first: the RoPE kernels rotate only
    launch_qk_norm(r.norm, r.lora ? &r.rl : nullptr);
    r.normed = false;
    r.lora = false;
  }
  launch("rope", [r, s = stream_] { return lc::rope_pair(r, s); });
}

void CudaBackend::rope_pair_impl(TensorView& a, TensorView& b, const int32_t* positions, const float* inv_freq,
                                 const lc::RopeLora* lora) {
  assert(a.rank() == 3 && b.rank() == 3 && a.is_contiguous() && b.is_contiguous() && a.dim(0) == b.dim(0) &&
         a.dim(2) == b.dim(2) && "rope_pair takes contiguous [n, heads, head_dim] of the same tokens");
  wrote(a.data, a.nbytes());
  wrote(b.data, b.nbytes());
  lc::RopeArgs r;
  r.n = a.dim(0);
  r.hd = static_cast<int>(a.dim(2));
  r.xa = a.f32();
  r.xb = b.f32();
  r.ha = static_cast<int>(a.dim(1));
  r.hb = static_cast<int>(b.dim(1));
  r.pos = dev_ints(positions, r.n);
  r.inv_freq = dev_floats(inv_freq, r.hd / 2);
  r.lora = lora != nullptr;
  if (lora) r.rl = *lora;
  if (pending_norm_) {  // the held q/k norm of exactly these rows goes on with the RoPE
    const lc::QkNormArgs& nm = pending_norm_->a;
    if (!lora && nm.q == r.xa && nm.k == r.xb && nm.n == r.n && nm.hq == r.ha && nm.hk == r.hb && nm.hd == r.hd) {
      r.normed = true;
      r.norm = nm;
      r.lora = pending_norm_->lora;  // q's LoRA term, added before the norm
      if (r.lora) r.rl = pending_norm_->rl;
      pending_norm_.reset();
      rec("rope_normed", r.lora);
    } else {
      flush_norm();
    }
  }
  // bf16 caches: the tuned attention takes q in bf16; write that copy here instead of converting
  // q again before attention (q_shadow_, found by address in run_fast_attention).
  q_shadow_ = {};
  if (dtype_ == DType::kBF16 && (r.hd == 64 || r.hd == 128)) {
    r.xa16 = try_scratch(3, static_cast<size_t>(a.numel()) * 2);
    if (r.xa16) q_shadow_ = {a.data, a.numel(), 0, r.xa16};
  }
  rec("rope_pair", r.xa, r.ha, r.xb, r.hb, r.n, r.hd, r.pos, r.inv_freq, r.xa16);
  // A recorded decode pass holds it back for the store batch that follows (launch_stores).
  if (fuse_rope_store() && tape_->recording() && r.n >= 1 && r.n <= lc::kDecodePassMaxRows && r.hb >= 1 &&
      r.hd % 2 == 0 && !failed_) {
    if (!pending_expand_.empty() && expand_overlaps(r)) flush_expand();
    if (pending_rope_) flush_rope();
    pending_rope_ = r;
    return;
  }
  launch_rope(r);
}

void CudaBackend::silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) {
  wrote(out.data, out.nbytes());
  void* o16 = out.rank() == 2 && out.is_contiguous() ? make_shadow(out, out.dim(0), out.dim(1)) : nullptr;
  const float *g = gate.f32(), *u = up.f32();
  float* o = matmul_only_ && o16 ? nullptr : out.f32();
  const int64_t n = gate.numel();
  rec("silu_mul", g, u, o, n, o16);
  launch("silu_mul", [=, this] { return lc::silu_mul(g, u, o, n, o16, stream_); });
}

void CudaBackend::matmul_swiglu(const TensorView& x, const TensorView& w_gate, const TensorView& w_up,
                                TensorView& gate, TensorView& up) {
  if (!gemv_swiglu(x, w_gate, w_up, gate, nullptr)) Backend::matmul_swiglu(x, w_gate, w_up, gate, up);
}

void CudaBackend::rms_norm_matmul_swiglu(const TensorView& h, const TensorView& norm_w, float eps, TensorView& xn,
                                         const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                                         TensorView& up) {
  const std::optional<lc::GemvNorm> nm = gemv_norm_of(h, norm_w, eps);
  if (!nm || !gemv_swiglu(h, w_gate, w_up, gate, &*nm))
    Backend::rms_norm_matmul_swiglu(h, norm_w, eps, xn, w_gate, w_up, gate, up);
}

bool CudaBackend::gemv_swiglu(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, TensorView& gate,
                              const lc::GemvNorm* norm) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w_gate.dim(0);
  const int64_t ldx = row_stride_of(x), ldy = row_stride_of(gate);
  // LRAGENT_CUDA_FUSE_SWIGLU=0: the two-kernel path (for measuring the fusion on the device).
  static const bool fuse = env_switch_on("LRAGENT_CUDA_FUSE_SWIGLU");
  const bool gemv = fuse && n > 0 && w_gate.dtype == DType::kBF16 && w_up.dtype == DType::kBF16 &&
                    w_up.dim(0) == out && w_gate.dim(1) == in && w_up.dim(1) == in && gate.dim(1) == out &&
                    gate.data != x.data &&
                    weight_gemv_ok(w_gate.data, row_stride_of(w_gate), x.f32(), ldx, n, in) &&
                    weight_gemv_ok(w_up.data, row_stride_of(w_up), x.f32(), ldx, n, in);
  if (!gemv) return false;
  const void* x16 = n > lc::kGemvMaxRows ? bf16_rows(x, DType::kBF16) : nullptr;  // version 3's two x tiles
  if (n > lc::kGemvMaxRows && !x16) return true;  // out of memory: failed
  wrote(gate.data, static_cast<size_t>((n - 1) * ldy + out) * 4);
  shadow_ = {};  // no bf16 copy of the output is made
  lc::GemvSwigluCall c;
  c.w_gate = w_gate.data;
  c.ldg = row_stride_of(w_gate);
  c.w_up = w_up.data;
  c.ldu = row_stride_of(w_up);
  c.x = x.f32();
  c.ldx = ldx;
  c.y = gate.f32();
  c.ldy = ldy;
  c.rows = n;
  c.in = in;
  c.out = out;
  if (norm) c.norm = *norm;  // gemv_norm_of's: g present (a null g would mean no norm mode)
  assert(!norm || norm->w);
  c.x16 = x16;
  c.stream = stream_;
  rec("gemv_swiglu", c.w_gate, c.ldg, c.w_up, c.ldu, c.x, ldx, c.y, ldy, n, in, out, c.norm.w, c.norm.t, c.norm.eps,
      x16);
  launch("matmul.gemv_swiglu", [c] { return lc::gemv_bf16_swiglu(c); });
  return true;
}

void CudaBackend::add(TensorView& y, const TensorView& x) {
  wrote(y.data, y.nbytes());
  float* yd = y.f32();
  const float* xd = x.f32();
  const int64_t n = y.numel();
  rec("add", yd, xd, n);
  launch("add", [=, this] { return lc::add(yd, xd, n, stream_); });
}

void CudaBackend::embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) {
  wrote(out.data, out.nbytes());
  const void* t = table.data;
  const auto et = elem_of(table.dtype);
  const int64_t d = table.dim(1);
  const int32_t* di = dev_ints(ids, n);
  float* o = out.f32();
  rec("embedding", t, et, d, di, n, o);
  launch("embedding", [=, this] { return lc::embedding(t, et, d, di, n, o, stream_); });
}

void CudaBackend::convert(const void* src, lc::Elem st, int64_t lds, void* dst, lc::Elem dt, int64_t ldd, int64_t rows,
             int64_t cols) {
  rec("convert", src, st, lds, dst, dt, ldd, rows, cols);
  launch("convert", [=, this] { return lc::convert_rows(src, st, lds, dst, dt, ldd, rows, cols, stream_); });
}

void* CudaBackend::make_shadow(const TensorView& y, int64_t rows, int64_t cols) {
  shadow_ = {};
  // Products of up to kGemvMaxRows rows that take the decode GEMV read f32; the rest read bf16.
  if (dtype_ != DType::kBF16 || row_stride_of(y) != cols || rows <= std::min(gemv_max_rows(), int64_t{lc::kGemvMaxRows}))
    return nullptr;
  // Optional: without memory for it the GEMMs convert instead.
  void* b = try_scratch(2, static_cast<size_t>(rows * cols) * 2);
  if (b) shadow_ = {y.data, rows, cols, b};
  return b;
}

const void* CudaBackend::bf16_rows(const TensorView& x, DType to) {
  const int64_t n = x.dim(0), in = x.dim(1), ldx = row_stride_of(x);
  // The shadow the producing op left (RMSNorm, SwiGLU), or x converted once into scratch.
  if (to == DType::kBF16 && shadow_.f32 == x.data && shadow_.rows == n && shadow_.cols == in && ldx == in)
    return shadow_.bf16;
  void* xs = scratch(0, static_cast<size_t>(n * in) * 2);
  if (!xs) return nullptr;
  convert(x.data, lc::Elem::kF32, ldx, xs, elem_of(to), in, n, in);
  return xs;
}

void CudaBackend::gemm(const TensorView& w, const void* x, int64_t ldx, void* y, int64_t ldy, int64_t n, int64_t in, int64_t out,
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
    if (st == CUBLAS_STATUS_SUCCESS) return cudaSuccess;
    fail(fmt::format("cublasLtMatmul [{}x{}]·[{}x{}]^T failed (status {})", n, in, out, in, static_cast<int>(st)));
    // Not success, so that a capture of this pass is discarded: a graph without this GEMM's node
    // must never be cached and replayed.
    return cudaErrorUnknown;
  });
}

}  // namespace lragent::cuda_impl
