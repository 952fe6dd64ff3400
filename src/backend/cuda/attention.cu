// The thin launcher: validates one AttnParams, dispatches to a numbered kernel version.
// Also the materialise-then-attend baseline's first step (V_full = V_base + s·LRv·B^T in HBM).
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_internal.h"
#include "backend/cuda/device_props.h"

#include <algorithm>

namespace lragent::cuda {
namespace {

bool pow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }

bool view_ok(const DevPagedView& v, int64_t align_elems) {
  return v.data != nullptr && v.table != nullptr && pow2(v.page_size) && v.row_stride > 0 &&
         v.row_stride % align_elems == 0 && v.block_stride > 0 && v.block_stride % align_elems == 0 &&
         v.block_stride <= INT32_MAX && static_cast<int64_t>(v.page_size) * v.row_stride <= INT32_MAX &&
         reinterpret_cast<uintptr_t>(v.data) % (align_elems * 2) == 0;
}

bool lowrank_ok(const DevLowRank& t) {
  if (!t.active()) return true;
  return t.rank <= 64 && t.rank % 4 == 0 && view_ok(t.lr, 4) && t.lr.row_stride >= t.rank &&
         reinterpret_cast<uintptr_t>(t.b) % 4 == 0;
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

bool params_ok(const AttnParams& p) {
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0) return false;
  if (p.n_seqs <= 0 || p.n_seqs > 65535 || p.max_q <= 0 || p.max_ctx <= 0) return false;  // grid.z holds seqs
  // Every kernel takes the row maximum on raw scores: a positive scale keeps their order.
  if (!(p.softmax_scale > 0.f)) return false;
  if (!p.q || !p.q_start || !p.ctx_len || (!p.out && !p.out_f32)) return false;
  // Q rows are copied in 16-byte chunks; outputs are stored as bf16 pairs / float2.
  if (!aligned(p.q, 16) || !aligned(p.out, 4) || !aligned(p.out_f32, 8)) return false;
  if (!view_ok(p.k, 8) || !view_ok(p.v, 8)) return false;
  if (!lowrank_ok(p.k_lr) || !lowrank_ok(p.v_lr)) return false;
  if (p.k_lr.active() && !p.inv_freq) return false;
  // Agents mode reads B as bf16 pairs at b + a·b_agent_stride.
  for (const DevLowRank* t : {&p.k_lr, &p.v_lr})
    if (t->active() && t->b_agent_stride % 2 != 0) return false;
  // Per-sequence B: v4's decode kernel only (another kernel would read b for every sequence), V
  // side alone or K and V sides together.
  if ((p.k_lr.b_seq && (!p.k_lr.active() || !p.v_lr.b_seq)) ||
      (p.v_lr.b_seq && (!p.v_lr.active() || (p.agents && p.k_lr.active() && !p.k_lr.b_seq) ||
                        !attention_v4_applies(p))))
    return false;
  // k_pos0: v4's K term only (the other kernels place key j at position j).
  if (p.k_pos0 != 0 && (p.k_pos0 < 0 || !p.k_lr.active() || !attention_v4_applies(p))) return false;
  if (p.lse_out && (!aligned(p.lse_out, 4) || !attention_v4_applies(p))) return false;
  if (p.split_counters_capacity < 0 || (p.split_counters_capacity > 0 && !p.split_counters)) return false;
  return true;
}

// V_full[t, :] = V[t, :] + s·LRv[t, :]·B^T. Two kernels: the vector one for rank <= 16 (the
// benchmark's r = 16), the generic one for the rest. The baseline should be as fast as such a pass
// can be: the generic kernel's 2-byte accesses ran at ~0.45 TB/s on an H100, which made
// materialise-then-attend look slower than it has to.
//
// Vector kernel: a thread owns 8 columns of the row (16-byte loads and stores of V and V_full) and
// keeps their B rows (8 x 16, f32) in registers; a block covers `tpb` tokens (up to
// kVecMaxTokens: enough to amortise loading B, few enough for two blocks per SM over the grid),
// kVecUnroll rows' V loads in flight per thread. Threads = width / 8.
constexpr int kVecMaxTokens = 256, kVecRank = 16, kVecUnroll = 8;
__global__ void __launch_bounds__(256) materialize_v_vec_kernel(const AttnParams p, bf16* v_full, int tpb) {
  const int s = blockIdx.y, t0 = blockIdx.x * tpb;
  const int ctx = p.ctx_len[s];
  if (t0 >= ctx) return;
  const int n = min(tpb, ctx - t0);
  const int rank = p.v_lr.rank;
  const int vshift = detail::ilog2(p.v.page_size), lshift = detail::ilog2(p.v_lr.lr.page_size);
  __shared__ float lr_s[kVecMaxTokens][kVecRank];  // [token][rank], zero past the rank
  __shared__ int64_t voff_s[kVecMaxTokens];
  for (int e = threadIdx.x; e < n * kVecRank; e += blockDim.x) {
    const int t = e / kVecRank, r = e % kVecRank;
    lr_s[t][r] = r < rank
                     ? __bfloat162float(p.v_lr.lr.data[detail::paged_offset(p.v_lr.lr, s, t0 + t, lshift) + r])
                     : 0.f;
  }
  for (int t = threadIdx.x; t < n; t += blockDim.x) voff_s[t] = detail::paged_offset(p.v, s, t0 + t, vshift);
  const int c0 = threadIdx.x * 8;  // this thread's columns
  float b[8][kVecRank];  // s·B[c0 + j, r]
  if (rank == kVecRank && reinterpret_cast<uintptr_t>(p.v_lr.b) % 16 == 0) {  // a B row is two 16-byte loads
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint4* row = reinterpret_cast<const uint4*>(p.v_lr.b + static_cast<int64_t>(c0 + j) * kVecRank);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 w = row[h];
        const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(w2[i]);
          b[j][8 * h + 2 * i] = p.v_lr.scale * f.x;
          b[j][8 * h + 2 * i + 1] = p.v_lr.scale * f.y;
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < kVecRank; ++r)
        b[j][r] = r < rank ? p.v_lr.scale * __bfloat162float(p.v_lr.b[static_cast<int64_t>(c0 + j) * rank + r]) : 0.f;
  }
  __syncthreads();
  for (int tb = 0; tb < n; tb += kVecUnroll) {
    uint4 v[kVecUnroll];
#pragma unroll
    for (int u = 0; u < kVecUnroll; ++u)
      v[u] = tb + u < n ? *reinterpret_cast<const uint4*>(p.v.data + voff_s[tb + u] + c0) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kVecUnroll; ++u) {
      const int t = tb + u;
      if (t >= n) break;
      const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
      uint4 o;
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int r = 0; r < kVecRank; ++r) {
          a0 += lr_s[t][r] * b[2 * j][r];
          a1 += lr_s[t][r] * b[2 * j + 1][r];
        }
        const float2 vf = __bfloat1622float2(v2[j]);
        o2[j] = __floats2bfloat162_rn(vf.x + a0, vf.y + a1);
      }
      *reinterpret_cast<uint4*>(v_full + voff_s[t] + c0) = o;
    }
  }
}

