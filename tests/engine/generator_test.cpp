// Batching invariance: a sequence's result does not depend on what else is in its batch,
// how its prompt is chunked, or whether prefill and decode steps share a forward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <regex>
#include <string>

#include "engine/generator.h"
#include "engine/guide/token_guide.h"
#include "engine/sampler.h"
#include "model/synthetic.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

int32_t stop_of_[4] = {};  // DecodeLookaheadGivesTheStepByStepTokens: a stop id per request

std::vector<GenerateRequest> make_requests() {
  std::vector<GenerateRequest> reqs;
  const int lens[] = {1, 17, 40, 5};
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r;
    for (int t = 0; t < lens[i]; ++t) r.prompt.push_back(3 + (t * 37 + i * 11) % 250);
    r.max_tokens = 12 + 3 * i;  // different lengths: sequences finish at different steps
    r.keep_first_logits = true;
    reqs.push_back(r);
  }
  return reqs;
}

TEST(Generator, BatchedChunkedMixedEqualsAlone) {
  auto be = make_cpu_backend(2);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto reqs = make_requests();
  std::vector<GenerateResult> alone;
  for (const auto& r : reqs) {
    Generator gen(**model, EngineOptions{});
    auto res = gen.run({r});
    ASSERT_TRUE(res.ok());
    alone.push_back((*res)[0]);
  }
  for (int64_t budget : {512, 7, 1}) {  // 7 and 1 force chunked prefill mixed with decode steps
    EngineOptions opts;
    opts.max_batch_tokens = budget;
    opts.page_size = budget == 7 ? 1 : 16;
    Generator gen(**model, opts);
    auto res = gen.run(reqs);
    ASSERT_TRUE(res.ok()) << res.error().message;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ((*res)[i].output, alone[i].output) << "request " << i << " budget " << budget;
      ASSERT_EQ((*res)[i].first_logits.size(), alone[i].first_logits.size());
      for (size_t v = 0; v < alone[i].first_logits.size(); ++v)
        ASSERT_NEAR((*res)[i].first_logits[v], alone[i].first_logits[v], 1e-4) << i << " " << v;
    }
  }
}

TEST(Generator, StopsAtStopIdAndReportsTooLongPrompts) {
  auto be = make_cpu_backend(1);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok());
  Generator gen(**model, EngineOptions{});
  GenerateRequest r;
  r.prompt = {1, 50, 60};
  r.max_tokens = 8;
  auto first = gen.run({r});
  ASSERT_TRUE(first.ok());
  ASSERT_EQ((*first)[0].output.size(), 8u);
  EXPECT_EQ((*first)[0].finish_reason, "length");
  const int32_t stop = (*first)[0].output[2];
  r.stop_ids = {stop};
  auto stopped = gen.run({r});
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ((*stopped)[0].finish_reason, "stop");
  // Greedy: the same tokens as the unstopped run, up to and including the first `stop`.
  const auto& full = (*first)[0].output;
  const auto cut = std::find(full.begin(), full.end(), stop) + 1;
  EXPECT_EQ((*stopped)[0].output, std::vector<int32_t>(full.begin(), cut));

  r.prompt.assign(5000, 7);
  auto too_long = gen.run({r});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(too_long.error().message.find("request 0: prompt (5000 tokens) + max tokens (8) exceeds the model's context"),
            std::string::npos)
      << too_long.error().message;
}

// A request with nothing to generate (max_tokens <= 0) finishes at once, as "length", and does
// not shrink the KV pool sized for the others (a negative count once did).
TEST(Generator, NothingToGenerateFinishesAtOnceAndTakesNoRoom) {
  auto be = make_cpu_backend(1);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok());
  Generator gen(**model, EngineOptions{});
  GenerateRequest none, zero, real;
  none.prompt = {1, 5, 6};
  none.max_tokens = -100;
  zero.prompt = {1, 7};
  zero.max_tokens = 0;
  real.prompt.assign(10, 9);
  real.max_tokens = 64;
  auto res = gen.run({none, zero, real});
  ASSERT_TRUE(res.ok()) << res.error().message;
  for (size_t i : {0u, 1u}) {
    EXPECT_TRUE((*res)[i].output.empty()) << i;
    EXPECT_EQ((*res)[i].finish_reason, "length") << i;
  }
  EXPECT_EQ((*res)[2].output.size(), 64u);
}

