// `bench trace` cells (agents/trace_bench.h) on the tiny preset: every mode completes the trace
// with the compute and cache bytes the sharing rules imply, a KV budget evicts private caches (or,
// without eviction, turns overflow into OOM cells), and the agents curve equals docs/kv.md's closed forms.
#include <gtest/gtest.h>

#include <map>

#include "agents/trace_bench.h"
#include "model/presets.h"
#include "test_util.h"

namespace lragent {
namespace {

class TraceBench : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto b = load_trajectory_bundle(testing::source_dir() + "/bench/trace/trajectories.json");
    ASSERT_TRUE(b.ok()) << b.error().message;
    source_ = new SourceTrajectory(b->trajectories.at(0));
    auto p = model_preset("tiny");
    ASSERT_TRUE(p.ok());
    preset_ = new ModelPreset(*p);
    be_ = make_cpu_backend(1).release();
    auto m = make_preset_model(*preset_, *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = m->release();
    shared_ = new std::vector<std::unique_ptr<LoraAdapter>>(make_preset_adapters(preset_->config, 16, true, 16));
    indep_ = new std::vector<std::unique_ptr<LoraAdapter>>(make_preset_adapters(preset_->config, 16, false, 16));
  }
  static void TearDownTestSuite() {
    delete shared_;
    delete indep_;
    delete model_;
    delete be_;
    delete preset_;
    delete source_;
  }

  static std::vector<const LoraAdapter*> ptrs(const std::vector<std::unique_ptr<LoraAdapter>>& v) {
    std::vector<const LoraAdapter*> out;
    for (const auto& a : v) out.push_back(a.get());
    return out;
  }
  static Trace trace(int64_t len) {
    auto t = make_trace(*source_, len, preset_->config.vocab_size);
    EXPECT_TRUE(t.ok()) << t.error().message;
    return *t;
  }
  static Result<TraceCell> run(const Trace& t, ShareMode m, const TraceBenchOptions& o = {}, bool indep = false) {
    return run_trace_cell(*model_, names_, ptrs(indep ? *indep_ : *shared_), t, m, o);
  }

