// Suffix decoding (--speculative-config '{"method": "suffix"}'): its config keys (vLLM's names
// and defaults; SpeculativeConfig.RefusalsNameTheCause checks its refusals), the proposer against
// a brute-force search written from the definition in engine/suffix_decoding.h (random texts and
// corpora, every option), and the corpus's first-in-first-out bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <random>

#include "engine/speculative.h"
#include "engine/suffix_decoding.h"

namespace lragent {
namespace {

TEST(SuffixConfig, ReadsVllmsSuffixKeysAndDefaults) {
  auto o = parse_speculative_config(R"({"method": "suffix"})");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->method, SpeculativeMethod::kSuffix);
  EXPECT_EQ(o->num_tokens, 32);
  EXPECT_EQ(o->max_tree_depth, 24);
  EXPECT_EQ(o->max_cached_requests, 10000);
  EXPECT_FLOAT_EQ(o->max_spec_factor, 1.f);
  EXPECT_FLOAT_EQ(o->min_token_prob, 0.1f);
  EXPECT_TRUE(o->on());
  o = parse_speculative_config(
      R"({"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 16,
          "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 2.5,
          "suffix_decoding_min_token_prob": 0, "disable_by_batch_size": 4})");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->num_tokens, 8);
  EXPECT_EQ(o->max_tree_depth, 16);
  EXPECT_EQ(o->max_cached_requests, 0);
  EXPECT_FLOAT_EQ(o->max_spec_factor, 2.5f);
  EXPECT_FLOAT_EQ(o->min_token_prob, 0.f);
  EXPECT_EQ(o->disable_by_batch_size, 4);
  o = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3})");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->method, SpeculativeMethod::kNgram);
}

SpeculativeOptions suffix_options(int num, int depth, float factor, float min_prob) {
  SpeculativeOptions o;
  o.method = SpeculativeMethod::kSuffix;
  o.num_tokens = num;
  o.max_tree_depth = depth;
  o.max_spec_factor = factor;
  o.min_token_prob = min_prob;
  return o;
}

// The definition, searched by brute force. A source is a list of documents, newest last; an
// occurrence is (document, position), the latest first (newer documents, then later positions).
struct RefProposal {
  std::vector<int32_t> drafts;
  double score = 0;
  int match = 0;
};
RefProposal ref_source(const std::vector<int32_t>& ctx, const std::vector<std::vector<int32_t>>& docs,
                       const SpeculativeOptions& o, int max_drafts) {
  const int n = static_cast<int>(ctx.size());
  const int depth = std::min(o.max_tree_depth, n);
  RefProposal best;
  for (int m = 1; m <= depth; ++m) {
    std::vector<std::pair<int, int>> occ;  // latest first
    for (int d = static_cast<int>(docs.size()) - 1; d >= 0; --d)
      for (int p = static_cast<int>(docs[d].size()) - 2; p >= m - 1; --p) {
        bool same = true;
        for (int i = 0; i < m && same; ++i) same = docs[d][p - i] == ctx[n - 1 - i];
        if (same) occ.push_back({d, p});
      }
    if (occ.empty()) break;
    const int budget = static_cast<int>(std::min<double>(
        {static_cast<double>(o.num_tokens), std::floor(static_cast<double>(o.max_spec_factor) * m + 1e-9),
         static_cast<double>(o.max_tree_depth - m), static_cast<double>(max_drafts)}));
    if (budget <= 0) continue;
    RefProposal p;
    p.match = m;
    double prob = 1.0;
    for (int k = 1; k <= budget; ++k) {
      std::map<int32_t, int> count;
      int going_on = 0;
      for (auto [d, q] : occ)
        if (q + k < static_cast<int>(docs[d].size())) {
          ++count[docs[d][q + k]];
          ++going_on;
        }
      if (going_on == 0) break;
      int most = 0;
      for (auto [t, c] : count) most = std::max(most, c);
      int32_t pick = -1;
      for (auto [d, q] : occ)
        if (q + k < static_cast<int>(docs[d].size()) && count[docs[d][q + k]] == most) {
          pick = docs[d][q + k];
          break;
        }
      prob *= static_cast<double>(most) / going_on;
      if (prob < o.min_token_prob) break;
      p.drafts.push_back(pick);
      p.score += prob;
      std::vector<std::pair<int, int>> next;
      for (auto [d, q] : occ)
        if (q + k < static_cast<int>(docs[d].size()) && docs[d][q + k] == pick) next.push_back({d, q});
      occ = next;
    }
    if (!p.drafts.empty() && (p.score > best.score || (p.score == best.score && m > best.match))) best = p;
  }
  return best;
}
std::vector<int32_t> ref_propose(const std::vector<int32_t>& ctx, const std::vector<std::vector<int32_t>>& corpus,
                                 const SpeculativeOptions& o, int max_drafts) {
  if (max_drafts <= 0 || ctx.empty()) return {};
  const RefProposal text = ref_source(ctx, {ctx}, o, max_drafts);
  const RefProposal from_corpus = ref_source(ctx, corpus, o, max_drafts);
  const bool corpus_wins = from_corpus.score > text.score || (from_corpus.score == text.score && from_corpus.match > text.match);
  return corpus_wins ? from_corpus.drafts : text.drafts;
}

