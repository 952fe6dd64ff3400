#include "server/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

std::string describe_position(int line, int column) { return fmt::format("line {}, column {}", line, column); }

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// The Python-whitespace code point at `pos`, if there is one (jinja2's \s is Unicode's).
size_t space_len(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  const auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return py::is_space(b) ? 1 : 0;
  const size_t n = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
  if (pos + n > s.size()) return 0;
  const std::u32string u = py::decode(s.substr(pos, n));
  return u.size() == 1 && py::is_space(u[0]) ? n : 0;
}

size_t skip_spaces(std::string_view s, size_t pos) {
  while (size_t n = space_len(s, pos)) pos += n;
  return pos;
}

bool all_spaces(std::string_view s) { return skip_spaces(s, 0) == s.size(); }

std::string rstrip_spaces(std::string_view s) {
  std::u32string u = py::decode(s);
  while (!u.empty() && py::is_space(u.back())) u.pop_back();
  return py::encode(u);
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 turns \r\n and \r into \n before lexing and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous match ended a line (lstrip_blocks strips at a line's start)
    const std::string_view s = src_;
    while (pos < s.size()) {
      size_t t = pos;
      while ((t = s.find('{', t)) != std::string_view::npos) {
        if (t + 1 < s.size() && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) break;
        ++t;
      }
      if (t == std::string_view::npos) {
        push_data(pos, std::string(s.substr(pos)));
        break;
      }
      const char kind = s[t + 1];
      size_t after = t + 2;
      char sign = 0;
      if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(after, &raw_end);
      push_data(pos, strip_text(s.substr(pos, t - pos), sign, kind != '{', line_starting));
      if (kind == '#') {
        size_t q = s.find("#}", after);
        if (q == std::string_view::npos) return fail(t, "missing end of comment tag");
        char end_sign = q > after && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
        pos = end_of_tag(q + 2, end_sign, /*trim=*/true);
      } else if (raw) {
        pos = raw_end;
        line_starting = pos > 0 && s[pos - 1] == '\n';
        LRA_ASSIGN_OR_RETURN(pos, lex_raw(t, pos, line_starting));
      } else {
        push(kind == '%' ? TokenType::kBlockBegin : TokenType::kVariableBegin, t);
        LRA_ASSIGN_OR_RETURN(pos, lex_tag(after, kind == '%'));
      }
      line_starting = pos > 0 && s[pos - 1] == '\n';
    }
    push(TokenType::kEof, s.size());
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;

  void locate(size_t pos, int* line, int* column) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    const size_t idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    *line = static_cast<int>(idx + 1);
    *column = static_cast<int>(pos - line_starts_[idx] + 1);
  }

  Error fail(size_t pos, const std::string& what) const {
    int line, column;
    locate(pos, &line, &column);
    return make_error(ErrorCode::kCorrupt, "template syntax error at {}: {}", describe_position(line, column), what);
  }

  Token& push(TokenType type, size_t pos, std::string text = {}) {
    Token tok;
    tok.type = type;
    tok.text = std::move(text);
    locate(pos, &tok.line, &tok.column);
    tokens_.push_back(std::move(tok));
    return tokens_.back();
  }

  void push_data(size_t pos, std::string text) {
    if (!text.empty()) push(TokenType::kData, pos, std::move(text));
  }

  // The data before a tag, with the tag's whitespace control applied: "-" strips all whitespace
  // before it; otherwise lstrip_blocks strips the spaces from the start of the line to a block or
  // comment tag ("+" opts out), as jinja2's OptionalLStrip does.
  static std::string strip_text(std::string_view text, char sign, bool lstrip_kind, bool line_starting) {
    if (sign == '-') return rstrip_spaces(text);
    if (sign != '+' && lstrip_kind) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_spaces(text.substr(l_pos)))
        return std::string(text.substr(0, l_pos));
    }
    return std::string(text);
  }

  // Where the text after a tag's end resumes: "-" skips all whitespace, "+" nothing, and plain
  // block and comment ends drop one newline (trim_blocks).
  size_t end_of_tag(size_t pos, char sign, bool trim) const {
    if (sign == '-') return skip_spaces(src_, pos);
    if (sign != '+' && trim && pos < src_.size() && src_[pos] == '\n') return pos + 1;
    return pos;
  }

  // {%[-+]? raw %} (after the sign): \s* raw \s* then -%} or %} (no trim_blocks here, as jinja2).
  bool match_raw_begin(size_t pos, size_t* end) const {
    const std::string_view s = src_;
    pos = skip_spaces(s, pos);
    if (s.substr(pos, 3) != "raw") return false;
    pos = skip_spaces(s, pos + 3);
    if (s.substr(pos, 3) == "-%}") {
      *end = skip_spaces(s, pos + 3);
      return true;
    }
    if (s.substr(pos, 2) == "%}") {
      *end = pos + 2;
      return true;
    }
    return false;
  }

  Result<size_t> lex_raw(size_t begin, size_t pos, bool line_starting) {
    const std::string_view s = src_;
    for (size_t p = s.find("{%", pos); p != std::string_view::npos; p = s.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < s.size() && (s[q] == '-' || s[q] == '+')) sign = s[q++];
      q = skip_spaces(s, q);
      if (s.substr(q, 6) != "endraw") continue;
      q = skip_spaces(s, q + 6);
      char end_sign = 0;
      if (q < s.size() && (s[q] == '-' || s[q] == '+')) end_sign = s[q++];
      if (s.substr(q, 2) != "%}") continue;
      push_data(pos, strip_text(s.substr(pos, p - pos), sign, true, line_starting));
      return end_of_tag(q + 2, end_sign, true);
    }
    return fail(begin, "missing end of raw directive");
  }

  // (\d+_)*\d+ at pos: its end, or npos.
  size_t digits(size_t pos) const {
    const std::string_view s = src_;
    if (pos >= s.size() || !is_digit(s[pos])) return std::string_view::npos;
    while (pos < s.size() && is_digit(s[pos])) ++pos;
    while (pos + 1 < s.size() && s[pos] == '_' && is_digit(s[pos + 1])) {
      ++pos;
      while (pos < s.size() && is_digit(s[pos])) ++pos;
    }
    return pos;
  }

  // jinja2's float_re: digits with a fraction, an exponent or both, not right after a '.'.
  size_t match_float(size_t pos) const {
    const std::string_view s = src_;
    if (pos > 0 && s[pos - 1] == '.') return 0;
    const size_t a = digits(pos);
    if (a == std::string_view::npos) return 0;
    size_t b = a;
    if (a < s.size() && s[a] == '.') {
      const size_t f = digits(a + 1);
      if (f != std::string_view::npos) b = f;
    }
    if (b < s.size() && (s[b] == 'e' || s[b] == 'E')) {
      size_t c = b + 1;
      if (c < s.size() && (s[c] == '+' || s[c] == '-')) ++c;
      const size_t d = digits(c);
      if (d != std::string_view::npos) return d - pos;
    }
    return b > a ? b - pos : 0;
  }

  // jinja2's integer_re: 0b/0o/0x literals, decimal without leading zeros, or zeros.
  size_t match_integer(size_t pos, int* base) const {
    const std::string_view s = src_;
    auto run = [&](size_t p, auto is_d) {  // (_?d)+ at p
      size_t n = p;
      while (true) {
        if (n < s.size() && is_d(s[n]))
          ++n;
        else if (n + 1 < s.size() && s[n] == '_' && is_d(s[n + 1]))
          n += 2;
        else
          break;
      }
      return n;
    };
    if (s[pos] == '0' && pos + 1 < s.size()) {
      const char p = static_cast<char>(s[pos + 1] | 0x20);
      size_t e = pos + 2;
      if (p == 'b')
        e = run(pos + 2, [](char c) { return c == '0' || c == '1'; }), *base = 2;
      else if (p == 'o')
        e = run(pos + 2, [](char c) { return c >= '0' && c <= '7'; }), *base = 8;
      else if (p == 'x')
        e = run(pos + 2, [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }), *base = 16;
      if (e > pos + 2) return e - pos;
    }
    *base = 10;
    if (s[pos] >= '1' && s[pos] <= '9') return run(pos + 1, is_digit) - pos;
    if (s[pos] == '0') return run(pos + 1, [](char c) { return c == '0'; }) - pos;
    return 0;
  }

  // A string literal's value (py::unescape), an error naming its place.
  Result<std::string> unescape(std::string_view raw, size_t pos) const {
    auto v = py::unescape(raw);
    if (!v.ok()) return fail(pos, v.error().message);
    return std::move(*v);
  }

  // The tokens inside {{ }} or {% %} from pos; returns where the data after the tag starts.
  Result<size_t> lex_tag(size_t pos, bool block) {
    const std::string_view s = src_;
    std::vector<char> balance;  // closers expected for ( [ {: the tag ends only when none is open
    static const char* const kOps[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                       "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
    while (true) {
      if (pos >= s.size())
        return fail(pos,
                    block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (balance.empty()) {
        const std::string_view end = block ? "%}" : "}}";
        for (char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const size_t at = pos + (sign ? 1 : 0);
          if ((sign == 0 || s[pos] == sign) && s.substr(at, 2) == end) {
            push(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, pos);
            return end_of_tag(at + 2, sign, block);
          }
        }
      }
      if (size_t n = space_len(s, pos)) {
        pos += n;
        continue;
      }
      if (size_t n = match_float(pos)) {
        std::string text(s.substr(pos, n));
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        push(TokenType::kFloat, pos).float_value = std::strtod(text.c_str(), nullptr);
        pos += n;
        continue;
      }
      int base = 10;
      if (size_t n = match_integer(pos, &base)) {
        std::string text(s.substr(pos + (base == 10 ? 0 : 2), n - (base == 10 ? 0 : 2)));
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        errno = 0;
        const unsigned long long v = std::strtoull(text.c_str(), nullptr, base);
        if (errno == ERANGE || v > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
          return fail(pos, "integer literal past 64 bits (Python's ints are unbounded; lragent's are not)");
        push(TokenType::kInteger, pos).int_value = static_cast<int64_t>(v);
        pos += n;
        continue;
      }
      if (is_name_start(s[pos])) {
        size_t e = pos;
        while (e < s.size() && is_name_char(s[e])) ++e;
        push(TokenType::kName, pos, std::string(s.substr(pos, e - pos)));
        pos = e;
        continue;
      }
      if (s[pos] == '\'' || s[pos] == '"') {
        size_t e = pos + 1;
        while (e < s.size() && s[e] != s[pos]) e += s[e] == '\\' ? 2 : 1;
        if (e < s.size()) {
          LRA_ASSIGN_OR_RETURN(std::string value, unescape(s.substr(pos + 1, e - pos - 1), pos));
          push(TokenType::kString, pos, std::move(value));
          pos = e + 1;
          continue;
        }
      }
      const char* op = nullptr;
      for (const char* o : kOps)
        if (s.substr(pos, std::char_traits<char>::length(o)) == o) {
          op = o;
          break;
        }
      if (!op) {
        if (static_cast<unsigned char>(s[pos]) >= 0x80)
          return fail(pos, "unexpected character (identifiers are ASCII here)");
        return fail(pos, fmt::format("unexpected char '{}'", s[pos]));
      }
      const char c = op[0];
      if (op[1] == 0 && (c == '(' || c == '[' || c == '{')) {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (op[1] == 0 && (c == ')' || c == ']' || c == '}')) {
        if (balance.empty()) return fail(pos, fmt::format("unexpected '{}'", c));
        if (balance.back() != c) return fail(pos, fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
        balance.pop_back();
      }
      push(TokenType::kOperator, pos, op);
      pos += std::char_traits<char>::length(op);
    }
  }
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace lragent::server::jinja
