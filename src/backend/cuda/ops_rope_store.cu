// RoPE (with q's LoRA terms), Qwen3's per-head q/k norms, the KV cache stores, and rope_store,
// which does the three in one launch for a decode pass (see ops.cuh). The rotation and norm
// arithmetic is rope_math.cuh's, shared with the v4 decode attention's fused RoPE.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/lora_expand.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_math.cuh"

namespace lragent::cuda {
namespace {

// One rotation pair of RoPE: elements i (< hd / 2) and i + hd / 2 of row `row` (token tok's
// head) of x, rotated in place and returned. With kLora and lr (token tok's x·A, q only) the row
// first gets its LoRA term scale · lr · b^T. x16 (optional): the rotated pair also in bf16.
template <bool kLora>
__device__ __forceinline__ float2 rope_elem(float* x, int heads, int64_t row, int i, int64_t tok, int hd,
                                          const int32_t* pos, const float* inv_freq, __nv_bfloat16* x16,
                                          const RopeLora& lora, const float* lr) {
  const int half = hd / 2;
  float sn, cs;
  rope_sincos(pos[tok], inv_freq[i], sn, cs);
  float* v = x + row * hd;
  float a = v[i], b = v[i + half];
  if constexpr (kLora) {
    if (lr) {
      const int64_t o = (row % heads) * hd + i;  // output column of x·A·B^T
      float da = 0.f, db = 0.f;
      const int rank = lora.rank[tok];
      const int64_t ldb = lora.ldb[tok];
      const bool bf = lora.b_bf16[tok] != 0;
      // 16 ranks at a time, every load of a chunk issued before the first use (a dependent
      // loop would wait one L2 round trip per rank), as 16-byte vectors where aligned.
      for (int k0 = 0; k0 < rank; k0 += 16) {
        float wa[16], wb[16], l[16];
        const int n = min(16, rank - k0);
        lora_load16(lora.b[tok], bf, o * ldb + k0, n, wa);
        lora_load16(lora.b[tok], bf, (o + half) * ldb + k0, n, wb);
        lora_load16(lr, false, k0, n, l);
#pragma unroll
        for (int u = 0; u < 16; ++u) {
          da += l[u] * wa[u];
          db += l[u] * wb[u];
        }
      }
      a += lora.scale[tok] * da;
      b += lora.scale[tok] * db;
    }
  }
  const float2 rot = rope_rotate(a, b, cs, sn);
  const float ra = rot.x, rb = rot.y;
  v[i] = ra;
  v[i + half] = rb;
  if (x16) {
    x16[row * hd + i] = __float2bfloat16(ra);
    x16[row * hd + i + half] = __float2bfloat16(rb);
  }
  return make_float2(ra, rb);
}

// RoPE on one or two tensors of the same tokens (q and k in one launch): elements [0, n·ha·half)
// rotate xa [n, ha, hd], the rest xb [n, hb, hd].
// xa16 (optional): the rotated xa also in bf16 (the attention kernels' query operand).
// kLora: token t's xa row first gets its LoRA term scale · lr_t · b^T (RopeLora, ops.cuh).
template <bool kLora>
__global__ void rope_kernel(float* xa, int ha, float* xb, int hb, int64_t n, int hd, const int32_t* pos,
                            const float* inv_freq, __nv_bfloat16* xa16, const RopeLora lora) {
  const int half = hd / 2;
  const int64_t total_a = n * ha * half, total = total_a + n * hb * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const bool in_a = e < total_a;
    const int heads = in_a ? ha : hb;
    const int64_t el = in_a ? e : e - total_a;
    const int64_t row = el / half;  // token * heads + head
    const int64_t tok = row / heads;
    rope_elem<kLora>(in_a ? xa : xb, heads, row, static_cast<int>(el % half), tok, hd, pos, inv_freq,
                     in_a ? xa16 : nullptr, lora, kLora && in_a ? lora.lr[tok] : nullptr);
  }
}

// f(std::integral_constant<int, kPer>) with kPer = the elements per lane of a warp holding a head
// row of hd <= 256 (2, 4 or 8: hd / 32 rounded up to those), for the warp-per-row kernels below.
template <class F>
void with_row_elems(int hd, F&& f) {
  static_assert(kQkNormMaxHeadDim == 256, "kPer 8 covers head_dim <= 256");
  if (hd <= 64)
    f(std::integral_constant<int, 2>{});
  else if (hd <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

// Token tok's q LoRA term scale · lr · b^T of a warp's head row `row` (its head: row % heads) added
// to v, lane l holding elements l + 32u (u < kPer; none past hd). Every B row of a 16-rank chunk
// is loaded before the first is used (a load-use chain per element cost ~3 us a layer in the 8B
// decode step). qk_norm_kernel and norm_rope_store_kernel share it: the same bits.
template <int kPer>
__device__ __forceinline__ void add_row_lora(float (&v)[kPer], const RopeLora& lora, int64_t tok, int64_t row,
                                             int heads, int hd, int lane) {
  const float* lr = lora.lr[tok];
  if (!lr) return;
  const bool bf = lora.b_bf16[tok] != 0;
  const int rank = lora.rank[tok];
  const int64_t ldb = lora.ldb[tok];
  const int64_t o0 = (row % heads) * hd;  // output column of x·A·B^T of element 0
  float d[kPer] = {};
  for (int k0 = 0; k0 < rank; k0 += 16) {
    const int m = min(16, rank - k0);
    float l[16], wb[kPer][16];
    lora_load16(lr, false, k0, m, l);
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int j = lane + 32 * u;
      if (j < hd) {
        lora_load16(lora.b[tok], bf, (o0 + j) * ldb + k0, m, wb[u]);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) wb[u][i] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u)
#pragma unroll
      for (int i = 0; i < 16; ++i) d[u] += l[i] * wb[u][i];
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) v[u] += lora.scale[tok] * d[u];
}

// The head row a warp of qk_norm_kernel / norm_rope_store_kernel takes: q's rows first, then k's.
struct QkRow {
  bool is_q;
  int heads;
  int64_t row, tok;  // the row within q or k, and its token
};
__device__ __forceinline__ QkRow qk_row(const QkNormArgs& a, int64_t row_all) {
  const int64_t rows_q = a.n * a.hq;
  QkRow r;
  r.is_q = row_all < rows_q;
  r.heads = r.is_q ? a.hq : a.hk;
  r.row = r.is_q ? row_all : row_all - rows_q;
  r.tok = r.row / r.heads;
  return r;
}

// One warp per head row (q's rows first, then k's): the row's values stay in registers between
// the sum of squares and the scaling (kPer = head_dim / 32 rounded up per lane). With kLora,
// token t's q rows first get their LoRA term (add_row_lora).
template <bool kLora, int kPer>
__global__ void qk_norm_kernel(const QkNormArgs a, const RopeLora lora) {
  pdl_release();  // the PDL-launched decode attention after us may start its page-table lookups now
  const int64_t row_all = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row_all >= a.n * (a.hq + a.hk)) return;  // whole warps leave together: the shuffles below are full
  const QkRow q = qk_row(a, row_all);
  float* x = (q.is_q ? a.q : a.k) + q.row * a.hd;
  const void* w = q.is_q ? a.wq : a.wk;
  float v[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int j = lane + 32 * u;
    v[u] = j < a.hd ? x[j] : 0.f;
  }
  if constexpr (kLora) {
    if (q.is_q) add_row_lora(v, lora, q.tok, q.row, q.heads, a.hd, lane);
  }
  const float inv = warp_inv_rms(v, a.hd, a.eps);
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int j = lane + 32 * u;
    if (j < a.hd) x[j] = normed(v[u], inv, load_elem(w, a.wt, j));
  }
}

