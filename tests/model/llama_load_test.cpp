// Loading a checkpoint computes what its config says or refuses it: Llama's attention_bias
// includes o_proj, a tensor the model would not read is an error naming it, and a forward pass
// checks its start position. Variants of tinystories-656k are written to a temporary directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "kv/full_cache.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace lragent {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// tinystories-656k in a fresh directory, its config.json merged with `patch` and `extra` tensors
// added to its checkpoint.
std::string variant(const std::string& name, const json& patch, const std::vector<std::pair<std::string, Tensor>>& extra) {
  const std::string dir = testing::temp_dir(name);
  json cfg = json::parse(testing::read_file(testing::tinystories_dir() + "/config.json"));
  cfg.merge_patch(patch);
  std::ofstream(dir + "/config.json") << cfg.dump();
  auto src = SafetensorsFile::open(testing::tinystories_dir() + "/model.safetensors");
  EXPECT_TRUE(src.ok()) << src.error().message;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const TensorInfo& info : (*src)->tensors()) views.emplace_back(info.name, (*src)->view(info));
  for (const auto& [n, t] : extra) views.emplace_back(n, t.view());
  const Status st = write_safetensors(dir + "/model.safetensors", views);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return dir;
}

Tensor filled(std::vector<int64_t> shape, float value) {
  Tensor t = Tensor::zeros(DType::kF32, std::move(shape));
  std::fill(t.f32(), t.f32() + t.numel(), value);
  return t;
}

// Logits of the last of a few prompt tokens.
std::vector<float> last_logits(LlamaModel& m) {
  const std::vector<int32_t> toks = {1, 400, 12, 77, 900, 33};
  auto pools = KvPools::create(m.config(), 16, 4, "test");
  EXPECT_TRUE(pools.ok());
  FullKvCache kv(pools->kv.get());
  SeqInput in;
  in.tokens = toks.data();
  in.n_tokens = static_cast<int>(toks.size());
  in.kv = &kv;
  auto r = m.forward({in});
  EXPECT_TRUE(r.ok()) << r.error().message;
  if (!r.ok()) return {};
  return std::vector<float>(r->f32(), r->f32() + r->numel());
}

TEST(LlamaLoad, AttentionBiasIncludesOProj) {
  auto be = make_cpu_backend(1);
  auto base = LlamaModel::load(testing::tinystories_dir(), *be);
  ASSERT_TRUE(base.ok()) << base.error().message;
  const ModelConfig& c = (*base)->config();
  const int64_t q = static_cast<int64_t>(c.num_heads) * c.head_dim, kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  auto with_biases = [&](const std::string& name, float o_bias, bool with_o) {
    std::vector<std::pair<std::string, Tensor>> extra;
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      extra.emplace_back(p + "q_proj.bias", filled({q}, 0.f));
      extra.emplace_back(p + "k_proj.bias", filled({kv}, 0.f));
      extra.emplace_back(p + "v_proj.bias", filled({kv}, 0.f));
      if (with_o) extra.emplace_back(p + "o_proj.bias", filled({c.hidden_size}, o_bias));
    }
    return variant(name, {{"attention_bias", true}}, extra);
  };
  const std::vector<float> ref = last_logits(**base);
  {  // zero biases: the base model's logits
    auto m = LlamaModel::load(with_biases("bias-zero", 0.f, true), *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const std::vector<float> got = last_logits(**m);
    EXPECT_LE(testing::max_abs_diff(got, ref), 1e-5f);
  }
  {  // an o_proj bias moves the residual stream: other logits (it was ignored before)
    auto m = LlamaModel::load(with_biases("bias-o", 0.5f, true), *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const std::vector<float> got = last_logits(**m);
    EXPECT_GT(testing::max_abs_diff(got, ref), 1e-2f) << "o_proj.bias was not applied";
  }
  {  // HF's LlamaAttention has o_proj.bias whenever attention_bias is true
    auto m = LlamaModel::load(with_biases("bias-no-o", 0.f, false), *be);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().code, ErrorCode::kNotFound);
    EXPECT_TRUE(Contains(m.error().message, "model.layers.0.self_attn.o_proj.bias")) << m.error().message;
  }
}

