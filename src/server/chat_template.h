// Chat templates for POST /v1/chat/completions. lragent has no Jinja engine: it recognises a
// model's chat_template (tokenizer_config.json) by its exact text and renders the known ones in
// C++, checked against transformers' apply_chat_template (tests/server/chat_template_test.cpp),
// as llama.cpp renders its built-in templates. A template it does not know is refused with a
// message, never approximated.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server {

enum class ChatFormat {
  kLlama3,  // Meta-Llama-3-*-Instruct: header blocks, <|eot_id|>, content trimmed
  kQwen3,   // Qwen3: ChatML with <think> handling, tool results as <tool_response> user turns
};
const char* chat_format_name(ChatFormat f);

struct ChatMessage {
  std::string role;     // system | developer | user | assistant | tool | function
  std::string content;  // text parts joined with "\n"
  std::optional<std::string> reasoning_content;  // Qwen3: an assistant turn's thinking, given apart
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::kLlama3;
  std::string bos_token;  // tokenizer_config.json's bos_token (Llama-3 writes it as text)
  bool generation_prompt_always = false;  // the template ends with the assistant header regardless

  // The template a tokenizer_config.json text names (its chat_template, or the "default" one of
  // a list). kNotFound: it has none; kUnsupported: one lragent does not render.
  static Result<ChatTemplate> from_tokenizer_config(std::string_view config_json, const std::string& source);

  // What apply_chat_template(messages, tokenize=False, add_generation_prompt, enable_thinking)
  // gives. Errors: a role the template has no place for (kInvalidArgument).
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             bool enable_thinking = true) const;
};

// The "messages" of a chat request: role and content (a string, or a list of {"type": "text",
// "text"} parts); errors name the message and field.
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::json& messages);

}  // namespace lragent::server
