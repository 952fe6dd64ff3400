// The CUDA backend's paged-cache ops: stores into paged caches and attention (the tuned
// kernels of attention.cuh when the shapes allow, else the generic kernel). The class:
// cuda_backend_impl.h.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>

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
  t.sig(d.b, d.b_agent_stride, d.b_seq, d.rank, d.scale);
}
void sig_of(lc::GraphTape& t, const lc::AttnParams& a) {
  t.sig(a.n_heads, a.n_kv_heads, a.head_dim, a.softmax_scale, a.n_seqs, a.q_start, a.ctx_len, a.max_q, a.max_ctx,
        a.agents, a.q, a.inv_freq, a.k_pos0, a.out, a.out_f32, a.lse_out, a.workspace, a.workspace_bytes, a.num_splits,
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
  // Queued on pending_stores_, launched now unless a store batch holds them back.
  for (const StoreJob& j : jobs) {
    const int64_t n = j.rows.dim(0), width = j.rows.numel() / std::max<int64_t>(n, 1);
    if (n == 0) continue;
    int64_t max_slot = 0;
    for (int64_t i = 0; i < n; ++i) max_slot = std::max<int64_t>(max_slot, j.slots[i]);
    lc::StoreJobDev& d = pending_stores_.emplace_back();
    d.rows = j.rows.f32();
    d.n = n;
    d.width = width;
    d.dst = paged(j.dst, max_slot + 1);
    d.slots = dev_ints(j.slots, n);  // staged now: the caller's array may go
    // Only a recorded pass may hold its stores for the attention (launch_stores).
    pending_store_rows_.push_back(n == 1 && tape_->recording() ? j.dst.row_offset(j.slots[0]) : -1);
    if (tape_->recording()) {
      rec("store_job", d.rows, d.n, d.width, d.slots);
      sig_of(*tape_, d.dst);
    }
  }
  if (!store_batching_) end_store_batch();
}

void CudaBackend::end_store_batch() {
  store_batching_ = false;
  launch_stores(pending_stores_, pending_store_rows_);
  pending_stores_.clear();
  pending_store_rows_.clear();
}

void CudaBackend::launch_stores(std::span<const lc::StoreJobDev> jobs_in, std::span<const int64_t> row_at) {
  flush_rope_store();  // an earlier layer's, still held: it runs first
  // Held-back expands (v_full) that these stores read: computed by the store kernel if every
  // output is read whole by some job of one launch, else launched alone first.
  std::array<lc::StoreJobDev, lc::kMaxStoreJobs> own{};
  std::span<const lc::StoreJobDev> jobs = jobs_in;
  lc::StoreLoras loras{};
  if (!pending_expand_.empty()) {
    bool attached = false;
    if (!jobs_in.empty() && jobs_in.size() <= static_cast<size_t>(lc::kMaxStoreJobs)) {
      std::copy(jobs_in.begin(), jobs_in.end(), own.begin());
      const std::span<lc::StoreJobDev> mine(own.data(), jobs_in.size());
      attached = attach_expands(mine, loras);
      if (attached) jobs = mine;
    }
    if (attached) {
      pending_expand_.clear();
      ++fused_lora_stores_;
      for (int x = 0; x < loras.n; ++x) rec("store_lora", x);
      for (const lc::StoreJobDev& j : jobs) rec("store_job_lora", j.lora, j.lora_writes_y);
    } else {
      flush_expand();
    }
  }
  const lc::StoreLoras* lp = loras.n > 0 ? &loras : nullptr;
  if (pending_rope_ && !jobs.empty() && jobs.size() <= static_cast<size_t>(lc::kMaxStoreJobs)) {
    // One launch for the RoPE and the stores, if every job reading the rotated k reads whole rows
    // of it (the thread rotating a pair then stores it), and no job reads q or straddles k.
    const lc::RopeArgs r = *pending_rope_;
    std::array<int64_t, lc::kMaxStoreJobs> tok0{};  // per job: the k row (token) of its row 0, or -1
    const auto row_bytes = static_cast<uintptr_t>(r.hb) * static_cast<uintptr_t>(r.hd) * 4;
    const auto b0 = reinterpret_cast<uintptr_t>(r.xb), b1 = b0 + static_cast<uintptr_t>(r.n) * row_bytes;
    const auto a0 = reinterpret_cast<uintptr_t>(r.xa);
    const auto a1 = a0 + static_cast<uintptr_t>(r.n * r.ha * r.hd) * 4;
    bool ok = true;
    for (size_t j = 0; j < jobs.size() && ok; ++j) {
      if (jobs[j].lora >= 0) {  // computes an expand's rows (disjoint from q and k: pending_expand_)
        tok0[j] = -1;
        continue;
      }
      const auto p0 = reinterpret_cast<uintptr_t>(jobs[j].rows);
      const auto p1 = p0 + static_cast<uintptr_t>(jobs[j].n * jobs[j].width) * 4;
      tok0[j] = -1;
      if (p0 >= b0 && p0 < b1) {
        ok = (p0 - b0) % row_bytes == 0 && jobs[j].width == int64_t{r.hb} * r.hd && p1 <= b1;
        tok0[j] = static_cast<int64_t>((p0 - b0) / row_bytes);
      } else {
        ok = (p1 <= b0 || p0 >= b1) && (p1 <= a0 || p0 >= a1);
      }
    }
    if (ok) {
      pending_rope_.reset();
      // A batch-1 decode layer's k and v rows: held for the attention after it (pending_rope_attn_).
      const int nj = static_cast<int>(jobs.size());
      if (fuse_rope_attention_ && tape_->recording() && !lp && !r.lora && r.n == 1 && r.xa16 && nj == 2 &&
          row_at.size() == jobs.size() && std::min(tok0[0], tok0[1]) == -1 && std::max(tok0[0], tok0[1]) == 0) {
        const int kj = tok0[0] == 0 ? 0 : 1, vj = 1 - kj;
        const lc::StoreJobDev &kd = jobs[static_cast<size_t>(kj)], &vd = jobs[static_cast<size_t>(vj)];
        if (kd.n == 1 && vd.n == 1 && vd.width == kd.width && kd.dst.dtype == lc::Elem::kBF16 &&
            vd.dst.dtype == lc::Elem::kBF16 && row_at[static_cast<size_t>(kj)] >= 0 &&
            row_at[static_cast<size_t>(vj)] >= 0) {
          pending_rope_attn_ =
              HeldRopeStore{r, kd, vd, row_at[static_cast<size_t>(kj)], row_at[static_cast<size_t>(vj)]};
          return;
        }
      }
      launch_rope_store(r, jobs.data(), tok0.data(), nj, lp);
      return;
    }
  }
  // With expands attached the jobs are one launch (attach_expands took at most kMaxStoreJobs).
  for (size_t at = 0; at < jobs.size(); at += lc::kMaxStoreJobs) {
    std::array<lc::StoreJobDev, lc::kMaxStoreJobs> chunk{};
    const int nj = static_cast<int>(std::min<size_t>(lc::kMaxStoreJobs, jobs.size() - at));
    std::copy_n(jobs.begin() + static_cast<std::ptrdiff_t>(at), nj, chunk.begin());
    rec("store_rows_multi", nj);
    launch("store_rows", [=, this] {
      return lc::store_rows_multi(chunk.data(), nj, lp ? &loras : nullptr, stream_);  // the closure's copy
    });
  }
}

void CudaBackend::launch_rope_store(const lc::RopeArgs& r, const lc::StoreJobDev* jobs, const int64_t* tok0, int nj,
                                    const lc::StoreLoras* loras) {
  std::array<lc::StoreJobDev, lc::kMaxStoreJobs> chunk{};
  std::array<int64_t, lc::kMaxStoreJobs> t0{};
  std::copy_n(jobs, nj, chunk.begin());
  std::copy_n(tok0, nj, t0.begin());
  const lc::StoreLoras ls = loras ? *loras : lc::StoreLoras{};
  const bool has_loras = loras != nullptr;
  ++fused_rope_stores_;
  if (r.normed && lc::rope_store_norms(r.hd)) ++fused_qk_norms_;
  rec("rope_store", nj);
  for (int j = 0; j < nj; ++j) rec("rope_store_tok0", t0[static_cast<size_t>(j)]);
  launch_now("rope_store", [=, this] {
    return lc::rope_store(r, chunk.data(), t0.data(), nj, has_loras ? &ls : nullptr, stream_);  // the closure's copies
  });
}

void CudaBackend::flush_rope_store() {
  if (!pending_rope_attn_) return;
  const HeldRopeStore h = *pending_rope_attn_;
  pending_rope_attn_.reset();
  const lc::StoreJobDev jobs[2] = {h.k_job, h.v_job};
  const int64_t tok0[2] = {0, -1};
  launch_rope_store(h.r, jobs, tok0, 2, nullptr);
}

std::optional<lc::DecodeRopeStore> CudaBackend::rope_store_for(const AttentionParams& p,
                                                              const lc::AttnParams& a) const {
  if (!pending_rope_attn_ || attn_kernel_ < lc::AttnKernel::kV4Decode) return std::nullopt;
  const HeldRopeStore& h = *pending_rope_attn_;
  const lc::RopeArgs& r = h.r;
  // q is the RoPE's (its bf16 copy is what the kernel's p.q names) with this attention's heads,
  // and both stores land on the key it reads last, in the caches it reads. (launch_stores held
  // only k's whole row of xb and a v row of the same width, into bf16 caches.)
  const bool same = p.n_q == 1 && p.q == r.xa && a.q == r.xa16 && r.ha == p.n_heads && r.hb == p.n_kv_heads &&
                    r.hd == p.head_dim && h.k_job.dst.data == p.k.data && h.v_job.dst.data == p.v.data &&
                    h.k_row == p.k.row_offset(p.n_ctx - 1) && h.v_row == p.v.row_offset(p.n_ctx - 1);
  if (!same || !lc::attention_decode_rope_store_applies(a)) return std::nullopt;
  lc::DecodeRopeStore rs;
  rs.q = r.xa;
  rs.q16 = static_cast<lc::bf16*>(r.xa16);
  rs.k = r.xb;
  rs.v = h.v_job.rows;
  rs.pos = r.pos;
  rs.inv_freq = r.inv_freq;
  rs.write_q = !matmul_only_;  // else q is read by this attention alone (set_matmul_only_outputs)
  if (r.normed) {  // Qwen3's q/k norms too, on f32 or bf16 weights (the kernel's two)
    if (r.norm.wt != lc::Elem::kF32 && r.norm.wt != lc::Elem::kBF16) return std::nullopt;
    rs.q_norm_w = r.norm.wq;
    rs.k_norm_w = r.norm.wk;
    rs.norm_w_bf16 = r.norm.wt == lc::Elem::kBF16;
    rs.norm_eps = r.norm.eps;
  }
  return rs;
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

const lc::bf16* CudaBackend::q_bf16(const float* q, int64_t elems) {
  const auto q0 = reinterpret_cast<uintptr_t>(q_shadow_.f32), qp = reinterpret_cast<uintptr_t>(q);
  if (q_shadow_.f32 && qp >= q0 && (qp - q0) % 4 == 0 && static_cast<int64_t>((qp - q0) / 4) + elems <= q_shadow_.rows)
    return static_cast<const lc::bf16*>(q_shadow_.bf16) + (qp - q0) / 4;  // rope_pair wrote it
  auto* qb = static_cast<lc::bf16*>(scratch(1, static_cast<size_t>(elems) * 2));
  convert(q, lc::Elem::kF32, elems, qb, lc::Elem::kBF16, elems, 1, elems);
  return qb;
}

lc::AttnParams CudaBackend::attn_params_for(const AttentionParams& p) const {
  lc::AttnParams a;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.softmax_scale = p.softmax_scale;
  a.stream = stream_;
  a.split_counters = split_counters_;
  a.split_counters_capacity = split_counters_ ? kSplitCounters : 0;
  for (auto [src, dst] : {std::pair{&p.k_lr, &a.k_lr}, std::pair{&p.v_lr, &a.v_lr}}) {
    if (!src->active()) continue;
    dst->b = static_cast<const lc::bf16*>(src->b);
    dst->rank = src->rank;
    dst->scale = src->scale;
  }
  return a;
}

void CudaBackend::run_fast_attention(const AttentionParams& p) {
  const int64_t q_elems = static_cast<int64_t>(p.n_q) * p.n_heads * p.head_dim;
  const lc::bf16* qb = q_bf16(p.q, q_elems);
  const int32_t meta[3] = {0, p.n_q, p.n_ctx};  // q_start[0..1], ctx_len[0]
  const auto* dmeta = dev_ints(meta, 3);
  lc::AttnParams a = attn_params_for(p);
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
  for (auto [src, dst] : {std::pair{&p.k_lr, &a.k_lr}, std::pair{&p.v_lr, &a.v_lr}})
    if (src->active()) dst->lr = dev_view(src->lr, p.n_ctx);
  if (p.k_lr.active()) a.inv_freq = dev_floats(p.inv_freq, p.head_dim / 2);
  a.out_f32 = p.out;
  // A complete AttnParams first: materialize_k_applies checks it as attention() would.
  void* const kv_copy = a.k_lr.active() ? materialize_k_full(p, a) : nullptr;
  const lc::AttnKernel kernel = attn_kernel_;
  set_attn_workspace(a, kernel);
  if (tape_->recording()) {
    rec("attention");
    sig_of(*tape_, a);
  }
  if (const std::optional<lc::DecodeRopeStore> rs = rope_store_for(p, a)) {
    pending_rope_attn_.reset();  // this launch does its work
    ++fused_rope_attention_;
    if (rs->normed()) ++fused_qk_norms_;
    rec("attention_rope_store", rs->q, rs->q16, rs->k, rs->v, rs->pos, rs->inv_freq, rs->write_q, rs->q_norm_w,
        rs->k_norm_w, rs->norm_w_bf16, rs->norm_eps);
    launch("attention", [a, d = *rs] { return lc::attention_decode_rope_store(a, d); });
  } else {
    launch("attention", [a, kernel] { return lc::attention(a, kernel); });
  }
  free_async(kv_copy);  // after the attention, in stream order (null when recording)
}

void CudaBackend::set_attn_workspace(lc::AttnParams& a, lc::AttnKernel kernel) {
  // Sized for the split count the kernel will pick (a prefill chunk runs unsplit; sizing for the
  // maximum splits x queries would ask for gigabytes).
  const size_t ws = lc::attention_plan(a, kernel).workspace_bytes;
  if (tape_->recording()) {
    a.workspace = ws > 0 ? pass_alloc(ws) : nullptr;
    a.workspace_bytes = a.workspace ? ws : 0;
    return;
  }
  if (ws > attn_ws_bytes_) {
    free_async(attn_workspace_);
    attn_workspace_ = raw_alloc(ws);
    attn_ws_bytes_ = attn_workspace_ ? ws : 0;  // out of memory: run unsplit rather than fail
  }
  a.workspace = ws > 0 && attn_ws_bytes_ >= ws ? attn_workspace_ : nullptr;
  a.workspace_bytes = a.workspace ? attn_ws_bytes_ : 0;
}

// Query rows (n_q x G) from which a prefill chunk over n_ctx keys materialises its K-side LoRA
// term. The fused kernel rebuilds K_base + RoPE(s·LRk·B_k^T) for every key tile in every block of
// 128 rows, which made a 1024-query chunk 2.3x the plain kernel's time (H200, 8B shapes;
// docs/cuda.md); written once, K_full costs one pass over the context (read K_base, V and LRk;
// write K_full and V's dense copy), then the plain (or Flash-LoRA V) kernel reads them. Decode and
// short chunks keep the fused term: there one pass over the context is the whole cost. Where the
// two cross (`lragent_attention_bench --kterm-chunks`, H200, 8B shapes, r = 16, fused / materialised
// ms): at 8k keys 512 rows 0.105 / 0.108, 1024 rows 0.184 / 0.145; at 32k keys 256 rows 0.182 /
// 0.228, 512 rows 0.335 / 0.296 (bench/results/attention-kchunk-nvidia-h200-20261129.md).
static int64_t materialize_k_min_rows(int64_t n_ctx) { return n_ctx >= 16384 ? 512 : 1024; }

void* CudaBackend::materialize_k_full(const AttentionParams& p, lc::AttnParams& a) {
  const int64_t rows = static_cast<int64_t>(p.n_q) * (p.n_heads / p.n_kv_heads);
  const int64_t width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  if (!materialize_k_ || rows < materialize_k_min_rows(p.n_ctx) || !lc::materialize_k_applies(a)) return nullptr;
  // K_full and a copy of V, each [pages * kPage, width] bf16, token t at row t: both read through
  // one identity block table (the prefill kernels then address K and V with one lookup; a dense
  // K beside the paged V ran 1.6x slower).
  constexpr int kPage = 16;
  const int64_t pages = (static_cast<int64_t>(a.max_ctx) + kPage - 1) / kPage;
  const int64_t elems = pages * kPage * width;
  // Allocated per chunk and freed after its attention (stream-ordered), not kept as scratch: at
  // long contexts it is hundreds of MB that later allocations may need.
  const bool recording = tape_->recording();
  const size_t bytes = static_cast<size_t>(elems) * 4;
  auto* kfull = static_cast<lc::bf16*>(recording ? pass_alloc(bytes) : raw_alloc(bytes));
  if (!kfull) return nullptr;  // no device memory for it: the kernel rebuilds K per tile instead
  lc::bf16* vdense = kfull + elems;
  if (static_cast<int64_t>(dense_table_.size()) < pages) {
    const size_t from = dense_table_.size();
    dense_table_.resize(static_cast<size_t>(pages));
    for (size_t i = from; i < dense_table_.size(); ++i) dense_table_[i] = static_cast<int32_t>(i);
  }
  const lc::AttnParams m = a;  // reads the paged K, the K term and inv_freq as `a` holds them
  if (recording) {
    rec("materialize_k", kfull);
    sig_of(*tape_, m);
  }
  launch("attention.materialize_k", [m, kfull, vdense] { return lc::materialize_k(m, kfull, vdense); });
  a.k.data = kfull;
  a.k.table = dev_ints(dense_table_.data(), pages);
  a.k.table_stride = 0;
  a.k.page_size = kPage;
  a.k.row_stride = width;
  a.k.block_stride = kPage * width;
  a.v = a.k;
  a.v.data = vdense;
  a.k_lr = lc::DevLowRank{};
  ++materialized_k_;
  return recording ? nullptr : kfull;
}

void CudaBackend::attention_batch(std::span<const AttentionParams> ps) {
  // Runs of consecutive decode rows that can share a launch; everything else one by one.
  for (size_t i = 0; i < ps.size();) {
    size_t j = i + 1;
    if (batch_attention_ && ps[i].n_q == 1 && decode_batchable(ps[i], ps[i], 0))
      while (j < ps.size() && decode_batchable(ps[i], ps[j], j - i)) ++j;
    if (j - i >= 2 && (run_shared_prefix(ps.subspan(i, j - i)) || run_same_key_groups(ps.subspan(i, j - i)) ||
                       run_decode_batch(ps.subspan(i, j - i)))) {
      i = j;
      continue;
    }
    for (; i < j; ++i) attention(ps[i]);
  }
}

bool CudaBackend::decode_batchable(const AttentionParams& first, const AttentionParams& p, size_t k) const {
  const int64_t row = static_cast<int64_t>(first.n_heads) * first.head_dim;
  auto same_layout = [](const PagedView& a, const PagedView& b) {
    return a.dtype == b.dtype && a.page_size == b.page_size && a.row_stride == b.row_stride &&
           a.block_step() == b.block_step();
  };
  if (p.n_q != 1 || p.n_ctx < 1 || !fast_attention_ok(p)) return false;
  if (p.n_heads != first.n_heads || p.n_kv_heads != first.n_kv_heads || p.head_dim != first.head_dim ||
      p.softmax_scale != first.softmax_scale)
    return false;
  if (!same_layout(p.k, first.k) || !same_layout(p.v, first.v)) return false;
  if (p.v_lr.active() != first.v_lr.active()) return false;
  if (p.v_lr.active() && (p.v_lr.rank != first.v_lr.rank || p.v_lr.scale != first.v_lr.scale ||
                          p.v_lr.b_dtype != first.v_lr.b_dtype || !same_layout(p.v_lr.lr, first.v_lr.lr)))
    return false;
  // The K term (k_proj adapters, v4's in-place rebuild): each sequence's B_k by b_seq, one RoPE.
  if (p.k_lr.active() != first.k_lr.active()) return false;
  if (p.k_lr.active() &&
      (p.k_lr.rank != first.k_lr.rank || p.k_lr.scale != first.k_lr.scale || p.k_lr.b_dtype != first.k_lr.b_dtype ||
       !same_layout(p.k_lr.lr, first.k_lr.lr) || !p.inv_freq || !first.inv_freq ||
       (p.inv_freq != first.inv_freq && !std::equal(p.inv_freq, p.inv_freq + p.head_dim / 2, first.inv_freq))))
    return false;
  // One launch reads q and writes out as consecutive rows.
  return p.q == first.q + static_cast<int64_t>(k) * row && p.out == first.out + static_cast<int64_t>(k) * row;
}

std::optional<lc::AttnParams> CudaBackend::decode_batch_params(std::span<const AttentionParams> ps, int64_t skip,
                                                               float* lse, int per) {
  const AttentionParams& p0 = ps.front();
  const auto rows = static_cast<int64_t>(ps.size());
  const int64_t n = rows / per;  // sequences: each `per` consecutive rows over the same keys
  // Sequence s's keys (its first row's; the others' are the same blocks: same_keys).
  auto seq = [&](int64_t s) -> const AttentionParams& { return ps[static_cast<size_t>(s * per)]; };
  int64_t max_ctx = 0;
  for (const AttentionParams& p : ps) max_ctx = std::max<int64_t>(max_ctx, p.n_ctx - skip);
  const int64_t sized = sized_ctx(max_ctx);
  const bool lr = p0.v_lr.active(), klr = p0.k_lr.active();
  lc::AttnParams a = attn_params_for(p0);
  a.n_seqs = static_cast<int>(n);
  a.agents = per > 1;  // a sequence's rows are its agents, each with its own B
  a.max_q = per;
  a.max_ctx = static_cast<int>(sized);
  a.out_f32 = p0.out;
  a.lse_out = lse;
  if (klr) {
    a.inv_freq = dev_floats(p0.inv_freq, p0.head_dim / 2);
    a.k_pos0 = static_cast<int>(skip);  // the keys from `skip` on keep their positions
  }
  // Decided by the shapes, before anything is staged but the K term's RoPE frequencies (the check
  // wants them present).
  if (!lc::attention_v4_applies(a)) return std::nullopt;

  // Block tables [n, stride], each sequence's entries (from page skip / page_size on) rebased
  // onto the lowest data address of the batch: its caches live in its own KV arena, and block ids
  // count granules from there. Arena bases and layer planes are granule aligned, so the rebasing
  // is exact; it fails only when the arenas lie more than int32 blocks apart.
  auto rebased = [&](auto view_of, std::vector<int32_t>& table) -> const void* {
    const PagedView& v0 = view_of(p0);
    const int64_t page = v0.page_size, stride = (sized + page - 1) / page, first = skip / page;
    const int64_t block_bytes = v0.block_step() * static_cast<int64_t>(dtype_size(v0.dtype));
    const char* base = static_cast<const char*>(v0.data);
    for (const AttentionParams& p : ps) base = std::min(base, static_cast<const char*>(view_of(p).data));
    table.assign(static_cast<size_t>(n * stride), 0);
    for (int64_t s = 0; s < n; ++s) {
      const PagedView& v = view_of(seq(s));
      const int64_t delta = static_cast<const char*>(v.data) - base;
      if (delta % block_bytes != 0) return nullptr;
      const int64_t pages = (seq(s).n_ctx - skip + page - 1) / page;
      for (int64_t j = 0; j < stride; ++j) {
        const int64_t b = static_cast<int64_t>(v.table[first + std::min(j, pages - 1)]) + delta / block_bytes;
        if (b > INT32_MAX) return nullptr;
        table[static_cast<size_t>(s * stride + j)] = static_cast<int32_t>(b);
      }
    }
    return base;
  };
  std::vector<int32_t> kt, vt, lt, klt;
  const void* kbase = rebased([](const AttentionParams& p) -> const PagedView& { return p.k; }, kt);
  const void* vbase = rebased([](const AttentionParams& p) -> const PagedView& { return p.v; }, vt);
  const void* lbase = lr ? rebased([](const AttentionParams& p) -> const PagedView& { return p.v_lr.lr; }, lt) : nullptr;
  const void* klbase =
      klr ? rebased([](const AttentionParams& p) -> const PagedView& { return p.k_lr.lr; }, klt) : nullptr;
  if (!kbase || !vbase || (lr && !lbase) || (klr && !klbase)) return std::nullopt;
  auto view = [&](const PagedView& v, const void* base, const std::vector<int32_t>& table) {
    lc::DevPagedView d;
    d.data = static_cast<const lc::bf16*>(base);
    d.table = static_cast<const int32_t*>(dev_bytes(table.data(), table.size() * 4));
    d.table_stride = static_cast<int64_t>(table.size()) / n;
    d.page_size = v.page_size;
    d.row_stride = v.row_stride;
    d.block_stride = v.block_step();
    return d;
  };
  a.k = view(p0.k, kbase, kt);
  a.v = view(p0.v, vbase, vt);
  std::vector<const void*> bs, bks;
  if (lr) {
    a.v_lr.lr = view(p0.v_lr.lr, lbase, lt);
    for (const AttentionParams& p : ps) bs.push_back(p.v_lr.b);
  }
  if (klr) {
    a.k_lr.lr = view(p0.k_lr.lr, klbase, klt);
    for (const AttentionParams& p : ps) bks.push_back(p.k_lr.b);
  }

  const int64_t q_elems = rows * p0.n_heads * p0.head_dim;
  std::vector<int32_t> meta(static_cast<size_t>(2 * n + 1));  // q_start[0..n], ctx_len[n]
  for (int64_t s = 0; s <= n; ++s) meta[static_cast<size_t>(s)] = static_cast<int32_t>(s * per);
  for (int64_t s = 0; s < n; ++s) meta[static_cast<size_t>(n + 1 + s)] = static_cast<int32_t>(seq(s).n_ctx - skip);
  const int32_t* dmeta = dev_ints(meta.data(), static_cast<int64_t>(meta.size()));
  a.q = q_bf16(p0.q, q_elems);
  a.q_start = dmeta;
  a.ctx_len = dmeta + n + 1;
  if (lr) a.v_lr.b_seq = static_cast<const lc::bf16* const*>(dev_bytes(bs.data(), bs.size() * sizeof(void*)));
  if (klr) a.k_lr.b_seq = static_cast<const lc::bf16* const*>(dev_bytes(bks.data(), bks.size() * sizeof(void*)));
  return a;
}

bool CudaBackend::run_decode_batch(std::span<const AttentionParams> ps) {
  std::optional<lc::AttnParams> a = decode_batch_params(ps, 0, nullptr);
  if (!a) return false;
  const lc::AttnKernel kernel = attn_kernel_;
  set_attn_workspace(*a, kernel);
  const auto n = static_cast<int64_t>(ps.size());
  wrote(ps.front().out, static_cast<size_t>(n) * ps.front().n_heads * ps.front().head_dim * 4);
  if (tape_->recording()) {
    rec("attention_batch");
    sig_of(*tape_, *a);
  }
  launch("attention", [a = *a, kernel] { return lc::attention(a, kernel); });
  ++batched_attn_;
  batched_attn_seqs_ += n;
  return true;
}

bool CudaBackend::run_same_key_groups(std::span<const AttentionParams> ps) {
  const auto n = static_cast<int64_t>(ps.size());
  if (same_keys_min_keys_ <= 0 || n < 4) return false;
  const AttentionParams& p0 = ps.front();
  // The first group: the rows from the first on that read its keys; every other group alike.
  int64_t per = 1;
  while (per < n && same_keys(ps.subspan(0, static_cast<size_t>(per + 1)))) ++per;
  if (per < 2 || per == n || n % per != 0) return false;  // per == n: run_shared_prefix's whole case
  if (per * (p0.n_heads / p0.n_kv_heads) > lc::kAgentsMaxRows) return false;
  for (int64_t g = 0; g < n; g += per) {
    const auto group = ps.subspan(static_cast<size_t>(g), static_cast<size_t>(per));
    if (group.front().n_ctx < same_keys_min_keys_ || (g > 0 && !same_keys(group))) return false;
  }
  std::optional<lc::AttnParams> a = decode_batch_params(ps, 0, nullptr, static_cast<int>(per));
  if (!a) return false;
  const lc::AttnKernel kernel = attn_kernel_;
  set_attn_workspace(*a, kernel);
  wrote(p0.out, static_cast<size_t>(n) * p0.n_heads * p0.head_dim * 4);
  if (tape_->recording()) {
    rec("attention_same_key_groups", per);
    sig_of(*tape_, *a);
  }
  launch("attention", [a = *a, kernel] { return lc::attention(a, kernel); });
  ++same_keys_attn_;
  same_keys_seqs_ += n;
  return true;
}

int64_t CudaBackend::shared_prefix_keys(std::span<const AttentionParams> ps) {
  const AttentionParams& p0 = ps.front();
  if (ps.size() < 2) return 0;
  std::vector<const void*> key;  // [n, 5] each sequence's tables and length
  key.reserve(ps.size() * 5);
  for (const AttentionParams& p : ps)
    key.insert(key.end(), {p.k.table, p.v.table, p.v_lr.active() ? p.v_lr.lr.table : nullptr,
                           p.k_lr.active() ? p.k_lr.lr.table : nullptr,
                           reinterpret_cast<const void*>(static_cast<intptr_t>(p.n_ctx))});
  if (pass_open_ && key == prefix_memo_key_) return prefix_memo_keys_;
  int64_t limit = p0.n_ctx - 1;  // every sequence keeps >= 1 key of its own (its new token's)
  for (const AttentionParams& p : ps) limit = std::min<int64_t>(limit, p.n_ctx - 1);
  // Whole pages whose block ids agree in every table, over the same memory.
  auto common = [&](auto view_of) -> int64_t {
    const PagedView& v0 = view_of(p0);
    int64_t pages = limit / v0.page_size;
    for (const AttentionParams& p : ps) {
      const PagedView& v = view_of(p);
      if (v.data != v0.data) return 0;
      pages = std::mismatch(v0.table, v0.table + pages, v.table).first - v0.table;
    }
    return pages * v0.page_size;
  };
  int64_t keys = std::min(common([](const AttentionParams& p) -> const PagedView& { return p.k; }),
                          common([](const AttentionParams& p) -> const PagedView& { return p.v; }));
  int64_t page = std::max(p0.k.page_size, p0.v.page_size);
  if (p0.v_lr.active()) {
    keys = std::min(keys, common([](const AttentionParams& p) -> const PagedView& { return p.v_lr.lr; }));
    page = std::max<int64_t>(page, p0.v_lr.lr.page_size);
  }
  if (p0.k_lr.active()) {  // decode_batchable: the same rank, scale and RoPE frequencies
    keys = std::min(keys, common([](const AttentionParams& p) -> const PagedView& { return p.k_lr.lr; }));
    page = std::max<int64_t>(page, p0.k_lr.lr.page_size);
  }
  keys = keys / page * page;  // a page boundary of every cache (page sizes are powers of two)
  if (pass_open_) {
    prefix_memo_key_ = std::move(key);
    prefix_memo_keys_ = keys;
  }
  return keys;
}

bool CudaBackend::same_keys(std::span<const AttentionParams> ps) const {
  const AttentionParams& p0 = ps.front();
  // Every table over the pages that hold n_ctx keys, the last partial one too, over one memory.
  // Compared from the last page back: forks of one prompt (the same length in lockstep) part
  // there, so a run of them costs a compare a table, not one a shared page, every layer.
  auto same = [&](auto view_of) {
    const PagedView& v0 = view_of(p0);
    const int64_t pages = (p0.n_ctx + v0.page_size - 1) / v0.page_size;
    for (const AttentionParams& p : ps) {
      const PagedView& v = view_of(p);
      if (p.n_ctx != p0.n_ctx || v.data != v0.data) return false;
      if (v.table == v0.table) continue;
      for (int64_t i = pages - 1; i >= 0; --i)
        if (v.table[i] != v0.table[i]) return false;
    }
    return true;
  };
  return same([](const AttentionParams& p) -> const PagedView& { return p.k; }) &&
         same([](const AttentionParams& p) -> const PagedView& { return p.v; }) &&
         (!p0.v_lr.active() || same([](const AttentionParams& p) -> const PagedView& { return p.v_lr.lr; })) &&
         (!p0.k_lr.active() || same([](const AttentionParams& p) -> const PagedView& { return p.k_lr.lr; }));
}

bool CudaBackend::run_shared_prefix(std::span<const AttentionParams> ps) {
  const auto n = static_cast<int64_t>(ps.size());
  if (n < 2) return false;
  const AttentionParams& p0 = ps.front();
  // Rows that read the very same keys (an ICaRus step's base-model row and decoder row over one
  // cache): the agents-mode pass over all of them is the whole attention, with nothing of their
  // own to run and merge (same_keys_min_keys_ says from how many keys on).
  const bool whole = same_keys_min_keys_ > 0 && p0.n_ctx >= same_keys_min_keys_ && same_keys(ps);
  if (!whole && shared_prefix_min_keys_ <= 0) return false;
  const int64_t shared = whole ? p0.n_ctx : shared_prefix_keys(ps);
  if (shared <= 0 || (!whole && (n - 1) * shared < shared_prefix_min_keys_)) return false;  // nothing (enough) shared: one batch
  const int64_t rows = n * p0.n_heads;  // [n, n_heads] output rows
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (!aligned16(p0.out)) return false;  // the merge's 16-byte rows (whole: the kernel's)
  const bool lr = p0.v_lr.active(), klr = p0.k_lr.active();

  // The shared keys' pass: agents mode, agent i the query of sequence i; more than one
  // agents-mode sequence takes go in groups of about equal size, a sequence each, all over the
  // same pages (table_stride 0).
  const int64_t per = std::max(1, lc::kAgentsMaxRows / (p0.n_heads / p0.n_kv_heads));
  const int64_t n_groups = (n + per - 1) / per, group = (n + n_groups - 1) / n_groups;
  lc::AttnParams a = attn_params_for(p0);
  a.n_seqs = static_cast<int>(n_groups);
  a.agents = true;
  a.max_q = static_cast<int>(group);
  a.max_ctx = static_cast<int>(sized_ctx(shared));
  // Placeholders for the check (every pointer set below before the launch).
  a.out_f32 = p0.out;
  a.lse_out = whole ? nullptr : p0.out;
  a.inv_freq = klr ? p0.inv_freq : nullptr;
  if (!lc::attention_v4_applies(a)) return false;

  // Scratch (a prefix only): the shared pass's outputs [rows, head_dim] and log-sum-exps, the own
  // keys' [rows].
  float *o_shared = nullptr, *lse_shared = nullptr, *lse_own = nullptr;
  std::optional<lc::AttnParams> own;
  if (!whole) {
    const size_t o_bytes = static_cast<size_t>(rows) * p0.head_dim * 4, l_bytes = static_cast<size_t>(rows) * 4;
    const size_t bytes = o_bytes + 2 * ((l_bytes + 15) / 16 * 16);
    auto* buf = static_cast<char*>(tape_->recording() ? pass_alloc(bytes) : try_scratch(6, bytes));
    if (!buf) return false;
    o_shared = reinterpret_cast<float*>(buf);
    lse_shared = reinterpret_cast<float*>(buf + o_bytes);
    lse_own = reinterpret_cast<float*>(buf + o_bytes + (l_bytes + 15) / 16 * 16);
    own = decode_batch_params(ps, shared, lse_own);
    if (!own) return false;
  }
  // Each agent's query row and B_v / B_k: the own keys' pass's, or staged here.
  auto b_seq = [&](auto b_of) {
    std::vector<const void*> bs;
    for (const AttentionParams& p : ps) bs.push_back(b_of(p));
    return static_cast<const lc::bf16* const*>(dev_bytes(bs.data(), bs.size() * sizeof(void*)));
  };
  std::vector<int32_t> meta(static_cast<size_t>(2 * n_groups + 1));  // q_start[0..n_groups], ctx_len[n_groups]
  for (int64_t g = 0; g <= n_groups; ++g) meta[static_cast<size_t>(g)] = static_cast<int32_t>(std::min(n, g * group));
  for (int64_t g = 0; g < n_groups; ++g) meta[static_cast<size_t>(n_groups + 1 + g)] = static_cast<int32_t>(shared);
  const int32_t* dmeta = dev_ints(meta.data(), static_cast<int64_t>(meta.size()));
  a.q_start = dmeta;
  a.ctx_len = dmeta + n_groups + 1;
  a.q = own ? own->q : q_bf16(p0.q, rows * p0.head_dim);  // the same n query rows in bf16
  a.k = dev_view(p0.k, shared);
  a.v = dev_view(p0.v, shared, p0.v.table == p0.k.table && p0.v.page_size == p0.k.page_size ? a.k.table : nullptr);
  if (lr) {  // each agent's B_v
    a.v_lr.lr = dev_view(p0.v_lr.lr, shared);
    a.v_lr.b_seq = own ? own->v_lr.b_seq : b_seq([](const AttentionParams& p) { return p.v_lr.b; });
  }
  if (klr) {  // each agent's B_k the same way, and the RoPE frequencies
    a.k_lr.lr = dev_view(p0.k_lr.lr, shared);
    a.k_lr.b_seq = own ? own->k_lr.b_seq : b_seq([](const AttentionParams& p) { return p.k_lr.b; });
    a.inv_freq = own ? own->inv_freq : dev_floats(p0.inv_freq, p0.head_dim / 2);
  }
  a.out_f32 = whole ? p0.out : o_shared;
  a.lse_out = lse_shared;

  // Each launch sets its workspace just before it: a later set may grow (reallocate) the buffer,
  // which stream order makes safe only for launches already made.
  const lc::AttnKernel kernel = attn_kernel_;
  wrote(p0.out, static_cast<size_t>(rows) * p0.head_dim * 4);
  set_attn_workspace(a, kernel);
  if (tape_->recording()) {
    // whole: the length is not part of the pass's shape (ctx_len and the tables are staged).
    if (whole)
      rec("attention_same_keys");
    else
      rec("attention_shared_prefix", shared);
    sig_of(*tape_, a);
  }
  launch("attention", [a, kernel] { return lc::attention(a, kernel); });
  if (whole) {
    ++same_keys_attn_;
    same_keys_seqs_ += n;
    return true;
  }
  set_attn_workspace(*own, kernel);
  if (tape_->recording()) {
    rec("attention_own_keys");
    sig_of(*tape_, *own);
  }
  launch("attention", [o = *own, kernel] { return lc::attention(o, kernel); });
  lc::AttnMerge m;
  m.o_a = o_shared;
  m.lse_a = lse_shared;
  m.o_b = p0.out;
  m.lse_b = lse_own;
  m.out = p0.out;
  m.rows = rows;
  m.head_dim = p0.head_dim;
  rec("attention_merge", m.o_a, m.lse_a, m.o_b, m.lse_b, m.out, m.rows, m.head_dim);
  launch("attention.merge", [m, this] { return lc::attention_merge(m, stream_); });
  ++shared_prefix_attn_;
  shared_prefix_seqs_ += n;
  return true;
}

}  // namespace lragent::cuda_impl
