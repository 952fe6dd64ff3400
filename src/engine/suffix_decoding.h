// Speculative decoding by suffix matching (vLLM's "suffix" method, after Arctic Inference's
// SuffixDecoding, arXiv 2411.04975): drafts for a text are the likeliest continuation of its
// latest tokens, found in two sources: the text itself (an agent's whole trajectory: the prompt,
// tool observations, every agent's turns) and a corpus of earlier finished outputs (other
// requests', other trajectories'). Agents that write the same kinds of plans, actions and answers
// again and again are what it finds; unlike n-gram lookup (one occurrence, a fixed suffix length)
// it weighs every occurrence, so it drafts only what usually follows, and as many tokens as the
// match supports.
//
// The proposal, for a text c of n tokens, in each source on its own (the better one wins):
//   pattern   the last min(D, n) tokens of c (D = max_tree_depth);
//   matches   for m = 1 .. the longest match: the occurrences of c's last m tokens in the source
//             that have a token after them (in the text: ending before its last token; in the
//             corpus: inside one output), at most kMaxSuffixCandidates of the latest positions
//             with the last token considered;
//   path      from those occurrences, repeatedly the next token most of them continue with (ties:
//             the one the latest occurrence continues with), each draft's probability the running
//             product of (occurrences continuing with it / occurrences continuing at all), the
//             occurrences then narrowed to those that continue with it; it stops before a token
//             whose probability is below min_token_prob, where no occurrence goes on, or at
//             min(num_tokens, floor(max_spec_factor x m), D - m, max_drafts) tokens;
//   score     the sum of the drafts' probabilities (the tokens it expects to be kept).
// The path of the highest score wins (ties: the longer match, then the text over the corpus).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

namespace lragent {

struct SpeculativeOptions;

// Occurrences of the last token considered per source and pass: bounds a pass's cost on long
// texts and large corpora (the latest ones are taken).
inline constexpr int kMaxSuffixCandidates = 1024;
// Tokens a corpus keeps at most (the oldest outputs go first past it, as past its output count).
inline constexpr int64_t kMaxSuffixCorpusTokens = int64_t{1} << 20;

// Finished outputs, searchable by their tokens (vLLM's global suffix tree). First in, first out
// past `max_outputs` outputs or kMaxSuffixCorpusTokens tokens. Thread-safe: the server's engine
// and the CLI's steps add to it while others propose from it.
class SuffixCorpus {
 public:
  explicit SuffixCorpus(int max_outputs) : max_outputs_(max_outputs) {}
  // A finished output (empty ones and outputs with max_outputs 0 are not kept).
  void add(std::span<const int32_t> tokens);
  int64_t outputs() const;
  int64_t tokens() const;

 private:
  friend struct SuffixSearch;
  void drop_oldest();  // the caller holds mu_
  void compact();      // the caller holds mu_

  int max_outputs_;
  mutable std::mutex mu_;
  std::vector<int32_t> toks_;  // [live tokens] the outputs in order, each followed by -1
  int64_t base_ = 0;           // the global position of toks_[0]
  int64_t dead_ = 0;           // toks_'s first entries that belong to dropped outputs
  std::vector<int64_t> ends_;  // global positions one past each live output's separator, oldest first
  size_t first_end_ = 0;       // ends_'s first live entry
  // token -> its global positions in the corpus, ascending (dropped ones skipped when read)
  std::unordered_map<int32_t, std::vector<int64_t>> where_;
};

// The drafts for `context` (its last token the latest) by the rules above, from the context and,
// when not null, `corpus`: at most max_drafts. Empty when nothing matches (or max_drafts <= 0).
std::vector<int32_t> propose_suffix(std::span<const int32_t> context, const SpeculativeOptions& opts,
                                    SuffixCorpus* corpus, int max_drafts);

}  // namespace lragent
