#include "kv/block_pool.h"

#include <cstdlib>
#include <new>

namespace lragent {

Result<std::unique_ptr<BlockPool>> BlockPool::create(std::string name, int n_layers, int page_size, int64_t width,
                                                     int64_t n_blocks, Backend* backend) {
  if (n_layers <= 0 || page_size <= 0 || width <= 0 || n_blocks <= 0 || n_blocks > INT32_MAX)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV pool '{}': invalid geometry (layers {}, page size {}, width {}, blocks {})", name, n_layers,
                      page_size, width, n_blocks);
  std::unique_ptr<BlockPool> p(new BlockPool());
  p->name_ = std::move(name);
  p->n_layers_ = n_layers;
  p->page_size_ = page_size;
  p->width_ = width;
  p->n_blocks_ = n_blocks;
  const std::vector<int64_t> shape = {n_layers, n_blocks, page_size, width};
  const DType dtype = backend ? backend->cache_dtype() : DType::kF32;
  const double mib = static_cast<double>(n_layers) * static_cast<double>(n_blocks) * page_size * static_cast<double>(width) *
                     static_cast<double>(dtype_size(dtype)) / (1 << 20);
  if (backend) {
    p->storage_ = backend->alloc(dtype, shape);
  } else {
    const size_t bytes = static_cast<size_t>(n_layers) * static_cast<size_t>(n_blocks) * page_size * width * 4;
    void* mem = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (mem) p->storage_ = Tensor::adopt(TensorView(DType::kF32, shape, mem), &std::free);
  }
  if (!p->storage_.view().data)
    return make_error(ErrorCode::kOutOfMemory,
                      "KV pool '{}': cannot allocate {:.1f} MiB on {}; lower --max-context (or --kv-budget)", p->name_,
                      mib, backend ? backend->name() : std::string("the host"));
  p->refs_.assign(static_cast<size_t>(n_blocks), 0);
  p->free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks; b-- > 0;) p->free_.push_back(static_cast<int32_t>(b));
  return p;
}

Result<int32_t> BlockPool::allocate() {
  if (free_.empty())
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache '{}' exhausted: all {} blocks of {} tokens are in use; raise the KV budget "
                      "(--max-context, or --kv-budget in bench) or shorten the context",
                      name_, n_blocks_, page_size_);
  int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  assert(refs_[static_cast<size_t>(block)] > 0 && "retain of a free block");
  ++refs_[static_cast<size_t>(block)];
}

void BlockPool::release(int32_t block) {
  assert(refs_[static_cast<size_t>(block)] > 0 && "release of a free block (double free)");
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

PagedView BlockPool::layer_view(int layer, const int32_t* table) const {
  PagedView v;
  const TensorView& st = storage_.view();
  v.dtype = st.dtype;
  v.data = static_cast<char*>(st.data) +
           static_cast<size_t>(layer) * static_cast<size_t>(n_blocks_) * page_size_ * width_ * dtype_size(st.dtype);
  v.table = table;
  v.page_size = page_size_;
  v.row_stride = width_;
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
                      "raise the KV budget (--max-context, or --kv-budget in bench) or shorten the context",
                      pool_->name(), n_tokens, need - static_cast<int64_t>(table_.size()), pool_->page_size(),
                      pool_->free_blocks());
  while (static_cast<int64_t>(table_.size()) < need) {
    LRA_ASSIGN_OR_RETURN(int32_t b, pool_->allocate());
    table_.push_back(b);
  }
  return Status::Ok();
}

void PagedStream::clear() {
  if (pool_)
    for (int32_t b : table_) pool_->release(b);
  table_.clear();
}

}  // namespace lragent
