#include "engine/guide/json_regex.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

namespace lragent::guide {
namespace {

using ojson = nlohmann::ordered_json;
// A sub-language: its regex, or nullopt when no value is in it (a `false` schema, a recursion cut
// off at max_depth, an enum whose values all have other types). Callers drop such branches.
using Lang = std::optional<std::string>;

constexpr size_t kMaxRegexBytes = size_t{1} << 20;
// ByteDfa's largest count in {m,n}; counts written out past it would pass its NFA cap anyway.
constexpr uint64_t kMaxCount = 1000;
// Bound the work on schemas nested absurdly deep (the compiler recurses with the schema) and on
// ones that expand into many branches that all come out empty (which the size check cannot see).
constexpr int kMaxNesting = 256;
constexpr size_t kMaxCalls = size_t{1} << 20;

// One character of a JSON string: raw (not ", \ or a control character) or an escape.
constexpr std::string_view kChar = R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}))";
// The same without \u escapes of surrogates: a counted character must be one character, and a
// surrogate pair would count twice.
constexpr std::string_view kCountedChar =
    R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))";
constexpr std::string_view kNat = "(?:0|[1-9][0-9]*)";
constexpr std::string_view kFracExp = R"((?:\.[0-9]+)?(?:[eE][+\-]?[0-9]+)?)";
// What a raw JSON string cannot hold; a `pattern`'s negated classes exclude it as well.
constexpr std::string_view kNotRaw = R"("\\\x00-\x1f)";
// A pattern's `.`: ECMAScript's any character but a line terminator (\n and \r are controls, U+2028
// and U+2029 written as UTF-8), less kNotRaw.
constexpr std::string_view kDot = R"([^"\\\x00-\x1f)"
                                  "\xe2\x80\xa8\xe2\x80\xa9]";

// Years 0001-9999 (year 0 is no date to Python or RFC 3339), the days of each month, and
// February 29 of the leap years only.
constexpr std::string_view kDate =
    "(?:(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|"
    "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|"
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29)";
constexpr std::string_view kTime =
    R"((?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+\-](?:[01][0-9]|2[0-3]):[0-5][0-9]))";
constexpr std::string_view kUuid = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
// Dot-atoms within the lengths validators check (local part <= 64 characters, labels <= 63).
constexpr std::string_view kEmail = R"([A-Za-z0-9_+\-]{1,32}(?:\.[A-Za-z0-9_+\-]{1,31})?@)"
                                    R"((?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,24})";

enum TypeBit : unsigned { kNull = 1, kBool = 2, kInt = 4, kNum = 8, kStr = 16, kObj = 32, kArr = 64 };

std::string group(std::string_view s) { return "(?:" + std::string(s) + ")"; }

// One atom matching any of `alts`; none when there is no alternative.
Lang alternation(std::vector<std::string> alts) {
  std::vector<std::string> seen;
  for (auto& a : alts)
    if (std::find(seen.begin(), seen.end(), a) == seen.end()) seen.push_back(std::move(a));
  if (seen.size() <= 1) return seen.empty() ? Lang() : Lang(seen[0]);
  std::string out = "(?:";
  for (size_t i = 0; i < seen.size(); ++i) out += (i ? "|" : "") + seen[i];
  return out + ")";
}

// `atom` repeated lo..hi times (hi < 0: unbounded); "" for none.
std::string repeat(std::string_view atom, uint64_t lo, int64_t hi) {
  if (hi == 0) return "";
  if (lo == 1 && hi == 1) return std::string(atom);
  if (hi < 0) return group(atom) + (lo == 0 ? "*" : lo == 1 ? "+" : fmt::format("{{{},}}", lo));
  if (lo == 0 && hi == 1) return group(atom) + "?";
  return group(atom) + (lo == static_cast<uint64_t>(hi) ? fmt::format("{{{}}}", lo) : fmt::format("{{{},{}}}", lo, hi));
}

