// The backend interface: the handful of ops the model needs, implemented once per device
// (cpu/, cuda/). Model code only talks to this interface. Every op works on TensorViews
// whose memory lives on the backend's device; activations are f32, weights may be
// f32/f16/bf16 (kept in their file dtype), caches are f32 on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"
#include "core/tensor.h"

namespace lragent {

// One layer of a paged cache: token t lives at
//   data + (table[t / page_size] * page_size + t % page_size) * row_stride.
struct PagedView {
  float* data = nullptr;           // [n_blocks, page_size, row_stride] (this layer's slice)
  const int32_t* table = nullptr;  // [ceil(n_tokens / page_size)] block ids
  int page_size = 1;
  int64_t row_stride = 0;          // floats per token row
  float* row(int64_t t) const {
    return data + (static_cast<int64_t>(table[t / page_size]) * page_size + t % page_size) * row_stride;
  }
};

// Low-rank (LoRA) term that attention adds to the base cache without materialising it:
//   V_j = V_base_j + LR_j · B_eff,  B_eff = scale · B^T   (K likewise, RoPE'd after the expand)
struct LowRankTerm {
  PagedView lr;              // [n_ctx, rank] rows of X·A (f32), K-side pre-RoPE
  const float* b = nullptr;  // [n_kv_heads * head_dim, rank] lora_B of this agent (row-major)
  int rank = 0;
  float scale = 0.f;         // lora_alpha / r (or / sqrt(r))
  bool active() const { return b != nullptr && rank > 0; }
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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;

  // An uninitialised tensor in this backend's memory.
  virtual Tensor alloc(DType t, std::vector<int64_t> shape) = 0;
  // dst = src: same element count, both contiguous and in this backend's memory.
  virtual void copy(const TensorView& src, TensorView& dst) = 0;
  // dst[i, :] = src[rows[i], :] for i < n; `rows` is a host array.
  virtual void gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) = 0;
  // A host copy of a tensor in this backend's memory.
  virtual Tensor to_host(const TensorView& src) = 0;

  // y[n, out] = alpha · x[n, in] · w[out, in]^T + beta · y (+ bias[out] when given).
  // w may be f32/f16/bf16 and may be strided along rows (a slice of a larger matrix).
  virtual void matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y,
                      float alpha = 1.f, float beta = 0.f) = 0;
  // y[n, d] = x / rms(x) · weight[d]
  virtual void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) = 0;
  // In-place rotate-half RoPE on x[n, n_heads, head_dim] with positions[n] and inv_freq[head_dim/2].
  virtual void rope(TensorView& x, const int32_t* positions, const float* inv_freq) = 0;
  // out[n, d] = silu(gate) * up
  virtual void silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) = 0;
  // y += x (same shape)
  virtual void add(TensorView& y, const TensorView& x) = 0;
  // out[n, d] = table[ids[n], :] (table in any float dtype)
  virtual void embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) = 0;
  // Writes rows[i] into the paged cache at token slot slots[i].
  virtual void store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) = 0;
  // Causal attention of one sequence over its paged cache (see AttentionParams).
  virtual void attention(const AttentionParams& p) = 0;
};

// The CPU backend with `n_threads` threads (0: all cores).
std::unique_ptr<Backend> make_cpu_backend(int n_threads = 0);

}  // namespace lragent
