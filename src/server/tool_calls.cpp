#include "server/tool_calls.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "engine/guide/json_regex.h"
#include "server/chat_template.h"
#include "server/python_calls.h"

namespace lragent::server {

using ordered_json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsJsonClose = "\n```";

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The text parsed as one JSON value, or a discarded value (not JSON, or nested too deep to walk).
ordered_json parse_json(std::string_view text) {
  if (!json_depth_within(text)) return ordered_json(ordered_json::value_t::discarded);
  return ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The end (one past the closing brace) of the JSON object that begins at text[at] == '{', braces
// inside strings not counted; npos: it does not close.
size_t object_end(std::string_view text, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

ParsedToolCalls no_calls(std::string content) { return ParsedToolCalls{{}, std::move(content)}; }

// One pythonic call of `fn_name` whose keyword arguments follow `params`: every property, in the
// schema's order, as NAME=VALUE with the value as its JSON schema's regex gives it (JSON's
// true / false / null, which parse_python_calls reads as Python's). Optional properties are
// written too: a narrowing, every such call is valid. kUnsupported: a property name that is not
// a Python identifier, or a value the guide cannot enforce.
Result<std::string> pythonic_call_regex(const std::string& fn_name, const ordered_json& params) {
  if (!is_python_name(fn_name))
    return make_error(ErrorCode::kUnsupported,
                      "'tool_choice' with pythonic tool calls: tool '{}' is not a Python name, so no call of it "
                      "can be written (letters, digits and _ only)",
                      fn_name);
  std::vector<std::string> args;
  if (params.is_object() && params.contains("properties") && params["properties"].is_object())
    for (const auto& [key, schema] : params["properties"].items()) {
      if (!is_python_name(key))
        return make_error(ErrorCode::kUnsupported,
                          "'tool_choice' with pythonic tool calls: tool '{}' has parameter '{}', which is not a Python "
                          "keyword argument name",
                          fn_name, key);
      auto re = guide::json_schema_regex(schema);
      if (!re.ok())
        return Error{re.error().code, fmt::format("'tool_choice' needs tool '{}' parameters lragent can enforce: {}",
                                                  fn_name, re.error().message)};
      args.push_back(guide::escape_regex(key + "=") + "(?:" + *re + ")");
    }
  return guide::escape_regex(fn_name + "(") + fmt::format("{}", fmt::join(args, ", ")) + "\\)";
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kDeepSeekV3: return "deepseek_v3";
    case ToolCallFormat::kPythonic: return "pythonic";
  }
  return "?";
}

Result<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json" || name == "llama3") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  if (name == "pythonic" || name == "llama4_pythonic") return ToolCallFormat::kPythonic;
  return make_error(ErrorCode::kInvalidArgument,
                    "tool-call parser '{}' is not one of hermes, llama3_json, mistral, deepseek_v3, pythonic", name);
}

ToolCallFormat detect_tool_call_format(std::string_view t) {
  // Mistral's templates write [TOOL_CALLS] for an assistant's calls; Hermes-style ones show the
  // model <tool_call> blocks; Llama 3.1-3.3's have the ipython role (tool results) and ask for
  // {"name", "parameters"} objects, and every Llama-3 template has its header tokens.
  if (t.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (t.find(kDsCallsBegin) != std::string_view::npos) return ToolCallFormat::kDeepSeekV3;
  // vLLM's pythonic templates show the model "[func_name1(params_name1=params_value1, ...)]".
  if (t.find("[func_name1(") != std::string_view::npos || t.find(kPythonStart) != std::string_view::npos)
    return ToolCallFormat::kPythonic;
  if (t.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (t.find("ipython") != std::string_view::npos || t.find(kPythonTag) != std::string_view::npos)
    return ToolCallFormat::kLlama3Json;
  // A Llama-3 template that shows no tools: a forced call is still best written as Llama writes one.
  if (t.find("<|start_header_id|>") != std::string_view::npos) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kHermes;
}

ParsedToolCalls parse_hermes_tool_calls(const std::string& text) {
  const size_t first = text.find(kHermesOpen);
  if (first == std::string::npos) return no_calls(text);
  ParsedToolCalls out;
  // vLLM's regex <tool_call>(.*?)</tool_call>|<tool_call>(.*) (DOTALL): closed blocks, then the
  // rest after an unclosed one.
  for (size_t at = first; at != std::string::npos;) {
    const size_t body = at + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body);
    const ordered_json j =
        parse_json(std::string_view(text).substr(body, close == std::string::npos ? std::string::npos : close - body));
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("arguments"))
      return no_calls(text);
    out.calls.push_back({j["name"].get<std::string>(), python_json_dumps(j["arguments"])});
    if (close == std::string::npos) break;
    at = text.find(kHermesOpen, close + kHermesClose.size());
  }
  out.content = text.substr(0, first);
  return out;
}

ParsedToolCalls parse_llama3_json_tool_calls(const std::string& text) {
  const std::string_view t = text;
  size_t at = t.find('{');
  if (at == std::string_view::npos) return no_calls(text);
  ParsedToolCalls out;  // content stays empty: vLLM gives none beside the calls
  while (true) {
    const size_t end = object_end(t, at);
    if (end == std::string_view::npos) return no_calls(text);
    const ordered_json j = parse_json(t.substr(at, end - at));
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return no_calls(text);
    const auto args = j.contains("arguments") ? j.find("arguments") : j.find("parameters");
    if (args == j.end()) return no_calls(text);
    out.calls.push_back({j["name"].get<std::string>(), python_json_dumps(*args, /*ensure_ascii=*/true)});
    // Another call follows after ";" (whitespace around it allowed); anything else ends the list.
    size_t next = end;
    while (next < t.size() && is_ascii_space(t[next])) ++next;
    if (next >= t.size() || t[next] != ';') break;
    ++next;
    while (next < t.size() && is_ascii_space(t[next])) ++next;
    if (next >= t.size() || t[next] != '{') break;
    at = next;
  }
  return out;
}

ParsedToolCalls parse_mistral_tool_calls(const std::string& text) {
  const size_t first = text.find(kMistralMarker);
  if (first == std::string::npos) return no_calls(text);
  std::string rest;  // the text without any marker
  for (size_t from = 0;;) {
    const size_t m = text.find(kMistralMarker, from);
    rest.append(text, from, m == std::string::npos ? std::string::npos : m - from);
    if (m == std::string::npos) break;
    from = m + kMistralMarker.size();
  }
  rest = py_strip(rest);  // vLLM strips it with Python's str.strip()
  ordered_json list = parse_json(rest);
  if (list.is_discarded()) {  // vLLM's fallback: the "[{...}]" part (regex \[{.*}\], greedy)
    const size_t open = rest.find("[{"), close = rest.rfind("}]");
    if (open != std::string::npos && close != std::string::npos && close >= open + 1)
      list = parse_json(std::string_view(rest).substr(open, close + 2 - open));
  }
  if (list.is_discarded() || !list.is_array() || list.empty()) return no_calls(rest);
  ParsedToolCalls out;
  for (const ordered_json& call : list) {
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains("arguments"))
      return no_calls(rest);
    out.calls.push_back({call["name"].get<std::string>(), python_json_dumps(call["arguments"])});
  }
  out.content = text.substr(0, first);
  return out;
}

