// The OpenAI-compatible completions API as vLLM serves it: parsing a request body into a
// CompletionRequest, the text a completion shows (stop strings cut, special tokens left out),
// and the JSON of responses, stream chunks and errors. No HTTP here (server.h does that), so
// all of it is tested and fuzzed without a socket.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "engine/sampler.h"
#include "server/chat_template.h"
#include "server/reasoning.h"
#include "server/sampling_defaults.h"
#include "server/tool_call_stream.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace lragent::server {

// One prompt: text (tokenized by the server, BOS added as vLLM does) or token ids (used as given).
struct PromptInput {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
  bool add_special_tokens = true;  // text: BOS added (false for a rendered chat, which has its own)
};

// POST /v1/completions. Defaults are the OpenAI API's (and vLLM's): max_tokens 16, temperature 1.
struct CompletionRequest {
  std::string model;                 // empty: the server's base model
  std::vector<PromptInput> prompts;  // at least one ("prompt" may be a list)
  int max_tokens = 16;
  // Chat without max_tokens (max_tokens -1): the rest of the context, but at most this many when
  // > 0 (the model's max_new_tokens: SamplingDefaults::max_tokens), as vLLM takes the least.
  int max_tokens_cap = 0;
  int n = 1;                         // completions per prompt
  SamplingParams sampling{1.f, 0, 1.f, 0};
  bool seeded = false;               // "seed" given; otherwise the server draws one
  PenaltyParams penalties;           // presence_penalty, frequency_penalty, repetition_penalty (vLLM's)
  std::vector<std::string> stop;     // stop strings: generation ends there, the string is not shown
  std::vector<int32_t> stop_token_ids;  // vLLM extension: these ids end generation too
  bool ignore_eos = false;              // vLLM extension
  // vLLM's truncate_prompt_tokens: > 0, only the prompt's last this many tokens are kept (left
  // truncation); -1: the model's context length (the server's max_model_len); 0: no truncation.
  int truncate_prompt_tokens = 0;
  // vLLM extension: the text ends after the stop string that ended it, not before, and a stop
  // token id that ended it is shown (unless it is a special token skip_special_tokens leaves out).
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;      // vLLM extension
  bool echo = false;                    // prepend the prompt's text to each completion
  bool stream = false;                  // server-sent events
  bool include_usage = false;           // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM's), with include_usage: every chunk carries its
  // choice's usage so far.
  bool continuous_usage = false;
  // -1: none. Otherwise each generated token's log-probability (the model's raw output) and
  // this many most likely tokens per position: completions' "logprobs" (0-20), chat's
  // "top_logprobs" (0-20) when "logprobs" is true.
  int logprobs = -1;
  // vLLM's return_tokens_as_token_ids: the logprobs' tokens read "token_id:<id>" (a token whose
  // bytes are not text stays identifiable); prompt_logprobs keep their decoded text, as vLLM's.
  bool return_tokens_as_token_ids = false;
  // -1: none. Otherwise vLLM's prompt_logprobs: each prompt token's log-probability given those
  // before it, its rank, and this many most likely tokens per position (0-20), computed on a
  // trajectory of the request's own (none of the prompt read from a cache). Set by the
  // "prompt_logprobs" field (show_prompt_logprobs: a choice's "prompt_logprobs" list), or, on
  // /v1/completions, by "logprobs" with "echo": true (the legacy logprobs object then starts with
  // the prompt's tokens; streamed, they lead the first chunk). The field is refused with stream
  // above 0 (as vLLM), and 0 with stream is taken and computes nothing.
  int prompt_logprobs = -1;
  bool show_prompt_logprobs = false;
  // vLLM's logits processors (AgentDecode): OpenAI's logit_bias ({"id": bias}, clamped to
  // [-100, 100] as vLLM clamps), vLLM's min_tokens (no stop id nor stop string before it) and min_p.
  std::vector<std::pair<int32_t, float>> logit_bias;
  int min_tokens = 0;
  float min_p = 0.f;
  // vLLM's allowed_token_ids: only these ids may be generated (empty: any).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words: words never generated (the server tokenizes them as vLLM does, with and
  // without a leading space; AgentDecode::bad_words).
  std::vector<std::string> bad_words;
  // vLLM's thinking_token_budget (chat; Anthropic's budget_tokens): once its thinking block holds
  // this many tokens a thinking model is made to write "</think>" (AgentDecode::reasoning_budget);
  // -1: none. Needs the server's reasoning parser.
  int thinking_token_budget = -1;
  // vLLM's priority: under --scheduling-policy priority, waiting requests start lowest value
  // first (arrival order among equals) and the engine preempts the highest value first when
  // the KV memory runs out; else only 0 is taken.
  int64_t priority = 0;
  // Structured output: the completion's text matches this regex whole (engine/guide/byte_dfa.h's
  // dialect), made from whichever of OpenAI's response_format (json_object, json_schema) and
  // vLLM's guided_json, guided_regex, guided_choice or structured_outputs the request gave (one
  // at most). Empty `guided_from`: free text.
  std::string guided_regex;
  // Or a GBNF grammar (engine/guide/grammar.h) from vLLM's guided_grammar / structured_outputs.grammar
  // or llama.cpp's grammar, starting at guided_grammar_root; guided_regex is then empty.
  std::string guided_grammar;
  std::string guided_grammar_root = "root";
  std::string guided_from;  // the field it came from, for errors ("guided_json", "response_format", ...)
  // vLLM's cache_salt: the request shares kept trajectories (their KV cache) only with requests
  // of the same salt (SessionPool::acquire); empty: with the other unsalted ones.
  std::string cache_salt;
  // vLLM's request_id: names the request in its answer's id ("cmpl-<id>", "chatcmpl-<id>"),
  // unless an X-Request-Id header does; empty: a random one. 1-256 printable ASCII characters.
  std::string request_id;
};

