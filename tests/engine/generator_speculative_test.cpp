// The Generator with speculative decoding (EngineOptions::speculative, `lragent generate
// --speculative-config`) on tinystories-656k and its adapters: requests give exactly the tokens of
// one pass a token, greedy, sampled (the same seed: each row picked with the draw decoding a token
// a pass makes) and guided ones, batched and chunked with others, at every token budget; drafts
// are found and kept, sampled and guided ones' too (checked, so that the comparison covers them);
// max_tokens is never passed.
#include <gtest/gtest.h>

#include "engine/generator.h"
#include "engine/guide/token_guide.h"
#include "model/lora.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

TEST(GeneratorSpeculative, TokensAreThoseOfOnePassAToken) {
  auto be = make_cpu_backend(2);
  auto model = LlamaModel::load(testing::tinystories_dir(), *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  std::vector<std::unique_ptr<LoraAdapter>> adapters;
  for (const char* role : {"plan", "action"}) {
    auto a = load_lora_adapter(role, testing::adapters_dir() + "/qv-indep-a-r8/" + role, (*model)->config());
    ASSERT_TRUE(a.ok()) << a.error().message;
    adapters.push_back(std::move(*a));
  }
  auto trie = guide::VocabTrie::build(**tok);
  auto guide = guide::TokenGuide::compile("[a-z ]{10,40}\\.", *trie);
  ASSERT_TRUE(guide.ok()) << guide.error().message;

  const char* prompts[] = {
      "Once upon a time, there was a little girl named Lily. Lily had a red ball. Lily",
      "Tom had a big dog. The big dog liked to run. One day, Tom and the big dog",
      "The cat sat on the mat. The cat was happy. The cat",
      "Sue and Sam played in the park. Sue said, \"Sam, look!\" Sam",
  };
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < std::size(prompts); ++i) {
    GenerateRequest r;
    r.prompt = *(*tok)->encode(prompts[i], true);
    r.max_tokens = 30 + 7 * static_cast<int>(i);
    r.adapter = i == 0 ? nullptr : adapters[i % 2].get();
    r.stop_ids = (*model)->config().eos_token_ids;
    r.keep_first_logits = i == 1;
    reqs.push_back(r);
  }
  GenerateRequest sampled = reqs[0];
  sampled.sampling = {0.2f, 0, 0.95f, 3};
  sampled.max_tokens = 60;
  reqs.push_back(sampled);
  GenerateRequest top_k = reqs[3];  // sampled from the 3 likeliest at temperature 1
  top_k.sampling = {1.f, 3, 1.f, 5};
  top_k.max_tokens = 60;
  GenerateRequest guided = reqs[2];
  guided.guide = guide->get();
  reqs.push_back(guided);
  reqs.push_back(top_k);

  std::vector<GenerateResult> plain;
  {
    auto r = Generator(**model, EngineOptions{}).run(reqs);
    ASSERT_TRUE(r.ok()) << r.error().message;
    plain = std::move(*r);
  }
  for (int64_t budget : {int64_t{512}, int64_t{9}}) {
    for (int cap : {0, 3}) {
      SCOPED_TRACE(::testing::Message() << "budget " << budget << " disable_by_batch_size " << cap);
      EngineOptions o;
      o.max_batch_tokens = budget;
      o.speculative.num_tokens = 4;
      o.speculative.lookup_min = 1;
      o.speculative.lookup_max = 3;
      o.speculative.disable_by_batch_size = cap;
      auto r = Generator(**model, o).run(reqs);
      ASSERT_TRUE(r.ok()) << r.error().message;
      int64_t accepted = 0, accepted_sampled = 0, accepted_guided = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ((*r)[i].output, plain[i].output);
        EXPECT_EQ((*r)[i].finish_reason, plain[i].finish_reason);
        EXPECT_LE(static_cast<int>((*r)[i].output.size()), reqs[i].max_tokens);
        ASSERT_EQ((*r)[i].first_logits.size(), plain[i].first_logits.size());
        if (!plain[i].first_logits.empty())  // a chunked prompt rounds differently
          EXPECT_LE(testing::max_abs_diff((*r)[i].first_logits, plain[i].first_logits), 1e-4f);
        EXPECT_LE((*r)[i].drafts.accepted, (*r)[i].drafts.drafted);
        accepted += (*r)[i].drafts.accepted;
      }
      accepted_sampled = (*r)[4].drafts.accepted;
      accepted_guided = (*r)[5].drafts.accepted;
      EXPECT_GT(accepted, cap == 0 ? 20 : 2);
      if (cap == 0) {
        EXPECT_GT(accepted_sampled, 0);
        EXPECT_GT(accepted_guided, 0);
      }
    }
  }
}

// The suffix method: the same tokens, and a Generator keeps a corpus of its finished outputs, so
// a later run of the same prompt drafts most of its answer from the earlier one.
TEST(GeneratorSpeculative, TheSuffixMethodDraftsFromEarlierOutputs) {
  auto be = make_cpu_backend(2);
  auto model = LlamaModel::load(testing::tinystories_dir(), *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  GenerateRequest req;
  req.prompt = *(*tok)->encode("Once upon a time, there was a little boy named Tim. Tim", true);
  req.max_tokens = 48;
  req.stop_ids = (*model)->config().eos_token_ids;
  GenerateRequest sampled = req;
  sampled.sampling = {0.3f, 0, 1.f, 4};
  auto plain = Generator(**model, EngineOptions{}).run({req, sampled});
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EngineOptions o;
  o.speculative.method = SpeculativeMethod::kSuffix;
  o.speculative.num_tokens = 8;
  Generator gen(**model, o);
  std::vector<int64_t> accepted;
  for (int run = 0; run < 2; ++run) {
    auto r = gen.run({req, sampled});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ((*r)[0].output, (*plain)[0].output) << run;
    EXPECT_EQ((*r)[1].output, (*plain)[1].output) << run;
    accepted.push_back((*r)[0].drafts.accepted);
  }
  EXPECT_GT(accepted[1], accepted[0]);
  EXPECT_GE(accepted[1] * 2, static_cast<int64_t>((*plain)[0].output.size()));
}

}  // namespace
}  // namespace lragent
