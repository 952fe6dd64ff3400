// One JSON value, read piece by piece as a model writes it, written out as Python's json.dumps
// writes the parsed value (python_json_dumps: ", " and ": " separators, strings re-escaped, numbers
// as Python prints them), as far as the text so far settles it. A streamed tool call's arguments
// go out through it: the pieces joined are exactly the arguments string of the call parsed whole
// (tool_calls.h), so a client that joins the deltas gets what a non-streamed request gets.
//
// What goes out when: brackets, separators and every complete scalar at once; a string's
// characters as they come (never half an escape, a surrogate pair or a UTF-8 sequence); a number
// or a literal only once the character after it shows it is complete (a "1" may become "12").
// The value's own text is checked as it is read: what is not JSON stops the stream (failed()),
// and nothing wrong has gone out before that point, as every piece sent was a prefix of the dump
// of some valid value. One difference with the value parsed whole remains: an object that repeats a
// key (the parse keeps one, the stream sent both).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace lragent::server {

class PyJsonStream {
 public:
  explicit PyJsonStream(bool ensure_ascii = false) : ensure_ascii_(ensure_ascii) {}

  // Reads `text` (everything the model wrote so far; it only grows) from where the last call
  // stopped, up to the end of the value at most, and appends to `out` (when not null) the dump
  // text that became certain. Returns the position in `text` where reading stopped: the end of
  // the value once done(), else text.size() or the start of a token still open (a number, a
  // literal).
  size_t read(std::string_view text, std::string* out);
  // The value is complete: read() consumed its last character.
  bool done() const { return mode_ == Mode::kDone; }
  // The text is not a JSON value (or nests deeper than kMaxJsonDepth); read() reads no more.
  bool failed() const { return mode_ == Mode::kFailed; }
  // The position read() continues from.
  size_t position() const { return pos_; }
  // Starts at `at` (a fresh stream over a text that has something before the value).
  void start_at(size_t at) { pos_ = at; }

 private:
  // What the next character may be: kValueOrClose after "[", kKeyOrClose after "{", kKey after
  // an object's ",".
  enum class Mode { kValue, kValueOrClose, kKeyOrClose, kKey, kColon, kCommaOrClose, kString, kDone, kFailed };
  void after_value();
  // A string's raw characters (escapes as written) as Python's json.dumps writes them, without
  // the quotes, appended to `out` (when not null); false when they are not valid JSON string content.
  bool dump_chars(std::string_view raw, std::string* out) const;
  void open(char bracket, std::string* out);
  // Where an open string's raw text from `from` may be cut without splitting an escape, a
  // surrogate pair or a UTF-8 sequence (<= end).
  static size_t safe_cut(std::string_view text, size_t from, size_t end);

  bool ensure_ascii_;
  Mode mode_ = Mode::kValue;
  bool key_ = false;                        // the open string is an object's key
  std::vector<char> open_;                  // the open containers, '{' or '['
  size_t pos_ = 0;                          // the next character to read
  size_t string_sent_ = 0;                  // an open string: its raw text before this went out
  bool escape_ = false;                     // an open string: the scan stopped after a backslash
};

}  // namespace lragent::server
