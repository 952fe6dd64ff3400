#include "engine/suffix_decoding.h"

#include <algorithm>
#include <cmath>

#include "engine/speculative.h"

namespace lragent {

void SuffixCorpus::add(std::span<const int32_t> tokens) {
  if (tokens.empty() || max_outputs_ <= 0) return;
  // An output longer than the whole corpus keeps its last tokens.
  if (static_cast<int64_t>(tokens.size()) >= kMaxSuffixCorpusTokens)
    tokens = tokens.last(static_cast<size_t>(kMaxSuffixCorpusTokens - 1));
  std::lock_guard<std::mutex> lock(mu_);
  while (ends_.size() - first_end_ >= static_cast<size_t>(max_outputs_) ||
         (ends_.size() > first_end_ &&
          static_cast<int64_t>(toks_.size()) - dead_ + static_cast<int64_t>(tokens.size()) + 1 > kMaxSuffixCorpusTokens))
    drop_oldest();
  const int64_t at = base_ + static_cast<int64_t>(toks_.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    toks_.push_back(tokens[i]);
    where_[tokens[i]].push_back(at + static_cast<int64_t>(i));
  }
  toks_.push_back(-1);
  ends_.push_back(base_ + static_cast<int64_t>(toks_.size()));
}

void SuffixCorpus::drop_oldest() {
  dead_ = ends_[first_end_++] - base_;
  if (dead_ * 2 > static_cast<int64_t>(toks_.size())) compact();
}

void SuffixCorpus::compact() {
  // The dropped outputs' tokens go, and with them their positions in the index (amortised: the
  // live half is copied once per half dropped).
  toks_.erase(toks_.begin(), toks_.begin() + dead_);
  base_ += dead_;
  dead_ = 0;
  ends_.erase(ends_.begin(), ends_.begin() + static_cast<ptrdiff_t>(first_end_));
  first_end_ = 0;
  for (auto it = where_.begin(); it != where_.end();) {
    std::vector<int64_t>& v = it->second;
    v.erase(v.begin(), std::lower_bound(v.begin(), v.end(), base_));
    it = v.empty() ? where_.erase(it) : std::next(it);
  }
}

int64_t SuffixCorpus::outputs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(ends_.size() - first_end_);
}

int64_t SuffixCorpus::tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(toks_.size()) - dead_ - static_cast<int64_t>(ends_.size() - first_end_);
}

namespace {

// How many of a step's live occurrences continue with each token: open addressing over a table
// of at least twice as many slots as occurrences (a step counts at most kMaxSuffixCandidates),
// reset per step (a std::unordered_map's node allocations were a fifth of a pass's time).
class TokenCounts {
 public:
  void reset(size_t n) {
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    keys_.assign(size, -1);
    counts_.assign(size, 0);
  }
  // t's count after adding one (t >= 0).
  int add(int32_t t) { return ++counts_[slot(t)]; }
  int get(int32_t t) const { return counts_[slot(t)]; }

 private:
  size_t slot(int32_t t) const {
    const size_t mask = keys_.size() - 1;
    size_t i = (static_cast<uint32_t>(t) * 2654435761u) & mask;  // Knuth's multiplicative hash
    while (keys_[i] != t && keys_[i] != -1) i = (i + 1) & mask;
    return i;
  }
  size_t slot(int32_t t) {
    const size_t i = static_cast<const TokenCounts*>(this)->slot(t);
    keys_[i] = t;
    return i;
  }
  std::vector<int32_t> keys_;  // [slots] token, -1: empty
  std::vector<int> counts_;    // [slots]
};

struct Proposal {
  std::vector<int32_t> drafts;
  double score = 0;
  int match = 0;
};

// One source: `at(pos)` its token at a position (-1: none there, or a boundary), the candidate
// positions holding the context's last token (latest first). Fills `best` when it beats it.
template <typename At>
void best_path(std::span<const int32_t> context, std::span<const int64_t> candidates, const At& at,
               const SpeculativeOptions& o, int max_drafts, Proposal& best) {
  const auto n = static_cast<int64_t>(context.size());
  const int depth = static_cast<int>(std::min<int64_t>(std::max(o.max_tree_depth, 1), n));
  // Each candidate's match length: how many of the context's last tokens end at it (<= depth).
  std::vector<int> len(candidates.size(), 0);  // [candidates]
  int longest = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const int64_t p = candidates[c];
    int l = 1;
    while (l < depth && at(p - l) >= 0 && at(p - l) == context[static_cast<size_t>(n - 1 - l)]) ++l;
    len[c] = l;
    longest = std::max(longest, l);
  }
  TokenCounts count;
  for (int m = 1; m <= longest; ++m) {
    const double by_factor = std::floor(static_cast<double>(o.max_spec_factor) * m + 1e-9);
    const int budget = static_cast<int>(std::min<double>(
        {static_cast<double>(o.num_tokens), by_factor, static_cast<double>(o.max_tree_depth - m),
         static_cast<double>(max_drafts)}));
    if (budget <= 0) continue;
    std::vector<int64_t> live;  // the occurrences still on the path, latest first
    for (size_t c = 0; c < candidates.size(); ++c)
      if (len[c] >= m) live.push_back(candidates[c]);
    Proposal p;
    p.match = m;
    double prob = 1.0;
    for (int k = 1; k <= budget && !live.empty(); ++k) {
      count.reset(live.size());
      int going_on = 0, pick_count = 0;
      for (int64_t q : live) {
        const int32_t t = at(q + k);
        if (t < 0) continue;
        ++going_on;
        pick_count = std::max(pick_count, count.add(t));
      }
      if (going_on == 0) break;
      int32_t pick = -1;  // of the most frequent, the one the latest occurrence continues with
      for (int64_t q : live)
        if (const int32_t t = at(q + k); t >= 0 && count.get(t) == pick_count) {
          pick = t;
          break;
        }
      prob *= static_cast<double>(pick_count) / going_on;
      if (prob < o.min_token_prob) break;
      p.drafts.push_back(pick);
      p.score += prob;
      std::erase_if(live, [&](int64_t q) { return at(q + k) != pick; });
    }
    if (!p.drafts.empty() && (p.score > best.score || (p.score == best.score && m > best.match))) best = std::move(p);
  }
}