// An array: the `first` elements, then `rest` lo..hi times (hi < 0: unbounded).
std::string list_regex(const std::vector<std::string>& first, const Lang& rest, uint64_t lo, int64_t hi,
                       const std::string& ws) {
  const std::string sep = "," + ws;
  std::string out = "\\[";
  for (size_t i = 0; i < first.size(); ++i) out += (i ? sep : "") + first[i];
  if (rest && hi != 0 && !first.empty()) {
    out += repeat(sep + *rest, lo, hi);
  } else if (rest && hi != 0) {  // the first element has no comma before it
    const std::string body = *rest + repeat(sep + *rest, lo ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    out += lo == 0 ? group(body) + "?" : body;
  }
  return out + "\\]";
}

// An object of any keys, each value in `value`.
std::string map_regex(const std::string& value, const std::string& ws) {
  const std::string kv = "\"" + std::string(kChar) + "*\":" + ws + value;
  return "\\{" + group(kv + group("," + ws + kv) + "*") + "?\\}";
}

// Any JSON value of nesting up to `depth` (a scalar is nesting 0).
std::string any_value(int depth, const std::string& ws) {
  std::vector<std::string> alts = {"\"" + std::string(kChar) + "*\"", "-?" + std::string(kNat) + std::string(kFracExp),
                                   "true", "false", "null"};
  if (depth > 0) {
    const std::string inner = any_value(depth - 1, ws);
    alts.push_back(map_regex(inner, ws));
    alts.push_back(list_regex({}, inner, 0, -1, ws));
  }
  return *alternation(std::move(alts));
}

std::string where(const std::string& ptr) { return ptr.empty() ? "the root" : ptr; }

Error unsupported(std::string_view keyword, const std::string& ptr, std::string_view why = "") {
  return make_error(ErrorCode::kUnsupported, "'{}' at {} is not supported{}", keyword, where(ptr), why);
}
Error invalid(std::string_view keyword, const std::string& ptr, std::string_view what) {
  return make_error(ErrorCode::kInvalidArgument, "'{}' at {} {}", keyword, where(ptr), what);
}

Error too_large(const std::string& ptr) {
  return make_error(ErrorCode::kInvalidArgument,
                    "the schema's automaton would be too large (its regex passes 1 MiB at "
                    "{}); lower max_depth, the counts (maxLength, maxItems) or the optional properties",
                    where(ptr));
}

// `v` as its compact JSON text, matched literally.
Result<std::string> json_literal(const ojson& v, const std::string& ptr) {
  try {
    return escape_regex(v.dump());
  } catch (const ojson::exception& e) {  // a string that is not UTF-8
    return make_error(ErrorCode::kInvalidArgument, "a value at {} cannot be written as JSON: {}", where(ptr), e.what());
  }
}

unsigned types_of(const ojson& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBool;
  if (v.is_number_integer()) return kInt | kNum;
  if (v.is_number()) return std::floor(v.get<double>()) == v.get<double>() ? kInt | kNum : kNum;
  return v.is_string() ? kStr : v.is_object() ? kObj : kArr;
}

// ---- Integer ranges as decimal regexes.

// The decimal strings of one length from `lo` to `hi` (lo <= hi).
std::string digits_between(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return "";
  if (lo[0] == hi[0]) return lo[0] + digits_between(lo.substr(1), hi.substr(1));
  const size_t rest = lo.size() - 1;
  auto tail_is = [](const std::string& s, char c) { return s.find_first_not_of(c, 1) == std::string::npos; };
  const std::string any = rest == 0 ? "" : rest == 1 ? "[0-9]" : fmt::format("[0-9]{{{}}}", rest);
  std::vector<std::string> alts;
  char mid_lo = lo[0], mid_hi = hi[0];
  // A first digit whose tail is bounded (lo's above 0..0, hi's below 9..9) is a branch of its own.
  if (!tail_is(lo, '0')) alts.push_back(lo[0] + digits_between(lo.substr(1), std::string(rest, '9'))), ++mid_lo;
  const bool hi_free = tail_is(hi, '9');
  if (!hi_free) --mid_hi;
  if (mid_lo <= mid_hi)
    alts.push_back((mid_lo == mid_hi ? std::string(1, mid_lo) : fmt::format("[{}-{}]", mid_lo, mid_hi)) + any);
  if (!hi_free) alts.push_back(hi[0] + digits_between(std::string(rest, '0'), hi.substr(1)));
  return *alternation(std::move(alts));
}

// The naturals lo..hi (none: unbounded) without leading zeros, appended to `alts` behind `sign`.
// Bounds <= 10^18 keep every power of ten used in uint64.
void naturals(uint64_t lo, std::optional<uint64_t> hi, const char* sign, std::vector<std::string>& alts) {
  const size_t lo_digits = std::to_string(lo).size();
  uint64_t pow = 1;  // 10^(len - 1)
  for (size_t i = 1; i < lo_digits; ++i) pow *= 10;
  for (size_t len = lo_digits;; ++len, pow *= 10) {
    const uint64_t first = len == lo_digits ? lo : pow;
    if (hi && first > *hi) return;
    if (!hi && len > lo_digits)
      return alts.push_back(std::string(sign) + "[1-9]" + (len == 2 ? "[0-9]+" : fmt::format("[0-9]{{{},}}", len - 1)));
    const uint64_t last = hi ? std::min(*hi, pow * 10 - 1) : pow * 10 - 1;
    alts.push_back(sign + digits_between(std::to_string(first), std::to_string(last)));
  }
}

// The integers lo..hi (none: unbounded).
Lang integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (!lo && !hi) return "-?" + std::string(kNat);
  if (lo && hi && *lo > *hi) return Lang();
  std::vector<std::string> alts;
  const int64_t top = hi ? std::min<int64_t>(*hi, -1) : -1;  // negatives: '-' and their magnitudes
  if (!lo || top >= *lo) naturals(-top, lo ? std::optional<uint64_t>(-*lo) : std::nullopt, "-", alts);
  if (!hi || *hi >= 0)
    naturals(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? std::optional<uint64_t>(*hi) : std::nullopt, "", alts);
  return alternation(std::move(alts));
}

// ---- `pattern`: ECMAScript syntax translated to the dialect, confined to raw JSON characters.

struct CodeRange {
  uint32_t lo, hi;
};

