#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <random>
#include <span>
#include <tuple>

#include <fmt/core.h>

#include "agents/agent_turn.h"
#include "server/server_internal.h"

namespace lragent::server {

Result<std::unique_ptr<Server>> Server::create(LlamaModel& model, const Tokenizer* tok, AdapterRegistry* adapters,
                                               ServerOptions opts) {
  std::unique_ptr<Server> s(new Server());
  s->model_ = &model;
  s->tok_ = tok;
  if (!adapters) {
    s->own_registry_ = std::make_unique<AdapterRegistry>();
    adapters = s->own_registry_.get();
  }
  s->registry_ = adapters;
  std::vector<std::string> adapter_names;
  std::vector<const LoraAdapter*> adapter_ptrs;
  for (int i = 0; i < adapters->size(); ++i) {
    const LoraAdapter& a = adapters->at(i);
    if (a.name == opts.base_name ||
        std::find(opts.base_aliases.begin(), opts.base_aliases.end(), a.name) != opts.base_aliases.end())
      return make_error(ErrorCode::kInvalidArgument,
                        "adapter '{}' has one of the base model's served names: rename it or pass another "
                        "--served-model-name",
                        a.name);
    // vLLM's --max-lora-rank: an adapter of a higher rank is refused, as vLLM refuses it.
    if (opts.max_lora_rank > 0 && a.max_rank() > opts.max_lora_rank)
      return make_error(ErrorCode::kInvalidArgument,
                        "adapter '{}' has LoRA rank {}, more than --max-lora-rank {}: raise it, or drop the flag "
                        "(lragent serves any rank)",
                        a.name, a.max_rank(), opts.max_lora_rank);
    adapter_names.push_back(a.name);
    adapter_ptrs.push_back(&a);
  }
  s->names_.push_back(opts.base_name);
  s->names_.insert(s->names_.end(), adapter_names.begin(), adapter_names.end());
  s->roots_.push_back(opts.base_name);
  for (const LoraAdapter* a : adapter_ptrs) s->roots_.push_back(a->dir.empty() ? a->name : a->dir);
  int64_t capacity = opts.pool.replay.sharing.max_tokens;
  if (model.config().max_position_embeddings > 0)
    capacity = std::min<int64_t>(capacity, model.config().max_position_embeddings);
  opts.max_model_len = opts.max_model_len > 0 ? std::min(opts.max_model_len, capacity) : capacity;
  auto groups = SessionPool::groups_for(opts.base_name, adapter_names, adapter_ptrs, opts.pool.replay.sharing.mode);
  LRA_ASSIGN_OR_RETURN(s->pool_, SessionPool::create(model, tok, std::move(groups), opts.pool));
  // A KV memory smaller than the context (--kv-memory) caps the requests, as vLLM caps
  // max_model_len to what its cache holds: a request never runs out of room at its end.
  // The same for one KV memory smaller than the trajectories' caps (--kv-cache-memory): a request
  // must fit it with nothing else running.
  if (opts.pool.replay.sharing.arena_bytes > 0 || s->pool_->oversubscribed()) {
    const int64_t fits = s->pool_->capacity_tokens(opts.max_model_len);
    if (fits < 2)
      return make_error(ErrorCode::kOutOfMemory, "the KV memory ({}) holds {} tokens of one trajectory: give it more room",
                        s->pool_->oversubscribed() ? "--kv-cache-memory / --gpu-memory-utilization" : "--kv-memory",
                        fits);
    opts.max_model_len = fits;
  }
  if (const auto& plan = opts.memory_plan; opts.max_pass_tokens <= 0 && plan && plan->pass_tokens > 0 && plan->pass_peak > 0) {
    const int64_t spare = std::max<int64_t>(plan->kv_bytes - s->kv_memory_bytes(), 0);
    const double per_token = static_cast<double>(plan->pass_peak) / static_cast<double>(plan->pass_tokens);
    opts.max_pass_tokens = plan->pass_tokens + static_cast<int64_t>(static_cast<double>(spare) / per_token);
  }
  s->opts_ = std::move(opts);
  s->metrics_.set_base_model(s->opts_.base_name);
  s->publish_sessions();
  s->engine_ = std::thread([srv = s.get()] { srv->engine_loop(); });
  s->created_ = unix_now();
  s->next_seed_ = s->opts_.seed ? *s->opts_.seed : std::random_device{}();
  s->http_ = std::make_unique<Http>();
  s->responses_ = std::make_unique<ResponseStore>(s->opts_.max_stored_responses, s->opts_.max_stored_response_bytes);
  // At most as many as the store keeps: each one's response must outlast its run to be fetched.
  s->background_ = std::make_unique<BackgroundJobs>(s->opts_.max_stored_responses);
  s->event_logs_ = std::make_unique<EventLogs>();
  s->responses_->on_evict([logs = s->event_logs_.get()](const std::string& id) { logs->erase(id); });
  s->install_routes();
  return s;
}

Server::~Server() {
  stop();
  // Background responses run on the engine: they end (cancelled) while it still runs.
  if (background_) background_->cancel_all();
  if (engine_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    engine_.join();
  }
}

const guide::VocabTrie& Server::vocab_trie() const {
  std::call_once(vocab_trie_once_, [this] { vocab_trie_ = guide::VocabTrie::build(*tok_); });
  return *vocab_trie_;
}

bool Server::is_base_name(const std::string& name) const {
  return name == opts_.base_name ||
         std::find(opts_.base_aliases.begin(), opts_.base_aliases.end(), name) != opts_.base_aliases.end();
}

Result<std::string> Server::agent_for(const std::string& model) const {
  std::lock_guard<std::mutex> lock(names_mu_);
  if (model.empty() || is_base_name(model)) return names_.front();
  if (std::find(names_.begin(), names_.end(), model) != names_.end()) return model;
  std::vector<std::string> all = names_;
  all.insert(all.begin() + 1, opts_.base_aliases.begin(), opts_.base_aliases.end());
  return make_error(ErrorCode::kNotFound, "the model '{}' does not exist; this server serves: {} (GET /v1/models)", model,
                    fmt::join(all, ", "));
}

Status Server::check_vocab(std::span<const int32_t> ids, const char* field) const {
  const int vocab = model_->config().vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      return make_error(ErrorCode::kInvalidArgument, "token id {} in '{}' is outside the vocabulary [0, {})", id, field,
                        vocab);
  return Status::Ok();
}

Error Server::no_chat_template() const {
  return Error{ErrorCode::kUnsupported,
               fmt::format("this server has no chat template ({}): format the conversation as text and POST it to "
                           "/v1/completions (or /tokenize it as a 'prompt')",
                           opts_.chat_template_missing)};
}

Result<std::string> Server::render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                        bool enable_thinking, const std::vector<std::string>& tools,
                                        const nlohmann::ordered_json& kwargs, bool continue_final,
                                        const std::string& request_template) const {
  std::optional<ChatTemplate> own;  // the request's template, with the server's special tokens
  if (!request_template.empty()) {
    if (!opts_.trust_request_chat_template)
      return make_error(ErrorCode::kInvalidArgument,
                        "'chat_template' was given with the request, but the server runs only its own template: "
                        "start it with --trust-request-chat-template to allow a request's template, or leave the "
                        "field out");
    nlohmann::ordered_json cfg = opts_.chat_template ? opts_.chat_template->special_tokens : nlohmann::ordered_json::object();
    cfg["chat_template"] = request_template;
    auto t = ChatTemplate::from_tokenizer_config(cfg.dump(), "the request's 'chat_template'");
    if (!t.ok()) return make_error(ErrorCode::kInvalidArgument, "{}", t.error().message);
    own = std::move(*t);
    if (opts_.chat_template) own->strftime_now = opts_.chat_template->strftime_now;
  } else if (!opts_.chat_template) {
    return no_chat_template();
  }
  const ChatTemplate& tmpl = own ? *own : *opts_.chat_template;
  LRA_ASSIGN_OR_RETURN(std::string text, tmpl.render(messages, add_generation_prompt, enable_thinking, tools, kwargs));
  if (!continue_final || messages.empty()) return text;
  return continue_final_message(std::move(text), messages.back().content);
}

