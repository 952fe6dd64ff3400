#include "core/config_file.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>

namespace lragent {
namespace {

constexpr const char* kExpectedKey =
    "expected `flag-name: value` (a flag's long name without \"--\", then ': ' and its value)";
constexpr const char* kUnendedList = "a list [...] does not end on its line (write one \"- item\" a line instead)";

// One line being read: its text, number and where the reading is.
struct Line {
  std::string_view text;
  int number = 0;
  size_t at = 0;

  bool end() const { return at >= text.size(); }
  char peek() const { return end() ? '\0' : text[at]; }
  void skip_spaces() {
    while (!end() && text[at] == ' ') ++at;
  }
  // The rest is blank or a comment.
  bool rest_blank() const {
    size_t i = at;
    while (i < text.size() && text[i] == ' ') ++i;
    return i == text.size() || text[i] == '#';
  }
};

class Parser {
 public:
  explicit Parser(const std::string& source) : source_(source) {}

  Error error(const Line& l, std::string_view what) const {
    return Error{ErrorCode::kInvalidArgument, fmt::format("{}, line {}: {}", source_, l.number, what)};
  }

  // A quoted scalar starting at l.at (its quote), to `out`; l.at moves past the closing quote.
  Status quoted(Line& l, std::string* out) const {
    const char q = l.text[l.at++];
    for (;;) {
      if (l.end())
        return error(l, fmt::format("a {} string does not end on its line (a quoted value must be on one line)",
                                    q == '"' ? "double-quoted" : "single-quoted"));
      const char c = l.text[l.at++];
      if (c == q) {
        if (q == '\'' && l.peek() == '\'') {  // '' is a quote in a single-quoted string
          ++l.at;
          out->push_back('\'');
          continue;
        }
        return Status::Ok();
      }
      if (c != '\\' || q == '\'') {
        out->push_back(c);
        continue;
      }
      if (l.end()) return error(l, "a '\\' ends the line inside a double-quoted string");
      const char e = l.text[l.at++];
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case '0': out->push_back('\0'); break;
        case 'e': out->push_back('\x1b'); break;
        case ' ': out->push_back(' '); break;
        case 'x': case 'u': case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < digits; ++k) {
            const char h = l.peek();
            const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (v < 0) return error(l, fmt::format("'\\{}' needs {} hexadecimal digits", e, digits));
            cp = cp * 16 + static_cast<uint32_t>(v);
            ++l.at;
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return error(l, fmt::format("'\\{}' names no Unicode character (U+{:X})", e, cp));
          put_utf8(out, cp);
          break;
        }
        default:
          return error(l, fmt::format("'\\{}' is not an escape of a double-quoted string (write '\\\\' for a "
                                      "backslash, or single-quote the value)", e));
      }
    }
  }

  // A plain scalar from l.at up to `stops` (a flow list's ',' and ']'), a " #" comment or the
  // line's end; trimmed.
  Result<std::string> plain(Line& l, std::string_view stops) const {
    const size_t begin = l.at;
    while (!l.end()) {
      const char c = l.text[l.at];
      if (stops.find(c) != std::string_view::npos) break;
      if (c == '#' && l.at > begin && l.text[l.at - 1] == ' ') break;
      ++l.at;
    }
    std::string_view v = l.text.substr(begin, l.at - begin);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    if (v == "null" || v == "~" || v == "Null" || v == "NULL")
      return error(l, "null is not a flag's value: leave the key out for its default");
    if (!v.empty()) {
      const char c = v.front();
      if (c == '&' || c == '*') return error(l, "anchors and aliases (& and *) are not read: write the value itself");
      if (c == '!') return error(l, "tags (!) are not read: write the value itself");
      if (c == '|' || c == '>')
        return error(l, "block scalars (| and >) are not read: write the value on one line, quoted");
      if (c == '{' || c == '[')
        return error(l, "a list or mapping inside a list is not read: quote it");
    }
    return std::string(v);
  }

  // A scalar (quoted or plain) at l.at.
  Result<std::string> scalar(Line& l, std::string_view stops) const {
    if (l.peek() == '"' || l.peek() == '\'') {
      std::string v;
      LRA_RETURN_IF_ERROR(quoted(l, &v));
      return v;
    }
    return plain(l, stops);
  }

  // A flow list "[a, 'b', "c"]" at l.at, to the line's end.
  Status flow_list(Line& l, std::vector<std::string>* out) const {
    ++l.at;  // '['
    l.skip_spaces();
    if (l.peek() == ']') {
      ++l.at;
      return Status::Ok();
    }
    for (;;) {
      l.skip_spaces();
      if (l.end()) return error(l, kUnendedList);
      LRA_ASSIGN_OR_RETURN(std::string v, scalar(l, ",]"));
      out->push_back(std::move(v));
      l.skip_spaces();
      if (l.end()) return error(l, kUnendedList);
      if (l.peek() == ',') {
        ++l.at;
        continue;
      }
      if (l.peek() == ']') {
        ++l.at;
        return Status::Ok();
      }
      return error(l, "a list's item is followed by neither ',' nor ']'");
    }
  }

