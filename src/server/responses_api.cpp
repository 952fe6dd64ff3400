#include "server/responses_api.h"

#include <utility>

#include <fmt/format.h>

#include "server/api_translation.h"

namespace lragent::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

using namespace translation;

// A message's content: a string as is, or its text parts in chat's form.
Result<ordered_json> content_of(const ordered_json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) return bad(fmt::format("{}.content must be a string or a list of content parts", where));
  ordered_json parts = ordered_json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& p = content[i];
    const std::string at = fmt::format("{}.content[{}]", where, i);
    if (!p.is_object() || !field(p, "type").is_string())
      return bad(fmt::format("{} must be an object with a \"type\" (input_text, output_text)", at));
    const std::string type = p["type"];
    if (type == "input_text" || type == "output_text" || type == "text") {
      LRA_ASSIGN_OR_RETURN(std::string text, get_string(p, "text", at));
      parts.push_back({{"type", "text"}, {"text", std::move(text)}});
    } else if (type == "refusal") {
      LRA_ASSIGN_OR_RETURN(std::string text, get_string(p, "refusal", at));
      parts.push_back({{"type", "text"}, {"text", std::move(text)}});
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return unsupported(fmt::format("{} is {}: lragent serves text models, give text parts (input_text)", at, type));
    } else {
      return bad(fmt::format("{} has type '{}': expected input_text or output_text", at, type));
    }
  }
  return parts;
}

// The text of a reasoning item's content (reasoning_text parts) or, without one, its summary.
std::string reasoning_text(const ordered_json& item) {
  std::string text;
  for (const char* key : {"content", "summary"}) {
    const ordered_json& parts = field(item, key);
    if (!parts.is_array()) continue;
    for (const ordered_json& p : parts)
      if (p.is_object() && field(p, "text").is_string()) text += p["text"].get<std::string>();
    if (!text.empty()) break;
  }
  return text;
}

// The input items as chat messages: messages as they are (developer as system), a run of
// function_call items as one assistant turn's tool_calls (joined to the assistant message just
// before, which wrote them), function_call_output as a tool message, a reasoning item as the
// next assistant turn's reasoning_content.
Result<ordered_json> input_messages(const ordered_json& input) {
  ordered_json out = ordered_json::array();
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input}});
    return out;
  }
  if (!input.is_array()) return bad("'input' must be a string or a list of input items");
  std::optional<std::string> reasoning;  // a reasoning item's text, for the next assistant turn
  auto assistant_turn = [&](ordered_json m) {
    if (reasoning) m["reasoning_content"] = *std::exchange(reasoning, std::nullopt);
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ordered_json& it = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!it.is_object()) return bad(fmt::format("{} must be an object (a message or an item)", at));
    const ordered_json& t = field(it, "type");
    if (!t.is_null() && !t.is_string()) return bad(fmt::format("{}.type must be a string", at));
    const std::string type = t.is_string() ? t.get<std::string>() : "message";
    if (type == "message") {
      LRA_ASSIGN_OR_RETURN(std::string role, get_string(it, "role", at));
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(fmt::format("{}.role is '{}': expected user, assistant, system or developer", at, role));
      LRA_ASSIGN_OR_RETURN(ordered_json content, content_of(field(it, "content"), at));
      ordered_json m = {{"role", role == "developer" ? "system" : role}, {"content", std::move(content)}};
      out.push_back(role == "assistant" ? assistant_turn(std::move(m)) : std::move(m));
    } else if (type == "function_call") {
      LRA_ASSIGN_OR_RETURN(std::string call_id, get_string(it, "call_id", at));
      LRA_ASSIGN_OR_RETURN(std::string name, get_string(it, "name", at));
      LRA_ASSIGN_OR_RETURN(std::string arguments, get_string(it, "arguments", at));
      ordered_json call = {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
      const bool joins = !out.empty() && out.back()["role"] == "assistant" && !reasoning;
      if (!joins) out.push_back(assistant_turn({{"role", "assistant"}, {"content", nullptr}}));
      ordered_json& m = out.back();
      if (!m.contains("tool_calls")) m["tool_calls"] = ordered_json::array();
      m["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      LRA_ASSIGN_OR_RETURN(std::string call_id, get_string(it, "call_id", at));
      const ordered_json& output = field(it, "output");
      ordered_json content;
      if (output.is_string()) {
        content = output;
      } else {
        LRA_ASSIGN_OR_RETURN(content, content_of(output, at + ".output"));
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(content)}});
    } else if (type == "reasoning") {
      reasoning = reasoning.value_or("") + reasoning_text(it);
    } else if (type == "item_reference") {
      return unsupported(fmt::format("{} is an item_reference: give the item itself, or continue a stored "
                                     "response with previous_response_id", at));
    } else {
      return unsupported(fmt::format("{} has type '{}': lragent takes messages, function_call, "
                                     "function_call_output and reasoning items", at, type));
    }
  }
  return out;
}

