#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace lragent {
namespace {

using json = nlohmann::json;
const char* const kRoles[] = {"plan", "action", "reflect"};

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

std::string fixture(const std::string& set, const std::string& role) {
  return testing::adapters_dir() + "/" + set + "/" + role;
}

// "base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight"
std::string key(int layer, const std::string& proj, char ab) {
  const char* block = (proj == "gate_proj" || proj == "up_proj" || proj == "down_proj") ? "mlp" : "self_attn";
  return "base_model.model.model.layers." + std::to_string(layer) + "." + block + "." + proj + ".lora_" + ab + ".weight";
}

// An editable copy of an adapter: its config and its tensors.
struct AdapterFiles {
  json config;
  std::map<std::string, Tensor> tensors;

  static AdapterFiles read(const std::string& dir) {
    AdapterFiles f;
    f.config = json::parse(testing::read_file(dir + "/adapter_config.json"));
    auto st = SafetensorsFile::open(dir + "/adapter_model.safetensors");
    EXPECT_TRUE(st.ok()) << st.error().message;
    for (const TensorInfo& info : (*st)->tensors()) {
      TensorView v = (*st)->view(info);
      Tensor t = Tensor::empty(v.dtype, v.shape);
      std::memcpy(t.view().data, v.data, v.nbytes());
      f.tensors.emplace(info.name, std::move(t));
    }
    return f;
  }
  void set(const std::string& name, std::vector<int64_t> shape) { tensors[name] = Tensor::zeros(DType::kF32, std::move(shape)); }
  // Writes the copy into a fresh temp directory and returns its path.
  std::string write(const std::string& tag) const {
    const std::string dir = testing::temp_dir("lora-" + tag);
    std::ofstream(dir + "/adapter_config.json") << config.dump(2);
    std::vector<std::pair<std::string, TensorView>> views;
    for (const auto& [name, t] : tensors) views.emplace_back(name, t.view());
    EXPECT_TRUE(write_safetensors(dir + "/adapter_model.safetensors", views).ok());
    return dir;
  }
};

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = load_model_config(testing::tinystories_dir());
    ASSERT_TRUE(cfg.ok()) << cfg.error().message;
    cfg_ = *cfg;
  }
  std::unique_ptr<LoraAdapter> load(const std::string& name, const std::string& dir) {
    auto a = load_lora_adapter(name, dir, cfg_);
    EXPECT_TRUE(a.ok()) << a.error().message;
    return a.ok() ? std::move(a).value() : nullptr;
  }
  // A registry holding plan/action/reflect of one fixture set.
  AdapterRegistry registry_of(const std::string& set) {
    AdapterRegistry reg;
    for (const char* role : kRoles) EXPECT_TRUE(reg.add(load(role, fixture(set, role))).ok());
    return reg;
  }
  ModelConfig cfg_;
};

TEST_F(LoraTest, LoadsAllNineFixtureAdapters) {
  struct Set { const char* name; int rank; std::vector<LoraTarget> targets; };
  const Set sets[] = {{"qv-shared-a-r8", 8, {LoraTarget::kQ, LoraTarget::kV}},
                      {"qv-indep-a-r8", 8, {LoraTarget::kQ, LoraTarget::kV}},
                      {"qkvo-shared-a-r4", 4, {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV, LoraTarget::kO}}};
  for (const Set& set : sets)
    for (const char* role : kRoles) {
      SCOPED_TRACE(std::string(set.name) + "/" + role);
      auto a = load(role, fixture(set.name, role));
      ASSERT_NE(a, nullptr);
      EXPECT_EQ(a->name, role);
      EXPECT_EQ(a->default_rank, set.rank);
      EXPECT_FLOAT_EQ(a->lora_alpha, 2.0f * set.rank);
      EXPECT_FALSE(a->use_rslora);
      ASSERT_EQ(a->layers.size(), 2u);
      for (int t = 0; t < kNumLoraTargets; ++t) {
        const auto target = static_cast<LoraTarget>(t);
        const bool want = std::find(set.targets.begin(), set.targets.end(), target) != set.targets.end();
        EXPECT_EQ(a->targets(target), want) << lora_target_name(target);
        for (const auto& layer : a->layers) {
          ASSERT_EQ(layer[t].has_value(), want);
          if (!want) continue;
          const LoraModule& m = *layer[t];
          EXPECT_EQ(m.rank, set.rank);
          EXPECT_FLOAT_EQ(m.scale, 2.0f) << "lora_alpha / r";
          EXPECT_EQ(m.a.shape(), (std::vector<int64_t>{set.rank, 128}));
          const int64_t out = (target == LoraTarget::kK || target == LoraTarget::kV) ? 64 : 128;
          EXPECT_EQ(m.b.shape(), (std::vector<int64_t>{out, set.rank}));
        }
      }
    }
  // The matrices are the file's values.
  auto a = load("plan", fixture("qv-indep-a-r8", "plan"));
  AdapterFiles files = AdapterFiles::read(fixture("qv-indep-a-r8", "plan"));
  const Tensor& b = files.tensors.at(key(1, "v_proj", 'B'));
  EXPECT_EQ(std::memcmp(a->layers[1][2]->b.f32(), b.f32(), b.view().nbytes()), 0);
}

