#include "server/metrics.h"

#include <chrono>

#include <fmt/core.h>
#include <fmt/format.h>

namespace lragent::server {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A label value with Prometheus' escapes (backslash, double quote, newline).
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

const std::vector<double>& Histogram::ttft_bounds() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                        1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  return b;
}

const std::vector<double>& Histogram::e2e_bounds() {
  static const std::vector<double> b = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                        30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

const std::vector<double>& Histogram::iteration_token_bounds() {
  static const std::vector<double> b = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  return b;
}

void Histogram::observe(double seconds) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (seconds <= bounds_[i]) {
      ++buckets_[i];
      break;
    }
  ++count_;
  sum_ += seconds;
}

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::string out;
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += buckets_[i];
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, count_);
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, braces, sum_, name, braces, count_);
  return out;
}

void Metrics::record(const RequestRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  PerModel& m = models_[r.model];
  m.prompt += r.prompt_tokens;
  m.generation += r.generation_tokens;
  m.reused += r.reused_tokens;
  m.prefilled += r.prefilled_tokens;
  m.drafts += r.drafts;
  for (const std::string& f : r.finish_reasons) ++m.finished[f];
  if (r.ttft_seconds >= 0) m.ttft.observe(r.ttft_seconds);
  m.e2e.observe(r.e2e_seconds);
}

void Metrics::record_http(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[{route, status}];
}

void Metrics::record_pass(int64_t sequences, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++passes_;
  pass_sequences_ += sequences;
  pass_tokens_.observe(static_cast<double>(tokens));
}

void Metrics::set_kv(const KvSnapshot& kv) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_ = kv;
}

void Metrics::set_kv_used(int64_t arena_used) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_.arena_used = arena_used;
}

void Metrics::request_waiting(const std::string& model) {
  ++waiting_;
  std::lock_guard<std::mutex> lock(mu_);
  if (model == base_model_) return;
  ++lora_[model].first;
  lora_changed_ = unix_seconds();
}

void Metrics::request_running(const std::string& model) {
  --waiting_;
  ++running_;
  std::lock_guard<std::mutex> lock(mu_);
  if (model == base_model_) return;
  auto& [waiting, running] = lora_[model];
  --waiting;
  ++running;
  lora_changed_ = unix_seconds();
}