struct StoreMulti {
  StoreJobDev job[kMaxStoreJobs];
  int64_t end[kMaxStoreJobs];  // prefix sums of n · width
  int n_jobs;
  StoreLoras loras;  // the expands the jobs' `lora` fields index
};
// Jobs [0, n_jobs) packed for one launch; returns the elements in all (0 for no job), or -1 when
// a job names an expand that is not there or does not cover its rows exactly.
int64_t pack_stores(const StoreJobDev* jobs, int n_jobs, const StoreLoras* loras, StoreMulti& m) {
  m.n_jobs = n_jobs;
  if (loras) m.loras = *loras;
  int64_t end = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const StoreJobDev& jb = jobs[j];
    if (jb.lora >= 0) {
      if (jb.lora >= m.loras.n) return -1;
      const LoraJob& lj = m.loras.job[jb.lora];
      if (lj.y != jb.rows || lj.rows != jb.n || lj.out != jb.width || lj.ldy != lj.out || !lj.base ||
          lj.rank > kMaxLoraRank || (lj.xa && !lj.b))
        return -1;
    }
    m.job[j] = jb;
    end += jb.n * jb.width;
    m.end[j] = end;
  }
  return end;
}
// Element e (< m.end[n_jobs - 1]) of the packed jobs: the job it falls in, then its row and column.
__device__ __forceinline__ void store_multi_elem(const StoreMulti& m, int64_t e) {
  int j = 0;
  while (j + 1 < m.n_jobs && e >= m.end[j]) ++j;
  const StoreJobDev& jb = m.job[j];
  const int64_t el = e - (j > 0 ? m.end[j - 1] : 0);
  const int64_t i = el / jb.width, c = el % jb.width;
  float v;
  if (jb.lora >= 0) {  // a held-back expand's element, computed here (and left in y)
    const LoraJob& lj = m.loras.job[jb.lora];
    float bv[kMaxLoraRank];  // [rank] row c of b
    lora_b_row(lj, c, bv);
    v = lora_expand_value(lj, static_cast<int>(i), c, [&](int k) { return bv[k]; });
    if (jb.lora_writes_y) lj.y[el] = v;
  } else {
    v = jb.rows[el];
  }
  store_elem(jb.dst.data, jb.dst.dtype, paged_row(jb.dst, jb.slots[i]) + c, v);
}
__global__ void store_rows_multi_kernel(const StoreMulti m) {
  pdl_release();  // the PDL-launched decode attention may start its page-table lookups now
  const int64_t total = m.end[m.n_jobs - 1];
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x)
    store_multi_elem(m, e);
}

