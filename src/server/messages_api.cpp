#include "server/messages_api.h"

#include <utility>

#include <fmt/format.h>

#include "server/api_translation.h"
#include "server/chat_template.h"

namespace lragent::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

using namespace translation;

// Text blocks ({"type": "text", "text"}; cache_control and citations ignored) as chat's text
// parts, which chat joins as it joins any, or a string as is: a system prompt or a tool result's content.
Result<ordered_json> text_of(const ordered_json& v, const std::string& where) {
  if (v.is_string()) return v;
  if (!v.is_array()) return bad(fmt::format("{} must be a string or a list of text blocks", where));
  ordered_json parts = ordered_json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!v[i].is_object() || field(v[i], "type") != "text") {
      if (v[i].is_object() && field(v[i], "type").is_string())
        return unsupported(fmt::format("{} is a '{}' block: lragent serves text models, give text blocks", at,
                                       v[i]["type"].get<std::string>()));
      return bad(fmt::format("{} must be a text block {{\"type\": \"text\", \"text\": ...}}", at));
    }
    LRA_ASSIGN_OR_RETURN(std::string t, get_string(v[i], "text", at));
    parts.push_back({{"type", "text"}, {"text", std::move(t)}});
  }
  return parts;
}

// One message of the API as chat messages: an assistant turn (text, thinking, tool_use blocks)
// as one assistant message; a user turn's tool_result blocks as tool messages, in place, and its
// text blocks as user messages between them.
Status add_message(const ordered_json& m, const std::string& at, ordered_json& out) {
  if (!m.is_object()) return bad(fmt::format("{} must be an object {{\"role\", \"content\"}}", at));
  LRA_ASSIGN_OR_RETURN(std::string role, get_string(m, "role", at));
  if (role != "user" && role != "assistant") return bad(fmt::format("{}.role is '{}': expected user or assistant", at, role));
  const ordered_json& content = field(m, "content");
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return Status::Ok();
  }
  if (!content.is_array()) return bad(fmt::format("{}.content must be a string or a list of content blocks", at));
  ordered_json parts = ordered_json::array();  // text blocks not yet written out
  ordered_json calls = ordered_json::array();
  std::optional<std::string> thinking;
  auto flush_user_text = [&] {
    if (parts.empty()) return;
    out.push_back({{"role", "user"}, {"content", std::exchange(parts, ordered_json::array())}});
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& b = content[i];
    const std::string bat = fmt::format("{}.content[{}]", at, i);
    if (!b.is_object() || !field(b, "type").is_string())
      return bad(fmt::format("{} must be a content block with a \"type\"", bat));
    const std::string type = b["type"];
    if (type == "text") {
      LRA_ASSIGN_OR_RETURN(std::string t, get_string(b, "text", bat));
      parts.push_back({{"type", "text"}, {"text", std::move(t)}});
    } else if (type == "tool_use" && role == "assistant") {
      LRA_ASSIGN_OR_RETURN(std::string id, get_string(b, "id", bat));
      LRA_ASSIGN_OR_RETURN(std::string name, get_string(b, "name", bat));
      const ordered_json& input = field(b, "input");
      if (!input.is_object()) return bad(fmt::format("{}.input must be an object", bat));
      calls.push_back({{"id", id}, {"type", "function"},
                       {"function", {{"name", name}, {"arguments", input.dump(-1, ' ', false, json::error_handler_t::replace)}}}});
    } else if (type == "thinking" && role == "assistant") {
      LRA_ASSIGN_OR_RETURN(std::string t, get_string(b, "thinking", bat));
      thinking = thinking.value_or("") + t;
    } else if (type == "redacted_thinking" && role == "assistant") {
      continue;  // encrypted by Anthropic's servers: nothing a local model can read
    } else if (type == "tool_result" && role == "user") {
      flush_user_text();
      LRA_ASSIGN_OR_RETURN(std::string id, get_string(b, "tool_use_id", bat));
      ordered_json text = "";
      if (!field(b, "content").is_null()) {
        LRA_ASSIGN_OR_RETURN(text, text_of(b["content"], bat + ".content"));
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(text)}});
    } else if (type == "image" || type == "document" || type == "search_result" || type == "container_upload") {
      return unsupported(fmt::format("{} is a '{}' block: lragent serves text models, give text blocks", bat, type));
    } else {
      return bad(fmt::format("{} has type '{}', which a {} message cannot hold (text{})", bat, type, role,
                             role == "user" ? ", tool_result" : ", tool_use, thinking"));
    }
  }
  if (role == "user") {
    flush_user_text();
    return Status::Ok();
  }
  ordered_json a = {{"role", "assistant"}, {"content", parts.empty() ? ordered_json(nullptr) : std::move(parts)}};
  if (thinking) a["reasoning_content"] = *thinking;
  if (!calls.empty()) a["tool_calls"] = std::move(calls);
  out.push_back(std::move(a));
  return Status::Ok();
}

