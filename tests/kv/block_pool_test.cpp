// KvArena + BlockPool: pools of different geometries share one arena without overlapping (every
// layer plane of every block checked),
// memory moves between them as slabs empty, the cap of a --max-context-sized pool holds, the
// accounting adds up, and exhaustion is an error that names who holds the memory.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kv/block_pool.h"

namespace lragent {
namespace {

// Marks every value of block b (all layers) of pool p with `tag`, through layer views.
void fill_block(const BlockPool& p, int32_t b, float tag) {
  const int32_t table[1] = {b};
  for (int l = 0; l < p.n_layers(); ++l) {
    const PagedView v = p.layer_view(l, table);
    for (int t = 0; t < p.page_size(); ++t)
      for (int64_t c = 0; c < p.width(); ++c) v.row(t)[c] = tag + static_cast<float>(l * 1000 + t * 10) + c * 1e-3f;
  }
}
bool block_holds(const BlockPool& p, int32_t b, float tag) {
  const int32_t table[1] = {b};
  for (int l = 0; l < p.n_layers(); ++l) {
    const PagedView v = p.layer_view(l, table);
    for (int t = 0; t < p.page_size(); ++t)
      for (int64_t c = 0; c < p.width(); ++c)
        if (v.row(t)[c] != tag + static_cast<float>(l * 1000 + t * 10) + c * 1e-3f) return false;
  }
  return true;
}

TEST(KvArena, PoolsOfDifferentWidthsShareOneArenaWithoutOverlap) {
  // 64 KiB slabs: a 4-layer, 16-token, 64-wide f32 block is 16 KiB (4 per slab); the 4-wide
  // low-rank block is 1 KiB (64 per slab); a 3-layer, 5-wide one is 960 B (rounded to 1 KiB).
  auto arena = KvArena::create(16 * 65536, nullptr, 65536);
  ASSERT_TRUE(arena.ok()) << arena.error().message;
  auto base = BlockPool::create("base.k", 4, 16, 64, arena->get());
  auto lr = BlockPool::create("lr.k", 4, 16, 4, arena->get());
  auto odd = BlockPool::create("agent0.full.k", 3, 16, 5, arena->get());
  ASSERT_TRUE(base.ok() && lr.ok() && odd.ok());
  std::map<std::pair<BlockPool*, int32_t>, float> tags;
  float tag = 1.f;
  for (int i = 0; i < 9; ++i)
    for (BlockPool* p : {base->get(), lr->get(), odd->get()}) {
      auto b = p->allocate();
      ASSERT_TRUE(b.ok()) << b.error().message;
      fill_block(*p, *b, tag);
      tags[{p, *b}] = tag;
      tag += 100000.f;
    }
  // Every block still holds what was written to it: no two blocks of any pools overlap.
  for (const auto& [key, t] : tags) EXPECT_TRUE(block_holds(*key.first, key.second, t)) << key.first->name();
  EXPECT_EQ((*base)->used_blocks(), 9);
  EXPECT_EQ((*base)->held_slabs(), 3);  // 9 blocks at 4 per slab
  EXPECT_EQ((*lr)->held_slabs(), 1);
  EXPECT_EQ((*odd)->held_slabs(), 1);
  EXPECT_EQ((*arena)->free_slabs(), 16 - 5);
  // Layer planes: within a slab, one layer's rows of consecutive blocks are contiguous.
  {
    auto b0 = (*base)->allocate(), b1 = (*base)->allocate();
    ASSERT_TRUE(b0.ok() && b1.ok());
    const int32_t t0[1] = {*b0}, t1[1] = {*b1};
    // Both come from the third slab, which holds one block so far: the check below must run.
    ASSERT_EQ(*b1 / (65536 / KvArena::kGranule), *b0 / (65536 / KvArena::kGranule)) << "not in one slab";
    for (int l = 0; l < 4; ++l)
      EXPECT_EQ((*base)->layer_view(l, t0).row(0) + 16 * 64, (*base)->layer_view(l, t1).row(0)) << "layer " << l;
    (*base)->release(*b0);
    (*base)->release(*b1);
  }
  for (const auto& [key, t] : tags) key.first->release(key.second);
  EXPECT_EQ((*arena)->free_slabs(), 16);  // emptied slabs all went back
}

TEST(KvArena, MemoryMovesBetweenPoolsAndExhaustionNamesTheHolders) {
  auto arena = KvArena::create(4 * 65536, nullptr, 65536);
  ASSERT_TRUE(arena.ok());
  auto a = BlockPool::create("agent0.full.k", 4, 16, 64, arena->get());  // 16 KiB blocks, 4 per slab
  auto b = BlockPool::create("agent1.full.k", 4, 16, 64, arena->get());
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> held;
  for (int i = 0; i < 16; ++i) {
    auto x = (*a)->allocate();
    ASSERT_TRUE(x.ok()) << i << ": " << x.error().message;
    held.push_back(*x);
  }
  EXPECT_EQ((*a)->free_blocks(), 0);
  EXPECT_EQ((*b)->free_blocks(), 0);
  auto none = (*b)->allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(none.error().message.find("agent1.full.k"), std::string::npos) << none.error().message;
  EXPECT_NE(none.error().message.find("agent0.full.k 256.0 KiB"), std::string::npos) << none.error().message;
  // Freeing three blocks of one slab keeps it with agent0; the fourth returns it to the arena.
  for (int i = 0; i < 3; ++i) (*a)->release(held[static_cast<size_t>(i)]);
  EXPECT_EQ((*b)->free_blocks(), 0);
  EXPECT_EQ((*a)->free_blocks(), 3);
  (*a)->release(held[3]);
  EXPECT_EQ((*b)->free_blocks(), 4);
  auto y = (*b)->allocate();
  ASSERT_TRUE(y.ok()) << y.error().message;
  EXPECT_EQ(*y, held[0]) << "agent1 reuses the memory agent0 gave back";
  // Accounting: one line per pool; bytes are blocks in use, slab bytes what each holds.
  const auto usage = (*arena)->usage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].blocks, 12);
  EXPECT_EQ(usage[0].bytes, 12 * 16384);
  EXPECT_EQ(usage[0].slab_bytes, 3 * 65536);
  EXPECT_EQ(usage[1].blocks, 1);
  EXPECT_EQ(usage[1].slab_bytes, 65536);
  EXPECT_EQ((*arena)->lent_bytes(), 4 * 65536);
  (*b)->release(*y);
  for (size_t i = 4; i < held.size(); ++i) (*a)->release(held[i]);
  EXPECT_EQ((*arena)->free_slabs(), 4);
}