TEST_F(LoraTest, SharedAQvAdaptersFormOneGroupPerModule) {
  AdapterRegistry reg = registry_of("qv-shared-a-r8");
  const auto& groups = reg.shared_a_groups();
  ASSERT_EQ(groups.size(), 4u);  // 2 layers x {q, v}
  for (const auto& g : groups) {
    EXPECT_TRUE(g.target == LoraTarget::kQ || g.target == LoraTarget::kV);
    EXPECT_EQ(g.members, (std::vector<int>{0, 1, 2}));
  }
  EXPECT_EQ(reg.describe_groups(),
            "q_proj: {plan, action, reflect} share A in all 2 layers\n"
            "v_proj: {plan, action, reflect} share A in all 2 layers\n");
  // Shared A, distinct B: the adapters still differ.
  const LoraModule& plan_q = *reg.find("plan")->layers[0][0];
  const LoraModule& act_q = *reg.find("action")->layers[0][0];
  EXPECT_EQ(plan_q.a_hash, act_q.a_hash);
  EXPECT_NE(std::memcmp(plan_q.b.f32(), act_q.b.f32(), plan_q.b.view().nbytes()), 0);
}

TEST_F(LoraTest, SharedAQkvoAdaptersGroupAllFourProjections) {
  AdapterRegistry reg = registry_of("qkvo-shared-a-r4");
  const auto& groups = reg.shared_a_groups();
  ASSERT_EQ(groups.size(), 8u);  // 2 layers x {q, k, v, o}
  int per_target[kNumLoraTargets] = {};
  for (const auto& g : groups) {
    EXPECT_EQ(g.members, (std::vector<int>{0, 1, 2}));
    ++per_target[static_cast<int>(g.target)];
  }
  for (int t = 0; t < 4; ++t) EXPECT_EQ(per_target[t], 2) << lora_target_name(static_cast<LoraTarget>(t));
  EXPECT_TRUE(Contains(reg.describe_groups(), "o_proj: {plan, action, reflect} share A in all 2 layers\n"));
}

// remove() (a server unloading an adapter): the rest regroup, the removed adapter's modules lead
// themselves (none leads from it once it is freed), and its name can be registered again.
TEST_F(LoraTest, RemovingTheLeadRegroupsTheRest) {
  AdapterRegistry reg = registry_of("qv-shared-a-r8");
  EXPECT_EQ(reg.remove("nobody"), nullptr);
  std::unique_ptr<LoraAdapter> plan = reg.remove("plan");  // the lead of every group
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(reg.size(), 2);
  EXPECT_EQ(reg.find("plan"), nullptr);
  ASSERT_EQ(reg.shared_a_groups().size(), 4u);
  for (const auto& g : reg.shared_a_groups()) EXPECT_EQ(g.members, (std::vector<int>{0, 1}));
  const LoraModule& act_q = *reg.find("action")->layers[0][0];
  const LoraModule& ref_q = *reg.find("reflect")->layers[0][0];
  const LoraModule& plan_q = *plan->layers[0][0];
  EXPECT_EQ(act_q.a_lead, &act_q);
  EXPECT_EQ(ref_q.a_lead, &act_q);
  EXPECT_EQ(plan_q.a_lead, &plan_q);
  EXPECT_TRUE(plan_q.same_a_as(act_q));  // compared, not looked up
  plan.reset();
  EXPECT_TRUE(reg.add(load("plan", fixture("qv-shared-a-r8", "plan"))).ok());
  EXPECT_EQ(reg.find("plan")->layers[0][0]->a_lead, &act_q);
  EXPECT_EQ(reg.shared_a_groups().front().members, (std::vector<int>{0, 1, 2}));
}

TEST_F(LoraTest, IndependentAdaptersHaveNoGroups) {
  AdapterRegistry reg = registry_of("qv-indep-a-r8");
  EXPECT_TRUE(reg.shared_a_groups().empty());
  EXPECT_EQ(reg.describe_groups(), "lora_A: no two adapters share one in any layer\n");
}

