// Speculative decoding by n-gram lookup (vLLM's "ngram" method, also called prompt lookup): the
// tokens that followed the latest earlier occurrence of the text's last few tokens are proposed as
// the next ones, and one forward pass over the last token and those drafts checks them all: every
// draft the model would have picked itself is kept, and the pass's row after the last kept one
// gives one more token. Greedy picks are thus exactly those of decoding one token per pass, while
// a pass yields up to 1 + num_tokens of them. Sampled rows are picked each with the draw one token
// a pass would give it: a draft is then kept with the probability the model gives it, which is
// speculative sampling's rejection rule for a one-hot draft, and the tokens are those a seed gives
// without drafts. Agents copy a lot (names and numbers from a tool's
// observation into the next action), which is what this finds.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"

namespace lragent {

struct SpeculativeOptions {
  int num_tokens = 0;   // drafts per pass (vLLM's num_speculative_tokens); 0: off
  int lookup_min = 5;   // shortest suffix matched (prompt_lookup_min)
  int lookup_max = 5;   // longest suffix matched (prompt_lookup_max)
  // vLLM's disable_by_batch_size: a pass that decodes more sequences than this checks no drafts
  // (a batch is no longer bound by reading the weights, and drafts that fail cost compute). 0: never.
  int disable_by_batch_size = 0;
  bool on() const { return num_tokens > 0; }
};

// What speculation did in a step (or a request, a server's model): passes that checked drafts,
// the drafts they checked, and those kept (each a token got without a pass of its own).
struct DraftCounts {
  int64_t passes = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  DraftCounts& operator+=(const DraftCounts& o) {
    passes += o.passes;
    drafted += o.drafted;
    accepted += o.accepted;
    return *this;
  }
};

// {"draft_passes", "draft_tokens", "accepted_tokens"}: how the CLI's JSON and a served choice's
// `lragent.speculative` report them (nlohmann's to_json: `j["speculative"] = counts`).
void to_json(nlohmann::json& j, const DraftCounts& d);

// Limits of the options (a draft costs a row of the verifying pass whether kept or not).
inline constexpr int kMaxSpeculativeTokens = 32;
inline constexpr int kMaxPromptLookup = 64;

// vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": N,
// "prompt_lookup_max": M, "prompt_lookup_min": m, "disable_by_batch_size": B}. num_speculative_tokens is required; given one
// of the lookup bounds, the other takes its value, given neither both are 5 (vLLM's defaults).
// "method" may be left out when the lookup bounds are given. Errors name the key: another method
// (a draft model, EAGLE, ...), a key vLLM's config lacks or this engine does not use, a value of
// the wrong type or out of range, JSON that is not an object.
Result<SpeculativeOptions> parse_speculative_config(std::string_view json);

// The drafts for the text `context` (token ids, its last token the latest): the longest suffix of
// between opts.lookup_min and opts.lookup_max tokens that also occurs earlier in the context, at
// its latest such occurrence, and the up to `max_drafts` tokens that followed it there. Empty when
// no such suffix occurs (or max_drafts <= 0). Cost: one backward scan of the context, each
// position compared over at most lookup_max tokens.
std::vector<int32_t> propose_ngram(std::span<const int32_t> context, const SpeculativeOptions& opts, int max_drafts);

}  // namespace lragent
