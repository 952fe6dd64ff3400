// The cluster schedule's bookkeeping of version 3's decode GEMV (src/backend/cuda/gemv_v3_split.h,
// used by gemv_v3_mma.cu's cluster kernel): every batch of the grid is in exactly one warp's share,
// every unit is written exactly once, and a unit split between shares is finished by the warp
// where it ends from exactly the pieces of the other warps whose shares meet it, each sent once
// to it. Checked on the CPU by replaying the kernel's decisions for every warp of every cluster,
// over small shapes exhaustively and the 8B model's shapes on a 132-SM GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/gemv_v3_split.h"

namespace lragent::cuda {
namespace {

template <int kWarpsPer>
void check_grid(int n_units, int U, int clusters) {
  const std::string what = "units " + std::to_string(n_units) + ", batches a unit " + std::to_string(U) +
                           ", clusters " + std::to_string(clusters) + ", warps " + std::to_string(kWarpsPer);
  std::vector<int> written(static_cast<size_t>(n_units), 0);  // times each unit is written
  int64_t next_batch = 0;                                       // the grid's batches, in order
  for (int c = 0; c < clusters; ++c) {
    const ClusterSplit<kWarpsPer> cs(c, n_units, clusters, U);
    ASSERT_EQ(cs.base, next_batch) << what << ": cluster " << c << " does not start where the last ended";
    ASSERT_GE(cs.u1, cs.u0) << what;
    std::vector<WarpShare> shares;
    for (int w = 0; w < kWarpsPer; ++w) {
      shares.emplace_back(cs.base + cs.begin(w), cs.base + cs.begin(w + 1), U);
      ASSERT_EQ(shares.back().j0, next_batch) << what << ": warp " << w << " leaves a gap or overlaps";
      ASSERT_GE(shares.back().count(), 0) << what;
      next_batch = shares.back().j1;
    }
    ASSERT_EQ(next_batch, cs.base + cs.len) << what << ": cluster " << c << "'s shares miss batches";
    // owner(j): the warp whose share holds the cluster's batch j.
    for (int64_t j = 0; j < cs.len; ++j) {
      const int o = cs.owner(j);
      ASSERT_TRUE(o >= 0 && o < kWarpsPer && cs.begin(o) <= j && j < cs.begin(o + 1))
          << what << ": owner of batch " << j << " is warp " << o;
    }
    // The kernel's decisions: who writes a unit alone, who sends a piece where, who finishes.
    std::vector<int> sent_to(kWarpsPer, -1), sent_unit(kWarpsPer, -1);
    for (int w = 0; w < kWarpsPer; ++w) {
      const WarpShare& s = shares[static_cast<size_t>(w)];
      if (s.count() == 0) {
        EXPECT_FALSE(s.sends() || s.finishes()) << what << ": empty share of warp " << w;
        continue;
      }
      ASSERT_TRUE(s.first >= cs.u0 && s.last < cs.u1 && s.first <= s.last) << what << ": warp " << w;
      for (int u = s.first; u <= s.last; ++u)
        if (s.holds(u)) ++written[static_cast<size_t>(u)];
      // Split pieces: at most the first unit (begun earlier) and the last (going on after).
      for (int u = s.first + 1; u < s.last; ++u) EXPECT_TRUE(s.holds(u)) << what << ": warp " << w << " unit " << u;
      if (s.sends()) {
        sent_to[static_cast<size_t>(w)] = s.receiver(cs);
        sent_unit[static_cast<size_t>(w)] = s.last;
        EXPECT_GT(sent_to[static_cast<size_t>(w)], w) << what << ": warp " << w << " sends its piece back";
      }
    }
    for (int w = 0; w < kWarpsPer; ++w) {
      const WarpShare& s = shares[static_cast<size_t>(w)];
      if (!s.finishes()) continue;
      const int u = s.first;
      ++written[static_cast<size_t>(u)];
      // The senders the finisher reads: non-empty shares from first_sender to itself.
      std::set<int> read;
      for (int f = s.first_sender(cs); f < w; ++f)
        if (cs.begin(f) != cs.begin(f + 1)) read.insert(f);
      // Every warp other than the finisher whose share meets the unit, by brute force.
      std::set<int> meet;
      for (int f = 0; f < kWarpsPer; ++f) {
        const WarpShare& o = shares[static_cast<size_t>(f)];
        if (f != w && o.count() > 0 && o.j0 < int64_t{u + 1} * U && o.j1 > int64_t{u} * U) meet.insert(f);
      }
      EXPECT_EQ(read, meet) << what << ": warp " << w << " finishing unit " << u;
      EXPECT_FALSE(read.empty()) << what << ": warp " << w << " finishes a unit nobody else met";
      for (int f : read) {
        EXPECT_EQ(sent_to[static_cast<size_t>(f)], w) << what << ": warp " << f << "'s piece of unit " << u;
        EXPECT_EQ(sent_unit[static_cast<size_t>(f)], u) << what << ": warp " << f;
        sent_to[static_cast<size_t>(f)] = -2;  // received
      }
    }
    for (int w = 0; w < kWarpsPer; ++w)
      EXPECT_LT(sent_to[static_cast<size_t>(w)], 0) << what << ": warp " << w << "'s piece is read by no finisher";
  }
  EXPECT_EQ(next_batch, int64_t{n_units} * U) << what << ": the clusters miss batches";
  for (int u = 0; u < n_units; ++u)
    ASSERT_EQ(written[static_cast<size_t>(u)], 1) << what << ": unit " << u << " written that many times";
}

TEST(GemvV3Split, EveryUnitIsWrittenOnceFromEveryPiece) {
  // Small grids exhaustively: units of 1 batch (fewer batches than warps: empty shares) to 9, up
  // to a cluster a unit.
  for (int n_units = 1; n_units <= 40; ++n_units)
    for (int U = 1; U <= 9; ++U)
      for (int clusters = 1; clusters <= std::min(n_units, 9); ++clusters) {
        check_grid<16>(n_units, U, clusters);
        check_grid<3>(n_units, U, clusters);
      }
}

TEST(GemvV3Split, TheModelsShapesOnA132SmGpu) {
  // (units, batches a unit, clusters) as gemv_v3_launch makes them for Llama-3.1-8B at 2-8 rows
  // on an H200 (132 clusters of two blocks): gate/up SwiGLU (896 tile pairs, 2 x 64 batches),
  // q/k/v (384 tiles), lm_head (8016), down (256 tiles of 224 batches), k alone (64 tiles, 7
  // clusters), an odd width (1031 rows, 4104 columns: 65 tiles of 65 batches).
  for (const auto& [n, U, c] : std::vector<std::tuple<int, int, int>>{
           {896, 128, 132}, {384, 64, 132}, {8016, 64, 132}, {256, 224, 132}, {64, 64, 64}, {65, 65, 65}, {7, 224, 7}})
    check_grid<16>(n, U, c);
}

}  // namespace
}  // namespace lragent::cuda
