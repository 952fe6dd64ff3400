#include "kv/kv_arena.h"

#include <fmt/core.h>

#include <algorithm>
#include <cassert>
#include <cstdlib>

#include "kv/block_pool.h"

namespace lragent {

namespace {

std::string human_bytes(int64_t b) {
  const double d = static_cast<double>(b);
  if (d >= (1LL << 30)) return fmt::format("{:.2f} GiB", d / (1LL << 30));
  if (d >= (1LL << 20)) return fmt::format("{:.1f} MiB", d / (1LL << 20));
  return fmt::format("{:.1f} KiB", d / (1LL << 10));
}

}  // namespace

int64_t KvArena::slab_for(int64_t largest_block, int64_t arena_bytes, int n_pools) {
  const int64_t block = (std::max<int64_t>(largest_block, 1) + kGranule - 1) / kGranule * kGranule;
  const int64_t share = std::max<int64_t>(arena_bytes, 0) / (16 * std::max(n_pools, 1));
  const int64_t k = std::clamp<int64_t>(std::min(share, kDefaultSlabBytes) / block, 1,
                                        std::max<int64_t>(kDefaultSlabBytes / block, 1));
  return k * block;
}

Result<std::unique_ptr<KvArena>> KvArena::create(int64_t bytes, Backend* backend, int64_t slab_bytes) {
  if (slab_bytes == 0) slab_bytes = kDefaultSlabBytes;
  if (slab_bytes <= 0 || slab_bytes % kGranule != 0)
    return make_error(ErrorCode::kInvalidArgument, "KV arena: slab size {} is not a positive multiple of {} bytes",
                      slab_bytes, kGranule);
  const int64_t n_slabs = std::max<int64_t>(bytes / slab_bytes, 1);
  // Block ids are int32 granule counts from the arena's start.
  if (n_slabs > (static_cast<int64_t>(INT32_MAX) * kGranule) / slab_bytes)
    return make_error(ErrorCode::kInvalidArgument, "KV arena: {} is more than the {} one arena can address",
                      human_bytes(n_slabs * slab_bytes), human_bytes(static_cast<int64_t>(INT32_MAX) * kGranule));
  std::unique_ptr<KvArena> a(new KvArena());
  a->slab_bytes_ = slab_bytes;
  a->n_slabs_ = n_slabs;
  const int64_t total = n_slabs * slab_bytes;
  a->backend_ = backend;
  if (backend) {
    a->dtype_ = backend->cache_dtype();
    a->storage_ = backend->alloc(DType::kU8, {total});
    a->where_ = fmt::format("{} ({})", backend->name(), dtype_name(a->dtype_));
  } else {
    a->dtype_ = DType::kF32;
    void* mem = std::aligned_alloc(static_cast<size_t>(kGranule), static_cast<size_t>(total));
    if (mem) a->storage_ = Tensor::adopt(TensorView(DType::kU8, {total}, mem), &std::free);
    a->where_ = "host (f32)";
  }
  if (!a->storage_.view().data)
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache: cannot allocate {} on {}; lower --max-context or --kv-memory (--kv-budget in bench)", human_bytes(total),
                      a->where_);
  a->free_.reserve(static_cast<size_t>(n_slabs));
  for (int64_t s = n_slabs; s-- > 0;) a->free_.push_back(s);  // lowest index on top
  return a;
}

KvArena::~KvArena() {
  assert(pools_.empty() && "KvArena destroyed while block pools still draw from it: destroy the pools first");
}

void KvArena::detach(const BlockPool* p) { pools_.erase(std::remove(pools_.begin(), pools_.end(), p), pools_.end()); }

Result<int64_t> KvArena::take_slab(const std::string& for_pool) {
  if (free_.empty())
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache '{}' exhausted: the KV memory of {} on {} is full ({}); raise the KV budget "
                      "(--kv-memory, or --kv-budget in bench) or shorten the context",
                      for_pool, human_bytes(capacity_bytes()), where_, summary());
  const int64_t s = free_.back();
  free_.pop_back();
  return s;
}

void KvArena::give_slab(int64_t slab) {
  assert(slab >= 0 && slab < n_slabs_ && "give_slab: not a slab of this arena");
  free_.push_back(slab);
}

