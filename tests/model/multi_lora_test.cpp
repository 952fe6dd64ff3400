// Mixed-adapter batches: every sequence gets exactly its own result, and x·A is computed once
// per shared-A group (counted by ForwardStats).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generator.h"
#include "model/lora.h"
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
  std::vector<std::vector<int32_t>> toks = {{1, 50, 60}, {1, 70}, {1, 80, 90, 100}};
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
  EXPECT_EQ(model_->stats().lora_shrink_rows, static_cast<int64_t>(layers) * modules * 9);
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
