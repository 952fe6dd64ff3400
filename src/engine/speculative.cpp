#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

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
  static constexpr const char* kKeys[] = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                                          "disable_by_batch_size"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&key](const char* k) { return key == k; }) == std::end(kKeys))
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: unknown key \"{}\" (the ngram method takes method, num_speculative_tokens, "
                        "prompt_lookup_max, prompt_lookup_min and disable_by_batch_size)",
                        kWhere, key);
  }
  const bool bounds = j.contains("prompt_lookup_max") || j.contains("prompt_lookup_min");
  if (const auto m = j.find("method"); m != j.end() && !m->is_null()) {
    if (!m->is_string())
      return make_error(ErrorCode::kInvalidArgument, "{}: \"method\" must be a string, not {}", kWhere, m->dump());
    if (m->get<std::string>() != "ngram")
      return make_error(ErrorCode::kUnsupported,
                        "{}: method \"{}\" is not supported; lragent speculates by n-gram lookup only "
                        "(\"method\": \"ngram\"): it needs no draft model",
                        kWhere, m->get<std::string>());
  } else if (!bounds) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: say \"method\": \"ngram\" (or give prompt_lookup_max / prompt_lookup_min)", kWhere);
  }
  if (!j.contains("num_speculative_tokens") || j["num_speculative_tokens"].is_null())
    return make_error(ErrorCode::kInvalidArgument, "{}: \"num_speculative_tokens\" is required (e.g. 4)", kWhere);
  SpeculativeOptions o;
  LRA_ASSIGN_OR_RETURN(o.num_tokens, int_key(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens, 0));
  LRA_ASSIGN_OR_RETURN(const int max_n, int_key(j, "prompt_lookup_max", 1, kMaxPromptLookup, 0));
  LRA_ASSIGN_OR_RETURN(const int min_n, int_key(j, "prompt_lookup_min", 1, kMaxPromptLookup, 0));
  LRA_ASSIGN_OR_RETURN(o.disable_by_batch_size, int_key(j, "disable_by_batch_size", 1, 1 << 20, 0));
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

}  // namespace lragent