TEST(KvArena, RefcountsAndCap) {
  auto p = BlockPool::create("k", 2, 4, 8, 3);  // own arena, capped at 3 blocks
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ((*p)->free_blocks(), 3);
  auto x = (*p)->allocate();
  ASSERT_TRUE(x.ok());
  (*p)->retain(*x);
  EXPECT_EQ((*p)->refcount(*x), 2);
  (*p)->release(*x);
  EXPECT_EQ((*p)->refcount(*x), 1);
  EXPECT_EQ((*p)->used_blocks(), 1);
  auto y = (*p)->allocate(), z = (*p)->allocate();
  ASSERT_TRUE(y.ok() && z.ok());
  std::set<int32_t> ids = {*x, *y, *z};
  EXPECT_EQ(ids.size(), 3u);
  auto over = (*p)->allocate();
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(over.error().message.find("all 3 blocks"), std::string::npos) << over.error().message;
  for (int32_t b : ids) (*p)->release(b);
  EXPECT_EQ((*p)->used_blocks(), 0);
  EXPECT_EQ((*p)->refcount(*x), 0);
}

TEST(KvArena, StreamReserveFailureKeepsWhatIsStored) {
  auto p = BlockPool::create("v", 1, 4, 2, 2);  // 2 blocks of 4 tokens
  ASSERT_TRUE(p.ok());
  PagedStream s(p->get());
  ASSERT_TRUE(s.reserve(5).ok());
  const std::vector<int32_t> table = s.table();
  s.view(0).row(4)[1] = 42.f;
  const Status st = s.reserve(9);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(st.error().message.find("exhausted"), std::string::npos);
  EXPECT_EQ(s.table(), table);
  EXPECT_EQ(s.view(0).row(4)[1], 42.f);
}