TEST(SuffixProposer, TheMostFrequentContinuationWinsOverTheLatest) {
  // "1 2" is followed by 3 twice and by 4 once (the latest): 3 is drafted, with probability 2/3.
  const std::vector<int32_t> ctx = {1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2};
  auto o = suffix_options(4, 24, 1.f, 0.f);
  // Two matched tokens, spec factor 1: two drafts at most; after "1 2 3", 9 and 8 once each: the
  // latest occurrence's 8 (probability 2/3 x 1/2).
  EXPECT_EQ(propose_suffix(ctx, o, nullptr, 4), (std::vector<int32_t>{3, 8}));
  // A draft below min_token_prob is not proposed: 2/3 < 0.7, so nothing is.
  o.min_token_prob = 0.7f;
  EXPECT_TRUE(propose_suffix(ctx, o, nullptr, 4).empty());
  o.min_token_prob = 0.5f;  // 3 (2/3) passes, 8 (1/3) does not
  EXPECT_EQ(propose_suffix(ctx, o, nullptr, 4), (std::vector<int32_t>{3}));
}

TEST(SuffixProposer, DraftsFromEarlierOutputsInTheCorpus) {
  SuffixCorpus corpus(10);
  corpus.add(std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11});
  const std::vector<int32_t> ctx = {1, 2, 3, 5, 6, 7};  // "5 6 7" only in the corpus
  auto o = suffix_options(8, 24, 1.f, 0.1f);
  EXPECT_TRUE(propose_suffix(ctx, o, nullptr, 8).empty());
  EXPECT_EQ(propose_suffix(ctx, o, &corpus, 8), (std::vector<int32_t>{8, 9, 10}));  // 3 matched, factor 1
  o.max_spec_factor = 2.f;
  EXPECT_EQ(propose_suffix(ctx, o, &corpus, 8), (std::vector<int32_t>{8, 9, 10, 11}));  // to the output's end
  EXPECT_EQ(propose_suffix(ctx, o, &corpus, 2), (std::vector<int32_t>{8, 9}));
  // Match + drafts within the depth: the 3-token match leaves room for 2, the 2-token one ("6 7")
  // for 3, which scores higher.
  o.max_tree_depth = 5;
  EXPECT_EQ(propose_suffix(ctx, o, &corpus, 8), (std::vector<int32_t>{8, 9, 10}));
  o.max_tree_depth = 4;  // 3 + 1, 2 + 2 (factor 2: 4), 1 + 2: "6 7" -> 8 9
  EXPECT_EQ(propose_suffix(ctx, o, &corpus, 8), (std::vector<int32_t>{8, 9}));
}

TEST(SuffixProposer, MatchesTheBruteForceDefinition) {
  std::mt19937 rng(11);
  int nonempty = 0, from_corpus = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int alphabet = 2 + static_cast<int>(rng() % 5);
    const int n = 1 + static_cast<int>(rng() % 120);
    std::vector<int32_t> ctx(static_cast<size_t>(n));
    for (auto& t : ctx) t = static_cast<int32_t>(rng() % alphabet);
    const int outputs = static_cast<int>(rng() % 6);
    const int keep = static_cast<int>(rng() % 5);  // max_cached_requests: the oldest go first
    SuffixCorpus corpus(keep);
    std::vector<std::vector<int32_t>> all;
    for (int k = 0; k < outputs; ++k) {
      std::vector<int32_t> out(1 + rng() % 60);
      for (auto& t : out) t = static_cast<int32_t>(rng() % alphabet);
      corpus.add(out);
      all.push_back(out);
    }
    const std::vector<std::vector<int32_t>> kept(all.end() - std::min<ptrdiff_t>(keep, static_cast<ptrdiff_t>(all.size())),
                                                 all.end());
    ASSERT_EQ(corpus.outputs(), static_cast<int64_t>(kept.size()));
    SpeculativeOptions o = suffix_options(1 + static_cast<int>(rng() % 8), 2 + static_cast<int>(rng() % 14),
                                          std::array<float, 4>{0.5f, 1.f, 1.5f, 3.f}[rng() % 4],
                                          std::array<float, 4>{0.f, 0.1f, 0.3f, 0.6f}[rng() % 4]);
    const int max_drafts = static_cast<int>(rng() % 10);
    const std::vector<int32_t> got = propose_suffix(ctx, o, &corpus, max_drafts);
    const std::vector<int32_t> want = ref_propose(ctx, kept, o, max_drafts);
    ASSERT_EQ(got, want) << "iteration " << iter;
    nonempty += !got.empty();
    from_corpus += !got.empty() && got != ref_propose(ctx, {}, o, max_drafts);
  }
  EXPECT_GT(nonempty, 1000);    // the comparison covers proposals
  EXPECT_GT(from_corpus, 100);  // and ones the corpus made
}

