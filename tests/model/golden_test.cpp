// The model and adapters against goldens made by HF transformers + PEFT
// (scripts/goldens/make_model_goldens.py, run on the device machine).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "encode_util.h"
#include "engine/generator.h"
#include "kv/full_cache.h"
#include "model/lora.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

using testing::fixtures_dir;
using testing::must_encode;
using testing::read_file;

nlohmann::json load_golden(const std::string& name) {
  const std::string path = fixtures_dir() + "/goldens/" + name;
  EXPECT_TRUE(std::filesystem::exists(path)) << "missing golden " << path << " (scripts/goldens/README.md)";
  return nlohmann::json::parse(read_file(path), nullptr, false);
}

// Runs every case of a golden file through generate (greedy, EOS ignored, 64 tokens)
// both one by one and as one mixed batch, checking logits and tokens.
void check_golden(LlamaModel& model, const Tokenizer* tok, const nlohmann::json& g, const LoraAdapter* adapter,
                  const Tokenizer* tok_lib = nullptr) {
  ASSERT_TRUE(g.is_object() && g.contains("cases"));
  ASSERT_FALSE(g["cases"].empty()) << "a golden file without cases would check nothing";
  std::vector<GenerateRequest> reqs;
  for (const auto& c : g["cases"]) {
    GenerateRequest r;
    r.prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    if (tok && c.contains("prompt")) {
      // The default flavor reproduces transformers' tokenizer (which made these goldens).
      EXPECT_EQ(must_encode(*tok, c["prompt"].get<std::string>()), r.prompt) << "tokenization differs from transformers";
    }
    if (tok_lib && c.contains("prompt")) {
      // transformers 5's LlamaTokenizer ignores tokenizer.json's normalizer; where the `tokenizers`
      // library disagrees the golden keeps its ids too.
      const auto& ref = c.contains("prompt_tokens_tokenizers_lib") ? c["prompt_tokens_tokenizers_lib"] : c["prompt_tokens"];
      EXPECT_EQ(must_encode(*tok_lib, c["prompt"].get<std::string>()), ref.get<std::vector<int32_t>>())
          << "tokenization differs from HF tokenizers";
    }
    r.max_tokens = static_cast<int>(c["output_tokens"].size());
    r.keep_first_logits = true;
    r.adapter = adapter;
    reqs.push_back(std::move(r));
  }
  Generator gen(model, EngineOptions{});
  for (int batched = 0; batched < 2; ++batched) {
    std::vector<GenerateResult> results;
    if (batched) {
      auto res = gen.run(reqs);
      ASSERT_TRUE(res.ok()) << res.error().message;
      results = std::move(*res);
    } else {
      for (const auto& r : reqs) {
        auto res = gen.run({r});
        ASSERT_TRUE(res.ok()) << res.error().message;
        results.push_back(std::move((*res)[0]));
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& c = g["cases"][i];
      const auto want_logits = c["last_logits"].get<std::vector<float>>();
      ASSERT_EQ(results[i].first_logits.size(), want_logits.size());
      const float max_diff = testing::max_abs_diff(results[i].first_logits, want_logits);
      EXPECT_LE(max_diff, 1e-4f) << "case " << i << (batched ? " (batched)" : "");
      EXPECT_EQ(results[i].output, c["output_tokens"].get<std::vector<int32_t>>())
          << "case " << i << (batched ? " (batched)" : "");
    }
  }
}

class Golden : public ::testing::Test {
 protected:
  void SetUp() override { be_ = make_cpu_backend(2); }
  std::unique_ptr<Backend> be_;
};

TEST_F(Golden, TinyStoriesBaseMatchesTransformers) {
  auto model = LlamaModel::load(testing::tinystories_dir(), *be_);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  auto tok_lib = Tokenizer::load_dir(testing::tinystories_dir(), TokenizerFlavor::kTokenizers);
  ASSERT_TRUE(tok_lib.ok()) << tok_lib.error().message;
  check_golden(**model, tok->get(), load_golden("tinystories-base.json"), nullptr, tok_lib->get());
}

TEST_F(Golden, SyntheticQwen2GqaLlama3RopeMatchesTransformers) {
  auto model = LlamaModel::load(fixtures_dir() + "/models/synthetic-qwen2-gqa", *be_);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto g = load_golden("synthetic-qwen2-gqa.json");
  ASSERT_TRUE(g.contains("inv_freq"));
  const auto inv = g["inv_freq"].get<std::vector<float>>();
  ASSERT_EQ(inv.size(), (*model)->inv_freq().size());
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR((*model)->inv_freq()[i], inv[i], 1e-6 * std::fabs(inv[i]) + 1e-12) << i;
  check_golden(**model, nullptr, g, nullptr);
}

// Qwen3: q_norm and k_norm per head before RoPE, head_dim 64 with hidden 64 (q wider than the
// residual stream), tied embeddings (scripts/goldens/make_qwen3_goldens.py).
TEST_F(Golden, SyntheticQwen3QkNormMatchesTransformers) {
  auto model = LlamaModel::load(fixtures_dir() + "/models/synthetic-qwen3", *be_);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_TRUE((*model)->config().qk_norm);
  EXPECT_EQ((*model)->config().head_dim, 64);
  check_golden(**model, nullptr, load_golden("synthetic-qwen3.json"), nullptr);
}

class Qwen3AdapterGolden : public Golden, public ::testing::WithParamInterface<std::string> {};

// qkvo: the k_proj term goes through k_norm with the base key (a private full cache).
TEST_P(Qwen3AdapterGolden, MatchesPeft) {
  auto model = LlamaModel::load(fixtures_dir() + "/models/synthetic-qwen3", *be_);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto adapter = load_lora_adapter(GetParam(), fixtures_dir() + "/adapters/synthetic-qwen3/" + GetParam(),
                                   (*model)->config());
  ASSERT_TRUE(adapter.ok()) << adapter.error().message;
  check_golden(**model, nullptr, load_golden("synthetic-qwen3-" + GetParam() + ".json"), adapter->get());
}

INSTANTIATE_TEST_SUITE_P(Qwen3, Qwen3AdapterGolden, ::testing::Values("qkvo", "qv"));

class AdapterGolden : public Golden, public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

TEST_P(AdapterGolden, MatchesPeft) {
  const auto& [set, role] = GetParam();
  auto model = LlamaModel::load(testing::tinystories_dir(), *be_);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto adapter = load_lora_adapter(role, testing::adapters_dir() + "/" + set + "/" + role, (*model)->config());
  ASSERT_TRUE(adapter.ok()) << adapter.error().message;
  check_golden(**model, nullptr, load_golden("tinystories-" + set + "-" + role + ".json"), adapter->get());
}

// --kv-share icarus: the decoder's logits (the adapted model's queries over the base model's
// entries; SeqInput::decoder) against the same composed from transformers + PEFT modules
// (scripts/goldens/make_icarus_goldens.py), teacher-forced at every position.
TEST_F(Golden, IcarusDecoderMatchesPeftOverTheBaseModelsCache) {
  auto model = LlamaModel::load(testing::tinystories_dir(), *be_);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const nlohmann::json g = load_golden("tinystories-icarus.json");
  ASSERT_TRUE(g.is_object() && g.contains("cases") && !g["cases"].empty());
  const int vocab = (*model)->config().vocab_size;
  for (const auto& c : g["cases"]) {
    const std::string name = c["adapter"].get<std::string>();  // "<set>/<role>"
    SCOPED_TRACE(name);
    auto adapter = load_lora_adapter(name.substr(name.find('/') + 1), testing::adapters_dir() + "/" + name,
                                     (*model)->config());
    ASSERT_TRUE(adapter.ok()) << adapter.error().message;
    const auto toks = c["tokens"].get<std::vector<int32_t>>();
    auto pools = KvPools::create((*model)->config(), 16, 16, "icarus");
    ASSERT_TRUE(pools.ok());
    FullKvCache cache(pools->kv.get());
    SeqInput in;
    in.tokens = toks.data();
    in.n_tokens = static_cast<int>(toks.size());
    in.kv = &cache;
    in.decoder = adapter->get();
    in.all_logits = true;
    auto r = (*model)->forward({in});
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->numel(), static_cast<int64_t>(toks.size()) * vocab);
    const float* rows = r->f32();
    const auto& top_ids = c["top_ids"];
    const auto& top_logits = c["top_logits"];
    ASSERT_EQ(top_ids.size(), toks.size());
    for (size_t p = 0; p < toks.size(); ++p)
      for (size_t k = 0; k < top_ids[p].size(); ++k) {
        const int id = top_ids[p][k].get<int>();
        EXPECT_NEAR(rows[p * vocab + id], top_logits[p][k].get<float>(), 1e-4f) << "position " << p << " rank " << k;
      }
    const auto last = c["last_logits"].get<std::vector<float>>();
    const std::vector<float> ours(rows + (toks.size() - 1) * vocab, rows + toks.size() * vocab);
    EXPECT_LE(testing::max_abs_diff(ours, last), 1e-4f);
    // The adapter moves the logits well past that tolerance (else this would check the base model).
    EXPECT_GT(c["max_abs_diff_vs_base"].get<float>(), 0.05f);
  }
}

INSTANTIATE_TEST_SUITE_P(AllSets, AdapterGolden,
                         ::testing::Combine(::testing::Values("qv-shared-a-r8", "qv-indep-a-r8", "qkvo-shared-a-r4"),
                                            ::testing::Values("plan", "action", "reflect")),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace lragent