// rope_store (ops.cuh), element by element over one grid: q's rotation pairs, then k's (each
// written back and, by the same thread, into every job that stores k's rows: nothing reads a
// rotated k value but the thread that made it), then the other jobs' elements (which read nothing
// the RoPE writes). No barrier, so the RoPE and the stores overlap as one launch.
struct RopeStoreJobs {
  StoreJobDev k_job[kMaxStoreJobs];  // jobs storing k's rows: row i is token k_tok0[j] + i
  int64_t k_tok0[kMaxStoreJobs];
  int n_k_jobs;
  StoreMulti other;                  // the rest (other.n_jobs may be 0)
  int64_t n_other;                   // their elements
};
// Kernel parameters stay within the classic 4 KB (graph nodes copy them for every replay).
static_assert(sizeof(RopeArgs) + sizeof(RopeStoreJobs) <= 4096, "rope_store's parameters fit in 4 KB");
template <bool kLora>
__global__ void rope_store_kernel(const RopeArgs r, const RopeStoreJobs js) {
  pdl_release();  // the PDL-launched decode attention may start its page-table lookups now
  const int half = r.hd / 2;
  const int64_t total_a = r.n * r.ha * half, total_k = total_a + r.n * r.hb * half, total = total_k + js.n_other;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    if (e < total_a) {
      const int64_t row = e / half, t = row / r.ha;
      rope_elem<kLora>(r.xa, r.ha, row, static_cast<int>(e % half), t, r.hd, r.pos, r.inv_freq,
                       static_cast<__nv_bfloat16*>(r.xa16), r.rl, kLora ? r.rl.lr[t] : nullptr);
    } else if (e < total_k) {
      const int64_t el = e - total_a, row = el / half, t = row / r.hb;
      const int i = static_cast<int>(el % half);
      const float2 v = rope_elem<false>(r.xb, r.hb, row, i, t, r.hd, r.pos, r.inv_freq, nullptr, r.rl, nullptr);
      const int64_t col = (row % r.hb) * r.hd + i;  // in a k row of width hb · hd
      for (int j = 0; j < js.n_k_jobs; ++j) {
        const StoreJobDev& jb = js.k_job[j];
        const int64_t ti = t - js.k_tok0[j];  // the job's row of token t
        if (ti < 0 || ti >= jb.n) continue;
        const int64_t base = paged_row(jb.dst, jb.slots[ti]);
        store_elem(jb.dst.data, jb.dst.dtype, base + col, v.x);
        store_elem(jb.dst.data, jb.dst.dtype, base + col + half, v.y);
      }
    } else {
      store_multi_elem(js.other, e - total_k);
    }
  }
}