TEST(KvArena, BadGeometryAndSlabErrors) {
  auto arena = KvArena::create(65536, nullptr, 65536);
  ASSERT_TRUE(arena.ok());
  auto big = BlockPool::create("huge", 64, 16, 64, arena->get());  // 256 KiB block > 64 KiB slab
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, ErrorCode::kInvalidArgument);
  // 64 layers x 16 tokens x 64 f32 values = 262144 bytes.
  EXPECT_NE(big.error().message.find("KV pool 'huge': a block of 262144 bytes (64 layers x 16 tokens x 64 values) "
                                     "does not fit the arena's 65536-byte slabs"),
            std::string::npos)
      << big.error().message;
  // Each refusal names the pool (or arena) and the value at fault.
  auto expect_invalid = [](const Error& e, const std::string& cause) {
    EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << e.message;
    EXPECT_NE(e.message.find(cause), std::string::npos) << e.message;
  };
  auto zero = BlockPool::create("zero", 0, 16, 64, arena->get());
  ASSERT_FALSE(zero.ok());
  expect_invalid(zero.error(), "KV pool 'zero': invalid geometry (layers 0, page size 16, width 64)");
  auto flat = BlockPool::create("flat", 1, 16, 0, arena->get());
  ASSERT_FALSE(flat.ok());
  expect_invalid(flat.error(), "KV pool 'flat': invalid geometry (layers 1, page size 16, width 0)");
  auto none = BlockPool::create("none", 1, 16, 64, nullptr);
  ASSERT_FALSE(none.ok());
  expect_invalid(none.error(), "KV pool 'none': no arena");
  auto odd = KvArena::create(65536, nullptr, 1000);  // not a multiple of the granule
  ASSERT_FALSE(odd.ok());
  expect_invalid(odd.error(), "slab size 1000 is not a positive multiple of " + std::to_string(KvArena::kGranule));
  // Slabs are whole blocks: ~2 MiB for big arenas, one block when the block is bigger, and
  // smaller for small arenas so a partly used last slab stays cheap.
  EXPECT_EQ(KvArena::slab_for(100, int64_t{1} << 40, 4), KvArena::kDefaultSlabBytes);
  EXPECT_EQ(KvArena::slab_for(3 << 20, int64_t{1} << 40, 4), 30 << 20);
  EXPECT_EQ(KvArena::slab_for(1 << 20, int64_t{1} << 40, 4), 32 << 20);
  EXPECT_EQ(KvArena::slab_for(40 << 20, int64_t{1} << 40, 4), 40 << 20);
  EXPECT_EQ(KvArena::slab_for(3000, 64 * 3072, 1), 4 * 3072);  // 64 blocks: slabs of 4
  EXPECT_EQ(KvArena::slab_for(3000, 8 * 3072, 1), 3072);
  EXPECT_EQ(KvArena::slab_for(1024, 64 * 1024 * 16, 2), 32 * 1024);
  EXPECT_EQ(BlockPool::arena_bytes_for(4, 16384, 9, 65536), 3 * 65536);  // 4 blocks of 4 x 4 KiB per slab
  EXPECT_EQ(BlockPool::footprint_for(3, 16, 5, DType::kF32), 3 * 512);     // 320-byte layer rows -> 512
  EXPECT_EQ(BlockPool::blocks_per_slab(3, 3 * 512, 65536), 42);             // planes of 21760 bytes
}

