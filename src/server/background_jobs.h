// Work a request starts and nobody waits on (the Responses API's "background": true): each job
// runs on a thread of its own under the response's id, can be cancelled by that id, and all of
// them are cancelled and joined before the server lets its engine go.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

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

// The events of a streamed background response, as its job makes them: the request's own stream
// and GET /v1/responses/{id}?stream=true read them, from any point, while more come and after.
// Event k is the one of sequence_number k. Thread-safe.
class EventLog {
 public:
  // Moves `events` in (emptying it) and wakes the readers.
  void append(std::vector<nlohmann::json>& events);
  void close();  // the last event is in
  // The events from index `from` on (copied into *out), waiting up to `wait` for one when there
  // is none yet. True when the log is closed and *out holds all it has left past `from`.
  bool read(size_t from, std::chrono::milliseconds wait, std::vector<nlohmann::json>* out);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<nlohmann::json> events_;  // [events so far]
  bool closed_ = false;
};

// The event logs of streamed background responses by response id. A log is kept as long as its
// response is stored: the server erases it when the response store drops that response
// (ResponseStore::on_evict) or a client deletes it, so one LRU bounds both. Thread-safe.
class EventLogs {
 public:
  std::shared_ptr<EventLog> open(const std::string& id);  // a new, empty log for `id`
  std::shared_ptr<EventLog> find(const std::string& id);  // null when none is kept
  void erase(const std::string& id);
  size_t size();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<EventLog>> logs_;
};

}  // namespace lragent::server