// Generic kernel: a block of 32 tokens; thread per column.
constexpr int kMatTokens = 32, kMatThreads = 256;
__global__ void __launch_bounds__(kMatThreads) materialize_v_kernel(const AttnParams p, bf16* v_full) {
  const int s = blockIdx.y, t0 = blockIdx.x * kMatTokens;
  const int ctx = p.ctx_len[s];
  if (t0 >= ctx) return;
  const int n = min(kMatTokens, ctx - t0);
  const int rank = p.v_lr.rank;
  const int vshift = detail::ilog2(p.v.page_size), lshift = detail::ilog2(p.v_lr.lr.page_size);
  __shared__ float lr_s[64][kMatTokens];  // [rank][token]
  __shared__ int64_t voff_s[kMatTokens];
  for (int e = threadIdx.x; e < kMatTokens * rank; e += kMatThreads) {
    const int t = e / rank, r = e % rank;
    lr_s[r][t] = t < n ? __bfloat162float(p.v_lr.lr.data[detail::paged_offset(p.v_lr.lr, s, t0 + t, lshift) + r]) : 0.f;
  }
  for (int t = threadIdx.x; t < kMatTokens; t += kMatThreads)
    voff_s[t] = t < n ? detail::paged_offset(p.v, s, t0 + t, vshift) : 0;
  __syncthreads();
  const int width = p.n_kv_heads * p.head_dim;
  for (int c = threadIdx.x; c < width; c += kMatThreads) {
    float acc[kMatTokens];
#pragma unroll
    for (int t = 0; t < kMatTokens; ++t) acc[t] = 0.f;
    const bf16* brow = p.v_lr.b + static_cast<int64_t>(c) * rank;
    for (int r = 0; r < rank; ++r) {
      const float b = __bfloat162float(brow[r]);
#pragma unroll
      for (int t = 0; t < kMatTokens; ++t) acc[t] += lr_s[r][t] * b;
    }
#pragma unroll
    for (int t = 0; t < kMatTokens; ++t) {
      if (t < n) {
        const int64_t off = voff_s[t] + c;
        v_full[off] = __float2bfloat16(__bfloat162float(p.v.data[off]) + p.v_lr.scale * acc[t]);
      }
    }
  }
}

