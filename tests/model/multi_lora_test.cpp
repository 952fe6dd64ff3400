// Mixed-adapter batches: every sequence gets exactly its own result, and x·A is computed once
// per shared-A group (counted by ForwardStats).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/generator.h"
#include "model/lora.h"
#include "model/lora_apply.h"
#include "test_util.h"

namespace lragent {
namespace {

class MultiLora : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(2);
    auto m = LlamaModel::load(testing::tinystories_dir(), *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    for (const char* role : {"plan", "action", "reflect"}) {
      auto a = load_lora_adapter(role, testing::adapters_dir() + "/" + GetParam() + "/" + role, model_->config());
      ASSERT_TRUE(a.ok()) << a.error().message;
      adapters_.push_back(std::move(*a));
    }
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<std::unique_ptr<LoraAdapter>> adapters_;
};

TEST_P(MultiLora, MixedBatchEqualsEachSequenceAlone) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) {  // plan, action, reflect, bare base model
    GenerateRequest r;
    r.prompt = {1};
    for (int t = 0; t < 9 + 13 * i; ++t) r.prompt.push_back(3 + (t * 31 + i * 7) % 2000);
    r.max_tokens = 16;
    r.keep_first_logits = true;
    r.adapter = i < 3 ? adapters_[static_cast<size_t>(i)].get() : nullptr;
    reqs.push_back(r);
  }
  Generator gen(*model_, EngineOptions{});
  auto batched = gen.run(reqs);
  ASSERT_TRUE(batched.ok()) << batched.error().message;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = gen.run({reqs[i]});
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*batched)[i].output, (*alone)[0].output) << "sequence " << i;
    const float diff = testing::max_abs_diff((*batched)[i].first_logits, (*alone)[0].first_logits);
    EXPECT_LE(diff, 5e-5f) << "sequence " << i;  // GEMM blocking differs with the batch size: rounding only
  }
}

TEST_P(MultiLora, ShrinkOncePerSharedAGroup) {
  const bool shared = GetParam().find("shared") != std::string::npos;
  const int modules = GetParam().find("qkvo") != std::string::npos ? 4 : 2;
  const int layers = model_->config().num_layers;
  // 18 rows, more than kLoraFoldRows: independent groups take their own rows (a range or gathered)
  // instead of riding in the grouped product over all of them.
  std::vector<std::vector<int32_t>> toks = {{1, 50, 60, 61, 62, 63}, {1, 70, 71, 72, 73}, {1, 80, 90, 100, 101, 102, 103}};
  static_assert(kLoraFoldRows < 18);
  auto pools = KvPools::create(model_->config(), 16, 8, "test");  // outlives the caches below
  ASSERT_TRUE(pools.ok());
  std::vector<std::unique_ptr<FullKvCache>> kv;
  std::vector<SeqInput> batch;
  for (size_t i = 0; i < 3; ++i) {
    kv.push_back(std::make_unique<FullKvCache>(pools->kv.get()));
    SeqInput in;
    in.tokens = toks[i].data();
    in.n_tokens = static_cast<int>(toks[i].size());
    in.kv = kv.back().get();
    in.adapter = adapters_[i].get();
    batch.push_back(in);
  }
  model_->stats() = ForwardStats{};
  ASSERT_TRUE(model_->forward(batch).ok());
  const int groups = shared ? 1 : 3;  // one x·A per group per module and layer
  EXPECT_EQ(model_->stats().lora_shrink_calls, static_cast<int64_t>(layers) * modules * groups);
  EXPECT_EQ(model_->stats().lora_shrink_rows, static_cast<int64_t>(layers) * modules * 18);
}

// An ICaRus decoder (SeqInput::decoder) stores no entries: it attends to the base model's. Its
// adapter's q (and o) terms run on its row, its k and v terms nowhere (their shrinks and expands
// would produce rows nothing reads), and the pass gives the decoder's logits all the same (the
// logits themselves are checked against transformers + PEFT by IcarusTest).
TEST_P(MultiLora, AnIcarusDecoderRunsNoKOrVTerm) {
  const int layers = model_->config().num_layers;
  const bool qkvo = GetParam().find("qkvo") != std::string::npos;
  auto pools = KvPools::create(model_->config(), 16, 4, "test");
  ASSERT_TRUE(pools.ok());
  FullKvCache kv(pools->kv.get());
  const std::vector<int32_t> toks = {1, 50, 60, 70};
  SeqInput in;
  in.tokens = toks.data();
  in.n_tokens = static_cast<int>(toks.size());
  in.kv = &kv;
  in.decoder = adapters_[1].get();
  model_->stats() = ForwardStats{};
  auto logits = model_->forward({in});
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  EXPECT_EQ(logits->dim(0), 1);  // the decoder's row: the last token's
  const int modules = qkvo ? 2 : 1;  // q (and o): one shrink each a layer
  EXPECT_EQ(model_->stats().lora_shrink_calls, static_cast<int64_t>(layers) * modules);
  // The pass's 5 rows (4 through the base model, the decoder's last) are few enough that each
  // shrink rides in the grouped product over all of them (kLoraFoldRows), which counts them all.
  static_assert(kLoraFoldRows >= 5);
  EXPECT_EQ(model_->stats().lora_shrink_rows, static_cast<int64_t>(layers) * modules * 5);
}