// Function tools in chat's form; built-in tools (web_search, file_search, ...) are not served.
Result<ordered_json> chat_tools(const ordered_json& tools) {
  if (!tools.is_array()) return bad("'tools' must be a list of tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object() || !field(t, "type").is_string()) return bad(fmt::format("{} must be an object with a \"type\"", at));
    const std::string type = t["type"];
    if (type != "function")
      return unsupported(fmt::format("{} is a '{}' tool: lragent runs function tools only (the client runs them)", at, type));
    LRA_ASSIGN_OR_RETURN(std::string name, get_string(t, "name", at));
    ordered_json fn = {{"name", name}};
    for (const char* key : {"description", "parameters", "strict"})
      if (!field(t, key).is_null()) fn[key] = t[key];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

Result<ordered_json> chat_tool_choice(const ordered_json& choice) {
  if (choice.is_string()) {
    const std::string c = choice;
    if (c == "auto" || c == "none" || c == "required") return choice;
    return bad(fmt::format("'tool_choice' is '{}': expected auto, none, required or {{\"type\": \"function\", "
                           "\"name\": ...}}", c));
  }
  if (choice.is_object() && field(choice, "type") == "function") {
    LRA_ASSIGN_OR_RETURN(std::string name, get_string(choice, "name", "tool_choice"));
    return ordered_json{{"type", "function"}, {"function", {{"name", name}}}};
  }
  if (choice.is_object() && field(choice, "type").is_string())
    return unsupported(fmt::format("'tool_choice' of type '{}' is not served: use auto, none, required or a function",
                                   choice["type"].get<std::string>()));
  return bad("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": ...}");
}

// text.format as chat's response_format (null: plain text).
Result<ordered_json> response_format(const ordered_json& text) {
  if (text.is_null()) return ordered_json();
  if (!text.is_object()) return bad("'text' must be an object like {\"format\": {\"type\": \"json_schema\", ...}}");
  const ordered_json& f = field(text, "format");
  if (f.is_null()) return ordered_json();
  if (!f.is_object() || !field(f, "type").is_string())
    return bad("'text.format' must be an object with a \"type\" (text, json_object or json_schema)");
  const std::string type = f["type"];
  if (type == "text") return ordered_json();
  if (type == "json_object") return ordered_json{{"type", "json_object"}};
  if (type == "json_schema") {
    if (field(f, "schema").is_null()) return bad("'text.format.schema' is missing: give the JSON schema of the output");
    ordered_json js = {{"name", field(f, "name").is_string() ? f["name"] : ordered_json("response")},
                       {"schema", f["schema"]}};
    for (const char* key : {"description", "strict"})
      if (!field(f, key).is_null()) js[key] = f[key];
    return ordered_json{{"type", "json_schema"}, {"json_schema", std::move(js)}};
  }
  return bad(fmt::format("'text.format.type' is '{}': expected text, json_object or json_schema", type));
}