// K_full = K_base + RoPE(s·LRk·B_k^T) into a dense buffer: a block covers `tpb` tokens and
// blockDim.x of the row's n_kv·D/2 rotation pairs (blockIdx.y: which ones), a thread one pair
// (g·D + i, g·D + i + D/2) of every token, with that pair's two B_k rows (s folded in, zero past
// the rank) in registers; the tokens' LRk rows are staged in shared memory.
constexpr int kMatKTokens = 64;
__global__ void materialize_k_kernel(const AttnParams p, bf16* k_full, bf16* v_dense, int tpb) {
  constexpr int R = kMaterializeKMaxRank;
  const int t0 = blockIdx.x * tpb;
  const int ctx = p.ctx_len[0];
  if (t0 >= ctx) return;
  const int n = min(tpb, ctx - t0);
  const int D = p.head_dim, half = D / 2, rank = p.k_lr.rank;
  const int64_t width = static_cast<int64_t>(p.n_kv_heads) * D;
  const int kshift = detail::ilog2(p.k.page_size), lshift = detail::ilog2(p.k_lr.lr.page_size);
  __shared__ float lr_s[kMatKTokens][R];  // [token][rank], zero past the rank
  __shared__ int64_t koff_s[kMatKTokens], voff_s[kMatKTokens];
  for (int e = threadIdx.x; e < n * R; e += blockDim.x) {
    const int t = e / R, r = e % R;
    lr_s[t][r] = r < rank ? __bfloat162float(p.k_lr.lr.data[detail::paged_offset(p.k_lr.lr, 0, t0 + t, lshift) + r])
                          : 0.f;
  }
  const int vshift = detail::ilog2(p.v.page_size);
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    koff_s[t] = detail::paged_offset(p.k, 0, t0 + t, kshift);
    voff_s[t] = detail::paged_offset(p.v, 0, t0 + t, vshift);
  }
  const int pair = blockIdx.y * blockDim.x + threadIdx.x;
  const int g = pair / half, i = pair % half;
  const int64_t ca = static_cast<int64_t>(g) * D + i, cb = ca + half;  // the pair's columns
  float ba[R], bb[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    ba[r] = r < rank ? p.k_lr.scale * __bfloat162float(p.k_lr.b[ca * rank + r]) : 0.f;
    bb[r] = r < rank ? p.k_lr.scale * __bfloat162float(p.k_lr.b[cb * rank + r]) : 0.f;
  }
  const float freq = p.inv_freq[i];
  __syncthreads();
  // kBatch tokens at a time, their K_base values loaded before any is used: one DRAM round trip
  // per batch instead of one per token (the stores between would keep the loads in order).
  constexpr int kBatch = 8;
  for (int tb = 0; tb < n; tb += kBatch) {
    float ka[kBatch], kc[kBatch];
    bf16 va[kBatch], vc[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int t = min(tb + u, n - 1);
      ka[u] = __bfloat162float(__ldg(p.k.data + koff_s[t] + ca));
      kc[u] = __bfloat162float(__ldg(p.k.data + koff_s[t] + cb));
      if (v_dense) {
        va[u] = __ldg(p.v.data + voff_s[t] + ca);
        vc[u] = __ldg(p.v.data + voff_s[t] + cb);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int t = tb + u;
      if (t >= n) break;
      float da = 0.f, db = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        da = fmaf(lr_s[t][r], ba[r], da);
        db = fmaf(lr_s[t][r], bb[r], db);
      }
      float sn, cs;
      sincosf(static_cast<float>(t0 + t) * freq, &sn, &cs);  // the RoPE ops' expression
      bf16* out = k_full + static_cast<int64_t>(t0 + t) * width;
      out[ca] = __float2bfloat16(ka[u] + (da * cs - db * sn));
      out[cb] = __float2bfloat16(kc[u] + (db * cs + da * sn));
      if (v_dense) {
        bf16* vo = v_dense + static_cast<int64_t>(t0 + t) * width;
        vo[ca] = va[u];
        vo[cb] = vc[u];
      }
    }
  }
}

