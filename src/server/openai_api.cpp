#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/ranges.h>

#include "engine/guide/grammar.h"
#include "engine/guide/json_regex.h"

namespace lragent::server {
namespace {

using nlohmann::json;

Error bad(std::string msg) { return Error{ErrorCode::kInvalidArgument, std::move(msg)}; }

// The field, or null when absent (null and absent mean the default, as in the OpenAI API).
const json& field(const json& body, const char* name) {
  static const json kNull;
  const auto it = body.find(name);
  return it == body.end() ? kNull : *it;
}

Result<bool> get_bool(const json& body, const char* name, bool dflt) {
  const json& v = field(body, name);
  if (v.is_null()) return dflt;
  if (!v.is_boolean()) return bad(fmt::format("'{}' must be true or false, not {}", name, v.dump()));
  return v.get<bool>();
}

// An integer in [lo, hi]; JSON numbers like 16.0 are accepted (clients written in JavaScript send them).
// vLLM's per-request "chat_template": a template's text, or null / absent (empty).
Result<std::string> request_chat_template(const json& body) {
  const json& v = field(body, "chat_template");
  if (v.is_null()) return std::string();
  if (!v.is_string() || v.get<std::string>().empty())
    return Error{ErrorCode::kInvalidArgument, "'chat_template' must be the text of a Jinja chat template"};
  return v.get<std::string>();
}

Result<int64_t> get_int(const json& body, const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  const json& v = field(body, name);
  if (v.is_null()) return dflt;
  double d = 0;
  if (v.is_number_integer() || v.is_number_unsigned()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      return bad(fmt::format("'{}' must be in [{}, {}], not {}", name, lo, hi, v.dump()));
    const int64_t i = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
    if (i < lo || i > hi) return bad(fmt::format("'{}' must be in [{}, {}], not {}", name, lo, hi, i));
    return i;
  }
  if (v.is_number_float()) {
    d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
      return static_cast<int64_t>(d);
  }
  return bad(fmt::format("'{}' must be an integer in [{}, {}], not {}", name, lo, hi, v.dump()));
}

Result<double> get_number(const json& body, const char* name, double dflt, double lo, double hi) {
  const json& v = field(body, name);
  if (v.is_null()) return dflt;
  if (!v.is_number()) return bad(fmt::format("'{}' must be a number, not {}", name, v.dump()));
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi)) return bad(fmt::format("'{}' must be in [{}, {}], not {}", name, lo, hi, v.dump()));
  return d;
}

Result<std::vector<int32_t>> get_ids(const json& v, const std::string& what) {
  if (!v.is_array()) return bad(fmt::format("{} must be a list of token ids", what));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& e : v) {
    if (!e.is_number_integer() && !e.is_number_unsigned())
      return bad(fmt::format("{} must hold integer token ids, not {}", what, e.dump()));
    if (e.is_number_unsigned() ? e.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                               : (e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<int32_t>::max()))
      return bad(fmt::format("{} holds {}, which is no token id", what, e.dump()));
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return ids;
}

Result<std::vector<PromptInput>> get_prompts(const json& v) {
  std::vector<PromptInput> out;
  auto one = [&](const json& p, const std::string& what) -> Status {
    PromptInput in;
    if (p.is_string()) {
      in.text = p.get<std::string>();
    } else {
      LRA_ASSIGN_OR_RETURN(in.tokens, get_ids(p, what));
      in.is_tokens = true;
      if (in.tokens.empty()) return bad(fmt::format("{} is an empty list of token ids", what));
    }
    out.push_back(std::move(in));
    return Status::Ok();
  };
  if (v.is_null()) return bad("'prompt' is missing: give a string, a list of token ids, or a list of either");
  if (v.is_string()) {
    LRA_RETURN_IF_ERROR(one(v, "'prompt'"));
  } else if (!v.is_array()) {
    return bad(fmt::format("'prompt' must be a string or a list, not {}", v.type_name()));
  } else if (v.empty()) {
    return bad("'prompt' is an empty list");
  } else if (v[0].is_number()) {  // one prompt of token ids
    LRA_RETURN_IF_ERROR(one(v, "'prompt'"));
  } else {  // a batch: strings or lists of ids
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() && !v[i].is_array())
        return bad(fmt::format("'prompt'[{}] must be a string or a list of token ids, not {}", i, v[i].type_name()));
      LRA_RETURN_IF_ERROR(one(v[i], fmt::format("'prompt'[{}]", i)));
    }
  }
  return out;
}

