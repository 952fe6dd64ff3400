#include "kv/block_pool.h"

#include <algorithm>
#include <cassert>
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
  // Detached first, so that a slab whose blocks other pools' streams still hold goes to one of
  // them (KvArena::disown), not back to us.
  arena_->detach(this);
  for (const auto& [slab, st] : slabs_) arena_->disown(slab, *this);
  slabs_.clear();
}

Result<int32_t> BlockPool::allocate() {
  if (max_blocks_ > 0 && used_ >= max_blocks_)
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache '{}' exhausted: all {} blocks of {} tokens are in use; raise the KV budget "
                      "(--max-context or --kv-memory, or --kv-budget in bench) or shorten the context",
                      name_, max_blocks_, page_size_);
  if (with_free_.empty()) {
    LRA_ASSIGN_OR_RETURN(int64_t slab, arena_->take_slab(name_));
    arena_->lend(slab, this, granules_per_block_, blocks_per_slab_);
    Slab& st = slabs_[slab];
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
  KvArena::LentSlab& ls = arena_->lent_.at(slab);
  ls.refs[static_cast<size_t>(slot)] = 1;
  ++ls.live;
  --free_in_slabs_;
  ++used_;
  return block_id(slab, slot);
}

void BlockPool::retain(int32_t block) {
  arena_->retain(block);
  ++used_;
}

void BlockPool::release(int32_t block) {
  assert(used_ > 0 && "release without a reference of this pool's");
  --used_;
  arena_->release(block);
}

void BlockPool::slot_freed(int64_t slab, int32_t slot) {
  Slab& st = slabs_.at(slab);
  st.free.push_back(slot);
  ++free_in_slabs_;
  if (static_cast<int64_t>(st.free.size()) < blocks_per_slab_) {
    with_free_.insert(slab);
    return;
  }
  // Every block of the slab is free: the memory goes back to the arena for any pool to use.
  free_in_slabs_ -= blocks_per_slab_;
  with_free_.erase(slab);
  slabs_.erase(slab);
  arena_->unlend(slab);
}

void BlockPool::adopt(int64_t slab, std::vector<int32_t> free_slots) {
  assert(static_cast<int64_t>(free_slots.size()) < blocks_per_slab_ && "an adopted slab has a held block");
  const int64_t n_free = static_cast<int64_t>(free_slots.size());
  slabs_[slab].free = std::move(free_slots);
  free_in_slabs_ += n_free;
  if (n_free > 0) with_free_.insert(slab);
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

namespace {

// Copies every layer's rows of blocks s_ids[i] of pool sp into blocks d_ids[i] of pool dp (i <
// n_blocks), runs of blocks consecutive in both pools in one copy per layer. Same geometry and
// device (callers check).
void copy_blocks(const BlockPool& sp, const int32_t* s_ids, const BlockPool& dp, const int32_t* d_ids, size_t n_blocks) {
  Backend* be = sp.arena().backend();
  const DType dt = sp.dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t block_rows_bytes = static_cast<int64_t>(sp.page_size()) * sp.width() * es;  // one layer of a block
  // A block's rows of one layer take `step` granules; block b + step follows block b in memory
  // (block ids count granules from the arena's start, layer planes at a fixed offset).
  const int32_t step = static_cast<int32_t>((block_rows_bytes + KvArena::kGranule - 1) / KvArena::kGranule);
  for (int l = 0; l < sp.n_layers(); ++l) {
    const PagedView sv = sp.layer_view(l, s_ids);
    const PagedView dv = dp.layer_view(l, d_ids);
    for (size_t i = 0; i < n_blocks;) {
      size_t j = i + 1;  // [i, j): a run consecutive in both pools
      while (j < n_blocks && s_ids[j] == s_ids[j - 1] + step && d_ids[j] == d_ids[j - 1] + step) ++j;
      const int64_t bytes = static_cast<int64_t>(j - i - 1) * step * KvArena::kGranule + block_rows_bytes;
      const char* from = static_cast<const char*>(sv.data) + static_cast<int64_t>(s_ids[i]) * KvArena::kGranule;
      char* to = static_cast<char*>(dv.data) + static_cast<int64_t>(d_ids[i]) * KvArena::kGranule;
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
}

}  // namespace

Status PagedStream::share_prefix(const PagedStream& src, int64_t n_tokens) {
  assert(pool_ && "share_prefix on a stream without a pool");
  if (!table_.empty()) return make_error(ErrorCode::kInvalidArgument, "KV share: the stream already holds blocks");
  if (n_tokens <= 0) return Status::Ok();
  if (!src.pool() || !pool_->same_geometry(*src.pool()))
    return make_error(ErrorCode::kInvalidArgument, "KV share: pools '{}' and '{}' differ in arena or geometry",
                      src.pool() ? src.pool()->name() : "(none)", pool_->name());
  if (src.capacity() < n_tokens)
    return make_error(ErrorCode::kInvalidArgument, "KV share of {} rows: the source holds {}", n_tokens,
                      src.capacity());
  const int64_t page = pool_->page_size(), whole = n_tokens / page;
  const bool tail = n_tokens % page != 0;
  // Shared blocks take no memory but count against a cap (a fork holds as much as a copy would).
  if (pool_->max_blocks() > 0 && pool_->max_blocks() - pool_->used_blocks() < whole + (tail ? 1 : 0))
    return make_error(ErrorCode::kOutOfMemory, "KV cache '{}' exhausted: sharing {} rows needs {} of its {} blocks",
                      pool_->name(), n_tokens, whole + (tail ? 1 : 0), pool_->max_blocks());
  for (int64_t i = 0; i < whole; ++i) {
    pool_->retain(src.table()[static_cast<size_t>(i)]);
    table_.push_back(src.table()[static_cast<size_t>(i)]);
  }
  if (tail) {
    auto b = pool_->allocate();
    if (!b.ok()) {
      clear();
      return b.error();
    }
    table_.push_back(*b);
    copy_blocks(*src.pool(), src.table().data() + whole, *pool_, &table_.back(), 1);
  }
  return Status::Ok();
}

bool PagedStream::shares_row(int64_t t) const {
  if (!pool_ || t < 0) return false;
  const auto i = static_cast<size_t>(t / pool_->page_size());
  return i < table_.size() && pool_->refcount(table_[i]) > 1;
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
  const size_t n_blocks = static_cast<size_t>((n_tokens + sp->page_size() - 1) / sp->page_size());
  copy_blocks(*sp, src.table().data(), *dp, dst.table().data(), n_blocks);
  return Status::Ok();
}

}  // namespace lragent
