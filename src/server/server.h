// `lragent serve`: an OpenAI-compatible HTTP server (the API vLLM serves) whose models are the
// base model and its LoRA adapters, as vLLM's --lora-modules. Requests of all of them share KV
// caches through the SessionPool: an agent whose prompt extends a trajectory another agent
// wrote reuses that trajectory's base (and, in base-lr, low-rank) cache.
//
// Routes:
//   GET  /health                 200 while the server runs
//   GET  /v1/models              the served names: the base model, then each adapter (parent: base)
//   POST /v1/completions         text completions (stream with server-sent events)
//   POST /v1/chat/completions    chat completions (the model's chat template, recognised and rendered in C++)
//   GET  /lragent/sessions       the kept trajectories: tokens, cache bytes, tokens each agent computed
//   POST /tokenize, /detokenize  vLLM's: a prompt (or chat messages) to ids, ids to text
//   GET  /metrics                Prometheus counters (server/metrics.h)
//   POST /v1/responses           OpenAI's Responses API (responses_api.h), run as a chat completion;
//   GET, DELETE /v1/responses/{id}   a stored response (previous_response_id continues it;
//                                    ?stream=true: a streamed background response's events again)
//   POST /v1/responses/{id}/cancel   stops a background response ("background": true)
//   POST /v1/messages            Anthropic's Messages API (messages_api.h), run as a chat completion;
//   POST /v1/messages/count_tokens   its prompt's tokens
//   POST /v1/load_lora_adapter   vLLM's runtime LoRA updating (ServerOptions::runtime_lora): serve
//   POST /v1/unload_lora_adapter   one more adapter, or stop serving one (server_lora.cpp)
// Requests are batched: one engine thread runs a forward pass at a time over the next pass of
// every running request (continuous batching, as vLLM's scheduler: decode tokens first, then
// prompt catch-ups in chunks within --max-num-batched-tokens), each on its own trajectory and
// with its own adapter. A request whose trajectory another request is running (the next turn of
// that conversation, or a second choice of one prompt) waits for it; so does one that needs a
// trajectory slot while every slot is running a request (--max-sessions bounds how many run).
// A bad request gets an OpenAI error body with its status (400, 404, 413, 503); the server
// stays up, and a request whose pass fails drops only its own trajectory (an exception on the
// engine thread fails the requests running then).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/guide/token_guide.h"
#include "engine/memory_plan.h"
#include "server/background_jobs.h"
#include "server/cors.h"
#include "server/metrics.h"
#include "server/messages_api.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/session_pool.h"

namespace httplib {
struct Request;
struct Response;
}