// An OpenAI option lragent does not implement: accepted only at its neutral value.
Status neutral(const json& body, const char* name, const json& neutral_value, const char* why) {
  const json& v = field(body, name);
  if (v.is_null() || v == neutral_value) return Status::Ok();
  if (v.is_object() && v.empty() && neutral_value.is_null()) return Status::Ok();
  return Error{ErrorCode::kUnsupported, fmt::format("'{}' = {} is not supported: {}", name, v.dump(), why)};
}

Result<json> parse_body(std::string_view text) {
  if (!json_depth_within(text))
    return bad(fmt::format("the request body nests arrays and objects more than {} deep", kMaxJsonDepth));
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return bad("the request body is not valid JSON (send a JSON object, Content-Type: application/json)");
  if (!body.is_object()) return bad(fmt::format("the request body must be a JSON object, not {}", body.type_name()));
  return body;
}

// vLLM's continue_final_message, which cannot go with a generation prompt.
Result<bool> continue_final(const json& body, bool add_generation_prompt) {
  LRA_ASSIGN_OR_RETURN(bool on, get_bool(body, "continue_final_message", false));
  if (on && add_generation_prompt)
    return bad("'continue_final_message' and 'add_generation_prompt' cannot both be true: give \"add_generation_prompt\": "
               "false to continue the final message");
  return on;
}

// The fields completions and chat completions share (all but prompt/messages, max_tokens, echo).
Status parse_common(const json& body, std::string_view text, CompletionRequest& r, const SamplingDefaults& d);

// The model's max_new_tokens caps what a request asks for (vLLM takes the least of the two).
// `asked`: the request's max_tokens (-1: none, the rest of the context, which the server caps
// by max_tokens_cap once it knows the prompt's length).
int capped_max_tokens(int asked, const SamplingDefaults& d) {
  if (d.max_tokens <= 0 || asked < 0) return asked;
  return std::min(asked, d.max_tokens);
}

// min_tokens above the (possibly capped) max_tokens: an error that says where the cap came from.
Status check_min_tokens(const CompletionRequest& r, const char* budget, int asked) {
  if (r.max_tokens < 0 || r.min_tokens <= r.max_tokens) return Status::Ok();
  if (r.max_tokens != asked)
    return bad(fmt::format("'min_tokens' ({}) must not exceed the model's max_new_tokens ({}), which caps '{}' "
                           "(generation_config.json; serve --generation-config vllm to lift it)",
                           r.min_tokens, r.max_tokens, budget));
  return bad(fmt::format("'min_tokens' ({}) must not exceed '{}' ({})", r.min_tokens, budget, r.max_tokens));
}

}  // namespace

Result<CompletionRequest> parse_completion_request(std::string_view text, const SamplingDefaults& defaults) {
  LRA_ASSIGN_OR_RETURN(json body, parse_body(text));
  CompletionRequest r;
  LRA_ASSIGN_OR_RETURN(r.prompts, get_prompts(field(body, "prompt")));
  LRA_ASSIGN_OR_RETURN(int64_t max_tokens, get_int(body, "max_tokens", 16, 0, 1 << 24));
  r.max_tokens = capped_max_tokens(static_cast<int>(max_tokens), defaults);
  LRA_ASSIGN_OR_RETURN(r.echo, get_bool(body, "echo", false));
  if (r.max_tokens == 0 && !r.echo) return bad("'max_tokens' must be at least 1 (0 only with \"echo\": true)");
  LRA_RETURN_IF_ERROR(parse_common(body, text, r, defaults));
  LRA_RETURN_IF_ERROR(check_min_tokens(r, "max_tokens", static_cast<int>(max_tokens)));
  LRA_ASSIGN_OR_RETURN(int64_t logprobs, get_int(body, "logprobs", -1, 0, kLogprobsLimit));
  r.logprobs = static_cast<int>(logprobs);
  // echo with logprobs: the prompt's tokens come first in the logprobs object (OpenAI's legacy
  // completions; what lm-evaluation-harness asks a server for), computed as prompt_logprobs.
  // Streamed, they lead the first chunk (vLLM's way).
  if (r.logprobs >= 0 && r.echo) r.prompt_logprobs = std::max(r.prompt_logprobs, r.logprobs);
  LRA_RETURN_IF_ERROR(neutral(body, "suffix", json(nullptr), "lragent does not insert text"));
  return r;
}