TEST_F(LoraTest, MixedRegistryGroupsOnlyWithinEachSet) {
  AdapterRegistry reg;
  for (const char* set : {"qv-shared-a-r8", "qv-indep-a-r8", "qkvo-shared-a-r4"})
    for (const char* role : kRoles)
      ASSERT_TRUE(reg.add(load(std::string(set) + "/" + role, fixture(set, role))).ok());
  ASSERT_EQ(reg.size(), 9);
  EXPECT_EQ(reg.shared_a_groups().size(), 12u);  // 4 from qv-shared, 8 from qkvo-shared
  for (const auto& g : reg.shared_a_groups()) {
    ASSERT_EQ(g.members.size(), 3u);
    EXPECT_TRUE(g.members == (std::vector<int>{0, 1, 2}) || g.members == (std::vector<int>{6, 7, 8}));
  }
  EXPECT_TRUE(Contains(reg.describe_groups(),
                       "q_proj: {qv-shared-a-r8/plan, qv-shared-a-r8/action, qv-shared-a-r8/reflect} share A"));
  // same_a_as (what a batched pass asks, answered from the registry's a_lead without comparing A)
  // is the compare of the matrices, for every pair of modules, and for a module outside the
  // registry (no a_lead: compared).
  auto outside = load("outside", fixture("qv-shared-a-r8", "plan"));
  int same = 0, pairs = 0;
  for (size_t l = 0; l < 2; ++l)
    for (int t = 0; t < kNumLoraTargets; ++t)
      for (int i = 0; i < reg.size(); ++i) {
        const auto& mi = reg.at(i).layers[l][static_cast<size_t>(t)];
        if (!mi) continue;
        ASSERT_NE(mi->a_lead, nullptr);
        for (int j = 0; j < reg.size(); ++j) {
          const auto& mj = reg.at(j).layers[l][static_cast<size_t>(t)];
          if (!mj) continue;
          const bool equal = mi->a.shape() == mj->a.shape() &&
                             std::memcmp(mi->a.f32(), mj->a.f32(), mi->a.view().nbytes()) == 0;
          EXPECT_EQ(mi->same_a_as(*mj), equal) << l << " " << t << " " << i << " " << j;
          EXPECT_EQ(mi->a_lead == mj->a_lead, equal);
          same += equal && i != j;
          ++pairs;
        }
        const auto& mo = outside->layers[l][static_cast<size_t>(t)];
        if (mo) {
          EXPECT_EQ(mo->a_lead, nullptr);
          EXPECT_EQ(mo->same_a_as(*mi), i < 3) << "the outside plan shares A with qv-shared-a-r8 only";
        }
      }
  EXPECT_EQ(same, 2 * 12 * 3);  // 12 groups of 3: 6 ordered pairs each
  EXPECT_GT(pairs, same);
}

