// Patterns from tokenizer.json: literal strings and Oniguruma-syntax regexes run with PCRE2.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

struct pcre2_real_code_8;

namespace lragent {

struct Span {
  size_t begin = 0;
  size_t end = 0;
};

// A compiled regex. HF compiles patterns with Oniguruma (Ruby syntax, Unicode classes); PCRE2
// with UTF+UCP agrees except for a few escapes, which compile() rewrites (\s, \S, \w, \W, \h, \H,
// \uHHHH) so that e.g. \s is exactly Unicode White_Space as in Oniguruma.
class Regex {
 public:
  // `where` prefixes error messages (file and JSON path).
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern, std::string_view where);

  // Appends the leftmost non-overlapping matches in `s` (valid UTF-8), in order. An empty match
  // advances the search by one character, as Oniguruma's find_iter does. Fails (kInvalidArgument)
  // when PCRE2 gives up on the text (match, depth or heap limit) even without its JIT: the
  // matches after that point are unknown, and splitting the rest as one piece would give other
  // ids than HF's, silently.
  Status find_all(std::string_view s, std::vector<Span>& out) const;
  // Whether the regex matches somewhere in `s` (valid UTF-8). Only for patterns and subjects whose
  // size bounds the work (the added vocabulary's one-character class test): a PCRE2 limit error
  // counts as no match.
  bool search(std::string_view s) const;

 private:
  struct CodeFree {
    void operator()(pcre2_real_code_8* code) const;
  };
  Regex(pcre2_real_code_8* code, std::string where) : code_(code), where_(std::move(where)) {}
  std::unique_ptr<pcre2_real_code_8, CodeFree> code_;
  std::string where_;  // file and JSON path of the pattern, for errors
};

// HF's SplitPattern / ReplacePattern: {"String": literal} or {"Regex": pattern}.
class Pattern {
 public:
  static Result<Pattern> from_json(const nlohmann::json& j, std::string_view where);

  // Splits all of `s` into consecutive pieces, each flagged as a match or the text in between
  // (HF's Pattern::find_matches); `s` empty gives one empty non-match. Fails as Regex::find_all.
  // out: [k] pieces covering s in order.
  Status find_matches(std::string_view s, std::vector<std::pair<Span, bool>>& out) const;

 private:
  std::string literal_;  // used when regex_ is null
  std::unique_ptr<Regex> regex_;
};

}  // namespace lragent
