// Pythonic tool calls ([get_weather(city="Paris"), get_time()], python_calls.h) read piece by
// piece as a model writes them, so that a streamed chat completion can send each call's arguments
// as they are written, as vLLM's pythonic parser streams them. The arguments go out as the JSON
// text the whole parse gives (python_json_dumps of the keyword arguments), as far as the text so
// far settles it: the pieces joined are exactly the arguments of the call parsed whole.
//
// What is settled when: a call's name at its "("; "{" and a keyword at its "="; a string's
// characters as they come (never half an escape or a UTF-8 sequence), its closing quote once the
// next token shows that no literal is joined to it ("a" "b" is one string); a number or a literal
// once the character after it shows it complete (a "1" may become "12"); a separator once the
// next element begins (a trailing comma writes none); a dict's key at its ":"; "}" at the ")".
// The text is checked as it is read against parse_python_calls' subset: what is outside it stops
// the stream (failed()), and nothing wrong went out before that point. One difference with the
// whole parse remains, as with PyJsonStream: a dict that repeats a key (the parse keeps one, the
// stream sent both; repeated_key() says so).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace lragent::server {

class PyCallsStream {
 public:
  struct Call {
    std::string name;
    std::string arguments;  // the dump text settled so far
  };
  // Reads `text` (all the model wrote so far, from the start of the calls: optional whitespace and
  // "<|python_start|>", then "["; it only grows) from where the last read stopped.
  void read(std::string_view text);
  // The calls whose "(" was read, in order.
  const std::vector<Call>& calls() const { return calls_; }
  bool done() const { return state_ == State::kDone; }      // the list's "]" was read
  bool failed() const { return state_ == State::kFailed; }  // the text left the subset
  bool repeated_key() const { return repeated_key_; }

 private:
  enum class State {
    kStart,         // before the list's "["
    kCallOrEnd,     // a call's name, or the list's "]"
    kName,          // inside a call's name
    kParen,         // the "(" after it
    kKeyOrClose,    // a keyword, or the call's ")"
    kKey,           // inside a keyword
    kEquals,        // the "=" after it
    kValue,         // a value begins (a dict key too, in key mode)
    kString,        // inside a string literal
    kAfterString,   // after a literal: another one joined to it, or the string ends
    kNumber,        // inside a number
    kWord,          // inside True / False / None (or JSON's true / false / null)
    kAfterValue,    // a separator or a closing bracket
    kElemOrClose,   // a list's next element, or its "]"
    kDictKeyOrClose,  // a dict's next key, or its "}"
    kAfterCall,     // "," or the list's "]"
    kDone,
    kFailed,
  };
  struct Open {
    char bracket;  // '[' or '{'
    int count = 0;  // elements (or keys) so far
    std::vector<std::string> keys;  // a dict's keys so far
  };
  void step(std::string_view text);  // one state's work, or waiting_ when it needs more text
  void emit(std::string_view s);     // to the current call's arguments (dropped in key mode)
  // A literal's content (whole escapes only), decoded and written as json.dumps writes it (in key
  // mode: added to the key); false when an escape is not Python's.
  bool emit_string_chars(std::string_view raw);
  // The name, keyword or word that began at token_, once a character after it shows it whole
  // (pos_ moves past it); false (and waiting_) while the text ends inside it.
  bool read_identifier(std::string_view text, std::string* out);
  // The literal whose quote is at `at` (raw: an r prefix); false while the text ends before it
  // shows whether the quote opens a triple-quoted string.
  bool begin_literal(std::string_view text, size_t at, bool raw);
  void fail() { state_ = State::kFailed; }

  State state_ = State::kStart;
  size_t pos_ = 0;                 // the next byte of the text to read
  size_t token_ = 0;               // where the open name, keyword, number or word began
  bool waiting_ = false;           // the last step needs more text
  std::string name_;               // the call's name or the keyword just read
  std::vector<Call> calls_;
  std::vector<std::string> keywords_;  // the current call's keywords
  std::vector<Open> open_;         // the containers open inside the current argument
  // The open string literal.
  char quote_ = '"';
  bool triple_ = false, raw_ = false;
  // Key mode: a dict's key is being read; it goes out (dumped) at its ":".
  bool key_mode_ = false;
  std::string key_;  // the key's text (an integer key's digits)
  bool repeated_key_ = false;
};

}  // namespace lragent::server