Result<std::vector<std::vector<int32_t>>> bad_word_ids(const Tokenizer& tok, const std::vector<std::string>& words) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& word : words) {
    const std::string w(py_lstrip(word));  // vLLM's bad_word.lstrip()
    if (w.empty()) continue;
    LRA_ASSIGN_OR_RETURN(std::vector<int32_t> plain, tok.encode(w, /*add_special_tokens=*/false));
    if (plain.empty()) continue;
    LRA_ASSIGN_OR_RETURN(std::vector<int32_t> spaced, tok.encode(" " + w, /*add_special_tokens=*/false));
    const bool new_word = !spaced.empty() && spaced[0] != plain[0] && spaced.size() == plain.size();
    out.push_back(std::move(plain));
    if (new_word) out.push_back(std::move(spaced));
  }
  return out;
}

namespace {

// tool_choice "required" or {"type": "function", "function": {"name"}}: the regex of the calls
// (forced_tool_calls_regex, in the model's form). `other` says a structured output was given too.
Result<std::string> forced_tool_calls(ToolCallFormat format, const nlohmann::ordered_json& tools, const json& choice,
                                      bool other) {
  if (other) return bad("'tool_choice' forcing a call cannot be combined with another structured output");
  std::string name;  // empty: any tool ("required")
  if (choice.is_object()) {
    const json& f = field(choice, "function");
    if (field(choice, "type") != json("function") || !f.is_object() || !field(f, "name").is_string())
      return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                 "{\"name\": ...}}");
    name = field(f, "name").get<std::string>();
  } else if (choice != json("required")) {
    return bad(fmt::format("'tool_choice' = {} is not one of \"none\", \"auto\", \"required\" or a named function",
                           choice.dump()));
  }
  return forced_tool_calls_regex(format, tools, name);
}

}  // namespace

Result<ChatRequest> parse_chat_request(std::string_view text, ToolCallFormat tool_format,
                                       const SamplingDefaults& defaults) {
  LRA_ASSIGN_OR_RETURN(json body, parse_body(text));
  // Messages and tools keep the client's key order (the template writes them as JSON).
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  static const nlohmann::ordered_json kNull;
  auto ordered_field = [&](const char* name) -> const nlohmann::ordered_json& {
    const auto it = ordered.find(name);
    return it == ordered.end() ? kNull : *it;
  };
  ChatRequest c;
  LRA_ASSIGN_OR_RETURN(c.messages, parse_chat_messages(ordered_field("messages")));
  // max_completion_tokens (the current name) wins over max_tokens; neither: the rest of the context.
  const char* budget = field(body, "max_completion_tokens").is_null() ? "max_tokens" : "max_completion_tokens";
  LRA_ASSIGN_OR_RETURN(int64_t max_tokens, get_int(body, budget, -1, 1, 1 << 24));
  if (max_tokens < 0 && !field(body, budget).is_null()) return bad(fmt::format("'{}' must be at least 1", budget));
  c.req.max_tokens = capped_max_tokens(static_cast<int>(max_tokens), defaults);
  c.req.max_tokens_cap = defaults.max_tokens;
  LRA_RETURN_IF_ERROR(parse_common(body, text, c.req, defaults));
  LRA_RETURN_IF_ERROR(check_min_tokens(c.req, budget, static_cast<int>(max_tokens)));
  LRA_ASSIGN_OR_RETURN(c.add_generation_prompt, get_bool(body, "add_generation_prompt", true));
  const json& kw = field(body, "chat_template_kwargs");
  if (!kw.is_null()) {
    if (!kw.is_object()) return bad("'chat_template_kwargs' must be an object like {\"enable_thinking\": false}");
    LRA_ASSIGN_OR_RETURN(c.enable_thinking, get_bool(kw, "enable_thinking", true));
    c.template_kwargs = ordered_field("chat_template_kwargs");
  }
  LRA_ASSIGN_OR_RETURN(bool logprobs, get_bool(body, "logprobs", false));
  LRA_ASSIGN_OR_RETURN(int64_t top, get_int(body, "top_logprobs", -1, 0, kLogprobsLimit));
  if (top >= 0 && !logprobs) return bad("'top_logprobs' needs \"logprobs\": true");
  if (logprobs) c.req.logprobs = static_cast<int>(std::max<int64_t>(top, 0));
  LRA_RETURN_IF_ERROR(neutral(body, "echo", json(false), "a chat completion never repeats the conversation"));
  LRA_ASSIGN_OR_RETURN(c.continue_final_message, continue_final(body, c.add_generation_prompt));
  LRA_ASSIGN_OR_RETURN(int64_t budget_tokens, get_int(body, "thinking_token_budget", -1, 0, 1 << 24));
  c.req.thinking_token_budget = static_cast<int>(budget_tokens);
  LRA_ASSIGN_OR_RETURN(c.chat_template, request_chat_template(body));
  LRA_ASSIGN_OR_RETURN(c.tools, parse_chat_tools(ordered_field("tools")));
  LRA_RETURN_IF_ERROR(neutral(body, "functions", json(nullptr), "give the functions as 'tools'"));
  const json& choice = field(body, "tool_choice");
  if (!choice.is_null() && c.tools.empty())
    return bad("'tool_choice' needs 'tools': give the tool definitions, or leave tool_choice out");
  if (!c.tools.empty() && choice != json("none")) {
    c.tool_calls = tool_format;
    // Their markers are special tokens ([TOOL_CALLS], DeepSeek's <｜tool▁calls▁begin｜>): the
    // parser must see them, as vLLM's parsers ask.
    if (tool_format == ToolCallFormat::kMistral || tool_format == ToolCallFormat::kDeepSeekV3)
      c.req.skip_special_tokens = false;
  }
  if (!choice.is_null() && choice != json("none") && choice != json("auto")) {
    LRA_ASSIGN_OR_RETURN(c.req.guided_regex,
                         forced_tool_calls(tool_format, ordered_field("tools"), choice, !c.req.guided_from.empty()));
    c.req.guided_from = "tool_choice";
  }
  return c;
}