void Metrics::request_done(const std::string& model) {
  --running_;
  std::lock_guard<std::mutex> lock(mu_);
  if (model == base_model_) return;
  auto it = lora_.find(model);
  if (it == lora_.end()) return;
  if (--it->second.second == 0 && it->second.first == 0) lora_.erase(it);
  lora_changed_ = unix_seconds();
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  {
    std::vector<std::string> running, waiting;
    for (const auto& [name, n] : lora_) {
      if (n.second > 0) running.push_back(name);
      if (n.first > 0) waiting.push_back(name);
    }
    // vLLM's info gauge: the adapters with requests running and waiting, valued at the time they
    // last changed; max_lora 0: lragent batches any number of adapters together.
    header(out, "lragent:lora_requests_info", "gauge",
           "Adapters with requests running and waiting (labels), valued at the unix time that last changed.");
    out += fmt::format("lragent:lora_requests_info{{max_lora=\"0\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {:.6f}\n",
                       label(fmt::format("{}", fmt::join(running, ","))),
                       label(fmt::format("{}", fmt::join(waiting, ","))), lora_changed_);
  }
  header(out, "lragent:num_requests_running", "gauge", "Requests in the engine (their passes batched together).");
  out += fmt::format("lragent:num_requests_running {}\n", running_.load());
  header(out, "lragent:num_requests_waiting", "gauge", "Requests waiting for the engine.");
  out += fmt::format("lragent:num_requests_waiting {}\n", waiting_.load());
  header(out, "lragent:stored_responses", "gauge",
         "Responses kept in memory for GET /v1/responses/{id} and previous_response_id (--max-stored-responses).");
  out += fmt::format("lragent:stored_responses {}\n", stored_responses_.load());
  header(out, "lragent:stored_response_bytes", "gauge", "Bytes of the stored responses' JSON (at most 256 MB).");
  out += fmt::format("lragent:stored_response_bytes {}\n", stored_response_bytes_.load());

  auto per_model = [&](const char* name, const char* help, auto value) {
    header(out, name, "counter", help);
    for (const auto& [model, m] : models_) out += fmt::format("{}{{model_name=\"{}\"}} {}\n", name, label(model), value(m));
  };
  per_model("lragent:prompt_tokens_total", "Prompt tokens of finished requests (each prompt once).",
            [](const PerModel& m) { return m.prompt; });
  per_model("lragent:generation_tokens_total", "Generated tokens.", [](const PerModel& m) { return m.generation; });
  per_model("lragent:prompt_tokens_reused_total",
            "Prompt tokens a kept trajectory already held (its token ids kept; a new trajectory's BOS and a "
            "completion's last token count, although their entries are computed with the request: "
            "prefill_tokens_total says what was computed).",
            [](const PerModel& m) { return m.reused; });
  per_model("lragent:prefill_tokens_total",
            "Tokens the agent computed to catch up before decoding (under base-lr and full, only those no agent "
            "had computed).",
            [](const PerModel& m) { return m.prefilled; });
  // vLLM's speculative decoding counters (its spec_decode_num_* names).
  per_model("lragent:spec_decode_num_drafts_total",
            "Engine passes of a request's step that checked speculative drafts (--speculative-config).",
            [](const PerModel& m) { return m.drafts.passes; });
  per_model("lragent:spec_decode_num_draft_tokens_total", "Speculative draft tokens checked.",
            [](const PerModel& m) { return m.drafts.drafted; });
  per_model("lragent:spec_decode_num_accepted_tokens_total",
            "Speculative draft tokens the model agreed with: each a token generated without a pass of its own.",
            [](const PerModel& m) { return m.drafts.accepted; });
  header(out, "lragent:request_success_total", "counter", "Finished completions (choices) by finish reason.");
  for (const auto& [model, m] : models_)
    for (const auto& [reason, n] : m.finished)
      out += fmt::format("lragent:request_success_total{{model_name=\"{}\",finished_reason=\"{}\"}} {}\n", label(model),
                         label(reason), n);
  header(out, "lragent:time_to_first_token_seconds", "histogram", "Arrival to the first generated token.");
  for (const auto& [model, m] : models_)
    out += m.ttft.render("lragent:time_to_first_token_seconds", fmt::format("model_name=\"{}\"", label(model)));
  header(out, "lragent:e2e_request_latency_seconds", "histogram", "Arrival to the last token.");
  for (const auto& [model, m] : models_)
    out += m.e2e.render("lragent:e2e_request_latency_seconds", fmt::format("model_name=\"{}\"", label(model)));

  header(out, "lragent:http_requests_total", "counter", "HTTP answers by route and status.");
  for (const auto& [key, n] : http_)
    out += fmt::format("lragent:http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", label(key.first), key.second, n);

  header(out, "lragent:engine_passes_total", "counter", "Batched forward passes the engine ran.");
  out += fmt::format("lragent:engine_passes_total {}\n", passes_);
  header(out, "lragent:engine_pass_sequences_total", "counter",
         "Requests served by those passes, summed (over engine_passes_total: the mean batch).");
  out += fmt::format("lragent:engine_pass_sequences_total {}\n", pass_sequences_);
  header(out, "lragent:iteration_tokens_total", "histogram", "Tokens of one engine pass (decode tokens and prompt chunks).");
  out += pass_tokens_.render("lragent:iteration_tokens_total", "");

  header(out, "lragent:trajectories", "gauge", "Trajectories kept that hold cache entries (each one's caches shared by its agents).");
  out += fmt::format("lragent:trajectories {}\n", kv_.trajectories);
  header(out, "lragent:trajectories_evicted_total", "counter", "Trajectories dropped for a new one (least recently used).");
  out += fmt::format("lragent:trajectories_evicted_total {}\n", kv_.evicted);
  header(out, "lragent:num_preemptions_total", "counter",
         "Running requests preempted because the KV memory was full (what they added to their trajectory given back; resumed by recompute).");
  out += fmt::format("lragent:num_preemptions_total {}\n", kv_.preempted);
  header(out, "lragent:trajectories_copied_total", "counter",
         "Trajectories started as a copy of another's prefix (a request beside the one running on it, or parting from it).");
  out += fmt::format("lragent:trajectories_copied_total {}\n", kv_.copied);
  header(out, "lragent:trajectory_copied_tokens_total", "counter",
         "Prompt tokens those copies took over (their cache entries shared or copied, not computed).");
  out += fmt::format("lragent:trajectory_copied_tokens_total {}\n", kv_.copied_tokens);
  header(out, "lragent:kv_cache_bytes", "gauge",
         "KV cache bytes of the kept trajectories: base (X·W0, shared), lr (X·A, low-rank), full (private).");
  out += fmt::format("lragent:kv_cache_bytes{{kind=\"base\"}} {}\n", kv_.bytes.base);
  out += fmt::format("lragent:kv_cache_bytes{{kind=\"lr\"}} {}\n", kv_.bytes.lr);
  out += fmt::format("lragent:kv_cache_bytes{{kind=\"full\"}} {}\n", kv_.bytes.full);
  header(out, "lragent:kv_cache_allocated_bytes", "gauge",
         "Bytes of the pages holding those caches (a page two trajectories share counts in each).");
  out += fmt::format("lragent:kv_cache_allocated_bytes {}\n", kv_.bytes.allocated);
  if (kv_.arena_capacity >= 0) {
    header(out, "lragent:kv_memory_used_bytes", "gauge",
           "Bytes of the KV memory (one arena for every trajectory) in use: pages a copy shares with its source once.");
    out += fmt::format("lragent:kv_memory_used_bytes {}\n", kv_.arena_used);
    header(out, "lragent:kv_memory_bytes", "gauge", "Bytes of that KV memory.");
    out += fmt::format("lragent:kv_memory_bytes {}\n", kv_.arena_capacity);
    header(out, "lragent:kv_cache_usage_perc", "gauge",
           "The fraction of that KV memory in use, 0 to 1 (vLLM's kv_cache_usage_perc, for its dashboards).");
    out += fmt::format("lragent:kv_cache_usage_perc {}\n",
                       kv_.arena_capacity > 0 ? static_cast<double>(kv_.arena_used) / kv_.arena_capacity : 0.0);
  }
  return out;
}

}  // namespace lragent::server
