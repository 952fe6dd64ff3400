#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/suffix_decoding.h"

namespace lragent {
namespace {

constexpr const char* kWhere = "--speculative-config";

// An integer key's value within [lo, hi]; absent: `fallback`.
Result<int> int_key(const nlohmann::json& j, const char* key, int lo, int hi, int fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  // 4.0 is an integer to Python's config too; 4.5 is not.
  const bool integral = it->is_number_integer() || it->is_number_unsigned() ||
                        (it->is_number_float() && std::isfinite(it->get<double>()) &&
                         std::floor(it->get<double>()) == it->get<double>());
  if (!integral)
    return make_error(ErrorCode::kInvalidArgument, "{}: \"{}\" must be an integer, not {}", kWhere, key, it->dump());
  const double v = it->get<double>();
  if (v < lo || v > hi)
    return make_error(ErrorCode::kInvalidArgument, "{}: \"{}\" must be between {} and {}, not {}", kWhere, key, lo, hi,
                      it->dump());
  return static_cast<int>(v);
}

// A number key's value within [lo, hi]; absent: `fallback`.
Result<float> float_key(const nlohmann::json& j, const char* key, double lo, double hi, float fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number())
    return make_error(ErrorCode::kInvalidArgument, "{}: \"{}\" must be a number, not {}", kWhere, key, it->dump());
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    return make_error(ErrorCode::kInvalidArgument, "{}: \"{}\" must be between {} and {}, not {}", kWhere, key, lo, hi,
                      it->dump());
  return static_cast<float>(v);
}

constexpr const char* kNgramKeys[] = {"prompt_lookup_max", "prompt_lookup_min"};
constexpr const char* kSuffixKeys[] = {"suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                                       "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"};
template <size_t N>
bool one_of(const std::string& key, const char* const (&keys)[N]) {
  return std::find_if(std::begin(keys), std::end(keys), [&key](const char* k) { return key == k; }) != std::end(keys);
}

}  // namespace

Result<SpeculativeOptions> parse_speculative_config(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: not valid JSON; give an object such as "
                      "'{{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}}'",
                      kWhere);
  if (!j.is_object())
    return make_error(ErrorCode::kInvalidArgument, "{}: must be a JSON object, not {}", kWhere, j.type_name());
  const bool bounds = j.contains("prompt_lookup_max") || j.contains("prompt_lookup_min");
  std::string method;
  if (const auto m = j.find("method"); m != j.end() && !m->is_null()) {
    if (!m->is_string())
      return make_error(ErrorCode::kInvalidArgument, "{}: \"method\" must be a string, not {}", kWhere, m->dump());
    method = m->get<std::string>();
    if (method != "ngram" && method != "suffix")
      return make_error(ErrorCode::kUnsupported,
                        "{}: method \"{}\" is not supported; lragent speculates by n-gram lookup "
                        "(\"method\": \"ngram\") or suffix matching (\"method\": \"suffix\"): neither needs a "
                        "draft model",
                        kWhere, method);
  } else if (bounds) {
    method = "ngram";
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: say \"method\": \"ngram\" or \"suffix\" (or give prompt_lookup_max / prompt_lookup_min)",
                      kWhere);
  }
  const bool suffix = method == "suffix";
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "method" || key == "num_speculative_tokens" || key == "disable_by_batch_size") continue;
    if (suffix ? one_of(key, kSuffixKeys) : one_of(key, kNgramKeys)) continue;
    if (suffix ? one_of(key, kNgramKeys) : one_of(key, kSuffixKeys))
      return make_error(ErrorCode::kInvalidArgument, "{}: \"{}\" is a key of the {} method, not of \"{}\"", kWhere,
                        key, suffix ? "ngram" : "suffix", method);
    return make_error(ErrorCode::kInvalidArgument, "{}: unknown key \"{}\" (the {} method takes {})", kWhere, key,
                      method,
                      suffix ? "method, num_speculative_tokens, suffix_decoding_max_tree_depth, "
                               "suffix_decoding_max_cached_requests, suffix_decoding_max_spec_factor, "
                               "suffix_decoding_min_token_prob and disable_by_batch_size"
                             : "method, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min and "
                               "disable_by_batch_size");
  }
  SpeculativeOptions o;
  LRA_ASSIGN_OR_RETURN(o.disable_by_batch_size, int_key(j, "disable_by_batch_size", 1, 1 << 20, 0));
  if (suffix) {
    // vLLM's defaults; num_speculative_tokens is the most a pass drafts (its default 32).
    o.method = SpeculativeMethod::kSuffix;
    LRA_ASSIGN_OR_RETURN(o.num_tokens, int_key(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens, 32));
    LRA_ASSIGN_OR_RETURN(o.max_tree_depth, int_key(j, "suffix_decoding_max_tree_depth", 2, kMaxSuffixTreeDepth, 24));
    LRA_ASSIGN_OR_RETURN(o.max_cached_requests,
                         int_key(j, "suffix_decoding_max_cached_requests", 0, 1 << 24, 10000));
    LRA_ASSIGN_OR_RETURN(o.max_spec_factor, float_key(j, "suffix_decoding_max_spec_factor", 0.0, 1e6, 1.f));
    LRA_ASSIGN_OR_RETURN(o.min_token_prob, float_key(j, "suffix_decoding_min_token_prob", 0.0, 1.0, 0.1f));
    return o;
  }
  if (!j.contains("num_speculative_tokens") || j["num_speculative_tokens"].is_null())
    return make_error(ErrorCode::kInvalidArgument, "{}: \"num_speculative_tokens\" is required (e.g. 4)", kWhere);
  LRA_ASSIGN_OR_RETURN(o.num_tokens, int_key(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens, 0));
  LRA_ASSIGN_OR_RETURN(const int max_n, int_key(j, "prompt_lookup_max", 1, kMaxPromptLookup, 0));
  LRA_ASSIGN_OR_RETURN(const int min_n, int_key(j, "prompt_lookup_min", 1, kMaxPromptLookup, 0));
  // vLLM's defaults: one bound given sets the other; neither, both 5.
  o.lookup_max = max_n > 0 ? max_n : (min_n > 0 ? min_n : 5);
  o.lookup_min = min_n > 0 ? min_n : (max_n > 0 ? max_n : 5);
  if (o.lookup_min > o.lookup_max)
    return make_error(ErrorCode::kInvalidArgument, "{}: prompt_lookup_min ({}) must not exceed prompt_lookup_max ({})",
                      kWhere, o.lookup_min, o.lookup_max);
  return o;
}