Result<ordered_json> chat_tools(const ordered_json& tools) {
  if (!tools.is_array()) return bad("'tools' must be a list of tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) return bad(fmt::format("{} must be an object {{\"name\", \"description\", \"input_schema\"}}", at));
    const ordered_json& type = field(t, "type");
    if (!type.is_null() && type != "custom")
      return unsupported(fmt::format("{} is a '{}' tool: lragent runs client tools only (name, description, "
                                     "input_schema)", at, type.is_string() ? type.get<std::string>() : type.dump()));
    LRA_ASSIGN_OR_RETURN(std::string name, get_string(t, "name", at));
    if (!field(t, "input_schema").is_object()) return bad(fmt::format("{}.input_schema must be a JSON schema object", at));
    ordered_json fn = {{"name", name}};
    if (!field(t, "description").is_null()) fn["description"] = t["description"];
    fn["parameters"] = t["input_schema"];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

Result<MessagesRequest> parse(std::string_view body, bool count_only) {
  ordered_json b = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded() || !json_depth_within(body)) return bad("the request body is not valid JSON");
  if (!b.is_object()) return bad("the request body must be a JSON object");
  MessagesRequest r;
  ordered_json& chat = r.chat;
  const ordered_json& model = field(b, "model");
  if (!model.is_null() && !model.is_string()) return bad("'model' must be a string");
  if (model.is_string()) r.model = model;
  chat["model"] = r.model;
  const ordered_json& stream = field(b, "stream");
  if (!stream.is_null() && !stream.is_boolean()) return bad("'stream' must be true or false");
  r.stream = !count_only && stream.is_boolean() && stream.get<bool>();
  if (!count_only) {
    const ordered_json& max_tokens = field(b, "max_tokens");
    if (max_tokens.is_null()) return bad("'max_tokens' is required (the most tokens to generate), as the API requires it");
    if (!max_tokens.is_number_integer() || max_tokens.get<int64_t>() < 1)
      return bad("'max_tokens' must be an integer of at least 1");
    chat["max_completion_tokens"] = max_tokens;
  }
  for (const char* name : {"mcp_servers", "container"})
    if (!field(b, name).is_null()) return unsupported(fmt::format("'{}' is not served by lragent", name));

  ordered_json messages = ordered_json::array();
  const ordered_json& system = field(b, "system");
  if (!system.is_null()) {
    LRA_ASSIGN_OR_RETURN(ordered_json s, text_of(system, "system"));
    messages.push_back({{"role", "system"}, {"content", std::move(s)}});
  }
  const ordered_json& msgs = field(b, "messages");
  if (!msgs.is_array() || msgs.empty()) return bad("'messages' must be a non-empty list of {\"role\", \"content\"}");
  for (size_t i = 0; i < msgs.size(); ++i) LRA_RETURN_IF_ERROR(add_message(msgs[i], fmt::format("messages[{}]", i), messages));
  // The API continues a last assistant message (a "prefill", such as "{" to begin JSON): the chat
  // is cut after its text (continue_final_message) rather than given a new turn.
  if (field(msgs.back(), "role") == "assistant") {
    chat["add_generation_prompt"] = false;
    chat["continue_final_message"] = true;
  }
  chat["messages"] = std::move(messages);
  chat["stream"] = r.stream;

  // Sampling: the API's names, then vLLM's extras with chat's names.
  static const char* const kSame[] = {"temperature", "top_p", "top_k", "seed", "min_p", "presence_penalty",
                                      "frequency_penalty", "repetition_penalty", "logit_bias", "stop_token_ids",
                                      "ignore_eos", "skip_special_tokens", "min_tokens", "cache_salt"};
  for (const char* name : kSame)
    if (!field(b, name).is_null()) chat[name] = b[name];
  const ordered_json& stops = field(b, "stop_sequences");
  if (!stops.is_null()) {
    if (!stops.is_array()) return bad("'stop_sequences' must be a list of strings");
    for (const ordered_json& s : stops)
      if (!s.is_string() || s.get<std::string>().empty()) return bad("'stop_sequences' must be a list of non-empty strings");
    chat["stop"] = stops;
  }
  ordered_json kwargs = field(b, "chat_template_kwargs").is_object() ? b["chat_template_kwargs"] : ordered_json::object();
  const ordered_json& thinking = field(b, "thinking");
  if (!thinking.is_null()) {
    if (!thinking.is_object() || !(field(thinking, "type") == "enabled" || field(thinking, "type") == "disabled"))
      return bad("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    kwargs["enable_thinking"] = thinking["type"] == "enabled";
    const ordered_json& budget = field(thinking, "budget_tokens");
    if (thinking["type"] == "enabled" && !budget.is_null()) {
      if (!budget.is_number_integer() || budget.get<int64_t>() < 0)
        return bad("'thinking.budget_tokens' must be a non-negative integer (the most tokens to think for)");
      chat["thinking_token_budget"] = budget;
    }
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = std::move(kwargs);

  const ordered_json& tools = field(b, "tools");
  if (!tools.is_null()) {
    LRA_ASSIGN_OR_RETURN(ordered_json t, chat_tools(tools));
    if (!t.empty()) chat["tools"] = std::move(t);
  }
  const ordered_json& choice = field(b, "tool_choice");
  if (!choice.is_null()) {
    if (!choice.is_object() || !field(choice, "type").is_string())
      return bad("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const std::string type = choice["type"];
    if (chat.contains("tools")) {
      if (type == "auto" || type == "none") {
        chat["tool_choice"] = type;
      } else if (type == "any") {
        chat["tool_choice"] = "required";
      } else if (type == "tool") {
        LRA_ASSIGN_OR_RETURN(std::string name, get_string(choice, "name", "tool_choice"));
        chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
      } else {
        return bad(fmt::format("'tool_choice.type' is '{}': expected auto, any, tool or none", type));
      }
    }
    const ordered_json& no_parallel = field(choice, "disable_parallel_tool_use");
    if (no_parallel.is_boolean()) chat["parallel_tool_calls"] = !no_parallel.get<bool>();
  }
  return r;
}

}  // namespace

Result<MessagesRequest> parse_messages_request(std::string_view body) { return parse(body, false); }
Result<MessagesRequest> parse_count_tokens_request(std::string_view body) { return parse(body, true); }

json messages_error_json(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

MessageBuilder::MessageBuilder(std::string id, std::string model, int64_t input_tokens) : input_tokens_(input_tokens) {
  message_ = {{"id", std::move(id)},
              {"type", "message"},
              {"role", "assistant"},
              {"model", std::move(model)},
              {"content", json::array()},
              {"stop_reason", nullptr},
              {"stop_sequence", nullptr},
              {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 0}, {"cache_creation_input_tokens", 0},
                         {"cache_read_input_tokens", 0}}}};
}

void MessageBuilder::begin(std::vector<json>& events) {
  events.push_back({{"type", "message_start"}, {"message", message_}});
  // Anthropic's API sends one right after message_start (its SDKs skip it; raw clients may wait for it).
  events.push_back({{"type", "ping"}});
}

void MessageBuilder::open(json block, std::vector<json>& events) {
  open_ = static_cast<int>(message_["content"].size());
  events.push_back({{"type", "content_block_start"}, {"index", open_}, {"content_block", block}});
  message_["content"].push_back(std::move(block));
}

void MessageBuilder::close(std::vector<json>& events) {
  if (open_ < 0) return;
  events.push_back({{"type", "content_block_stop"}, {"index", open_}});
  open_ = -1;
}

void MessageBuilder::thinking(const std::string& delta, std::vector<json>& events) {
  if (delta.empty()) return;
  if (open_ >= 0 && message_["content"][static_cast<size_t>(open_)]["type"] != "thinking") close(events);
  if (open_ < 0) open({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, events);
  json& block = message_["content"][static_cast<size_t>(open_)];
  block["thinking"].get_ref<std::string&>() += delta;  // in place: a stream appends a token's text at a time
  events.push_back({{"type", "content_block_delta"}, {"index", open_}, {"delta", {{"type", "thinking_delta"}, {"thinking", delta}}}});
}

void MessageBuilder::text(const std::string& delta, std::vector<json>& events) {
  if (delta.empty()) return;
  if (open_ >= 0 && message_["content"][static_cast<size_t>(open_)]["type"] != "text") close(events);
  if (open_ < 0) open({{"type", "text"}, {"text", ""}}, events);
  json& block = message_["content"][static_cast<size_t>(open_)];
  block["text"].get_ref<std::string&>() += delta;
  events.push_back({{"type", "content_block_delta"}, {"index", open_}, {"delta", {{"type", "text_delta"}, {"text", delta}}}});
}

void MessageBuilder::tool_call_deltas(const json& deltas, std::vector<json>& events) {
  for (const json& d : deltas) {
    const size_t k = d.value("index", size_t{0});
    const std::string piece = d["function"].value("arguments", "");
    if (k == call_blocks_.size()) {  // a call's first delta
      const bool object = piece.starts_with("{");
      call_blocks_.push_back(-1);
      if (!object) continue;
      close(events);
      open({{"type", "tool_use"}, {"id", translation::random_id("toolu")}, {"name", d["function"].value("name", "")},
            {"input", json::object()}},
           events);
      call_blocks_.back() = open_;
    }
    // Only the open block takes pieces (a late piece of an earlier call is left out: finish sets
    // every block's input from its whole arguments).
    if (k >= call_blocks_.size() || call_blocks_[k] < 0 || call_blocks_[k] != open_ || piece.empty()) continue;
    events.push_back({{"type", "content_block_delta"}, {"index", open_},
                      {"delta", {{"type", "input_json_delta"}, {"partial_json", piece}}}});
  }
}

void MessageBuilder::finish(const json& tool_calls, const std::string& finish_reason,
                            const std::optional<std::string>& stop_string, int64_t output_tokens, int64_t cached,
                            std::vector<json>& events) {
  close(events);
  for (size_t k = 0; k < tool_calls.size(); ++k) {
    const json& call = tool_calls[k];
    const std::string arguments = call["function"].value("arguments", "");
    json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
    // The API's input is an object: arguments that are not one (a parser that keeps them as
    // written, DeepSeek's) are handed over under "arguments".
    if (input.is_discarded() || !input.is_object()) input = json{{"arguments", arguments}};
    if (k < call_blocks_.size() && call_blocks_[k] >= 0) {  // streamed: its block gets the parsed input
      message_["content"][static_cast<size_t>(call_blocks_[k])]["input"] = std::move(input);
      continue;
    }
    open({{"type", "tool_use"}, {"id", translation::random_id("toolu")}, {"name", call["function"].value("name", "")}, {"input", json::object()}},
         events);
    const std::string partial = input.dump(-1, ' ', false, json::error_handler_t::replace);
    events.push_back({{"type", "content_block_delta"}, {"index", open_},
                      {"delta", {{"type", "input_json_delta"}, {"partial_json", partial}}}});
    message_["content"][static_cast<size_t>(open_)]["input"] = std::move(input);
    close(events);
  }
  json stop_sequence = nullptr;
  std::string reason = "end_turn";
  if (!tool_calls.empty()) {
    reason = "tool_use";
  } else if (finish_reason == "length") {
    reason = "max_tokens";
  } else if (stop_string) {
    reason = "stop_sequence";
    stop_sequence = *stop_string;
  }
  message_["stop_reason"] = reason;
  message_["stop_sequence"] = stop_sequence;
  // The API counts input_tokens apart from the ones read from a cache.
  const int64_t fresh = std::max<int64_t>(input_tokens_ - cached, 0);
  message_["usage"] = {{"input_tokens", fresh}, {"output_tokens", output_tokens},
                       {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", cached}};
  events.push_back({{"type", "message_delta"},
                    {"delta", {{"stop_reason", reason}, {"stop_sequence", stop_sequence}}},
                    {"usage", {{"output_tokens", output_tokens}, {"input_tokens", fresh}, {"cache_read_input_tokens", cached}}}});
  events.push_back({{"type", "message_stop"}});
}

void MessageBuilder::fail(const std::string& message, std::vector<json>& events) {
  events.push_back(messages_error_json(500, message));
}

}  // namespace lragent::server