Result<std::vector<int32_t>> Server::prompt_ids(const PromptInput& p) const {
  if (p.is_tokens) {
    LRA_RETURN_IF_ERROR(check_vocab(p.tokens, "prompt"));
    return p.tokens;
  }
  if (!tok_)
    return make_error(ErrorCode::kInvalidArgument,
                      "this model has no tokenizer.json: send 'prompt' as a list of token ids");
  return tok_->encode(p.text, p.add_special_tokens);
}

Result<std::shared_ptr<guide::TokenGuide>> Server::guide_for(const CompletionRequest& req) const {
  const bool grammar = !req.guided_grammar.empty();
  // Kept per cache_salt too: a guide another client compiled would answer faster, which tells
  // a client of another salt what that one asked for.
  const std::string key = req.cache_salt + "\n" +
                          (grammar ? "grammar\n" + req.guided_grammar_root + "\n" + req.guided_grammar
                                   : "regex\n" + req.guided_regex);
  {
    std::lock_guard<std::mutex> lock(guides_mu_);
    for (auto it = guides_.begin(); it != guides_.end(); ++it)
      if (it->first == key) {
        guides_.splice(guides_.begin(), guides_, it);  // most recently used first
        return guides_.front().second;
      }
  }
  // Compiled outside the lock (a large schema takes a while); two requests racing on a new text
  // each compile it, and the cache keeps one.
  auto g = grammar ? guide::TokenGuide::compile_grammar(req.guided_grammar, req.guided_grammar_root, vocab_trie())
                   : guide::TokenGuide::compile(req.guided_regex, vocab_trie());
  if (!g.ok()) return g.error();
  std::shared_ptr<guide::TokenGuide> shared = std::move(*g);
  std::lock_guard<std::mutex> lock(guides_mu_);
  guides_.emplace_front(key, shared);
  if (guides_.size() > kGuideCache) guides_.pop_back();
  return shared;
}