// copy_rows between pools of two arenas: every row of the first n tokens arrives, whatever the
// block tables (runs of consecutive blocks, scattered blocks, blocks in several slabs), at
// awkward lengths; nothing past the copied blocks is touched; mismatches are errors.
TEST(KvArena, CopyRowsBetweenPoolsOfTwoArenas) {
  constexpr int kLayers = 3, kPage = 4;
  constexpr int64_t kWidth = 5;  // 80-byte rows of a block's layer: granules hold one block's layer each
  auto value = [](int l, int64_t t, int64_t c) { return static_cast<float>(l * 100000 + t * 10) + c * 1e-2f; };
  for (int64_t n : {1, 4, 17, 97}) {
    SCOPED_TRACE(n);
    // Small slabs (several per stream); the first half of the source's blocks interleaved with a
    // neighbour's (scattered), the rest consecutive (copied in runs).
    auto a1 = KvArena::create(64 * 1024, nullptr, 1024 * kLayers);
    auto a2 = KvArena::create(64 * 1024, nullptr, 2048 * kLayers);
    ASSERT_TRUE(a1.ok() && a2.ok());
    auto sp = BlockPool::create("src", kLayers, kPage, kWidth, a1->get());
    auto dp = BlockPool::create("dst", kLayers, kPage, kWidth, a2->get());
    ASSERT_TRUE(sp.ok() && dp.ok());
    PagedStream src(sp->get()), neighbour(sp->get()), dst(dp->get()), filler(dp->get());
    for (int64_t t = 0; t < n; t += kPage) {  // src, neighbour, src, ... in one pool
      ASSERT_TRUE(src.reserve(t + 1).ok());
      if (2 * t < n) ASSERT_TRUE(neighbour.reserve(t + 1).ok());
    }
    ASSERT_TRUE(filler.reserve(3).ok());  // dst's blocks start past the pool's first
    ASSERT_TRUE(dst.reserve(n + 2 * kPage).ok());  // more blocks than the copy fills
    for (int l = 0; l < kLayers; ++l) {
      const PagedView sv = src.view(l), dv = dst.view(l);
      for (int64_t t = 0; t < src.capacity(); ++t)
        for (int64_t c = 0; c < kWidth; ++c) sv.row(t)[c] = value(l, t, c);
      for (int64_t t = 0; t < dst.capacity(); ++t)
        for (int64_t c = 0; c < kWidth; ++c) dv.row(t)[c] = -1.f;
    }
    ASSERT_TRUE(copy_rows(src, dst, n).ok());
    const int64_t copied_blocks = (n + kPage - 1) / kPage;
    for (int l = 0; l < kLayers; ++l) {
      const PagedView dv = dst.view(l);
      for (int64_t t = 0; t < dst.capacity(); ++t)
        for (int64_t c = 0; c < kWidth; ++c) {
          const float want = t < copied_blocks * kPage ? value(l, t, c) : -1.f;
          ASSERT_EQ(dv.row(t)[c], want) << "layer " << l << " token " << t << " value " << c;
        }
    }
    EXPECT_TRUE(copy_rows(src, dst, 0).ok());
    // More rows than a stream holds, and pools of another geometry, are refused.
    EXPECT_EQ(copy_rows(src, dst, src.capacity() + 1).error().code, ErrorCode::kInvalidArgument);
    auto wide = BlockPool::create("wide", kLayers, kPage, kWidth + 1, a2->get());
    ASSERT_TRUE(wide.ok());
    PagedStream w(wide->get());
    ASSERT_TRUE(w.reserve(n).ok());
    auto bad = copy_rows(src, w, n);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("geometry"), std::string::npos) << bad.error().message;
  }
}

