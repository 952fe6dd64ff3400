// A streamed chat completion whose tool calls are parsed (tool_calls.h), piece by piece as the
// model writes it. Its text goes out as content until a call could begin there (hermes
// "<tool_call>", mistral "[TOOL_CALLS]", deepseek_v3 "<｜tool▁calls▁begin｜>"; llama3_json: a text
// that begins with "{" or "<|python_tag|>", as vLLM streams it; pythonic: one that begins with "["
// or "<|python_start|>") and is held from that point.
//
// The calls then go out as OpenAI streams them, deltas that clients join by index: with
// `incremental` (the streams of the chat completions, Responses and Messages APIs) each call of
// the JSON formats (hermes, mistral, llama3_json) opens with {"index", "id", "type", "function":
// {"name", "arguments"}} once its name is read and its arguments begin, and its
// arguments follow as they are written (PyJsonStream: the pieces join into exactly the arguments
// the whole text parses to); a pythonic call opens at its first keyword (its "{") and its keyword arguments follow as
// they are written, as the JSON object the parse makes of them (PyCallsStream, the same
// guarantee); deepseek_v3's arguments go out as written (its parser keeps them so), never
// splitting a UTF-8 sequence. The rest (a call whose arguments come before its name, and every
// call without `incremental`) go out whole at the end. When the held text turns out to hold no valid call,
// the end gives it back as content, unless a call already went out (the stream cannot take it
// back: the calls sent stand, as vLLM's streaming parsers leave them).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/py_json_stream.h"
#include "server/python_calls_stream.h"
#include "server/tool_calls.h"

namespace lragent::server {

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat f = ToolCallFormat::kHermes, bool incremental = false);
  struct Piece {
    std::string content;                                  // content to send now
    nlohmann::json tool_calls = nlohmann::json::array();  // call deltas to send now
  };
  // What to send now out of the next piece of shown text.
  Piece push(const std::string& piece);
  struct End {
    std::string content;  // content not sent yet
    // Every call, whole: [{"index", "id", "type", "function": {"name", "arguments"}}] (the ids
    // those that went out had).
    nlohmann::json tool_calls = nlohmann::json::array();
    nlohmann::json deltas = nlohmann::json::array();  // what of them did not go out yet
  };
  // After the last piece: the rest of the content, and the calls parsed out of the whole text.
  End finish();

 private:
  // A call that went out, as far as it did.
  struct Sent {
    std::string id, name, arguments;
    size_t arguments_sent = 0;  // bytes of arguments in deltas so far
    bool opened = false;        // its first delta (id, name) went out
  };
  // Where the scan of a held call text is (incremental): between calls (the format's framing),
  // or inside a call's object.
  // (kDs*: deepseek_v3's blocks, whose arguments are streamed as written, as its parser keeps them.)
  enum class Scan { kOpen, kBetween, kCallStart, kKey, kColon, kValue, kAfterValue, kDsSeek, kDsHead, kDsArgs, kStopped };
  void scan();
  void scan_deepseek();
  void scan_pythonic();
  // Reads a whole JSON string at scan_ into `out` (decoded); false: not complete yet (or not a
  // string: scan_state_ becomes kStopped).
  bool read_string(std::string* out);
  void skip_space();
  nlohmann::json deltas(bool all = false);  // all: every call opens, arguments or not (the end)

  ToolCallFormat format_;
  bool incremental_;
  std::string text_;
  size_t sent_ = 0;       // bytes of text_ sent as content
  bool in_call_ = false;  // a call began: no more content goes out before finish()
  bool decided_ = false;  // llama3_json, pythonic: the text's start showed whether it is a call
  size_t call_at_ = 0;    // where the held text begins (in_call_)

  // The incremental scan.
  std::vector<Sent> calls_;
  Scan scan_state_ = Scan::kOpen;
  size_t scan_ = 0;        // the next byte of text_ to read
  std::string key_;        // the call object's key whose value is read
  std::string name_;       // the call's name, once read
  bool has_name_ = false;
  bool args_seen_ = false;  // the call's arguments key came (only the first one is streamed)
  bool streaming_ = false;  // the value read is the call's arguments, going out
  std::optional<PyJsonStream> value_;  // the value being read (arguments, or one skipped)
  PyCallsStream python_;               // pythonic: the calls read so far
};

}  // namespace lragent::server
