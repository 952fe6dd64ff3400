#include "server/python_calls_stream.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "server/chat_template.h"
#include "server/jinja/pystr.h"
#include "server/python_calls.h"
#include "server/tool_calls.h"
#include "tokenizer/unicode.h"

namespace lragent::server {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr size_t kMaxDepth = 64;  // containers inside an argument, as parse_python_calls allows

// The character classes parse_python_calls reads with.
using pychars::is_digit;
using pychars::is_ident;
using pychars::is_ident_start;
using pychars::is_space;
bool is_quote(char c) { return c == '"' || c == '\''; }
bool is_string_prefix(char c) { return c == 'r' || c == 'R' || c == 'u' || c == 'U'; }
// The bytes of the UTF-8 sequence at t[i] as a literal's scan steps over it: its lead and the
// continuation bytes that follow, up to the lead's length (any other byte ends it early, so a
// quote after a stray lead still closes the literal); 0 while the text ends inside it.
size_t utf8_seq(std::string_view t, size_t i) {
  const size_t want = unicode::utf8_length(static_cast<unsigned char>(t[i]));
  size_t len = 1;
  for (; len < want; ++len) {
    if (i + len >= t.size()) return 0;
    if ((static_cast<unsigned char>(t[i + len]) & 0xC0) != 0x80) break;
  }
  return len;
}

size_t skip_space(std::string_view t, size_t i) {
  while (i < t.size() && is_space(t[i])) ++i;
  return i;
}

// The length of the escape at t[i] (a backslash) in a literal that is not raw, as
// jinja::py::unescape reads it; 0 while the text ends before that is known (an octal escape
// takes up to three digits).
size_t escape_len(std::string_view t, size_t i) {
  if (i + 1 >= t.size()) return 0;
  const char n = t[i + 1];
  size_t len = 2;
  if (n == 'x') {
    len = 4;
  } else if (n == 'u') {
    len = 6;
  } else if (n == 'U') {
    len = 10;
  } else if (n >= '0' && n <= '7') {
    size_t digits = 1;
    while (digits < 3 && i + 1 + digits < t.size() && t[i + 1 + digits] >= '0' && t[i + 1 + digits] <= '7') ++digits;
    if (digits < 3 && i + 1 + digits >= t.size()) return 0;
    len = 1 + digits;
  } else if (static_cast<unsigned char>(n) >= 0x80) {
    // A backslash before non-ASCII text takes the continuation bytes that follow, all of them
    // (unescape's rule): complete once a byte that is none shows.
    while (true) {
      if (i + len >= t.size()) return 0;
      if ((static_cast<unsigned char>(t[i + len]) & 0xC0) != 0x80) break;
      ++len;
    }
  }
  return i + len <= t.size() ? len : 0;
}

std::string dump_string(const std::string& s) { return python_json_dumps(ordered_json(s)); }

}  // namespace

void PyCallsStream::read(std::string_view text) {
  while (state_ != State::kDone && state_ != State::kFailed) {
    waiting_ = false;
    step(text);
    if (waiting_) return;
  }
}

void PyCallsStream::emit(std::string_view s) {
  if (!key_mode_ && !calls_.empty()) calls_.back().arguments += s;
}

bool PyCallsStream::read_identifier(std::string_view text, std::string* out) {
  size_t i = token_;
  while (i < text.size() && is_ident(text[i])) ++i;
  if (i >= text.size()) {  // a later character may still belong to it
    waiting_ = true;
    return false;
  }
  out->assign(text.substr(token_, i - token_));
  pos_ = i;
  return true;
}

// Starts the literal whose quote is at `at`: false while the text ends before it shows whether
// the quote opens a triple-quoted string.
bool PyCallsStream::begin_literal(std::string_view text, size_t at, bool raw) {
  const char q = text[at];
  if (at + 1 >= text.size()) return false;
  if (text[at + 1] == q) {
    if (at + 2 >= text.size()) return false;
    triple_ = text[at + 2] == q;
  } else {
    triple_ = false;
  }
  quote_ = q;
  raw_ = raw;
  pos_ = at + (triple_ ? 3 : 1);
  state_ = State::kString;
  return true;
}

bool PyCallsStream::emit_string_chars(std::string_view raw) {
  if (raw.empty()) return true;
  std::string decoded;
  if (raw_) {
    decoded.assign(raw);  // a raw string keeps its backslashes
  } else {
    auto v = jinja::py::unescape(raw);  // whole escapes only: the same as the literal's whole text gives
    if (!v.ok()) return false;
    decoded = std::move(*v);
  }
  if (key_mode_) {
    key_ += decoded;
  } else {
    const std::string dumped = dump_string(decoded);
    emit(std::string_view(dumped).substr(1, dumped.size() - 2));
  }
  return true;
}

