// BackgroundJobs (server/background_jobs.h): jobs run on threads of their own, cancel(id) stops
// one and returns once its work returned, the bound on jobs at once holds, and cancel_all()
// stops every job and refuses new ones; EventLog's readers see every event; EventLogs keep a
// log as long as the response store keeps its response.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/background_jobs.h"
#include "server/responses_api.h"

namespace lragent::server {
namespace {

// Work that runs until cancelled, counting how many of its kind returned.
BackgroundJobs::Work until_cancelled(std::atomic<int>* returned) {
  return [returned](const std::atomic<bool>& cancelled) {
    while (!cancelled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    returned->fetch_add(1);
  };
}

TEST(BackgroundJobs, CancelStopsAJobAndWaitsForIt) {
  std::atomic<int> returned{0};  // before the jobs: it outlives their threads
  BackgroundJobs jobs(4);
  ASSERT_TRUE(jobs.start("a", until_cancelled(&returned)).ok());
  ASSERT_TRUE(jobs.start("b", until_cancelled(&returned)).ok());
  EXPECT_EQ(jobs.running(), 2u);
  auto twice = jobs.start("a", until_cancelled(&returned));
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(jobs.cancel("a"));
  EXPECT_EQ(returned.load(), 1);  // its work returned before cancel did
  EXPECT_EQ(jobs.running(), 1u);
  EXPECT_FALSE(jobs.cancel("a"));  // gone
  EXPECT_FALSE(jobs.cancel("nobody"));
  jobs.cancel_all();
  EXPECT_EQ(returned.load(), 2);
  EXPECT_EQ(jobs.running(), 0u);
  auto closed = jobs.start("c", until_cancelled(&returned));
  ASSERT_FALSE(closed.ok());
  EXPECT_NE(closed.error().message.find("shutting down"), std::string::npos);
}

// A job that ended on its own is not cancelled (cancel says so) and makes room for the next.
TEST(BackgroundJobs, AJobThatEndedIsNotCancelledAndFreesItsPlace) {
  std::atomic<bool> ran{false};
  std::atomic<int> returned{0};  // before the jobs: it outlives their threads
  BackgroundJobs jobs(1);
  ASSERT_TRUE(jobs.start("quick", [&ran](const std::atomic<bool>&) { ran.store(true); }).ok());
  // Until "quick" has returned, it holds the only place.
  for (int i = 0; i < 10000 && jobs.running() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(jobs.running(), 0u);
  EXPECT_TRUE(ran.load());
  ASSERT_TRUE(jobs.start("long", until_cancelled(&returned)).ok());
  EXPECT_FALSE(jobs.cancel("quick"));
  auto full = jobs.start("more", until_cancelled(&returned));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(full.error().message.find("at most 1 background responses at once"), std::string::npos) << full.error().message;
  // The destructor cancels what still runs.
}

// An event log is read from any index, while events come (a reader waits for them) and after it
// closed; the logs kept are the newest `max`.
TEST(EventLog, ReadersGetEveryEventFromWhereTheyStart) {
  EventLog log;
  std::vector<nlohmann::json> got;
  EXPECT_FALSE(log.read(0, std::chrono::milliseconds(1), &got));
  EXPECT_TRUE(got.empty());
  std::vector<nlohmann::json> all;
  std::thread reader([&] {
    for (size_t at = 0;;) {
      std::vector<nlohmann::json> some;
      const bool closed = log.read(at, std::chrono::milliseconds(50), &some);
      at += some.size();
      for (auto& e : some) all.push_back(std::move(e));
      if (closed) break;
    }
  });
  for (int k = 0; k < 100; ++k) {
    std::vector<nlohmann::json> events = {{{"sequence_number", k}}};
    log.append(events);
    EXPECT_TRUE(events.empty());
  }
  log.close();
  reader.join();
  ASSERT_EQ(all.size(), 100u);
  for (int k = 0; k < 100; ++k) EXPECT_EQ(all[k]["sequence_number"], k);
  std::vector<nlohmann::json> tail;
  EXPECT_TRUE(log.read(97, std::chrono::milliseconds(0), &tail));
  ASSERT_EQ(tail.size(), 3u);
  EXPECT_EQ(tail[0]["sequence_number"], 97);

  EventLogs logs;
  auto a = logs.open("a");
  logs.open("b");
  EXPECT_EQ(logs.find("a"), a);
  logs.erase("b");
  EXPECT_EQ(logs.find("b"), nullptr);
  EXPECT_NE(logs.open("a"), a);  // a second open of an id starts it afresh
  EXPECT_EQ(logs.size(), 1u);

  // Kept as long as the response: the store's eviction drops the log with it (as the server wires
  // them), not a put that replaces a response nor an erase.
  ResponseStore store(2, 1 << 20);
  store.on_evict([&logs](const std::string& id) { logs.erase(id); });
  for (const char* id : {"r1", "r2"}) {
    store.put(id, "", nlohmann::json{{"id", id}}, nlohmann::ordered_json::array());
    logs.open(id);
  }
  store.put("r1", "", nlohmann::json{{"id", "r1"}, {"status", "completed"}}, nlohmann::ordered_json::array());
  EXPECT_NE(logs.find("r1"), nullptr);
  store.put("r3", "", nlohmann::json{{"id", "r3"}}, nlohmann::ordered_json::array());  // r2 is the least recent
  EXPECT_FALSE(store.get("r2"));
  EXPECT_EQ(logs.find("r2"), nullptr);
  EXPECT_NE(logs.find("r1"), nullptr);
}

}  // namespace
}  // namespace lragent::server
