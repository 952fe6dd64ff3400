// Device helpers shared by the attention kernels: paged addressing, per-sequence geometry,
// and the PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16 bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention.cuh"

namespace lragent::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;

// Element offset of token t's row in a paged view (sequence s). block_stride and
// page_size · row_stride fit in 32 bits (the launcher checks), so this is one wide multiply-add
// and one 32-bit one: it sits on the path of every K/V tile load.
// K and V views with one table, page size and row layout: a key's K and V rows sit at the same
// offset, so one lookup serves both (the engine's caches, docs/kv.md).
inline bool kv_share_rows(const AttnParams& p) {
  return p.k.table == p.v.table && p.k.table_stride == p.v.table_stride && p.k.page_size == p.v.page_size &&
         p.k.row_stride == p.v.row_stride && p.k.block_stride == p.v.block_stride;
}

__device__ __forceinline__ int64_t paged_offset(const DevPagedView& v, int s, int t, int page_shift) {
  const int32_t blk = __ldg(v.table + static_cast<int64_t>(s) * v.table_stride + (t >> page_shift));
  const int32_t in_block = (t & (v.page_size - 1)) * static_cast<int32_t>(v.row_stride);
  return static_cast<int64_t>(blk) * static_cast<int32_t>(v.block_stride) + in_block;
}

// Per-sequence query geometry.
struct SeqInfo {
  int q0;   // first query row of the sequence in q/out
  int n_q;  // queries of the sequence
  int ctx;  // keys available
};
__device__ __forceinline__ SeqInfo seq_info(const AttnParams& p, int s) {
  SeqInfo si;
  si.q0 = p.q_start[s];
  si.n_q = p.q_start[s + 1] - si.q0;
  si.ctx = p.ctx_len[s];
  return si;
}
// Agents mode: the agent (the index of its B in b_agent_stride steps, or in b_seq) of query i of
// a sequence is q_start[s] + i, numbered through every sequence: a shared prefix's forks go in
// groups, one group a sequence of one launch. 0 without agents mode (one adapter).
__device__ __forceinline__ int agent_of(const AttnParams& p, const SeqInfo& si, int i) { return p.agents ? si.q0 + i : 0; }
// Absolute position of query i (keys 0..pos are visible).
__device__ __forceinline__ int query_pos(const AttnParams& p, const SeqInfo& si, int i) {
  return p.agents ? si.ctx - 1 : si.ctx - si.n_q + i;
}

__host__ __device__ inline int ilog2(int x) {
  int r = 0;
  while ((1 << (r + 1)) <= x) ++r;
  return r;
}

// ---- PTX wrappers -----------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes == 0 zero-fills the destination (nothing is read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
// 8-byte async copy (LR rows whose rank is not a multiple of 8).
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
// 4-byte async copy (a block-table entry; src_bytes 0: zero).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

// D = A·B + D, m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ex2.approx: one MUFU op (exp2f adds the denormal-range fix-up instructions); the softmax
// arguments are <= 0 after subtracting the running maximum.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two bf16 of a lora_B row as one mma operand register, zero past the rank.
__device__ __forceinline__ uint32_t ld_b32_guard(const bf16* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const unsigned int*>(p)) : 0u;
}

// sin/cos of an f32 angle up to ~1e5 rad: x - k·2π with a two-term FMA Cody-Waite reduction
// (error ~ulp(π)), then the MUFU approximations (abs. error ~2^-21 on [-π, π]).
__device__ __forceinline__ void rope_sincos(float x, float* sn, float* cs) {
  const float k = rintf(x * 0.15915494309189535f);
  float r = fmaf(-k, 6.28318548202514648f, x);
  r = fmaf(-k, -1.7484555314695172e-07f, r);
  __sincosf(r, sn, cs);
}

}  // namespace lragent::cuda::detail