  Result<std::vector<ConfigEntry>> parse(std::string_view text) {
    std::vector<ConfigEntry> out;
    std::set<std::string> seen;
    bool open_list = false;  // the last key had no value: "- item" lines may follow
    int number = 0;
    for (size_t pos = 0; pos <= text.size();) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      Line l{text.substr(pos, nl - pos), ++number, 0};
      pos = nl + 1;
      if (!l.text.empty() && l.text.back() == '\r') l.text.remove_suffix(1);
      if (number == 1 && l.text.substr(0, 3) == "\xEF\xBB\xBF") l.at = 3;  // a UTF-8 byte order mark
      const size_t first = l.text.find_first_not_of(" \t", l.at);
      if (first == std::string_view::npos || l.text[first] == '#') continue;  // blank, or a comment
      if (l.text.find('\t', l.at) < first) return error(l, "a tab indents the line: YAML indents with spaces");
      const std::string_view rest = l.text.substr(l.at);
      if ((rest.substr(0, 3) == "---" || rest.substr(0, 3) == "...") && (rest.size() == 3 || rest[3] == ' ')) {
        open_list = false;
        continue;
      }
      // An item of the list the last key opened: indented, or "- " at the line's start (YAML's
      // compact form).
      const bool dash = l.text[l.at] == '-' && (l.at + 1 == l.text.size() || l.text[l.at + 1] == ' ');
      if (l.text[l.at] == ' ' || (dash && open_list)) {
        l.skip_spaces();
        if (!open_list || l.peek() != '-' || (l.at + 1 < l.text.size() && l.text[l.at + 1] != ' '))
          return error(l, open_list ? "an indented line here must be a list item \"- value\""
                                 : "an indented line belongs to no key (nested mappings are not read: write a "
                                   "mapping's value on one line as JSON, {\"key\": value})");
        ++l.at;
        l.skip_spaces();
        if (l.peek() == '[' || l.peek() == '{' || l.peek() == '-')
          return error(l, "nested lists are not read: quote the item");
        LRA_ASSIGN_OR_RETURN(std::string v, scalar(l, ""));
        if (!l.rest_blank()) return error(l, "text after a quoted item");
        out.back().values.push_back(std::move(v));
        continue;
      }
      if (open_list && out.back().values.empty())
        return error(l, fmt::format("the key before this line ('{}') has no value", out.back().key));
      open_list = false;
      // key: value
      size_t k = l.at;
      while (k < l.text.size() && (std::isalnum(static_cast<unsigned char>(l.text[k])) || l.text[k] == '-' ||
                                   l.text[k] == '_'))
        ++k;
      if (k == l.at || k >= l.text.size() || l.text[k] != ':' || (k + 1 < l.text.size() && l.text[k + 1] != ' '))
        return error(l, kExpectedKey);
      ConfigEntry e;
      e.key = std::string(l.text.substr(l.at, k - l.at));
      std::replace(e.key.begin(), e.key.end(), '_', '-');
      if (e.key.front() == '-') {  // "--model: x", or only dashes
        const size_t name = e.key.find_first_not_of('-');
        if (name == std::string::npos) return error(l, kExpectedKey);
        return error(l, fmt::format("write the flag's name without the leading \"-\": '{}'", e.key.substr(name)));
      }
      e.line = number;
      if (!seen.insert(e.key).second)
        return error(l, fmt::format("'{}' is given twice", e.key));
      l.at = k + 1;
      l.skip_spaces();
      if (l.rest_blank()) {  // "- item" lines follow
        e.list = true;
        open_list = true;
      } else if (l.peek() == '[') {
        e.list = true;
        LRA_RETURN_IF_ERROR(flow_list(l, &e.values));
      } else if (l.peek() == '{') {  // a mapping, kept as written: JSON for the flags that take it
        const size_t begin = l.at;
        const size_t close = l.text.rfind('}');
        if (close == std::string_view::npos || close < begin)
          return error(l, "a mapping {...} does not end on its line");
        e.values.emplace_back(l.text.substr(begin, close + 1 - begin));
        l.at = close + 1;
      } else {
        LRA_ASSIGN_OR_RETURN(std::string v, scalar(l, ""));
        e.values.push_back(std::move(v));
      }
      if (!l.rest_blank()) return error(l, "text after the value (quote it all)");
      out.push_back(std::move(e));
    }
    if (open_list && out.back().values.empty())
      return Result<std::vector<ConfigEntry>>(
          Error{ErrorCode::kInvalidArgument, fmt::format("{}, line {}: '{}' has no value", source_, out.back().line,
                                                         out.back().key)});
    return out;
  }

 private:
  static void put_utf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  const std::string& source_;
};

}  // namespace

Result<std::vector<ConfigEntry>> parse_config_file(std::string_view text, const std::string& source) {
  return Parser(source).parse(text);
}

}  // namespace lragent
