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
