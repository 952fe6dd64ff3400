// jinja2's number, conversion and JSON filters (abs, int, float, round, sum, center, wordcount,
// and transformers' tojson), for the filter table of filters.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "server/jinja/builtins.h"
#include "server/jinja/eval.h"
#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

namespace {

Result<Value> f_abs(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "abs"));
  if (v.is_integral()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) return filter_error("integer overflow in abs");
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.kind() == Value::Kind::kFloat) return Value::number(std::fabs(v.as_double()));
  return filter_error(fmt::format("TypeError: bad operand type for abs(): '{}'", v.type_name()));
}

Result<Value> f_center(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"width"}, "center"));
  const int64_t width = b[0] ? (b[0]->is_integral() ? b[0]->as_int() : -1) : 80;
  if (b[0] && !b[0]->is_integral()) return filter_error("TypeError: center() width must be an integer");
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  const auto len = static_cast<int64_t>(py::length(s));
  if (width <= len) return Value::string(std::move(s));
  LRA_RETURN_IF_ERROR(in.check_bytes(static_cast<size_t>(width) + s.size()));
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);  // CPython's str.center
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(marg - left), ' '));
}

// Python's float(str): optional sign, digits with single underscores, a fraction, an exponent,
// or inf/infinity/nan; surrounding whitespace allowed.
std::optional<double> parse_float(const std::string& text) {
  std::string s = py::strip(text, std::nullopt, true, true);
  std::string lower = py::lower(s);
  size_t i = 0;
  if (i < lower.size() && (lower[i] == '+' || lower[i] == '-')) ++i;
  const std::string word = lower.substr(i);
  if (word == "inf" || word == "infinity" || word == "nan") {
    const double x = word == "nan" ? std::nan("") : HUGE_VAL;
    return lower[0] == '-' ? -x : x;
  }
  std::string clean = s.substr(0, i);
  bool digits = false, prev_digit = false;
  bool seen_dot = false, seen_e = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = prev_digit = true;
      clean.push_back(c);
    } else if (c == '_' && prev_digit && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      prev_digit = false;
    } else if (c == '.' && !seen_dot && !seen_e) {
      seen_dot = true;
      prev_digit = false;
      clean.push_back(c);
    } else if ((c == 'e' || c == 'E') && digits && !seen_e) {
      seen_e = true;
      digits = prev_digit = false;
      clean.push_back(c);
      if (i + 1 < s.size() && (s[i + 1] == '+' || s[i + 1] == '-')) clean.push_back(s[++i]);
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

// Python's int(str, base): whitespace, a sign, an optional base prefix, digits with single
// underscores. nullopt: not an integer (or past 64 bits).
std::optional<int64_t> parse_int(const std::string& text, int base) {
  std::string s = py::strip(text, std::nullopt, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == 0 || base == pb)) {
      base = pb;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || i >= s.size()) return std::nullopt;
  uint64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = static_cast<char>(s[i] | 0x20);
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    if (s[i] == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    }
    if (d >= base) return std::nullopt;
    if (v > (uint64_t{1} << 63) / static_cast<uint64_t>(base)) return std::nullopt;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  if (!prev_digit || v > (uint64_t{1} << 63) - (neg ? 0 : 1)) return std::nullopt;
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

Result<Value> f_float(Interp&, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"default"}, "float"));
  if (v.is_undefined())
    return filter_error(v.str().empty() ? "value is undefined" : v.str());  // float(Undefined) raises
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string())
    if (auto d = parse_float(v.str())) return Value::number(*d);
  return b[0] ? *b[0] : Value::number(0.0);
}

Result<Value> f_int(Interp&, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"default", "base"}, "int"));
  const Value fallback = b[0] ? *b[0] : Value::integer(0);
  if (v.is_undefined()) return filter_error(v.str().empty() ? "value is undefined" : v.str());  // int(Undefined) raises
  if (v.is_integral()) return Value::integer(v.as_int());
  std::optional<double> d;
  if (v.kind() == Value::Kind::kFloat) {
    d = v.as_double();
  } else if (v.is_string()) {
    const int base = b[1] && b[1]->is_integral() ? static_cast<int>(b[1]->as_int()) : 10;
    if (auto i = parse_int(v.str(), base)) return Value::integer(*i);
    d = parse_float(v.str());
  }
  if (!d || std::isnan(*d)) return fallback;
  if (std::isinf(*d)) return filter_error("OverflowError: cannot convert float infinity to integer");
  if (std::fabs(*d) >= 9.2233720368547758e18) return filter_error("integer overflow (lragent's ints are 64-bit)");
  return Value::integer(static_cast<int64_t>(*d));
}