// A guided request (grammar or regex) batched with free ones: its text is in its language and
// ends at a whole match ("stop"), sampled or greedy, and the free requests get what they get
// alone (a guided row picks on the host, from the same logits). The synthetic model's random
// logits, one token a byte, reach every corner of the language.
TEST(Generator, GuidedRequestsFollowTheirLanguageBesideFreeOnes) {
  auto be = make_cpu_backend(2);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok());
  auto bytes = make_byte_tokenizer();
  auto trie = guide::VocabTrie::build(*bytes);
  const std::string gbnf = "root ::= \"(\" [a-c]{1,4} (\",\" root)? \")\"";
  auto grammar = guide::TokenGuide::compile_grammar(gbnf, "root", *trie);
  ASSERT_TRUE(grammar.ok()) << grammar.error().message;
  auto regex = guide::TokenGuide::compile("[0-9]{2,5}-(yes|no)", *trie);
  ASSERT_TRUE(regex.ok());
  const auto free_reqs = make_requests();
  std::vector<GenerateResult> alone;
  for (const auto& r : free_reqs) {
    auto res = Generator(**model, EngineOptions{}).run({r});
    ASSERT_TRUE(res.ok());
    alone.push_back((*res)[0]);
  }
  // Balanced: every "(" closed, letters between.
  auto balanced = [](const std::string& t) {
    int depth = 0;
    for (char c : t) {
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
      if (depth < 0) return false;
    }
    return depth == 0 && !t.empty() && t.front() == '(' && std::regex_match(t, std::regex("[(),a-c]+"));
  };
  for (float temperature : {0.f, 1.f}) {
    for (bool lookahead : {true, false}) {
      std::vector<GenerateRequest> reqs = free_reqs;
      for (int k = 0; k < 3; ++k) {
        GenerateRequest g;
        g.prompt = {1, 40 + k, 50};
        g.max_tokens = 200;
        g.sampling.temperature = temperature;
        g.sampling.seed = 9 + k;
        g.guide = k == 2 ? regex->get() : grammar->get();  // two requests on one guide
        reqs.push_back(g);
      }
      EngineOptions opts;
      opts.decode_lookahead = lookahead;
      opts.max_batch_tokens = 7;  // chunked prompts mixed with decode steps
      auto res = Generator(**model, opts).run(reqs);
      ASSERT_TRUE(res.ok()) << res.error().message;
      for (size_t i = 0; i < free_reqs.size(); ++i) EXPECT_EQ((*res)[i].output, alone[i].output) << i;
      for (size_t i = free_reqs.size(); i < reqs.size(); ++i) {
        const std::string text = bytes->decode((*res)[i].output);
        SCOPED_TRACE(text);
        EXPECT_EQ((*res)[i].finish_reason, "stop");
        if (i + 1 == reqs.size()) EXPECT_TRUE(std::regex_match(text, std::regex("[0-9]{2,5}-(yes|no)")));
        else EXPECT_TRUE(balanced(text));
      }
    }
  }
}

TEST(Generator, ExhaustedKvPoolIsAnErrorNotACrash) {
  auto be = make_cpu_backend(1);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok());
  EngineOptions opts;
  opts.kv_blocks = 2;  // 32 tokens
  Generator gen(**model, opts);
  GenerateRequest r;
  r.prompt.assign(40, 9);
  r.max_tokens = 4;
  auto res = gen.run({r});
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(res.error().message.find("exhausted"), std::string::npos);
}

// Sampled generation picks on the backend (forward_sample) unless the step's logits are wanted;
// both paths follow the same rules with the same draws, so keep_first_logits (its first token
// picked from host logits) changes nothing. Same seed, same text; another seed, another text.
TEST(Generator, SampledPicksAreTheSameOnBothPathsAndSeeded) {
  auto be = make_cpu_backend(2);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto run = [&](bool keep_logits, uint64_t seed, int64_t budget) {
    auto reqs = make_requests();
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].keep_first_logits = keep_logits;
      reqs[i].sampling = {0.9f, i == 1 ? 0 : 40, i == 2 ? 1.f : 0.95f, seed + i};
    }
    reqs[3].sampling.temperature = 0.f;  // a greedy request in the same batches
    EngineOptions opts;
    opts.max_batch_tokens = budget;
    Generator gen(**model, opts);
    auto res = gen.run(reqs);
    EXPECT_TRUE(res.ok()) << res.error().message;
    std::vector<std::vector<int32_t>> out;
    if (res.ok())
      for (const auto& r : *res) out.push_back(r.output);
    return out;
  };
  for (int64_t budget : {512, 7}) {
    const auto device = run(false, 11, budget);
    ASSERT_EQ(device.size(), 4u);
    EXPECT_EQ(run(true, 11, budget), device) << "budget " << budget;
    EXPECT_EQ(run(false, 11, budget), device) << "budget " << budget;
    const auto other = run(false, 500, budget);
    EXPECT_NE(other[0], device[0]);
    EXPECT_EQ(other[3], device[3]) << "the greedy request draws nothing";
  }
}

