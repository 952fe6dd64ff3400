// Running benchmark traces (agents/trace.h) under the KV sharing modes and measuring them:
// the library half of `lragent bench trace` (docs/bench.md defines every metric).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "agents/trace.h"
#include "kv/sharing.h"
#include "model/llama.h"

namespace lragent {

struct TraceBenchOptions {
  int page_size = 16;
  std::vector<int> droidspeak_layers = {0};  // recompute layers of droidspeak
  int64_t kv_budget_bytes = 0;               // > 0: the KV pools of a cell get at most this; 0: sized to the trace
  bool decode_lookahead = true;              // ReplayOptions::decode_lookahead
  bool evict_private = true;                 // SharingOptions::evict_private (under a budget)
};

// One (length, mode) cell.
struct TraceCell {
  int64_t length = 0;                 // target (= final) trajectory tokens
  ShareMode mode = ShareMode::kNone;
  // ok | oom (KV pool or weights+pools do not fit) | n/a (the mode cannot run these adapters)
  // | context (longer than the model's positions) | error (anything else: a bug)
  std::string status = "ok";
  std::string message;                // why, when not ok
  int agent_calls = 0;
  int64_t final_tokens = 0;
  double ttft_s = 0;                  // sum over agent calls of catch-up prefill + first token
  double wall_s = 0;                  // first step to last, pools already allocated
  double throughput_tok_s = 0;        // final_tokens / wall_s
  int64_t decode_tokens = 0;          // tokens decoded after each call's first
  double decode_s = 0;
  double decode_tok_s = 0;            // decode_tokens / decode_s
  int64_t prefill_tokens = 0;         // catch-up tokens over all calls
  int64_t computed_tokens = 0;        // forward-pass tokens over all agents (every layer)
  int64_t partial_tokens = 0;         // catch-up tokens run through only droidspeak's first layers
  CacheBytes cache;                   // the peak over the trace (TrajectoryKv::peak_bytes)
  int64_t evictions = 0;              // private caches dropped for room (SharingOptions::evict_private)
  int64_t evicted_tokens = 0;         // the tokens they held (their agents computed them again)
  int64_t kv_max_tokens = 0;          // tokens the KV memory holds at this mode's bytes per token
  int64_t kv_pool_bytes = 0;          // bytes of KV memory reserved up front (the trajectory's arena)
  int64_t device_peak_bytes = 0;      // Backend::memory_stats().peak during the cell (0 on the CPU)
  int64_t device_capacity_bytes = 0;
  // The timed runs' wall times (the figures above are the median run's); empty for one run.
  std::vector<double> wall_s_runs;
  int warmup_runs = 0;                // untimed runs of this very cell before the timed ones
};

// Runs a cell `warmup` times untimed, then `runs` times, and returns the run of median wall time
// with every timed run's wall time: one-off costs of a new shape (plan lookups, graph capture)
// then land in the warm-up, not in whichever mode happens to meet the shape first. A cell that is
// not "ok" (OOM, n/a, context) or an error stops at once.
Result<TraceCell> run_trace_cell_repeated(LlamaModel& model, const std::vector<std::string>& names,
                                          const std::vector<const LoraAdapter*>& adapters, const Trace& trace,
                                          ShareMode mode, const TraceBenchOptions& opts, int warmup, int runs);

// Bytes the KV pools of one trajectory reserve per token of capacity, exactly as
// TrajectoryKv::create sizes them (pools of every mode hold max_tokens tokens each).
int64_t kv_pool_bytes_per_token(const ModelConfig& cfg, ShareMode mode, int n_agents, int rank_k, int rank_v,
                                int n_recompute_layers, int64_t value_bytes);

// Runs `trace` with agents `names[i]` = `adapters[i]` under `mode` and measures it. Running out of
// KV memory, a mode the adapters cannot use (base-lr without shared A) or a trace longer than the
// model's context are reported in the cell's status, not as errors; other failures are errors.
Result<TraceCell> run_trace_cell(LlamaModel& model, const std::vector<std::string>& names,
                                 const std::vector<const LoraAdapter*>& adapters, const Trace& trace, ShareMode mode,
                                 const TraceBenchOptions& opts);

// Cache bytes when n = 1..max_agents agents (agent i uses adapters[i % size]) have each processed
// all `length` tokens of one trajectory: TrajectoryKv::bytes() on sessions whose counters are
// advanced without any forward pass. Per mode, one CacheBytes per n; `allocated` is 0.
// An empty vector for a mode the adapters cannot use (base-lr without shared A).
Result<std::vector<CacheBytes>> agents_memory_curve(const ModelConfig& cfg, const std::vector<const LoraAdapter*>& adapters,
                                                    ShareMode mode, int64_t length, int max_agents,
                                                    int64_t value_bytes, const TraceBenchOptions& opts);

nlohmann::json cell_to_json(const TraceCell& c);
nlohmann::json cache_bytes_json(const CacheBytes& b);

// The poster's table: rows = lengths, per mode TTFT s | throughput tok/s | KV memory GB
// (cache.total() / 1e9); cells not ok show their status.
std::string trace_markdown_table(const std::vector<TraceCell>& cells, const std::vector<ShareMode>& modes,
                                 const std::vector<int64_t>& lengths);

}  // namespace lragent