int32_t KvArena::slot_of(int32_t block, const LentSlab& s) const {
  return static_cast<int32_t>((static_cast<int64_t>(block) - slab_of(block) * (slab_bytes_ / kGranule)) /
                              s.granules_per_block);
}

KvArena::LentSlab& KvArena::lent(int32_t block, int32_t* slot) {
  LentSlab& s = lent_.at(slab_of(block));
  *slot = slot_of(block, s);
  return s;
}

int KvArena::refcount(int32_t block) const {
  const auto it = lent_.find(slab_of(block));
  return it == lent_.end() ? 0 : it->second.refs[static_cast<size_t>(slot_of(block, it->second))];
}

int64_t KvArena::orphan_slabs() const {
  return std::count_if(lent_.begin(), lent_.end(), [](const auto& kv) { return kv.second.owner == nullptr; });
}

void KvArena::lend(int64_t slab, BlockPool* owner, int64_t granules_per_block, int64_t n_blocks) {
  LentSlab& s = lent_[slab];
  s.owner = owner;
  s.granules_per_block = granules_per_block;
  s.refs.assign(static_cast<size_t>(n_blocks), 0);
  s.live = 0;
}

void KvArena::retain(int32_t block) {
  int32_t slot = 0;
  int32_t& r = lent(block, &slot).refs[static_cast<size_t>(slot)];
  assert(r > 0 && "retain of a free block");
  ++r;
}

void KvArena::release(int32_t block) {
  int32_t slot = 0;
  LentSlab& s = lent(block, &slot);
  int32_t& r = s.refs[static_cast<size_t>(slot)];
  assert(r > 0 && "release of a free block (double free)");
  if (--r > 0) return;
  --s.live;
  if (s.owner)
    s.owner->slot_freed(slab_of(block), slot);  // may unlend the slab (s dangles after)
  else if (s.live == 0)
    unlend(slab_of(block));
}

void KvArena::disown(int64_t slab, const BlockPool& geometry) {
  LentSlab& s = lent_.at(slab);
  if (s.live == 0) {
    unlend(slab);
    return;
  }
  // The blocks still held sit in streams of pools with this geometry (share_prefix checks it), so
  // one exists; the one holding the most references likely holds these and frees them last.
  BlockPool* heir = nullptr;
  for (BlockPool* p : pools_)
    if (p->same_geometry(geometry) && (!heir || p->used_blocks() > heir->used_blocks())) heir = p;
  assert(heir && "a held block of a destroyed pool must belong to a stream of a pool of its geometry");
  s.owner = heir;  // null (release builds, never expected): the slab returns once its last block is free
  if (!heir) return;
  std::vector<int32_t> free_slots;  // stack, lowest slot on top as in BlockPool::allocate
  for (int32_t i = static_cast<int32_t>(s.refs.size()); i-- > 0;)
    if (s.refs[static_cast<size_t>(i)] == 0) free_slots.push_back(i);
  heir->adopt(slab, std::move(free_slots));
}

void KvArena::unlend(int64_t slab) {
  lent_.erase(slab);
  give_slab(slab);
}

std::vector<KvArena::PoolUsage> KvArena::usage() const {
  std::vector<PoolUsage> out;
  out.reserve(pools_.size());
  for (const BlockPool* p : pools_)
    out.push_back({p->name(), p->used_blocks(), p->used_blocks() * static_cast<int64_t>(p->block_bytes()),
                   p->held_slabs() * slab_bytes_});
  return out;
}

std::string KvArena::summary() const {
  std::string s;
  for (const PoolUsage& u : usage()) {
    if (u.slab_bytes == 0) continue;
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {}", u.name, human_bytes(u.slab_bytes));
  }
  if (const int64_t orphans = orphan_slabs(); orphans > 0) {
    if (!s.empty()) s += ", ";
    s += fmt::format("shared blocks of dropped caches {}", human_bytes(orphans * slab_bytes_));
  }
  if (s.empty()) s = "no pool holds memory";
  return s + fmt::format("; {} free of {}", human_bytes(free_bytes()), human_bytes(capacity_bytes()));
}

}  // namespace lragent
