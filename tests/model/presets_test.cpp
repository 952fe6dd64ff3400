// Model presets (model/presets.h): the published shapes, weights made on the backend
// (deterministic, normal(0, 0.02), norms 1), and the shared-A / independent-A role adapters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kv/full_cache.h"
#include "model/presets.h"

namespace lragent {
namespace {

TEST(Presets, PublishedShapes) {
  auto l = model_preset("llama3.1-8b");
  ASSERT_TRUE(l.ok()) << l.error().message;
  const ModelConfig& c = l->config;
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  // Parameter counts as published: 8,030,261,248 (Llama-3.1-8B) and 8,019,808,256 (Ministral-8B).
  EXPECT_EQ(preset_weight_bytes(c, DType::kF32), 8030261248LL * 4);
  auto m = model_preset("ministral-8b");
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->config.architecture, "MistralForCausalLM");
  EXPECT_EQ(m->config.num_layers, 36);
  EXPECT_EQ(m->config.intermediate_size, 12288);
  EXPECT_EQ(m->config.vocab_size, 131072);
  EXPECT_EQ(m->config.head_dim, 128);
  EXPECT_EQ(m->config.rope_theta, 1e8);
  EXPECT_EQ(m->config.max_position_embeddings, 32768);
  EXPECT_EQ(preset_weight_bytes(m->config, DType::kF32), 8019808256LL * 4);
  auto q3 = model_preset("qwen3-8b");
  ASSERT_TRUE(q3.ok()) << q3.error().message;
  EXPECT_EQ(q3->config.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(q3->config.qk_norm);
  EXPECT_EQ(q3->config.num_layers, 36);
  EXPECT_EQ(q3->config.vocab_size, 151936);
  EXPECT_EQ(q3->config.max_position_embeddings, 40960);
  // Qwen3-8B's published count, its 36 × 2 per-head norms of 128 included: 8,190,735,360.
  EXPECT_EQ(preset_weight_bytes(q3->config, DType::kF32), 8190735360LL * 4);
  // bf16 matrices halve everything but the f32 norms.
  EXPECT_EQ(preset_weight_bytes(c, DType::kBF16), (8030261248LL - 4096 * 65) * 2 + 4096 * 65 * 4);
  auto bad = model_preset("llama-70b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("tiny, llama3.1-8b, ministral-8b or qwen3-8b"), std::string::npos);
}

TEST(Presets, TinyWeightsAreMadeOnTheBackendDeterministically) {
  auto p = model_preset("tiny");
  ASSERT_TRUE(p.ok());
  // Two backends with different thread counts: counter-based numbers do not depend on the split.
  auto be = make_cpu_backend(1);
  auto be2 = make_cpu_backend(2);
  auto m1 = make_preset_model(*p, *be);
  auto m2 = make_preset_model(*p, *be2);
  ASSERT_TRUE(m1.ok() && m2.ok()) << (m1.ok() ? m2.error().message : m1.error().message);
  const ModelWeights& w1 = (*m1)->weights();
  const ModelWeights& w2 = (*m2)->weights();
  ASSERT_EQ(w1.layers.size(), 2u);
  EXPECT_EQ(std::memcmp(w1.layers[1].w_up.data, w2.layers[1].w_up.data, w1.layers[1].w_up.nbytes()), 0);
  EXPECT_EQ(std::memcmp(w1.embed.data, w2.embed.data, w1.embed.nbytes()), 0);
  EXPECT_NE(std::memcmp(w1.layers[0].w_up.data, w1.layers[1].w_up.data, w1.layers[0].w_up.nbytes()), 0)
      << "every tensor has its own stream";
  EXPECT_EQ(w1.embed.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(w1.layers[0].wk.shape, (std::vector<int64_t>{32, 64}));
  // Matrices: normal(0, 0.02); norms: ones.
  double sum = 0, sq = 0;
  const int64_t n = w1.lm_head.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = w1.lm_head.f32()[i];
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.001);
  for (int64_t i = 0; i < w1.final_norm.numel(); ++i) ASSERT_EQ(w1.final_norm.f32()[i], 1.0f);
}

// A Qwen3-shaped preset (qwen3-8b's qk_norm on the tiny shapes) gets its per-head norm weights:
// without them the forward pass would read null q_norm / k_norm views.
TEST(Presets, QkNormPresetsMakeTheirNormWeights) {
  auto p = model_preset("tiny");
  ASSERT_TRUE(p.ok());
  p->config.architecture = "Qwen3ForCausalLM";
  p->config.qk_norm = true;
  auto be = make_cpu_backend(1);
  auto m = make_preset_model(*p, *be);
  ASSERT_TRUE(m.ok()) << m.error().message;
  for (const LayerWeights& lw : (*m)->weights().layers)
    for (const TensorView* v : {&lw.q_norm, &lw.k_norm}) {
      ASSERT_NE(v->data, nullptr);
      ASSERT_EQ(v->shape, (std::vector<int64_t>{p->config.head_dim}));
      for (int64_t i = 0; i < v->numel(); ++i) ASSERT_EQ(v->f32()[i], 1.0f);
    }
  auto pools = KvPools::create(p->config, 16, 1, "test");
  ASSERT_TRUE(pools.ok()) << pools.error().message;
  FullKvCache kv(pools->kv.get());
  const std::vector<int32_t> toks = {1, 7, 300, 12};
  SeqInput in;
  in.tokens = toks.data();
  in.n_tokens = 4;
  in.kv = &kv;
  auto r = (*m)->forward({in});
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (int64_t i = 0; i < r->numel(); ++i) ASSERT_TRUE(std::isfinite(r->f32()[i]));
}

TEST(Presets, TinyModelRunsAForwardPass) {
  auto p = model_preset("tiny");
  ASSERT_TRUE(p.ok());
  auto be = make_cpu_backend(1);
  auto m = make_preset_model(*p, *be);
  ASSERT_TRUE(m.ok());
  auto pools = KvPools::create(p->config, 16, 1, "test");
  ASSERT_TRUE(pools.ok()) << pools.error().message;
  {
    FullKvCache kv(pools->kv.get());
    const int32_t ids[] = {1, 100, 200, 300};
    SeqInput in;
    in.tokens = ids;
    in.n_tokens = 4;
    in.kv = &kv;
    auto logits = (*m)->forward({in});
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    ASSERT_EQ(logits->numel(), 512);
    for (int64_t i = 0; i < logits->numel(); ++i) ASSERT_TRUE(std::isfinite(logits->f32()[i]));
  }
}

TEST(Presets, SharedAndIndependentRoleAdapters) {
  auto p = model_preset("tiny");
  ASSERT_TRUE(p.ok());
  const ModelConfig& c = p->config;
  auto shared = make_preset_adapters(c, 16, true, 16);
  auto indep = make_preset_adapters(c, 16, false, 16);
  ASSERT_EQ(shared.size(), 3u);
  EXPECT_EQ(shared[0]->name, "plan");
  EXPECT_EQ(shared[1]->name, "action");
  EXPECT_EQ(shared[2]->name, "reflect");
  for (const auto* set : {&shared, &indep})
    for (const auto& a : *set) {
      EXPECT_TRUE(a->targets(LoraTarget::kQ));
      EXPECT_TRUE(a->targets(LoraTarget::kV));
      EXPECT_FALSE(a->targets(LoraTarget::kK));
      const LoraModule& q = *a->layers[1][static_cast<size_t>(LoraTarget::kQ)];
      const LoraModule& v = *a->layers[1][static_cast<size_t>(LoraTarget::kV)];
      EXPECT_EQ(q.rank, 16);
      EXPECT_EQ(q.scale, 2.0f);
      EXPECT_EQ(q.a.shape(), (std::vector<int64_t>{16, 64}));
      EXPECT_EQ(q.b.shape(), (std::vector<int64_t>{64, 16}));
      EXPECT_EQ(v.b.shape(), (std::vector<int64_t>{32, 16}));
    }
  auto a_of = [](const std::vector<std::unique_ptr<LoraAdapter>>& s, int role, int layer) -> const LoraModule& {
    return *s[static_cast<size_t>(role)]->layers[static_cast<size_t>(layer)][static_cast<size_t>(LoraTarget::kV)];
  };
  for (int l = 0; l < 2; ++l) {
    const LoraModule &s0 = a_of(shared, 0, l), &s2 = a_of(shared, 2, l), &i0 = a_of(indep, 0, l), &i2 = a_of(indep, 2, l);
    EXPECT_EQ(std::memcmp(s0.a.view().data, s2.a.view().data, s0.a.view().nbytes()), 0) << "shared A is bit-identical";
    EXPECT_EQ(s0.a_hash, s2.a_hash);
    EXPECT_NE(std::memcmp(i0.a.view().data, i2.a.view().data, i0.a.view().nbytes()), 0);
    EXPECT_NE(i0.a_hash, i2.a_hash);
    EXPECT_NE(std::memcmp(s0.b.view().data, s2.b.view().data, s0.b.view().nbytes()), 0) << "each role has its own B";
  }
}

}  // namespace
}  // namespace lragent