TEST(LlamaLoad, TensorsTheModelWouldNotReadAreRefusedByName) {
  auto be = make_cpu_backend(1);
  auto cfg = load_model_config(testing::tinystories_dir());
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  const ModelConfig& c = *cfg;
  std::vector<std::pair<std::string, Tensor>> extra;
  extra.emplace_back("model.layers.1.mlp.down_proj.bias", filled({c.hidden_size}, 1.f));
  const std::string dir = variant("unused", json::object(), extra);
  auto m = LlamaModel::load(dir, *be);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(m.error().message, "holds 1 tensor this LlamaForCausalLM model does not use "
                                          "(model.layers.1.mlp.down_proj.bias)"));
  // Old checkpoints' RoPE tables are recomputed, not refused.
  extra.clear();
  extra.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", filled({c.head_dim / 2}, 1.f));
  auto ok = LlamaModel::load(variant("inv-freq", json::object(), extra), *be);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
}

// Qwen3's q_norm and k_norm are part of the model: a checkpoint without them is refused by name,
// norm weights change the logits (a norm of ones still normalises), and a Qwen3 checkpoint
// labelled Llama is refused rather than computed without its norms.
TEST(LlamaLoad, Qwen3NormsAreRequiredAndComputed) {
  auto be = make_cpu_backend(1);
  auto base = LlamaModel::load(testing::tinystories_dir(), *be);
  ASSERT_TRUE(base.ok()) << base.error().message;
  const ModelConfig& c = (*base)->config();
  const json qwen3 = {{"architectures", {"Qwen3ForCausalLM"}}};
  {
    auto m = LlamaModel::load(variant("qwen3-no-norms", qwen3, {}), *be);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().code, ErrorCode::kNotFound);
    EXPECT_TRUE(Contains(m.error().message, "model.layers.0.self_attn.q_norm.weight")) << m.error().message;
  }
  std::vector<std::pair<std::string, Tensor>> norms;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    norms.emplace_back(p + "q_norm.weight", filled({c.head_dim}, 1.f));
    norms.emplace_back(p + "k_norm.weight", filled({c.head_dim}, 1.f));
  }
  auto m = LlamaModel::load(variant("qwen3-norms", qwen3, norms), *be);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_GT(testing::max_abs_diff(last_logits(**m), last_logits(**base)), 1e-2f) << "q_norm / k_norm were not applied";

  const std::string dir = testing::temp_dir("qwen3-as-llama");
  json cfg = json::parse(testing::read_file(testing::fixtures_dir() + "/models/synthetic-qwen3/config.json"));
  cfg["architectures"] = {"LlamaForCausalLM"};
  std::ofstream(dir + "/config.json") << cfg.dump();
  fs::copy_file(testing::fixtures_dir() + "/models/synthetic-qwen3/model.safetensors", dir + "/model.safetensors",
                fs::copy_options::overwrite_existing);
  auto mislabelled = LlamaModel::load(dir, *be);
  ASSERT_FALSE(mislabelled.ok());
  EXPECT_EQ(mislabelled.error().code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(mislabelled.error().message, "holds 6 tensors this LlamaForCausalLM model does not use "
                                                    "(model.layers.0.self_attn.k_norm.weight"))
      << mislabelled.error().message;
}

TEST(LlamaLoad, NegativeStartPositionIsRefused) {
  auto be = make_cpu_backend(1);
  auto m = LlamaModel::load(testing::tinystories_dir(), *be);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto pools = KvPools::create((*m)->config(), 16, 4, "test");
  ASSERT_TRUE(pools.ok());
  FullKvCache kv(pools->kv.get());
  const int32_t toks[2] = {5, 6};
  SeqInput in;
  in.tokens = toks;
  in.n_tokens = 2;
  in.start_pos = -1;
  in.kv = &kv;
  auto r = (*m)->forward({in});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.error().message, "start position -1 is negative"));
}

}  // namespace
}  // namespace lragent
