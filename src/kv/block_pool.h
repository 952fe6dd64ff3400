// Paged storage for per-token cache rows (K, V, low-rank rows, ...). A pool hands out blocks;
// each block stores `page_size` token rows of `width` values for every layer of the pool. Blocks
// come from a KvArena (kv_arena.h), shared by every pool of a trajectory or engine, in the
// arena's dtype (host f32, or a backend's cache_dtype(), bf16 on a GPU). A sequence's rows live
// in a PagedStream: a block table into one pool. Blocks are reference-counted so streams can
// share prefixes.
//
// Layout inside a slab the pool holds: one plane per layer, [n_layers][blocks_per_slab][page_size,
// width] (each block's layer rows rounded up to KvArena::kGranule). A layer's rows of the blocks
// of one slab are contiguous, so reading one layer of a long context touches few memory pages
// (the GPU's TLB) instead of a sliver of every block. Block b's rows of layer l start at
// base + l · plane_bytes + b · kGranule, the same plane offset for every slab of the pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "kv/kv_arena.h"

namespace lragent {

class BlockPool {
 public:
  // A pool drawing from `arena` (which must outlive it). Its blocks must fit in one slab.
  static Result<std::unique_ptr<BlockPool>> create(std::string name, int n_layers, int page_size, int64_t width,
                                                   KvArena* arena);
  // A pool with an arena of its own that holds exactly n_blocks blocks (single caches, tests).
  // backend null: host f32; else the backend's memory in its cache_dtype().
  static Result<std::unique_ptr<BlockPool>> create(std::string name, int n_layers, int page_size, int64_t width,
                                                   int64_t n_blocks, Backend* backend = nullptr);
  // Bytes of one block of this geometry (all layers: what its rows hold).
  static int64_t block_bytes_for(int n_layers, int page_size, int64_t width, DType dtype) {
    return static_cast<int64_t>(n_layers) * page_size * width * static_cast<int64_t>(dtype_size(dtype));
  }
  // Slab bytes one block takes (its layer rows rounded up to the granule): the smallest slab.
  static int64_t footprint_for(int n_layers, int page_size, int64_t width, DType dtype) {
    const int64_t layer = static_cast<int64_t>(page_size) * width * static_cast<int64_t>(dtype_size(dtype));
    return n_layers * ((layer + KvArena::kGranule - 1) / KvArena::kGranule * KvArena::kGranule);
  }
  // Blocks of this footprint one slab holds, and the arena bytes (whole slabs) for n_blocks.
  static int64_t blocks_per_slab(int n_layers, int64_t footprint, int64_t slab_bytes) {
    const int64_t plane = slab_bytes / n_layers / KvArena::kGranule * KvArena::kGranule;
    return plane / (footprint / n_layers);
  }
  static int64_t arena_bytes_for(int n_layers, int64_t footprint, int64_t n_blocks, int64_t slab_bytes);

  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const std::string& name() const { return name_; }
  int page_size() const { return page_size_; }
  int64_t width() const { return width_; }
  int n_layers() const { return n_layers_; }
  DType dtype() const { return arena_->dtype(); }
  KvArena& arena() const { return *arena_; }
  // Block references this pool's streams hold: blocks it allocated and, for a fork's streams,
  // blocks of other pools of the arena they share (share_prefix). Caps (set_max_blocks) count these.
  int64_t used_blocks() const { return used_; }
  // Blocks this pool can still hand out: free ones in its slabs plus the arena's free slabs
  // (which other pools of the arena may take first), within its cap.
  int64_t free_blocks() const {
    const int64_t avail = free_in_slabs_ + arena_->free_slabs() * blocks_per_slab_;
    return max_blocks_ > 0 ? std::min(avail, max_blocks_ - used_) : avail;
  }
  // At most n blocks in use at once (0: no cap, the arena is the limit). A trajectory sized by
  // --max-context caps each pool so that every cache holds exactly that many tokens.
  void set_max_blocks(int64_t n) { max_blocks_ = n; }
  int64_t max_blocks() const { return max_blocks_; }
  int64_t held_slabs() const { return static_cast<int64_t>(slabs_.size()); }
  // Free blocks in the slabs this pool holds (taken before the arena's free slabs).
  int64_t free_in_slabs() const { return free_in_slabs_; }
  int64_t blocks_per_slab() const { return blocks_per_slab_; }
  // Bytes of one block across all layers.
  size_t block_bytes() const { return static_cast<size_t>(block_bytes_for(n_layers_, page_size_, width_, dtype())); }

