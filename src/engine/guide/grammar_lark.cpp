// Lark's grammar syntax -> GBNF (grammar.h): a line-by-line rewrite, as vLLM's
// convert_lark_to_ebnf rewrites it, with Lark's own meaning for [x] (optional) and its ranges,
// repetitions and aliases spelled out instead of passed through.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engine/guide/grammar.h"
#include "engine/guide/utf8_ranges.h"

namespace lragent::guide {
namespace {

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// The line without its comment (# or // to the end, outside quotes) and surrounding blanks.
std::string_view strip_comment(std::string_view line) {
  char quote = 0;
  size_t end = line.size();
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' || (c == '/' && i + 1 < line.size() && line[i + 1] == '/')) {
      end = i;
      break;
    }
  }
  line = line.substr(0, end);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())) != 0) line.remove_prefix(1);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())) != 0) line.remove_suffix(1);
  return line;
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t nl = text.find('\n', at);
    out.push_back(text.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at));
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  return out;
}

class LarkLine {
 public:
  LarkLine(std::string_view s, size_t line) : s_(s), line_(line) {}

  // One rule body (or the part of it after a '|') as GBNF.
  Result<std::string> convert() {
    std::string out;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '"' || c == '\'') {
        LRA_RETURN_IF_ERROR(literal(out));
      } else if (c == '/') {
        return unsupported("regular expressions (/.../) are not supported: spell the terminal with literals, "
                           "ranges (\"a\"..\"z\") and repetition");
      } else if (c == '[') {
        out += '(';
        ++i_;
      } else if (c == ']') {
        out += ")?";
        ++i_;
      } else if (c == '-' && i_ + 1 < s_.size() && s_[i_ + 1] == '>') {  // -> alias: names a tree node
        i_ += 2;
        skip_space();
        while (i_ < s_.size() && name_char(s_[i_])) ++i_;
      } else if (c == '~') {
        ++i_;
        LRA_ASSIGN_OR_RETURN(const int lo, number());
        int hi = lo;
        skip_space();
        if (s_.substr(i_, 2) == "..") {
          i_ += 2;
          LRA_ASSIGN_OR_RETURN(hi, number());
        }
        out += hi == lo ? fmt::format("{{{}}}", lo) : fmt::format("{{{},{}}}", lo, hi);
      } else if (c == '%') {
        return unsupported("directives (%import, %ignore, ...) are not supported: write the rules out");
      } else {
        out += c;
        ++i_;
      }
    }
    while (!out.empty() && (out.front() == ' ' || out.front() == '\t')) out.erase(out.begin());
    while (!out.empty() && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
    return out;
  }

  Error bad(std::string_view what) const {
    return make_error(ErrorCode::kInvalidArgument, "Lark grammar, line {}: {}", line_, what);
  }
  Error unsupported(std::string_view what) const {
    return make_error(ErrorCode::kUnsupported, "Lark grammar, line {}: {}", line_, what);
  }

 private:
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  Result<int> number() {
    skip_space();
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return bad("'~' wants a count: x ~ 3 or x ~ 2..5");
    int v = 0;
    for (; i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])); ++i_)
      v = std::min(v * 10 + (s_[i_] - '0'), Grammar::kMaxRepeat + 1);  // Grammar::parse refuses one above its cap
    return v;
  }

  // A quoted literal's characters as GBNF writes them inside "..." (a ' needs no escape there,
  // a " does).
  Result<std::string> quoted() {
    const char q = s_[i_++];
    std::string out;
    while (true) {
      if (i_ >= s_.size()) return bad("unterminated string literal");
      const char c = s_[i_];
      if (c == q) break;
      if (c == '\\' && i_ + 1 < s_.size()) {
        if (s_[i_ + 1] == '\'') out += '\'';
        else out.append(s_.substr(i_, 2));
        i_ += 2;
        continue;
      }
      if (c == '"') out += '\\';
      out += c;
      ++i_;
    }
    ++i_;
    if (i_ < s_.size() && name_start(s_[i_]))
      return unsupported(fmt::format("literal flags (\"...\"{}) are not supported", s_[i_]));
    return out;
  }

  // A literal, or "a".."z" (a range of characters: each end one character or one escape).
  Status literal(std::string& out) {
    LRA_ASSIGN_OR_RETURN(std::string lo, quoted());
    const size_t save = i_;
    skip_space();
    if (s_.substr(i_, 2) == ".." && i_ + 2 < s_.size()) {
      i_ += 2;
      skip_space();
      if (i_ < s_.size() && (s_[i_] == '"' || s_[i_] == '\'')) {
        LRA_ASSIGN_OR_RETURN(std::string hi, quoted());
        auto one = [](const std::string& t) {
          uint32_t cp = 0;
          return (!t.empty() && t[0] == '\\') || (!t.empty() && static_cast<size_t>(utf8_char(t, 0, &cp)) == t.size());
        };
        if (!one(lo) || !one(hi)) return bad("a range \"a\"..\"z\" wants one character at each end");
        auto in_class = [](std::string t) {  // a class's own metacharacters escaped
          if (t == "]" || t == "-" || t == "^") t.insert(t.begin(), '\\');
          if (t == "\\\"") t = "\"";
          return t;
        };
        out += "[" + in_class(lo) + "-" + in_class(hi) + "]";
        return Status::Ok();
      }
      return bad("'..' wants a literal after it: \"a\"..\"z\"");
    }
    i_ = save;
    out += "\"" + lo + "\"";
    return Status::Ok();
  }

  std::string_view s_;
  size_t line_;
  size_t i_ = 0;
};

}  // namespace

