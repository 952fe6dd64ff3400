// Python's string formatting: printf-style `str % args` (jinja2's format filter) and
// str.format with its format-spec mini-language (fill, align, sign, #, 0, width, grouping,
// precision, type). Field names are indexes or keyword names; attribute and item lookups inside a
// field ("{0.name}") and nested fields in a spec are not supported (an error).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "server/jinja/builtins.h"
#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

namespace {

constexpr int64_t kMaxWidth = 1 << 20;  // a field padded wider than this is refused

Error type_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, "TypeError: " + what}; }
Error value_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, "ValueError: " + what}; }

std::string digits_in_base(uint64_t v, int base, bool upper) {
  if (v == 0) return "0";
  std::string s;
  const char* d = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  while (v) {
    s.insert(s.begin(), d[v % static_cast<uint64_t>(base)]);
    v /= static_cast<uint64_t>(base);
  }
  return s;
}

uint64_t magnitude(int64_t v) { return v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

std::string pad_to(std::string s, int64_t width, char32_t fill, char align, size_t split = 0) {
  const int64_t len = static_cast<int64_t>(py::length(s));
  if (width <= len) return s;
  std::string f;
  py::append_utf8(f, fill);
  const auto n = static_cast<size_t>(width - len);
  auto fills = [&](size_t k) {
    std::string r;
    for (size_t i = 0; i < k; ++i) r += f;
    return r;
  };
  switch (align) {
    case '<': return s + fills(n);
    case '^': return fills(n / 2) + s + fills(n - n / 2);
    case '=': return s.substr(0, split) + fills(n) + s.substr(split);
    default: return fills(n) + s;
  }
}

// The integer a %d / {:d} conversion takes: ints and bools as they are, floats truncated.
Result<int64_t> to_integer(const Value& v, char conv, bool allow_float) {
  if (v.is_integral()) return v.as_int();
  if (v.kind() == Value::Kind::kFloat && allow_float) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return value_error("cannot convert float to a 64-bit integer");
    return static_cast<int64_t>(d);
  }
  return type_error(fmt::format("%{} format: a real number is required, not {}", conv, v.type_name()));
}

Result<std::string> bounded_str(const Value& v, bool as_repr, size_t max_bytes) {
  std::string out;
  if (!(as_repr ? append_repr(out, v, max_bytes) : append_str(out, v, max_bytes)))
    return Error{ErrorCode::kInvalidArgument, fmt::format("formatted text is larger than {} bytes", max_bytes)};
  return out;
}

