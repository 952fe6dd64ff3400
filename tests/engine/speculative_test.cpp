// --speculative-config's parser (vLLM's keys, defaults and refusals) and the n-gram proposer
// against a brute-force search written from its definition.
#include <gtest/gtest.h>

#include <random>

#include "engine/speculative.h"

namespace lragent {
namespace {

TEST(SpeculativeConfig, ReadsVllmsNgramConfig) {
  auto o = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2})");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->num_tokens, 4);
  EXPECT_EQ(o->lookup_max, 3);
  EXPECT_EQ(o->lookup_min, 2);
  EXPECT_EQ(o->disable_by_batch_size, 0);
  EXPECT_TRUE(o->on());
  // One bound given sets the other; neither: both 5 (vLLM's defaults). 4.0 is an integer.
  o = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5.0, "prompt_lookup_max": 4})");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->num_tokens, 5);
  EXPECT_EQ(o->lookup_min, 4);
  EXPECT_EQ(o->lookup_max, 4);
  o = parse_speculative_config(R"({"num_speculative_tokens": 2, "prompt_lookup_min": 1})");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->lookup_min, 1);
  EXPECT_EQ(o->lookup_max, 1);
  o = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 8})");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->lookup_min, 5);
  EXPECT_EQ(o->lookup_max, 5);
  EXPECT_EQ(o->disable_by_batch_size, 8);
  EXPECT_FALSE(SpeculativeOptions{}.on());
}

TEST(SpeculativeConfig, RefusalsNameTheCause) {
  const std::pair<const char*, const char*> bad[] = {
      {"{", "not valid JSON"},
      {"[1]", "must be a JSON object"},
      {R"({"method": "eagle", "num_speculative_tokens": 3})", "method \"eagle\" is not supported"},
      {R"({"method": 3, "num_speculative_tokens": 3})", "\"method\" must be a string"},
      {R"({"num_speculative_tokens": 3})", "say \"method\": \"ngram\""},
      {R"({"method": "ngram"})", "\"num_speculative_tokens\" is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "between 1 and 32"},
      {R"({"method": "ngram", "num_speculative_tokens": 2.5})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": "4"})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 1e300})", "between 1 and 32"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 2, "prompt_lookup_min": 3})",
       "must not exceed"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 65})", "between 1 and 64"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "model": "x"})", "unknown key \"model\""},
      // The suffix method's keys (tests/engine/suffix_decoding_test.cpp reads them).
      {R"({"method": "suffix", "prompt_lookup_max": 4})", "\"prompt_lookup_max\" is a key of the ngram method"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "suffix_decoding_min_token_prob": 0.2})",
       "\"suffix_decoding_min_token_prob\" is a key of the suffix method"},
      {R"({"method": "suffix", "suffix_decoding_min_token_prob": 1.5})", "between 0 and 1"},
      {R"({"method": "suffix", "suffix_decoding_min_token_prob": "high"})", "must be a number"},
      {R"({"method": "suffix", "suffix_decoding_max_tree_depth": 1})", "between 2 and 1024"},
      {R"({"method": "suffix", "suffix_decoding_max_cached_requests": -1})", "between 0 and"},
      {R"({"method": "suffix", "suffix_decoding_max_spec_factor": -1})", "between 0 and"},
      {R"({"method": "suffix", "num_speculative_tokens": 33})", "between 1 and 32"},
      {R"({"method": "suffix", "model": "x"})", "unknown key \"model\" (the suffix method takes"},
      {R"({"method": "eagle3", "num_speculative_tokens": 3})", "or suffix matching"},
  };
  for (const auto& [text, cause] : bad) {
    SCOPED_TRACE(text);
    auto o = parse_speculative_config(text);
    ASSERT_FALSE(o.ok());
    EXPECT_NE(o.error().message.find("--speculative-config"), std::string::npos) << o.error().message;
    EXPECT_NE(o.error().message.find(cause), std::string::npos) << o.error().message;
  }
}

TEST(NgramProposer, TakesTheLatestOccurrenceOfTheLongestSuffix) {
  SpeculativeOptions o;
  o.lookup_min = 1;
  o.lookup_max = 3;
  // Suffix "7 8": "8" alone occurs at 1 and 6, "7 8" only at 5..6; the longest wins.
  const std::vector<int32_t> ctx = {1, 8, 2, 3, 4, 7, 8, 9, 10, 11, 7, 8};
  EXPECT_EQ(propose_ngram(ctx, o, 3), (std::vector<int32_t>{9, 10, 11}));
  EXPECT_EQ(propose_ngram(ctx, o, 1), (std::vector<int32_t>{9}));
  EXPECT_TRUE(propose_ngram(ctx, o, 0).empty());
  // Of two equally long matches, the latest; the drafts stop at the context's end.
  const std::vector<int32_t> twice = {5, 6, 1, 5, 6, 2, 3, 5, 6};
  EXPECT_EQ(propose_ngram(twice, o, 4), (std::vector<int32_t>{2, 3, 5, 6}));
  // A match shorter than lookup_min proposes nothing.
  o.lookup_min = 3;
  EXPECT_TRUE(propose_ngram(twice, o, 4).empty());
  // Too short a context, or no earlier occurrence.
  o.lookup_min = 1;
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{4}, o, 4).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3, 4}, o, 4).empty());
  // A run of one token: the latest occurrence of the longest suffix overlaps it.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{9, 9, 9, 9, 9}, o, 4), (std::vector<int32_t>{9}));
}

// The definition, searched by brute force: for len from lookup_max down to lookup_min, the
// latest end e < n - 1 whose len tokens equal the last len tokens.
std::vector<int32_t> reference(const std::vector<int32_t>& c, const SpeculativeOptions& o, int k) {
  const auto n = static_cast<int64_t>(c.size());
  for (int len = o.lookup_max; len >= o.lookup_min; --len) {
    for (int64_t e = n - 2; e >= len - 1; --e) {
      bool same = true;
      for (int i = 0; i < len && same; ++i) same = c[static_cast<size_t>(e - i)] == c[static_cast<size_t>(n - 1 - i)];
      if (same) return {c.begin() + e + 1, c.begin() + std::min<int64_t>(n, e + 1 + k)};
    }
  }
  return {};
}

TEST(NgramProposer, MatchesTheDefinitionOnRandomTexts) {
  std::mt19937 rng(3);
  int proposed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    SpeculativeOptions o;
    o.lookup_min = 1 + static_cast<int>(rng() % 4);
    o.lookup_max = o.lookup_min + static_cast<int>(rng() % 4);
    const int vocab = 2 + static_cast<int>(rng() % 5);
    std::vector<int32_t> c(rng() % 60);
    for (auto& t : c) t = static_cast<int32_t>(rng() % vocab);
    const int k = static_cast<int>(rng() % 6);
    const auto got = propose_ngram(c, o, k);
    ASSERT_EQ(got, reference(c, o, k)) << "trial " << trial;
    proposed += !got.empty();
  }
  EXPECT_GT(proposed, 1000);  // the comparison covers proposals, not only empty answers
}

}  // namespace
}  // namespace lragent