// Whether `id` can name a request (request_id, X-Request-Id): 1-256 printable ASCII characters
// and no space, so that it fits an HTTP header and a log line as it is.
bool valid_request_id(std::string_view id);
// Log-probabilities a request may ask for per token: the parsers take up to kLogprobsLimit, the
// server then holds a request to its --max-logprobs (ServerOptions::max_logprobs; default
// kDefaultMaxLogprobs, vLLM's default and OpenAI's chat limit).
constexpr int kDefaultMaxLogprobs = 20;
constexpr int kLogprobsLimit = 1 << 20;

// Parses and validates a request body. Errors (kInvalidArgument, or kUnsupported for an OpenAI
// option lragent does not implement, e.g. logprobs) name the field and say what is allowed.
// Fields the API does not know are ignored, as vLLM ignores them.
// `defaults`: what a field the body leaves out (or sets to null) is; its max_tokens caps the
// request's (SamplingDefaults).
Result<CompletionRequest> parse_completion_request(std::string_view body, const SamplingDefaults& defaults = {});

// vLLM's bad_words as token ids, tokenized as vLLM does: each word without its leading
// whitespace, and again after one space when that gives as many tokens starting with another
// (so the word is out both at the start of the text and after a space).
Result<std::vector<std::vector<int32_t>>> bad_word_ids(const Tokenizer& tok, const std::vector<std::string>& words);

// POST /v1/chat/completions: the shared fields in `req` (its prompt is the rendered
// conversation, made by the server), max_tokens -1 meaning the rest of the context (as vLLM).
struct ChatRequest {
  CompletionRequest req;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  // vLLM extension
  // vLLM extension: the conversation's final message is continued (cut after its text) instead
  // of a new turn opened after it; needs add_generation_prompt false, as vLLM asks.
  bool continue_final_message = false;
  bool enable_thinking = true;        // chat_template_kwargs.enable_thinking (Qwen3)
  // chat_template_kwargs as given (client's order): an interpreted template gets them all.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  std::vector<std::string> tools;     // each tool's JSON text for the template (parse_chat_tools)
  // vLLM's chat_template: a Jinja template to render this request with instead of the model's
  // (served only with --trust-request-chat-template); empty: the model's.
  std::string chat_template;
  // tool_choice "auto" (the default with tools) or a forced call: the completion's tool calls are
  // parsed out of its text (parse_tool_calls) in this form; "none" or no tools: unset, the text
  // is left as is. (ChatParsing::tool_calls)
  std::optional<ToolCallFormat> tool_calls;
};
// `tool_format`: the form the model writes tool calls in (the chat template's, or `serve
// --tool-call-parser`): a forced tool_choice asks for calls in that form. With mistral's, a
// request whose calls are parsed keeps special tokens in its text (the [TOOL_CALLS] marker is
// one), as vLLM's mistral parser asks.
Result<ChatRequest> parse_chat_request(std::string_view body, ToolCallFormat tool_format = ToolCallFormat::kHermes,
                                       const SamplingDefaults& defaults = {});