Result<std::string> percent_one(const Value& arg, char t, const std::string& flags, int64_t width, int64_t prec,
                                size_t max_bytes) {
  const bool left = flags.find('-') != std::string::npos;
  const bool zero = flags.find('0') != std::string::npos && !left;
  const bool alt = flags.find('#') != std::string::npos;
  const std::string sign_flag = flags.find('+') != std::string::npos   ? "+"
                                : flags.find(' ') != std::string::npos ? " "
                                                                       : "";
  if (t == 's' || t == 'r' || t == 'a') {
    LRA_ASSIGN_OR_RETURN(std::string s, bounded_str(arg, t != 's', max_bytes));
    if (prec >= 0) s = py::encode(py::decode(s).substr(0, static_cast<size_t>(prec)));
    return pad_to(s, width, ' ', left ? '<' : '>');
  }
  if (t == 'c') {
    if (arg.is_string() && py::length(arg.str()) == 1) return pad_to(arg.str(), width, ' ', left ? '<' : '>');
    if (!arg.is_integral()) return type_error("%c requires int or char");
    if (arg.as_int() < 0 || arg.as_int() > 0x10FFFF)
      return Error{ErrorCode::kInvalidArgument, "OverflowError: %c arg not in range(0x110000)"};
    std::string s;
    py::append_utf8(s, static_cast<char32_t>(arg.as_int()));
    return pad_to(s, width, ' ', left ? '<' : '>');
  }
  if (t == 'd' || t == 'i' || t == 'u' || t == 'x' || t == 'X' || t == 'o') {
    const bool decimal = t == 'd' || t == 'i' || t == 'u';
    if (!decimal && arg.kind() == Value::Kind::kFloat)
      return type_error(fmt::format("%{} format: an integer is required, not float", t));
    LRA_ASSIGN_OR_RETURN(int64_t v, to_integer(arg, t, true));
    std::string digits = digits_in_base(magnitude(v), decimal ? 10 : t == 'o' ? 8 : 16, t == 'X');
    if (prec > static_cast<int64_t>(digits.size())) digits.insert(0, static_cast<size_t>(prec) - digits.size(), '0');
    std::string prefix = v < 0 ? "-" : sign_flag;
    if (alt && !decimal) prefix += t == 'o' ? "0o" : t == 'x' ? "0x" : "0X";
    if (zero) return pad_to(prefix + digits, width, '0', '=', prefix.size());
    return pad_to(prefix + digits, width, ' ', left ? '<' : '>');
  }
  if (t == 'e' || t == 'E' || t == 'f' || t == 'F' || t == 'g' || t == 'G') {
    if (!arg.is_number()) return type_error(fmt::format("must be real number, not {}", arg.type_name()));
    std::string cfmt =
        "%" + flags + std::to_string(width < 0 ? 0 : width) + "." + std::to_string(prec < 0 ? 6 : prec) + t;
    const int n = std::snprintf(nullptr, 0, cfmt.c_str(), arg.as_double());
    std::string out(static_cast<size_t>(n > 0 ? n : 0), '\0');
    std::snprintf(out.data(), out.size() + 1, cfmt.c_str(), arg.as_double());
    return out;
  }
  return value_error(fmt::format("unsupported format character '{}' (0x{:x})", t, static_cast<unsigned char>(t)));
}

struct Spec {
  char32_t fill = ' ';
  char align = 0;
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

Result<Spec> parse_spec(const std::string& text) {
  Spec s;
  const std::u32string u = py::decode(text);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  if (u.size() >= 2 && is_align(u[1])) {
    s.fill = u[0];
    s.align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && is_align(u[0])) {
    s.align = static_cast<char>(u[0]);
    i = 1;
  }
  if (i < u.size() && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) s.sign = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == '#') s.alt = true, ++i;
  if (i < u.size() && u[i] == '0') s.zero = true, ++i;
  auto number = [&](int64_t* out) {
    if (i >= u.size() || u[i] < '0' || u[i] > '9') return;
    *out = 0;
    while (i < u.size() && u[i] >= '0' && u[i] <= '9')
      *out = std::min<int64_t>(*out * 10 + (u[i++] - '0'), kMaxWidth + 1);
  };
  number(&s.width);
  if (i < u.size() && (u[i] == ',' || u[i] == '_')) s.grouping = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == '.') {
    ++i;
    number(&s.precision);
    if (s.precision < 0) return value_error("Format specifier missing precision");
  }
  if (i < u.size() && u[i] < 0x80) s.type = static_cast<char>(u[i++]);
  if (i != u.size()) return value_error("Invalid format specifier");
  if (s.width > kMaxWidth || s.precision > kMaxWidth) return value_error("format width or precision too large");
  if (s.zero && !s.align) {
    s.fill = '0';
    s.align = '=';
  }
  return s;
}

std::string group(const std::string& digits, char sep, size_t every) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