Result<Server::Prepared> Server::prepare(const CompletionRequest& req) const {
  Prepared p;
  p.req = req;
  LRA_ASSIGN_OR_RETURN(p.agent, agent_for(req.model));
  if (!tok_ && !req.stop.empty())
    return make_error(ErrorCode::kInvalidArgument, "'stop' strings need a tokenizer, which this model lacks: use 'stop_token_ids'");
  for (const auto& [id, bias] : req.logit_bias) LRA_RETURN_IF_ERROR(check_vocab({&id, 1}, "logit_bias"));
  if (const int asked = std::max(req.logprobs, req.prompt_logprobs); opts_.max_logprobs >= 0 && asked > opts_.max_logprobs)
    return make_error(ErrorCode::kInvalidArgument,
                      "the request asks for the log-probabilities of {} tokens a position ('{}'), more than this "
                      "server's limit of {}: ask for fewer, or start the server with a larger --max-logprobs (-1: no limit)",
                      asked, req.logprobs >= req.prompt_logprobs ? "logprobs' / 'top_logprobs" : "prompt_logprobs",
                      opts_.max_logprobs);
  if (req.priority != 0 && !opts_.priority_scheduling)
    return make_error(ErrorCode::kInvalidArgument,
                      "'priority' {} asks for priority scheduling, which is not enabled: start the server with "
                      "--scheduling-policy priority (or leave 'priority' out)",
                      req.priority);
  LRA_RETURN_IF_ERROR(check_vocab(req.allowed_token_ids, "allowed_token_ids"));
  if (!req.bad_words.empty()) {
    if (!tok_)
      return make_error(ErrorCode::kInvalidArgument, "'bad_words' need a tokenizer, which this model lacks");
    LRA_ASSIGN_OR_RETURN(p.bad_words, bad_word_ids(*tok_, req.bad_words));
  }
  if (req.thinking_token_budget >= 0) {
    if (!tok_)
      return make_error(ErrorCode::kInvalidArgument, "'thinking_token_budget' needs a tokenizer, which this model lacks");
    LRA_ASSIGN_OR_RETURN(p.reasoning_start, tok_->encode(kThinkStart, /*add_special_tokens=*/false));
    LRA_ASSIGN_OR_RETURN(p.reasoning_end, tok_->encode(kThinkEnd, /*add_special_tokens=*/false));
  }
  if (!req.guided_from.empty()) {
    if (!tok_)
      return make_error(ErrorCode::kInvalidArgument,
                        "'{}' needs the model's tokenizer.json (to know the text of each token), which this model lacks",
                        req.guided_from);
    auto g = guide_for(req);
    if (!g.ok()) return Error{g.error().code, fmt::format("'{}': {}", req.guided_from, g.error().message)};
    p.guide = std::move(*g);
  }
  const int64_t max_model_len = opts_.max_model_len;
  const int64_t keep = req.truncate_prompt_tokens < 0 ? max_model_len : req.truncate_prompt_tokens;
  if (keep > max_model_len)
    return make_error(ErrorCode::kInvalidArgument,
                      "'truncate_prompt_tokens' ({}) is greater than this model's maximum context length ({}): give a "
                      "smaller number, or -1 for the context length",
                      keep, max_model_len);
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    LRA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, prompt_ids(req.prompts[i]));
    // vLLM's left truncation: the prompt's last `keep` tokens (BOS and the template's start go too).
    const bool truncated = keep > 0 && static_cast<int64_t>(ids.size()) > keep;
    if (truncated) ids.erase(ids.begin(), ids.end() - keep);
    if (ids.empty())
      return make_error(ErrorCode::kInvalidArgument, "'prompt' is empty and this model has no BOS token to start from");
    // Chat without max_tokens: the rest of the context (at most the model's max_new_tokens), as vLLM.
    const int64_t rest = std::max<int64_t>(max_model_len - static_cast<int64_t>(ids.size()), 1);
    const int64_t budget = req.max_tokens >= 0     ? req.max_tokens
                           : req.max_tokens_cap > 0 ? std::min<int64_t>(rest, req.max_tokens_cap)
                                                    : rest;
    p.budgets.push_back(static_cast<int>(budget));
    const int64_t want = static_cast<int64_t>(ids.size()) + budget;
    if (want > max_model_len)
      return make_error(ErrorCode::kInvalidArgument,
                        "this model's maximum context length is {} tokens, but {} were requested ({} in the prompt{}, "
                        "{} for the completion): shorten the prompt or lower 'max_tokens' (the server's "
                        "--max-context sets the limit)",
                        max_model_len, want, ids.size(), req.prompts.size() > 1 ? fmt::format(" {}", i) : "",
                        want - static_cast<int64_t>(ids.size()));
    if (req.echo)  // a truncated prompt echoes what the model read
      p.echo.push_back(req.prompts[i].is_tokens || truncated ? (tok_ ? tok_->decode(ids) : std::string())
                                                             : req.prompts[i].text);
    p.ids.push_back(std::move(ids));
  }
  return p;
}

Result<std::vector<CompletionChoice>> Server::complete(const CompletionRequest& req, const DeltaFn& on_delta) {
  LRA_ASSIGN_OR_RETURN(Prepared p, prepare(req));
  return run(p, on_delta);
}

struct Server::ChoiceRun {
  size_t index = 0;                     // the choice (prompt index * n + sample)
  CompletionChoice c;
  int64_t lease = 0;                    // its trajectory (SessionPool id)
  int64_t kept = 0;                     // tokens that trajectory held when it took it (Lease::reused_tokens)
  std::optional<CompletionText> text;   // the shown text and its stop strings (with a tokenizer)
  std::string shown;                    // the echoed prompt
  // Streamed with "logprobs": the echo waits for the prompt's log-probabilities, to go out with
  // the first token (or the step's end), as vLLM's first chunk carries both.
  bool echo_pending = false;
  CompletionDelta pending;              // tokens (and log-probabilities) not sent with a piece yet
  size_t pushed = 0;                    // output tokens given to `text`
  uint64_t seed = 0;                    // its sampler's (a resumed turn draws on from the same stream)
  // Preempted (its trajectory dropped to make room in the KV memory): what it had produced, which
  // its next turn resumes from, and the tokens its earlier turns computed.
  std::vector<int32_t> resumed;
  std::vector<StepLogprobs> resumed_logprobs;  // [resumed] when asked for
  int64_t prefilled_before = 0;
  DraftCounts drafts_before;
  // Preempted once while it ran alone (Server::make_room): it ran short on a trajectory that held
  // other agents' caches too, and resumed without them; short alone again, it does not fit.
  bool restarted_alone = false;
  std::unique_ptr<AgentTurn> turn;
};

// A request between its handler thread (which waits in run()) and the engine thread. The fields
// under `mu` pass pieces and the end to the handler; the rest is the engine's, and the handler
// reads `out` and `error` only once `finished` is set, after which the engine never touches it.
struct Server::Job {
  using Clock = std::chrono::steady_clock;
  const Prepared* p = nullptr;
  bool streaming = false;
  std::atomic<bool> cancelled{false};  // the handler's on_delta declined: the client went away
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CompletionDelta> deltas;  // under mu: pieces for the handler
  bool finished = false;                // under mu
  std::optional<Error> error;
  std::vector<CompletionChoice> out;
  // Engine thread only.
  size_t next = 0;           // the next choice to start (prompt next / n, sample next % n)
  bool running = false;      // counted as running in the metrics
  bool abandoned = false;    // the engine saw `cancelled`
  bool ended = false;        // in ended_
  std::optional<Clock::time_point> first_token;
  // The choices running now: several at once when they can (n > 1, several prompts), each on its
  // own trajectory (a copy of the one its prompt belongs on while another choice runs there).
  std::vector<std::unique_ptr<ChoiceRun>> runs;
  // Choices preempted to make room in the KV memory, in the order they stopped: each resumes
  // (before any new choice of any request starts) once there is room again.
  std::deque<std::unique_ptr<ChoiceRun>> preempted;
  std::vector<std::optional<CompletionChoice>> done;  // [choices()] the finished ones
  size_t choices() const { return p->ids.size() * static_cast<size_t>(p->req.n); }
};

