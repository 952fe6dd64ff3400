// Jinja template text to tokens, as jinja2's lexer splits it under transformers' settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline=False): template data with the whitespace
// control of {%- -%} {{- -}} {#- -#} and {%+ +%} applied, comments and {% raw %} resolved, and the
// tokens inside {{ }} and {% %}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent::server::jinja {

enum class TokenType : uint8_t {
  kData,           // text between tags, whitespace control applied
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text: the literal's value, escapes resolved
  kInteger,
  kFloat,
  kOperator,  // text: the operator ("+", "//", "(", ...)
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// The tokens of `source`, ending with kEof. Errors (kCorrupt) name the line and column.
Result<std::vector<Token>> tokenize(std::string_view source);

// "line L, column C" of a position, for error messages.
std::string describe_position(int line, int column);

}  // namespace lragent::server::jinja
