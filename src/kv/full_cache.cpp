#include "kv/full_cache.h"

#include <algorithm>
#include <vector>

namespace lragent {

Result<KvPools> KvPools::create(const ModelConfig& cfg, int page_size, int64_t n_blocks, const std::string& name,
                                Backend* backend) {
  const int64_t width = static_cast<int64_t>(cfg.num_kv_heads) * cfg.head_dim;
  if (n_blocks <= 0)
    return make_error(ErrorCode::kInvalidArgument, "KV pools '{}': {} blocks requested; need at least 1", name, n_blocks);
  const int planes = 2 * cfg.num_layers;  // K planes, then V planes
  const int64_t fp = BlockPool::footprint_for(planes, page_size, width, backend ? backend->cache_dtype() : DType::kF32);
  const int64_t slab = KvArena::slab_for(fp, fp * n_blocks, 1);
  KvPools p;
  LRA_ASSIGN_OR_RETURN(p.arena, KvArena::create(BlockPool::arena_bytes_for(planes, fp, n_blocks, slab), backend, slab));
  LRA_ASSIGN_OR_RETURN(p.kv, BlockPool::create(name + ".kv", planes, page_size, width, p.arena.get()));
  p.kv->set_max_blocks(n_blocks);  // exactly n_blocks, as asked
  return p;
}

Status FullKvCache::reserve(int64_t total_tokens) {
  return kv_.reserve(total_tokens);
}

void FullKvCache::write(Backend& be, const LayerKvRows& rows) {
  std::vector<int32_t> slots(static_cast<size_t>(rows.n));  // [n] positions of the new rows
  for (int64_t i = 0; i < rows.n; ++i) slots[static_cast<size_t>(i)] = static_cast<int32_t>(rows.start_pos + i);
  const int64_t width = kv_.pool()->width();
  TensorView kr(DType::kF32, {rows.n, width}, const_cast<float*>(rows.k_full));
  TensorView vr(DType::kF32, {rows.n, width}, const_cast<float*>(rows.v_full));
  const Backend::StoreJob jobs[] = {{kr, kv_k_view(kv_, rows.layer), slots.data()},
                                      {vr, kv_v_view(kv_, rows.layer), slots.data()}};
  be.store_rows_multi(jobs);
  if (rows.start_pos + rows.n > n_tokens_) n_tokens_ = rows.start_pos + rows.n;
}

void FullKvCache::truncate(int64_t tokens) {
  if (tokens >= n_tokens_) return;
  n_tokens_ = std::max<int64_t>(tokens, 0);
  kv_.release_beyond(n_tokens_);
}

void FullKvCache::attention_views(int layer, AttentionParams& p) const {
  p.k = kv_k_view(kv_, layer);
  p.v = kv_v_view(kv_, layer);
  p.n_ctx = static_cast<int>(n_tokens_);
}

}  // namespace lragent
