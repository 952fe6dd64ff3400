#include "agents/trace_bench.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace lragent {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The rank of `t` in the adapter's first layer (0 when not adapted; TrajectoryKv checks that
// every layer uses the same one).
int module_rank(const LoraAdapter* a, LoraTarget t) {
  if (!a || a->layers.empty()) return 0;
  const auto& m = a->layers.front()[static_cast<size_t>(t)];
  return m ? m->rank : 0;
}

// Whether a session-creation error means "this mode cannot serve these adapters" (base-lr needs
// one shared A) rather than a failure.
bool mode_not_applicable(ShareMode mode, const Error& e) {
  return mode == ShareMode::kBaseLr && e.code == ErrorCode::kInvalidArgument;
}

SharingOptions sharing_for(ShareMode mode, const TraceBenchOptions& o, int64_t max_tokens) {
  SharingOptions s;
  s.mode = mode;
  s.page_size = o.page_size;
  s.max_tokens = max_tokens;
  if (mode == ShareMode::kDroidSpeak) s.recompute_layers = o.droidspeak_layers;
  s.evict_private = o.evict_private;
  return s;
}

}  // namespace

int64_t kv_pool_bytes_per_token(const ModelConfig& cfg, ShareMode mode, int n_agents, int rank_k, int rank_v,
                                int n_recompute, int64_t value_bytes) {
  const int64_t L = cfg.num_layers, n = n_agents, kv_row = 2LL * cfg.num_kv_heads * cfg.head_dim;  // K + V
  int64_t values = 0;
  switch (mode) {
    case ShareMode::kNone: values = n * L * kv_row; break;
    case ShareMode::kFull:
    case ShareMode::kIcarus: values = L * kv_row; break;
    case ShareMode::kDroidSpeak: values = (L - n_recompute) * kv_row + n * n_recompute * kv_row; break;
    case ShareMode::kBase: values = L * kv_row + n * L * (rank_k + rank_v); break;
    case ShareMode::kBaseLr: values = L * kv_row + L * (rank_k + rank_v); break;
  }
  return values * value_bytes;
}

