#include "server/python_calls.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "server/jinja/pystr.h"

namespace lragent::server {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;  // lists and dicts inside an argument (the fuzzer's deep inputs stay cheap)

using pychars::is_digit;
using pychars::is_ident;
using pychars::is_ident_start;
using pychars::is_space;

// A recursive-descent reader over the text; every method returns false on anything outside the
// subset (the caller then treats the whole text as content).
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  bool calls(std::vector<PythonCall>& out) {
    if (!eat('[')) return false;
    do {
      if (peek() == ']') break;  // a trailing comma
      PythonCall c;
      if (!call(c)) return false;
      out.push_back(std::move(c));
    } while (eat(','));
    return eat(']') && !out.empty() && at_end();
  }
  bool whole_value(ordered_json& out) { return value(out, 0) && at_end(); }

 private:
  char peek() {
    skip_space();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  bool eat(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  bool at_end() {
    skip_space();
    return i_ == s_.size();
  }
  void skip_space() {
    while (i_ < s_.size() && is_space(s_[i_])) ++i_;
  }
  bool identifier(std::string& out) {
    if (!is_ident_start(peek())) return false;
    const size_t b = i_;
    while (i_ < s_.size() && is_ident(s_[i_])) ++i_;
    out.assign(s_.substr(b, i_ - b));
    return true;
  }

  bool call(PythonCall& c) {
    if (!identifier(c.name) || !eat('(')) return false;  // a.b( is refused here: '.' is not '('
    do {
      if (peek() == ')') break;
      std::string key;
      if (!identifier(key) || !eat('=') || c.arguments.contains(key)) return false;
      ordered_json v;
      if (!value(v, 0)) return false;
      c.arguments[key] = std::move(v);
    } while (eat(','));
    return eat(')');
  }

  bool value(ordered_json& out, int depth) {
    if (depth > kMaxDepth) return false;
    const char c = peek();
    if (c == '[') {
      ++i_;
      out = ordered_json::array();
      do {
        if (peek() == ']') break;
        ordered_json v;
        if (!value(v, depth + 1)) return false;
        out.push_back(std::move(v));
      } while (eat(','));
      return eat(']');
    }
    if (c == '{') {
      ++i_;
      out = ordered_json::object();
      do {
        if (peek() == '}') break;
        ordered_json k, v;
        if (!value(k, depth + 1) || !eat(':') || !value(v, depth + 1)) return false;
        // JSON keys are strings: json.dumps writes an integer key as its digits.
        if (!k.is_string() && !k.is_number_integer()) return false;
        out[k.is_string() ? k.get<std::string>() : k.dump()] = std::move(v);
      } while (eat(','));
      return eat('}');
    }
    if (c == '-' || c == '.' || is_digit(c)) return number(out);
    if (c == '"' || c == '\'' || c == 'r' || c == 'R' || c == 'u' || c == 'U') {
      const size_t save = i_;
      std::string s;
      if (string(s)) {
        while (string(s)) {
        }  // adjacent literals are one string, as in Python
        out = std::move(s);
        return true;
      }
      i_ = save;
    }
    std::string word;
    if (!identifier(word)) return false;
    if (word == "True" || word == "true") out = true;
    else if (word == "False" || word == "false") out = false;
    else if (word == "None" || word == "null") out = nullptr;
    else return false;
    return true;
  }

  // Appends one string literal's value to `out` (false, position unchanged, when there is none).
  bool string(std::string& out) {
    const size_t save = i_;
    skip_space();
    bool raw = false;
    if (i_ < s_.size() && (s_[i_] == 'r' || s_[i_] == 'R')) raw = true, ++i_;
    else if (i_ < s_.size() && (s_[i_] == 'u' || s_[i_] == 'U')) ++i_;
    if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) {
      i_ = save;
      return false;
    }
    const char q = s_[i_];
    const bool triple = s_.substr(i_, 3) == std::string(3, q);
    i_ += triple ? 3 : 1;
    // The text up to the closing quote (an escaped character never closes it, raw or not).
    const size_t begin = i_;
    for (;; ++i_) {
      if (i_ >= s_.size() || (s_[i_] == '\n' && !triple)) return false;
      if (s_[i_] == '\\') {
        ++i_;
        continue;
      }
      if (s_[i_] == q && (!triple || s_.substr(i_, 3) == std::string(3, q))) break;
    }
    const std::string_view text = s_.substr(begin, i_ - begin);
    i_ += triple ? 3 : 1;
    if (raw) {  // a raw string keeps its backslashes
      out += text;
      return true;
    }
    auto v = jinja::py::unescape(text);  // Python's escapes, as a Jinja string literal's
    if (!v.ok()) return false;
    out += *v;
    return true;
  }

  bool number(ordered_json& out) {
    skip_space();
    std::string digits;  // underscores between digits dropped
    if (i_ < s_.size() && s_[i_] == '-') digits += s_[i_++];
    bool is_float = false, any = false;
    auto run = [&] {
      bool some = false;
      while (i_ < s_.size() && (is_digit(s_[i_]) || (s_[i_] == '_' && some && i_ + 1 < s_.size() && is_digit(s_[i_ + 1])))) {
        if (s_[i_] != '_') digits += s_[i_];
        some = true;
        ++i_;
      }
      return some;
    };
    const size_t int_start = digits.size();
    any = run();
    const size_t int_digits = digits.size() - int_start;
    if (i_ < s_.size() && s_[i_] == '.') {
      digits += s_[i_++];
      is_float = true;
      any = run() || any;
    }
    if (!any) return false;
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      digits += s_[i_++];
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) digits += s_[i_++];
      if (!run()) return false;
      is_float = true;
    }
    if (i_ < s_.size() && (is_ident(s_[i_]) || s_[i_] == '.')) return false;  // 0x10, 1j, 1.2.3
    if (!is_float) {
      if (int_digits > 1 && digits[int_start] == '0') return false;  // 007 is not Python
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec == std::errc() && end == digits.data() + digits.size()) {
        out = v;
        return true;
      }
      uint64_t u = 0;
      const auto [uend, uec] = std::from_chars(digits.data(), digits.data() + digits.size(), u);
      if (uec != std::errc() || uend != digits.data() + digits.size()) return false;  // past 64 bits
      out = u;
      return true;
    }
    double d = 0;  // from_chars: no locale's decimal comma
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    // Out of range (1e999) Python reads as inf, which json.dumps writes as Infinity: not JSON.
    if (ec != std::errc() || end != digits.data() + digits.size() || !std::isfinite(d)) return false;
    out = d;
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

bool is_python_name(std::string_view s) {
  return !s.empty() && is_ident_start(s.front()) && std::all_of(s.begin(), s.end(), is_ident);
}

std::optional<nlohmann::ordered_json> parse_python_value(std::string_view text) {
  ordered_json v;
  Reader r(text);
  if (!r.whole_value(v)) return std::nullopt;
  return v;
}

std::optional<std::vector<PythonCall>> parse_python_calls(std::string_view text) {
  std::vector<PythonCall> out;
  Reader r(text);
  if (!r.calls(out)) return std::nullopt;
  return out;
}

}  // namespace lragent::server