Result<std::vector<CompletionChoice>> Server::run(const Prepared& p, const DeltaFn& on_delta, const AliveFn& alive) {
  Job job;
  job.p = &p;
  job.streaming = static_cast<bool>(on_delta);
  job.done.resize(job.choices());
  metrics_.request_waiting(p.agent);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) {
      metrics_.request_running(p.agent);
      metrics_.request_done(p.agent);
      return make_error(ErrorCode::kInternal, "the server is shutting down");
    }
    queue_.push_back(&job);
  }
  queue_cv_.notify_one();
  // The job lives in this frame: this thread waits for `finished` whatever happens, an exception
  // from on_delta included (it cancels the request and is rethrown once the engine let go).
  std::exception_ptr thrown;
  for (bool finished = false; !finished;) {
    std::vector<CompletionDelta> deltas;
    {
      std::unique_lock<std::mutex> lock(job.mu);
      auto ready = [&] { return job.finished || !job.deltas.empty(); };
      if (!alive || job.cancelled.load()) {
        job.cv.wait(lock, ready);
      } else if (!job.cv.wait_for(lock, kAlivePoll, ready)) {
        lock.unlock();  // the check may block on the socket: not under the lock the engine takes
        if (!alive()) job.cancelled.store(true);  // the engine ends it before it starts or at its next token
        continue;
      }
      deltas.swap(job.deltas);
      finished = job.finished;
    }
    for (const CompletionDelta& d : deltas) {
      if (job.cancelled.load()) break;
      try {
        if (!on_delta(d)) job.cancelled.store(true);
      } catch (...) {
        thrown = std::current_exception();
        job.cancelled.store(true);
      }
    }
  }
  if (thrown) std::rethrow_exception(thrown);
  if (job.error) return *job.error;
  return std::move(job.out);
}

void Server::admit(std::vector<Job*>& active) {
  for (Job* j : queue_) {
    if (!opts_.priority_scheduling) {
      active.push_back(j);
      continue;
    }
    // After every job of its priority or a lower value: stable, arrival order among equals.
    const int64_t pr = j->p->req.priority;
    auto at = std::upper_bound(active.begin(), active.end(), pr,
                               [](int64_t v, const Job* a) { return v < a->p->req.priority; });
    active.insert(at, j);
  }
  queue_.clear();
}

void Server::engine_loop() {
  // Admitted, in arrival order (or by priority, then arrival: admit), which is the order their
  // choices start in and, from the back, the order they give back KV memory (make_room).
  std::vector<Job*> active;
  bool worked = false;        // requests ran since the last on_idle
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_progress = Clock::now(), last_warned{};
  for (;;) {
    if (worked && active.empty() && opts_.on_idle) {
      bool waiting = false;
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        waiting = !queue_.empty();
      }
      if (!waiting) {
        opts_.on_idle();
        worked = false;
      }
    }
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !tasks_.empty() || !active.empty(); });
      // Runtime changes (on_engine) between passes, the lock let go while they run.
      while (!tasks_.empty()) {
        std::function<void()> task = std::move(tasks_.front());
        tasks_.pop_front();
        lock.unlock();
        task();
        lock.lock();
      }
      if (stopping_) {
        active.insert(active.end(), queue_.begin(), queue_.end());
        queue_.clear();
        lock.unlock();
        for (Job* j : active) fail_job(*j, Error{ErrorCode::kInternal, "the server is shutting down"});
        active.clear();
      } else {
        // The stall clock starts when requests come to an idle engine: its idle wait is no stall.
        if (active.empty()) {
          last_progress = Clock::now();
          counts_at_advance_ = counts_;
        }
        admit(active);
      }
    }
    bool ran = false;
    // The server stays up: an exception fails the requests that were starting or running (those
    // with a choice), not the waiting ones.
    auto fail_running = [&](const std::string& what) {
      for (Job* j : active)
        if (!j->runs.empty() && !j->ended) fail_job(*j, Error{ErrorCode::kInternal, "internal error: " + what});
    };
    try {
      ran = engine_pass(active);
    } catch (const std::exception& e) {
      fail_running(e.what());
    } catch (...) {
      fail_running("unknown exception");
    }
    // Before the ended requests hear of it: an unloaded adapter their trajectories held is freed.
    if (!retired_.empty()) free_retired();
    const bool ended_any = !ended_.empty();
    const bool progress = ran || ended_any;
    worked = worked || progress;
    // Handed back last: a handler may destroy its job as soon as it sees `finished`.
    for (Job* j : ended_) {
      std::erase(active, j);
      // Notified under the lock: the handler, once it sees `finished`, destroys the job (its cv
      // with it), and it cannot look before this thread lets go of the mutex.
      std::lock_guard<std::mutex> lock(j->mu);
      j->finished = true;
      j->cv.notify_all();
    }
    ended_.clear();
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (stopping_ && active.empty() && queue_.empty() && tasks_.empty()) return;
    }
    // A job waits only for a trajectory another running job holds, so some turn always runs;
    // should none, wait for a new request rather than spin.
    assert((progress || active.empty()) && "every admitted request waits: no running turn to release a trajectory");
    // No turn advancing for long (no pass, or only passes short of KV memory) while requests are
    // admitted should never last: say so, with what they wait for, rather than hang silently.
    const Clock::time_point now = Clock::now();
    counts_.evicted = pool_->evicted_sessions();
    counts_.preempted = preemptions_;
    if (advanced_ || ended_any || active.empty()) {
      last_progress = now;
      counts_at_advance_ = counts_;
    }
    advanced_ = false;
    if (!active.empty() && now - last_progress > opts_.stall_warning && now - last_warned > opts_.stall_warning &&
        opts_.warn) {
      opts_.warn(stall_report(active, std::chrono::duration<double>(now - last_progress).count()));
      last_warned = now;
    }
    if (!progress && !active.empty()) {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait_for(lock, std::chrono::milliseconds(50),
                         [&] { return stopping_ || !queue_.empty() || !tasks_.empty(); });
    }
  }
}

