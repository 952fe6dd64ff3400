// libFuzzer target: arbitrary bytes as the body of POST /v1/completions, of POST
// /v1/chat/completions (then rendered with each chat template), of POST /v1/responses, POST
// /v1/messages and /v1/load_lora_adapter, as a tokenizer_config.json's chat_template, and as a
// generation_config.json. Each parser must return a value or an error (never crash or throw), and what
// it accepts must hold the invariants the server relies on.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/cors.h"
#include "server/messages_api.h"
#include "server/openai_api.h"
#include "server/python_calls_stream.h"
#include "server/responses_api.h"
#include "server/sampling_defaults.h"

namespace {

void fuzz_chat(const std::string& text) {
  using namespace lragent::server;
  for (ToolCallFormat f : {ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral, ToolCallFormat::kDeepSeekV3}) {  // forced calls in their forms
    auto other = parse_chat_request(text, f);
    if (!other.ok() && other.error().message.empty()) __builtin_trap();
  }
  auto c = parse_chat_request(text);
  if (!c.ok()) {
    if (c.error().message.empty()) __builtin_trap();
    return;
  }
  if (c->messages.empty() || (c->req.max_tokens < 1 && c->req.max_tokens != -1)) __builtin_trap();
  if (c->req.logprobs < -1 || c->req.logprobs > kLogprobsLimit) __builtin_trap();
  for (ChatFormat f : {ChatFormat::kLlama3, ChatFormat::kQwen3}) {
    ChatTemplate t;
    t.format = f;
    t.bos_token = "<s>";
    auto out = t.render(c->messages, c->add_generation_prompt, c->enable_thinking);
    if (!out.ok()) continue;
    // Every message's role is written (Llama-3) or its turn opened (Qwen3): the text is not empty.
    if (out->empty()) __builtin_trap();
  }
  (void)ChatTemplate::from_tokenizer_config(text, "<fuzz config>");
}

// POST /v1/responses: the body, the chat body it runs as (which the chat parser must take or
// refuse with a reason), and its output items built from the body's own bytes as text.
void fuzz_responses(const std::string& text) {
  using namespace lragent::server;
  auto r = parse_responses_request(text);
  if (!r.ok()) {
    if (r.error().message.empty()) __builtin_trap();
    return;
  }
  if (r->input_messages.empty() && !r->input_messages.is_array()) __builtin_trap();
  const std::string body = chat_body(*r, nlohmann::ordered_json::array());
  auto c = parse_chat_request(body);
  if (!c.ok() && c.error().message.empty()) __builtin_trap();
  ResponseBuilder b("resp_fuzz", 0, r->model, *r);
  std::vector<nlohmann::json> events;
  b.begin(events);
  const size_t half = text.size() / 2;
  b.reasoning(text.substr(0, half), events);
  b.text(text.substr(half), events);
  b.finish(nlohmann::json::array(), "stop", {}, events);
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i]["sequence_number"] != i) __builtin_trap();
  (void)b.assistant_message().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// POST /v1/messages (Anthropic's): the body, the chat body it runs as, and its content blocks