ParsedToolCalls parse_deepseek_v3_tool_calls(const std::string& text) {
  const size_t first = text.find(kDsCallsBegin);
  if (first == std::string::npos) return no_calls(text);
  const std::string_view t = text;
  ParsedToolCalls out;
  // vLLM's findall: each "<｜tool▁call▁begin｜>" a match may start at, left to right.
  for (size_t at = t.find(kDsCallBegin); at != std::string_view::npos; at = t.find(kDsCallBegin, at + 1)) {
    const size_t head = at + kDsCallBegin.size();
    const size_t eol = t.find('\n', head);
    if (eol == std::string_view::npos) break;
    const std::string_view line = t.substr(head, eol - head);  // TYPE<｜tool▁sep｜>NAME
    const size_t sep = line.rfind(kDsSep);
    if (sep == std::string_view::npos || t.substr(eol, kDsJsonOpen.size()) != kDsJsonOpen) continue;
    const size_t args_at = eol + kDsJsonOpen.size();
    const size_t args_end = t.find('\n', args_at);
    if (args_end == std::string_view::npos) break;
    const size_t close = args_end + kDsJsonClose.size();
    if (t.substr(args_end, kDsJsonClose.size()) != kDsJsonClose || t.substr(close, kDsCallEnd.size()) != kDsCallEnd)
      continue;
    out.calls.push_back({std::string(line.substr(sep + kDsSep.size())), std::string(t.substr(args_at, args_end - args_at))});
    at = close + kDsCallEnd.size() - 1;  // the next match starts after this one
  }
  if (out.calls.empty()) return no_calls(text);
  out.content = text.substr(0, first);
  return out;
}