std::string Server::stall_report(const std::vector<Job*>& active, double seconds) const {
  size_t running = 0, preempted = 0, unstarted = 0, abandoned = 0;
  const std::vector<SessionPool::Info> kept = pool_->sessions();
  auto trajectory = [&](int64_t id) -> const SessionPool::Info* {
    for (const auto& i : kept)
      if (i.id == id) return &i;
    return nullptr;
  };
  // Each running choice: its agent, what it has produced and the trajectory it runs on.
  std::string choices;
  for (const Job* j : active) {
    if (j->ended) continue;
    running += j->runs.size();
    preempted += j->preempted.size();
    unstarted += j->choices() - std::min(j->next, j->choices());
    abandoned += j->abandoned || j->cancelled.load() ? 1 : 0;
    for (const auto& r : j->runs) {
      const SessionPool::Info* t = trajectory(r->lease);
      choices += fmt::format("; choice {} of a request to '{}' ({} prompt tokens, {} produced{}{}, on trajectory {}",
                             r->index, j->p->agent.empty() ? "the base model" : j->p->agent,
                             r->c.prompt_tokens, r->resumed.size() + r->pushed,
                             r->resumed.empty() ? "" : ", resumed", r->restarted_alone ? ", restarted alone" : "",
                             r->lease);
      if (t) choices += fmt::format(": {} tokens, {} bytes", t->tokens, t->bytes.allocated);
      choices += ")";
    }
  }
  size_t idle = 0, idle_copied = 0;
  int64_t idle_bytes = 0;
  for (const auto& i : kept) {
    if (i.running || i.bytes.allocated == 0) continue;
    ++idle;
    idle_bytes += i.bytes.allocated;
    idle_copied += i.copied ? 1 : 0;
  }
  const KvArena* a = pool_->shared_arena();
  return fmt::format(
      "engine stalled: no request advanced for {:.1f} s with {} requests admitted ({} choices running, {} preempted waiting{}, "
      "{} not started, {} abandoned); {} trajectories held, {} idle holding {} bytes ({} of them shared by a live "
      "copy){}; since the last advance {} passes ran, {} of them short of KV memory, {} trajectories were dropped and {} "
      "choices preempted{}. Please report this with the requests that led to it",
      seconds, active.size(), running, preempted,
      preempted > 0 ? (ended_choices_ == ended_at_preemption_ ? " for a running choice to end" : ", free to resume")
                    : "",
      unstarted, abandoned, pool_->held_sessions(), idle, idle_bytes, idle_copied,
      a ? fmt::format(", KV memory {} of {} bytes in use", a->lent_bytes(), a->capacity_bytes()) : std::string(),
      counts_.passes - counts_at_advance_.passes, counts_.short_passes - counts_at_advance_.short_passes,
      counts_.evicted - counts_at_advance_.evicted, counts_.preempted - counts_at_advance_.preempted, choices);
}

bool Server::engine_pass(const std::vector<Job*>& active) {
  // Preempted choices resume first, in the order they stopped; no new choice starts while one waits.
  auto none_preempted = [&] {
    return std::none_of(active.begin(), active.end(), [](const Job* j) { return !j->ended && !j->preempted.empty(); });
  };
  for (Job* j : active)
    while (!j->ended && start_choice(*j, none_preempted())) {
    }
  std::vector<AgentTurn*> turns;
  std::vector<std::pair<Job*, ChoiceRun*>> owners, finished;  // [turns]; nothing to generate
  for (Job* j : active) {
    if (j->ended) continue;
    for (const auto& r : j->runs) {
      if (r->turn->done()) {  // nothing to generate (echo with max_tokens 0)
        finished.emplace_back(j, r.get());
        continue;
      }
      turns.push_back(r->turn.get());
      owners.emplace_back(j, r.get());
    }
  }
  // A choice that ends successfully never ends another choice of its job.
  for (auto [j, r] : finished) end_choice(*j, *r, Status::Ok());
  advanced_ = advanced_ || !finished.empty();
  if (turns.empty()) return false;
  std::vector<Status> status;  // [turns]
  // Every turn decoding with its picks on the device: passes back to back with decode lookahead
  // (the host records step t + 1 while the device runs step t) until a turn ends or a new request
  // (or an on_engine task) comes in, so that it joins the batch at the next pass as before.
  const bool window = std::all_of(turns.begin(), turns.end(),
                                  [](const AgentTurn* t) { return t->looks_ahead() && t->pending_tokens() == 1; });
  if (window) {
    // An admitted request whose choice could not start waits for something a pass may bring
    // (the prefix it would copy being computed): with one waiting, a window runs two passes (the
    // second launched while the first runs) and start_choice looks again.
    const bool waiting = std::any_of(active.begin(), active.end(), [](const Job* j) {
      return !j->ended && !j->abandoned && (j->next < j->choices() || !j->preempted.empty());
    });
    int launches = 0;
    TurnWindow w = decode_turns(*model_, turns, [&] {
      if (const KvArena* a = pool_->shared_arena()) metrics_.set_kv_used(a->lent_bytes());  // as after a pass
      if (waiting && ++launches > 1) return false;
      std::lock_guard<std::mutex> lock(queue_mu_);
      return queue_.empty() && tasks_.empty() && !stopping_;  // an adapter loaded or unloaded ends it too
    });
    for (int64_t rows : w.passes) metrics_.record_pass(rows, rows);
    if (w.ran) status = std::move(w.status);
  }
  if (status.empty()) {
    TurnStep step = step_turns(*model_, turns, opts_.max_batch_tokens, opts_.max_pass_tokens);
    metrics_.record_pass(step.sequences, step.tokens);
    status = std::move(step.status);
  }
  std::vector<std::pair<Job*, ChoiceRun*>> short_of_memory;
  for (size_t k = 0; k < turns.size(); ++k) {
    // A failed choice fails its whole job (its other choices with it): skip what it ended.
    if (owners[k].first->ended) continue;
    // The KV memory every trajectory shares is full (it is smaller than their caps): the turn
    // tries again once room is made, its pass not run (nothing of it advanced).
    if (!status[k].ok() && status[k].error().code == ErrorCode::kOutOfMemory && pool_->oversubscribed()) {
      short_of_memory.push_back(owners[k]);
      continue;
    }
    advanced_ = advanced_ || status[k].ok();
    if (!status[k].ok() || turns[k]->done()) end_choice(*owners[k].first, *owners[k].second, status[k]);
  }
  ++counts_.passes;
  if (!short_of_memory.empty()) {
    ++counts_.short_passes;
    make_room(active, short_of_memory);
  }
  // The KV memory in use grows with every pass (lragent:kv_cache_usage_perc follows it; in a
  // decode window, before each launch).
  if (const KvArena* a = pool_->shared_arena()) metrics_.set_kv_used(a->lent_bytes());
  return true;
}