// rope_store with Qwen3's q/k norms (RopeArgs::normed), head_dim = 32·kPer with kPer 2, 4 or 8:
// blocks [0, row_blocks) take q's and k's head rows, a warp each: the row (q's with its LoRA term
// when kLora) normed as qk_norm_kernel does, rotated as rope_elem does (pair j, j + hd/2 sits in
// one lane: elements u and u + kPer/2), written back (q's also to xa16) and k's stored into the
// jobs that store k; the blocks after them store the other jobs' elements. The same bits as
// qk_norm, then rope_store.
template <bool kLora, int kPer>
__global__ void norm_rope_store_kernel(const RopeArgs r, const RopeStoreJobs js, int row_blocks) {
  pdl_release();  // the PDL-launched decode attention may start its page-table lookups now
  if (static_cast<int>(blockIdx.x) >= row_blocks) {
    const int64_t stride = int64_t{gridDim.x - row_blocks} * blockDim.x;
    for (int64_t e = int64_t{blockIdx.x - row_blocks} * blockDim.x + threadIdx.x; e < js.n_other; e += stride)
      store_multi_elem(js.other, e);
    return;
  }
  const QkNormArgs& a = r.norm;
  const int64_t row_all = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row_all >= a.n * (a.hq + a.hk)) return;  // whole warps leave together
  const QkRow q = qk_row(a, row_all);
  constexpr int kHalf = kPer / 2;
  const int hd = 32 * kPer;
  float* x = (q.is_q ? r.xa : r.xb) + q.row * hd;
  float v[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) v[u] = x[lane + 32 * u];
  if constexpr (kLora) {
    if (q.is_q) add_row_lora(v, r.rl, q.tok, q.row, q.heads, hd, lane);
  }
  const float inv = warp_inv_rms(v, hd, a.eps);
  const void* w = q.is_q ? a.wq : a.wk;
#pragma unroll
  for (int u = 0; u < kPer; ++u) v[u] = normed(v[u], inv, load_elem(w, a.wt, lane + 32 * u));
#pragma unroll
  for (int u = 0; u < kHalf; ++u) {
    float sn, cs;
    rope_sincos(r.pos[q.tok], r.inv_freq[lane + 32 * u], sn, cs);
    const float2 rot = rope_rotate(v[u], v[u + kHalf], cs, sn);
    v[u] = rot.x;
    v[u + kHalf] = rot.y;
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) x[lane + 32 * u] = v[u];
  if (q.is_q) {
    if (r.xa16) {
      __nv_bfloat16* x16 = static_cast<__nv_bfloat16*>(r.xa16) + q.row * hd;
#pragma unroll
      for (int u = 0; u < kPer; ++u) x16[lane + 32 * u] = __float2bfloat16(v[u]);
    }
    return;
  }
  const int64_t col0 = (q.row % q.heads) * hd;  // in a k row of width hb · hd
  for (int j = 0; j < js.n_k_jobs; ++j) {
    const StoreJobDev& jb = js.k_job[j];
    const int64_t ti = q.tok - js.k_tok0[j];  // the job's row of token tok
    if (ti < 0 || ti >= jb.n) continue;
    const int64_t base = paged_row(jb.dst, jb.slots[ti]) + col0;
#pragma unroll
    for (int u = 0; u < kPer; ++u) store_elem(jb.dst.data, jb.dst.dtype, base + lane + 32 * u, v[u]);
  }
}

}  // namespace

cudaError_t rope(float* x, int64_t n, int heads, int head_dim, const int32_t* pos, const float* inv_freq,
                 cudaStream_t s) {
  RopeArgs r;
  r.xa = x;
  r.ha = heads;
  r.n = n;
  r.hd = head_dim;
  r.pos = pos;
  r.inv_freq = inv_freq;
  return rope_pair(r, s);
}

cudaError_t rope_pair(const RopeArgs& r, cudaStream_t s) {
  if (r.normed || (r.lora && r.n > kDecodePassMaxRows)) return cudaErrorInvalidValue;
  const int64_t total = r.n * (r.ha + r.hb) * (r.hd / 2);
  if (total == 0) return cudaSuccess;
  auto* xa16 = static_cast<__nv_bfloat16*>(r.xa16);
  if (r.lora)
    rope_kernel<true><<<blocks_for(total), kThreads, 0, s>>>(r.xa, r.ha, r.xb, r.hb, r.n, r.hd, r.pos, r.inv_freq, xa16,
                                                             r.rl);
  else
    rope_kernel<false><<<blocks_for(total), kThreads, 0, s>>>(r.xa, r.ha, r.xb, r.hb, r.n, r.hd, r.pos, r.inv_freq,
                                                              xa16, RopeLora{});
  return cudaGetLastError();
}

