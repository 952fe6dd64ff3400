// One memory pool for the KV caches of a trajectory, an engine or a server (vLLM's single
// pre-allocated cache pool): every BlockPool (base K/V, low-rank rows, full caches, each agent's
// private ones) draws its blocks from the same arena, so memory moves between components as
// they grow and shrink instead of being split up front, and the arena accounts for every byte.
//
// Layout: one allocation of n_slabs · slab_bytes bytes, in the backend's cache dtype (host f32 for
// the CPU). A slab is lent to one BlockPool at a time, which cuts it into one plane per layer and
// each plane into its blocks' rows (block_pool.h); a slab whose blocks are all free goes back to
// the arena. Block ids count granules of kGranule bytes from the arena's start, so a block's
// layer-0 rows are at base + id · kGranule whatever pool it belongs to (PagedView::block_stride =
// kGranule / element size), and layer l's a fixed plane offset further.
//
// Block reference counts live here, per lent slab, not in the pools: a stream may hold blocks
// that another pool of the arena allocated (a fork of a trajectory shares its prefix's blocks,
// PagedStream::share_prefix). A freed block goes back to the pool that owns its slab. When that
// pool is destroyed while other pools' streams still hold some of the slab's blocks, a pool of
// the same geometry adopts the slab (the holders' pools are such pools), so its free blocks are
// handed out again instead of sitting in a slab nobody owns until the last holder lets go.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"

namespace lragent {

class BlockPool;

class KvArena {
 public:
  static constexpr int64_t kGranule = 256;               // bytes; block ids count these
  static constexpr int64_t kDefaultSlabBytes = 32 << 20;  // 32 MiB: 1 MiB per layer plane at 32 layers

  // An arena of `bytes` (rounded down to whole slabs; at least one slab). slab_bytes 0: the
  // default; it must be a multiple of kGranule and at least the largest block of any pool that
  // will draw from the arena. backend null: host f32, else the backend's memory in its cache_dtype().
  static Result<std::unique_ptr<KvArena>> create(int64_t bytes, Backend* backend = nullptr, int64_t slab_bytes = 0);
  // A slab size for an arena of about `arena_bytes` shared by `n_pools` pools whose largest block
  // takes `largest_block` slab bytes (BlockPool::footprint_for): a whole number of those blocks
  // (no waste in the big pools), near kDefaultSlabBytes, but small enough that each pool's partly
  // used last slab costs at most ~1/16 of its share of a small arena.
  static int64_t slab_for(int64_t largest_block, int64_t arena_bytes, int n_pools);

  ~KvArena();
  KvArena(const KvArena&) = delete;
  KvArena& operator=(const KvArena&) = delete;

  DType dtype() const { return dtype_; }
  // The backend whose memory holds the arena; null: host memory.
  Backend* backend() const { return backend_; }
  char* base() const { return static_cast<char*>(storage_.view().data); }
  int64_t slab_bytes() const { return slab_bytes_; }
  int64_t n_slabs() const { return n_slabs_; }
  int64_t free_slabs() const { return static_cast<int64_t>(free_.size()); }
  int64_t capacity_bytes() const { return n_slabs_ * slab_bytes_; }
  int64_t lent_bytes() const { return (n_slabs_ - free_slabs()) * slab_bytes_; }
  int64_t free_bytes() const { return free_slabs() * slab_bytes_; }
  std::string where() const { return where_; }  // "cuda:0 (bf16)", "host (f32)"

  // Explicit byte accounting: one line per pool that draws from the arena.
  struct PoolUsage {
    std::string name;
    int64_t blocks = 0;       // blocks in use
    int64_t bytes = 0;        // blocks · the pool's block bytes
    int64_t slab_bytes = 0;   // bytes of the slabs it holds (bytes + free blocks + slab tails)
  };
  std::vector<PoolUsage> usage() const;
  // "base.k 1.2 GiB, lr.v 30 MiB, ... ; 0.4 GiB free of 2.0 GiB", for error messages and logs.
  std::string summary() const;

  // A free slab's index, or kOutOfMemory naming who holds the memory. Used by BlockPool.
  Result<int64_t> take_slab(const std::string& for_pool);
  void give_slab(int64_t slab);

  // References to `block` (0: free), whichever pool's streams hold them.
  int refcount(int32_t block) const;
  // Lent slabs without an owner: 0 while every pool keeps its blocks in one of the arena's pools
  // (BlockPool's destructor hands held slabs on; see disown). For summaries and tests.
  int64_t orphan_slabs() const;

 private:
  friend class BlockPool;
  KvArena() = default;
  void attach(BlockPool* p) { pools_.push_back(p); }
  void detach(const BlockPool* p);
  // A lent slab: its owner (null once that pool is gone) and its blocks' reference counts.
  struct LentSlab {
    BlockPool* owner = nullptr;
    int64_t granules_per_block = 0;
    std::vector<int32_t> refs;  // [blocks in the slab]
    int64_t live = 0;           // blocks with refs > 0
  };
  int64_t slab_of(int32_t block) const { return static_cast<int64_t>(block) * kGranule / slab_bytes_; }
  int32_t slot_of(int32_t block, const LentSlab& s) const;  // block's index in its slab s
  LentSlab& lent(int32_t block, int32_t* slot);
  // BlockPool's side: a slab taken by `owner`, cut into n blocks of granules_per_block granules.
  void lend(int64_t slab, BlockPool* owner, int64_t granules_per_block, int64_t n_blocks);
  void retain(int32_t block);
  // Drops a reference; at zero the block goes back to its slab's owner (BlockPool::slot_freed), or
  // with no owner left the slab goes back to the arena once its last block is free.
  void release(int32_t block);
  // The owner of `slab` gives it up (it is being destroyed and has detached): back to the arena if
  // no block of it is held, else adopted by the attached pool of `geometry`'s layout that holds
  // the most references (BlockPool::adopt).
  void disown(int64_t slab, const BlockPool& geometry);
  // An owned slab whose blocks are all free goes back.
  void unlend(int64_t slab);

  DType dtype_ = DType::kF32;
  Backend* backend_ = nullptr;
  int64_t slab_bytes_ = 0, n_slabs_ = 0;
  std::string where_;
  Tensor storage_;                       // [n_slabs * slab_bytes] bytes
  std::vector<int64_t> free_;            // stack of free slab indices
  std::vector<BlockPool*> pools_;        // pools drawing from the arena (accounting, adoption)
  std::unordered_map<int64_t, LentSlab> lent_;  // by slab index
};

}  // namespace lragent