// Appends the latest positions of `text` holding `t` (latest first) until `out` holds
// kMaxSuffixCandidates. A rare token's search reads the whole text (a trajectory: tens of
// thousands of tokens, once per pass), so it checks 64 tokens at a time for any hit, a loop the
// compiler vectorises, and looks at single tokens only in chunks that have one.
void latest_positions(std::span<const int32_t> text, int32_t t, std::vector<int64_t>& out) {
  constexpr int64_t kChunk = 64;
  int64_t end = static_cast<int64_t>(text.size());  // positions [0, end) are still to search
  while (end > 0 && out.size() < static_cast<size_t>(kMaxSuffixCandidates)) {
    const int64_t begin = std::max<int64_t>(end - kChunk, 0);
    if (end - begin == kChunk) {
      const int32_t* chunk = text.data() + begin;
      int hit = 0;
      for (int64_t i = 0; i < kChunk; ++i) hit |= chunk[i] == t;
      if (!hit) {
        end = begin;
        continue;
      }
    }
    for (int64_t p = end - 1; p >= begin && out.size() < static_cast<size_t>(kMaxSuffixCandidates); --p)
      if (text[static_cast<size_t>(p)] == t) out.push_back(p);
    end = begin;
  }
}

}  // namespace

// The corpus's side of a proposal, under its lock (a friend of SuffixCorpus).
struct SuffixSearch {
  static void run(SuffixCorpus& corpus, std::span<const int32_t> context, const SpeculativeOptions& o, int max_drafts,
                  Proposal& best) {
    std::lock_guard<std::mutex> lock(corpus.mu_);
    const auto it = corpus.where_.find(context.back());
    if (it == corpus.where_.end()) return;
    const int64_t live_from = corpus.base_ + corpus.dead_;
    std::vector<int64_t> cands;  // latest first
    for (auto p = it->second.rbegin(); p != it->second.rend() && *p >= live_from; ++p) {
      cands.push_back(*p);
      if (static_cast<int>(cands.size()) == kMaxSuffixCandidates) break;
    }
    const auto at = [&corpus, live_from](int64_t pos) -> int32_t {
      const int64_t end = corpus.base_ + static_cast<int64_t>(corpus.toks_.size());
      return pos < live_from || pos >= end ? -1 : corpus.toks_[static_cast<size_t>(pos - corpus.base_)];
    };
    best_path(context, cands, at, o, max_drafts, best);
  }
};

std::vector<int32_t> propose_suffix(std::span<const int32_t> context, const SpeculativeOptions& o, SuffixCorpus* corpus,
                                    int max_drafts) {
  const auto n = static_cast<int64_t>(context.size());
  if (max_drafts <= 0 || n < 1) return {};
  const int32_t last = context.back();
  // The corpus first: on a tie of score and match the text, searched second, must win; so the
  // corpus's proposal counts only when strictly better.
  Proposal from_corpus;
  if (corpus) SuffixSearch::run(*corpus, context, o, max_drafts, from_corpus);
  std::vector<int64_t> cands;  // latest first; an occurrence needs a token after it
  latest_positions(context.first(static_cast<size_t>(n - 1)), last, cands);
  const auto at = [context, n](int64_t pos) -> int32_t {
    return pos < 0 || pos >= n ? -1 : context[static_cast<size_t>(pos)];
  };
  Proposal from_text;
  best_path(context, cands, at, o, max_drafts, from_text);
  const bool corpus_wins = from_corpus.score > from_text.score ||
                           (from_corpus.score == from_text.score && from_corpus.match > from_text.match);
  return corpus_wins ? std::move(from_corpus.drafts) : std::move(from_text.drafts);
}

}  // namespace lragent
