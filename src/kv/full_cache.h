// A private full KV cache for one sequence: K = RoPE(x·(W_k + s·A_k·B_k)), V likewise.
// This is the layout every engine uses and the Non-Shared reference of the sharing modes.
#pragma once

#include <memory>

#include "kv/block_pool.h"
#include "kv/kv_binding.h"
#include "model/config.h"

namespace lragent {

// The K/V pool sized for a model: 2 · n_layers planes of [page_size, n_kv_heads * head_dim] rows
// per block (K planes, then V planes: kv_k_view / kv_v_view), in an arena that holds n_blocks.
struct KvPools {
  std::unique_ptr<KvArena> arena;  // declared first: destroyed after the pool
  std::unique_ptr<BlockPool> kv;
  static Result<KvPools> create(const ModelConfig& cfg, int page_size, int64_t n_blocks, const std::string& name,
                                Backend* backend = nullptr);
  // Blocks needed for `n_seqs` sequences of up to `max_tokens` tokens each.
  static int64_t blocks_for(int64_t n_seqs, int64_t max_tokens, int page_size) {
    return n_seqs * ((max_tokens + page_size - 1) / page_size);
  }
};

class FullKvCache final : public KvBinding {
 public:
  explicit FullKvCache(BlockPool* kv_pool) : kv_(kv_pool) {}  // a pool of 2 · n_layers planes
  Status reserve(int64_t total_tokens) override;
  void write(Backend& be, const LayerKvRows& rows) override;
  void attention_views(int layer, AttentionParams& p) const override;
  int64_t n_tokens() const { return n_tokens_; }
  // Forgets the entries at positions >= tokens and gives back the blocks past them (a pass's
  // speculative drafts that were not kept).
  void truncate(int64_t tokens);

 private:
  PagedStream kv_;  // K planes then V planes
  int64_t n_tokens_ = 0;  // positions [0, n_tokens_) hold entries
};

}  // namespace lragent