TEST_F(LoraTest, BadAdaptersGiveClearErrorsAndRegistryKeepsServing) {
  AdapterRegistry reg;
  ASSERT_TRUE(reg.add(load("plan", fixture("qv-shared-a-r8", "plan"))).ok());
  ASSERT_TRUE(reg.add(load("action", fixture("qv-shared-a-r8", "action"))).ok());

  const std::string base = fixture("qv-shared-a-r8", "reflect");
  struct Case {
    const char* tag;
    std::function<void(AdapterFiles&)> edit;
    ErrorCode code;
    std::string cause;
  };
  const Case cases[] = {
      {"dims", [](AdapterFiles& f) { f.set(key(0, "q_proj", 'A'), {8, 64}); }, ErrorCode::kCorrupt,
       "model.layers.0.self_attn.q_proj has lora_A [8, 64] and lora_B [128, 8], expected [8, 128] and [128, 8]"},
      {"vdims", [](AdapterFiles& f) { f.set(key(1, "v_proj", 'B'), {128, 8}); }, ErrorCode::kCorrupt,
       "expected [8, 128] and [64, 8]"},
      {"missing", [](AdapterFiles& f) { f.tensors.erase(key(1, "v_proj", 'B')); }, ErrorCode::kCorrupt,
       "missing lora_B tensor for model.layers.1.self_attn.v_proj"},
      {"rankab", [](AdapterFiles& f) { f.set(key(0, "q_proj", 'B'), {128, 4}); }, ErrorCode::kCorrupt,
       "has lora_A [8, 128] (rank 8) but lora_B [128, 4] (rank 4)"},
      {"rankcfg", [](AdapterFiles& f) { f.config["r"] = 4; }, ErrorCode::kCorrupt,
       "has rank 8 but adapter_config.json gives r = 4"},
      {"rankpattern", [](AdapterFiles& f) { f.config["rank_pattern"] = {{"v_proj", 16}}; }, ErrorCode::kCorrupt,
       "model.layers.0.self_attn.v_proj has rank 8 but adapter_config.json gives r = 16"},
      {"extra", [](AdapterFiles& f) { f.set(key(0, "k_proj", 'A'), {8, 128}); }, ErrorCode::kCorrupt,
       "is for model.layers.0.self_attn.k_proj, which target_modules"},
      {"stray", [](AdapterFiles& f) { f.set("base_model.model.lm_head.lora_A.weight", {8, 128}); }, ErrorCode::kCorrupt,
       "unexpected tensor 'base_model.model.lm_head.lora_A.weight'"},
      // A signed layer index once passed the range check and indexed before the module tables.
      {"neglayer", [](AdapterFiles& f) { f.set("base_model.model.model.layers.-1.self_attn.q_proj.lora_A.weight", {8, 128}); },
       ErrorCode::kCorrupt, "unexpected tensor 'base_model.model.model.layers.-1.self_attn.q_proj.lora_A.weight'"},
      {"pluslayer", [](AdapterFiles& f) { f.set("base_model.model.model.layers.+0.self_attn.q_proj.lora_A.weight", {8, 128}); },
       ErrorCode::kCorrupt, "unexpected tensor"},
      {"biglayer", [](AdapterFiles& f) { f.set(key(7, "q_proj", 'A'), {8, 128}); }, ErrorCode::kCorrupt,
       "is for layer 7 but the model has 2 layers"},
      {"dora", [](AdapterFiles& f) { f.config["use_dora"] = true; }, ErrorCode::kUnsupported, "DoRA"},
      {"fc1", [](AdapterFiles& f) { f.config["target_modules"] = {"q_proj", "fc1"}; }, ErrorCode::kUnsupported,
       "target_modules entry 'fc1' matches no module of this model"},
      {"mlp", [](AdapterFiles& f) { f.config["target_modules"] = {"mlp"}; }, ErrorCode::kUnsupported,
       "selects model.layers.0.mlp, which is not one of q_proj"},
      {"lmhead", [](AdapterFiles& f) { f.config["target_modules"] = {"q_proj", "v_proj", "lm_head"}; },
       ErrorCode::kUnsupported, "embedding/lm_head adapters are not supported"},
      {"embed", [](AdapterFiles& f) { f.config["target_modules"] = ".*(embed_tokens|q_proj|v_proj)"; },
       ErrorCode::kUnsupported, "selects model.embed_tokens: embedding/lm_head"},
      {"badregex", [](AdapterFiles& f) { f.config["target_modules"] = "(q_proj"; }, ErrorCode::kCorrupt,
       "invalid regex '(q_proj'"},
      {"bias", [](AdapterFiles& f) { f.config["bias"] = "lora_only"; }, ErrorCode::kUnsupported,
       "bias 'lora_only' is not supported"},
      {"save", [](AdapterFiles& f) { f.config["modules_to_save"] = {"lm_head"}; }, ErrorCode::kUnsupported,
       "modules_to_save"},
      {"layers", [](AdapterFiles& f) { f.config["layers_to_transform"] = {0}; }, ErrorCode::kUnsupported,
       "layers_to_transform is not supported"},
      {"fanin", [](AdapterFiles& f) { f.config["fan_in_fan_out"] = true; }, ErrorCode::kUnsupported, "fan_in_fan_out"},
      // Loaded as plain LoRA these apply the adapter where PEFT would not.
      {"alora", [](AdapterFiles& f) { f.config["alora_invocation_tokens"] = {5, 6}; }, ErrorCode::kUnsupported,
       "activated LoRA"},
      {"tparams", [](AdapterFiles& f) { f.config["target_parameters"] = {"mlp.experts.gate_up_proj"}; },
       ErrorCode::kUnsupported, "target_parameters"},
      {"ia3", [](AdapterFiles& f) { f.config["peft_type"] = "IA3"; }, ErrorCode::kUnsupported,
       "peft_type 'IA3' is not supported"},
      {"norank", [](AdapterFiles& f) { f.config.erase("r"); }, ErrorCode::kCorrupt, "'r' must be a positive integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tag);
    AdapterFiles f = AdapterFiles::read(base);
    c.edit(f);
    const std::string dir = f.write(c.tag);
    auto r = load_lora_adapter("reflect", dir, cfg_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, c.code) << r.error().message;
    EXPECT_TRUE(Contains(r.error().message, dir)) << "names the adapter dir";
    EXPECT_TRUE(Contains(r.error().message, c.cause));
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
    // The registry keeps serving what it had.
    ASSERT_EQ(reg.size(), 2);
    ASSERT_NE(reg.find("plan"), nullptr);
    EXPECT_TRUE(reg.find("action")->targets(LoraTarget::kV));
    EXPECT_EQ(reg.shared_a_groups().size(), 4u);
  }

  auto missing = load_lora_adapter("ghost", "/nonexistent/adapter", cfg_);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(missing.error().message, "/nonexistent/adapter"));

  // Registry-level refusals leave it unchanged too.
  Status dup = reg.add(load("plan", base));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(dup.error().message, "'plan'"));
  EXPECT_TRUE(Contains(dup.error().message, "already registered"));
  EXPECT_EQ(reg.size(), 2);
  EXPECT_EQ(reg.find("plan")->dir, fixture("qv-shared-a-r8", "plan"));
}