// A stream of another pool of the same arena and geometry takes a prefix's whole blocks by
// reference and copies the partial last one (PagedStream::share_prefix); the shared blocks
// outlive the stream and the pool that allocated them (a pool of their geometry adopts their slab
// and hands its free blocks out again), a cap counts them, and other geometries are refused.
TEST(KvArena, SharedPrefixBlocksOutliveTheirPool) {
  constexpr int kLayers = 2, kPage = 4;
  constexpr int64_t kWidth = 6;
  auto value = [](int l, int64_t t, int64_t c) { return static_cast<float>(l * 100000 + t * 10) + c * 1e-2f; };
  for (int64_t n : {1, 4, 17, 97}) {
    SCOPED_TRACE(n);
    auto arena = KvArena::create(64 * 1024, nullptr, 1024 * kLayers);
    ASSERT_TRUE(arena.ok());
    KvArena& a = **arena;
    auto sp = BlockPool::create("src", kLayers, kPage, kWidth, &a);
    auto dp = BlockPool::create("dst", kLayers, kPage, kWidth, &a);
    ASSERT_TRUE(sp.ok() && dp.ok());
    auto src = std::make_unique<PagedStream>(sp->get());
    PagedStream dst(dp->get());
    ASSERT_TRUE(src->reserve(n + 3).ok());
    for (int l = 0; l < kLayers; ++l)
      for (int64_t t = 0; t < src->capacity(); ++t)
        for (int64_t c = 0; c < kWidth; ++c) src->view(l).row(t)[c] = value(l, t, c);
    ASSERT_TRUE(dst.share_prefix(*src, n).ok());
    const int64_t whole = n / kPage;
    ASSERT_EQ(static_cast<int64_t>(dst.table().size()), (n + kPage - 1) / kPage);
    for (int64_t i = 0; i < whole; ++i) {
      EXPECT_EQ(dst.table()[static_cast<size_t>(i)], src->table()[static_cast<size_t>(i)]) << "block " << i;
      EXPECT_EQ(a.refcount(dst.table()[static_cast<size_t>(i)]), 2);
      EXPECT_TRUE(dst.shares_row(i * kPage));
    }
    if (n % kPage != 0) {  // the partial block is dst's own copy
      EXPECT_NE(dst.table().back(), src->table()[static_cast<size_t>(whole)]);
      EXPECT_EQ(a.refcount(dst.table().back()), 1);
      EXPECT_FALSE(dst.shares_row(n - 1));
      for (int l = 0; l < kLayers; ++l) dst.view(l).row(n)[0] = -5.f;  // dst writes past the prefix
      EXPECT_EQ(src->view(0).row(n)[0], value(0, n, 0)) << "a write to the copied block reached the source";
    }
    EXPECT_EQ((*dp)->used_blocks(), (n + kPage - 1) / kPage);  // shared references count for dst
    // The source goes, then its pool: the shared blocks stay readable through dst, and dp adopts
    // their slabs: every slot of a slab it holds is one of dst's blocks or free in dp.
    src.reset();
    sp->reset();
    EXPECT_EQ(a.orphan_slabs(), 0);
    const int64_t bps = (*dp)->blocks_per_slab();
    EXPECT_EQ((*dp)->held_slabs() * bps, (*dp)->used_blocks() + (*dp)->free_in_slabs())
        << "a slab of the destroyed pool is not accounted in dp";
    for (int l = 0; l < kLayers; ++l)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < kWidth; ++c) ASSERT_EQ(dst.view(l).row(t)[c], value(l, t, c)) << l << " " << t;
    // dst grows into the free blocks of the slabs dp holds, adopted ones included, before it takes
    // another slab from the arena.
    const int64_t free_slabs = a.free_slabs(), in_slabs = (*dp)->free_in_slabs();
    ASSERT_TRUE(dst.reserve(dst.capacity() + in_slabs * kPage).ok());
    EXPECT_EQ(a.free_slabs(), free_slabs) << "a new slab was taken while adopted ones had free blocks";
    EXPECT_EQ((*dp)->free_in_slabs(), 0);
    dst.clear();
    EXPECT_EQ(a.orphan_slabs(), 0);
    EXPECT_EQ(a.free_slabs(), a.n_slabs()) << "every slab back once the last reference went";
  }
  // A cap counts shared blocks; another width, or another arena, is refused.
  auto arena = KvArena::create(64 * 1024, nullptr, 1024 * kLayers);
  auto other = KvArena::create(64 * 1024, nullptr, 1024 * kLayers);
  ASSERT_TRUE(arena.ok() && other.ok());
  auto sp = BlockPool::create("src", kLayers, kPage, kWidth, arena->get());
  auto capped = BlockPool::create("capped", kLayers, kPage, kWidth, arena->get());
  auto wide = BlockPool::create("wide", kLayers, kPage, kWidth + 1, arena->get());
  auto far = BlockPool::create("far", kLayers, kPage, kWidth, other->get());
  ASSERT_TRUE(sp.ok() && capped.ok() && wide.ok() && far.ok());
  (*capped)->set_max_blocks(2);
  PagedStream src(sp->get()), c(capped->get()), w(wide->get()), f(far->get());
  ASSERT_TRUE(src.reserve(12).ok());
  auto full = c.share_prefix(src, 12);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::kOutOfMemory);
  EXPECT_TRUE(c.table().empty());
  EXPECT_EQ((*capped)->used_blocks(), 0);
  EXPECT_TRUE(c.share_prefix(src, 8).ok());
  EXPECT_EQ(w.share_prefix(src, 8).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(f.share_prefix(src, 8).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(c.share_prefix(src, 4).error().code, ErrorCode::kInvalidArgument) << "the stream already holds blocks";
}

}  // namespace
}  // namespace lragent