// built from the body's own bytes (as text and as a tool call's arguments).
void fuzz_messages(const std::string& text) {
  using namespace lragent::server;
  (void)parse_count_tokens_request(text);
  auto m = parse_messages_request(text);
  if (!m.ok()) {
    if (m.error().message.empty()) __builtin_trap();
    return;
  }
  auto c = parse_chat_request(m->chat.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  if (!c.ok() && c.error().message.empty()) __builtin_trap();
  MessageBuilder b("msg_fuzz", m->model, 7);
  std::vector<nlohmann::json> events;
  b.begin(events);
  b.thinking(text.substr(0, text.size() / 3), events);
  b.text(text.substr(text.size() / 3), events);
  const nlohmann::json calls = {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", text}}}}};
  b.finish(calls, "stop", std::nullopt, 3, 9, events);
  if (events.back()["type"] != "message_stop" || !b.message()["content"].back()["input"].is_object()) __builtin_trap();
}

// /tokenize and /detokenize bodies.
void fuzz_tokenize(const std::string& text) {
  using namespace lragent::server;
  auto t = parse_tokenize_request(text);
  if (!t.ok()) {
    if (t.error().message.empty()) __builtin_trap();
  } else if (t->chat == t->messages.empty()) {  // messages given exactly when chat (and never empty)
    __builtin_trap();
  }
  auto d = parse_detokenize_request(text);
  if (!d.ok()) {
    if (d.error().message.empty()) __builtin_trap();
  } else {
    for (int32_t id : d->tokens)
      if (id < 0) __builtin_trap();
  }
}


// A completion's text through each tool-call parser, whole and streamed; a JSON value through
// Python's dumps.
// Whether some object in a JSON text names a key twice (the parser keeps one; a stream sent both).
bool repeats_a_key(const std::string& text) {
  std::vector<std::vector<std::string>> open;  // the keys of each object being read, innermost last
  bool repeated = false;
  const auto seen = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) open.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !open.empty()) {
      const std::string key = parsed.get<std::string>();
      if (std::find(open.back().begin(), open.back().end(), key) != open.back().end()) repeated = true;
      open.back().push_back(key);
    }
    return true;
  };
  (void)nlohmann::json::parse(text, seen, false);
  return repeated;
}