Result<TraceCell> run_trace_cell(LlamaModel& model, const std::vector<std::string>& names,
                                 const std::vector<const LoraAdapter*>& adapters, const Trace& trace, ShareMode mode,
                                 const TraceBenchOptions& opts) {
  const ModelConfig& cfg = model.config();
  Backend& be = model.backend();
  TraceCell c;
  c.length = trace.target_tokens;
  c.mode = mode;
  c.agent_calls = trace.agent_calls();
  const int64_t final_tokens = trace.final_tokens();
  if (cfg.max_position_embeddings > 0 && final_tokens > cfg.max_position_embeddings) {
    c.status = "context";
    c.message = fmt::format("the trace has {} tokens; the model has {} positions", final_tokens, cfg.max_position_embeddings);
    return c;
  }
  if (opts.page_size <= 0) return make_error(ErrorCode::kInvalidArgument, "--page-size must be positive");
  const int64_t vb = static_cast<int64_t>(dtype_size(be.cache_dtype()));
  const int n_rec = mode == ShareMode::kDroidSpeak ? static_cast<int>(opts.droidspeak_layers.size()) : 0;
  const int64_t per_token = kv_pool_bytes_per_token(cfg, mode, static_cast<int>(adapters.size()),
                                                    module_rank(adapters.front(), LoraTarget::kK),
                                                    module_rank(adapters.front(), LoraTarget::kV), n_rec, vb);
  const int64_t page = opts.page_size;
  // Tokens the caches can hold: the whole trace, or under a budget what it pays for.
  int64_t max_tokens = (final_tokens + page - 1) / page * page;
  if (opts.kv_budget_bytes > 0) {
    const int64_t affordable = opts.kv_budget_bytes / (per_token * page) * page;
    if (affordable == 0) {
      c.status = "oom";
      c.message = fmt::format("a KV budget of {:.3g} GB holds no {}-token page under {} ({} bytes per token)",
                              static_cast<double>(opts.kv_budget_bytes) / 1e9, page, share_mode_name(mode), per_token);
      return c;
    }
    max_tokens = std::min(max_tokens, affordable);
  }
  ReplayOptions ro;
  ro.decode_lookahead = opts.decode_lookahead;
  // Under a budget the trajectory's arena is the budget, shared by all its caches (memory moves
  // between agents and components); without one it holds the whole trace in every pool.
  ro.sharing = sharing_for(mode, opts, (final_tokens + page - 1) / page * page);
  ro.sharing.arena_bytes = opts.kv_budget_bytes > 0 ? opts.kv_budget_bytes : 0;
  c.kv_max_tokens = max_tokens;
  c.kv_pool_bytes = opts.kv_budget_bytes > 0 ? opts.kv_budget_bytes : per_token * max_tokens;
  be.synchronize();
  be.reset_peak_memory();
  auto session_r = AgentSession::create(model, nullptr, names, adapters, ro);
  if (!session_r.ok()) {
    const Error& e = session_r.error();
    if (e.code != ErrorCode::kOutOfMemory && !mode_not_applicable(mode, e)) return e;
    c.status = e.code == ErrorCode::kOutOfMemory ? "oom" : "n/a";
    c.message = e.message;
    return c;
  }
  AgentSession& session = **session_r;
  auto finish = [&](Clock::time_point start) {
    be.synchronize();
    c.wall_s = seconds_between(start, Clock::now());
    c.final_tokens = static_cast<int64_t>(session.trajectory().size());
    c.throughput_tok_s = c.wall_s > 0 ? static_cast<double>(c.final_tokens) / c.wall_s : 0;
    c.decode_tok_s = c.decode_s > 0 ? static_cast<double>(c.decode_tokens) / c.decode_s : 0;
    const KvUsage u = session.kv().usage();
    c.cache = u.peak;
    c.evictions = u.evictions;
    c.evicted_tokens = u.evicted_tokens;
    c.computed_tokens = 0;
    for (int64_t n : session.computed_per_agent()) c.computed_tokens += n;
    c.partial_tokens = 0;
    for (int64_t n : session.partial_per_agent()) c.partial_tokens += n;
    const MemoryStats m = be.memory_stats();
    c.device_peak_bytes = m.peak;
    c.device_capacity_bytes = m.capacity;
  };

  const auto start = Clock::now();
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const TraceStep& st = trace.steps[i];
    if (st.kind == TraceStep::Kind::kAppend) {
      session.append(st.tokens);
      continue;
    }
    const int64_t pos = static_cast<int64_t>(session.trajectory().size());
    // The first token separately: its latency (catch-up prefill + one decode) is the call's TTFT.
    const auto t0 = Clock::now();
    auto first = session.run_agent(st.agent, 1, {}, {});
    Result<StepResult> rest = StepResult{};
    Clock::time_point t1 = t0;
    if (first.ok()) {
      be.synchronize();
      t1 = Clock::now();
      c.ttft_s += seconds_between(t0, t1);
      c.prefill_tokens += first->prefilled_tokens;
      if (st.generate > 1) rest = session.run_agent(st.agent, st.generate - 1, {}, {});
    }
    const Error* err = !first.ok() ? &first.error() : !rest.ok() ? &rest.error() : nullptr;
    if (err) {
      if (err->code != ErrorCode::kOutOfMemory)
        return make_error(err->code, "{} tokens, {}: step {} ({} of round {}): {}", trace.target_tokens,
                          share_mode_name(mode), i, st.agent, st.round, err->message);
      finish(start);
      c.status = "oom";
      c.message = fmt::format("at position {} ({} of round {}): {}", pos, st.agent, st.round, err->message);
      return c;
    }
    be.synchronize();
    c.decode_s += seconds_between(t1, Clock::now());
    c.decode_tokens += st.generate - 1;
  }
  finish(start);
  return c;
}

Result<std::vector<CacheBytes>> agents_memory_curve(const ModelConfig& cfg, const std::vector<const LoraAdapter*>& adapters,
                                                    ShareMode mode, int64_t length, int max_agents, int64_t value_bytes,
                                                    const TraceBenchOptions& opts) {
  std::vector<CacheBytes> out;
  for (int n = 1; n <= max_agents; ++n) {
    std::vector<const LoraAdapter*> agents;
    for (int a = 0; a < n; ++a) agents.push_back(adapters[static_cast<size_t>(a) % adapters.size()]);
    // One page per pool: the counters, not the storage, make bytes().
    SharingOptions so = sharing_for(mode, opts, opts.page_size);
    so.value_bytes = value_bytes;
    auto kv = TrajectoryKv::create(cfg, agents, so);
    if (!kv.ok()) {
      if (mode_not_applicable(mode, kv.error())) return std::vector<CacheBytes>{};
      return kv.error();
    }
    for (int a = 0; a < n; ++a) (*kv)->advance(a, length);
    out.push_back((*kv)->bytes());
  }
  return out;
}