void to_json(nlohmann::json& j, const DraftCounts& d) {
  j = {{"draft_passes", d.passes}, {"draft_tokens", d.drafted}, {"accepted_tokens", d.accepted}};
}

std::vector<int32_t> propose_ngram(std::span<const int32_t> context, const SpeculativeOptions& opts, int max_drafts) {
  const auto n = static_cast<int64_t>(context.size());
  const int lo = std::max(opts.lookup_min, 1);
  const int hi = std::max(opts.lookup_max, lo);
  if (max_drafts <= 0 || n < lo + 1) return {};
  // An occurrence ending at position e (< n - 1) matches the suffix over `len` tokens when
  // context[e - i] == context[n - 1 - i] for i < len. The latest occurrence of the longest match
  // wins: scanning e downwards, a longer match replaces the best, an equal one does not.
  int64_t best_end = -1;
  int best_len = 0;
  const int32_t last = context[static_cast<size_t>(n - 1)];
  for (int64_t e = n - 2; e >= lo - 1; --e) {
    if (context[static_cast<size_t>(e)] != last) continue;
    int len = 1;
    const int cap = static_cast<int>(std::min<int64_t>(hi, e + 1));
    while (len < cap && context[static_cast<size_t>(e - len)] == context[static_cast<size_t>(n - 1 - len)]) ++len;
    if (len >= lo && len > best_len) {
      best_len = len;
      best_end = e;
      if (len == hi) break;  // nothing longer is looked for
    }
  }
  if (best_end < 0) return {};
  const int64_t from = best_end + 1;
  const int64_t to = std::min<int64_t>(n, from + max_drafts);
  return {context.begin() + from, context.begin() + to};
}

std::vector<int32_t> propose_drafts(std::span<const int32_t> context, const SpeculativeOptions& opts, int max_drafts) {
  return opts.method == SpeculativeMethod::kSuffix ? propose_suffix(context, opts, opts.corpus, max_drafts)
                                                   : propose_ngram(context, opts, max_drafts);
}

void remember_output(const SpeculativeOptions& opts, std::span<const int32_t> tokens) {
  if (opts.method == SpeculativeMethod::kSuffix && opts.corpus) opts.corpus->add(tokens);
}

}  // namespace lragent