std::string utf8(uint32_t c) {
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  const int n = c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  std::string s(static_cast<size_t>(n), '\0');
  for (int k = n - 1; k > 0; --k, c >>= 6) s[static_cast<size_t>(k)] = static_cast<char>(0x80 | (c & 0x3F));
  s[0] = static_cast<char>((0xF00 >> n) | c);  // 0xC0, 0xE0 or 0xF0 and the high bits
  return s;
}

bool raw_ok(uint32_t c) { return c >= 0x20 && c != '"' && c != '\\'; }

// A code point inside a class.
std::string class_char(uint32_t c) {
  if (c < 0x20 || c == 0x7f) return fmt::format("\\x{:02x}", c);
  if (c < 0x80 && !std::isalnum(static_cast<int>(c)) && c != ' ') return std::string(1, '\\').append(utf8(c));
  return utf8(c);
}

std::string class_of(const std::vector<CodeRange>& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (auto r : ranges) {
    out += class_char(r.lo);
    if (r.hi > r.lo) {
      out += '-';
      out += class_char(r.hi);
    }
  }
  return out + (negated ? std::string(kNotRaw) : "") + "]";
}

// A code point outside a class, as one atom; one JSON must escape is its short escape.
std::string literal_atom(uint32_t c) {
  if (raw_ok(c)) return c < 0x80 ? escape_regex(utf8(c)) : group(utf8(c));
  static constexpr std::string_view kShort = "\"\"\\\\\bb\ff\nn\rr\tt";  // pairs: character, escape letter
  size_t k = 0;
  while (k < kShort.size() && static_cast<uint32_t>(kShort[k]) != c) k += 2;
  return group(escape_regex(k < kShort.size() ? std::string("\\") + kShort[k + 1] : fmt::format("\\u{:04x}", c)));
}