Result<TraceCell> run_trace_cell_repeated(LlamaModel& model, const std::vector<std::string>& names,
                                          const std::vector<const LoraAdapter*>& adapters, const Trace& trace,
                                          ShareMode mode, const TraceBenchOptions& opts, int warmup, int runs) {
  for (int w = 0; w < warmup; ++w) {
    LRA_ASSIGN_OR_RETURN(TraceCell c, run_trace_cell(model, names, adapters, trace, mode, opts));
    if (c.status != "ok") return c;
  }
  std::vector<TraceCell> timed;  // [runs]
  for (int i = 0; i < std::max(runs, 1); ++i) {
    LRA_ASSIGN_OR_RETURN(TraceCell c, run_trace_cell(model, names, adapters, trace, mode, opts));
    if (c.status != "ok") return c;
    timed.push_back(std::move(c));
  }
  std::vector<double> walls;
  for (const TraceCell& c : timed) walls.push_back(c.wall_s);
  std::sort(timed.begin(), timed.end(), [](const TraceCell& a, const TraceCell& b) { return a.wall_s < b.wall_s; });
  TraceCell out = std::move(timed[(timed.size() - 1) / 2]);  // the median (the lower one of an even count)
  if (walls.size() > 1) out.wall_s_runs = std::move(walls);
  out.warmup_runs = warmup;
  return out;
}

nlohmann::json cache_bytes_json(const CacheBytes& b) {
  return {{"base", b.base}, {"lr", b.lr}, {"full", b.full}, {"total", b.total()}, {"allocated", b.allocated}};
}

nlohmann::json cell_to_json(const TraceCell& c) {
  nlohmann::json j = {{"length", c.length},
                      {"mode", share_mode_name(c.mode)},
                      {"status", c.status},
                      {"agent_calls", c.agent_calls},
                      {"final_tokens", c.final_tokens},
                      {"ttft_s", c.ttft_s},
                      {"wall_s", c.wall_s},
                      {"throughput_tok_s", c.throughput_tok_s},
                      {"decode_tokens", c.decode_tokens},
                      {"decode_s", c.decode_s},
                      {"decode_tok_s", c.decode_tok_s},
                      {"prefill_tokens", c.prefill_tokens},
                      {"computed_tokens", c.computed_tokens},
                      {"partial_tokens", c.partial_tokens},
                      {"evictions", c.evictions},
                      {"evicted_tokens", c.evicted_tokens},
                      {"kv_bytes", c.cache.total()},
                      {"cache_bytes", cache_bytes_json(c.cache)},
                      {"kv_max_tokens", c.kv_max_tokens},
                      {"kv_pool_bytes", c.kv_pool_bytes},
                      {"device_peak_bytes", c.device_peak_bytes},
                      {"device_capacity_bytes", c.device_capacity_bytes},
                      {"warmup_runs", c.warmup_runs}};
  if (!c.wall_s_runs.empty()) j["wall_s_runs"] = c.wall_s_runs;
  if (!c.message.empty()) j["message"] = c.message;
  return j;
}

std::string trace_markdown_table(const std::vector<TraceCell>& cells, const std::vector<ShareMode>& modes,
                                 const std::vector<int64_t>& lengths) {
  std::string head = "| tokens |", rule = "| ---: |";
  for (ShareMode m : modes) {
    head += fmt::format(" {0} TTFT s | {0} tok/s | {0} KV GB |", share_mode_name(m));
    rule += " ---: | ---: | ---: |";
  }
  std::string out = head + "\n" + rule + "\n";
  for (int64_t len : lengths) {
    out += fmt::format("| {} |", len);
    for (ShareMode m : modes) {
      const auto it = std::find_if(cells.begin(), cells.end(), [&](const TraceCell& c) { return c.length == len && c.mode == m; });
      if (it == cells.end()) {
        out += " | | |";
      } else if (it->status == "ok") {
        out += fmt::format(" {:.3f} | {:.1f} | {:.3g} |", it->ttft_s, it->throughput_tok_s,
                           static_cast<double>(it->cache.total()) / 1e9);
      } else {
        const std::string s = it->status == "oom" ? "OOM" : it->status;
        out += fmt::format(" {0} | {0} | {1} |", s, it->status == "oom" ? fmt::format("> {:.3g}", static_cast<double>(it->kv_pool_bytes) / 1e9) : "");
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace lragent