namespace {

using ordered_json = nlohmann::ordered_json;

// A JSON schema given as an object (or a boolean schema), or as its text (vLLM takes both), with
// its keys in the client's order (an object's properties are written in the schema's order).
Result<ordered_json> schema_value(const ordered_json& v, const std::string& where) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    ordered_json parsed = ordered_json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
      return bad(fmt::format("{} must be a JSON schema (an object, or its JSON text)", where));
    return parsed;
  }
  return bad(fmt::format("{} must be a JSON schema (an object, or its JSON text), not {}", where, v.type_name()));
}

Result<std::string> schema_regex(const ordered_json& schema, const std::string& where, const guide::JsonRegexOptions& o) {
  auto re = guide::json_schema_regex(schema, o);
  if (!re.ok()) return Error{re.error().code, fmt::format("{}: {}", where, re.error().message)};
  return *re;
}

Result<std::vector<std::string>> choice_list(const json& v, const std::string& where) {
  if (!v.is_array() || v.empty()) return bad(fmt::format("{} must be a non-empty list of strings", where));
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) return bad(fmt::format("{} must be a non-empty list of strings", where));
    out.push_back(c.get<std::string>());
  }
  return out;
}

// Structured outputs: OpenAI's response_format, vLLM's guided_* fields and its newer
// structured_outputs object, all compiled to one regex (engine/guide/json_regex.h).
Status parse_guided(const json& body, std::string_view text, CompletionRequest& r) {
  // The body again with its keys in order, for the schemas (parse_body has checked it).
  static const ordered_json kNull;
  const bool schemas = !field(body, "guided_json").is_null() || !field(body, "structured_outputs").is_null() ||
                       !field(body, "response_format").is_null() || !field(body, "json_schema").is_null();
  const ordered_json ordered = schemas ? ordered_json::parse(text, nullptr, /*allow_exceptions=*/false) : ordered_json();
  auto in_order = [&](std::initializer_list<const char*> path) -> const ordered_json& {
    const ordered_json* v = &ordered;
    for (const char* k : path) {
      if (!v->is_object() || !v->contains(k)) return kNull;
      v = &(*v)[k];
    }
    return *v;
  };
  guide::JsonRegexOptions o;
  const json& ws = field(body, "guided_whitespace_pattern");
  if (!ws.is_null()) {
    if (!ws.is_string()) return bad("'guided_whitespace_pattern' must be a regex string, like \"[ ]?\"");
    o.whitespace = ws.get<std::string>();
  }
  std::vector<std::string> given;  // the fields that constrain the output
  auto take = [&](const std::string& from, Result<std::string> re) -> Status {
    if (!re.ok()) return re.error();
    given.push_back(from);
    r.guided_regex = std::move(*re);
    r.guided_from = from;
    return Status::Ok();
  };
  // A GBNF grammar: compiled (and its errors reported) when the request is prepared, as a regex.
  auto take_grammar = [&](const std::string& from, const json& v) -> Status {
    if (!v.is_string())
      return bad(fmt::format("'{}' must be a GBNF grammar as a string, like \"root ::= \\\"yes\\\" | \\\"no\\\"\"", from));
    if (v.get<std::string>().empty()) return Status::Ok();  // no grammar, as vLLM and llama.cpp read ""
    given.push_back(from);
    r.guided_grammar = v.get<std::string>();
    r.guided_grammar_root = "root";
    // vLLM reads a grammar without "::=" as Lark's syntax and converts it.
    if (guide::looks_like_lark(r.guided_grammar)) {
      auto gbnf = guide::lark_to_gbnf(r.guided_grammar, &r.guided_grammar_root);
      if (!gbnf.ok())
        return Error{gbnf.error().code, fmt::format("'{}' (read as Lark's syntax: it has no '::='): {}", from,
                                                    gbnf.error().message)};
      r.guided_grammar = std::move(*gbnf);
    }
    r.guided_regex.clear();
    r.guided_from = from;
    return Status::Ok();
  };
  for (const char* g : {"guided_grammar", "grammar"})  // vLLM's; llama.cpp's
    if (const json& v = field(body, g); !v.is_null()) LRA_RETURN_IF_ERROR(take_grammar(g, v));
  for (const char* f : {"guided_json", "json_schema"}) {  // vLLM's; llama.cpp's
    if (field(body, f).is_null()) continue;
    const std::string where = fmt::format("'{}'", f);
    LRA_ASSIGN_OR_RETURN(ordered_json schema, schema_value(in_order({f}), where));
    LRA_RETURN_IF_ERROR(take(f, schema_regex(schema, where, o)));
  }
  if (const json& v = field(body, "guided_regex"); !v.is_null()) {
    if (!v.is_string()) return bad("'guided_regex' must be a string");
    LRA_RETURN_IF_ERROR(take("guided_regex", v.get<std::string>()));
  }
  if (const json& v = field(body, "guided_choice"); !v.is_null()) {
    LRA_ASSIGN_OR_RETURN(auto choices, choice_list(v, "'guided_choice'"));
    LRA_RETURN_IF_ERROR(take("guided_choice", guide::choice_regex(choices)));
  }
  if (const json& so = field(body, "structured_outputs"); !so.is_null()) {
    if (!so.is_object())
      return bad("'structured_outputs' must be an object like {\"json\": {...}}, {\"regex\": \"...\"} or {\"choice\": [...]}");
    for (const auto& [key, v] : so.items()) {
      const std::string name = "structured_outputs." + key;  // as guided_from: quoted where it is shown
      const std::string where = "'" + name + "'";
      if (key == "json") {
        LRA_ASSIGN_OR_RETURN(ordered_json schema, schema_value(in_order({"structured_outputs", "json"}), where));
        LRA_RETURN_IF_ERROR(take(name, schema_regex(schema, where, o)));
      } else if (key == "regex") {
        if (!v.is_string()) return bad(where + " must be a string");
        LRA_RETURN_IF_ERROR(take(name, v.get<std::string>()));
      } else if (key == "choice") {
        LRA_ASSIGN_OR_RETURN(auto choices, choice_list(v, where));
        LRA_RETURN_IF_ERROR(take(name, guide::choice_regex(choices)));
      } else if (key == "json_object") {
        if (v != json(true)) return bad(where + " must be true");
        LRA_RETURN_IF_ERROR(take(name, guide::json_object_regex(o)));
      } else if (key == "grammar") {
        LRA_RETURN_IF_ERROR(take_grammar(name, v));
      } else if (key == "structural_tag") {
        return Error{ErrorCode::kUnsupported, fmt::format("{} is not supported: use json, regex, choice or grammar", where)};
      } else if (!v.is_null() && key != "disable_any_whitespace" && key != "disable_fallback" &&
                 key != "disable_additional_properties" && key != "whitespace_pattern") {
        return bad(fmt::format("{} is not a structured_outputs field (json, regex, choice, grammar, json_object)", where));
      }
    }
  }
  if (const json& rf = field(body, "response_format"); !rf.is_null()) {
    const json& type = rf.is_object() ? field(rf, "type") : rf;
    if (!rf.is_object() || !type.is_string())
      return bad("'response_format' must be an object like {\"type\": \"json_object\"}");
    const std::string t = type.get<std::string>();
    if (t == "json_object") {
      LRA_RETURN_IF_ERROR(take("response_format", guide::json_object_regex(o)));
    } else if (t == "json_schema") {
      const json& js = field(rf, "json_schema");
      if (!js.is_object() || field(js, "schema").is_null())
        return bad("'response_format' of type json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}");
      LRA_ASSIGN_OR_RETURN(ordered_json schema, schema_value(in_order({"response_format", "json_schema", "schema"}),
                                                             "'response_format.json_schema.schema'"));
      LRA_RETURN_IF_ERROR(take("response_format", schema_regex(schema, "'response_format.json_schema.schema'", o)));
    } else if (t != "text") {
      return bad(fmt::format("'response_format' type \"{}\" is not one of text, json_object, json_schema", t));
    }
  }
  if (given.size() > 1)
    return bad(fmt::format("give one structured output at most; this request gives {}", fmt::join(given, " and ")));
  return Status::Ok();
}