// attention_merge: a thread per 4 columns of a row, 256 threads a block.
__global__ void __launch_bounds__(256) attn_merge_kernel(const AttnMerge m) {
  const int per_row = m.head_dim / 4;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (256 / per_row) + threadIdx.x / per_row;
  const int c4 = threadIdx.x % per_row;
  if (row >= m.rows || threadIdx.x >= 256 / per_row * per_row) return;
  const float la = m.lse_a[row], lb = m.lse_b[row];
  const float mx = fmaxf(la, lb);
  const float wa = la == -INFINITY ? 0.f : exp2f(la - mx), wb = lb == -INFINITY ? 0.f : exp2f(lb - mx);
  const float inv = wa + wb > 0.f ? 1.f / (wa + wb) : 0.f;
  const float4 a = reinterpret_cast<const float4*>(m.o_a + row * m.head_dim)[c4];
  const float4 b = reinterpret_cast<const float4*>(m.o_b + row * m.head_dim)[c4];
  const float fa = wa * inv, fb = wb * inv;
  reinterpret_cast<float4*>(m.out + row * m.head_dim)[c4] =
      make_float4(fa * a.x + fb * b.x, fa * a.y + fb * b.y, fa * a.z + fb * b.z, fa * a.w + fb * b.w);
}

}  // namespace

cudaError_t attention_merge(const AttnMerge& m, cudaStream_t stream) {
  if (!m.o_a || !m.lse_a || !m.o_b || !m.lse_b || !m.out || m.rows < 0 || m.head_dim <= 0 || m.head_dim % 4 != 0 ||
      m.head_dim > 256 || !aligned(m.o_a, 16) || !aligned(m.o_b, 16) || !aligned(m.out, 16))
    return cudaErrorInvalidValue;
  if (m.rows == 0) return cudaSuccess;
  const int64_t per_block = 256 / (m.head_dim / 4);
  attn_merge_kernel<<<static_cast<unsigned>((m.rows + per_block - 1) / per_block), 256, 0, stream>>>(m);
  return cudaGetLastError();
}

namespace {
thread_local AttnKernel last_kernel = AttnKernel::kV0Naive;
}  // namespace

int attention_lr_copy_chunk(const DevLowRank& t) {
  return (t.rank % 8 == 0 && t.lr.row_stride % 8 == 0 && t.lr.block_stride % 8 == 0 && aligned(t.lr.data, 16)) ? 8 : 4;
}

void note_attention_kernel(AttnKernel k) { last_kernel = k; }
AttnKernel attention_last_kernel() { return last_kernel; }

bool attention_params_ok(const AttnParams& p) { return params_ok(p); }

cudaError_t attention(const AttnParams& p, AttnKernel kernel) {
  if (!params_ok(p)) return cudaErrorInvalidValue;
  // Only v4 writes lse_out (params_ok checked that v4 takes these shapes).
  if (p.lse_out && kernel < AttnKernel::kV4Decode) return cudaErrorInvalidValue;
  switch (kernel) {
    case AttnKernel::kV0Naive:
      return attention_v0(p);
    case AttnKernel::kV1Mma:
      return attention_v1(p);
    case AttnKernel::kV2Mma:
      return attention_v2(p);
    case AttnKernel::kV3Mma:
      return attention_v3(p);
    case AttnKernel::kV4Decode:
      return attention_v4(p);
    case AttnKernel::kV5Wgmma:
      return attention_v5(p);
    case AttnKernel::kV6WgmmaWs:
      return attention_v6(p);
  }
  return cudaErrorInvalidValue;
}

size_t attention_workspace_bytes(const AttnParams& p, int max_splits) {
  return attention_v1_workspace_bytes(p, max_splits);
}

