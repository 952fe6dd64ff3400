#include "server/background_jobs.h"

namespace lragent::server {

void BackgroundJobs::reap_locked() {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second->done.load()) {
      it->second->thread.join();  // returned already: no wait
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

Status BackgroundJobs::start(const std::string& id, Work work) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return make_error(ErrorCode::kInternal, "the server is shutting down");
  reap_locked();
  if (jobs_.count(id)) return make_error(ErrorCode::kInvalidArgument, "a background job '{}' is running already", id);
  if (jobs_.size() >= max_running_)
    return make_error(ErrorCode::kOutOfMemory,
                      "the server runs at most {} background responses at once (--max-stored-responses), and that many "
                      "are running: wait for one to end, cancel one, or send the request without \"background\"",
                      jobs_.size());
  auto job = std::make_unique<Job>();
  Job* j = job.get();
  // The thread only touches its Job, which stays in jobs_ (or in cancel()'s hands) until joined.
  j->thread = std::thread([j, work = std::move(work)] {
    work(j->cancelled);
    j->done.store(true);
  });
  jobs_.emplace(id, std::move(job));
  return Status::Ok();
}

bool BackgroundJobs::cancel(const std::string& id) {
  std::unique_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return false;
    job = std::move(it->second);
    jobs_.erase(it);
  }
  const bool was_running = !job->done.load();
  job->cancelled.store(true);
  job->thread.join();  // outside the lock: other jobs start and end meanwhile
  return was_running;
}

void BackgroundJobs::cancel_all() {
  std::unordered_map<std::string, std::unique_ptr<Job>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    all.swap(jobs_);
  }
  for (auto& [id, job] : all) job->cancelled.store(true);
  for (auto& [id, job] : all) job->thread.join();
}

size_t BackgroundJobs::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, job] : jobs_) n += job->done.load() ? 0 : 1;
  return n;
}

void EventLog::append(std::vector<nlohmann::json>& events) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (nlohmann::json& e : events) events_.push_back(std::move(e));
  }
  events.clear();
  cv_.notify_all();
}

void EventLog::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool EventLog::read(size_t from, std::chrono::milliseconds wait, std::vector<nlohmann::json>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return closed_ || events_.size() > from; });
  for (size_t k = from; k < events_.size(); ++k) out->push_back(events_[k]);
  return closed_;
}

std::shared_ptr<EventLog> EventLogs::open(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto log = std::make_shared<EventLog>();
  logs_[id] = log;
  return log;
}

std::shared_ptr<EventLog> EventLogs::find(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = logs_.find(id);
  return it == logs_.end() ? nullptr : it->second;
}

void EventLogs::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  logs_.erase(id);
}

size_t EventLogs::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return logs_.size();
}

}  // namespace lragent::server
