// Paged storage for per-token cache rows (K, V, low-rank rows, ...). A pool holds
// n_blocks blocks; each block stores `page_size` token rows of `width` floats for every
// layer. A sequence's rows live in a PagedStream: a block table into one pool. The storage
// is host f32, or the memory of a backend in its cache_dtype() (bf16 on a GPU).
// Blocks are reference-counted so streams can share prefixes (copy-on-write happens above).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"

namespace lragent {

class BlockPool {
 public:
  // Allocates n_blocks * n_layers * page_size * width values up front, as vLLM does, so
  // running out is an explicit, reportable event rather than a failed malloc mid-step.
  // backend null: host f32; else the backend's memory in its cache_dtype().
  static Result<std::unique_ptr<BlockPool>> create(std::string name, int n_layers, int page_size, int64_t width,
                                                   int64_t n_blocks, Backend* backend = nullptr);

  ~BlockPool() { assert(used_blocks() == 0 && "BlockPool destroyed while streams still hold blocks: destroy them first"); }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const std::string& name() const { return name_; }
  int page_size() const { return page_size_; }
  int64_t width() const { return width_; }
  int n_layers() const { return n_layers_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return n_blocks_ - free_blocks(); }
  DType dtype() const { return storage_.view().dtype; }
  // Bytes of one block across all layers.
  size_t block_bytes() const { return static_cast<size_t>(n_layers_) * page_size_ * width_ * dtype_size(dtype()); }
  size_t total_bytes() const { return block_bytes() * static_cast<size_t>(n_blocks_); }

  Result<int32_t> allocate();  // refcount 1; kOutOfMemory when the pool is exhausted
  void retain(int32_t block);
  void release(int32_t block);  // frees at refcount 0
  int refcount(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

  // View of `layer` through a block table.
  PagedView layer_view(int layer, const int32_t* table) const;

 private:
  BlockPool() = default;
  std::string name_;
  int n_layers_ = 0, page_size_ = 0;
  int64_t width_ = 0, n_blocks_ = 0;
  Tensor storage_;  // [n_layers, n_blocks, page_size, width] f32 (host) or cache dtype (backend)
  std::vector<int32_t> refs_;      // [n_blocks]
  std::vector<int32_t> free_;      // stack of free block ids
};

// The backend a pool should allocate from: null (host f32) for the CPU backend.
inline Backend* pool_backend(Backend& be) { return be.device() == Device::kCpu ? nullptr : &be; }

// One sequence's rows in a pool. Owns references to its blocks.
class PagedStream {
 public:
  PagedStream() = default;
  explicit PagedStream(BlockPool* pool) : pool_(pool) {}
  ~PagedStream() { clear(); }
  PagedStream(PagedStream&& o) noexcept;
  PagedStream& operator=(PagedStream&& o) noexcept;
  PagedStream(const PagedStream&) = delete;
  PagedStream& operator=(const PagedStream&) = delete;

  // Ensures room for n_tokens rows. On failure nothing already stored is lost.
  Status reserve(int64_t n_tokens);
  int64_t capacity() const { return static_cast<int64_t>(table_.size()) * (pool_ ? pool_->page_size() : 0); }
  PagedView view(int layer) const { return pool_->layer_view(layer, table_.data()); }
  void clear();
  BlockPool* pool() const { return pool_; }
  const std::vector<int32_t>& table() const { return table_; }

 private:
  BlockPool* pool_ = nullptr;
  std::vector<int32_t> table_;
};

}  // namespace lragent