int attention_num_splits(const AttnParams& p, AttnKernel kernel) {
  switch (kernel) {
    case AttnKernel::kV0Naive:
      return 1;
    case AttnKernel::kV1Mma:
      return attention_v1_num_splits(p);
    case AttnKernel::kV2Mma:
      return attention_v2_num_splits(p);
    case AttnKernel::kV3Mma:
      return attention_v3_num_splits(p);
    case AttnKernel::kV4Decode:
      return attention_v4_num_splits(p);
    case AttnKernel::kV5Wgmma:
      return attention_v5_num_splits(p);
    case AttnKernel::kV6WgmmaWs:
      return attention_v6_num_splits(p);
  }
  return 1;
}

AttnPlan attention_plan(const AttnParams& p, AttnKernel kernel) {
  // The split heuristics only test the workspace for presence, size and 16-byte alignment (v4's
  // merge); they never dereference it. A placeholder with the alignment of a real allocation:
  // a host address here (as the backend once passed) made v4's alignment test, and so the
  // decode split count, follow the host object layout.
  AttnParams q = p;
  q.workspace = reinterpret_cast<void*>(uintptr_t{256});
  q.workspace_bytes = SIZE_MAX;
  AttnPlan plan;
  plan.splits = attention_num_splits(q, kernel);
  plan.workspace_bytes = plan.splits > 1 ? attention_workspace_bytes(p, plan.splits) : 0;
  return plan;
}

cudaError_t materialize_v(const AttnParams& p, bf16* v_full) {
  if (!params_ok(p) || !p.v_lr.active() || !v_full) return cudaErrorInvalidValue;
  const int width = p.n_kv_heads * p.head_dim;
  // The vector kernel's 16-byte accesses: rows and the pool 16-byte aligned (view_ok checks 8
  // elements for V; V_full shares V's layout).
  if (p.v_lr.rank <= kVecRank && width % 8 == 0 && width / 8 <= 256 &&
      reinterpret_cast<uintptr_t>(v_full) % 16 == 0) {
    // About two blocks per SM over the grid, 16..kVecMaxTokens tokens each.
    const int64_t want = std::max<int64_t>(1, 2 * sm_count() / std::max(1, p.n_seqs));
    const int tpb = static_cast<int>(std::clamp<int64_t>((p.max_ctx + want - 1) / want, 16, kVecMaxTokens));
    const dim3 grid((p.max_ctx + tpb - 1) / tpb, p.n_seqs);
    materialize_v_vec_kernel<<<grid, width / 8, 0, p.stream>>>(p, v_full, tpb);
    return cudaGetLastError();
  }
  const dim3 grid((p.max_ctx + kMatTokens - 1) / kMatTokens, p.n_seqs);
  materialize_v_kernel<<<grid, kMatThreads, 0, p.stream>>>(p, v_full);
  return cudaGetLastError();
}

bool materialize_k_applies(const AttnParams& p) {
  const int pairs = p.n_kv_heads * p.head_dim / 2;
  return params_ok(p) && p.k_lr.active() && p.k_lr.rank <= kMaterializeKMaxRank && p.n_seqs == 1 && p.inv_freq &&
         (pairs <= 256 || (pairs % 256 == 0 && pairs <= 1024));
}

cudaError_t materialize_k(const AttnParams& p, bf16* k_full, bf16* v_dense) {
  if (!materialize_k_applies(p) || !k_full) return cudaErrorInvalidValue;
  // Blocks of at most 256 pairs (two resident per SM at the kernel's registers), about eight
  // blocks per SM over the context, 4..kMatKTokens tokens each.
  const int threads = p.n_kv_heads * p.head_dim / 2;
  const int per_block = threads <= 256 ? threads : 256;
  const int col_blocks = threads / per_block;
  const int64_t want = std::max<int64_t>(1, 8 * static_cast<int64_t>(sm_count()) / col_blocks);
  const int tpb = static_cast<int>(std::clamp<int64_t>((p.max_ctx + want - 1) / want, 4, kMatKTokens));
  const dim3 grid((p.max_ctx + tpb - 1) / tpb, col_blocks);
  materialize_k_kernel<<<grid, per_block, 0, p.stream>>>(p, k_full, v_dense, tpb);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