cudaError_t rope_store(const RopeArgs& r, const StoreJobDev* jobs, const int64_t* tok0, int n_jobs,
                       const StoreLoras* loras, cudaStream_t s) {
  if (r.n < 1 || r.n > kDecodePassMaxRows || r.hb < 1 || r.ha < 0 || n_jobs < 1 || n_jobs > kMaxStoreJobs || r.hd % 2 != 0)
    return cudaErrorInvalidValue;
  RopeStoreJobs js{};
  StoreJobDev other[kMaxStoreJobs];
  int n_other = 0;
  for (int j = 0; j < n_jobs; ++j) {
    if (tok0[j] < 0) {
      other[n_other++] = jobs[j];
      continue;
    }
    if (tok0[j] + jobs[j].n > r.n || jobs[j].width != int64_t{r.hb} * r.hd || jobs[j].lora >= 0)
      return cudaErrorInvalidValue;
    js.k_job[js.n_k_jobs] = jobs[j];
    js.k_tok0[js.n_k_jobs++] = tok0[j];
  }
  js.n_other = pack_stores(other, n_other, loras, js.other);
  if (js.n_other < 0) return cudaErrorInvalidValue;
  if (r.normed) {
    const QkNormArgs& a = r.norm;
    if (a.q != r.xa || a.k != r.xb || a.n != r.n || a.hq != r.ha || a.hk != r.hb || a.hd != r.hd)
      return cudaErrorInvalidValue;
    if (rope_store_norms(r.hd)) {  // one kernel: norm, RoPE and stores
      constexpr int kWarps = kThreads / 32;
      const int64_t rows = r.n * (r.ha + r.hb);
      const int row_blocks = static_cast<int>((rows + kWarps - 1) / kWarps);
      const auto grid = static_cast<unsigned>(row_blocks + (js.n_other > 0 ? blocks_for(js.n_other) : 0));
      with_row_elems(r.hd, [&](auto per) {
        constexpr int kPer = decltype(per)::value;
        if (r.lora)
          norm_rope_store_kernel<true, kPer><<<grid, kThreads, 0, s>>>(r, js, row_blocks);
        else
          norm_rope_store_kernel<false, kPer><<<grid, kThreads, 0, s>>>(r, js, row_blocks);
      });
      return cudaGetLastError();
    }
    // Other head dims: the norm (with q's LoRA term) first, then the rotations and stores.
    if (const cudaError_t e = qk_norm(a, r.lora ? &r.rl : nullptr, s); e != cudaSuccess) return e;
    RopeArgs rot = r;
    rot.normed = false;
    rot.lora = false;
    const int64_t total = rot.n * (rot.ha + rot.hb) * (rot.hd / 2) + js.n_other;
    rope_store_kernel<false><<<blocks_for(total), kThreads, 0, s>>>(rot, js);
    return cudaGetLastError();
  }
  const int64_t total = r.n * (r.ha + r.hb) * (r.hd / 2) + js.n_other;
  if (r.lora)
    rope_store_kernel<true><<<blocks_for(total), kThreads, 0, s>>>(r, js);
  else
    rope_store_kernel<false><<<blocks_for(total), kThreads, 0, s>>>(r, js);
  return cudaGetLastError();
}

cudaError_t qk_norm(const QkNormArgs& a, const RopeLora* lora, cudaStream_t s) {
  if (a.hd < 1 || a.hd > kQkNormMaxHeadDim || a.n < 0 || a.hq < 0 || a.hk < 0 || (lora && a.n > kDecodePassMaxRows))
    return cudaErrorInvalidValue;
  const int64_t rows = a.n * (a.hq + a.hk);
  if (rows == 0) return cudaSuccess;
  constexpr int kWarps = 8;
  const auto grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const RopeLora none{};
  with_row_elems(a.hd, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    if (lora)
      qk_norm_kernel<true, kPer><<<grid, 32 * kWarps, 0, s>>>(a, *lora);
    else
      qk_norm_kernel<false, kPer><<<grid, 32 * kWarps, 0, s>>>(a, none);
  });
  return cudaGetLastError();
}

cudaError_t store_rows_multi(const StoreJobDev* jobs, int n_jobs, const StoreLoras* loras, cudaStream_t s) {
  if (n_jobs < 1 || n_jobs > kMaxStoreJobs) return cudaErrorInvalidValue;
  StoreMulti m{};
  const int64_t end = pack_stores(jobs, n_jobs, loras, m);
  if (end < 0) return cudaErrorInvalidValue;
  if (end == 0) return cudaSuccess;
  store_rows_multi_kernel<<<blocks_for(end), kThreads, 0, s>>>(m);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