// What \d \w \s \D \W \S match in a raw JSON string: \s only the space (other whitespace is
// escaped in JSON), \D \W \S only their printable ASCII members. In a negated class a shorthand
// must exclude all it matches in any flavour (validators are Python's, Rust's or ECMAScript's):
// \s its Unicode spaces too; \d and \w, Unicode digits and letters in two of them, are refused.
std::vector<CodeRange> shorthand_ranges(char e, bool negated) {
  if (negated && e == 's')
    return {{' ', ' '},       {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
            {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  if (negated) return {};
  if (e == 'd') return {{'0', '9'}};
  if (e == 'w') return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  if (e == 's') return {{' ', ' '}};
  std::vector<CodeRange> out;
  for (uint32_t c = 0x20; c < 0x7f; ++c) {
    const bool word = std::isalnum(static_cast<int>(c)) || c == '_';
    const bool keep = e == 'D' ? !std::isdigit(static_cast<int>(c)) : e == 'W' ? !word : c != ' ';
    if (!raw_ok(c) || !keep) continue;
    if (out.empty() || out.back().hi + 1 != c) out.push_back({c, c});
    out.back().hi = c;
  }
  return out;
}

class PatternTranslator {
 public:
  PatternTranslator(std::string_view p, const std::string& ptr) : p_(p), ptr_(ptr) {}

  Result<std::string> run() {
    if (!p_.empty() && p_[0] == '^') p_.remove_prefix(1);
    if (!p_.empty() && p_.back() == '$') {
      size_t slashes = 0;  // a trailing $ is an anchor unless escaped
      while (slashes + 1 < p_.size() && p_[p_.size() - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) p_.remove_suffix(1);
    }
    std::string out;
    int open = 0;
    bool atom = false;  // a quantifier may follow
    while (i_ < p_.size()) {
      const char c = p_[i_];
      const bool quantifier = c == '*' || c == '+' || c == '?' || (c == '{' && counted());
      if (quantifier) {
        if (!atom) return invalid("has a quantifier with nothing before it");
        const size_t end = c == '{' ? p_.find('}', i_) + 1 : i_ + 1;
        if (c == '{') {  // ByteDfa refuses what ECMAScript does, and counts past its largest
          const std::string q(p_.substr(i_ + 1, end - i_ - 2));
          const uint64_t m = std::strtoull(q.c_str(), nullptr, 10), comma = q.find(',');
          const uint64_t n = comma == std::string::npos ? m : std::strtoull(q.c_str() + comma + 1, nullptr, 10);
          if (std::max(m, n) > kMaxCount) return bad(fmt::format("counts above {}", kMaxCount));
          if (comma + 1 < q.size() && n < m) return invalid("has a count range out of order");
        }
        out += p_.substr(i_, end - i_);
        i_ = end + (end < p_.size() && p_[end] == '?');  // a lazy quantifier: the same language
      } else if (c == '(') {
        if (p_.substr(i_ + 1, 1) == "?" && p_.substr(i_ + 1, 2) != "?:") return bad("lookarounds, named groups, flags");
        i_ += p_.substr(i_ + 1, 2) == "?:" ? 3 : 1;
        out += "(?:";
        ++open;
      } else if (c == ')' || c == '|') {
        if (c == ')' && --open < 0) return invalid("closes a group it never opened");
        out += c;
        ++i_;
      } else if (c == '^' || c == '$') {
        return bad("anchors inside the pattern");
      } else if (c == '.') {
        out += kDot;
        ++i_;
      } else if (c == '[') {
        ++i_;
        LRA_ASSIGN_OR_RETURN(std::string cls, char_class());
        out += cls;
      } else {
        LRA_ASSIGN_OR_RETURN(Member m, member(/*in_class=*/false));
        out += m.shorthand == 'd' || m.shorthand == 'w' ? std::string("\\") + m.shorthand
               : m.shorthand                            ? class_of(shorthand_ranges(m.shorthand, false), false)
                                                        : literal_atom(m.code);
      }
      atom = !quantifier && c != '(' && c != '|';
    }
    if (open != 0) return invalid("leaves a group open");
    return out;
  }

 private:
  struct Member {
    uint32_t code = 0;
    char shorthand = 0;  // d w s D W S, or 0 for the code point
  };

  Error bad(std::string_view what) const { return unsupported("pattern", ptr_, fmt::format(" ({}: {})", what, p_)); }
  Error invalid(std::string_view what) const {
    return guide::invalid("pattern", ptr_, fmt::format("{}: {}", what, p_));
  }

  // {m}, {m,} or {m,n} at i_ (another brace is a literal one, as ECMAScript reads it).
  bool counted() const {
    const size_t end = p_.find('}', i_), comma = p_.find(',', i_);
    auto digit = [](char d) { return d >= '0' && d <= '9'; };
    auto digits = [&](size_t from, size_t to) { return std::all_of(p_.begin() + from, p_.begin() + to, digit); };
    if (end == std::string_view::npos || end == i_ + 1 || p_[i_ + 1] == ',') return false;
    return comma < end ? digits(i_ + 1, comma) && digits(comma + 1, end) : digits(i_ + 1, end);
  }

  // One UTF-8 character at i_.
  Result<uint32_t> next_char() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > p_.size()) return invalid("is not UTF-8");
    uint32_t c = n == 1 ? b : b & (0x7Fu >> n);
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += n;
    return c;
  }

  // A character or an escape at i_: a code point, or a shorthand class.
  Result<Member> member(bool in_class) {
    if (p_[i_] != '\\') {
      LRA_ASSIGN_OR_RETURN(uint32_t c, next_char());
      return Member{c, 0};
    }
    if (++i_ >= p_.size()) return invalid("ends with a backslash");
    const char e = p_[i_];
    if (!std::isalnum(static_cast<unsigned char>(e))) {  // an escaped punctuation or non-ASCII character
      LRA_ASSIGN_OR_RETURN(uint32_t c, next_char());
      return Member{c, 0};
    }
    ++i_;
    if (std::string_view("dwsDWS").find(e) != std::string_view::npos) return Member{0, e};
    static constexpr std::string_view kControls = "n\nr\rt\tf\fv\v";  // pairs: letter, character
    if (const size_t k = kControls.find(e); k != std::string_view::npos && k % 2 == 0)
      return Member{static_cast<uint32_t>(kControls[k + 1]), 0};
    if (e == 'b' && in_class) return Member{'\b', 0};
    if (e == '0' && (i_ >= p_.size() || !std::isdigit(static_cast<unsigned char>(p_[i_])))) return Member{0, 0};
    if (e != 'x' && e != 'u') return bad(fmt::format("the escape \\{}", e));
    const size_t n = e == 'x' ? 2 : 4;
    auto hex = [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; };
    if (i_ + n > p_.size() || !std::all_of(p_.begin() + i_, p_.begin() + i_ + n, hex))
      return invalid("has a bad hex escape");
    const auto c = static_cast<uint32_t>(std::strtoul(std::string(p_.substr(i_, n)).c_str(), nullptr, 16));
    i_ += n;
    if (c >= 0xD800 && c <= 0xDFFF) return bad("surrogate escapes");
    return Member{c, 0};
  }

  // The class after a '[' at i_, up to its ']'.
  Result<std::string> char_class() {
    const bool negated = i_ < p_.size() && p_[i_] == '^';
    i_ += negated;
    std::vector<CodeRange> ranges;
    while (i_ >= p_.size() || p_[i_] != ']') {
      if (i_ >= p_.size()) return invalid("leaves a class open");
      LRA_ASSIGN_OR_RETURN(Member lo, member(/*in_class=*/true));
      if (lo.shorthand) {
        const auto rs = shorthand_ranges(lo.shorthand, negated);
        if (rs.empty()) return bad(fmt::format("\\{} inside a negated class", lo.shorthand));
        ranges.insert(ranges.end(), rs.begin(), rs.end());
        continue;
      }
      uint32_t hi = lo.code;
      if (p_.substr(i_, 1) == "-" && p_.substr(i_ + 1, 1) != "]" && i_ + 1 < p_.size()) {
        ++i_;
        LRA_ASSIGN_OR_RETURN(Member h, member(/*in_class=*/true));
        if (h.shorthand) return bad("a range ending in a shorthand class");
        if (h.code < lo.code) return invalid("has a range out of order");
        hi = h.code;
      }
      ranges.push_back({lo.code, hi});
    }
    ++i_;
    if (negated) return class_of(ranges, true);
    // Characters a raw JSON string cannot hold are dropped: ", \ and the controls.
    std::vector<CodeRange> kept;
    for (auto r : ranges)
      for (uint32_t lo = std::max<uint32_t>(r.lo, 0x20); lo <= r.hi;) {
        const uint32_t stop = lo <= '"' ? '"' : lo <= '\\' ? '\\' : 0x110000;
        if (lo < stop) kept.push_back({lo, std::min(r.hi, stop - 1)});
        lo = stop + 1;
      }
    if (kept.empty()) return bad("a class with no character a raw JSON string holds");
    return class_of(kept, false);
  }

  std::string_view p_;
  const std::string& ptr_;
  size_t i_ = 0;
};

// ---- The schema compiler.

// What a keyword is: a combinator, a constraint on values of `types`, or neither (an annotation,
// `type`); none for a keyword outside the subset.
struct Keyword {
  bool combinator;
  unsigned types;
};

std::optional<Keyword> keyword_of(std::string_view k) {
  static const std::pair<Keyword, std::string_view> kKeywords[] = {
      // discriminator: pydantic's (OpenAPI's) note on a oneOf, whose branches' consts do the work.
      {{false, 0},
       " title description default examples $schema $id $comment deprecated readOnly writeOnly "
       "$defs definitions discriminator type "},
      {{true, 0}, " enum const anyOf oneOf allOf $ref "},
      {{false, kStr}, " minLength maxLength pattern format "},
      {{false, kInt | kNum}, " minimum maximum exclusiveMinimum exclusiveMaximum multipleOf "},
      {{false, kObj}, " properties required additionalProperties "},
      {{false, kArr}, " items prefixItems minItems maxItems uniqueItems "}};
  if (k.empty() || k.find(' ') != std::string_view::npos) return std::nullopt;
  std::string spaced(1, ' ');  // " k ": a whole word of a list
  spaced.append(k).push_back(' ');
  for (const auto& [keyword, words] : kKeywords)
    if (words.find(spaced) != std::string_view::npos) return keyword;
  return std::nullopt;
}

class Compiler {
 public:
  Compiler(const ojson& root, const JsonRegexOptions& o) : root_(root), o_(o), ws_(o.whitespace) {}

  Result<Lang> compile(const ojson& s, const std::string& ptr) {
    if (++calls_ > kMaxCalls) return too_large(ptr);
    if (nesting_ >= kMaxNesting)
      return make_error(ErrorCode::kInvalidArgument, "the schema at {} nests deeper than {} levels", where(ptr),
                        kMaxNesting);
    ++nesting_;
    auto r = dispatch(s, ptr);
    --nesting_;
    if (r.ok() && r->has_value() && (*r)->size() > kMaxRegexBytes) return too_large(ptr);
    return r;
  }

 private:
  // Any value of nesting up to `depth`, built once per depth.
  const std::string& any(int depth) {
    auto& slot = any_[depth];
    if (slot.empty()) slot = any_value(depth, ws_);
    return slot;
  }

  Result<Lang> dispatch(const ojson& s, const std::string& ptr) {
    if (s.is_boolean()) return s.get<bool>() ? Lang(any(o_.max_depth)) : Lang();
    if (!s.is_object())
      return make_error(ErrorCode::kInvalidArgument, "the schema at {} must be an object or a boolean, not {}",
                        where(ptr), s.type_name());
    unsigned types = 0;  // the types the keywords present constrain
    std::vector<std::string> combinators, constraints;
    for (const auto& [k, v] : s.items()) {
      const auto kw = keyword_of(k);
      if (!kw) return unsupported(k, ptr);
      if (kw->combinator) combinators.push_back(k);
      if (kw->types) constraints.push_back(k);
      types |= kw->types;
    }
    const bool typed = s.contains("type");
    if (typed) {
      LRA_ASSIGN_OR_RETURN(types, parse_type(s["type"], ptr));
    }
    if (!combinators.empty()) {
      const std::string& c = combinators[0];
      // Another keyword would intersect with the combinator's language, which no regex of
      // alternatives does; enum and const are only filtered by `type`.
      if (combinators.size() > 1) return unsupported(combinators[1], ptr, fmt::format(" beside '{}'", c));
      if (!constraints.empty()) return unsupported(constraints[0], ptr, fmt::format(" beside '{}'", c));
      if (typed && c != "enum" && c != "const") return unsupported("type", ptr, fmt::format(" beside '{}'", c));
      if (c == "const") return values({s["const"]}, typed ? types : ~0u, ptr);
      if (c == "enum") {
        if (!s["enum"].is_array()) return invalid("enum", ptr, "must be a list");
        return values(std::vector<ojson>(s["enum"].begin(), s["enum"].end()), typed ? types : ~0u, ptr);
      }
      if (c == "$ref") return ref(s["$ref"], ptr);
      return combine(c, s[c], ptr + "/" + c);
    }
    if (types == 0) return Lang(any(o_.max_depth));
    using Part = Result<Lang> (Compiler::*)(const ojson&, const std::string&, unsigned);
    static constexpr std::pair<unsigned, Part> kParts[] = {{kObj, &Compiler::object},
                                                           {kArr, &Compiler::array},
                                                           {kStr, &Compiler::string},
                                                           {kInt | kNum, &Compiler::number}};
    std::vector<std::string> alts;
    for (const auto& [bits, part] : kParts) {
      if (!(types & bits)) continue;
      LRA_ASSIGN_OR_RETURN(Lang l, (this->*part)(s, ptr, types));
      if (l) alts.push_back(std::move(*l));
    }
    if (types & kBool) alts.push_back("(?:true|false)");
    if (types & kNull) alts.push_back("null");
    return alternation(std::move(alts));
  }

  static Result<unsigned> parse_type(const ojson& t, const std::string& ptr) {
    static const std::map<std::string, unsigned> kNames = {{"null", kNull},  {"boolean", kBool}, {"integer", kInt},
                                                           {"number", kNum}, {"string", kStr},   {"object", kObj},
                                                           {"array", kArr}};
    unsigned out = 0;
    for (const ojson& n : t.is_array() ? t : ojson::array({t})) {
      auto it = n.is_string() ? kNames.find(n.get<std::string>()) : kNames.end();
      if (it == kNames.end())
        return invalid("type", ptr,
                       fmt::format("names {}, not null, boolean, integer, number, string, object or array", n.dump()));
      out |= it->second;
    }
    if (out == 0) return invalid("type", ptr, "is an empty list");
    return out;
  }

  static Result<std::optional<uint64_t>> count(const ojson& s, const char* key, const std::string& ptr) {
    if (!s.contains(key)) return std::optional<uint64_t>();
    const ojson& v = s[key];
    const double d = v.is_number() ? v.get<double>() : -1;
    if (d < 0 || d != std::floor(d)) return invalid(key, ptr, "must be a non-negative integer");
    if (d > kMaxCount)
      return unsupported(key, ptr, fmt::format(" above {} (the automaton's largest count)", kMaxCount));
    return std::optional<uint64_t>(static_cast<uint64_t>(d));
  }

  static Result<Lang> values(const std::vector<ojson>& vals, unsigned allowed, const std::string& ptr) {
    std::vector<std::string> alts;
    for (const ojson& v : vals) {
      if (!(types_of(v) & allowed)) continue;
      LRA_ASSIGN_OR_RETURN(std::string lit, json_literal(v, ptr));
      alts.push_back(std::move(lit));
    }
    return alternation(std::move(alts));
  }

  Result<Lang> combine(const std::string& c, const ojson& list, const std::string& ptr) {
    if (!list.is_array() || list.empty()) return invalid(c, ptr, "must be a non-empty list of schemas");
    if (c == "allOf" && list.size() > 1)
      return unsupported(c, ptr,
                         fmt::format(" with {} schemas (one only: an intersection is no regex here)", list.size()));
    std::vector<std::string> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      LRA_ASSIGN_OR_RETURN(Lang l, compile(list[i], ptr + "/" + std::to_string(i)));
      if (l) alts.push_back(std::move(*l));
    }
    return alternation(std::move(alts));
  }

  Result<Lang> ref(const ojson& r, const std::string& ptr) {
    if (!r.is_string()) return invalid("$ref", ptr, "must be a string");
    const std::string target = r.get<std::string>();
    if (target.empty() || target[0] != '#')
      return unsupported("$ref", ptr, fmt::format(" to \"{}\" (local references \"#/...\" only)", target));
    const ojson* def = nullptr;
    try {
      const ojson::json_pointer jp(target.substr(1));
      if (root_.contains(jp)) def = &root_.at(jp);
    } catch (const ojson::exception&) {  // not a JSON pointer: reported below
    }
    if (!def) return invalid("$ref", ptr, fmt::format("names \"{}\", which is not in the schema", target));
    // A recursion is cut once the reference is open max_depth times on the current path.
    int& open = open_refs_[target];
    if (open >= o_.max_depth) return Lang();
    ++open;
    auto out = compile(*def, target.substr(1));
    --open;
    return out;
  }

  Result<Lang> string(const ojson& s, const std::string& ptr, unsigned /*types*/) {
    LRA_ASSIGN_OR_RETURN(auto lo, count(s, "minLength", ptr));
    LRA_ASSIGN_OR_RETURN(auto hi, count(s, "maxLength", ptr));
    const bool counted = lo || hi;
    if (s.contains("pattern") && counted) return unsupported("pattern", ptr, " beside a length bound");
    if (s.contains("format") && (counted || s.contains("pattern")))
      return unsupported("format", ptr, counted ? " beside a length bound" : " beside 'pattern'");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return invalid("pattern", ptr, "must be a string");
      LRA_ASSIGN_OR_RETURN(std::string p, PatternTranslator(s["pattern"].get_ref<const std::string&>(), ptr).run());
      return Lang("\"" + (p.empty() ? p : group(p)) + "\"");
    }
    if (s.contains("format")) {
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : s["format"].dump();
      const std::string date(kDate), time(kTime);
      const std::map<std::string, std::string> kFormats = {{"date", date},
                                                           {"time", time},
                                                           {"date-time", date + "T" + time},
                                                           {"uuid", std::string(kUuid)},
                                                           {"email", std::string(kEmail)}};
      if (!kFormats.count(f))
        return unsupported("format", ptr, fmt::format(" as \"{}\" (date, time, date-time, uuid, email)", f));
      return Lang("\"" + kFormats.at(f) + "\"");
    }
    if (!counted) return Lang("\"" + std::string(kChar) + "*\"");
    if (hi && *hi < lo.value_or(0)) return Lang();
    return Lang("\"" + repeat(kCountedChar, lo.value_or(0), hi ? static_cast<int64_t>(*hi) : -1) + "\"");
  }

  // The lower (or upper) bound of minimum / exclusiveMinimum (or the maximums): its value, whether
  // it is exclusive, and the keyword that set it. Draft 4's boolean exclusive* mark the other.
  struct Bound {
    double value;
    bool exclusive;
    const char* keyword;
  };
  static Result<std::optional<Bound>> bound(const ojson& s, const char* incl, const char* excl, bool lower,
                                            const std::string& ptr) {
    std::optional<Bound> out;
    for (const char* k : {incl, excl}) {
      if (!s.contains(k) || (k == excl && s[k].is_boolean())) continue;
      if (!s[k].is_number()) return invalid(k, ptr, "must be a number");
      const double x = s[k].get<double>();
      if (!out || (lower ? x >= out->value : x <= out->value)) out = Bound{x, k == excl, k};  // the tighter wins
    }
    if (out && s.contains(excl) && s[excl].is_boolean()) out->exclusive = s[excl].get<bool>();
    return out;
  }

  Result<Lang> number(const ojson& s, const std::string& ptr, unsigned types) {
    const bool fractional = (types & kNum) != 0;
    LRA_ASSIGN_OR_RETURN(auto lo, bound(s, "minimum", "exclusiveMinimum", true, ptr));
    LRA_ASSIGN_OR_RETURN(auto hi, bound(s, "maximum", "exclusiveMaximum", false, ptr));
    if (s.contains("multipleOf") && (fractional || s["multipleOf"] != 1))
      return unsupported("multipleOf", ptr, fractional ? " on a number" : " other than 1");
    if (!fractional) {
      for (const auto& b : {lo, hi})
        if (b && std::fabs(b->value) > 1e18) return unsupported(b->keyword, ptr, " beyond 1e18");
      std::optional<int64_t> l, h;
      if (lo) l = static_cast<int64_t>(lo->exclusive ? std::floor(lo->value) + 1 : std::ceil(lo->value));
      if (hi) h = static_cast<int64_t>(hi->exclusive ? std::ceil(hi->value) - 1 : std::floor(hi->value));
      return integer_range(l, h);
    }
    if (hi) return unsupported(hi->keyword, ptr, " on a number (integers take any bound)");
    if (!lo) return Lang("-?" + std::string(kNat) + std::string(kFracExp));
    if (lo->value != 0) return unsupported(lo->keyword, ptr, " on a number other than 0 (integers take any bound)");
    if (!lo->exclusive) return Lang(std::string(kNat) + std::string(kFracExp));
    // Above 0: a nonzero digit in the mantissa, and no value so small that it parses as 0.0 (at
    // most 15 zeros after the point, no negative exponent).
    return Lang(R"((?:[1-9][0-9]*(?:\.[0-9]+)?|0\.0{0,15}[1-9][0-9]*)(?:[eE]\+?[0-9]+)?)");
  }

  Result<Lang> object(const ojson& s, const std::string& ptr, unsigned /*types*/) {
    const ojson& addl = s.contains("additionalProperties") ? s["additionalProperties"] : null_;
    if (!s.contains("properties")) {  // a map
      if (s.contains("required") && !s["required"].empty())
        return unsupported("required", ptr, " without 'properties'");
      if (addl == false) return Lang("\\{\\}");
      Lang value = any(o_.max_depth - 1);
      if (addl.is_object()) {
        LRA_ASSIGN_OR_RETURN(value, compile(addl, ptr + "/additionalProperties"));
      }
      return Lang(value ? map_regex(*value, ws_) : "\\{\\}");
    }
    if (!addl.is_null() && addl != false)
      return unsupported("additionalProperties", ptr, " beside 'properties' (false only: the object is closed)");
    const ojson& props = s["properties"];
    if (!props.is_object()) return invalid("properties", ptr, "must be an object");
    const ojson& required = s.contains("required") ? s["required"] : ojson::array();
    if (!required.is_array()) return invalid("required", ptr, "must be a list of property names");
    for (const ojson& r : required)
      if (!r.is_string() || !props.contains(r.get<std::string>()))
        return invalid("required", ptr,
                       fmt::format("names {}, which is not a property (the object is closed)", r.dump()));
    std::vector<std::string> kv;  // "key":ws value
    std::vector<bool> req;
    for (const auto& [name, sub] : props.items()) {
      const bool r = std::find(required.begin(), required.end(), name) != required.end();
      std::string token;
      for (char c : name) token += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      LRA_ASSIGN_OR_RETURN(Lang v, compile(sub, ptr + "/properties/" + token));
      if (!v && r) return Lang();  // a required property no value satisfies
      if (!v) continue;            // an optional one is left out
      LRA_ASSIGN_OR_RETURN(std::string key, json_literal(ojson(name), ptr + "/properties"));
      kv.push_back(key + ":" + ws_ + *v);
      req.push_back(r);
    }
    if (kv.empty()) return Lang("\\{\\}");
    // Every property after the first one written has a comma before it. The first written is the
    // first required one or an optional one before it: a branch each, followed by the others.
    const size_t n = kv.size(), first_req = std::find(req.begin(), req.end(), true) - req.begin();
    const size_t last = std::min(first_req, n - 1);  // the last property that may come first
    std::vector<std::string> seg(n);                 // a property after another
    for (size_t i = 0; i < n; ++i) seg[i] = req[i] ? "," + ws_ + kv[i] : group("," + ws_ + kv[i]) + "?";
    std::string after;  // the properties after `last`, shared by every branch
    for (size_t i = last + 1; i < n; ++i) after += seg[i];
    size_t total = 0, middle = 0;
    for (size_t i = last + 1; i-- > 0; middle += seg[i].size()) total += kv[i].size() + middle + after.size();
    if (total > kMaxRegexBytes) return too_large(ptr);
    std::vector<std::string> branches(last + 1);
    std::string mid;  // seg[i + 1 .. last]
    for (size_t i = last + 1; i-- > 0; mid = seg[i] + mid) branches[i] = kv[i] + mid + after;
    std::string body = *alternation(std::move(branches));
    if (first_req == n) body = (last == 0 ? group(body) : body) + "?";  // all optional: may be empty
    return Lang("\\{" + body + "\\}");
  }

  Result<Lang> array(const ojson& s, const std::string& ptr, unsigned /*types*/) {
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) return unsupported("uniqueItems", ptr);
    LRA_ASSIGN_OR_RETURN(auto lo_opt, count(s, "minItems", ptr));
    LRA_ASSIGN_OR_RETURN(auto hi_opt, count(s, "maxItems", ptr));
    const ojson& items = s.contains("items") ? s["items"] : null_;
    const ojson& prefix = s.contains("prefixItems") ? s["prefixItems"] : null_;
    if (!prefix.is_null() && !prefix.is_array()) return invalid("prefixItems", ptr, "must be a list of schemas");
    const uint64_t lo = lo_opt.value_or(0);
    int64_t hi = hi_opt ? static_cast<int64_t>(*hi_opt) : -1;
    std::vector<std::string> first;
    for (size_t i = 0; i < prefix.size() && (hi < 0 || static_cast<int64_t>(i) < hi); ++i) {
      LRA_ASSIGN_OR_RETURN(Lang p, compile(prefix[i], ptr + "/prefixItems/" + std::to_string(i)));
      if (!p) {  // no element fits here: the array ends before it
        hi = static_cast<int64_t>(i);
        break;
      }
      first.push_back(std::move(*p));
    }
    const uint64_t rest_lo = lo > first.size() ? lo - first.size() : 0;
    int64_t rest_hi = hi < 0 ? -1 : hi - static_cast<int64_t>(first.size());
    Lang rest;
    if (!items.is_null() && !items.is_boolean()) {
      LRA_ASSIGN_OR_RETURN(rest, compile(items, ptr + "/items"));
    } else if (items != false) {
      rest = any(o_.max_depth - 1);
      // After a tuple, further elements are only written when minItems asks for them.
      if (prefix.is_array()) rest_hi = static_cast<int64_t>(rest_lo);
    }
    if (!rest) rest_hi = 0;
    if (rest_hi >= 0 && rest_lo > static_cast<uint64_t>(rest_hi)) return Lang();
    return Lang(list_regex(first, rest, rest_lo, rest_hi, ws_));
  }

  const ojson& root_;
  const JsonRegexOptions& o_;
  const std::string ws_;
  const ojson null_;
  std::map<std::string, int> open_refs_;
  std::map<int, std::string> any_;
  size_t calls_ = 0;
  int nesting_ = 0;
};

}  // namespace