TEST(SuffixProposer, LongTextsMatchTheBruteForceDefinition) {
  // Texts of thousands of tokens: the search for the last token's occurrences runs over many
  // 64-token chunks, with hits at every offset in them and in the partial chunk at the start.
  std::mt19937 rng(5);
  int nonempty = 0;
  for (int iter = 0; iter < 150; ++iter) {
    // Small alphabets put the last token in every chunk; large ones leave it in a few, at any
    // offset (a chunk whose one hit is its first or last token).
    const int alphabet = iter % 2 ? 8 + static_cast<int>(rng() % 40) : 500 + static_cast<int>(rng() % 3000);
    const int n = 64 + static_cast<int>(rng() % 4000);
    std::vector<int32_t> ctx(static_cast<size_t>(n));
    for (auto& t : ctx) t = static_cast<int32_t>(rng() % alphabet);
    // Repeated phrases, so that long matches and continuations exist.
    for (int k = 0; k < 20; ++k) {
      const int len = 2 + static_cast<int>(rng() % 12);
      const int from = static_cast<int>(rng() % static_cast<unsigned>(n - len));
      const int to = static_cast<int>(rng() % static_cast<unsigned>(n - len));
      std::copy_n(ctx.begin() + from, len, ctx.begin() + to);
    }
    const int tail = 1 + static_cast<int>(rng() % 8);  // the text ends with an earlier phrase
    std::copy_n(ctx.begin() + static_cast<int>(rng() % static_cast<unsigned>(n - tail)), tail, ctx.end() - tail);
    // The reference weighs every occurrence: within the proposer's bound here.
    ASSERT_LT(std::count(ctx.begin(), ctx.end() - 1, ctx.back()), kMaxSuffixCandidates);
    SpeculativeOptions o = suffix_options(1 + static_cast<int>(rng() % 16), 2 + static_cast<int>(rng() % 24), 1.f,
                                          std::array<float, 3>{0.f, 0.1f, 0.3f}[rng() % 3]);
    const std::vector<int32_t> got = propose_suffix(ctx, o, nullptr, 16);
    ASSERT_EQ(got, ref_propose(ctx, {}, o, 16)) << "iteration " << iter;
    nonempty += !got.empty();
  }
  EXPECT_GT(nonempty, 100);
}

TEST(SuffixProposer, OnlyTheLatestOccurrencesAreWeighed) {
  // 3000 older occurrences of 5 continue with 1, the latest ones with 2 (depth 2: one draft from
  // a one-token match). Of the latest kMaxSuffixCandidates occurrences, `recent` continue with 2.
  const auto text = [](int recent) {
    std::vector<int32_t> ctx;
    for (int i = 0; i < 3000; ++i) ctx.insert(ctx.end(), {5, 1, 9});
    for (int i = 0; i < recent; ++i) ctx.insert(ctx.end(), {5, 2, 9});
    ctx.push_back(5);
    return ctx;
  };
  const auto o = suffix_options(4, 2, 1.f, 0.1f);
  // Weighing every occurrence, 1 would win 3000 to 1024.
  EXPECT_EQ(propose_suffix(text(kMaxSuffixCandidates), o, nullptr, 4), (std::vector<int32_t>{2}));
  // Half and half: the tie goes to the latest occurrence's continuation (more weighed: 1 wins).
  EXPECT_EQ(propose_suffix(text(kMaxSuffixCandidates / 2), o, nullptr, 4), (std::vector<int32_t>{2}));
  // One fewer recent: 1 wins 513 to 511 (were two fewer weighed, a tie: 2).
  EXPECT_EQ(propose_suffix(text(kMaxSuffixCandidates / 2 - 1), o, nullptr, 4), (std::vector<int32_t>{1}));
}

TEST(SuffixCorpus, KeepsTheLatestOutputsWithinItsBounds) {
  SuffixCorpus none(0);
  none.add(std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(none.outputs(), 0);
  SuffixCorpus c(3);
  for (int i = 0; i < 100; ++i) c.add(std::vector<int32_t>{i, i + 1, i + 2, i + 3});
  EXPECT_EQ(c.outputs(), 3);
  EXPECT_EQ(c.tokens(), 12);
  // Only the last three outputs (97.., 98.., 99..) are searched: "50 51" drafts nothing.
  const auto o = suffix_options(4, 24, 2.f, 0.f);
  EXPECT_TRUE(propose_suffix(std::vector<int32_t>{50, 51}, o, &c, 4).empty());
  EXPECT_EQ(propose_suffix(std::vector<int32_t>{98, 99}, o, &c, 4), (std::vector<int32_t>{100, 101}));
  // The token bound: two outputs of 600k tokens do not fit 1M; the older goes.
  SuffixCorpus big(10);
  big.add(std::vector<int32_t>(600000, 7));
  big.add(std::vector<int32_t>(600000, 8));
  EXPECT_EQ(big.outputs(), 1);
  EXPECT_EQ(big.tokens(), 600000);
}

}  // namespace
}  // namespace lragent
