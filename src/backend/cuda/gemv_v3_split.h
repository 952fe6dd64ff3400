// Version 3's cluster schedule (gemv_v3_mma.cu): how a cluster's batches are split among its
// warps, and which warps meet to finish a unit split between shares. Plain C++ that nvcc also
// compiles for the device, so that the CPU tests check this bookkeeping without a GPU
// (tests/backend/gemv_v3_split_test.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LRA_SPLIT_HD __host__ __device__
#else
#define LRA_SPLIT_HD
#endif

namespace lragent::cuda {

// Cluster c of `clusters` holds units [u0, u1) of n_units, as even as whole units go: its
// batches (U a unit) are the grid's base .. base + len - 1. Its kWarpsPer warps split them
// evenly: warp w holds the cluster's batches [begin(w), begin(w + 1)) (an empty share when a
// cluster has fewer batches than warps).
template <int kWarpsPer>
struct ClusterSplit {
  int u0, u1;
  int64_t base, len;
  LRA_SPLIT_HD ClusterSplit(int c, int n_units, int clusters, int U)
      : u0(static_cast<int>(int64_t{c} * n_units / clusters)),
        u1(static_cast<int>(int64_t{c + 1} * n_units / clusters)),
        base(int64_t{u0} * U),
        len(int64_t{u1 - u0} * U) {}
  LRA_SPLIT_HD int64_t begin(int w) const { return w * len / kWarpsPer; }
  // The warp whose share holds the cluster's batch j (0 <= j < len): the first w with
  // begin(w + 1) > j.
  LRA_SPLIT_HD int owner(int64_t j) const { return static_cast<int>((kWarpsPer * (j + 1) + len - 1) / len) - 1; }
};

// A warp's share: the grid's batches [j0, j1), U a unit; its first and last units (last -1: an
// empty share).
struct WarpShare {
  int64_t j0, j1;
  int U, first, last;
  LRA_SPLIT_HD WarpShare(int64_t begin, int64_t end, int unit_batches)
      : j0(begin),
        j1(end),
        U(unit_batches),
        first(static_cast<int>(begin / unit_batches)),
        last(end > begin ? static_cast<int>((end - 1) / unit_batches) : -1) {}
  LRA_SPLIT_HD int count() const { return static_cast<int>(j1 - j0); }
  // Whether unit u's batches all lie in the share (the warp writes it alone).
  LRA_SPLIT_HD bool holds(int u) const { return int64_t{u} * U >= j0 && int64_t{u + 1} * U <= j1; }
  // Whether the share ends inside a unit (its last): the warp sends its piece of that unit to
  // the warp that finishes it. A warp sends at most one piece.
  LRA_SPLIT_HD bool sends() const { return count() > 0 && int64_t{last + 1} * U > j1; }
  // Whether the warp finishes a unit: its first, begun in an earlier share and ending in this one.
  LRA_SPLIT_HD bool finishes() const { return count() > 0 && !holds(first) && int64_t{first + 1} * U <= j1; }
  // The warp (of the cluster) that finishes the unit this one sends a piece of.
  template <int kWarpsPer>
  LRA_SPLIT_HD int receiver(const ClusterSplit<kWarpsPer>& cs) const {
    return cs.owner(int64_t{last + 1} * U - 1 - cs.base);
  }
  // A finishing warp's first sender: the warp whose share holds its unit's first batch. The
  // senders are the non-empty shares from there to the finishing warp (exclusive), in order.
  template <int kWarpsPer>
  LRA_SPLIT_HD int first_sender(const ClusterSplit<kWarpsPer>& cs) const {
    return cs.owner(int64_t{first} * U - cs.base);
  }
};

}  // namespace lragent::cuda
