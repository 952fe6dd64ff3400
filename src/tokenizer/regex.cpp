#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <new>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace lragent {

namespace {

// Oniguruma's Unicode \w: letters, marks, decimal digits, connector punctuation.
constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

// Rewrites the escapes whose Oniguruma meaning differs from PCRE2's (see Regex). Inside a
// character class only positive forms can be spliced in; a negated one there is unsupported.
// Oniguruma also nests classes: a nested positive class is a union, flattened here (BLOOM's
// `[^(\s|[.,!?…])]`); a negated nested class and class intersection (&&) are refused.
Result<std::string> to_pcre2(std::string_view p, std::string_view where) {
  std::string out;
  out.reserve(p.size() + 16);
  int depth = 0;           // character classes open at i (0: outside any)
  size_t class_start = 0;  // index in `p` just after '[' or '[^' of the innermost open class
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    const bool in_class = depth > 0;
    if (c != '\\' || i + 1 == p.size()) {
      if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {
        // A POSIX class ([:alpha:]) is the same in both: copied whole.
        const size_t end = p.find(":]", i + 2);
        if (end == std::string_view::npos) return tokjson::corrupt(where, "regex has an unterminated [: class");
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
      if (c == '[' && in_class) {
        if (i + 1 < p.size() && p[i + 1] == '^')
          return tokjson::unsupported(where, "regex with a negated character class nested in another");
        ++depth;  // a union: its members join the enclosing class
        class_start = i + 1;
        continue;
      }
      if (c == '&' && in_class && i + 1 < p.size() && p[i + 1] == '&')
        return tokjson::unsupported(where, "regex character class intersection (&&)");
      if (c == '[') {
        depth = 1;
        class_start = i + 1 + (i + 1 < p.size() && p[i + 1] == '^');
      } else if (c == ']' && in_class && i != class_start) {
        if (--depth > 0) continue;  // a nested class's end: dropped with its start
      }
      out.push_back(c);
      continue;
    }
    const char e = p[++i];
    switch (e) {
      case 's':
        out += "\\p{White_Space}";
        break;
      case 'S':
        out += "\\P{White_Space}";
        break;
      case 'w':
        out += in_class ? std::string(kWordClass) : fmt::format("[{}]", kWordClass);
        break;
      case 'h':
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
        break;
      case 'W':
      case 'H':
        if (in_class) {
          return tokjson::unsupported(where, fmt::format("regex escape \\{} inside a character class", e));
        }
        out += e == 'W' ? fmt::format("[^{}]", kWordClass) : std::string("[^0-9a-fA-F]");
        break;
      case 'u':
        // Ruby's \uHHHH; PCRE2 spells it \x{HHHH}.
        if (i + 4 < p.size() &&
            p.substr(i + 1, 4).find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos) {
          out += fmt::format("\\x{{{}}}", p.substr(i + 1, 4));
          i += 4;
          break;
        }
        return tokjson::corrupt(where, "regex escape \\u needs four hex digits");
      default: {
        // Copy the escaped character whole (it may be multi-byte UTF-8).
        out.push_back('\\');
        const size_t len = unicode::utf8_length(static_cast<unsigned char>(e));
        out.append(p.substr(i, len));
        i += len - 1;
      }
    }
  }
  return out;
}

}  // namespace

void Regex::CodeFree::operator()(pcre2_real_code_8* code) const { pcre2_code_free(code); }

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern, std::string_view where) {
  if (!unicode::is_valid_utf8(pattern)) return tokjson::corrupt(where, "regex is not valid UTF-8");
  LRA_ASSIGN_OR_RETURN(const std::string translated, to_pcre2(pattern, where));
  int err = 0;
  PCRE2_SIZE offset = 0;
  // Oniguruma's ^ and $ are line anchors (Ruby's): PCRE2's multiline mode.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return tokjson::corrupt(where, fmt::format("bad regex \"{}\": {} (at offset {} of the PCRE2 form)", pattern,
                                               reinterpret_cast<const char*>(msg), offset));
  }
  // JIT is only a speed-up; without it pcre2_match interprets the same pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code, std::string(where)));
}

Status Regex::find_all(std::string_view s, std::vector<Span>& out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_.get(), nullptr);
  if (!md) throw std::bad_alloc();  // PCRE2's malloc failed: as operator new would
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  size_t last_end = std::string_view::npos;  // end of the previous match kept
  while (pos <= s.size()) {
    // Subjects are valid UTF-8 by construction (encode() sanitises its input), so skip the
    // per-call check that would make repeated matching quadratic.
    int rc = pcre2_match(code_.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // The JIT's fixed stack can run out on huge inputs; the interpreter uses the heap.
      rc = pcre2_match(code_.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;  // the caller keeps the rest of `s` as one unmatched piece
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: the regex gave up on this text, searching from byte {} of a {}-byte piece ({}); "
                        "the text is pathological for the pattern: split it or shorten its repeated runs",
                        where_, pos, s.size(), reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    // As Oniguruma's match iterator (rust-onig's FindMatches): an empty match where the previous
    // match ended is skipped, not kept.
    if (ov[0] == ov[1] && ov[1] == last_end) {
      if (ov[1] >= s.size()) break;
      pos = ov[1] + unicode::utf8_length(static_cast<unsigned char>(s[ov[1]]));
      continue;
    }
    out.push_back({ov[0], ov[1]});
    last_end = ov[1];
    if (ov[1] > ov[0]) {
      pos = ov[1];
    } else if (ov[1] < s.size()) {
      pos = ov[1] + unicode::utf8_length(static_cast<unsigned char>(s[ov[1]]));
    } else {
      break;
    }
  }
  pcre2_match_data_free(md);
  return Status::Ok();
}

bool Regex::search(std::string_view s) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_.get(), nullptr);
  if (!md) throw std::bad_alloc();  // PCRE2's malloc failed: as operator new would
  const int rc =
      pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, PCRE2_NO_UTF_CHECK, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

Result<Pattern> Pattern::from_json(const nlohmann::json& j, std::string_view where) {
  LRA_RETURN_IF_ERROR(tokjson::expect_object(j, where));
  Pattern p;
  if (const auto* lit = tokjson::find(j, "String")) {
    if (!lit->is_string()) return tokjson::corrupt(tokjson::member(where, "String"), "expected a string");
    p.literal_ = lit->get<std::string>();
    return p;
  }
  if (const auto* re = tokjson::find(j, "Regex")) {
    if (!re->is_string()) return tokjson::corrupt(tokjson::member(where, "Regex"), "expected a string");
    LRA_ASSIGN_OR_RETURN(p.regex_, Regex::compile(re->get<std::string>(), tokjson::member(where, "Regex")));
    return p;
  }
  return tokjson::corrupt(where, "pattern needs a \"String\" or \"Regex\" member");
}

Status Pattern::find_matches(std::string_view s, std::vector<std::pair<Span, bool>>& out) const {
  out.clear();
  if (s.empty()) {
    out.push_back({{0, 0}, false});
    return Status::Ok();
  }
  std::vector<Span> matches;
  if (regex_) {
    LRA_RETURN_IF_ERROR(regex_->find_all(s, matches));
  } else if (!literal_.empty()) {
    for (size_t pos = s.find(literal_); pos != std::string_view::npos; pos = s.find(literal_, pos + literal_.size())) {
      matches.push_back({pos, pos + literal_.size()});
    }
  }
  size_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.begin) out.push_back({{prev, m.begin}, false});
    out.push_back({m, true});
    prev = m.end;
  }
  if (prev != s.size()) out.push_back({{prev, s.size()}, false});
  return Status::Ok();
}

}  // namespace lragent
