// The server's counters, exposed as Prometheus text at GET /metrics (as vLLM's /metrics, with
// the prefix "lragent:"). Besides vLLM's usual ones (requests, prompt and generation tokens,
// time to first token, request latency, tokens per engine pass, KV bytes) it counts what sharing saves: prompt tokens a
// kept trajectory already held, and the tokens agents actually computed to catch up.
//
// Thread-safe; GET /metrics never waits for the engine (the KV figures are a snapshot the
// engine leaves after each request).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/speculative.h"
#include "kv/sharing.h"

namespace lragent::server {

// A Prometheus histogram of seconds: cumulative bucket counts, sum and count.
class Histogram {
 public:
  // vLLM's buckets (its time-to-first-token and end-to-end latency histograms).
  static const std::vector<double>& ttft_bounds();
  static const std::vector<double>& e2e_bounds();
  // vLLM's iteration_tokens_total buckets (tokens of one engine pass).
  static const std::vector<double>& iteration_token_bounds();
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size(), 0) {}
  void observe(double seconds);
  // The name_bucket{labels,le=...} / name_sum{labels} / name_count{labels} lines (`labels`:
  // e.g. model_name="plan", may be empty); the caller writes # HELP and # TYPE once per name.
  std::string render(const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;     // [buckets] upper bounds, ascending
  std::vector<uint64_t> buckets_;  // [buckets] observations in (previous bound, bound] (not cumulative)
  uint64_t count_ = 0;
  double sum_ = 0;
};

// One finished request, as run() saw it.
struct RequestRecord {
  std::string model;                         // the served name
  std::vector<std::string> finish_reasons;   // [choices]
  int64_t prompt_tokens = 0;                 // each prompt once (usage's count)
  int64_t generation_tokens = 0;
  int64_t reused_tokens = 0;     // prompt tokens the kept trajectories already held (all choices)
  int64_t prefilled_tokens = 0;  // tokens the agent computed to catch up (all choices)
  DraftCounts drafts;            // speculative decoding's (all choices)
  double ttft_seconds = -1;      // arrival to the first generated token (< 0: none was generated)
  double e2e_seconds = 0;        // arrival to the end
};

// The sharing state after a request: the kept trajectories and their cache bytes.
struct KvSnapshot {
  int64_t trajectories = 0;  // holding cache entries
  int64_t evicted = 0;
  int64_t preempted = 0;  // running choices stopped to make room in the KV memory (resumed by recompute)
  int64_t copied = 0, copied_tokens = 0;  // trajectories started as a copy of another's prefix, and its tokens
  CacheBytes bytes;  // summed over the trajectories (a block two share counts in each)
  // The one KV arena of every trajectory (SessionPoolOptions::share_blocks): bytes of its slabs
  // in use (a shared block once) and its size; -1 without one.
  int64_t arena_used = -1, arena_capacity = -1;
};

class Metrics {
 public:
  void record(const RequestRecord& r);
  // Every HTTP answer: its route (unknown paths count as "other") and status.
  void record_http(const std::string& route, int status);
  void set_kv(const KvSnapshot& kv);
  // Only the shared arena's bytes in use (KvSnapshot::arena_used), after each engine pass.
  void set_kv_used(int64_t arena_used);
  // A request of `model` starts waiting for the engine, takes it, leaves it (each counted as it
  // happens, so the gauges hold whatever the threads' order).
  void request_waiting(const std::string& model);
  void request_running(const std::string& model);
  void request_done(const std::string& model);
  // The base model's served name: every other model a request names is an adapter, listed in
  // lragent:lora_requests_info (vLLM's vllm:lora_requests_info).
  void set_base_model(std::string name) {
    std::lock_guard<std::mutex> lock(mu_);
    base_model_ = std::move(name);
  }
  // One batched forward pass of the engine: the requests it served and the tokens it ran.
  void record_pass(int64_t sequences, int64_t tokens);
  // The Responses API's stored responses (ResponseStore's size and bytes), as /metrics is asked.
  void set_stored_responses(int64_t count, int64_t bytes) {
    stored_responses_ = count;
    stored_response_bytes_ = bytes;
  }
  // Prometheus text exposition format 0.0.4.
  std::string render() const;

 private:
  mutable std::mutex mu_;
  struct PerModel {
    int64_t prompt = 0, generation = 0, reused = 0, prefilled = 0;
    DraftCounts drafts;
    std::map<std::string, int64_t> finished;  // finish_reason -> choices
    Histogram ttft{Histogram::ttft_bounds()}, e2e{Histogram::e2e_bounds()};
  };
  std::map<std::string, PerModel> models_;
  std::map<std::pair<std::string, int>, int64_t> http_;  // (route, status) -> answers
  KvSnapshot kv_;
  int64_t passes_ = 0, pass_sequences_ = 0;
  Histogram pass_tokens_{Histogram::iteration_token_bounds()};
  std::atomic<int64_t> running_{0}, waiting_{0};
  std::string base_model_;
  std::map<std::string, std::pair<int64_t, int64_t>> lora_;  // adapter -> (waiting, running) requests
  double lora_changed_ = 0;  // unix seconds of the last change of lora_ (the info gauge's value, as vLLM's)
  std::atomic<int64_t> stored_responses_{0}, stored_response_bytes_{0};
};

}  // namespace lragent::server