  Result<int32_t> allocate();  // refcount 1; kOutOfMemory when the arena is exhausted
  // A reference for one of this pool's streams to `block`, which any pool of the arena with this
  // pool's geometry may have allocated.
  void retain(int32_t block);
  // Drops a reference taken by allocate() or retain(); at refcount 0 the block is free again in
  // the pool that allocated it, and an emptied slab goes back to the arena.
  void release(int32_t block);
  int refcount(int32_t block) const { return arena_->refcount(block); }
  // Whether `other` lays blocks out as this pool does (one arena, layers, page size, width): its
  // blocks can then sit in this pool's streams.
  bool same_geometry(const BlockPool& other) const {
    return arena_ == other.arena_ && n_layers_ == other.n_layers_ && page_size_ == other.page_size_ &&
           width_ == other.width_;
  }

  // View of `layer` through a block table.
  PagedView layer_view(int layer, const int32_t* table) const;

 private:
  friend class KvArena;
  BlockPool() = default;
  // KvArena::release: the last reference to slot `slot` of our slab `slab` is gone.
  void slot_freed(int64_t slab, int32_t slot);
  // KvArena::disown: `slab`, lent to a destroyed pool of our geometry with some blocks still held,
  // is ours now; `free_slots` (a stack) are its free blocks, handed out like those of our own slabs.
  void adopt(int64_t slab, std::vector<int32_t> free_slots);
  struct Slab {
    std::vector<int32_t> free;  // stack of free block slots (the arena keeps the reference counts)
  };
  int32_t block_id(int64_t slab, int32_t slot) const {
    return static_cast<int32_t>(slab * slab_granules_ + static_cast<int64_t>(slot) * granules_per_block_);
  }

  std::unique_ptr<KvArena> own_arena_;  // set by the n_blocks create(); destroyed last
  KvArena* arena_ = nullptr;
  std::string name_;
  int n_layers_ = 0, page_size_ = 0;
  int64_t width_ = 0;
  int64_t granules_per_block_ = 0;  // of one layer's rows of a block
  int64_t slab_granules_ = 0, blocks_per_slab_ = 0;
  int64_t plane_bytes_ = 0;         // offset from layer l's rows to layer l + 1's, in every slab
  std::unordered_map<int64_t, Slab> slabs_;  // by arena slab index
  std::set<int64_t> with_free_;              // held slabs with a free block (lowest first)
  int64_t used_ = 0, free_in_slabs_ = 0;  // used_: references held (used_blocks)
  int64_t max_blocks_ = 0;  // 0: no cap
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
  // Frees the blocks past those that n_tokens rows need (the rows kept are untouched).
  void release_beyond(int64_t n_tokens);
  // Starts this stream, which must hold no blocks, with src's first n_tokens rows: src's whole
  // blocks below them shared (retained: no writer touches them again, every one appends past its
  // rows), a partial last block copied into a block of this stream's own, which it may go on
  // writing. src's pool must have this pool's geometry (BlockPool::same_geometry). On error
  // (kInvalidArgument, kOutOfMemory) this stream is left empty.
  Status share_prefix(const PagedStream& src, int64_t n_tokens);
  // Whether the block holding row `t` is shared with another stream (refcount > 1).
  bool shares_row(int64_t t) const;
  BlockPool* pool() const { return pool_; }
  const std::vector<int32_t>& table() const { return table_; }

 private:
  BlockPool* pool_ = nullptr;
  std::vector<int32_t> table_;
};

// Copies the first n_tokens rows of every layer of `src` into `dst`, a stream of another pool of
// the same geometry (layers, page size, width, dtype) that already holds blocks for them
// (reserve): a trajectory started from another's prefix gets those entries without computing
// them. Rows of consecutive blocks go in one copy per layer; on a backend the copies are queued
// on its stream behind the passes issued before (both arenas must be that backend's memory).
// The rows past n_tokens in its last block are copied too (they are dst's, never read before
// they are written). Errors: geometries differ, or a stream holds fewer rows (kInvalidArgument).
Status copy_rows(const PagedStream& src, PagedStream& dst, int64_t n_tokens);

// K and V caches live in one pool of 2n planes for n layers: planes [0, n) hold K rows, [n, 2n) V
// rows. K and V of a token then share one block id and one block table, so the attention kernels
// compute one address per key for both (with two tables, v6's producer loads both: on the 8B
// model's 8k prefill its kernel took 1.9 ms per layer against 1.2 in the bench's one-table case;
// docs/cuda.md, v6).
inline PagedView kv_k_view(const PagedStream& kv, int layer) { return kv.view(layer); }
inline PagedView kv_v_view(const PagedStream& kv, int layer) { return kv.view(kv.pool()->n_layers() / 2 + layer); }

}  // namespace lragent