  static inline SourceTrajectory* source_ = nullptr;
  static inline ModelPreset* preset_ = nullptr;
  static inline Backend* be_ = nullptr;
  static inline LlamaModel* model_ = nullptr;
  static inline std::vector<std::unique_ptr<LoraAdapter>>*shared_ = nullptr, *indep_ = nullptr;
  static inline const std::vector<std::string> names_ = {"plan", "action", "reflect"};
};

TEST_F(TraceBench, EveryModeRunsTheTraceWithItsComputeAndCache) {
  const ModelConfig& c = preset_->config;
  const int64_t row = 2LL * c.num_kv_heads * c.head_dim * 4;  // K + V bytes per token and layer (f32)
  for (int64_t len : {300, 600}) {
    const Trace t = trace(len);
    std::map<ShareMode, TraceCell> cells;
    for (ShareMode m : kAllShareModes) {
      auto r = run(t, m);
      ASSERT_TRUE(r.ok()) << share_mode_name(m) << ": " << r.error().message;
      ASSERT_EQ(r->status, "ok") << share_mode_name(m) << ": " << r->message;
      EXPECT_EQ(r->final_tokens, len);
      EXPECT_EQ(r->agent_calls, t.agent_calls());
      EXPECT_EQ(r->decode_tokens, t.generated_tokens() - t.agent_calls());
      EXPECT_GT(r->ttft_s, 0);
      EXPECT_GT(r->wall_s, r->ttft_s * 0.5);
      EXPECT_NEAR(r->throughput_tok_s, static_cast<double>(len) / r->wall_s, 1e-6 * r->throughput_tok_s);
      EXPECT_GT(r->decode_tok_s, 0);
      EXPECT_LE(r->cache.total(), r->cache.allocated);
      EXPECT_LE(r->cache.allocated, r->kv_pool_bytes);
      cells[m] = *r;
    }
    const TraceCell &none = cells[ShareMode::kNone], &full = cells[ShareMode::kFull], &base = cells[ShareMode::kBase],
                    &blr = cells[ShareMode::kBaseLr], &ds = cells[ShareMode::kDroidSpeak];
    // Positions every agent forwarded at least once: all but the last generated token.
    const int64_t T = len - 1;
    EXPECT_EQ(full.computed_tokens, T) << "full: every position is computed once";
    EXPECT_EQ(blr.computed_tokens, T) << "base-lr: every position is computed once";
    EXPECT_GT(none.computed_tokens, 2 * T) << "none: plan, action and reflect each catch up on the trajectory";
    EXPECT_EQ(base.computed_tokens, none.computed_tokens) << "base recomputes as none does";
    // droidspeak recomputing layer 0 runs every layer only where full does; the rest of each
    // agent's catch-up (none's) runs through layer 0 alone.
    EXPECT_EQ(ds.computed_tokens, T) << "droidspeak: every layer once per position, as full";
    EXPECT_EQ(ds.computed_tokens + ds.partial_tokens, none.computed_tokens) << "droidspeak catches up as none";
    for (const TraceCell* cell : {&none, &full, &base, &blr}) EXPECT_EQ(cell->partial_tokens, 0);
    EXPECT_LT(blr.prefill_tokens, none.prefill_tokens);
    // Cache bytes (docs/kv.md): full/base hold T tokens once; none holds every agent's copy.
    EXPECT_EQ(full.cache.full, T * c.num_layers * row);
    EXPECT_EQ(blr.cache.base, T * c.num_layers * row);
    EXPECT_EQ(blr.cache.lr, T * c.num_layers * (0 + 16) * 4) << "LR cache: r_v = 16 values per token and layer";
    EXPECT_EQ(none.cache.full, none.computed_tokens * c.num_layers * row);
    EXPECT_LT(blr.cache.total(), none.cache.total() / 2);
    EXPECT_LT(blr.cache.total(), base.cache.total());
    EXPECT_LT(full.cache.total(), blr.cache.total());
    // Pools sized to the trace: the shared modes fill theirs up to page rounding.
    EXPECT_EQ(full.cache.allocated, full.kv_pool_bytes);
    EXPECT_EQ(full.kv_max_tokens, (len + 15) / 16 * 16);
  }
}

TEST_F(TraceBench, PoolBytesPerTokenMatchTheAllocatedPools) {
  const ModelConfig& c = preset_->config;
  const int64_t row = 2LL * c.num_kv_heads * c.head_dim;
  EXPECT_EQ(kv_pool_bytes_per_token(c, ShareMode::kNone, 3, 0, 16, 0, 4), 3 * c.num_layers * row * 4);
  EXPECT_EQ(kv_pool_bytes_per_token(c, ShareMode::kFull, 3, 0, 16, 0, 2), c.num_layers * row * 2);
  EXPECT_EQ(kv_pool_bytes_per_token(c, ShareMode::kBase, 3, 0, 16, 0, 4), (c.num_layers * row + 3 * c.num_layers * 16) * 4);
  EXPECT_EQ(kv_pool_bytes_per_token(c, ShareMode::kBaseLr, 3, 8, 16, 0, 4), (c.num_layers * row + c.num_layers * 24) * 4);
  EXPECT_EQ(kv_pool_bytes_per_token(c, ShareMode::kDroidSpeak, 3, 0, 16, 1, 4), ((c.num_layers - 1) * row + 3 * row) * 4);
  // Every agent of none reads the whole trace, so its private pools end up as full as full's pool.
  const Trace t = trace(600);
  auto none = run(t, ShareMode::kNone);
  ASSERT_TRUE(none.ok() && none->status == "ok");
  EXPECT_EQ(none->kv_pool_bytes, kv_pool_bytes_per_token(c, ShareMode::kNone, 3, 0, 16, 0, 4) * none->kv_max_tokens);
  EXPECT_GE(none->cache.allocated, none->kv_pool_bytes * 9 / 10);
}

TEST_F(TraceBench, KvBudgetWithoutEvictionTurnsOverflowIntoOomCells) {
  const ModelConfig& c = preset_->config;
  const Trace t = trace(600);
  TraceBenchOptions o;
  o.evict_private = false;
  // Room for 640 tokens of base-lr: enough for full and base-lr, not for the modes with private copies.
  o.kv_budget_bytes = kv_pool_bytes_per_token(c, ShareMode::kBaseLr, 3, 0, 16, 0, 4) * 640;
  std::map<ShareMode, TraceCell> cells;
  for (ShareMode m : kAllShareModes) {
    auto r = run(t, m, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_LE(r->kv_pool_bytes, o.kv_budget_bytes) << share_mode_name(m);
    EXPECT_LE(r->cache.allocated, o.kv_budget_bytes);
    EXPECT_EQ(r->evictions, 0);
    cells[m] = *r;
  }
  EXPECT_EQ(cells[ShareMode::kFull].status, "ok");
  EXPECT_EQ(cells[ShareMode::kBaseLr].status, "ok");
  for (ShareMode m : {ShareMode::kNone, ShareMode::kBase, ShareMode::kDroidSpeak}) {
    EXPECT_EQ(cells[m].status, "oom") << share_mode_name(m);
    EXPECT_NE(cells[m].message.find("exhausted"), std::string::npos) << cells[m].message;
    EXPECT_NE(cells[m].message.find("at position"), std::string::npos) << cells[m].message;
    EXPECT_LT(cells[m].final_tokens, 600) << "the trace stopped where memory ran out";
  }
  const std::string md = trace_markdown_table(
      {cells[ShareMode::kNone], cells[ShareMode::kBaseLr]}, {ShareMode::kNone, ShareMode::kBaseLr}, {600});
  EXPECT_NE(md.find("| 600 | OOM | OOM |"), std::string::npos) << md;
  EXPECT_NE(md.find("base-lr TTFT s"), std::string::npos) << md;
  // A budget below one page: OOM before anything runs.
  o.kv_budget_bytes = 100;
  auto tiny = run(t, ShareMode::kNone, o);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->status, "oom");
  EXPECT_NE(tiny->message.find("holds no 16-token page"), std::string::npos) << tiny->message;
}

// The same budget with eviction (the default): the modes with private caches finish the trace by
// dropping the least recently run agent's and recomputing it at that agent's next call.
TEST_F(TraceBench, KvBudgetEvictsPrivateCachesAndRecomputes) {
  const ModelConfig& c = preset_->config;
  const Trace t = trace(600);
  TraceBenchOptions o;
  o.kv_budget_bytes = kv_pool_bytes_per_token(c, ShareMode::kBaseLr, 3, 0, 16, 0, 4) * 640;
  for (ShareMode m : kAllShareModes) {
    SCOPED_TRACE(share_mode_name(m));
    auto free_run = run(t, m);
    auto r = run(t, m, o);
    ASSERT_TRUE(r.ok() && free_run.ok());
    ASSERT_EQ(r->status, "ok") << r->message;
    EXPECT_EQ(r->final_tokens, free_run->final_tokens);
    EXPECT_LE(r->cache.allocated, o.kv_budget_bytes);
    EXPECT_LE(r->cache.total(), o.kv_budget_bytes);
    if (m == ShareMode::kFull || m == ShareMode::kBaseLr) {
      EXPECT_EQ(r->evictions, 0) << "nothing private to drop";
      EXPECT_EQ(r->computed_tokens, free_run->computed_tokens);
      continue;
    }
    EXPECT_GT(r->evictions, 0);
    EXPECT_GT(r->evicted_tokens, 0);
    // (droidspeak's catch-up runs through its recompute layer only: partial tokens.)
    const int64_t again = r->computed_tokens + r->partial_tokens - free_run->computed_tokens - free_run->partial_tokens;
    EXPECT_GT(again, 0) << "evicted agents compute their context again";
    EXPECT_LE(again, r->evicted_tokens);
    EXPECT_GT(r->prefill_tokens, free_run->prefill_tokens);
  }
}

TEST_F(TraceBench, UnsupportedAndTooLongCellsAreReportedNotFailed) {
  const Trace t = trace(300);
  auto blr = run(t, ShareMode::kBaseLr, {}, /*indep=*/true);
  ASSERT_TRUE(blr.ok()) << blr.error().message;
  EXPECT_EQ(blr->status, "n/a");
  EXPECT_NE(blr->message.find("shared-A"), std::string::npos) << blr->message;
  auto base = run(t, ShareMode::kBase, {}, /*indep=*/true);
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(base->status, "ok") << "independent A: base keeps a private LR cache per agent";
  // A model with fewer positions than the trace.
  ModelPreset short_ctx = *preset_;
  short_ctx.config.max_position_embeddings = 256;
  auto m = make_preset_model(short_ctx, *be_);
  ASSERT_TRUE(m.ok());
  auto r = run_trace_cell(**m, names_, ptrs(*shared_), t, ShareMode::kNone, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, "context");
  EXPECT_NE(r->message.find("256 positions"), std::string::npos) << r->message;
}

TEST_F(TraceBench, AgentsCurveIsTheClosedForm) {
  const ModelConfig& c = preset_->config;
  const int64_t T = 5000, L = c.num_layers, W2 = 2LL * c.num_kv_heads * c.head_dim, b = 2, r = 16, R = 1;
  TraceBenchOptions o;  // droidspeak recomputes layer 0
  std::map<ShareMode, std::vector<CacheBytes>> curve;
  for (ShareMode m : kAllShareModes) {
    auto v = agents_memory_curve(c, ptrs(*shared_), m, T, 16, b, o);
    ASSERT_TRUE(v.ok()) << v.error().message;
    ASSERT_EQ(v->size(), 16u);
    curve[m] = *v;
  }
  for (int64_t n = 1; n <= 16; ++n) {
    const size_t i = static_cast<size_t>(n - 1);
    EXPECT_EQ(curve[ShareMode::kNone][i].total(), n * T * L * W2 * b);
    EXPECT_EQ(curve[ShareMode::kFull][i].total(), T * L * W2 * b);
    EXPECT_EQ(curve[ShareMode::kBase][i].total(), T * L * W2 * b + n * T * L * r * b);
    EXPECT_EQ(curve[ShareMode::kBaseLr][i].total(), T * L * W2 * b + T * L * r * b);
    EXPECT_EQ(curve[ShareMode::kDroidSpeak][i].total(), (T * (L - R) + n * T * R) * W2 * b);
  }
  auto indep = agents_memory_curve(c, ptrs(*indep_), ShareMode::kBaseLr, T, 4, b, o);
  ASSERT_TRUE(indep.ok());
  EXPECT_TRUE(indep->empty()) << "base-lr cannot share the LR cache of independent-A adapters";
}

}  // namespace
}  // namespace lragent