Status parse_common(const json& body, std::string_view text, CompletionRequest& r, const SamplingDefaults& d) {
  const json& model = field(body, "model");
  if (!model.is_null()) {
    if (!model.is_string()) return bad("'model' must be a string: a name from GET /v1/models");
    r.model = model.get<std::string>();
  }
  const json& salt = field(body, "cache_salt");
  if (!salt.is_null()) {
    if (!salt.is_string() || salt.get<std::string>().empty())
      return bad("'cache_salt' must be a non-empty string: requests share cached prompts only with the same salt");
    r.cache_salt = salt.get<std::string>();
  }
  const json& request_id = field(body, "request_id");
  if (!request_id.is_null()) {
    if (!request_id.is_string() || !valid_request_id(request_id.get<std::string>()))
      return bad("'request_id' must be a string of 1-256 printable ASCII characters without spaces (it names the "
                 "request in its answer's id)");
    r.request_id = request_id.get<std::string>();
  }
  LRA_ASSIGN_OR_RETURN(int64_t n, get_int(body, "n", 1, 1, 64));
  r.n = static_cast<int>(n);
  LRA_ASSIGN_OR_RETURN(double temperature, get_number(body, "temperature", d.temperature, 0.0, 100.0));
  LRA_ASSIGN_OR_RETURN(double top_p, get_number(body, "top_p", d.top_p, 0.0, 1.0));
  if (top_p <= 0.0) return bad("'top_p' must be in (0, 1]: 0 would keep no token");
  // vLLM: -1 (and 0) turn top-k off.
  LRA_ASSIGN_OR_RETURN(int64_t top_k, get_int(body, "top_k", d.top_k, -1, std::numeric_limits<int32_t>::max()));
  r.sampling.temperature = static_cast<float>(temperature);
  r.sampling.top_p = static_cast<float>(top_p);
  r.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  const json& seed = field(body, "seed");
  if (!seed.is_null()) {
    if (!seed.is_number_integer() && !seed.is_number_unsigned()) return bad("'seed' must be an integer");
    r.sampling.seed = seed.is_number_unsigned() ? seed.get<uint64_t>() : static_cast<uint64_t>(seed.get<int64_t>());
    r.seeded = true;
  }
  const json& stop = field(body, "stop");
  if (stop.is_string()) {
    r.stop.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    for (const json& s : stop) {
      if (!s.is_string()) return bad("'stop' must be a string or a list of strings");
      r.stop.push_back(s.get<std::string>());
    }
  } else if (!stop.is_null()) {
    return bad("'stop' must be a string or a list of strings");
  }
  if (std::any_of(r.stop.begin(), r.stop.end(), [](const std::string& s) { return s.empty(); }))
    return bad("'stop' holds an empty string, which would end every completion before its first token");
  const json& stop_ids = field(body, "stop_token_ids");
  if (!stop_ids.is_null()) {
    LRA_ASSIGN_OR_RETURN(r.stop_token_ids, get_ids(stop_ids, "'stop_token_ids'"));
  }
  LRA_ASSIGN_OR_RETURN(r.ignore_eos, get_bool(body, "ignore_eos", false));
  LRA_ASSIGN_OR_RETURN(r.return_tokens_as_token_ids, get_bool(body, "return_tokens_as_token_ids", false));
  LRA_ASSIGN_OR_RETURN(r.skip_special_tokens, get_bool(body, "skip_special_tokens", true));
  LRA_ASSIGN_OR_RETURN(r.stream, get_bool(body, "stream", false));
  const json& so = field(body, "stream_options");
  if (!so.is_null()) {
    if (!so.is_object()) return bad("'stream_options' must be an object like {\"include_usage\": true}");
    if (!r.stream) return bad("'stream_options' is only allowed with \"stream\": true");
    LRA_ASSIGN_OR_RETURN(r.include_usage, get_bool(so, "include_usage", false));
    LRA_ASSIGN_OR_RETURN(bool continuous, get_bool(so, "continuous_usage_stats", false));
    r.continuous_usage = continuous && r.include_usage;  // vLLM's rule: only with include_usage
  }
  const json& best_of = field(body, "best_of");
  if (!best_of.is_null() && best_of != json(r.n))
    return Error{ErrorCode::kUnsupported, "'best_of' other than 'n' is not supported: every completion is returned"};
  const json& bias = field(body, "logit_bias");
  if (!bias.is_null()) {
    if (!bias.is_object()) return bad("'logit_bias' must be an object of token id (a string) to bias, like {\"50256\": -100}");
    for (const auto& [key, value] : bias.items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > std::numeric_limits<int32_t>::max())
        return bad(fmt::format("'logit_bias' key \"{}\" is not a token id", key));
      if (!value.is_number() || !std::isfinite(value.get<double>()))
        return bad(fmt::format("'logit_bias'[\"{}\"] must be a number", key));
      r.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(std::clamp(value.get<double>(), -100.0, 100.0)));
    }
  }
  // vLLM's extensions.
  LRA_ASSIGN_OR_RETURN(int64_t min_tokens, get_int(body, "min_tokens", 0, 0, 1 << 24));
  r.min_tokens = static_cast<int>(min_tokens);
  LRA_ASSIGN_OR_RETURN(double min_p, get_number(body, "min_p", d.min_p, 0.0, 1.0));
  r.min_p = static_cast<float>(min_p);
  LRA_ASSIGN_OR_RETURN(r.include_stop_str_in_output, get_bool(body, "include_stop_str_in_output", false));
  LRA_ASSIGN_OR_RETURN(int64_t truncate, get_int(body, "truncate_prompt_tokens", 0, -1, 1 << 24));
  if (truncate == 0 && !field(body, "truncate_prompt_tokens").is_null())
    return bad("'truncate_prompt_tokens' must be at least 1 (the prompt tokens to keep), or -1 for the model's context length");
  r.truncate_prompt_tokens = static_cast<int>(truncate);
  LRA_ASSIGN_OR_RETURN(r.priority, get_int(body, "priority", 0, std::numeric_limits<int32_t>::min(),
                                           std::numeric_limits<int32_t>::max()));
  LRA_ASSIGN_OR_RETURN(int64_t prompt_logprobs, get_int(body, "prompt_logprobs", -1, 0, kLogprobsLimit));
  r.prompt_logprobs = static_cast<int>(prompt_logprobs);
  r.show_prompt_logprobs = r.prompt_logprobs >= 0;
  // A streamed chunk has no place for them: vLLM refuses a count above 0 with "stream" and takes
  // 0, which then shows nothing (and is not computed here).
  if (r.stream && r.prompt_logprobs > 0)
    return Error{ErrorCode::kUnsupported,
                 "'prompt_logprobs' are not available with \"stream\": true (a streamed chunk has no place for "
                 "them): send the request with \"stream\": false, or, on /v1/completions, ask for \"echo\": true "
                 "with \"logprobs\", whose first chunk leads with the prompt's tokens"};
  if (r.stream) {
    r.prompt_logprobs = -1;
    r.show_prompt_logprobs = false;
  }
  // Present at all: refused.
  const json& allowed = field(body, "allowed_token_ids");
  if (!allowed.is_null()) {
    LRA_ASSIGN_OR_RETURN(r.allowed_token_ids, get_ids(allowed, "'allowed_token_ids'"));
    if (r.allowed_token_ids.empty()) return bad("'allowed_token_ids' is empty: it would allow no token at all");
  }
  if (const json& words = field(body, "bad_words"); !words.is_null()) {
    if (!words.is_array()) return bad("'bad_words' must be a list of strings (words never to generate)");
    for (const json& w : words) {
      if (!w.is_string() || py_strip(w.get<std::string>()).empty())
        return bad("'bad_words' must be a list of non-empty strings (words never to generate)");
      r.bad_words.push_back(w.get<std::string>());
    }
  }
  if (!field(body, "logits_processors").is_null())
    return Error{ErrorCode::kUnsupported,
                 "'logits_processors' is not supported: lragent runs no custom logits processors (its structured "
                 "outputs take guided_json, guided_regex, guided_choice, guided_grammar, structured_outputs or "
                 "response_format)"};
  LRA_RETURN_IF_ERROR(neutral(body, "use_beam_search", json(false), "lragent does not run beam search"));
  LRA_RETURN_IF_ERROR(neutral(body, "length_penalty", json(1), "it applies to beam search, which lragent does not run"));
  LRA_RETURN_IF_ERROR(parse_guided(body, text, r));
  LRA_ASSIGN_OR_RETURN(double presence, get_number(body, "presence_penalty", 0.0, -2.0, 2.0));
  LRA_ASSIGN_OR_RETURN(double frequency, get_number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  LRA_ASSIGN_OR_RETURN(double repetition, get_number(body, "repetition_penalty", d.repetition_penalty, 0.0, 100.0));
  if (repetition <= 0.0) return bad("'repetition_penalty' must be > 0 (1: off)");
  r.penalties = {static_cast<float>(repetition), static_cast<float>(frequency), static_cast<float>(presence)};
  return Status::Ok();
}

}  // namespace