Result<std::string> format_value(const Value& v, const std::string& spec_text, size_t max_bytes) {
  if (spec_text.empty()) return bounded_str(v, false, max_bytes);
  LRA_ASSIGN_OR_RETURN(Spec s, parse_spec(spec_text));
  if (v.is_string()) {
    if (s.type && s.type != 's')
      return value_error(fmt::format("Unknown format code '{}' for object of type 'str'", s.type));
    if (s.sign != '-' || s.alt || s.align == '=') return value_error("invalid format specifier for a string");
    std::string str = v.str();
    if (s.precision >= 0) str = py::encode(py::decode(str).substr(0, static_cast<size_t>(s.precision)));
    return pad_to(str, s.width, s.fill, s.align ? s.align : '<');
  }
  if (!v.is_number())
    return type_error(fmt::format("unsupported format string passed to {}.__format__", v.type_name()));
  const bool as_int = v.is_integral() && (s.type == 0 || std::string("bcdoxXn").find(s.type) != std::string::npos);
  std::string sign, prefix, body;
  if (as_int) {
    if (s.precision >= 0) return value_error("Precision not allowed in integer format specifier");
    const int64_t x = v.as_int();
    const char t = s.type ? s.type : 'd';
    if (t == 'c') {
      if (x < 0 || x > 0x10FFFF)
        return Error{ErrorCode::kInvalidArgument, "OverflowError: %c arg not in range(0x110000)"};
      py::append_utf8(body, static_cast<char32_t>(x));
    } else {
      const int base = t == 'b' ? 2 : t == 'o' ? 8 : (t == 'x' || t == 'X') ? 16 : 10;
      body = digits_in_base(magnitude(x), base, t == 'X');
      if (s.grouping) body = group(body, s.grouping, base == 10 ? 3 : 4);
      if (s.alt && base != 10) prefix = t == 'b' ? "0b" : t == 'o' ? "0o" : t == 'x' ? "0x" : "0X";
    }
    sign = x < 0 ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
  } else {
    double d = v.as_double();
    const char t = s.type;
    if (t && std::string("eEfFgG%n").find(t) == std::string::npos)
      return value_error(fmt::format("Unknown format code '{}' for object of type 'float'", t));
    sign = std::signbit(d) && !std::isnan(d) ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
    d = std::fabs(d);
    if (t == 0 && s.precision < 0) {
      body = py::repr_float(d);
    } else {
      const char ct = t == 0 || t == 'n' ? 'g' : t == '%' ? 'f' : t;
      const std::string cfmt =
          std::string("%") + (s.alt ? "#" : "") + "." + std::to_string(s.precision < 0 ? 6 : s.precision) + ct;
      const double x = t == '%' ? d * 100 : d;
      const int n = std::snprintf(nullptr, 0, cfmt.c_str(), x);
      body.assign(static_cast<size_t>(n > 0 ? n : 0), '\0');
      std::snprintf(body.data(), body.size() + 1, cfmt.c_str(), x);
      if (t == 0 && body.find_first_of(".en") == std::string::npos) body += ".0";
      if (t == '%') body += "%";
    }
    if (s.grouping) {
      const size_t int_end = body.find_first_not_of("0123456789");
      body = group(body.substr(0, int_end), s.grouping, 3) + (int_end == std::string::npos ? "" : body.substr(int_end));
    }
  }
  const std::string all = sign + prefix + body;
  return pad_to(all, s.width, s.fill, s.align ? s.align : '>', sign.size() + prefix.size());
}

}  // namespace

Result<std::string> percent_format(const std::string& fmt, const Value& args, size_t max_bytes) {
  std::vector<Value> pos;
  const DictData* mapping = nullptr;
  if (args.kind() == Value::Kind::kTuple) {
    pos = args.items();
  } else {
    if (args.is_dict()) mapping = &args.dict_data();
    pos = {args};
  }
  // Python treats any argument with __getitem__ (a list, jinja2's Undefined) as a mapping, which
  // may go unused.
  const bool mapping_like = mapping || args.is_undefined() || args.kind() == Value::Kind::kList;
  size_t next = 0;
  std::string out;
  auto next_arg = [&]() -> Result<Value> {
    if (next >= pos.size()) return type_error("not enough arguments for format string");
    return pos[next++];
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return value_error("incomplete format");
    std::optional<Value> arg;
    if (fmt[i] == '(') {
      if (args.is_undefined())
        return Error{ErrorCode::kInvalidArgument, args.str().empty() ? "value is undefined" : args.str()};
      if (!mapping) return type_error("format requires a mapping");
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) return value_error("incomplete format key");
      const Value* v = mapping->find(Value::string(fmt.substr(i + 1, close - i - 1)));
      if (!v)
        return Error{ErrorCode::kInvalidArgument, "KeyError: " + py::repr_string(fmt.substr(i + 1, close - i - 1))};
      arg = *v;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags.push_back(fmt[i++]);
    auto number = [&](int64_t* out_n) -> Status {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        LRA_ASSIGN_OR_RETURN(Value w, next_arg());
        if (!w.is_integral()) return type_error("* wants int");
        *out_n = w.as_int();
        if (*out_n < 0) {
          flags.push_back('-');
          *out_n = -*out_n;
        }
      }
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9')
        *out_n = std::min<int64_t>(std::max<int64_t>(*out_n, 0) * 10 + (fmt[i++] - '0'), kMaxWidth + 1);
      if (*out_n > kMaxWidth) return value_error("format width or precision too large");
      return Status::Ok();
    };
    int64_t width = -1, prec = -1;
    LRA_RETURN_IF_ERROR(number(&width));
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = 0;
      LRA_RETURN_IF_ERROR(number(&prec));
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) return value_error("incomplete format");
    const char t = fmt[i];
    if (t == '%') {
      out.push_back('%');
      continue;
    }
    if (!arg) {
      LRA_ASSIGN_OR_RETURN(arg, next_arg());
    }
    LRA_ASSIGN_OR_RETURN(std::string piece, percent_one(*arg, t, flags, width, prec, max_bytes));
    out += piece;
    if (out.size() > max_bytes) return bounded_str(Value::string(out), false, max_bytes);
  }
  if (next < pos.size() && !mapping_like) return type_error("not all arguments converted during string formatting");
  return out;
}