void PyCallsStream::step(std::string_view text) {
  const size_t n = text.size();
  // Moves past whitespace; true (and waiting) when the text ends there.
  const auto ends_after_space = [&] {
    pos_ = skip_space(text, pos_);
    waiting_ = pos_ >= n;
    return waiting_;
  };
  switch (state_) {
    case State::kStart: {
      size_t i = skip_space(text, 0);
      const std::string_view rest = text.substr(i);
      if (rest.starts_with(kPythonStart)) {
        i = skip_space(text, i + kPythonStart.size());
      } else if (kPythonStart.starts_with(rest)) {
        waiting_ = true;  // may still become the tag
        return;
      }
      if (i >= n) {
        waiting_ = true;
        return;
      }
      if (text[i] != '[') return fail();
      pos_ = i + 1;
      state_ = State::kCallOrEnd;
      return;
    }
    case State::kCallOrEnd:
      if (ends_after_space()) return;
      if (text[pos_] == ']') {
        if (calls_.empty()) return fail();  // an empty list holds no call
        ++pos_;
        state_ = State::kDone;
        return;
      }
      if (!is_ident_start(text[pos_])) return fail();
      token_ = pos_;
      state_ = State::kName;
      return;
    case State::kName:
      if (read_identifier(text, &name_)) state_ = State::kParen;
      return;
    case State::kParen:
      if (ends_after_space()) return;
      if (text[pos_] != '(') return fail();  // a.b( too: '.' is not '('
      ++pos_;
      calls_.push_back(Call{name_, {}});
      keywords_.clear();
      state_ = State::kKeyOrClose;
      return;
    case State::kKeyOrClose:
      if (ends_after_space()) return;
      if (text[pos_] == ')') {
        ++pos_;
        emit(keywords_.empty() ? "{}" : "}");
        state_ = State::kAfterCall;
        return;
      }
      if (!is_ident_start(text[pos_])) return fail();  // a positional argument
      token_ = pos_;
      state_ = State::kKey;
      return;
    case State::kKey:
      if (read_identifier(text, &name_)) state_ = State::kEquals;
      return;
    case State::kEquals:
      if (ends_after_space()) return;
      if (text[pos_] != '=' || std::find(keywords_.begin(), keywords_.end(), name_) != keywords_.end())
        return fail();  // a keyword given twice: the parse refuses the calls
      ++pos_;
      emit(keywords_.empty() ? "{" : ", ");
      emit(dump_string(name_));
      emit(": ");
      keywords_.push_back(name_);
      state_ = State::kValue;
      return;
    case State::kValue: {
      if (ends_after_space()) return;
      if (open_.size() > kMaxDepth) return fail();
      const char c = text[pos_];
      if (is_quote(c) || is_string_prefix(c)) {
        const size_t q = pos_ + (is_quote(c) ? 0 : 1);
        if (q >= n) {
          waiting_ = true;
          return;
        }
        if (is_quote(text[q])) {
          if (!begin_literal(text, q, c == 'r' || c == 'R')) {
            waiting_ = true;
            return;
          }
          if (key_mode_) key_.clear();
          emit("\"");
          return;
        }
      }
      if (key_mode_ && !(c == '-' || c == '.' || is_digit(c))) return fail();  // a key is a string or an integer
      if (c == '[' || c == '{') {
        ++pos_;
        emit(std::string_view(&c, 1));
        open_.push_back(Open{c, 0, {}});
        state_ = c == '[' ? State::kElemOrClose : State::kDictKeyOrClose;
        return;
      }
      token_ = pos_;
      if (c == '-' || c == '.' || is_digit(c)) {
        state_ = State::kNumber;
      } else if (is_ident_start(c)) {
        state_ = State::kWord;
      } else {
        fail();
      }
      return;
    }
    case State::kString: {
      size_t i = pos_;
      bool closed = false;
      while (i < n) {
        const char c = text[i];
        if (c == '\\') {  // an escaped character never closes the literal, raw or not
          // (Raw: the backslash and the character after it, kept as they are.)
          const size_t len = raw_ ? (i + 1 < n && utf8_seq(text, i + 1) > 0 ? 1 + utf8_seq(text, i + 1) : 0)
                                  : escape_len(text, i);
          if (len == 0) break;
          i += len;
          continue;
        }
        if (c == '\n' && !triple_) return fail();
        if (c == quote_) {
          if (!triple_) {
            closed = true;
            break;
          }
          if (i + 3 <= n) {
            if (text[i + 1] == quote_ && text[i + 2] == quote_) {
              closed = true;
              break;
            }
          } else if (std::all_of(text.begin() + static_cast<long>(i), text.end(), [&](char x) { return x == quote_; })) {
            break;  // may be the closing quotes
          }
          ++i;
          continue;
        }
        const size_t len = utf8_seq(text, i);
        if (len == 0) break;
        i += len;
      }
      if (!emit_string_chars(text.substr(pos_, i - pos_))) return fail();
      pos_ = i;
      if (!closed) {
        waiting_ = true;
        return;
      }
      pos_ += triple_ ? 3 : 1;
      state_ = State::kAfterString;
      return;
    }
    case State::kAfterString: {  // another literal joins this one ("a" "b" is "ab"), or it ends
      const size_t i = skip_space(text, pos_);
      if (i >= n) {
        waiting_ = true;
        return;
      }
      const char c = text[i];
      if (is_quote(c) || is_string_prefix(c)) {
        const size_t q = i + (is_quote(c) ? 0 : 1);
        if (q >= n) {
          waiting_ = true;
          return;
        }
        if (is_quote(text[q])) {
          if (!begin_literal(text, q, c == 'r' || c == 'R')) waiting_ = true;
          return;
        }
      }
      emit("\"");
      pos_ = i;
      state_ = State::kAfterValue;
      return;
    }
    case State::kNumber: {
      size_t i = token_ + (text[token_] == '-' ? 1 : 0);
      while (i < n && (is_ident(text[i]) || text[i] == '.' ||
                       ((text[i] == '+' || text[i] == '-') && (text[i - 1] == 'e' || text[i - 1] == 'E'))))
        ++i;
      if (i >= n) {
        waiting_ = true;  // "1" may become "12"
        return;
      }
      const auto v = parse_python_value(text.substr(token_, i - token_));
      if (!v || !v->is_number()) return fail();
      if (key_mode_) {
        if (!v->is_number_integer()) return fail();
        key_ = v->dump();  // json.dumps writes an integer key as its digits, quoted
      } else {
        emit(python_json_dumps(*v));
      }
      pos_ = i;
      state_ = State::kAfterValue;
      return;
    }
    case State::kWord: {
      std::string word;
      if (!read_identifier(text, &word)) return;
      if (word == "True" || word == "true") emit("true");
      else if (word == "False" || word == "false") emit("false");
      else if (word == "None" || word == "null") emit("null");
      else return fail();
      state_ = State::kAfterValue;
      return;
    }
    case State::kAfterValue: {
      if (ends_after_space()) return;
      const char c = text[pos_];
      if (key_mode_) {  // a dict's key, out once its ":" shows it whole
        if (c != ':') return fail();
        ++pos_;
        Open& d = open_.back();
        if (std::find(d.keys.begin(), d.keys.end(), key_) != d.keys.end()) repeated_key_ = true;
        d.keys.push_back(key_);
        key_mode_ = false;
        emit(d.count++ ? ", " : "");
        emit(dump_string(key_));
        emit(": ");
        state_ = State::kValue;
        return;
      }
      if (open_.empty()) {  // a keyword's value
        if (c == ',') {
          ++pos_;
          state_ = State::kKeyOrClose;
        } else if (c == ')') {
          ++pos_;
          emit("}");
          state_ = State::kAfterCall;
        } else {
          fail();
        }
        return;
      }
      const char bracket = open_.back().bracket;
      const char close = bracket == '[' ? ']' : '}';
      if (c == ',') {
        ++pos_;
        state_ = bracket == '[' ? State::kElemOrClose : State::kDictKeyOrClose;
      } else if (c == close) {
        ++pos_;
        emit(std::string_view(&close, 1));
        open_.pop_back();
      } else {
        fail();
      }
      return;
    }
    case State::kElemOrClose: {
      if (ends_after_space()) return;
      Open& l = open_.back();
      if (text[pos_] == ']') {  // also after a trailing comma, which writes no separator
        ++pos_;
        emit("]");
        open_.pop_back();
        state_ = State::kAfterValue;
        return;
      }
      emit(l.count++ ? ", " : "");
      state_ = State::kValue;
      return;
    }
    case State::kDictKeyOrClose:
      if (ends_after_space()) return;
      if (text[pos_] == '}') {
        ++pos_;
        emit("}");
        open_.pop_back();
        state_ = State::kAfterValue;
        return;
      }
      key_mode_ = true;
      state_ = State::kValue;
      return;
    case State::kAfterCall:
      if (ends_after_space()) return;
      if (text[pos_] == ',') {
        ++pos_;
        state_ = State::kCallOrEnd;  // a trailing comma: "]" may follow
      } else if (text[pos_] == ']') {
        ++pos_;
        state_ = State::kDone;
      } else {
        fail();
      }
      return;
    case State::kDone:
    case State::kFailed: return;
  }
}

}  // namespace lragent::server