std::string Server::take_echo(ChoiceRun& run, const std::vector<StepLogprobs>& prompt_logprobs) {
  if (!run.echo_pending) return {};
  run.echo_pending = false;
  run.pending.echo_logprobs = prompt_logprobs;
  return run.shown;
}

bool Server::emit(Job& job, ChoiceRun& run, std::string text) {
  if (job.cancelled.load()) job.abandoned = true;
  if ((text.empty() && !run.pending.echo_logprobs) || !job.streaming) return !job.abandoned;
  run.pending.text = std::move(text);
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.deltas.push_back(std::move(run.pending));
  }
  job.cv.notify_one();
  const size_t index = run.pending.index;
  run.pending = CompletionDelta{};
  run.pending.index = index;
  return !job.abandoned;
}

bool Server::start_choice(Job& job, bool may_start_new) {
  const Prepared& p = *job.p;
  const CompletionRequest& req = p.req;
  if (job.cancelled.load()) job.abandoned = true;  // its client went away while it waited
  if (job.abandoned) {
    abort_preempted(job);
    if (job.runs.empty()) end_job(job, std::nullopt);
    return false;
  }
  const bool resume = !job.preempted.empty();
  if (!resume && job.next >= job.choices()) {
    if (job.runs.empty()) end_job(job, std::nullopt);
    return false;
  }
  if (!resume && !may_start_new) return false;
  // A preempted choice waits until a running one has ended since the last preemption (or none
  // runs): the memory its preemption gave back is what the running ones are growing into, so
  // resuming on it at once would only be preempted again at their next page, its recompute lost.
  if (resume && ended_choices_ == ended_at_preemption_ && pool_->held_sessions() > 0) return false;
  const size_t index = resume ? job.preempted.front()->index : job.next;
  const size_t i = index / static_cast<size_t>(req.n);
  const size_t j = index % static_cast<size_t>(req.n);
  std::vector<int32_t> prompt = p.ids[i];
  if (resume) prompt.insert(prompt.end(), job.preempted.front()->resumed.begin(), job.preempted.front()->resumed.end());
  // The prompt's log-probabilities need all of it computed by this request: a trajectory of its own.
  auto lease = pool_->acquire(p.agent, prompt, /*reuse=*/req.prompt_logprobs < 0, req.cache_salt);
  if (!lease.ok()) {
    fail_job(job, lease.error());
    return false;
  }
  if (!*lease) return false;  // no trajectory for it yet (see SessionPool::acquire): next time
  // In a KV memory smaller than the trajectories' caps, a choice whose catch-up would not fit
  // beside the running ones waits for them (unless none runs): started, it would fill the memory
  // part way and be preempted, its work thrown away. Kept trajectories no request runs on make
  // room first (least recently used), as vLLM's prefix cache gives its blocks to new requests.
  if (pool_->oversubscribed() && pool_->held_sessions() > 1) {
    bool room = pool_->has_room((*lease)->id, p.agent);
    while (!room && pool_->evict_idle()) room = pool_->has_room((*lease)->id, p.agent);
    if (!room) {
      pool_->unacquire(**lease);
      return false;
    }
  }
  if (!job.running) {
    metrics_.request_running(job.p->agent);
    job.running = true;
  }
  // Held from here: every way out drops or releases it (fail_job, end_choice), an exception too.
  if (resume) {
    job.runs.push_back(std::move(job.preempted.front()));
    job.preempted.pop_front();
  } else {
    job.runs.push_back(std::make_unique<ChoiceRun>());
  }
  ChoiceRun& cr = *job.runs.back();
  cr.lease = (*lease)->id;
  cr.kept = (*lease)->reused_tokens;
  cr.c.trajectory = (*lease)->id;
  if (!resume) {
    cr.index = job.next;
    cr.c.prompt_tokens = static_cast<int64_t>(p.ids[i].size());
    cr.c.prompt_index = i;
    cr.c.reused_tokens = (*lease)->reused_tokens;
    cr.pending.index = job.next;
    cr.seed = req.seeded ? req.sampling.seed + static_cast<uint64_t>(j) : next_seed_++;
  }
  AgentDecode dec;
  dec.sampling = req.sampling;
  dec.penalties = req.penalties;
  dec.sampling.seed = cr.seed;
  dec.logprobs = req.logprobs;
  dec.prompt_logprobs = req.prompt_logprobs;
  dec.logit_bias = req.logit_bias;
  dec.min_tokens = std::min(req.min_tokens, p.budgets[i]);
  dec.min_p = req.min_p;
  dec.allowed_ids = req.allowed_token_ids;
  dec.bad_words = p.bad_words;
  dec.reasoning_budget = req.thinking_token_budget;
  dec.reasoning_start = p.reasoning_start;
  dec.reasoning_end = p.reasoning_end;
  // A "<think>" the template left open counts its tokens in the prompt (vLLM); else the output
  // starts in the reasoning, as the reasoning parser reads it, until the model writes a "<think>".
  if (dec.reasoning_budget >= 0)
    dec.reasoning_open = std::max<int64_t>(0, thinking_tokens(p.ids[i], p.reasoning_start, p.reasoning_end, -1));
  dec.guide = p.guide.get();  // shared by the request's choices, all run on this thread
  if (!req.ignore_eos) dec.stop_ids = model_->config().eos_token_ids;
  dec.stop_ids.insert(dec.stop_ids.end(), req.stop_token_ids.begin(), req.stop_token_ids.end());
  dec.resumed = cr.resumed;
  dec.resumed_logprobs = cr.resumed_logprobs;
  if (!resume) {
    // Decoded after the prompt's last token, as vLLM decodes a completion. The stop strings are
    // found in this shown text (CompletionText), which ends the step through on_token; the
    // engine itself is given none.
    if (tok_) cr.text.emplace(*tok_, req.stop, req.skip_special_tokens, p.ids[i].back(), dec.min_tokens,
                                  req.include_stop_str_in_output);
    cr.shown = req.echo ? p.echo[i] : std::string();
  }
  // Every token but a stop id that ends the step (ends() checks those first) comes here.
  dec.on_token = [this, &job, &cr](int32_t t, const StepLogprobs* lp) {
    if (!job.first_token) job.first_token = Job::Clock::now();
    ++cr.pushed;
    // The turn's catch-up is over: its prompt log-probabilities are all there.
    assert((!cr.echo_pending || cr.turn) && "a token comes from a started turn");
    std::string lead = cr.echo_pending ? take_echo(cr, cr.turn->progress().prompt_logprobs) : std::string();
    cr.pending.token_ids.push_back(t);
    if (lp) cr.pending.logprobs.push_back(*lp);
    if (!cr.text) return emit(job, cr, std::move(lead));  // no tokenizer, no text: the ids go with the last piece
    std::string piece = cr.text->push(t);
    if (!lead.empty()) piece.insert(0, lead);  // only the first token's piece leads with the echo
    return emit(job, cr, std::move(piece)) && !cr.text->matched_stop();
  };
  if (!resume) {
    ++job.next;
    cr.echo_pending = job.streaming && req.echo && req.logprobs >= 0;
    if (!emit(job, cr, cr.echo_pending ? std::string() : cr.shown)) {  // the client went away: nothing ran on the trajectory
      pool_->unacquire(**lease);
      job.runs.pop_back();
      if (job.runs.empty()) end_job(job, std::nullopt);
      return false;
    }
  }
  auto turn = AgentTurn::start(*(*lease)->session, p.agent, p.budgets[i], {}, {}, std::move(dec));
  if (!turn.ok()) {  // a droidspeak catch-up may have run part way
    fail_job(job, turn.error());
    return false;
  }
  cr.turn = std::move(*turn);
  publish_sessions();  // GET /lragent/sessions shows it running
  return true;
}