namespace {

Result<std::string> get_model(const json& body) {
  const json& model = field(body, "model");
  if (model.is_null()) return std::string();
  if (!model.is_string()) return bad("'model' must be a string: a name from GET /v1/models");
  return model.get<std::string>();
}

}  // namespace

Result<TokenizeRequest> parse_tokenize_request(std::string_view text) {
  LRA_ASSIGN_OR_RETURN(json body, parse_body(text));
  TokenizeRequest r;
  LRA_ASSIGN_OR_RETURN(r.model, get_model(body));
  const json& prompt = field(body, "prompt");
  const json& messages = field(body, "messages");
  if (prompt.is_null() == messages.is_null())
    return bad("give either 'prompt' (a string) or 'messages' (a chat conversation), not both or neither");
  if (!prompt.is_null()) {
    if (!prompt.is_string()) return bad(fmt::format("'prompt' must be a string, not {}", prompt.type_name()));
    r.prompt = prompt.get<std::string>();
  } else {
    r.chat = true;
    // In the client's key order, as chat completions read them.
    const auto ordered = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    LRA_ASSIGN_OR_RETURN(r.messages, parse_chat_messages(ordered["messages"]));
    if (ordered.contains("tools")) {
      LRA_ASSIGN_OR_RETURN(r.tools, parse_chat_tools(ordered["tools"]));
    }
    LRA_ASSIGN_OR_RETURN(r.chat_template, request_chat_template(body));
    LRA_ASSIGN_OR_RETURN(r.add_generation_prompt, get_bool(body, "add_generation_prompt", true));
    LRA_ASSIGN_OR_RETURN(r.continue_final_message, continue_final(body, r.add_generation_prompt));
    const json& kw = field(body, "chat_template_kwargs");
    if (!kw.is_null()) {
      if (!kw.is_object()) return bad("'chat_template_kwargs' must be an object like {\"enable_thinking\": false}");
      LRA_ASSIGN_OR_RETURN(r.enable_thinking, get_bool(kw, "enable_thinking", true));
      r.template_kwargs = ordered["chat_template_kwargs"];
    }
  }
  LRA_ASSIGN_OR_RETURN(r.add_special_tokens, get_bool(body, "add_special_tokens", !r.chat));
  LRA_ASSIGN_OR_RETURN(r.return_token_strs, get_bool(body, "return_token_strs", false));
  return r;
}

