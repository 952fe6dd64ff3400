// libFuzzer target: arbitrary bytes as a chat template (src/server/jinja), rendered over a fixed
// conversation with tools, tool calls and tool results. Every input must parse or fail with a
// syntax error naming its line (kCorrupt), and render or fail with kInvalidArgument, within the
// limits given, never crash, hang, throw or grow without bound; rendering twice gives the same.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/jinja/jinja.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const nlohmann::ordered_json& variables() {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Weather in Paris? caf\u00e9 \u3000 \ud83d\ude00"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5, null, true]}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "22 degrees"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\nIt is 22 degrees.", "reasoning_content": null}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "documents": null,
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "nested": {"a": {"b": [[1], {"c": -9223372036854775807}], "d": 1e308}}
  })");
  return vars;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = lragent::server::jinja::Template::parse(source);
  if (!t.ok()) {
    check(t.error().code == lragent::ErrorCode::kCorrupt);
    check(t.error().message.find("line ") != std::string::npos);
    return 0;
  }
  lragent::server::jinja::RenderOptions o;
  o.strftime_now = [](const std::string& f) { return "strftime(" + f + ")"; };
  o.max_output_bytes = 1 << 20;
  o.max_steps = 100'000;
  o.max_depth = 30;
  auto first = t->render(variables(), o);
  if (!first.ok()) {
    check(first.error().code == lragent::ErrorCode::kInvalidArgument);
    return 0;
  }
  check(first->size() <= o.max_output_bytes);
  auto second = t->render(variables(), o);
  check(second.ok() && *second == *first);
  return 0;
}