// The input as the API lists it back (GET /v1/responses/{id}/input_items): items with an id and
// a type, a message's content as parts (input_text, or output_text for the assistant's). Called
// on an input input_messages() accepted.
ordered_json input_items(const ordered_json& input) {
  ordered_json out = ordered_json::array();
  auto message = [](const std::string& role, const ordered_json& content) {
    ordered_json parts = content;
    if (content.is_string())
      parts = ordered_json::array({{{"type", role == "assistant" ? "output_text" : "input_text"}, {"text", content}}});
    return ordered_json{{"id", translation::random_id("msg")}, {"type", "message"}, {"role", role},
                        {"content", std::move(parts)}, {"status", "completed"}};
  };
  if (input.is_string()) {
    out.push_back(message("user", input));
    return out;
  }
  for (const ordered_json& it : input) {
    const ordered_json& type = field(it, "type");
    if (type.is_null() || type == "message") {
      ordered_json m = message(it["role"].get<std::string>(), it["content"]);
      if (field(it, "id").is_string()) m["id"] = it["id"];
      out.push_back(std::move(m));
    } else {
      ordered_json item = it;
      if (!field(item, "id").is_string()) item["id"] = translation::random_id("item");
      out.push_back(std::move(item));
    }
  }
  return out;
}

}  // namespace

Result<ResponsesRequest> parse_responses_request(std::string_view body, const SamplingDefaults& defaults) {
  ordered_json b = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded() || !json_depth_within(body)) return bad("the request body is not valid JSON");
  if (!b.is_object()) return bad("the request body must be a JSON object");
  ResponsesRequest r;
  const ordered_json& model = field(b, "model");
  if (!model.is_null() && !model.is_string()) return bad("'model' must be a string");
  if (model.is_string()) r.model = model;
  if (field(b, "input").is_null()) return bad("'input' is missing: give the text, or a list of messages and items");
  LRA_ASSIGN_OR_RETURN(r.input_messages, input_messages(b["input"]));
  r.input_items = input_items(b["input"]);
  auto get_bool = [&](const char* name, bool dflt) -> Result<bool> {
    const ordered_json& v = field(b, name);
    if (v.is_null()) return dflt;
    if (!v.is_boolean()) return bad(fmt::format("'{}' must be true or false", name));
    return v.get<bool>();
  };
  LRA_ASSIGN_OR_RETURN(r.stream, get_bool("stream", false));
  LRA_ASSIGN_OR_RETURN(r.store, get_bool("store", true));
  LRA_ASSIGN_OR_RETURN(r.background, get_bool("background", false));
  if (r.background && !r.store)
    return bad("'background' needs \"store\": true: a background response is kept for GET /v1/responses/{id}");
  for (const char* name : {"conversation", "prompt"})
    if (!field(b, name).is_null())
      return unsupported(fmt::format("'{}' is not served: give the input (and previous_response_id) instead", name));
  const ordered_json& prev = field(b, "previous_response_id");
  if (!prev.is_null() && !prev.is_string()) return bad("'previous_response_id' must be a string");
  if (prev.is_string()) r.previous_response_id = prev;
  const ordered_json& instructions = field(b, "instructions");
  if (!instructions.is_null() && !instructions.is_string()) return bad("'instructions' must be a string");
  if (instructions.is_string()) r.instructions = instructions.get<std::string>();
  const ordered_json& truncation = field(b, "truncation");
  if (!truncation.is_null() && truncation != "auto" && truncation != "disabled")
    return bad("'truncation' must be \"auto\" or \"disabled\"");
  const ordered_json& include = field(b, "include");
  if (!include.is_null()) {
    if (!include.is_array()) return bad("'include' must be a list of strings, like [\"message.output_text.logprobs\"]");
    for (const ordered_json& what : include) {
      if (!what.is_string()) return bad("'include' must be a list of strings, like [\"message.output_text.logprobs\"]");
      // The others name outputs lragent never makes (encrypted reasoning, built-in tools' results).
      if (what == "message.output_text.logprobs") r.output_logprobs = true;
    }
  }
  const ordered_json& top_logprobs = field(b, "top_logprobs");
  if (!top_logprobs.is_null() && (!top_logprobs.is_number_integer() || top_logprobs.get<int64_t>() < 0 ||
                                  top_logprobs.get<int64_t>() > kLogprobsLimit))
    return bad(fmt::format("'top_logprobs' must be an integer from 0 to {}", kLogprobsLimit));
  if (r.output_logprobs) {  // computed as chat computes them (vLLM's rule: only when included)
    r.chat_fields["logprobs"] = true;
    r.chat_fields["top_logprobs"] = top_logprobs.is_null() ? ordered_json(0) : top_logprobs;
  }

  // The chat body's fields: sampling fields with the same names and meanings, then the renamed ones.
  static const char* const kSame[] = {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                      "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids",
                                      "logit_bias", "min_tokens", "ignore_eos", "skip_special_tokens",
                                      "include_stop_str_in_output", "chat_template_kwargs", "parallel_tool_calls",
                                      "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                                      "guided_grammar", "bad_words", "allowed_token_ids", "cache_salt",
                                      "priority"};
  for (const char* name : kSame)
    if (!field(b, name).is_null()) r.chat_fields[name] = b[name];
  const ordered_json& max_out = field(b, "max_output_tokens");
  if (!max_out.is_null()) {
    if (!max_out.is_number_integer() || max_out.get<int64_t>() < 1)
      return bad("'max_output_tokens' must be an integer of at least 1");
    r.chat_fields["max_completion_tokens"] = max_out;
  }
  if (!field(b, "tools").is_null()) {
    LRA_ASSIGN_OR_RETURN(ordered_json tools, chat_tools(b["tools"]));
    if (!tools.empty()) r.chat_fields["tools"] = std::move(tools);
  }
  if (!field(b, "tool_choice").is_null() && r.chat_fields.contains("tools")) {
    LRA_ASSIGN_OR_RETURN(r.chat_fields["tool_choice"], chat_tool_choice(b["tool_choice"]));
  }
  LRA_ASSIGN_OR_RETURN(ordered_json format, response_format(field(b, "text")));
  if (!format.is_null()) r.chat_fields["response_format"] = std::move(format);

  // What the response repeats, with the API's defaults.
  auto or_default = [&](const char* name, ordered_json dflt) {
    r.echo[name] = field(b, name).is_null() ? std::move(dflt) : b[name];
  };
  or_default("instructions", nullptr);
  or_default("max_output_tokens", nullptr);
  or_default("metadata", ordered_json::object());
  or_default("parallel_tool_calls", true);
  or_default("previous_response_id", nullptr);
  or_default("reasoning", ordered_json{{"effort", nullptr}, {"summary", nullptr}});
  r.echo["store"] = r.store;
  or_default("temperature", defaults.temperature);
  or_default("text", ordered_json{{"format", {{"type", "text"}}}});
  or_default("tool_choice", "auto");
  or_default("tools", ordered_json::array());
  or_default("top_logprobs", 0);
  or_default("top_p", defaults.top_p);
  or_default("truncation", "disabled");
  or_default("user", nullptr);
  return r;
}