void fuzz_tool_calls(const std::string& text) {
  using namespace lragent::server;
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
                           ToolCallFormat::kDeepSeekV3, ToolCallFormat::kPythonic}) {
    const ParsedToolCalls p = parse_tool_calls(f, text);
    const bool by_start = f == ToolCallFormat::kLlama3Json || f == ToolCallFormat::kPythonic;
    // Content beside calls is the text before them (llama3_json, pythonic: none); no calls: the
    // text (mistral: the text without its markers, stripped, when it had one).
    if (!p.calls.empty() && text.compare(0, p.content.size(), p.content) != 0) __builtin_trap();
    if (!p.calls.empty() && by_start && !p.content.empty()) __builtin_trap();
    if (p.calls.empty() && f != ToolCallFormat::kMistral && p.content != text) __builtin_trap();
    for (const ToolCall& c : p.calls)  // deepseek_v3 keeps the arguments as written, as vLLM does
      if (f != ToolCallFormat::kDeepSeekV3 && nlohmann::ordered_json::parse(c.arguments, nullptr, false).is_discarded())
        __builtin_trap();
    // Streamed in pieces of 1-7 bytes: the content that goes out and the calls are the parse's
    // (or the whole text and no calls: a Llama completion that does not begin with a call).
    ToolCallStream stream(f), incremental(f, /*incremental=*/true);
    std::string shown, shown_incremental;
    nlohmann::json joined = nlohmann::json::array();  // the incremental stream's deltas joined by index
    auto join = [&](const nlohmann::json& deltas) {
      for (const auto& d : deltas) {
        const size_t k = d["index"];
        if (k > joined.size() || (k == joined.size()) != d.contains("id")) __builtin_trap();  // a call opens once, in order
        if (k == joined.size()) joined.push_back({{"name", d["function"]["name"]}, {"arguments", ""}, {"id", d["id"]}});
        joined[k]["arguments"] = joined[k]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
      }
    };
    for (size_t at = 0, k = 0; at < text.size(); ++k) {
      const size_t n = std::min(text.size() - at, 1 + k % 7);
      shown += stream.push(text.substr(at, n)).content;
      ToolCallStream::Piece piece = incremental.push(text.substr(at, n));
      shown_incremental += piece.content;
      join(piece.tool_calls);
      at += n;
    }
    const ToolCallStream::End end = stream.finish();
    const ToolCallStream::End incremental_end = incremental.finish();
    join(incremental_end.deltas);
    // The incremental deltas add up to the calls its end reports; its content is the other's, but
    // for held text that a call already went out for.
    if (joined.size() != incremental_end.tool_calls.size()) __builtin_trap();
    for (size_t k = 0; k < joined.size(); ++k)
      if (joined[k]["arguments"] != incremental_end.tool_calls[k]["function"]["arguments"] ||
          joined[k]["id"] != incremental_end.tool_calls[k]["id"])
        __builtin_trap();
    if (!end.tool_calls.empty() && shown_incremental + incremental_end.content != shown + end.content) __builtin_trap();
    const char opener = f == ToolCallFormat::kPythonic ? '[' : '{';
    const bool streamed_calls = !by_start || (!text.empty() && text[0] == opener);
    if (streamed_calls && end.tool_calls.size() != p.calls.size()) __builtin_trap();
    if (end.tool_calls.size() != 0 && end.tool_calls.size() != p.calls.size()) __builtin_trap();
    if (shown + end.content != (end.tool_calls.empty() ? text : p.content)) __builtin_trap();
    for (const auto& call : end.tool_calls)
      if (f == ToolCallFormat::kMistral && call["id"].get<std::string>().size() != 9) __builtin_trap();
  }
  // Pythonic calls read as they are written (PyCallsStream, in pieces of 1-5 bytes): whatever the
  // whole parse reads as calls, the stream reads to its end with the same names and, when its
  // strings are UTF-8 and no dict repeats a key, the same arguments (each piece only appends, so
  // every piece sent was a prefix of them).
  {
    PyCallsStream py;
    for (size_t at = 0, k = 0; at < text.size() && !py.failed() && !py.done(); ++k) {
      at = std::min(text.size(), at + 1 + k % 5);
      py.read(std::string_view(text).substr(0, at));
    }
    const ParsedToolCalls whole = parse_tool_calls(ToolCallFormat::kPythonic, text);
    if (!whole.calls.empty()) {
      if (!py.done() || py.calls().size() != whole.calls.size()) __builtin_trap();
      bool utf8 = true;
      try {
        (void)nlohmann::json(text).dump();
      } catch (const nlohmann::json::exception&) {
        utf8 = false;
      }
      for (size_t k = 0; k < whole.calls.size(); ++k) {
        if (py.calls()[k].name != whole.calls[k].name) __builtin_trap();
        if (utf8 && !py.repeated_key() && py.calls()[k].arguments != whole.calls[k].arguments) __builtin_trap();
      }
    }
  }
  // Reasoning split off whole and streamed: the same parts.
  for (bool thinking : {true, false}) {
    const ReasoningSplit whole = split_reasoning(text, thinking);
    ReasoningStream stream(thinking);
    std::string reasoning, content;
    for (size_t at = 0, k = 0; at < text.size(); ++k) {
      const size_t n = std::min(text.size() - at, 1 + k % 5);
      const ReasoningStream::Piece p = stream.push(text.substr(at, n));
      reasoning += p.reasoning;
      content += p.content;
      at += n;
    }
    const ReasoningStream::Piece last = stream.finish();
    if (reasoning + last.reasoning != whole.reasoning.value_or("") || content + last.content != whole.content.value_or(""))
      __builtin_trap();
  }
  const auto v = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!v.is_discarded()) {
    // What it writes reads back as the same value (when the strings were valid UTF-8).
    const auto back = nlohmann::ordered_json::parse(python_json_dumps(v), nullptr, false);
    if (back.is_discarded()) __builtin_trap();
  }
  // Read piece by piece (PyJsonStream), a JSON text is written as python_json_dumps writes it
  // whole (a top-level number or literal waits for a character after it: a space is added); an
  // object that repeats a key is the one difference (the stream sent both).
  for (bool ascii : {false, true}) {
    PyJsonStream js(ascii);
    std::string fed, out;
    const std::string padded = text + " ";
    for (size_t at = 0, k = 0; at < padded.size() && !js.done() && !js.failed(); ++k) {
      fed += padded.substr(at, 1 + k % 5);
      at += 1 + k % 5;
      js.read(fed, &out);
    }
    if (v.is_discarded() || text.starts_with("\xEF\xBB\xBF")) continue;  // (nlohmann skips a byte order mark)
    if (!js.done() && json_depth_within(text)) __builtin_trap();  // a JSON value it could not follow
    if (!js.done()) continue;
    const auto streamed = nlohmann::ordered_json::parse(out, nullptr, false);
    if (!streamed.is_discarded() && streamed == v && out != python_json_dumps(v, ascii) && !repeats_a_key(text))
      __builtin_trap();
  }
}

