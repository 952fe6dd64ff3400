#include "server/jinja/pystr.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "tokenizer/unicode.h"

namespace lragent::server::jinja::py {

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int n = 0;
    char32_t c = 0, min = 0;
    if ((b0 & 0xE0) == 0xC0)
      n = 1, c = b0 & 0x1F, min = 0x80;
    else if ((b0 & 0xF0) == 0xE0)
      n = 2, c = b0 & 0x0F, min = 0x800;
    else if ((b0 & 0xF8) == 0xF0)
      n = 3, c = b0 & 0x07, min = 0x10000;
    bool ok = n > 0 && i + n < s.size();
    for (int k = 1; ok && k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      c = (c << 6) | (b & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8.
    if (ok && (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back(0xDC00 + b0);
      ++i;
      continue;
    }
    out.push_back(c);
    i += n + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // an undecodable byte (decode), written back as it was
    out.push_back(static_cast<char>(c - 0xDC00));
  } else {
    unicode::append_utf8(out, c);
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode(s).size();
}

// Unicode White_Space plus the separators U+001C..U+001F, as Python counts them.
bool is_space(char32_t c) { return unicode::is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c - 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
  if (c == 0x3C2) return 0x3A3;
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 0x20;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
    return (c & 1) ? c - 1 : c;
  if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c : c - 1;
  if (c == 0x4CF) return 0x4C0;
  if (c >= 0x561 && c <= 0x586) return c - 0x30;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 0x20;
  return c;
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if (c == 0x130) return 'i';  // Python gives "i\u0307"; lower() below writes both
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c : c + 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
    return (c & 1) ? c : c + 1;
  if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c + 1 : c;
  if (c == 0x4C0) return 0x4CF;
  if (c >= 0x531 && c <= 0x556) return c + 0x30;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 0x20;
  return c;
}

bool is_cased(char32_t c) { return to_upper(c) != c || to_lower(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return is_cased(c) || c == 0xAA || c == 0xBA || (c >= 0x3040 && c <= 0x30FF && c != 0x30FB) ||
         (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) ||
         (c >= 0x5D0 && c <= 0x5EA) || (c >= 0x620 && c <= 0x64A);
}

bool is_digit(char32_t c) {
  return (c >= '0' && c <= '9') || c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0x660 && c <= 0x669) ||
         (c >= 0x6F0 && c <= 0x6F9) || (c >= 0x966 && c <= 0x96F) || (c >= 0xFF10 && c <= 0xFF19);
}

bool is_word(char32_t c) { return c == '_' || is_alpha(c) || is_digit(c); }

bool is_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c < 0x600) return true;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x890 || c == 0x891 || c == 0x8E2 ||
      c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || (c >= 0xD800 && c <= 0xF8FF) ||
      (c >= 0xFDD0 && c <= 0xFDEF) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || c == 0x110BD || c == 0x110CD ||
      (c >= 0x13430 && c <= 0x1343F) || (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A) ||
      c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) || c >= 0xF0000)
    return false;
  return (c & 0xFFFE) != 0xFFFE;  // U+xFFFE and U+xFFFF of every plane are noncharacters
}

namespace {

template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s)) f(out, c);
  return out;
}

void put_upper(std::string& out, char32_t c) {
  if (c == 0xDF)
    out += "SS";
  else
    append_utf8(out, to_upper(c));
}

void put_title(std::string& out, char32_t c) {
  if (c == 0xDF)
    out += "Ss";
  else
    append_utf8(out, to_upper(c));
}

void put_lower(std::string& out, char32_t c) {
  append_utf8(out, to_lower(c));
  if (c == 0x130) append_utf8(out, 0x307);
}

}  // namespace

std::string upper(std::string_view s) { return map_chars(s, put_upper); }
std::string lower(std::string_view s) { return map_chars(s, put_lower); }

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_chars(s, [&](std::string& out, char32_t c) {
    if (first)
      put_title(out, c);
    else
      put_lower(out, c);
    first = false;
  });
}

std::string title(std::string_view s) {
  bool previous_cased = false;
  return map_chars(s, [&](std::string& out, char32_t c) {
    if (previous_cased)
      put_lower(out, c);
    else
      put_title(out, c);
    previous_cased = is_cased(c);
  });
}

bool is_lower(std::string_view s) {
  bool any = false;
  for (char32_t c : decode(s)) {
    if (!is_cased(c)) continue;
    if (to_lower(c) != c) return false;
    any = true;
  }
  return any;
}

bool is_upper(std::string_view s) {
  bool any = false;
  for (char32_t c : decode(s)) {
    if (!is_cased(c)) continue;
    if (to_upper(c) != c || c == 0xDF || c == 0x138 || c == 0x149) return false;
    any = true;
  }
  return any;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  const std::u32string u = decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strippable(u[b])) ++b;
  if (right)
    while (e > b && strippable(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::string escape_code_point(char32_t c) {
  char buf[16];
  if (c < 0x100)
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
  else if (c < 0x10000)
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
  else
    std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
  return buf;
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_printable(c) || (c >= 0xDC80 && c <= 0xDCFF)) {
      out += escape_code_point(c);
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

std::string repr_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  // Shortest round-trip digits as d.ddde±x; Python's repr then picks fixed or exponent notation.
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::atoi(sci.c_str() + epos + 1);
  const int decpt = exp + 1;  // digits d1 d2 ... with the point after the decpt-th digit
  const int nd = static_cast<int>(digits.size());
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= nd) {
      out += digits + std::string(decpt - nd, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (nd > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[16];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

Result<std::string> unescape(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 >= raw.size()) {
      out.push_back(raw[i]);
      continue;
    }
    const char n = raw[++i];
    auto hex = [&](int count) -> Result<char32_t> {
      char32_t v = 0;
      for (int k = 1; k <= count; ++k) {
        if (i + k >= raw.size() || !std::isxdigit(static_cast<unsigned char>(raw[i + k])))
          return Error{ErrorCode::kInvalidArgument, fmt::format("truncated \\{} escape in a string", n)};
        const char h = static_cast<char>(raw[i + k] | 0x20);
        v = v * 16 + static_cast<char32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
      }
      i += count;
      return v;
    };
    switch (n) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x':
      case 'u':
      case 'U': {
        LRA_ASSIGN_OR_RETURN(char32_t c, hex(n == 'x' ? 2 : n == 'u' ? 4 : 8));
        if (c > 0x10FFFF) return Error{ErrorCode::kInvalidArgument, "illegal Unicode character escape in a string"};
        if (c >= 0xD800 && c <= 0xDFFF)
          return Error{ErrorCode::kInvalidArgument, "a surrogate code point escape in a string (not UTF-8 text)"};
        append_utf8(out, c);
        break;
      }
      case 'N': return Error{ErrorCode::kInvalidArgument, "\\N{...} escapes are not supported"};
      default:
        if (n >= '0' && n <= '7') {
          char32_t c = static_cast<char32_t>(n - '0');
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k)
            c = c * 8 + static_cast<char32_t>(raw[++i] - '0');
          append_utf8(out, c);
        } else if (static_cast<unsigned char>(n) >= 0x80) {
          // jinja2 backslash-escapes non-ASCII text before decoding, so "\é" is "\xe9".
          size_t len = 1;
          while (i + len < raw.size() && (static_cast<unsigned char>(raw[i + len]) & 0xC0) == 0x80) ++len;
          out += escape_code_point(decode(raw.substr(i, len))[0]);
          i += len - 1;
        } else {
          out.push_back('\\');
          out.push_back(n);
        }
    }
  }
  return out;
}

}  // namespace lragent::server::jinja::py