// The pass structure of the CUDA decode path (norms folded into the products that read them,
// residual adds inside the o and down projections: make_cpu_backend's fold_norms) against the
// plain pass, both on the CPU: a mixed batch (three adapters and the base model) through a
// prefill whose LoRA groups do not cover the batch (shrinks of their own rows), decode steps
// whose groups ride in the grouped products, and a step of the base-model sequence alone. Same
// logits up to f32 summation order, same greedy tokens. (A residual add dropped from the o or
// down projection fails it.)
TEST_P(MultiLora, FoldedNormPassEqualsPlainPass) {
  auto fold_be = make_cpu_backend(2, /*fold_norms=*/true);
  ASSERT_TRUE(fold_be->folds_rms_norm(1));
  ASSERT_FALSE(be_->folds_rms_norm(1));
  auto fm = LlamaModel::load(testing::tinystories_dir(), *fold_be);
  ASSERT_TRUE(fm.ok()) << fm.error().message;
  LlamaModel& folded = **fm;
  const ModelConfig& c = model_->config();
  const std::vector<const LoraAdapter*> who = {adapters_[0].get(), nullptr, adapters_[2].get(), adapters_[1].get()};
  std::vector<std::vector<int32_t>> toks = {{1, 50, 60, 7, 8, 9, 10, 11, 12},
                                           {1, 70, 71, 72, 73},
                                           {1, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180},
                                           {1, 33, 44}};
  auto pools = KvPools::create(c, 16, 24, "test");  // outlives the caches below
  ASSERT_TRUE(pools.ok());
  std::vector<std::unique_ptr<FullKvCache>> kv_plain, kv_fold;
  for (size_t i = 0; i < who.size(); ++i) {
    kv_plain.push_back(std::make_unique<FullKvCache>(pools->kv.get()));
    kv_fold.push_back(std::make_unique<FullKvCache>(pools->kv.get()));
  }
  std::vector<int> pos(who.size(), 0);
  // One pass of the sequences in `seqs` (their next tokens from toks at pos) on both models.
  auto step = [&](const std::vector<size_t>& seqs, const std::string& what) {
    std::vector<SeqInput> bp, bf;
    for (size_t i : seqs) {
      SeqInput in;
      in.tokens = toks[i].data() + pos[i];
      in.n_tokens = static_cast<int>(toks[i].size()) - pos[i];
      in.start_pos = pos[i];
      in.adapter = who[i];
      in.kv = kv_plain[i].get();
      bp.push_back(in);
      in.kv = kv_fold[i].get();
      bf.push_back(in);
    }
    auto lp = model_->forward(bp);
    auto lf = folded.forward(bf);
    ASSERT_TRUE(lp.ok()) << lp.error().message;
    ASSERT_TRUE(lf.ok()) << lf.error().message;
    ASSERT_EQ(lp->numel(), lf->numel());
    double num = 0, den = 0;
    for (int64_t k = 0; k < lp->numel(); ++k) {
      num += std::pow(double(lf->f32()[k]) - lp->f32()[k], 2);
      den += std::pow(double(lp->f32()[k]), 2);
    }
    EXPECT_LE(std::sqrt(num / den), 1e-5) << what;
    // Greedy next tokens from the plain pass, fed to both.
    for (size_t r = 0; r < seqs.size(); ++r) {
      const float* row = lp->f32() + static_cast<int64_t>(r) * c.vocab_size;
      const float* rowf = lf->f32() + static_cast<int64_t>(r) * c.vocab_size;
      const auto best = std::max_element(row, row + c.vocab_size) - row;
      EXPECT_EQ(std::max_element(rowf, rowf + c.vocab_size) - rowf, best) << what << ", sequence " << seqs[r];
      const size_t i = seqs[r];
      pos[i] = static_cast<int>(toks[i].size());
      toks[i].push_back(static_cast<int32_t>(best));
    }
  };
  step({0, 1, 2, 3}, "prefill of 29 rows");
  for (int t = 0; t < 5; ++t) step({0, 1, 2, 3}, "decode step " + std::to_string(t));
  step({1}, "the base-model sequence alone");
}

INSTANTIATE_TEST_SUITE_P(Sets, MultiLora, ::testing::Values("qv-shared-a-r8", "qv-indep-a-r8", "qkvo-shared-a-r4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace lragent
