// The Prometheus text of the server's metrics: cumulative histogram buckets, escaped labels,
// per-model counters and the KV snapshot, as the exposition format (0.0.4) defines them.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "server/metrics.h"

namespace lragent::server {
namespace {

// The value of the line that starts with `series` followed by a space; -1 if none.
double value_of(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

TEST(Metrics, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Histogram h({0.001, 0.005, 0.5, 1.0, 10.0});
  for (double s : {0.0005, 0.003, 0.003, 0.7, 42.0}) h.observe(s);
  const std::string text = h.render("x_seconds", "model_name=\"plan\"");
  EXPECT_EQ(value_of(text, "x_seconds_bucket{model_name=\"plan\",le=\"0.001\"}"), 1);
  EXPECT_EQ(value_of(text, "x_seconds_bucket{model_name=\"plan\",le=\"0.005\"}"), 3);
  EXPECT_EQ(value_of(text, "x_seconds_bucket{model_name=\"plan\",le=\"0.5\"}"), 3);
  EXPECT_EQ(value_of(text, "x_seconds_bucket{model_name=\"plan\",le=\"1\"}"), 4);
  EXPECT_EQ(value_of(text, "x_seconds_bucket{model_name=\"plan\",le=\"10\"}"), 4);
  EXPECT_EQ(value_of(text, "x_seconds_bucket{model_name=\"plan\",le=\"+Inf\"}"), 5);
  EXPECT_EQ(value_of(text, "x_seconds_count{model_name=\"plan\"}"), 5);
  EXPECT_NEAR(value_of(text, "x_seconds_sum{model_name=\"plan\"}"), 0.0005 + 0.006 + 0.7 + 42.0, 1e-9);
  // Without labels: no empty braces on _sum and _count.
  const std::string bare = h.render("y", "");
  EXPECT_EQ(value_of(bare, "y_bucket{le=\"+Inf\"}"), 5);
  EXPECT_EQ(value_of(bare, "y_count"), 5);
}

TEST(Metrics, CountersPerModelAndTheKvSnapshot) {
  Metrics m;
  RequestRecord r;
  r.model = "plan";
  r.finish_reasons = {"length", "stop"};
  r.prompt_tokens = 10;
  r.generation_tokens = 7;
  r.reused_tokens = 4;
  r.prefilled_tokens = 6;
  r.ttft_seconds = 0.02;
  r.e2e_seconds = 0.3;
  m.record(r);
  r.finish_reasons = {"stop"};
  r.ttft_seconds = -1;  // nothing generated: no TTFT observation
  m.record(r);
  RequestRecord odd;
  odd.model = "a\"b\\c";
  m.record(odd);
  m.record_http("/v1/completions", 200);
  m.record_http("/v1/completions", 200);
  m.record_http("other", 404);
  KvSnapshot kv;
  kv.trajectories = 2;
  kv.evicted = 1;
  kv.bytes.base = 1000;
  kv.bytes.lr = 60;
  kv.bytes.allocated = 2048;
  kv.preempted = 3;
  kv.arena_used = 1024;
  kv.arena_capacity = 4096;
  m.set_kv(kv);
  m.set_base_model("tiny");
  for (const char* model : {"tiny", "plan", "plan", "reflect"}) m.request_waiting(model);
  m.request_running("plan");
  const std::string t = m.render();
  EXPECT_EQ(value_of(t, "lragent:prompt_tokens_total{model_name=\"plan\"}"), 20);
  EXPECT_EQ(value_of(t, "lragent:generation_tokens_total{model_name=\"plan\"}"), 14);
  EXPECT_EQ(value_of(t, "lragent:prompt_tokens_reused_total{model_name=\"plan\"}"), 8);
  EXPECT_EQ(value_of(t, "lragent:prefill_tokens_total{model_name=\"plan\"}"), 12);
  EXPECT_EQ(value_of(t, "lragent:request_success_total{model_name=\"plan\",finished_reason=\"stop\"}"), 2);
  EXPECT_EQ(value_of(t, "lragent:request_success_total{model_name=\"plan\",finished_reason=\"length\"}"), 1);
  EXPECT_EQ(value_of(t, "lragent:time_to_first_token_seconds_count{model_name=\"plan\"}"), 1);
  EXPECT_EQ(value_of(t, "lragent:e2e_request_latency_seconds_count{model_name=\"plan\"}"), 2);
  EXPECT_EQ(value_of(t, "lragent:prompt_tokens_total{model_name=\"a\\\"b\\\\c\"}"), 0);  // escaped
  EXPECT_EQ(value_of(t, "lragent:http_requests_total{route=\"/v1/completions\",status=\"200\"}"), 2);
  EXPECT_EQ(value_of(t, "lragent:http_requests_total{route=\"other\",status=\"404\"}"), 1);
  EXPECT_EQ(value_of(t, "lragent:trajectories"), 2);
  EXPECT_EQ(value_of(t, "lragent:trajectories_evicted_total"), 1);
  EXPECT_EQ(value_of(t, "lragent:kv_cache_bytes{kind=\"base\"}"), 1000);
  EXPECT_EQ(value_of(t, "lragent:kv_cache_bytes{kind=\"lr\"}"), 60);
  EXPECT_EQ(value_of(t, "lragent:kv_cache_allocated_bytes"), 2048);
  EXPECT_EQ(value_of(t, "lragent:num_preemptions_total"), 3);
  EXPECT_EQ(value_of(t, "lragent:kv_memory_used_bytes"), 1024);
  EXPECT_EQ(value_of(t, "lragent:kv_memory_bytes"), 4096);
  EXPECT_EQ(value_of(t, "lragent:kv_cache_usage_perc"), 0.25);
  EXPECT_EQ(value_of(t, "lragent:num_requests_running"), 1);
  EXPECT_EQ(value_of(t, "lragent:num_requests_waiting"), 3);
  // vLLM's LoRA info gauge: adapters (not the base model) with requests running, waiting.
  const std::string info = "lragent:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"plan\",waiting_lora_adapters=\"plan,reflect\"}";
  EXPECT_GT(value_of(t, info), 1.7e9) << t;
  m.request_running("plan");
  m.request_done("plan");
  m.request_done("plan");
  EXPECT_GT(value_of(m.render(), "lragent:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"reflect\"}"), 1.7e9);
  // Every series has its # TYPE line, once.
  for (const char* name : {"lragent:prompt_tokens_total", "lragent:time_to_first_token_seconds", "lragent:kv_cache_bytes"}) {
    const std::string type = std::string("# TYPE ") + name + " ";
    const size_t at = t.find(type);
    EXPECT_NE(at, std::string::npos) << name;
    EXPECT_EQ(t.find(type, at + 1), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace lragent::server