Result<std::string> str_format(const std::string& fmt, const CallArgs& args, size_t max_bytes) {
  std::string out;
  size_t auto_index = 0;
  int numbering = 0;  // 1: automatic ({}), 2: manual ({0}); Python refuses a mix
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return value_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) return value_error("Single '{' encountered in format string");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string::npos) return value_error("nested format fields are not supported");
    i = close;
    const size_t name_end = field.find_first_of("!:");
    const std::string name = field.substr(0, name_end);
    char conversion = 0;
    std::string spec;
    if (name_end != std::string::npos) {
      size_t p = name_end;
      if (field[p] == '!') {
        if (p + 1 >= field.size()) return value_error("end of string while looking for conversion specifier");
        conversion = field[p + 1];
        p += 2;
        if (p < field.size() && field[p] != ':') return value_error("expected ':' after conversion specifier");
      }
      if (p < field.size()) spec = field.substr(p + 1);
    }
    Value v;
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) {
      size_t index = auto_index;
      if (name.empty()) {
        if (numbering == 2)
          return value_error("cannot switch from manual field specification to automatic field numbering");
        numbering = 1;
        ++auto_index;
      } else {
        if (numbering == 1)
          return value_error("cannot switch from automatic field numbering to manual field specification");
        numbering = 2;
        if (name.find_first_not_of("0123456789") != std::string::npos || name.size() > 9)
          return value_error("attribute and item lookups in format fields are not supported");
        index = std::stoul(name);
      }
      if (index >= args.pos.size())
        return Error{ErrorCode::kInvalidArgument,
                     fmt::format("IndexError: Replacement index {} out of range for positional args tuple", index)};
      v = args.pos[index];
    } else {
      if (name.find_first_of(".[") != std::string::npos)
        return value_error("attribute and item lookups in format fields are not supported");
      auto it = std::find_if(args.kw.begin(), args.kw.end(), [&](const auto& kv) { return kv.first == name; });
      if (it == args.kw.end()) return Error{ErrorCode::kInvalidArgument, "KeyError: " + py::repr_string(name)};
      v = it->second;
    }
    if (conversion == 'r' || conversion == 'a' || conversion == 's') {
      LRA_ASSIGN_OR_RETURN(std::string text, bounded_str(v, conversion != 's', max_bytes));
      v = Value::string(std::move(text));
    } else if (conversion) {
      return value_error(fmt::format("Unknown conversion specifier {}", conversion));
    }
    LRA_ASSIGN_OR_RETURN(std::string piece, format_value(v, spec, max_bytes));
    out += piece;
    if (out.size() > max_bytes) return bounded_str(Value::string(out), false, max_bytes);
  }
  return out;
}

}  // namespace lragent::server::jinja
