#include "server/py_json_stream.h"

#include <nlohmann/json.hpp>

#include "server/chat_template.h"

namespace lragent::server {
namespace {

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
// The characters a number or a literal (true, false, null) is made of: a run of them is one token.
bool is_scalar_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '+' ||
         c == '.';
}
int hex_value(std::string_view h) {  // four hex digits, or -1
  int v = 0;
  for (char c : h) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

size_t PyJsonStream::safe_cut(std::string_view text, size_t from, size_t end) {
  size_t i = from;
  while (i < end) {
    size_t len = 1;
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      if (i + 1 >= end) break;
      len = 2;
      if (text[i + 1] == 'u') {
        len = 6;
        if (i + len > end) break;
        const int code = hex_value(text.substr(i + 2, 4));
        // A high surrogate is half a character: it goes out with the \uXXXX after it.
        if (code >= 0xD800 && code <= 0xDBFF) {
          if (i + 7 >= end) break;
          if (text[i + 6] == '\\' && text[i + 7] == 'u') len = 12;
        }
      }
    } else if (c >= 0xC0) {
      len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;  // a UTF-8 sequence's lead byte
    }
    if (i + len > end) break;
    i += len;
  }
  return i;
}

bool PyJsonStream::dump_chars(std::string_view raw, std::string* out) const {
  if (raw.empty()) return true;
  std::string quoted;
  quoted.reserve(raw.size() + 2);
  quoted += '"';
  quoted += raw;
  quoted += '"';
  const auto v = nlohmann::ordered_json::parse(quoted, nullptr, /*allow_exceptions=*/false);
  if (!v.is_string()) return false;
  if (out) {
    // python_json_dumps writes a string as nlohmann does (chat_template.cpp).
    const std::string d = v.dump(-1, ' ', ensure_ascii_, nlohmann::ordered_json::error_handler_t::replace);
    out->append(d, 1, d.size() - 2);
  }
  return true;
}

void PyJsonStream::after_value() { mode_ = open_.empty() ? Mode::kDone : Mode::kCommaOrClose; }

void PyJsonStream::open(char bracket, std::string* out) {
  if (open_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
    mode_ = Mode::kFailed;
    return;
  }
  open_.push_back(bracket);
  if (out) *out += bracket;
  mode_ = bracket == '{' ? Mode::kKeyOrClose : Mode::kValueOrClose;
  ++pos_;
}

size_t PyJsonStream::read(std::string_view text, std::string* out) {
  while (pos_ < text.size() && mode_ != Mode::kDone && mode_ != Mode::kFailed) {
    if (mode_ == Mode::kString) {
      size_t i = pos_;
      for (; i < text.size(); ++i) {
        const char c = text[i];
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          break;
        }
      }
      if (i == text.size()) {  // still open: what can be cut off now goes out
        pos_ = i;
        const size_t cut = safe_cut(text, string_sent_, text.size());
        if (!dump_chars(text.substr(string_sent_, cut - string_sent_), out)) mode_ = Mode::kFailed;
        string_sent_ = cut;
        break;
      }
      if (!dump_chars(text.substr(string_sent_, i - string_sent_), out)) {
        mode_ = Mode::kFailed;
        break;
      }
      if (out) *out += '"';
      pos_ = i + 1;
      if (key_) mode_ = Mode::kColon;
      else after_value();
      continue;
    }
    const char c = text[pos_];
    if (is_json_space(c)) {
      ++pos_;
      continue;
    }
    const bool value = mode_ == Mode::kValue || mode_ == Mode::kValueOrClose;
    const bool key = mode_ == Mode::kKey || mode_ == Mode::kKeyOrClose;
    if (c == '"' && (value || key)) {
      if (out) *out += '"';
      key_ = key;
      mode_ = Mode::kString;
      string_sent_ = ++pos_;
      escape_ = false;
    } else if ((c == '{' || c == '[') && value) {
      open(c, out);
    } else if ((c == '}' || c == ']') && !open_.empty() && open_.back() == (c == '}' ? '{' : '[') &&
               (mode_ == Mode::kCommaOrClose || mode_ == (c == '}' ? Mode::kKeyOrClose : Mode::kValueOrClose))) {
      if (out) *out += c;
      open_.pop_back();
      ++pos_;
      after_value();
    } else if (c == ',' && mode_ == Mode::kCommaOrClose) {
      if (out) *out += ", ";
      mode_ = open_.back() == '{' ? Mode::kKey : Mode::kValue;
      ++pos_;
    } else if (c == ':' && mode_ == Mode::kColon) {
      if (out) *out += ": ";
      mode_ = Mode::kValue;
      ++pos_;
    } else if (is_scalar_char(c) && value) {
      size_t end = pos_;
      while (end < text.size() && is_scalar_char(text[end])) ++end;
      if (end == text.size()) break;  // "1" may become "12", "tr" "true": wait for what follows
      const auto v = nlohmann::ordered_json::parse(text.substr(pos_, end - pos_), nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded() || v.is_structured() || v.is_string()) {
        mode_ = Mode::kFailed;
        break;
      }
      if (out) *out += python_json_dumps(v, ensure_ascii_);
      pos_ = end;
      after_value();
    } else {
      mode_ = Mode::kFailed;
    }
  }
  return pos_;
}

}  // namespace lragent::server