TEST_F(LoraTest, RegexTargetsAndDefaultAdapterTensorNames) {
  AdapterFiles f = AdapterFiles::read(fixture("qv-indep-a-r8", "action"));
  f.config["target_modules"] = R"(model\.layers\.1\.self_attn\.(q|v)_proj)";
  std::map<std::string, Tensor> renamed;  // keep only layer 1, spelled with PEFT's ".default" adapter name
  for (auto& [name, t] : f.tensors) {
    if (name.find("layers.1.") == std::string::npos) continue;
    std::string n = name;
    n.replace(n.find(".weight"), 7, ".default.weight");
    renamed.emplace(n, std::move(t));
  }
  f.tensors = std::move(renamed);
  auto a = load("action", f.write("regex"));
  ASSERT_NE(a, nullptr);
  EXPECT_FALSE(a->layers[0][0].has_value());
  EXPECT_FALSE(a->layers[0][2].has_value());
  EXPECT_TRUE(a->layers[1][0].has_value());
  EXPECT_TRUE(a->layers[1][2].has_value());
  EXPECT_FALSE(a->layers[1][1].has_value());
  EXPECT_TRUE(a->targets(LoraTarget::kQ));
  EXPECT_FALSE(a->targets(LoraTarget::kK));
}

TEST_F(LoraTest, RankAlphaPatternsAndRsLora) {
  AdapterFiles f = AdapterFiles::read(fixture("qv-indep-a-r8", "plan"));
  // q_proj of layer 1 retrained at rank 4 with its own alpha; rsLoRA scaling everywhere.
  f.set(key(1, "q_proj", 'A'), {4, 128});
  f.set(key(1, "q_proj", 'B'), {128, 4});
  f.config["rank_pattern"] = {{"layers.1.self_attn.q_proj", 4}};
  f.config["alpha_pattern"] = {{"model.layers.1.self_attn.q_proj", 2.0}};
  f.config["use_rslora"] = true;
  auto a = load("plan", f.write("patterns"));
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->use_rslora);
  EXPECT_EQ(a->layers[1][0]->rank, 4);
  EXPECT_FLOAT_EQ(a->layers[1][0]->scale, 2.0f / 2.0f);  // alpha / sqrt(4)
  EXPECT_EQ(a->layers[0][0]->rank, 8);
  EXPECT_FLOAT_EQ(a->layers[0][0]->scale, 16.0f / std::sqrt(8.0f));
  EXPECT_FLOAT_EQ(a->layers[1][2]->scale, 16.0f / std::sqrt(8.0f));
}

TEST_F(LoraTest, AllLinearSelectsEveryProjection) {
  AdapterFiles f = AdapterFiles::read(fixture("qkvo-shared-a-r4", "plan"));
  f.config["target_modules"] = "all-linear";
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(p) == "down_proj";
      f.set(key(l, p, 'A'), {4, down ? 384 : 128});
      f.set(key(l, p, 'B'), {down ? 128 : 384, 4});
    }
  auto a = load("plan", f.write("alllinear"));
  ASSERT_NE(a, nullptr);
  for (int t = 0; t < kNumLoraTargets; ++t) EXPECT_TRUE(a->targets(static_cast<LoraTarget>(t))) << t;
  EXPECT_EQ(a->layers[0][6]->a.shape(), (std::vector<int64_t>{4, 384}));
}

}  // namespace
}  // namespace lragent