// POST /tokenize (vLLM's): a "prompt" string, or chat "messages" (rendered with the chat
// template as /v1/chat/completions renders them), to token ids.
struct TokenizeRequest {
  std::string model;
  bool chat = false;                  // "messages" given instead of "prompt"
  std::string prompt;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  // chat
  bool continue_final_message = false;  // chat
  bool enable_thinking = true;        // chat: chat_template_kwargs.enable_thinking
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat: as given
  std::vector<std::string> tools;     // chat: as /v1/chat/completions renders them (parse_chat_tools)
  std::string chat_template;          // chat: as ChatRequest::chat_template
  bool add_special_tokens = true;     // default true for a prompt, false for messages (the template writes BOS)
  bool return_token_strs = false;     // also each id's vocabulary string
};
Result<TokenizeRequest> parse_tokenize_request(std::string_view body);

// POST /detokenize (vLLM's): token ids to text.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
Result<DetokenizeRequest> parse_detokenize_request(std::string_view body);

// vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"} and
// /v1/unload_lora_adapter {"lora_name"} (path empty; vLLM's lora_int_id is ignored).
struct LoraAdapterRequest {
  std::string name, path;
  bool inplace = false;  // replace an adapter served under that name
};
Result<LoraAdapterRequest> parse_load_lora_request(std::string_view body);
Result<LoraAdapterRequest> parse_unload_lora_request(std::string_view body);

// The HTTP status of an error: 400 bad or unsupported input, 404 unknown model or route, 503 out
// of KV memory (retry later, or shorter), 500 anything else.
int http_status(ErrorCode code);
// {"error": {"message", "type", "param": null, "code": status}} as the OpenAI API answers.
nlohmann::json error_json(const Error& e);

// OpenAI's "logprobs" object for generated tokens `ids` and their log-probabilities `lps`
// (same length): chat's {"content": [{token, logprob, bytes, top_logprobs: [...]}]}, or the
// completions API's {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
// whose offsets (characters) start at *text_offset, which moves past these tokens (a stream
// continues it). A token's text is tokenizer.decode([id]) (vLLM's), "token_id:<id>" without a
// tokenizer; log-probabilities below -9999 (and -inf) are -9999, as vLLM clamps them.
nlohmann::json logprobs_json(const Tokenizer* tok, bool chat, std::span<const int32_t> ids,
                             std::span<const StepLogprobs> lps, size_t* text_offset);
// vLLM's "prompt_logprobs" of a prompt whose tokens after the first have `lps` (StepResult::
// prompt_logprobs): [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...], each position's
// object holding the prompt token and the most likely ones (ranks 1..k).
nlohmann::json prompt_logprobs_json(const Tokenizer* tok, std::span<const int32_t> prompt,
                                    std::span<const StepLogprobs> lps);
// The completions API's logprobs object with "echo": the prompt's tokens first (the first one with
// null log-probability and top_logprobs, the others with their `top` most likely tokens), then the
// generated tokens `ids`; text offsets run from 0 over the prompt's text.
nlohmann::json echo_logprobs_json(const Tokenizer* tok, std::span<const int32_t> prompt,
                                  std::span<const StepLogprobs> prompt_lps, int top, std::span<const int32_t> ids,
                                  std::span<const StepLogprobs> lps, size_t* end_offset = nullptr);