// The bytes as a generation_config.json and as --override-generation-config: sampling defaults
// or a reason. Defaults it takes make a valid request of one that gives no field, capped by them.
void fuzz_generation_config(const std::string& text) {
  using namespace lragent::server;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return;
  for (bool as_override : {false, true}) {
    auto d = as_override ? sampling_defaults_from(nlohmann::json::object(), "fuzz", j) : sampling_defaults_from(j, "fuzz");
    if (!d.ok()) {
      if (d.error().message.empty()) __builtin_trap();
      continue;
    }
    auto r = parse_completion_request(R"({"prompt": "a"})", *d);
    if (!r.ok() || (d->max_tokens > 0 && r->max_tokens > d->max_tokens)) __builtin_trap();
    if (!(r->sampling.top_p > 0 && r->sampling.top_p <= 1) || r->sampling.temperature < 0 || r->sampling.top_k < 0)
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz_chat(text);
  fuzz_responses(text);
  fuzz_messages(text);
  fuzz_tokenize(text);
  fuzz_tool_calls(text);
  fuzz_generation_config(text);
  // The CORS flags' lists, and a preflight asking for the bytes as its headers: a list or a reason;
  // a preflight allowed only where the options allow it.
  if (auto l = lragent::server::parse_cors_list(text, "--allowed-origins"); !l.ok() && l.error().message.empty())
    __builtin_trap();
  lragent::server::CorsOptions strict;
  strict.allowed_origins = {"https://app.example"};
  strict.allowed_headers = {"Authorization"};
  const auto p = lragent::server::cors_preflight(strict, text, "POST", text);
  if (p.status == 200 && text != "https://app.example") __builtin_trap();
  if (p.status != 200 && p.body.find("Disallowed CORS") != 0) __builtin_trap();
  // vLLM's runtime LoRA bodies: a name (and for a load a path) or a reason.
  for (bool load : {true, false}) {
    auto l = load ? lragent::server::parse_load_lora_request(text) : lragent::server::parse_unload_lora_request(text);
    if (!l.ok() ? l.error().message.empty() : l->name.empty() || (load && l->path.empty())) __builtin_trap();
  }
  auto r = lragent::server::parse_completion_request(text);
  if (!r.ok()) {
    if (r.error().message.empty()) __builtin_trap();
    // The error body is valid JSON text whatever the message holds.
    const std::string body =
        lragent::server::error_json(r.error()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (body.empty() || lragent::server::http_status(r.error().code) != 400) __builtin_trap();
    return 0;
  }
  const auto& q = *r;
  if (q.prompts.empty() || q.n < 1 || q.max_tokens < 0) __builtin_trap();
  for (const auto& p : q.prompts)
    if (p.is_tokens && (p.tokens.empty() || *std::min_element(p.tokens.begin(), p.tokens.end()) < 0)) __builtin_trap();
  for (const auto& s : q.stop)
    if (s.empty()) __builtin_trap();
  if (!std::isfinite(q.sampling.temperature) || q.sampling.temperature < 0) __builtin_trap();
  if (!(q.sampling.top_p > 0 && q.sampling.top_p <= 1) || q.sampling.top_k < 0) __builtin_trap();
  if (q.include_usage && !q.stream) __builtin_trap();
  if (!(q.penalties.repetition > 0) || !std::isfinite(q.penalties.frequency) || !std::isfinite(q.penalties.presence))
    __builtin_trap();
  if (q.max_tokens == 0 && !q.echo) __builtin_trap();
  // The server's logprobs JSON takes any count in range; echo with them is refused.
  if (q.logprobs < -1 || q.logprobs > lragent::server::kLogprobsLimit || (q.logprobs >= 0 && q.echo)) __builtin_trap();
  if (q.min_tokens < 0 || q.min_tokens > q.max_tokens || !(q.min_p >= 0 && q.min_p <= 1)) __builtin_trap();
  for (const auto& [id, bias] : q.logit_bias)
    if (id < 0 || !(bias >= -100 && bias <= 100)) __builtin_trap();
  for (const auto& w : q.bad_words)
    if (lragent::server::py_strip(w).empty()) __builtin_trap();
  if (q.truncate_prompt_tokens < -1 || (q.continuous_usage && !q.include_usage)) __builtin_trap();
  return 0;
}