std::string chat_body(const ResponsesRequest& r, const ordered_json& history) {
  ordered_json body = r.chat_fields;
  body["model"] = r.model;
  ordered_json messages = ordered_json::array();
  if (r.instructions) messages.push_back({{"role", "system"}, {"content", *r.instructions}});
  for (const ordered_json& m : history) messages.push_back(m);
  for (const ordered_json& m : r.input_messages) messages.push_back(m);
  body["messages"] = std::move(messages);
  body["stream"] = r.stream;
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

ResponseBuilder::ResponseBuilder(std::string id, int64_t created_at, std::string model, const ResponsesRequest& r) {
  response_ = {{"id", std::move(id)}, {"object", "response"}, {"created_at", created_at}, {"status", "in_progress"},
               {"background", r.background}, {"error", nullptr}, {"incomplete_details", nullptr}, {"model", std::move(model)},
               {"output", json::array()}, {"usage", nullptr}};
  for (const auto& [k, v] : r.echo.items()) response_[k] = json::parse(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

json ResponseBuilder::event(const char* type) { return json{{"type", type}, {"sequence_number", sequence_++}}; }

void ResponseBuilder::begin(std::vector<json>& events) {
  for (const char* type : {"response.created", "response.in_progress"}) {
    json e = event(type);
    e["response"] = response_;
    events.push_back(std::move(e));
  }
}

void ResponseBuilder::reasoning(const std::string& delta, std::vector<json>& events) { append(true, delta, events); }
void ResponseBuilder::text(const std::string& delta, std::vector<json>& events, const json& logprobs) {
  append(false, delta, events, logprobs);
}

void ResponseBuilder::append(bool reasoning, const std::string& delta, std::vector<json>& events, const json& logprobs) {
  const bool text_open = open_ >= 0 && !open_is_reasoning_;
  if (delta.empty() && (reasoning || logprobs.empty() || !text_open)) return;
  if (open_ >= 0 && open_is_reasoning_ != reasoning) close_open_item(events);
  json& output = response_["output"];
  if (open_ < 0) {
    open_ = static_cast<int>(output.size());
    open_is_reasoning_ = reasoning;
    json item = reasoning ? json{{"id", translation::random_id("rs")}, {"type", "reasoning"}, {"summary", json::array()},
                                 {"content", json::array()}, {"status", "in_progress"}}
                          : json{{"id", translation::random_id("msg")}, {"type", "message"}, {"status", "in_progress"},
                                 {"role", "assistant"}, {"content", json::array()}};
    json added = event("response.output_item.added");
    added["output_index"] = open_;
    added["item"] = item;
    events.push_back(std::move(added));
    const json part = reasoning ? json{{"type", "reasoning_text"}, {"text", ""}}
                                : json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()},
                                       {"logprobs", json::array()}};
    json part_added = event("response.content_part.added");
    part_added.update({{"item_id", item["id"]}, {"output_index", open_}, {"content_index", 0}, {"part", part}});
    events.push_back(std::move(part_added));
    item["content"].push_back(part);
    output.push_back(std::move(item));
  }
  json& item = output[static_cast<size_t>(open_)];
  item["content"][0]["text"].get_ref<std::string&>() += delta;  // in place: a stream appends a token's text at a time
  json d = event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta");
  d.update({{"item_id", item["id"]}, {"output_index", open_}, {"content_index", 0}, {"delta", delta}});
  if (!reasoning) {
    json& all = item["content"][0]["logprobs"];
    for (const json& e : logprobs) all.push_back(e);
    d["logprobs"] = logprobs;
  }
  events.push_back(std::move(d));
}

void ResponseBuilder::close_open_item(std::vector<json>& events) {
  if (open_ < 0) return;
  json& item = response_["output"][static_cast<size_t>(open_)];
  const json& part = item["content"][0];
  json done = event(open_is_reasoning_ ? "response.reasoning_text.done" : "response.output_text.done");
  done.update({{"item_id", item["id"]}, {"output_index", open_}, {"content_index", 0}, {"text", part["text"]}});
  if (!open_is_reasoning_) done["logprobs"] = part["logprobs"];
  events.push_back(std::move(done));
  json part_done = event("response.content_part.done");
  part_done.update({{"item_id", item["id"]}, {"output_index", open_}, {"content_index", 0}, {"part", part}});
  events.push_back(std::move(part_done));
  item["status"] = "completed";
  json item_done = event("response.output_item.done");
  item_done.update({{"output_index", open_}, {"item", item}});
  events.push_back(std::move(item_done));
  open_ = -1;
}

void ResponseBuilder::close_call(std::vector<json>& events) {
  if (!call_open_) return;
  call_open_ = false;
  const int index = call_items_.back();
  json& item = response_["output"][static_cast<size_t>(index)];
  json args_done = event("response.function_call_arguments.done");
  args_done.update({{"item_id", item["id"]}, {"output_index", index}, {"name", item["name"]}, {"arguments", item["arguments"]}});
  events.push_back(std::move(args_done));
  item["status"] = "completed";
  json item_done = event("response.output_item.done");
  item_done.update({{"output_index", index}, {"item", item}});
  events.push_back(std::move(item_done));
}

void ResponseBuilder::tool_call_deltas(const json& deltas, std::vector<json>& events) {
  json& output = response_["output"];
  for (const json& d : deltas) {
    const size_t k = d.value("index", size_t{0});
    if (k == call_items_.size()) {  // a call's first delta: its item
      close_open_item(events);
      close_call(events);
      call_open_ = true;
      call_items_.push_back(static_cast<int>(output.size()));
      json item = {{"id", translation::random_id("fc")},
                   {"type", "function_call"},
                   {"call_id", d.value("id", "")},
                   {"name", d["function"].value("name", "")},
                   {"arguments", ""},
                   {"status", "in_progress"}};
      json added = event("response.output_item.added");
      added.update({{"output_index", call_items_.back()}, {"item", item}});
      events.push_back(std::move(added));
      output.push_back(std::move(item));
    }
    // Only the last call's item is open (ChatStream opens calls in order; a late piece of an
    // earlier one, which its end would add, is left out).
    if (k + 1 != call_items_.size() || !call_open_) continue;
    const std::string piece = d["function"].value("arguments", "");
    if (piece.empty()) continue;
    const int index = call_items_[k];
    json& item = output[static_cast<size_t>(index)];
    item["arguments"].get_ref<std::string&>() += piece;
    json e = event("response.function_call_arguments.delta");
    e.update({{"item_id", item["id"]}, {"output_index", index}, {"delta", piece}});
    events.push_back(std::move(e));
  }
}

void ResponseBuilder::finish(const json& tool_calls, const std::string& finish_reason, const Usage& u,
                             std::vector<json>& events) {
  close_open_item(events);
  close_call(events);
  json& output = response_["output"];
  for (size_t k = call_items_.size(); k < tool_calls.size(); ++k) {  // those tool_call_deltas did not open
    const json& call = tool_calls[k];
    const int index = static_cast<int>(output.size());
    json item = {{"id", translation::random_id("fc")},
                 {"type", "function_call"},
                 {"call_id", call.value("id", "")},
                 {"name", call["function"].value("name", "")},
                 {"arguments", ""},
                 {"status", "in_progress"}};
    const std::string arguments = call["function"].value("arguments", "");
    json added = event("response.output_item.added");
    added.update({{"output_index", index}, {"item", item}});
    events.push_back(std::move(added));
    json d = event("response.function_call_arguments.delta");
    d.update({{"item_id", item["id"]}, {"output_index", index}, {"delta", arguments}});
    events.push_back(std::move(d));
    json args_done = event("response.function_call_arguments.done");
    args_done.update({{"item_id", item["id"]}, {"output_index", index}, {"name", item["name"]}, {"arguments", arguments}});
    events.push_back(std::move(args_done));
    item["arguments"] = arguments;
    item["status"] = "completed";
    json item_done = event("response.output_item.done");
    item_done.update({{"output_index", index}, {"item", item}});
    events.push_back(std::move(item_done));
    output.push_back(std::move(item));
  }
  const char* status = "completed";
  if (finish_reason == "length") {
    status = "incomplete";
    response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  } else if (finish_reason == "abort") {
    status = "cancelled";
  }
  response_["status"] = status;
  response_["usage"] = {{"input_tokens", u.input},
                        {"input_tokens_details", {{"cached_tokens", u.cached}}},
                        {"output_tokens", u.output},
                        {"output_tokens_details", {{"reasoning_tokens", u.reasoning}}},
                        {"total_tokens", u.input + u.output}};
  json e = event(std::string(status) == "incomplete" ? "response.incomplete" : "response.completed");
  e["response"] = response_;
  events.push_back(std::move(e));
}

void ResponseBuilder::fail(const Error& err, std::vector<json>& events) {
  close_open_item(events);
  close_call(events);
  json e = event("error");
  e.update({{"code", error_json(err)["error"]["type"]}, {"message", err.message}, {"param", nullptr}});
  events.push_back(std::move(e));
  response_["status"] = "failed";
  response_["error"] = {{"code", "server_error"}, {"message", err.message}};
  json f = event("response.failed");
  f["response"] = response_;
  events.push_back(std::move(f));
}

ordered_json ResponseBuilder::assistant_message() const {
  std::optional<std::string> text, reasoning;
  ordered_json calls = ordered_json::array();
  for (const json& item : response_["output"]) {
    const std::string type = item.value("type", "");
    if (type == "message") text = text.value_or("") + item["content"][0]["text"].get<std::string>();
    if (type == "reasoning") reasoning = reasoning.value_or("") + item["content"][0]["text"].get<std::string>();
    if (type == "function_call")
      calls.push_back({{"id", item["call_id"]}, {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
  }
  ordered_json m = {{"role", "assistant"}, {"content", text ? ordered_json(*text) : ordered_json(nullptr)}};
  if (reasoning) m["reasoning_content"] = *reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  return m;
}

void ResponseStore::touch(Entry& e, const std::string& id) {
  lru_.erase(e.lru);
  lru_.push_front(id);
  e.lru = lru_.begin();
}

void ResponseStore::shrink() {
  while (!lru_.empty() && (entries_.size() > max_responses_ || bytes_ > max_bytes_)) {
    auto it = entries_.find(lru_.back());
    bytes_ -= it->second.bytes;
    if (on_evict_) on_evict_(it->first);
    entries_.erase(it);
    lru_.pop_back();
  }
}

void ResponseStore::on_evict(std::function<void(const std::string&)> f) {
  std::lock_guard<std::mutex> lock(mu_);
  on_evict_ = std::move(f);
}

void ResponseStore::put(const std::string& id, const std::string& previous_id, json response,
                        ordered_json turn_messages, ordered_json input_items) {
  std::lock_guard<std::mutex> lock(mu_);
  erase_locked(id);
  Entry e;
  e.previous = previous_id;
  e.bytes = response.dump(-1, ' ', false, json::error_handler_t::replace).size() +
            turn_messages.dump(-1, ' ', false, json::error_handler_t::replace).size() +
            input_items.dump(-1, ' ', false, json::error_handler_t::replace).size();
  e.response = std::move(response);
  e.messages = std::move(turn_messages);
  e.input_items = std::move(input_items);
  lru_.push_front(id);
  e.lru = lru_.begin();
  bytes_ += e.bytes;
  entries_.emplace(id, std::move(e));
  // Its chain is used with it: the conversation it continues stays as long as it does.
  std::string p = previous_id;
  for (size_t steps = 0; !p.empty() && steps < entries_.size(); ++steps) {
    auto it = entries_.find(p);
    if (it == entries_.end()) break;
    touch(it->second, p);
    p = it->second.previous;
  }
  // The new response is the most recent of all.
  touch(entries_.find(id)->second, id);
  shrink();
}

std::optional<json> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.response;
}

bool ResponseStore::set_status(const std::string& id, const std::string& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  it->second.response["status"] = status;
  return true;
}

std::optional<ordered_json> ResponseStore::input_items(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.input_items;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return erase_locked(id);
}

bool ResponseStore::erase_locked(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  return true;
}

Result<ordered_json> ResponseStore::conversation(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry*> chain;
  std::string p = id;
  while (!p.empty()) {
    auto it = entries_.find(p);
    if (it == entries_.end()) {
      if (p == id)
        return Error{ErrorCode::kNotFound,
                     fmt::format("no stored response '{}': responses are kept in this server's memory (the latest "
                                 "{} at most, with \"store\": true), not across restarts", id, max_responses_)};
      return Error{ErrorCode::kNotFound,
                   fmt::format("response '{}' continues '{}', which is no longer stored: send the conversation as "
                               "input instead", id, p)};
    }
    if (chain.size() > entries_.size()) return Error{ErrorCode::kInternal, "a cycle of stored responses"};
    const std::string status = it->second.response.value("status", "");
    if (status == "queued" || status == "in_progress")
      return Error{ErrorCode::kInvalidArgument,
                   fmt::format("response '{}' is a background response still {}: continue it once it has ended (GET "
                               "/v1/responses/{} shows its status)", p, status == "queued" ? "queued" : "in progress", p)};
    chain.push_back(&it->second);
    touch(it->second, p);
    p = it->second.previous;
  }
  ordered_json out = ordered_json::array();
  for (auto c = chain.rbegin(); c != chain.rend(); ++c)
    for (const ordered_json& m : (*c)->messages) out.push_back(m);
  return out;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace lragent::server