// Characters (code points) of UTF-8 text, as Python's len() counts them (text_offset's unit).
size_t utf8_chars(std::string_view s);

// How a chat completion's text becomes its message: the reasoning split off first (a server with
// a reasoning parser), then the tool calls parsed out of what is left.
struct ChatParsing {
  std::optional<bool> reasoning;             // set: split_reasoning, the value saying whether thinking is on
  std::optional<ToolCallFormat> tool_calls;  // set: parse_tool_calls in that form
};

// Sets a chat choice's "message": {"role": "assistant", "content", "tool_calls": []}. With
// parsing.reasoning, the reasoning as "reasoning_content" (and "reasoning", vLLM's newer name;
// null when none) and the rest as content. With parsing.tool_calls, the calls its parser finds
// (parse_tool_calls) each as {"id", "type": "function", "function": {"name", "arguments"}}
// (new_tool_call_id), the content beside them (null when empty), and the choice's finish_reason
// "tool_calls" when any was found.
void put_chat_message(nlohmann::json& choice, const std::string& text, const ChatParsing& parsing);

// A streamed chat completion's text, piece by piece, parsed as put_chat_message parses it whole:
// reasoning (ReasoningStream), then content whose tool calls are held back (ToolCallStream; with
// `call_deltas`, the chat completions stream, calls go out as they are written).
class ChatStream {
 public:
  explicit ChatStream(const ChatParsing& parsing = {}, bool call_deltas = false);
  struct Delta {
    std::string reasoning;
    std::string content;
    nlohmann::json tool_calls = nlohmann::json::array();  // call deltas (call_deltas only)
  };
  // What to send now out of the next piece of shown text.
  Delta push(const std::string& piece);
  // After the last piece: what was held back, the tool calls ([] when none or not parsed) and
  // what of them has not gone out in deltas yet (ToolCallStream::End).
  struct End {
    Delta rest;
    nlohmann::json tool_calls = nlohmann::json::array();
    nlohmann::json tool_call_deltas = nlohmann::json::array();
  };
  End finish();

 private:
  ChatParsing parsing_;
  ReasoningStream reasoning_;
  ToolCallStream calls_;
};

// The text of one completion, built token by token: special tokens are left out (unless
// skip_special_tokens is off) and so is the stop id that ended it; the text ends before the
// first stop string. push() returns only text that can no longer change: pieces a later token
// may still merge with (StreamDecoder) and the tail that may be the start of a stop string are
// held back until finish().
class CompletionText {
 public:
  // context_id: the prompt's last token, which the text is decoded after (StreamDecoder::prime;
  // -1: none), so a completion's first word keeps its leading space as vLLM gives it.
  // min_tokens: stop strings are looked for only from the min_tokens-th token on (vLLM's rule: a
  // match must end in text that token or a later one added).
  // include_stop: the text keeps the stop string (and the stop id) that ended it, as
  // CompletionRequest::include_stop_str_in_output asks.
  CompletionText(const Tokenizer& tok, std::vector<std::string> stop, bool skip_special_tokens,
                 int32_t context_id = -1, int min_tokens = 0, bool include_stop = false);
  // `ends_step`: this is a stop id that ended generation (its text is never shown).
  std::string push(int32_t id, bool ends_step = false);
  std::string finish();
  const std::string& text() const { return text_; }  // everything shown or held back so far
  // The stop string the text was cut at, if any.
  const std::optional<std::string>& matched_stop() const { return matched_; }

 private:
  // Cuts text_ at the earliest stop string that ends after byte `end_after` (one starting at most
  // longest_stop_ - 1 bytes before it); true when cut.
  bool cut_at_stop(size_t end_after);
  std::string take(size_t upto);

  const Tokenizer& tok_;
  StreamDecoder dec_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  bool skip_special_;
  bool include_stop_ = false;
  std::string text_;
  size_t shown_ = 0;  // bytes of text_ returned by push()
  std::optional<std::string> matched_;
  int min_tokens_ = 0;
  int pushed_ = 0;  // ids given to push()
};

}  // namespace lragent::server
