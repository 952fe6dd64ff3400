// How one sequence's forward pass reads and writes its KV cache. The model computes, for
// the sequence's new tokens, every kind of cache entry a sharing mode may want; the
// binding stores the ones its mode keeps and describes what attention reads.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/result.h"

namespace lragent {

// Per-layer cache material for one sequence's new rows (n rows at positions start_pos...).
struct LayerKvRows {
  int layer = 0;
  int64_t start_pos = 0;
  int64_t n = 0;
  const float* k_base = nullptr;  // [n, n_kv_heads * head_dim] RoPE(x·W_k + b_k)
  const float* v_base = nullptr;  // [n, n_kv_heads * head_dim] x·W_v + b_v
  const float* k_full = nullptr;  // [n, n_kv_heads * head_dim] RoPE(x·(W_k + s·A_k·B_k)); null unless wants_full()
  const float* v_full = nullptr;  // [n, n_kv_heads * head_dim] x·(W_v + s·A_v·B_v); null unless wants_full()
  const float* lr_k = nullptr;    // [n, rank_k] x·A_k (pre-RoPE), null when k is not adapted
  const float* lr_v = nullptr;    // [n, rank_v] x·A_v, null when v is not adapted
  int rank_k = 0, rank_v = 0;
};

class KvBinding {
 public:
  virtual ~KvBinding() = default;
  // Called once before the forward: room for `total_tokens` positions in every stream it writes.
  virtual Status reserve(int64_t total_tokens) = 0;
  // Stores this layer's entries for the new rows (the mode decides which).
  virtual void write(Backend& be, const LayerKvRows& rows) = 0;
  // Fills k, v, k_lr, v_lr and n_ctx of `p` for this layer (queries are filled by the model).
  virtual void attention_views(int layer, AttentionParams& p) const = 0;
  // Whether this binding stores full entries. When no binding of a batch does, the model skips
  // expanding them and LayerKvRows::k_full / v_full are null.
  virtual bool wants_full() const { return true; }
};

}  // namespace lragent
