// measure_fidelity / profile_layers on tinystories-656k with the real role adapters: what each
// sharing mode changes against none must follow from what the mode shares.
#include <gtest/gtest.h>

#include <cmath>

#include "agents/fidelity.h"
#include "backend/backend.h"
#include "model/llama.h"
#include "model/lora.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

class Fidelity : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(2);
    auto m = LlamaModel::load(testing::tinystories_dir(), *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    auto t = Tokenizer::load_dir(testing::tinystories_dir());
    ASSERT_TRUE(t.ok()) << t.error().message;
    tok_ = std::move(*t);
  }
  void load_agents(const std::string& set) {
    names_.clear();
    ptrs_.clear();
    adapters_.clear();
    for (const char* role : {"plan", "action", "reflect"}) {
      auto a = load_lora_adapter(role, testing::adapters_dir() + "/" + set + "/" + role, model_->config());
      ASSERT_TRUE(a.ok()) << a.error().message;
      names_.push_back(role);
      adapters_.push_back(std::move(*a));
      ptrs_.push_back(adapters_.back().get());
    }
  }
  static std::vector<ReplayStep> script(const std::string& text) {
    auto s = parse_replay_script(text, "fidelity.json");
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? *s : std::vector<ReplayStep>{};
  }
  static const ModeFidelity* row(const FidelityReport& r, ShareMode m) {
    for (const auto& f : r.modes)
      if (f.mode == m) return &f;
    return nullptr;
  }

  std::unique_ptr<Backend> be_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<LoraAdapter>> adapters_;
  std::vector<const LoraAdapter*> ptrs_;
};

constexpr const char* kScript = R"({"steps": [
    {"append": "Once upon a time there was a little girl who liked to play in the park."},
    {"agent": "plan", "generate": 8},
    {"append": " Then her dog ran to the big tree."},
    {"agent": "action", "generate": 8},
    {"agent": "reflect", "generate": 6}]})";

TEST_F(Fidelity, ModesDivergeAsTheyShare) {
  load_agents("qv-shared-a-r8");
  FidelityOptions o;
  o.droidspeak_layers = {0};
  auto r = measure_fidelity(*model_, tok_.get(), names_, ptrs_, script(kScript), o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->skipped.empty());
  ASSERT_EQ(r->modes.size(), 5u);
  ASSERT_EQ(r->layers.size(), static_cast<size_t>(model_->config().num_layers));
  for (const auto& l : r->layers)
    for (double c : {l.full, l.base, l.adapter, l.hidden}) {
      EXPECT_TRUE(std::isfinite(c)) << "layer " << l.layer;
      EXPECT_LE(std::fabs(c), 1.0 + 1e-9) << "layer " << l.layer;
    }
  // Layer 0 reads the embeddings, which no adapter touches: its base caches (X·W0) and inputs are
  // the same for every agent; its full caches differ by each agent's X·A·B on v.
  EXPECT_NEAR(r->layers[0].base, 1.0, 1e-6);
  EXPECT_NEAR(r->layers[0].hidden, 1.0, 1e-6);
  EXPECT_LT(r->layers[0].full, 0.999);
  const ModeFidelity* none = row(*r, ShareMode::kNone);
  const ModeFidelity* base = row(*r, ShareMode::kBase);
  const ModeFidelity* full = row(*r, ShareMode::kFull);
  const ModeFidelity* base_lr = row(*r, ShareMode::kBaseLr);
  ASSERT_TRUE(none && base && full && base_lr);
  EXPECT_EQ(none->positions, 22);  // 8 + 8 + 6 teacher-forced positions
  // none against itself reproduces its own distributions.
  EXPECT_EQ(none->argmax_agreement, 1.0);
  EXPECT_LT(none->mean_kl, 1e-9);
  // Every other mode reuses caches another agent computed from its own hidden states (from
  // layer 1 on): they differ from none. base still catches each agent up on every token (its
  // X·A is private), full and base-lr compute each token once; all three store less.
  for (const ModeFidelity* m : {base, full, base_lr}) {
    EXPECT_GT(m->mean_kl, 1e-6) << share_mode_name(m->mode);
    EXPECT_LT(m->cache.total(), none->cache.total()) << share_mode_name(m->mode);
    EXPECT_EQ(m->positions, none->positions) << share_mode_name(m->mode);
  }
  EXPECT_EQ(base->computed_tokens, none->computed_tokens);
  EXPECT_LT(full->computed_tokens, none->computed_tokens);
  EXPECT_EQ(base_lr->computed_tokens, full->computed_tokens);
}

