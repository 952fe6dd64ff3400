// Reasoning in a chat completion's text: a thinking model (Qwen3, DeepSeek-R1 and its distills)
// writes its reasoning inside <think>...</think> before the answer. With a reasoning parser
// (vLLM's --reasoning-parser qwen3 / deepseek_r1) the server hands that part to the client apart,
// as the message's reasoning_content, and parses tool calls out of the answer alone.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace lragent::server {

// The markers around a thinking model's reasoning (both formats write them).
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

enum class ReasoningFormat {
  kQwen3,       // Qwen3: <think>...</think> from the model; none when enable_thinking is false
  kDeepSeekR1,  // DeepSeek-R1: the template opens <think> in the prompt; the model closes it
};
// vLLM's parser name: "qwen3", "deepseek_r1".
const char* reasoning_format_name(ReasoningFormat f);
// kInvalidArgument lists the known names.
Result<ReasoningFormat> parse_reasoning_format(std::string_view name);

// A completion's text split as vLLM's parsers split it: a leading "<think>" dropped, then the
// reasoning is the text before "</think>" and the content the text after it. No "</think>": the
// model was still thinking when it stopped, so all of it is reasoning; but with thinking off
// (Qwen3 and enable_thinking false: the template closed an empty block in the prompt) all of it
// is content. Empty parts are unset (JSON null).
// vLLM drops text before a "<think>" anywhere in the completion; here only a leading one is
// dropped, so that the streamed and the whole split are the same (ReasoningStream).
struct ReasoningSplit {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
};
ReasoningSplit split_reasoning(const std::string& text, bool thinking);

// The regex of a completion that reasons first and then matches `regex`: an optional "<think>",
// any text that holds no "</think>", then "</think>", whitespace, and a match of `regex`. A
// structured output (a forced tool call, a JSON schema, ...) of a thinking model is enforced only
// once its reasoning ends, as vLLM enforces it; the split then hands the match over as content.
std::string after_reasoning(const std::string& regex);

// The same split of a streamed completion, piece by piece: reasoning goes out until "</think>"
// (a tag split across pieces is held back), then content. Each part's pieces joined are
// split_reasoning's parts (unset: "").
class ReasoningStream {
 public:
  explicit ReasoningStream(bool thinking = true) : thinking_(thinking) {}
  struct Piece {
    std::string reasoning;
    std::string content;
  };
  // What to send now out of the next piece of shown text.
  Piece push(const std::string& piece);
  // After the last piece: what was held back.
  Piece finish();

 private:
  Piece advance(bool last);

  bool thinking_;
  std::string text_;
  size_t sent_ = 0;        // bytes of text_ handed out
  bool started_ = false;   // the start showed whether a "<think>" opens the text
  bool answering_ = false;  // "</think>" seen (or thinking off): the rest is content
};

}  // namespace lragent::server
