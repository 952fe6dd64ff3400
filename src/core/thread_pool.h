// A fixed-size thread pool with a blocking parallel_for. Used by the CPU backend for
// attention and element-wise work (OpenBLAS runs its own threads for GEMM).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lragent {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 1: everything runs on the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items;
  // returns when all chunks are done. Callers on several threads take turns (the pool has one
  // job slot: two callers at once used to wait on each other forever). A call from inside fn
  // runs serially on its thread rather than waiting for the pool it is part of.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  static int default_threads();  // hardware concurrency, at least 1

 private:
  void worker_loop();
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // held for a whole parallel_for: one job in the pool at a time
  std::mutex mu_;       // guards the job's fields below
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, next_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace lragent
