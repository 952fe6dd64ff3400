// Chat templates for POST /v1/chat/completions. A model's chat_template (tokenizer_config.json)
// is rendered by server/jinja, an interpreter of the Jinja2 that transformers' apply_chat_template
// runs (tests/server/chat_template_jinja_test.cpp checks it against transformers on real
// templates). The Meta-Llama-3-Instruct and Qwen3 templates, recognised by their exact text, are
// rendered by C++ code instead (no interpretation on the request path; checked against
// transformers by tests/server/chat_template_test.cpp), as llama.cpp renders its built-in ones.
// A template the interpreter cannot parse is refused with a message, never approximated.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "server/jinja/jinja.h"
#include "server/tool_calls.h"

namespace lragent::server {

enum class ChatFormat {
  kLlama3,  // Meta-Llama-3-*-Instruct: header blocks, <|eot_id|>, content trimmed
  kQwen3,   // Qwen3: ChatML with <think> handling, tool results as <tool_response> user turns
  kJinja,   // any other template: interpreted (server/jinja)
};
const char* chat_format_name(ChatFormat f);

struct ChatMessage {
  std::string role;     // system | developer | user | assistant | tool | function
  std::string content;  // text parts joined with "\n"
  std::optional<std::string> reasoning_content;  // Qwen3: an assistant turn's thinking, given apart
  std::vector<ToolCall> tool_calls;              // assistant
  // The message as vLLM hands it to a Jinja template: the client's object (its other fields,
  // tool_call_id, name, ..., in its order), content as the text above ("" for null), each tool
  // call's function.arguments parsed. Null: made from the fields above.
  nlohmann::ordered_json template_view;
};

// JSON text nested at most `max_depth` arrays/objects deep (brackets inside strings do not
// count). Request bodies and model output are checked before they are parsed: a value nested
// a million deep would overflow the stack of every recursive walk over it (dump, copy).
constexpr int kMaxJsonDepth = 256;
bool json_depth_within(std::string_view text, int max_depth = kMaxJsonDepth);

// Python's str.strip() (Jinja's |trim): Unicode whitespace off both ends; py_lstrip: off the
// start only. Text that is not valid UTF-8 loses ASCII whitespace only.
std::string py_strip(std::string_view s);
std::string_view py_lstrip(std::string_view s);

// Python's json.dumps(value, ensure_ascii=False) (Jinja's tojson as transformers defines it):
// ", " and ": " separators, keys in their order, non-ASCII as is; with ensure_ascii, json.dumps'
// default: non-ASCII as \uXXXX escapes (surrogate pairs above U+FFFF).
std::string python_json_dumps(const nlohmann::ordered_json& value, bool ensure_ascii = false);

struct ChatTemplate {
  ChatFormat format = ChatFormat::kLlama3;
  std::string bos_token;  // tokenizer_config.json's bos_token (Llama-3 writes it as text)
  bool generation_prompt_always = false;  // the template ends with the assistant header regardless
  // The form the template shows the model tool calls in, so the form they come back in
  // (detect_tool_call_format; `serve --tool-call-parser` overrides it).
  ToolCallFormat tool_call_format = ToolCallFormat::kHermes;
  // kJinja: the parsed template, the special tokens it is given (bos_token, eos_token, ... of
  // tokenizer_config.json, as transformers passes its special_tokens_map), and the clock of its
  // strftime_now (unset: the local time now; tests pin it).
  std::optional<jinja::Template> jinja;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  std::function<std::string(const std::string& format)> strftime_now;

  // The template a tokenizer_config.json text names (its chat_template, or the "default" one of
  // a list). kNotFound: it has none; kCorrupt: one the interpreter cannot parse (the error says
  // where). `builtin` false: a known template is interpreted too (tests compare the two).
  static Result<ChatTemplate> from_tokenizer_config(std::string_view config_json, const std::string& source,
                                                    bool builtin = true);

  // What apply_chat_template(messages, tokenize=False, add_generation_prompt, enable_thinking,
  // tools) gives; `tools`: each tool's JSON text (python_json_dumps of its vLLM form,
  // parse_chat_tools). Errors: tools or tool calls with a template that has no place for them
  // (kUnsupported).
  // `kwargs`: the request's chat_template_kwargs, which an interpreted template gets as variables
  // (all but messages, tools, documents and add_generation_prompt, as transformers passes them);
  // the built-in renderers read only enable_thinking.
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             bool enable_thinking = true, const std::vector<std::string>& tools = {},
                             const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;
  // render() of a kJinja template; a template's raise_exception is a kInvalidArgument error with
  // its message (the client's conversation is what it refused).
  Result<std::string> render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                   bool enable_thinking, const std::vector<std::string>& tools,
                                   const nlohmann::ordered_json& kwargs) const;
  // Whether tool definitions and calls go to the template: Qwen3's (Hermes-style <tool_call>) and
  // any interpreted one, which decides what to write of them (as vLLM hands them to it; one that
  // has no place for them leaves them out, as it does under vLLM). The Llama-3-Instruct built-in
  // templates have none and refuse them.
  bool supports_tools() const { return format != ChatFormat::kLlama3; }
};

// The "messages" of a chat request: role and content (a string, or a list of {"type": "text",
// "text"} parts), an assistant's tool_calls; errors name the message and field. Ordered JSON
// keeps the keys of tool-call arguments in the client's order, as the template writes them.
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::ordered_json& messages);
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::json& messages);

// transformers' continue_final_message: the rendered chat cut right after the final message's
// text (`final_text`), so that the model goes on with that message (an answer the client began)
// instead of a new turn. kInvalidArgument when the template does not show the text.
Result<std::string> continue_final_message(std::string rendered, const std::string& final_text);

// A chat request's "tools" ([{"type": "function", "function": {"name", "description",
// "parameters"}}]) as the JSON texts the template writes: each in vLLM's form (its pydantic
// model_dump: type, then function with name, description and parameters, null when absent,
// then any other keys as given).
Result<std::vector<std::string>> parse_chat_tools(const nlohmann::ordered_json& tools);

}  // namespace lragent::server