// Python's round(x, n) for floats: correctly rounded (half to even on the exact binary value),
// which printf's %.*f gives.
double round_float(double x, int64_t n) {
  if (!std::isfinite(x) || n > 320) return x;
  if (n >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  if (n < -320) return std::copysign(0.0, x);
  const double p = std::pow(10.0, static_cast<double>(-n));
  return std::nearbyint(x / p) * p;
}

Result<Value> f_round(Interp&, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"precision", "method"}, "round"));
  if (b[0] && !b[0]->is_integral()) return filter_error("TypeError: round() precision must be an integer");
  const int64_t prec = b[0] ? b[0]->as_int() : 0;
  const std::string method = b[1] ? to_str(*b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    return filter_error("method must be common, ceil or floor");
  if (!v.is_number())
    return filter_error(fmt::format("TypeError: type {} doesn't define __round__ method", v.type_name()));
  if (method == "common") {
    if (v.is_integral()) {
      if (prec >= 0) return Value::integer(v.as_int());
      return Value::integer(static_cast<int64_t>(round_float(static_cast<double>(v.as_int()), prec)));
    }
    return Value::number(round_float(v.as_double(), prec));
  }
  const double p = std::pow(10.0, static_cast<double>(prec));
  const double x = v.as_double() * p;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Result<Value> f_sum(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"attribute", "start"}, "sum"));
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  Value total = b[1] ? *b[1] : Value::integer(0);
  if (total.is_string()) return filter_error("TypeError: sum() can't sum strings [use ''.join(seq) instead]");
  for (const Value& item : items) {
    Value x = item;
    if (b[0] && !b[0]->is_none()) {
      LRA_ASSIGN_OR_RETURN(x, attribute_path(in, item, *b[0]));
    }
    LRA_ASSIGN_OR_RETURN(total, binary_op(in, BinOp::kAdd, total, x));
  }
  return total;
}

Result<Value> f_tojson(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson"));
  JsonOptions o;
  o.ensure_ascii = flag(b[0], false);
  o.sort_keys = flag(b[3], false);
  o.max_bytes = in.options().max_output_bytes;
  if (b[1] && !b[1]->is_none()) {
    if (b[1]->is_string()) {
      o.indent = b[1]->str();
    } else if (b[1]->is_integral()) {
      LRA_RETURN_IF_ERROR(in.check_bytes(static_cast<size_t>(std::max<int64_t>(b[1]->as_int(), 0))));
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(b[1]->as_int(), 0)), ' ');
    } else {
      return filter_error(fmt::format("TypeError: can't multiply sequence by non-int of type '{}'", b[1]->type_name()));
    }
  }
  if (b[2] && !b[2]->is_none()) {
    const auto& sep = b[2]->items();
    if (!b[2]->is_sequence() || sep.size() != 2 || !sep[0].is_string() || !sep[1].is_string())
      return filter_error("tojson separators must be a pair of strings");
    o.separators = std::make_pair(sep[0].str(), sep[1].str());
  }
  LRA_ASSIGN_OR_RETURN(std::string s, dump_json(v, o));
  return Value::string(std::move(s));
}

Result<Value> f_wordcount(Interp& in, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "wordcount"));
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : py::decode(s)) {
    const bool w = py::is_word(c);
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value::integer(words);
}

}  // namespace

const std::vector<std::pair<std::string_view, FilterFn>>& number_filters() {
  static const std::vector<std::pair<std::string_view, FilterFn>> table = {
      {"abs", f_abs},     {"center", f_center}, {"float", f_float},   {"int", f_int},
      {"round", f_round}, {"sum", f_sum},       {"tojson", f_tojson}, {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace lragent::server::jinja