// Decode lookahead (each step launched before the previous step's tokens are read, its token
// taken from the previous pass's pick) gives the tokens of the step-by-step loop: greedy and
// sampled requests, stop ids hit mid-batch (the stopped sequence's speculative row is dropped),
// different max_tokens, chunked prompts joining a running decode, keep_first_logits.
TEST(Generator, DecodeLookaheadGivesTheStepByStepTokens) {
  auto be = make_cpu_backend(2);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto run = [&](bool lookahead, int64_t budget, bool with_stops) {
    auto reqs = make_requests();
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].keep_first_logits = i == 1;
      reqs[i].sampling = {i == 3 ? 0.f : 0.8f, 0, 0.95f, 7 + i};
    }
    if (with_stops) {
      // A stop id each sequence emits a few tokens in (found from a run without stops).
      for (size_t i = 0; i < reqs.size(); ++i) reqs[i].stop_ids = {stop_of_[i]};
    }
    EngineOptions opts;
    opts.max_batch_tokens = budget;
    opts.decode_lookahead = lookahead;
    Generator gen(**model, opts);
    std::vector<std::vector<int32_t>> streamed(reqs.size());
    auto res = gen.run(reqs, [&](size_t i, int32_t t) { streamed[i].push_back(t); });
    EXPECT_TRUE(res.ok()) << res.error().message;
    std::vector<GenerateResult> out = res.ok() ? *res : std::vector<GenerateResult>{};
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(streamed[i], out[i].output) << "streamed tokens of " << i;
    return out;
  };
  for (int64_t budget : {512, 7}) {
    const auto plain = run(false, budget, false);
    ASSERT_EQ(plain.size(), 4u);
    for (size_t i = 0; i < plain.size(); ++i) stop_of_[i] = plain[i].output[std::min<size_t>(2 + i, plain[i].output.size() - 1)];
    const auto ahead = run(true, budget, false);
    ASSERT_EQ(ahead.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(ahead[i].output, plain[i].output) << "request " << i << " budget " << budget;
      EXPECT_EQ(ahead[i].finish_reason, plain[i].finish_reason);
      EXPECT_EQ(ahead[i].first_logits, plain[i].first_logits);
    }
    const auto plain_stop = run(false, budget, true), ahead_stop = run(true, budget, true);
    ASSERT_EQ(ahead_stop.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(ahead_stop[i].output, plain_stop[i].output) << "request " << i << " budget " << budget << " (stops)";
      EXPECT_EQ(ahead_stop[i].finish_reason, "stop") << i;
    }
  }
}

TEST(Generator, ForwardSampleWantsOneRowPerLogitsRow) {
  auto be = make_cpu_backend(1);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok());
  auto pools = KvPools::create((*model)->config(), 16, 4, "test", pool_backend(*be));
  ASSERT_TRUE(pools.ok());
  FullKvCache kv(pools->kv.get());
  const std::vector<int32_t> ids = {1, 50, 60};
  const std::vector<RowSampling> two(2);
  auto r = (*model)->forward_sample({SeqInput{ids.data(), 3, 0, &kv, nullptr, false}}, two);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("2 sampling rows"), std::string::npos) << r.error().message;
}

TEST(Sampler, GreedyTopKTopPAndSeed) {
  std::vector<float> logits = {0.f, 3.f, 1.f, 2.9f, -5.f};
  Sampler greedy({0.f, 0, 1.f, 0});
  EXPECT_EQ(greedy.sample(logits.data(), 5), 1);
  // top-k 1 is greedy whatever the temperature.
  Sampler k1({1.5f, 1, 1.f, 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(k1.sample(logits.data(), 5), 1);
  // top-p small enough keeps only ids 1 and 3.
  Sampler p({1.0f, 0, 0.8f, 5});
  int seen[5] = {};
  for (int i = 0; i < 400; ++i) ++seen[p.sample(logits.data(), 5)];
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  // Same seed, same draws.
  Sampler a({1.0f, 0, 1.f, 42}), b({1.0f, 0, 1.f, 42});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.sample(logits.data(), 5), b.sample(logits.data(), 5));
}

}  // namespace
}  // namespace lragent