ParsedToolCalls parse_pythonic_tool_calls(const std::string& text) {
  std::string_view t = text;
  while (!t.empty() && is_ascii_space(t.front())) t.remove_prefix(1);
  while (!t.empty() && is_ascii_space(t.back())) t.remove_suffix(1);
  if (t.starts_with(kPythonStart)) t.remove_prefix(kPythonStart.size());
  if (t.ends_with(kPythonEnd)) t.remove_suffix(kPythonEnd.size());
  auto calls = parse_python_calls(t);
  if (!calls) return no_calls(text);
  ParsedToolCalls out;
  for (PythonCall& c : *calls) out.calls.push_back({std::move(c.name), python_json_dumps(c.arguments)});
  return out;
}

ParsedToolCalls parse_tool_calls(ToolCallFormat f, const std::string& text) {
  switch (f) {
    case ToolCallFormat::kHermes: return parse_hermes_tool_calls(text);
    case ToolCallFormat::kLlama3Json: return parse_llama3_json_tool_calls(text);
    case ToolCallFormat::kMistral: return parse_mistral_tool_calls(text);
    case ToolCallFormat::kDeepSeekV3: return parse_deepseek_v3_tool_calls(text);
    case ToolCallFormat::kPythonic: return parse_pythonic_tool_calls(text);
  }
  return no_calls(text);
}

std::string new_tool_call_id(ToolCallFormat f) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  if (f == ToolCallFormat::kMistral) {
    static constexpr std::string_view kAlnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id(9, ' ');
    for (char& c : id) c = kAlnum[rng() % kAlnum.size()];
    return id;
  }
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

Result<std::string> forced_tool_calls_regex(ToolCallFormat f, const ordered_json& tools, const std::string& name) {
  // Llama's templates ask for "parameters"; the other two write "arguments".
  const char* args_key = f == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  std::vector<std::string> calls;  // [matching tools] one call's regex each
  for (const ordered_json& tool : tools) {
    const ordered_json& fn = tool["function"];
    const std::string fn_name = fn["name"].get<std::string>();
    if (!name.empty() && fn_name != name) continue;
    ordered_json params = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"]
                                                                                   : ordered_json{{"type", "object"}};
    if (f == ToolCallFormat::kPythonic) {
      LRA_ASSIGN_OR_RETURN(std::string call, pythonic_call_regex(fn_name, params));
      calls.push_back(std::move(call));
      continue;
    }
    // DeepSeek writes the name, then the arguments alone in a ```json block (on one line: vLLM's
    // parser reads them with '.'); the others one {"name", arguments} object.
    const bool deepseek = f == ToolCallFormat::kDeepSeekV3;
    ordered_json schema = deepseek ? std::move(params)
                                   : ordered_json{{"type", "object"},
                                                  {"properties", {{"name", {{"const", fn_name}}}, {args_key, std::move(params)}}},
                                                  {"required", {"name", args_key}}};
    auto re = guide::json_schema_regex(schema);
    if (!re.ok())
      return Error{re.error().code, fmt::format("'tool_choice' needs tool '{}' parameters lragent can enforce: {}",
                                                fn_name, re.error().message)};
    if (deepseek)
      *re = guide::escape_regex(fmt::format("{}function{}{}{}", kDsCallBegin, kDsSep, fn_name, kDsJsonOpen)) + *re +
            guide::escape_regex(fmt::format("{}{}", kDsJsonClose, kDsCallEnd));
    calls.push_back(std::move(*re));
  }
  if (calls.empty())
    return make_error(ErrorCode::kInvalidArgument, "'tool_choice' names function '{}', which is not among 'tools'", name);
  const std::string one = calls.size() == 1 ? calls[0] : "(?:" + fmt::format("{}", fmt::join(calls, "|")) + ")";
  const bool many = name.empty();  // "required": one or more calls; a named function: one
  switch (f) {
    case ToolCallFormat::kHermes: {
      const std::string block = "<tool_call>\\n" + one + "\\n</tool_call>";
      return many ? block + "(?:\\n" + block + ")*" : block;
    }
    case ToolCallFormat::kLlama3Json: return many ? one + "(?:; " + one + ")*" : one;
    case ToolCallFormat::kMistral:
      return guide::escape_regex(std::string(kMistralMarker)) + "\\[" + one + (many ? "(?:, " + one + ")*" : "") + "\\]";
    case ToolCallFormat::kDeepSeekV3:  // calls one a line, as the template writes them back
      return guide::escape_regex(std::string(kDsCallsBegin)) + one + (many ? "(?:\\n" + one + ")*" : "") +
             guide::escape_regex(std::string(kDsCallsEnd));
    case ToolCallFormat::kPythonic: return "\\[" + one + (many ? "(?:, " + one + ")*" : "") + "\\]";
  }
  return one;
}

}  // namespace lragent::server