std::string escape_regex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7f)
      out += fmt::format("\\x{:02x}", b);
    else if (std::string_view(".^$|?*+()[]{}\\").find(c) != std::string_view::npos)
      out += '\\', out += c;
    else
      out += c;
  }
  return out;
}

std::string choice_regex(const std::vector<std::string>& choices) {
  std::vector<std::string> alts;
  for (const auto& c : choices) alts.push_back(escape_regex(c));
  return alternation(std::move(alts)).value_or("");
}

std::string json_object_regex(const JsonRegexOptions& opts) {
  const int depth = std::clamp(opts.max_depth, 1, kMaxJsonDepth);
  return map_regex(any_value(depth - 1, opts.whitespace), opts.whitespace);
}

Result<std::string> json_schema_regex(const nlohmann::ordered_json& schema, const JsonRegexOptions& opts) {
  if (opts.max_depth < 1 || opts.max_depth > kMaxJsonDepth)
    return make_error(ErrorCode::kInvalidArgument, "max_depth {} is outside 1..{}", opts.max_depth, kMaxJsonDepth);
  Compiler c(schema, opts);
  LRA_ASSIGN_OR_RETURN(Lang re, c.compile(schema, ""));
  if (!re)
    return make_error(ErrorCode::kInvalidArgument,
                      "the schema accepts no value (a false schema, an empty enum, bounds that cross, or a recursive "
                      "$ref that needs more than max_depth = {} levels)",
                      opts.max_depth);
  return std::move(*re);
}

Result<std::string> json_schema_regex(const nlohmann::json& schema, const JsonRegexOptions& opts) {
  return json_schema_regex(nlohmann::ordered_json(schema), opts);
}

}  // namespace lragent::guide
