// Work a request starts and nobody waits on (the Responses API's "background": true): each job
// runs on a thread of its own under the response's id, can be cancelled by that id, and all of
// them are cancelled and joined before the server lets its engine go.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/result.h"

namespace lragent::server {

class BackgroundJobs {
 public:
  // `max_running`: jobs that may run at once (start refuses more).
  explicit BackgroundJobs(size_t max_running) : max_running_(max_running) {}
  ~BackgroundJobs() { cancel_all(); }
  BackgroundJobs(const BackgroundJobs&) = delete;
  BackgroundJobs& operator=(const BackgroundJobs&) = delete;

  // The job's work: it should return soon after `cancelled` turns true.
  using Work = std::function<void(const std::atomic<bool>& cancelled)>;
  // Runs `work` on a new thread. kOutOfMemory when max_running jobs are running; kInvalidArgument
  // when a job of that id is running; kInternal after cancel_all() (the server is stopping).
  Status start(const std::string& id, Work work);
  // Cancels job `id` and waits until its work returned. False when no job of that id is running
  // (never started, or already returned): nothing was cancelled.
  bool cancel(const std::string& id);
  // Cancels every job, waits for all, and refuses new ones from then on.
  void cancel_all();
  size_t running() const;

 private:
  struct Job {
    std::atomic<bool> cancelled{false};
    std::atomic<bool> done{false};  // its work returned
    std::thread thread;
  };
  void reap_locked();  // joins the jobs whose work returned (mu_ held)
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Job>> jobs_;
  size_t max_running_;
  bool closed_ = false;
};

}  // namespace lragent::server