bool looks_like_lark(std::string_view text) {
  bool any = false;
  for (std::string_view line : lines_of(text)) {
    line = strip_comment(line);
    if (line.find("::=") != std::string_view::npos) return false;
    any = any || !line.empty();
  }
  return any;
}

Result<std::string> lark_to_gbnf(std::string_view lark, std::string* root) {
  struct Rule {
    std::string name;
    std::vector<std::string> alts;
  };
  std::vector<Rule> rules;
  size_t n = 0;
  for (std::string_view raw : lines_of(lark)) {
    ++n;
    const std::string_view s = strip_comment(raw);
    if (s.empty()) continue;
    LarkLine whole(s, n);
    if (s[0] == '%') return whole.unsupported("directives (%import, %ignore, ...) are not supported: write the rules out");
    if (s[0] == '|') {
      if (rules.empty()) return whole.bad("an alternative '|' before any rule");
      LarkLine body(s.substr(1), n);
      LRA_ASSIGN_OR_RETURN(std::string alt, body.convert());
      rules.back().alts.push_back(std::move(alt));
      continue;
    }
    size_t i = (s[0] == '?' || s[0] == '!') ? 1 : 0;
    const size_t name_at = i;
    if (i >= s.size() || !name_start(s[i])) return whole.bad("expected a rule (name: ...) or an alternative (| ...)");
    while (i < s.size() && name_char(s[i])) ++i;
    const std::string name(s.substr(name_at, i - name_at));
    if (i < s.size() && s[i] == '.') {  // a priority: name.2
      ++i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    }
    if (i < s.size() && s[i] == '{') return whole.unsupported("templates (name{args}) are not supported");
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    if (i >= s.size() || s[i] != ':')
      return whole.bad(fmt::format("expected ':' after the rule name '{}' (a rule continues on a line starting with '|')",
                                   name));
    for (const Rule& r : rules)
      if (r.name == name) return whole.bad(fmt::format("rule '{}' is defined twice", name));
    LarkLine body(s.substr(i + 1), n);
    LRA_ASSIGN_OR_RETURN(std::string alt, body.convert());
    rules.push_back(Rule{name, {std::move(alt)}});
  }
  if (rules.empty()) return make_error(ErrorCode::kInvalidArgument, "Lark grammar: no rules (want `start: ...`)");
  *root = rules.front().name;
  for (const Rule& r : rules)
    if (r.name == "start") *root = "start";
  std::string out;
  for (const Rule& r : rules) {
    out += r.name + " ::=";
    for (size_t k = 0; k < r.alts.size(); ++k) out += (k ? " | " : " ") + r.alts[k];
    out += "\n";
  }
  return out;
}

}  // namespace lragent::guide