namespace lragent::server {

struct ServerOptions {
  std::string base_name = "base";  // the base model's served name
  // More names the base model answers to (vLLM's --served-model-name A B C: a request may name
  // any of them; answers and metrics name base_name, the first).
  std::vector<std::string> base_aliases;
  SessionPoolOptions pool;         // sharing mode, KV sizing, trajectories kept
  int64_t max_model_len = 0;       // prompt + max_tokens limit (0: the trajectories' capacity)
  // Tokens of one forward pass (vLLM's max_num_batched_tokens): every running request's decode
  // token, then prompt catch-ups in chunks from what is left (a pass with no decode runs its
  // first catch-up whole).
  int64_t max_batch_tokens = 2048;
  // > 0: no pass runs more tokens, a prompt alone included (in chunks of this many), because the
  // device's memory was planned for passes of that size.
  int64_t max_pass_tokens = 0;
  // The plan the KV memory came from (--gpu-memory-utilization). Unless max_pass_tokens is set,
  // create() bounds passes by it: the profiled pass's tokens, plus as many tokens as the planned
  // KV memory the trajectories' caps leave unused holds at that pass's bytes a token (its working
  // memory grows with its tokens), so that a cap below the plan lets long prompts run in fewer,
  // larger passes.
  std::optional<KvMemoryPlan> memory_plan;
  std::string api_key;             // non-empty: every /v1 request needs "Authorization: Bearer <key>"
  CorsOptions cors;                // cross-origin requests from browsers (vLLM's --allowed-origins, ...)
  // vLLM's --trust-request-chat-template: a chat request's own "chat_template" is rendered (a
  // client may then run any template on the server's Jinja interpreter); off, it is refused.
  bool trust_request_chat_template = false;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter serve (vLLM's
  // VLLM_ALLOW_RUNTIME_LORA_UPDATING): any client that may call /v1 may then make the server read
  // an adapter from a directory on its disk. Off, they answer 404 saying how to turn them on.
  bool runtime_lora = false;
  int max_lora_rank = 0;           // > 0: an adapter of a higher rank is refused (vLLM's --max-lora-rank)
  // POST /v1/responses with "store": true keeps each response in memory (ResponseStore) for GET
  // /v1/responses/{id} and previous_response_id: the latest this many, within this many bytes
  // (0 responses: none kept).
  size_t max_stored_responses = 1024;
  size_t max_stored_response_bytes = size_t{256} << 20;
  size_t max_body_bytes = 32u << 20;
  // Connection threads: each open connection (a keep-alive client between requests, too) holds
  // one, so there are many more than requests that run at once.
  int http_threads = 256;
  // Seconds an idle keep-alive connection keeps its thread (httplib's default is 5).
  int keep_alive_seconds = 2;
  // The model's chat template (tokenizer_config.json), for /v1/chat/completions; when absent,
  // why (the error that endpoint answers with).
  std::optional<ChatTemplate> chat_template;
  std::string chat_template_missing = "none was given";
  // The form of the model's tool calls (vLLM's --tool-call-parser); unset: the one the chat
  // template shows the model (ChatTemplate::tool_call_format).
  std::optional<ToolCallFormat> tool_call_parser;
  // Set (vLLM's --reasoning-parser): a chat completion's <think>...</think> goes to the message's
  // reasoning_content, apart from its content (ChatParsing::reasoning).
  std::optional<ReasoningFormat> reasoning_parser;
  // What a request's sampling fields are when it leaves them out (vLLM's --generation-config:
  // the model's generation_config.json, or neutral), and the cap on its max_tokens.
  SamplingDefaults sampling_defaults;
  // The seed of the first request that gives none (each next one + 1); unset: drawn at start.
  std::optional<uint64_t> seed;
  // vLLM's --max-logprobs: the most log-probabilities a request may ask for per token (logprobs,
  // top_logprobs, prompt_logprobs); a request asking for more is refused. -1: the vocabulary.
  int max_logprobs = kDefaultMaxLogprobs;
  // vLLM's --scheduling-policy priority: requests start in the order of their "priority" (lower
  // first, arrival order among equals), and the KV memory running out preempts the lowest
  // (highest value, latest) first. Off (fcfs): arrival order, and a request's priority must be 0.
  bool priority_scheduling = false;
  // vLLM's --enable-request-id-headers: every answer carries an X-Request-Id header, the
  // request's own (or, for a completion, the id its answer is named by: X-Request-Id, else the
  // body's request_id, else a random one).
  bool request_id_headers = false;
  // vLLM's --return-tokens-as-token-ids: every request's logprobs name tokens "token_id:<id>".
  bool return_tokens_as_token_ids = false;
  // One line per request (method, path, status, time); null: silent.
  std::function<void(const std::string&)> log;
  // Warnings from the engine thread (a stall); null: silent.
  std::function<void(const std::string&)> warn;
  // No admitted request advancing for this long (no pass, or only passes short of KV memory;
  // which should never happen: some turn always runs) is reported through `warn`, with what the
  // requests wait for. Only time with requests admitted counts, not the engine's idle waits.
  std::chrono::milliseconds stall_warning{10'000};
  // Called on the engine thread each time it has run requests and none is left running or
  // waiting (the CLI hands freed heap back to the system there); null: nothing.
  std::function<void()> on_idle;
};

// What one completion request produced, before it is JSON (the server's core, tested without HTTP).
struct CompletionChoice {
  std::string text;
  std::string finish_reason;             // "stop" | "length" | "abort"
  std::optional<std::string> stop_reason;  // the stop string, when one ended it
  std::optional<int32_t> stop_token;       // the stop id (not EOS), when one ended it (vLLM's stop_reason)
  size_t prompt_index = 0;
  int64_t completion_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;     // prompt tokens the trajectory held already
  int64_t prefilled_tokens = 0;  // tokens the agent computed to catch up
  DraftCounts drafts;            // speculative decoding's (--speculative-config)
  int64_t trajectory = 0;        // SessionPool id
  std::vector<int32_t> token_ids;  // the generated ids (the stop id included), as vLLM's return_token_ids
  std::vector<StepLogprobs> logprobs;  // [token_ids] when the request asked for them
  // [prompt_tokens - 1] when the request asked for them (CompletionRequest::prompt_logprobs):
  // each prompt token after the first, with its rank.
  std::vector<StepLogprobs> prompt_logprobs;
};

// A piece of a streamed completion: its text, and the generated tokens since the last piece
// with their log-probabilities (when asked for). A token's text may come in a later piece
// (held back while it could still change) or never (a stop string cuts it).
struct CompletionDelta {
  size_t index = 0;  // the choice
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<StepLogprobs> logprobs;  // [token_ids] or empty
  // The choice's first piece of a streamed completion with "echo" and "logprobs": `text` starts
  // with the echoed prompt, whose tokens' log-probabilities ([prompt tokens - 1]) lead its
  // logprobs object (the legacy form, echo_logprobs_json).
  std::optional<std::vector<StepLogprobs>> echo_logprobs;
};
using DeltaFn = std::function<bool(const CompletionDelta&)>;
// Whether the client is still there (a streaming response's socket); asked while a request waits.
using AliveFn = std::function<bool()>;

class Server {
 public:
  // `tok` may be null (token-id prompts only); `adapters` may be null. The server adds and
  // removes the adapters loaded and unloaded at run time (runtime_lora) in `adapters` (its own
  // registry when null), which must outlive it, on its engine thread.
  static Result<std::unique_ptr<Server>> create(LlamaModel& model, const Tokenizer* tok, AdapterRegistry* adapters,
                                                ServerOptions opts);
  ~Server();

  // Binds host:port (port 0: any free port) and returns the port.
  Result<int> bind(const std::string& host, int port);
  // Serves on the bound socket until stop() (blocking).
  Status serve();
  void stop();

  // The names GET /v1/models lists, base model first.
  std::vector<std::string> model_names() const {
    std::lock_guard<std::mutex> lock(names_mu_);
    return names_;
  }
  // vLLM's runtime LoRA updating, as POST /v1/load_lora_adapter and /v1/unload_lora_adapter run it
  // (whether or not ServerOptions::runtime_lora lets those routes serve). load_adapter reads the
  // PEFT adapter in `dir` (on the calling thread), then the engine thread, between passes, puts
  // it on the model's backend and serves it as `name`: it joins the trajectories the other
  // agents write (SessionPool::add_agent), so its first request reads the cache they hold.
  // Errors: a name already served, or the base model's (kInvalidArgument); the adapter's own
  // (a missing directory kNotFound, a bad file, a rank above max_lora_rank kInvalidArgument, a
  // module no trajectory can hold kUnsupported); no device memory (kOutOfMemory).
  // `replace` (vLLM's load_inplace): an adapter served under that name is unloaded first, once
  // the new one is read and on the device (those failing leave it served).
  Status load_adapter(const std::string& name, const std::string& dir, bool replace = false);
  // Stops serving the adapter `name`: requests for it that have not started fail (404), running
  // ones finish; its weights are freed once no kept trajectory holds it. kNotFound when it is not
  // served; kInvalidArgument for the base model.
  Status unload_adapter(const std::string& name);
  // Adapters unloaded whose weights are not freed yet (a trajectory a request runs on holds them).
  size_t retired_adapters() const {
    std::lock_guard<std::mutex> lock(queue_mu_);
    return retired_count_;
  }
  ShareMode share_mode() const { return opts_.pool.replay.sharing.mode; }
  int64_t max_model_len() const { return opts_.max_model_len; }
  const ServerOptions& options() const { return opts_; }
  // The one KV memory every trajectory shares, in bytes (0: an arena per trajectory).
  int64_t kv_memory_bytes() const { return pool_->shared_arena() ? pool_->shared_arena()->capacity_bytes() : 0; }
  // The most tokens one pass runs (0: no bound; ServerOptions::max_pass_tokens / memory_plan).
  int64_t max_pass_tokens() const { return opts_.max_pass_tokens; }

  // One completion request, as POST /v1/completions runs it: `on_delta` gets each piece of text
  // as it can be shown (streaming), called on the calling thread; returning false abandons the
  // request (the client went away; the engine ends it at its next token). Thread-safe: requests
  // from many threads run batched together.
  Result<std::vector<CompletionChoice>> complete(const CompletionRequest& req, const DeltaFn& on_delta = {});
  // Structured outputs compiled and kept for requests of the same text (at most kGuideCache).
  size_t cached_guides() const {
    std::lock_guard<std::mutex> lock(guides_mu_);
    return guides_.size();
  }
  // How often a request with an AliveFn asks it while no piece comes (run()).
  static constexpr std::chrono::milliseconds kAlivePoll{20};

 private:
  Server() = default;
  struct Http;
  struct Prepared;  // a validated request: its agent, and each prompt's ids and token budget
  // Validates a request and tokenizes its prompts (errors: unknown model, too long, bad ids).
  Result<Prepared> prepare(const CompletionRequest& req) const;
  // Runs a prepared request (complete()'s second half): hands it to the engine thread and passes
  // its pieces to on_delta until it ends. `alive`, when set (a streaming response's socket), is
  // asked every kAlivePoll while no piece comes (the request waits for a slot or a trajectory, or
  // computes its prompt): false abandons the request as on_delta's false does, so a client gone
  // before its request ran costs it no slot and no compute.
  Result<std::vector<CompletionChoice>> run(const Prepared& p, const DeltaFn& on_delta, const AliveFn& alive = {});
  struct Job;        // a request in the engine
  struct ChoiceRun;  // a choice of a Job running now
  // The engine thread: admits requests, starts their choices, runs one batched pass at a time.
  void engine_loop();
  // What the admitted jobs wait for, when none has advanced for `seconds` (engine thread).
  std::string stall_report(const std::vector<Job*>& active, double seconds) const;
  // One iteration over the admitted jobs: starts the choices that can start and runs one batched
  // pass over the running ones; false when no pass ran (every job waits, or none is left).
  bool engine_pass(const std::vector<Job*>& active);
  // Moves the queued jobs into `active` (queue_mu_ held): at its end, or by priority
  // (ServerOptions::priority_scheduling).
  void admit(std::vector<Job*>& active);
  // Starts the job's next choice when a trajectory can be had for it (SessionPool::acquire; else
  // it waits); true when it started. May end the job. A choice the job had preempted resumes
  // first; a new one starts only when `may_start_new` (no request has a preempted choice waiting).
  bool start_choice(Job& job, bool may_start_new);
  // Stops a running choice to give its KV memory back (vLLM's preemption by recompute): its
  // trajectory is cut back to what it held before the choice took it (SessionPool::cut_and_release),
  // or dropped whole. It resumes from the tokens it has produced, recomputing them (and, when the
  // trajectory was dropped since, what it held), when it can start again (start_choice).
  void preempt(Job& job, ChoiceRun& run, bool drop_trajectory = false);
  // The job's preempted choices end where they stopped (finish_reason "abort"): its client left.
  void abort_preempted(Job& job);
  // The KV memory every trajectory shares filled while `short_of_memory` (turns of the pass that
  // just ran) needed more: an idle trajectory is dropped, else the latest request's latest choice
  // is preempted; a choice short of memory with nothing else running fails (it does not fit).
  void make_room(const std::vector<Job*>& active, std::span<const std::pair<Job*, ChoiceRun*>> short_of_memory);
  // A running choice ended (its turn done, or failed with `st`: the whole job fails); may end the job.
  void end_choice(Job& job, ChoiceRun& run, const Status& st);
  // Ends the job with `error`, dropping the trajectories of its running choices (after their turns).
  void fail_job(Job& job, Error error);
  // Counts the job in the metrics and queues it for its handler (ended_); nothing touches it after.
  void end_job(Job& job, std::optional<Error> error);
  // A piece of a choice's text for a streaming client; false when the client went away.
  bool emit(Job& job, ChoiceRun& run, std::string text);
  // The echoed prompt when it still waits to lead the choice's first piece (ChoiceRun::echo_pending),
  // its tokens' log-probabilities put in that piece; else nothing.
  static std::string take_echo(ChoiceRun& run, const std::vector<StepLogprobs>& prompt_logprobs);
  // Copies the pool's state for /lragent/sessions and /metrics' KV series (engine thread); called
  // whenever a choice starts, is preempted or ends.
  void publish_sessions();
  // The agent a request's "model" names (empty: the base model).
  Result<std::string> agent_for(const std::string& model) const;
  // Whether `name` is one of the base model's served names (base_name or an alias).
  bool is_base_name(const std::string& name) const;
  Result<std::vector<int32_t>> prompt_ids(const PromptInput& p) const;
  // Every token's bytes in a trie, for structured outputs; built at the first request that asks for one.
  const guide::VocabTrie& vocab_trie() const;
  // The request's structured output compiled, or the cached guide of the same text (guides_).
  Result<std::shared_ptr<guide::TokenGuide>> guide_for(const CompletionRequest& req) const;
  // Every id inside the model's vocabulary; the error names the request field.
  Status check_vocab(std::span<const int32_t> ids, const char* field) const;
  // The conversation through the server's chat template (as /v1/chat/completions and /tokenize
  // render it); no_chat_template() is the error when the server has none.
  // `continue_final`: cut after the final message's text (continue_final_message).
  // `request_template`: the request's own template instead (vLLM's chat_template field), given the
  // server's special tokens; refused unless trust_request_chat_template.
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                  bool enable_thinking, const std::vector<std::string>& tools,
                                  const nlohmann::ordered_json& kwargs, bool continue_final = false,
                                  const std::string& request_template = "") const;
  Error no_chat_template() const;
  void install_routes();
  // A /v1/chat/completions body (or the one a Responses or Messages request runs as) parsed and
  // its conversation rendered into the request's prompt; *parsing: how its text splits
  // (reasoning, tool calls). Errors: the body's, the template's.
  Result<CompletionRequest> chat_completion_request(std::string_view body, ChatParsing* parsing) const;
  // POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel
  // (server_responses.cpp).
  void install_responses_routes();
  void respond_responses(const ResponsesRequest& r, const httplib::Request& http, httplib::Response& res);
  // POST /v1/messages and /v1/messages/count_tokens, Anthropic's (server_messages.cpp).
  void install_messages_routes();
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's (server_lora.cpp).
  void install_lora_routes();
  // Runs `task` on the engine thread between two passes and returns what it returns (the
  // pool, the registry and the backend are the engine thread's).
  Status on_engine(std::function<Status()> task);
  // Engine thread: frees the unloaded adapters no kept trajectory holds any more.
  void free_retired();
  // Engine thread: stops serving the adapter `name` (registered): out of the pool and the names,
  // its weights kept in retired_ until free_retired finds them unheld.
  Status retire(const std::string& name);
  struct EventAnswer;  // server_internal.h
  // Streams `log`'s events from index `from` as server-sent events, as they come, until it is
  // closed (or the client or the server goes).
  void send_event_log(httplib::Response& res, std::shared_ptr<EventLog> log, size_t from);
  // Runs a prepared request (its first choice) and answers it as `answer` builds it.
  void respond_events(Prepared p, bool stream, const httplib::Request& http, httplib::Response& res,
                      std::shared_ptr<EventAnswer> answer);
  // Runs a parsed request and writes its response (JSON, or server-sent events when streaming);
  // chat: the chat.completion objects, each completion's text parsed as `parsing` says (reasoning,
  // tool calls; streamed too: ChatStream). `http`: the request's connection, watched so that a
  // client gone stops its request.
  void respond(CompletionRequest req, bool chat, const httplib::Request& http, httplib::Response& res,
               const ChatParsing& parsing = {});
  // The form the model writes tool calls in: --tool-call-parser, else the chat template's.
  ToolCallFormat tool_call_format() const;

  LlamaModel* model_ = nullptr;
  const Tokenizer* tok_ = nullptr;
  ServerOptions opts_;
  mutable std::mutex names_mu_;  // names_, roots_: read by request threads, changed by the engine thread
  std::vector<std::string> names_;
  std::vector<std::string> roots_;  // [names_] GET /v1/models' root: an adapter's directory (vLLM's), else the name
  AdapterRegistry* registry_ = nullptr;           // the served adapters (own_registry_ when none was given)
  std::unique_ptr<AdapterRegistry> own_registry_;
  // Engine thread: unloaded adapters still held by a kept trajectory (free_retired).
  std::vector<std::unique_ptr<LoraAdapter>> retired_;
  std::unique_ptr<SessionPool> pool_;  // the engine thread's alone
  mutable std::once_flag vocab_trie_once_;
  mutable std::unique_ptr<guide::VocabTrie> vocab_trie_;  // vocab_trie()
  // Compiled structured outputs by cache_salt, kind and text, the most recently used first: agents that send
  // the same schema, grammar or tool list at every turn reuse its automaton and the masks of the
  // states it reached (as vLLM's xgrammar backend caches compiled grammars), instead of walking
  // the vocabulary again (~4 ms a new state at a 128k vocabulary, docs/server.md). Shared
  // ownership: a request keeps its guide alive after the cache lets it go. Looked up on request
  // threads under guides_mu_; a guide is only advanced and masked on the engine thread.
  static constexpr size_t kGuideCache = 8;
  mutable std::mutex guides_mu_;
  mutable std::list<std::pair<std::string, std::shared_ptr<guide::TokenGuide>>> guides_;
  Metrics metrics_;
  // Requests handed to the engine thread, not admitted yet.
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Job*> queue_;
  std::deque<std::function<void()>> tasks_;  // on_engine's, run before the next pass
  size_t retired_count_ = 0;                 // retired_.size(), as the engine thread last left it
  bool stopping_ = false;
  std::vector<Job*> ended_;  // engine thread: jobs ended in this iteration, handed back after it
  std::thread engine_;
  // The pool's state as the engine last left it (GET /lragent/sessions never waits for a pass).
  mutable std::mutex sessions_mu_;
  std::vector<SessionPool::Info> sessions_;
  KvSnapshot sessions_kv_;         // their sums and the pool's counters, as /metrics was given them
  int64_t preemptions_ = 0;        // engine thread: choices preempted to make room in the KV memory
  int64_t ended_choices_ = 0;      // engine thread: choices that ended (their trajectories released)
  int64_t ended_at_preemption_ = -1;  // ended_choices_ at the last preemption
  bool advanced_ = false;          // engine thread: a turn advanced (or ended) since engine_loop last looked
  // Engine thread: what the engine did, counted from the start and as it stood when a turn last
  // advanced (the stall report gives the difference).
  struct EngineCounts {
    int64_t passes = 0;        // passes run (a decode window counts once)
    int64_t short_passes = 0;  // of those, passes that left a turn short of KV memory
    int64_t evicted = 0;       // trajectories dropped (SessionPool::evicted_sessions)
    int64_t preempted = 0;     // choices preempted (preemptions_)
  };
  EngineCounts counts_, counts_at_advance_;
  std::unique_ptr<Http> http_;
  std::unique_ptr<ResponseStore> responses_;  // stored /v1/responses (thread-safe)
  // Background responses running (thread-safe); cancelled and joined before the engine stops.
  std::unique_ptr<BackgroundJobs> background_;
  std::unique_ptr<EventLogs> event_logs_;  // the events of streamed background responses
  int64_t created_ = 0;   // unix time the server started (the models' "created")
  uint64_t next_seed_ = 0;
};

}  // namespace lragent::server
