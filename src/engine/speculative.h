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

class SuffixCorpus;

// Where drafts come from: "ngram" (the latest earlier occurrence of the text's suffix, below) or
// "suffix" (the likeliest continuation over every occurrence, in the text and in a corpus of
// earlier outputs: engine/suffix_decoding.h).
enum class SpeculativeMethod { kNgram, kSuffix };

struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::kNgram;
  int num_tokens = 0;   // drafts per pass (vLLM's num_speculative_tokens; suffix: the most); 0: off
  int lookup_min = 5;   // ngram: shortest suffix matched (prompt_lookup_min)
  int lookup_max = 5;   // ngram: longest suffix matched (prompt_lookup_max)
  // suffix (vLLM's suffix_decoding_* keys, its defaults): the longest match plus drafts; the
  // corpus's outputs at most (0: the text only); drafts per matched token; the least estimated
  // probability a draft may have.
  int max_tree_depth = 24;
  int max_cached_requests = 10000;
  float max_spec_factor = 1.f;
  float min_token_prob = 0.1f;
  // suffix: the corpus finished outputs go to and are searched in; not owned, null: the text
  // only. Who runs the steps owns it (the server's session pool, the Generator, a CLI command).
  SuffixCorpus* corpus = nullptr;
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
inline constexpr int kMaxSuffixTreeDepth = 1024;

// vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": N,
// "prompt_lookup_max": M, "prompt_lookup_min": m, "disable_by_batch_size": B}. num_speculative_tokens is required; given one
// of the lookup bounds, the other takes its value, given neither both are 5 (vLLM's defaults).
// "method" may be left out when the lookup bounds are given. Or {"method": "suffix",
// "num_speculative_tokens": N (default 32), "suffix_decoding_max_tree_depth": D (24),
// "suffix_decoding_max_cached_requests": R (10000), "suffix_decoding_max_spec_factor": F (1.0),
// "suffix_decoding_min_token_prob": P (0.1), "disable_by_batch_size": B}. Errors name the key:
// another method (a draft model, EAGLE, ...), a key vLLM's config lacks or the method does not
// use, a value of the wrong type or out of range, JSON that is not an object.
Result<SpeculativeOptions> parse_speculative_config(std::string_view json);

// The drafts for the text `context` (token ids, its last token the latest): the longest suffix of
// between opts.lookup_min and opts.lookup_max tokens that also occurs earlier in the context, at
// its latest such occurrence, and the up to `max_drafts` tokens that followed it there. Empty when
// no such suffix occurs (or max_drafts <= 0). Cost: one backward scan of the context, each
// position compared over at most lookup_max tokens.
std::vector<int32_t> propose_ngram(std::span<const int32_t> context, const SpeculativeOptions& opts, int max_drafts);

// The drafts of opts.method: propose_ngram, or propose_suffix (engine/suffix_decoding.h) with
// opts.corpus.
std::vector<int32_t> propose_drafts(std::span<const int32_t> context, const SpeculativeOptions& opts, int max_drafts);

// A finished output, for opts.corpus (method suffix; otherwise nothing is kept).
void remember_output(const SpeculativeOptions& opts, std::span<const int32_t> tokens);

}  // namespace lragent
