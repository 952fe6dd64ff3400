#include "kv/block_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace lragent {

int64_t BlockPool::arena_bytes_for(int n_layers, int64_t footprint, int64_t n_blocks, int64_t slab_bytes) {
  const int64_t per_slab = std::max<int64_t>(blocks_per_slab(n_layers, footprint, slab_bytes), 1);
  return (n_blocks + per_slab - 1) / per_slab * slab_bytes;
}

Result<std::unique_ptr<BlockPool>> BlockPool::create(std::string name, int n_layers, int page_size, int64_t width,
                                                     KvArena* arena) {
  if (!arena) return make_error(ErrorCode::kInvalidArgument, "KV pool '{}': no arena to draw blocks from", name);
  if (n_layers <= 0 || page_size <= 0 || width <= 0)
    return make_error(ErrorCode::kInvalidArgument, "KV pool '{}': invalid geometry (layers {}, page size {}, width {})",
                      name, n_layers, page_size, width);
  const int64_t footprint = footprint_for(n_layers, page_size, width, arena->dtype());
  if (blocks_per_slab(n_layers, footprint, arena->slab_bytes()) < 1)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV pool '{}': a block of {} bytes ({} layers x {} tokens x {} values) does not fit the "
                      "arena's {}-byte slabs; create the arena with KvArena::slab_for(block footprint)",
                      name, footprint, n_layers, page_size, width, arena->slab_bytes());
  std::unique_ptr<BlockPool> p(new BlockPool());
  p->arena_ = arena;
  p->name_ = std::move(name);
  p->n_layers_ = n_layers;
  p->page_size_ = page_size;
  p->width_ = width;
  p->granules_per_block_ = footprint / n_layers / KvArena::kGranule;
  p->slab_granules_ = arena->slab_bytes() / KvArena::kGranule;
  p->plane_bytes_ = arena->slab_bytes() / n_layers / KvArena::kGranule * KvArena::kGranule;
  p->blocks_per_slab_ = blocks_per_slab(n_layers, footprint, arena->slab_bytes());
  arena->attach(p.get());
  return p;
}

Result<std::unique_ptr<BlockPool>> BlockPool::create(std::string name, int n_layers, int page_size, int64_t width,
                                                     int64_t n_blocks, Backend* backend) {
  if (n_layers <= 0 || page_size <= 0 || width <= 0 || n_blocks <= 0 || n_blocks > INT32_MAX)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV pool '{}': invalid geometry (layers {}, page size {}, width {}, blocks {})", name, n_layers,
                      page_size, width, n_blocks);
  const DType dtype = backend ? backend->cache_dtype() : DType::kF32;
  const int64_t fp = footprint_for(n_layers, page_size, width, dtype);
  const int64_t slab = KvArena::slab_for(fp, fp * n_blocks, 1);
  LRA_ASSIGN_OR_RETURN(auto arena, KvArena::create(arena_bytes_for(n_layers, fp, n_blocks, slab), backend, slab));
  LRA_ASSIGN_OR_RETURN(auto pool, create(std::move(name), n_layers, page_size, width, arena.get()));
  pool->own_arena_ = std::move(arena);
  pool->set_max_blocks(n_blocks);
  return pool;
}

BlockPool::~BlockPool() {
  assert(used_ == 0 && "BlockPool destroyed while streams still hold blocks: destroy them first");
  for (const auto& [slab, st] : slabs_) arena_->give_slab(slab);
  slabs_.clear();
  arena_->detach(this);
}

Result<int32_t> BlockPool::allocate() {
  if (max_blocks_ > 0 && used_ >= max_blocks_)
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache '{}' exhausted: all {} blocks of {} tokens are in use; raise the KV budget "
                      "(--max-context or --kv-memory, or --kv-budget in bench) or shorten the context",
                      name_, max_blocks_, page_size_);
  if (with_free_.empty()) {
    LRA_ASSIGN_OR_RETURN(int64_t slab, arena_->take_slab(name_));
    Slab& st = slabs_[slab];
    st.refs.assign(static_cast<size_t>(blocks_per_slab_), 0);
    st.free.reserve(static_cast<size_t>(blocks_per_slab_));
    for (int64_t i = blocks_per_slab_; i-- > 0;) st.free.push_back(static_cast<int32_t>(i));  // slot 0 on top
    with_free_.insert(slab);
    free_in_slabs_ += blocks_per_slab_;
  }
  const int64_t slab = *with_free_.begin();
  Slab& st = slabs_.at(slab);
  const int32_t slot = st.free.back();
  st.free.pop_back();
  if (st.free.empty()) with_free_.erase(slab);
  st.refs[static_cast<size_t>(slot)] = 1;
  --free_in_slabs_;
  ++used_;
  return block_id(slab, slot);
}

int BlockPool::refcount(int32_t block) const {
  const int64_t slab = slab_of(block);
  const auto it = slabs_.find(slab);
  return it == slabs_.end() ? 0 : it->second.refs[static_cast<size_t>(slot_of(block, slab))];
}

void BlockPool::retain(int32_t block) {
  const int64_t slab = slab_of(block);
  int32_t& r = slabs_.at(slab).refs[static_cast<size_t>(slot_of(block, slab))];
  assert(r > 0 && "retain of a free block");
  ++r;
}

