// The CUDA backend's paged-cache ops: stores into paged caches and attention (the tuned
// kernels of attention.cuh when the shapes allow, else the generic kernel). The class:
// cuda_backend_impl.h.
#include "backend/cuda/cuda_backend_impl.h"

namespace lragent::cuda_impl {

namespace {

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
        a.agents, a.q, a.inv_freq, a.out, a.out_f32, a.workspace, a.workspace_bytes, a.num_splits,
        a.split_counters, a.split_counters_capacity);
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

}  // namespace

void CudaBackend::store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) {
  const StoreJob job{rows, dst, slots};
  store_rows_multi(std::span<const StoreJob>(&job, 1));
}

void CudaBackend::store_rows_multi(std::span<const StoreJob> jobs) {
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

void CudaBackend::attention(const AttentionParams& p) {
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

lc::PagedDev CudaBackend::paged(const PagedView& v, int64_t n_tokens) {
  lc::PagedDev d;
  d.data = v.data;
  d.dtype = elem_of(v.dtype);
  d.page_size = v.page_size;
  d.row_stride = v.row_stride;
  d.block_stride = v.block_step();
  d.table = dev_table(v, n_tokens);
  return d;
}

const int32_t* CudaBackend::dev_table(const PagedView& v, int64_t n_tokens) {
  const int64_t pages = (n_tokens + v.page_size - 1) / v.page_size;
  const int64_t padded = (sized_ctx(n_tokens) + v.page_size - 1) / v.page_size;
  return static_cast<const int32_t*>(
      dev_bytes(v.table, static_cast<size_t>(pages) * 4, static_cast<size_t>(padded) * 4));
}

lc::LowRankDev CudaBackend::low_rank(const LowRankTerm& t, int64_t n_tokens) {
  lc::LowRankDev d;
  if (!t.active()) return d;
  d.lr = paged(t.lr, n_tokens);
  d.b = t.b;
  d.b_dtype = elem_of(t.b_dtype);
  d.rank = t.rank;
  d.scale = t.scale;
  return d;
}

bool CudaBackend::lr_fast_ok(const LowRankTerm& t) {
  return !t.active() || (t.b_dtype == DType::kBF16 && t.lr.dtype == DType::kBF16 && t.rank <= 64 && t.rank % 4 == 0 &&
                         t.lr.row_stride % 4 == 0 && t.lr.block_step() % 4 == 0 && pow2(t.lr.page_size));
}

bool CudaBackend::fast_attention_ok(const AttentionParams& p) const {
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

lc::DevPagedView CudaBackend::dev_view(const PagedView& v, int64_t n_tokens, const int32_t* table) {
  lc::DevPagedView d;
  d.data = static_cast<const lc::bf16*>(v.data);
  d.table = table ? table : dev_table(v, n_tokens);
  d.table_stride = 0;
  d.page_size = v.page_size;
  d.row_stride = v.row_stride;
  d.block_stride = v.block_step();
  return d;
}

void CudaBackend::run_fast_attention(const AttentionParams& p) {
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
  // K and V of a cache share one block table (kv_k_view / kv_v_view): then V reads K's device
  // copy, and the prefill kernels compute one address per key for both (Launch::kv_same).
  const bool same_table = p.v.table == p.k.table && p.v.page_size == p.k.page_size;
  a.v = dev_view(p.v, p.n_ctx, same_table ? a.k.table : nullptr);
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
  a.split_counters = split_counters_;
  a.split_counters_capacity = split_counters_ ? kSplitCounters : 0;
  // Workspace for the split count the kernel will pick (a prefill chunk runs unsplit; sizing
  // for the maximum splits x queries would ask for gigabytes).
  const lc::AttnKernel kernel = attn_kernel_;
  const size_t ws = lc::attention_plan(a, kernel).workspace_bytes;
  if (tape_->recording()) {
    a.workspace = ws > 0 ? pass_alloc(ws) : nullptr;
    a.workspace_bytes = a.workspace ? ws : 0;
    rec("attention");
    sig_of(*tape_, a);
    launch("attention", [a, kernel] { return lc::attention(a, kernel); });
    return;
  }
  if (ws > attn_ws_bytes_) {
    free_async(attn_workspace_);
    attn_workspace_ = raw_alloc(ws);
    attn_ws_bytes_ = attn_workspace_ ? ws : 0;  // out of memory: run unsplit rather than fail
  }
  a.workspace = ws > 0 && attn_ws_bytes_ >= ws ? attn_workspace_ : nullptr;
  a.workspace_bytes = a.workspace ? attn_ws_bytes_ : 0;
  launch("attention", [a, kernel] { return lc::attention(a, kernel); });
}

}  // namespace lragent::cuda_impl