Result<DetokenizeRequest> parse_detokenize_request(std::string_view text) {
  LRA_ASSIGN_OR_RETURN(json body, parse_body(text));
  DetokenizeRequest r;
  LRA_ASSIGN_OR_RETURN(r.model, get_model(body));
  const json& tokens = field(body, "tokens");
  if (tokens.is_null()) return bad("'tokens' is missing: give a list of token ids");
  LRA_ASSIGN_OR_RETURN(r.tokens, get_ids(tokens, "'tokens'"));
  return r;
}

namespace {

Result<std::string> non_empty_string(const json& body, const char* name) {
  const json& v = field(body, name);
  if (v.is_null()) return bad(fmt::format("'{}' is missing", name));
  if (!v.is_string() || v.get<std::string>().empty())
    return bad(fmt::format("'{}' must be a non-empty string, not {}", name, v.dump()));
  return v.get<std::string>();
}

}  // namespace

Result<LoraAdapterRequest> parse_load_lora_request(std::string_view text) {
  LRA_ASSIGN_OR_RETURN(json body, parse_body(text));
  LoraAdapterRequest r;
  LRA_ASSIGN_OR_RETURN(r.name, non_empty_string(body, "lora_name"));
  LRA_ASSIGN_OR_RETURN(r.path, non_empty_string(body, "lora_path"));
  LRA_ASSIGN_OR_RETURN(r.inplace, get_bool(body, "load_inplace", false));
  return r;
}

Result<LoraAdapterRequest> parse_unload_lora_request(std::string_view text) {
  LRA_ASSIGN_OR_RETURN(json body, parse_body(text));
  LoraAdapterRequest r;
  LRA_ASSIGN_OR_RETURN(r.name, non_empty_string(body, "lora_name"));
  return r;
}

}  // namespace lragent::server
