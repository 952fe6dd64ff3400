#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

namespace lragent {
namespace {

// Sums [0, n) through the pool; every index is visited exactly once.
int64_t pool_sum(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<int> visits(static_cast<size_t>(n), 0);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    int64_t local = 0;
    for (int64_t i = b; i < e; ++i) {
      ++visits[static_cast<size_t>(i)];
      local += i;
    }
    sum += local;
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[static_cast<size_t>(i)], 1) << "index " << i << " of " << n;
  return sum.load();
}

TEST(ThreadPoolTest, CoversEveryIndexOnceAtAwkwardSizes) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 17, 97, 4097}) {
    for (int64_t grain : {1, 3, 64}) EXPECT_EQ(pool_sum(pool, n, grain), n * (n - 1) / 2) << n << " grain " << grain;
  }
  EXPECT_EQ(pool_sum(pool, 0, 1), 0);
}

TEST(ThreadPoolTest, OneThreadRunsOnTheCaller) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  const std::thread::id caller = std::this_thread::get_id();
  bool elsewhere = false;
  pool.parallel_for(1000, 1, [&](int64_t, int64_t) { elsewhere |= std::this_thread::get_id() != caller; });
  EXPECT_FALSE(elsewhere);
}

// Two threads using one pool at once (the server's engine thread and another user of the same
// model) used to leave both waiting forever: the pool has a single job slot. They take turns now.
TEST(ThreadPoolTest, CallersOnSeveralThreadsTakeTurns) {
  ThreadPool pool(3);
  constexpr int kCallers = 4, kRounds = 300;
  std::vector<int> wrong(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        const int64_t n = 1 + (r * 37 + c * 11) % 500;
        std::atomic<int64_t> sum{0};
        pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
          int64_t local = 0;
          for (int64_t i = b; i < e; ++i) local += i;
          sum += local;
        });
        if (sum.load() != n * (n - 1) / 2) ++wrong[c];
      }
    });
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(wrong[c], 0) << "caller " << c;
}

// fn calling parallel_for (on a worker or on the caller) runs that inner loop serially.
TEST(ThreadPoolTest, ANestedCallRunsSerially) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(100, 1, [&](int64_t bb, int64_t ee) {
        for (int64_t k = bb; k < ee; ++k) sum += k;
      });
    }
  });
  EXPECT_EQ(sum.load(), 8 * (100 * 99 / 2));
}

}  // namespace
}  // namespace lragent