void Server::preempt(Job& job, ChoiceRun& cr, bool drop_trajectory) {
  const StepResult& so_far = cr.turn->progress();
  cr.resumed = so_far.output_tokens;
  cr.resumed_logprobs = so_far.logprobs;
  cr.prefilled_before += so_far.prefilled_tokens;
  cr.drafts_before += so_far.drafts;
  cr.turn.reset();  // it holds a KV binding into its trajectory's caches: first
  // Its blocks back to the KV memory (those a copy shares stay with it): all of them, or those
  // past what the trajectory held before it (other agents' turns, a long shared prefix), which it
  // resumes on unless they are needed too.
  if (drop_trajectory) {
    pool_->drop(cr.lease);
  } else {
    pool_->cut_and_release(cr.lease, cr.kept);
  }
  cr.lease = 0;
  auto it = std::find_if(job.runs.begin(), job.runs.end(), [&cr](const auto& r) { return r.get() == &cr; });
  assert(it != job.runs.end() && "a preempted choice is one of its job's running ones");
  job.preempted.push_back(std::move(*it));
  job.runs.erase(it);
  ++preemptions_;
  ended_at_preemption_ = ended_choices_;
  publish_sessions();
}

void Server::abort_preempted(Job& job) {
  for (std::unique_ptr<ChoiceRun>& cr : job.preempted) {
    CompletionChoice c = std::move(cr->c);
    c.text = cr->shown + (cr->text ? cr->text->text() : std::string());
    c.finish_reason = "abort";
    c.completion_tokens = static_cast<int64_t>(cr->resumed.size());
    c.token_ids = std::move(cr->resumed);
    c.logprobs = std::move(cr->resumed_logprobs);
    c.prefilled_tokens = cr->prefilled_before;
    c.drafts = cr->drafts_before;
    job.done[cr->index] = std::move(c);
  }
  job.preempted.clear();
}

void Server::make_room(const std::vector<Job*>& active, std::span<const std::pair<Job*, ChoiceRun*>> short_of_memory) {
  // Trajectories kept only for a later request's prefix go first (vLLM's prefix cache evicts
  // before it preempts); the turns that ran short try again at the next pass.
  if (pool_->evict_idle()) return;
  size_t running = 0;
  for (const Job* j : active)
    if (!j->ended) running += j->runs.size();
  if (running <= 1) {
    // Alone and still short. --max-model-len promises that one agent's caches fit alone, but its
    // trajectory may hold other agents' too (an agent extending another's turn computes its own
    // in none, and in base-lr with adapters of different A): once, the choice gives it all back
    // and resumes, recomputing, on a trajectory of its own (vLLM would have evicted the other
    // adapter's prefix blocks). Short again, this request does not fit the KV memory (a
    // trajectory a copy shares blocks with may hold some).
    for (auto [job, cr] : short_of_memory) {
      if (job->ended) continue;
      if (!cr->restarted_alone) {
        cr->restarted_alone = true;
        preempt(*job, *cr, /*drop_trajectory=*/true);
        continue;
      }
      fail_job(*job, Error{ErrorCode::kOutOfMemory,
                             "this request does not fit the server's KV memory (--kv-cache-memory / "
                             "--gpu-memory-utilization) even with no other request running: shorten the prompt or "
                             "lower 'max_tokens', or give the server more KV memory"});
    }
    return;
  }
  // Else the latest request's latest choice gives its memory back (vLLM preempts the request that
  // came last), to resume by recompute once there is room: whichever choices ran short try again.
  for (auto it = active.rbegin(); it != active.rend(); ++it) {
    Job& j = **it;
    if (j.ended || j.runs.empty()) continue;
    preempt(j, *j.runs.back());
    return;
  }
}

