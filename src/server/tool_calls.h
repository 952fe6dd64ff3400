// Tool calls in a chat completion's text: how each model family writes them, how the server reads
// them out (vLLM's --tool-call-parser: hermes, llama3_json, mistral, deepseek_v3, pythonic), and what a forced
// tool_choice makes the model write. The format follows the chat template: a template that
// shows the model Hermes blocks gets Hermes blocks back (docs/server.md, "Tool calls").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server {

enum class ToolCallFormat {
  kHermes,      // <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call> (Qwen2.5, Qwen3, Hermes)
  kLlama3Json,  // {"name": N, "parameters": {...}}; {...} (Llama 3.1-3.3; after <|python_tag|> or not)
  kMistral,     // [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] (Mistral 7B v0.3, Nemo, Small)
  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>
  // ...<｜tool▁calls▁end｜> (DeepSeek-V3 and R1, and R1's Llama and Qwen distills)
  kDeepSeekV3,
  // [get_weather(city="Paris"), get_time()] (Llama 3.2 and 4 with their pythonic templates, and
  // Llama 4's <|python_start|>...<|python_end|> around it; ToolACE; python_calls.h)
  kPythonic,
};
// The markers the formats write around their calls.
inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";
inline constexpr std::string_view kPythonStart = "<|python_start|>";  // Llama 4's
inline constexpr std::string_view kPythonEnd = "<|python_end|>";
inline constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kDsJsonOpen = "\n```json\n";

// vLLM's parser name: "hermes", "llama3_json", "mistral", "deepseek_v3", "pythonic".
const char* tool_call_format_name(ToolCallFormat f);
// A parser name (vLLM's names; "llama3" and "llama4_pythonic" too). kInvalidArgument lists the known ones.
Result<ToolCallFormat> parse_tool_call_format(std::string_view name);
// The format a chat template's text shows the model: "[TOOL_CALLS]" mistral, "<｜tool▁calls▁begin｜>"
// deepseek_v3, the pythonic templates' "[func_name1(params_name1=" or Llama 4's
// "<|python_start|>" pythonic, "<tool_call>" hermes, Llama's ipython role, <|python_tag|> or
// header tokens llama3_json; otherwise hermes.
ToolCallFormat detect_tool_call_format(std::string_view template_text);

// A function call of an assistant turn. Its arguments are kept as the JSON text the template
// writes: Python's json.dumps of the parsed arguments (vLLM parses the OpenAI API's arguments
// string before rendering; the template's tojson dumps it again, keys in their order).
struct ToolCall {
  std::string name;
  std::string arguments;
};

// The calls found in a completion's text and the content left beside them. No calls: the content
// is what the client gets as the message's text.
struct ParsedToolCalls {
  std::vector<ToolCall> calls;
  std::string content;
};

// vLLM's Hermes parser: the <tool_call>{"name", "arguments"}</tool_call> blocks (a last unclosed
// one too). Found: content is the text before the first block, arguments json.dumps(ensure_ascii
// =False) of the parsed ones. A block that is not such JSON: no calls, the whole text is content.
ParsedToolCalls parse_hermes_tool_calls(const std::string& text);
// vLLM's llama3_json parser: the first JSON object of the text and those that follow it after a
// ";" each, every one {"name", "arguments" or "parameters"}. Found: no content (vLLM drops the
// text around the calls), arguments json.dumps (ASCII) of the parsed ones. vLLM finds the objects
// with a regex that sees at most two levels of braces and counts braces inside strings; here
// the objects are scanned as JSON, so deeper arguments parse too.
ParsedToolCalls parse_llama3_json_tool_calls(const std::string& text);
// vLLM's mistral parser (a tokenizer of Hugging Face's kind): the text after "[TOOL_CALLS]", the
// marker removed and whitespace stripped (str.strip), is a JSON list of {"name", "arguments"} (or its
// "[{...}]" part, from the first "[{" to the last "}]"). Found: content is the text before the
// first marker; arguments json.dumps(ensure_ascii=False). Not such a list: no calls, and the
// content is the stripped text without the marker.
ParsedToolCalls parse_mistral_tool_calls(const std::string& text);
// vLLM's deepseek_v3 parser: with "<｜tool▁calls▁begin｜>" in the text, every
// <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜> (vLLM's regex
// without DOTALL: TYPE, NAME and ARGUMENTS each within one line, TYPE up to the line's last
// separator). Found: content is the text before the first "<｜tool▁calls▁begin｜>", arguments the
// text as written (vLLM does not parse them). None found: no calls, the whole text is content
// (vLLM reports an empty list of calls and the text before the marker).
ParsedToolCalls parse_deepseek_v3_tool_calls(const std::string& text);
// vLLM's pythonic parser (and llama4_pythonic's <|python_start|> / <|python_end|> around it):
// the whole text, whitespace stripped, is a Python list of calls (parse_python_calls). Found: no
// content, arguments json.dumps(ensure_ascii=False) of the keyword arguments. Else no calls, the
// whole text is content.
ParsedToolCalls parse_pythonic_tool_calls(const std::string& text);
ParsedToolCalls parse_tool_calls(ToolCallFormat f, const std::string& text);

// A new call id as the format's models take it back in a later turn: "chatcmpl-tool-" and 32 hex
// digits (vLLM's), for Mistral 9 letters and digits (its templates refuse any other id).
std::string new_tool_call_id(ToolCallFormat f);

// tool_choice "required" (`name` empty: one or more calls of any of `tools`) or a named function
// (one call of it): the regex of the completion, the calls in `f`'s form, each call's arguments
// following its function's parameters schema (guide/json_regex.h). `tools` is the request's
// list, already checked (parse_chat_tools). kInvalidArgument: `name` is not among them;
// kUnsupported: a schema the guide cannot enforce.
Result<std::string> forced_tool_calls_regex(ToolCallFormat f, const nlohmann::ordered_json& tools,
                                            const std::string& name);

}  // namespace lragent::server