TEST_F(Fidelity, IndependentAdaptersSkipBaseLrWithTheReason) {
  load_agents("qv-indep-a-r8");
  auto r = measure_fidelity(*model_, tok_.get(), names_, ptrs_, script(kScript), FidelityOptions{});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(row(*r, ShareMode::kBaseLr), nullptr);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0].mode, ShareMode::kBaseLr);
  EXPECT_NE(r->skipped[0].reason.find("shared-A"), std::string::npos) << r->skipped[0].reason;
}

// Qwen3 with an adapter that adapts k_proj: base and base-lr cannot hold its key term (k_norm),
// so their rows are skipped with the reason and the other modes are measured.
TEST(FidelityQwen3, KProjAdaptersSkipTheBaseModesWithTheReason) {
  auto be = make_cpu_backend(2);
  auto model = LlamaModel::load(testing::fixtures_dir() + "/models/synthetic-qwen3", *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::vector<std::unique_ptr<LoraAdapter>> owned;
  for (const char* name : {"qv", "qkvo"}) {
    auto a = load_lora_adapter(name, testing::fixtures_dir() + "/adapters/synthetic-qwen3/" + name, (*model)->config());
    ASSERT_TRUE(a.ok()) << a.error().message;
    owned.push_back(std::move(*a));
  }
  auto steps = parse_replay_script(R"({"steps": [{"append_tokens": [5, 9, 33, 200, 17, 4, 99]},
      {"agent": "qv", "generate": 6}, {"append_tokens": [3, 4, 5]}, {"agent": "qkvo", "generate": 6}]})",
                                   "qwen3.json");
  ASSERT_TRUE(steps.ok()) << steps.error().message;
  FidelityOptions o;
  o.droidspeak_layers = {0};
  auto r = measure_fidelity(**model, nullptr, {"qv", "qkvo"}, {owned[0].get(), owned[1].get()}, *steps, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->modes.size(), 3u);  // none, full, droidspeak
  ASSERT_EQ(r->skipped.size(), 2u);
  for (const auto& s : r->skipped) {
    EXPECT_TRUE(s.mode == ShareMode::kBase || s.mode == ShareMode::kBaseLr) << share_mode_name(s.mode);
    EXPECT_NE(s.reason.find("RMS-norms every key (k_norm)"), std::string::npos) << s.reason;
  }
}

TEST_F(Fidelity, ScriptWithoutAgentOutputIsRefused) {
  load_agents("qv-shared-a-r8");
  for (const char* text : {R"({"steps": []})", R"({"steps": [{"append": "hi"}]})",
                           R"({"steps": [{"append": "hi"}, {"agent": "plan", "generate": 0}]})"}) {
    auto r = measure_fidelity(*model_, tok_.get(), names_, ptrs_, script(text), FidelityOptions{});
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("nothing to compare"), std::string::npos) << r.error().message;
    auto p = profile_layers(*model_, tok_.get(), names_, ptrs_, script(text), 16);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(p.error().message.find("nothing to compare"), std::string::npos) << p.error().message;
  }
}

TEST_F(Fidelity, ProfileLayersRanksEveryLayerOnce) {
  load_agents("qv-shared-a-r8");
  auto p = profile_layers(*model_, tok_.get(), names_, ptrs_, script(kScript), 16);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->size(), static_cast<size_t>(model_->config().num_layers));
  std::vector<bool> seen(p->size(), false);
  for (size_t i = 0; i < p->size(); ++i) {
    const auto [layer, kl] = (*p)[i];
    ASSERT_GE(layer, 0);
    ASSERT_LT(layer, static_cast<int>(seen.size()));
    EXPECT_FALSE(seen[static_cast<size_t>(layer)]) << "layer " << layer << " twice";
    seen[static_cast<size_t>(layer)] = true;
    EXPECT_TRUE(std::isfinite(kl));
    EXPECT_GE(kl, 0.0);
    if (i > 0) EXPECT_GE((*p)[i - 1].second, kl) << "sorted from most to least divergent";
  }
}

}  // namespace
}  // namespace lragent
