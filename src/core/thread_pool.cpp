#include "core/thread_pool.h"

#include <algorithm>

namespace lragent {
namespace {
// True on a pool's worker, and on a caller while it runs chunks: a parallel_for there runs
// serially (waiting for the pool would wait for itself).
thread_local bool t_in_pool = false;

struct InPool {
  bool saved = t_in_pool;
  InPool() { t_in_pool = true; }
  ~InPool() { t_in_pool = saved; }
};
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = std::max<int64_t>(1, n / grain);
  const int64_t n_chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  if (workers_.empty() || n_chunks <= 1 || t_in_pool) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> turn(call_mu_);
  InPool in_pool;
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + n_chunks - 1) / n_chunks;
  next_ = 0;
  pending_ = static_cast<int>(workers_.size());
  ++generation_;
  cv_work_.notify_all();
  // The caller works too.
  while (next_ < n_) {
    int64_t b = next_;
    next_ = std::min(n_, next_ + chunk_);
    int64_t e = next_;
    lock.unlock();
    fn(b, e);
    lock.lock();
  }
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::worker_loop() {
  t_in_pool = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (next_ < n_) {
      int64_t b = next_;
      next_ = std::min(n_, next_ + chunk_);
      int64_t e = next_;
      const auto* fn = fn_;
      lock.unlock();
      (*fn)(b, e);
      lock.lock();
    }
    if (--pending_ == 0) cv_done_.notify_all();
  }
}

}  // namespace lragent