void BlockPool::release(int32_t block) {
  const int64_t slab = slab_of(block);
  Slab& st = slabs_.at(slab);
  const int32_t slot = slot_of(block, slab);
  int32_t& r = st.refs[static_cast<size_t>(slot)];
  assert(r > 0 && "release of a free block (double free)");
  if (--r > 0) return;
  st.free.push_back(slot);
  ++free_in_slabs_;
  --used_;
  if (static_cast<int64_t>(st.free.size()) < blocks_per_slab_) {
    with_free_.insert(slab);
    return;
  }
  // Every block of the slab is free: the memory goes back to the arena for any pool to use.
  free_in_slabs_ -= blocks_per_slab_;
  with_free_.erase(slab);
  slabs_.erase(slab);
  arena_->give_slab(slab);
}

PagedView BlockPool::layer_view(int layer, const int32_t* table) const {
  PagedView v;
  v.dtype = arena_->dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(v.dtype));
  // Block b's layer-0 rows start at base + b · kGranule bytes; layer l's are plane_bytes_ further.
  v.data = arena_->base() + static_cast<int64_t>(layer) * plane_bytes_;
  v.table = table;
  v.page_size = page_size_;
  v.row_stride = width_;
  v.block_stride = KvArena::kGranule / es;
  return v;
}

PagedStream::PagedStream(PagedStream&& o) noexcept : pool_(o.pool_), table_(std::move(o.table_)) { o.table_.clear(); }

PagedStream& PagedStream::operator=(PagedStream&& o) noexcept {
  if (this != &o) {
    clear();
    pool_ = o.pool_;
    table_ = std::move(o.table_);
    o.table_.clear();
  }
  return *this;
}

Status PagedStream::reserve(int64_t n_tokens) {
  assert(pool_ && "reserve on a stream without a pool");
  const int64_t need = (n_tokens + pool_->page_size() - 1) / pool_->page_size();
  if (need - static_cast<int64_t>(table_.size()) > pool_->free_blocks())
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache '{}' exhausted: {} tokens need {} more blocks of {} tokens but only {} are free; "
                      "raise the KV budget (--max-context or --kv-memory, or --kv-budget in bench) or shorten the context ({})",
                      pool_->name(), n_tokens, need - static_cast<int64_t>(table_.size()), pool_->page_size(),
                      pool_->free_blocks(), pool_->arena().summary());
  while (static_cast<int64_t>(table_.size()) < need) {
    LRA_ASSIGN_OR_RETURN(int32_t b, pool_->allocate());
    table_.push_back(b);
  }
  return Status::Ok();
}

void PagedStream::release_beyond(int64_t n_tokens) {
  if (!pool_) return;
  const auto keep = static_cast<size_t>(std::max<int64_t>(0, (n_tokens + pool_->page_size() - 1) / pool_->page_size()));
  while (table_.size() > keep) {
    pool_->release(table_.back());
    table_.pop_back();
  }
}

void PagedStream::clear() {
  if (pool_)
    for (int32_t b : table_) pool_->release(b);
  table_.clear();
}

Status copy_rows(const PagedStream& src, PagedStream& dst, int64_t n_tokens) {
  if (n_tokens <= 0) return Status::Ok();
  const BlockPool* sp = src.pool();
  const BlockPool* dp = dst.pool();
  if (!sp || !dp || sp->n_layers() != dp->n_layers() || sp->page_size() != dp->page_size() ||
      sp->width() != dp->width() || sp->dtype() != dp->dtype())
    return make_error(ErrorCode::kInvalidArgument, "KV copy: pools '{}' and '{}' differ in geometry or dtype",
                      sp ? sp->name() : "(none)", dp ? dp->name() : "(none)");
  if (src.capacity() < n_tokens || dst.capacity() < n_tokens)
    return make_error(ErrorCode::kInvalidArgument, "KV copy of {} rows: the source holds {}, the destination {}",
                      n_tokens, src.capacity(), dst.capacity());
  Backend* be = sp->arena().backend();
  if (be != dp->arena().backend())
    return make_error(ErrorCode::kInvalidArgument, "KV copy: pools '{}' and '{}' live on different devices",
                      sp->name(), dp->name());
  const DType dt = sp->dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t block_rows_bytes = static_cast<int64_t>(sp->page_size()) * sp->width() * es;  // one layer of a block
  const size_t n_blocks = static_cast<size_t>((n_tokens + sp->page_size() - 1) / sp->page_size());
  const std::vector<int32_t>& st = src.table();
  const std::vector<int32_t>& dt_table = dst.table();
  // A block's rows of one layer take `step` granules; block b + step follows block b in memory
  // (block ids count granules from the arena's start, layer planes at a fixed offset).
  const int32_t s_step = static_cast<int32_t>((block_rows_bytes + KvArena::kGranule - 1) / KvArena::kGranule);
  for (int l = 0; l < sp->n_layers(); ++l) {
    const PagedView sv = sp->layer_view(l, st.data());
    const PagedView dv = dp->layer_view(l, dt_table.data());
    for (size_t i = 0; i < n_blocks;) {
      size_t j = i + 1;  // [i, j): a run consecutive in both pools
      while (j < n_blocks && st[j] == st[j - 1] + s_step && dt_table[j] == dt_table[j - 1] + s_step) ++j;
      const int64_t bytes = static_cast<int64_t>(j - i - 1) * s_step * KvArena::kGranule + block_rows_bytes;
      const char* from = static_cast<const char*>(sv.data) + static_cast<int64_t>(st[i]) * KvArena::kGranule;
      char* to = static_cast<char*>(dv.data) + static_cast<int64_t>(dt_table[i]) * KvArena::kGranule;
      if (!be) {
        std::memcpy(to, from, static_cast<size_t>(bytes));
      } else {
        const TensorView s(dt, {bytes / es}, const_cast<char*>(from), be->device());
        TensorView d(dt, {bytes / es}, to, be->device());
        be->copy(s, d);
      }
      i = j;
    }
  }
  return Status::Ok();
}

}  // namespace lragent