void Server::fail_job(Job& job, Error error) {
  // The turns go before their trajectories: each may hold a KV binding into its trajectory's caches.
  std::vector<int64_t> leases;
  for (const auto& r : job.runs) leases.push_back(r->lease);
  job.runs.clear();
  for (int64_t lease : leases) pool_->drop(lease);  // their caches may hold a partial pass
  job.preempted.clear();  // they hold no trajectory
  end_job(job, std::move(error));
}

void Server::end_choice(Job& job, ChoiceRun& cr, const Status& st) {
  if (!st.ok()) {
    if (st.error().code == ErrorCode::kOutOfMemory)  // a trajectory's own KV memory: retrying cannot help
      return fail_job(job, Error{ErrorCode::kInvalidArgument,
                                    fmt::format("this request does not fit one trajectory's KV memory ({}): shorten "
                                                "the prompt or lower 'max_tokens' (the server's --kv-memory / "
                                                "--max-context set it)",
                                                st.error().message)});
    return fail_job(job, st.error());
  }
  const CompletionRequest& req = job.p->req;
  StepResult r = cr.turn->result();
  pool_->release(cr.lease);
  ++ended_choices_;
  CompletionChoice& c = cr.c;
  if (!job.first_token && !r.output_tokens.empty()) job.first_token = Job::Clock::now();  // a stop id came first
  // The stop id that ended the step, if one did, was not given to on_token: its text is never shown.
  for (; cr.pushed < r.output_tokens.size(); ++cr.pushed)
    if (cr.text) cr.text->push(r.output_tokens[cr.pushed], /*ends_step=*/true);
  c.text = cr.shown;
  std::string lead = take_echo(cr, r.prompt_logprobs);  // no token was shown (max_tokens 0, a stop id first)
  if (!cr.text) emit(job, cr, std::move(lead));
  if (cr.text) {
    emit(job, cr, lead + cr.text->finish());
    c.text += cr.text->text();
    c.stop_reason = cr.text->matched_stop();
  }
  if (c.stop_reason) {
    c.finish_reason = "stop";
  } else {
    c.finish_reason = job.abandoned ? "abort" : r.finish_reason;
    if (c.finish_reason == "stop" && !r.output_tokens.empty()) {  // a stop id; vLLM names it unless EOS
      const int32_t last = r.output_tokens.back();
      const auto& eos = model_->config().eos_token_ids;
      if (std::find(eos.begin(), eos.end(), last) == eos.end() || req.ignore_eos) c.stop_token = last;
    }
  }
  c.completion_tokens = static_cast<int64_t>(r.output_tokens.size());
  c.token_ids = r.output_tokens;
  c.logprobs = std::move(r.logprobs);
  c.prompt_logprobs = std::move(r.prompt_logprobs);
  c.prefilled_tokens = r.prefilled_tokens + cr.prefilled_before;
  c.drafts = cr.drafts_before;
  c.drafts += r.drafts;
  job.done[cr.index] = std::move(c);
  std::erase_if(job.runs, [&cr](const std::unique_ptr<ChoiceRun>& r) { return r.get() == &cr; });
  if (job.abandoned) abort_preempted(job);
  if (job.runs.empty() && job.preempted.empty() && (job.abandoned || job.next >= job.choices()))
    end_job(job, std::nullopt);
}

void Server::end_job(Job& job, std::optional<Error> error) {
  if (job.ended) return;
  job.ended = true;
  job.error = std::move(error);
  ended_.push_back(&job);  // first: whatever happens below, its handler gets it back
  for (std::optional<CompletionChoice>& c : job.done)  // in choice order, however they finished
    if (c) job.out.push_back(std::move(*c));
  if (!job.running) metrics_.request_running(job.p->agent);
  publish_sessions();
  // Counted also on an error: the choices that finished, with the sharing state the request left.
  RequestRecord rec;
  rec.model = job.p->agent;
  std::tie(rec.prompt_tokens, rec.generation_tokens) = count_tokens(job.out);
  for (const CompletionChoice& c : job.out) {
    rec.finish_reasons.push_back(c.finish_reason);
    rec.reused_tokens += c.reused_tokens;
    rec.prefilled_tokens += c.prefilled_tokens;
    rec.drafts += c.drafts;
  }
  const auto now = Job::Clock::now();
  if (job.first_token) rec.ttft_seconds = std::chrono::duration<double>(*job.first_token - job.p->arrival).count();
  rec.e2e_seconds = std::chrono::duration<double>(now - job.p->arrival).count();
  metrics_.record(rec);
  metrics_.request_done(job.p->agent);
}

void Server::publish_sessions() {
  std::vector<SessionPool::Info> infos = pool_->sessions();
  // /metrics' KV series too, as the engine changes them (vLLM's gauges follow every step), not
  // only when a request ends: a scrape during a long run sees the memory and preemptions of now.
  KvSnapshot kv;
  for (const SessionPool::Info& info : infos) {
    if (info.bytes.total() > 0) ++kv.trajectories;  // the pool also keeps a fresh one (BOS only) per group
    kv.bytes.base += info.bytes.base;
    kv.bytes.lr += info.bytes.lr;
    kv.bytes.full += info.bytes.full;
    kv.bytes.allocated += info.bytes.allocated;
  }
  kv.evicted = pool_->evicted_sessions();
  kv.preempted = preemptions_;
  kv.copied = pool_->copied_sessions();
  kv.copied_tokens = pool_->copied_tokens();
  if (const KvArena* a = pool_->shared_arena()) {
    kv.arena_used = a->lent_bytes();
    kv.arena_capacity = a->capacity_bytes();
  }
  metrics_.set_kv(kv);
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_ = std::move(infos);
  sessions_kv_ = kv;
}

}  // namespace lragent::server
