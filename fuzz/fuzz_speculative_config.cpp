// libFuzzer target: arbitrary bytes as --speculative-config's JSON (engine/speculative.h). The
// parser must answer (options or an error naming the flag), never crash or throw; options it
// gives are within their limits. The proposer then runs on a context made of the same bytes and
// must keep within them: drafts are a slice of the context that follows an earlier match (the
// n-gram method), or tokens of the context and corpus within the bounds (the suffix method).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/speculative.h"
#include "engine/suffix_decoding.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "speculative config invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = lragent::parse_speculative_config(text);
  lragent::SpeculativeOptions o;
  if (!r.ok()) {
    check(r.error().message.rfind("--speculative-config: ", 0) == 0, "an error names the flag");
    o.num_tokens = 4;
    o.lookup_min = 1 + (size > 0 ? data[0] % 4 : 0);
    o.lookup_max = o.lookup_min + (size > 1 ? data[1] % 4 : 0);
  } else {
    o = *r;
    check(o.num_tokens >= 1 && o.num_tokens <= lragent::kMaxSpeculativeTokens, "num_speculative_tokens in range");
    check(o.lookup_min >= 1 && o.lookup_min <= o.lookup_max && o.lookup_max <= lragent::kMaxPromptLookup,
          "lookup bounds in range");
    check(o.disable_by_batch_size >= 0, "disable_by_batch_size in range");
  }
  // Tokens from the bytes (a small alphabet, so matches happen).
  std::vector<int32_t> ctx;
  for (size_t i = 0; i < size; ++i) ctx.push_back(data[i] % 7);
  if (o.method == lragent::SpeculativeMethod::kSuffix) {
    // The suffix proposer over the context and a corpus of its halves: drafts within the bounds,
    // each a token that occurs in them.
    lragent::SuffixCorpus corpus(std::max(o.max_cached_requests, 0));
    corpus.add(std::vector<int32_t>(ctx.begin(), ctx.begin() + static_cast<ptrdiff_t>(ctx.size() / 2)));
    corpus.add(std::vector<int32_t>(ctx.begin() + static_cast<ptrdiff_t>(ctx.size() / 2), ctx.end()));
    check(corpus.outputs() <= 2 && corpus.tokens() <= static_cast<int64_t>(ctx.size()), "the corpus keeps what it got");
    const auto drafts = lragent::propose_suffix(ctx, o, &corpus, o.num_tokens);
    check(static_cast<int>(drafts.size()) <= o.num_tokens, "at most num_tokens drafts");
    check(static_cast<int>(drafts.size()) < o.max_tree_depth, "match and drafts within the tree depth");
    for (int32_t t : drafts) check(std::find(ctx.begin(), ctx.end(), t) != ctx.end(), "drafts are tokens seen");
    return 0;
  }
  const auto drafts = lragent::propose_ngram(ctx, o, o.num_tokens);
  check(static_cast<int>(drafts.size()) <= o.num_tokens, "at most num_tokens drafts");
  check(drafts.empty() || ctx.size() >= 2, "drafts need an earlier occurrence");
  if (!drafts.empty()) {
    // Some end e < n - 1 matches the last lookup_min tokens, and the drafts are what follows e.
    const size_t n = ctx.size();
    bool found = false;
    for (size_t e = static_cast<size_t>(o.lookup_min) - 1; e + 1 < n && !found; ++e) {
      bool same = true;
      for (size_t i = 0; i < static_cast<size_t>(o.lookup_min) && same; ++i) same = ctx[e - i] == ctx[n - 1 - i];
      if (!same || e + 1 + drafts.size() > n) continue;
      found = std::equal(drafts.begin(), drafts.end(), ctx.begin() + static_cast<ptrdiff_t>(e + 1));
    }
    check(found, "the drafts follow an earlier match");
  }
  return 0;
}
