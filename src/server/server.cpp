#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <span>
#include <tuple>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <fmt/core.h>
#include <httplib.h>

#include "agents/agent_turn.h"
#include "server/client_socket.h"

namespace lragent::server {
namespace {

using nlohmann::json;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const Error& e) { send_json(res, http_status(e.code), error_json(e)); }

// A POST route whose handler gets the body whatever its Content-Type. httplib reads a body sent
// as application/x-www-form-urlencoded (what `curl -d` sends) as form fields and refuses one over
// 8 KB with 413; read through a ContentReader, any body up to the payload limit arrives as is.
void post_route(httplib::Server& svr, const char* route,
                std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)> handler) {
  svr.Post(route, [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                 const httplib::ContentReader& read) {
    std::string body;
    // Without Content-Length or Transfer-Encoding a request has no body (RFC 9112 6.3); httplib
    // would read until the client closes, which `curl -X POST URL` never does (5 s, then a bare 400).
    if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
      // A multipart form's parts are read and dropped: the empty body is then refused as no JSON.
      const bool ok = req.is_multipart_form_data()
                          ? read([](const httplib::MultipartFormData&) { return true; },
                                 [](const char*, size_t) { return true; })
                          : read([&](const char* data, size_t n) {
                              body.append(data, n);
                              return true;
                            });
      if (!ok) return;  // res.status says why (413: over the payload limit); the error handler writes the body
    }
    handler(req, body, res);
  });
}

// Prompt and completion tokens of a request's choices; a prompt counts once however many
// completions (n) it has, as vLLM counts.
std::pair<int64_t, int64_t> count_tokens(const std::vector<CompletionChoice>& cs) {
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    completion += cs[i].completion_tokens;
    if (i == 0 || cs[i].prompt_index != cs[i - 1].prompt_index) prompt += cs[i].prompt_tokens;
  }
  return {prompt, completion};
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", prefix, rng());
}

}  // namespace

struct Server::Http {
  httplib::Server svr;
  bool bound = false;
  int socket = -1;  // the socket httplib last made (set_socket_options sees each before its bind)
};

struct Server::Prepared {
  CompletionRequest req;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  std::string agent;
  std::vector<std::vector<int32_t>> ids;  // [prompts][tokens]
  std::vector<std::string> echo;          // [prompts] the prompt text, when echo is on
  std::vector<int> budgets;               // [prompts] tokens to generate at most
  // The structured output every choice follows (req.guided_regex compiled); null: free text.
  std::unique_ptr<guide::TokenGuide> guide;
};

Result<std::unique_ptr<Server>> Server::create(LlamaModel& model, const Tokenizer* tok, const AdapterRegistry* adapters,
                                               ServerOptions opts) {
  std::unique_ptr<Server> s(new Server());
  s->model_ = &model;
  s->tok_ = tok;
  std::vector<std::string> adapter_names;
  std::vector<const LoraAdapter*> adapter_ptrs;
  for (int i = 0; adapters && i < adapters->size(); ++i) {
    const LoraAdapter& a = adapters->at(i);
    if (a.name == opts.base_name)
      return make_error(ErrorCode::kInvalidArgument,
                        "adapter '{}' has the base model's served name: rename it or pass another --served-model-name",
                        a.name);
    adapter_names.push_back(a.name);
    adapter_ptrs.push_back(&a);
  }
  s->names_.push_back(opts.base_name);
  s->names_.insert(s->names_.end(), adapter_names.begin(), adapter_names.end());
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
  s->publish_sessions();
  s->engine_ = std::thread([srv = s.get()] { srv->engine_loop(); });
  s->created_ = unix_now();
  s->next_seed_ = std::random_device{}();
  s->http_ = std::make_unique<Http>();
  s->install_routes();
  return s;
}

Server::~Server() {
  stop();
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

Result<std::string> Server::agent_for(const std::string& model) const {
  if (model.empty()) return names_.front();
  if (std::find(names_.begin(), names_.end(), model) != names_.end()) return model;
  return make_error(ErrorCode::kNotFound, "the model '{}' does not exist; this server serves: {} (GET /v1/models)", model,
                    fmt::join(names_, ", "));
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
                                        bool enable_thinking, const std::vector<std::string>& tools) const {
  if (!opts_.chat_template) return no_chat_template();
  return opts_.chat_template->render(messages, add_generation_prompt, enable_thinking, tools);
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

Result<Server::Prepared> Server::prepare(const CompletionRequest& req) const {
  Prepared p;
  p.req = req;
  LRA_ASSIGN_OR_RETURN(p.agent, agent_for(req.model));
  if (!tok_ && !req.stop.empty())
    return make_error(ErrorCode::kInvalidArgument, "'stop' strings need a tokenizer, which this model lacks: use 'stop_token_ids'");
  for (const auto& [id, bias] : req.logit_bias) LRA_RETURN_IF_ERROR(check_vocab({&id, 1}, "logit_bias"));
  LRA_RETURN_IF_ERROR(check_vocab(req.allowed_token_ids, "allowed_token_ids"));
  if (!req.guided_from.empty()) {
    if (!tok_)
      return make_error(ErrorCode::kInvalidArgument,
                        "'{}' needs the model's tokenizer.json (to know the text of each token), which this model lacks",
                        req.guided_from);
    auto g = guide::TokenGuide::compile(req.guided_regex, vocab_trie());
    if (!g.ok()) return Error{g.error().code, fmt::format("'{}': {}", req.guided_from, g.error().message)};
    p.guide = std::move(*g);
  }
  const int64_t max_model_len = opts_.max_model_len;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    LRA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, prompt_ids(req.prompts[i]));
    if (ids.empty())
      return make_error(ErrorCode::kInvalidArgument, "'prompt' is empty and this model has no BOS token to start from");
    // Chat without max_tokens: the rest of the context, as vLLM.
    const int64_t budget = req.max_tokens >= 0 ? req.max_tokens
                                               : std::max<int64_t>(max_model_len - static_cast<int64_t>(ids.size()), 1);
    p.budgets.push_back(static_cast<int>(budget));
    const int64_t want = static_cast<int64_t>(ids.size()) + budget;
    if (want > max_model_len)
      return make_error(ErrorCode::kInvalidArgument,
                        "this model's maximum context length is {} tokens, but {} were requested ({} in the prompt{}, "
                        "{} for the completion): shorten the prompt or lower 'max_tokens' (the server's "
                        "--max-context sets the limit)",
                        max_model_len, want, ids.size(), req.prompts.size() > 1 ? fmt::format(" {}", i) : "",
                        want - static_cast<int64_t>(ids.size()));
    if (req.echo)
      p.echo.push_back(req.prompts[i].is_tokens ? (tok_ ? tok_->decode(ids) : std::string()) : req.prompts[i].text);
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
  CompletionDelta pending;              // tokens (and log-probabilities) not sent with a piece yet
  size_t pushed = 0;                    // output tokens given to `text`
  uint64_t seed = 0;                    // its sampler's (a resumed turn draws on from the same stream)
  // Preempted (its trajectory dropped to make room in the KV memory): what it had produced, which
  // its next turn resumes from, and the tokens its earlier turns computed.
  std::vector<int32_t> resumed;
  std::vector<StepLogprobs> resumed_logprobs;  // [resumed] when asked for
  int64_t prefilled_before = 0;
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
  metrics_.request_waiting();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) {
      metrics_.request_running();
      metrics_.request_done();
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

void Server::engine_loop() {
  std::vector<Job*> active;  // admitted, in arrival order
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
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
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
        active.insert(active.end(), queue_.begin(), queue_.end());
        queue_.clear();
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
      if (stopping_ && active.empty() && queue_.empty()) return;
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
      queue_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_ || !queue_.empty(); });
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
  // comes in, so that it joins the batch at the next pass as before.
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
      return queue_.empty() && !stopping_;
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

bool Server::emit(Job& job, ChoiceRun& run, std::string text) {
  if (job.cancelled.load()) job.abandoned = true;
  if (text.empty() || !job.streaming) return !job.abandoned;
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
  auto lease = pool_->acquire(p.agent, prompt);
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
    metrics_.request_running();
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
  dec.logit_bias = req.logit_bias;
  dec.min_tokens = std::min(req.min_tokens, p.budgets[i]);
  dec.min_p = req.min_p;
  dec.allowed_ids = req.allowed_token_ids;
  dec.guide = p.guide.get();  // shared by the request's choices, all run on this thread
  if (!req.ignore_eos) dec.stop_ids = model_->config().eos_token_ids;
  dec.stop_ids.insert(dec.stop_ids.end(), req.stop_token_ids.begin(), req.stop_token_ids.end());
  dec.resumed = cr.resumed;
  dec.resumed_logprobs = cr.resumed_logprobs;
  if (!resume) {
    // Decoded after the prompt's last token, as vLLM decodes a completion. The stop strings are
    // found in this shown text (CompletionText), which ends the step through on_token; the
    // engine itself is given none.
    if (tok_) cr.text.emplace(*tok_, req.stop, req.skip_special_tokens, p.ids[i].back(), dec.min_tokens);
    cr.shown = req.echo ? p.echo[i] : std::string();
  }
  // Every token but a stop id that ends the step (ends() checks those first) comes here.
  dec.on_token = [this, &job, &cr](int32_t t, const StepLogprobs* lp) {
    if (!job.first_token) job.first_token = Job::Clock::now();
    ++cr.pushed;
    cr.pending.token_ids.push_back(t);
    if (lp) cr.pending.logprobs.push_back(*lp);
    if (!cr.text) return emit(job, cr, {});  // no tokenizer, no text: the ids go with the last piece
    return emit(job, cr, cr.text->push(t)) && !cr.text->matched_stop();
  };
  if (!resume) {
    ++job.next;
    if (!emit(job, cr, cr.shown)) {  // the client went away: nothing ran on the trajectory
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
  if (cr.text) {
    emit(job, cr, cr.text->finish());
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
  c.prefilled_tokens = r.prefilled_tokens + cr.prefilled_before;
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
  if (!job.running) metrics_.request_running();
  publish_sessions();
  // Counted also on an error: the choices that finished, with the sharing state the request left.
  RequestRecord rec;
  rec.model = job.p->agent;
  std::tie(rec.prompt_tokens, rec.generation_tokens) = count_tokens(job.out);
  for (const CompletionChoice& c : job.out) {
    rec.finish_reasons.push_back(c.finish_reason);
    rec.reused_tokens += c.reused_tokens;
    rec.prefilled_tokens += c.prefilled_tokens;
  }
  const auto now = Job::Clock::now();
  if (job.first_token) rec.ttft_seconds = std::chrono::duration<double>(*job.first_token - job.p->arrival).count();
  rec.e2e_seconds = std::chrono::duration<double>(now - job.p->arrival).count();
  metrics_.record(rec);
  metrics_.request_done();
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

Result<int> Server::bind(const std::string& host, int port) {
  int bound = -1;
  if (port == 0) {
    bound = http_->svr.bind_to_any_port(host);
  } else if (http_->svr.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound < 0)
    return make_error(ErrorCode::kIo, "cannot listen on {}:{} (in use, or not an address of this machine): pick "
                      "another --port or --host", host, port);
  // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the library):
  // a burst of clients connecting at once overflows it and the kernel drops their handshakes
  // (with SYN cookies some read "connection reset by peer"). listen() again on the listening
  // socket only raises its backlog (capped by net.core.somaxconn; uvicorn, vLLM's server, asks 2048).
  if (::listen(http_->socket, 4096) != 0)
    return make_error(ErrorCode::kIo, "cannot raise the listen backlog of {}:{}: {}", host, bound, std::strerror(errno));
  http_->bound = true;
  return bound;
}

Status Server::serve() {
  if (!http_->bound) return make_error(ErrorCode::kInternal, "Server::serve before bind");
  if (!http_->svr.listen_after_bind()) return make_error(ErrorCode::kIo, "the server's socket failed");
  return Status::Ok();
}

void Server::stop() {
  if (http_ && http_->svr.is_running()) http_->svr.stop();
}

void Server::install_routes() {
  httplib::Server& svr = http_->svr;
  svr.set_payload_max_length(opts_.max_body_bytes);
  const size_t threads = static_cast<size_t>(std::max(opts_.http_threads, 2));
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_keep_alive_timeout(opts_.keep_alive_seconds);
  // SO_REUSEADDR (a restarted server can listen at once) but not httplib's default SO_REUSEPORT,
  // with which a second server on a busy port would start and take half of its connections.
  svr.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    http_->socket = sock;  // the one bound last is the one that listens (bind() raises its backlog)
  });
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opts_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_json(res, 401,
              json{{"error", {{"message", "missing or wrong API key: send \"Authorization: Bearer <key>\" with the "
                                          "server's --api-key"},
                              {"type", "authentication_error"},
                              {"param", nullptr},
                              {"code", 401}}}});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (res.status == 404)
      msg = fmt::format("no route {} {}: the server answers GET /health, GET /v1/models, POST /v1/completions, "
                        "POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET /lragent/sessions, GET /metrics",
                        req.method, req.path);
    else if (res.status == 413)
      msg = "the request body is larger than the server accepts";
    else
      msg = fmt::format("HTTP {}", res.status);
    const int status = res.status;
    const char* type = status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
    send_json(res, status, json{{"error", {{"message", msg}, {"type", type}, {"param", nullptr}, {"code", status}}}});
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, Error{ErrorCode::kInternal, fmt::format("internal error: {}", what)});
  });
  // Counted before the answer is written (the logger runs after it: a client could read
  // /metrics before its own request was counted).
  svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Known routes by name; anything else as "other" (a scan of random paths must not grow the
    // metrics without bound).
    static const char* const kRoutes[] = {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions",
                                          "/lragent/sessions", "/tokenize", "/detokenize", "/metrics"};
    std::string route = "other";
    for (const char* r : kRoutes)
      if (req.path == r) route = r;
    metrics_.record_http(route, res.status);
  });
  if (opts_.log) {
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      opts_.log(fmt::format("{} {} {} {}", req.remote_addr, req.method, req.path, res.status));
    });
  }

  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, json{{"status", "ok"}}); });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (size_t i = 0; i < names_.size(); ++i) {
      data.push_back({{"id", names_[i]},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "lragent"},
                      {"root", names_[i]},
                      {"parent", i == 0 ? json(nullptr) : json(names_[0])},
                      {"max_model_len", opts_.max_model_len}});
    }
    send_json(res, 200, json{{"object", "list"}, {"data", data}});
  });
  svr.Get("/lragent/sessions", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    json list = json::array();
    for (const SessionPool::Info& s : sessions_) {
      json computed = json::object();
      for (size_t a = 0; a < s.agents.size(); ++a) computed[s.agents[a]] = s.computed[a];
      list.push_back({{"id", s.id},
                      {"running", s.running},
                      {"tokens", s.tokens},
                      {"agents", s.agents},
                      {"computed_tokens", computed},
                      {"cache", {{"base_bytes", s.bytes.base}, {"lr_bytes", s.bytes.lr}, {"full_bytes", s.bytes.full},
                                 {"total_bytes", s.bytes.total()}}}});
    }
    send_json(res, 200, json{{"kv_share", share_mode_name(share_mode())},
                             {"sessions", list},
                             {"evicted_sessions", sessions_kv_.evicted},
                             {"preempted_requests", sessions_kv_.preempted},
                             {"copied_sessions", sessions_kv_.copied},
                             // the one KV memory of every trajectory (null with an arena each):
                             // bytes in use, a page shared by copies once
                             {"kv_memory", sessions_kv_.arena_capacity < 0
                                               ? json(nullptr)
                                               : json{{"used_bytes", sessions_kv_.arena_used},
                                                      {"bytes", sessions_kv_.arena_capacity}}}});
  });
  // A known route with the wrong method: 405, as vLLM answers.
  auto wrong_method = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      send_json(res, 405, json{{"error", {{"message", fmt::format("{} takes {}, not {}", req.path, allow, req.method)},
                                          {"type", "invalid_request_error"}, {"param", nullptr}, {"code", 405}}}});
    };
  };
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}) {
    svr.Get(route, wrong_method("POST"));
    svr.Put(route, wrong_method("POST"));
    svr.Delete(route, wrong_method("POST"));
    svr.Patch(route, wrong_method("POST"));
  }
  for (const char* route : {"/v1/models", "/health", "/lragent/sessions", "/metrics"}) {
    svr.Post(route, wrong_method("GET"));
    svr.Put(route, wrong_method("GET"));
    svr.Delete(route, wrong_method("GET"));
    svr.Patch(route, wrong_method("GET"));
  }
  // Never waits for the engine: the figures are those the last request left (metrics.h).
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  post_route(svr, "/tokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    auto parsed = parse_tokenize_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    if (auto agent = agent_for(parsed->model); !agent.ok()) return send_error(res, agent.error());
    if (!tok_) return send_error(res, Error{ErrorCode::kInvalidArgument, "this model has no tokenizer.json to tokenize with"});
    std::string text = parsed->prompt;
    if (parsed->chat) {
      auto rendered = render_chat(parsed->messages, parsed->add_generation_prompt, parsed->enable_thinking, parsed->tools);
      if (!rendered.ok()) return send_error(res, rendered.error());
      text = std::move(*rendered);
    }
    auto ids = tok_->encode(text, parsed->add_special_tokens);
    if (!ids.ok()) return send_error(res, ids.error());
    json strs = nullptr;
    if (parsed->return_token_strs) {
      strs = json::array();
      for (int32_t id : *ids) strs.push_back(tok_->id_to_token(id));
    }
    send_json(res, 200, json{{"count", ids->size()}, {"max_model_len", opts_.max_model_len}, {"tokens", *ids},
                             {"token_strs", std::move(strs)}});
  });
  post_route(svr, "/detokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    auto parsed = parse_detokenize_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    if (auto agent = agent_for(parsed->model); !agent.ok()) return send_error(res, agent.error());
    if (!tok_) return send_error(res, Error{ErrorCode::kInvalidArgument, "this model has no tokenizer.json to decode with"});
    if (Status in_vocab = check_vocab(parsed->tokens, "tokens"); !in_vocab.ok()) return send_error(res, in_vocab.error());
    send_json(res, 200, json{{"prompt", tok_->decode(parsed->tokens)}});
  });
  post_route(svr, "/v1/completions", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    auto parsed = parse_completion_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    respond(std::move(*parsed), /*chat=*/false, http, res);
  });
  post_route(svr, "/v1/chat/completions", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    if (!opts_.chat_template) return send_error(res, no_chat_template());  // before the body's own errors
    auto parsed = parse_chat_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    auto text = render_chat(parsed->messages, parsed->add_generation_prompt, parsed->enable_thinking, parsed->tools);
    if (!text.ok()) return send_error(res, text.error());
    CompletionRequest req = std::move(parsed->req);
    PromptInput p;
    p.text = std::move(*text);
    p.add_special_tokens = false;  // the template wrote BOS (or wants none), as vLLM tokenizes chat
    req.prompts = {std::move(p)};
    respond(std::move(req), /*chat=*/true, http, res, parsed->parse_tool_calls);
  });
}

void Server::respond(CompletionRequest req, bool chat, const httplib::Request& http, httplib::Response& res,
                     bool tool_calls) {
  const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
  const int64_t created = unix_now();
  // Errors found before the first byte (unknown model, too long) are HTTP errors, also when
  // streaming; later ones are an error event there.
  auto prepared = prepare(req);
  if (!prepared.ok()) return send_error(res, prepared.error());
  const std::string model = prepared->agent;
  auto usage_of = [](const std::vector<CompletionChoice>& cs) {
    const auto [prompt, completion] = count_tokens(cs);
    return json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  };
  auto stop_reason = [](const CompletionChoice& c) {
    return c.stop_reason ? json(*c.stop_reason) : c.stop_token ? json(*c.stop_token) : json(nullptr);
  };
  const bool want_logprobs = req.logprobs >= 0;
  // The logprobs object of tokens [from, end) of a choice (null when not asked for); `offset`:
  // the completions API's text offset, continued across a stream's events.
  auto logprobs_of = [this, chat, want_logprobs](std::span<const int32_t> ids, std::span<const StepLogprobs> lps,
                                                 size_t* offset) {
    return want_logprobs ? logprobs_json(tok_, chat, ids, lps, offset) : json(nullptr);
  };
  // A whole choice (non-streaming), or a stream's last event for it (no text; the log-probabilities
  // of its tokens from `sent` on, which no earlier event carried).
  auto choice_json = [chat, tool_calls, stop_reason, logprobs_of](size_t index, const CompletionChoice& c, bool whole, size_t sent,
                                                      size_t* offset) {
    const size_t from = std::min(sent, c.logprobs.size());
    json j = {{"index", index},
              {"logprobs", logprobs_of(std::span(c.token_ids).subspan(std::min(sent, c.token_ids.size())),
                                       std::span(c.logprobs).subspan(from), offset)},
              {"finish_reason", c.finish_reason},
              {"stop_reason", stop_reason(c)}};
    if (chat) {
      if (whole) {
        put_chat_message(j, c.text, tool_calls);
      } else {
        j["delta"] = json::object();
      }
    } else {
      j["text"] = whole ? c.text : "";
    }
    return j;
  };
  auto lragent_json = [this](const std::vector<CompletionChoice>& cs) {
    json per = json::array();
    for (const CompletionChoice& c : cs)
      per.push_back({{"trajectory", c.trajectory}, {"reused_tokens", c.reused_tokens},
                     {"prefilled_tokens", c.prefilled_tokens}, {"token_ids", c.token_ids}});
    return json{{"kv_share", share_mode_name(share_mode())}, {"choices", per}};
  };
  if (!req.stream) {
    // The client is asked while its request waits and runs, as a streaming one is: gone (a
    // client-side timeout, a killed agent), its request stops ("abort") instead of running on.
    const int fd = find_client_socket(http.remote_addr, http.remote_port, http.local_port);
    AliveFn alive;
    if (fd >= 0) alive = [fd] { return client_still_there(fd); };
    auto r = run(*prepared, {}, alive);
    if (!r.ok()) return send_error(res, r.error());
    json choices = json::array();
    for (size_t i = 0; i < r->size(); ++i) {
      size_t offset = 0;
      choices.push_back(choice_json(i, (*r)[i], true, 0, &offset));
    }
    return send_json(res, 200,
                     json{{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                          {"model", model}, {"choices", choices}, {"usage", usage_of(*r)}, {"lragent", lragent_json(*r)}});
  }
  auto p = std::make_shared<const Prepared>(std::move(*prepared));  // the provider is copied: share the ids
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, p, chat, tool_calls, id, created, model, usage_of,
                                                         choice_json, logprobs_of,
                                                         lragent_json](size_t, httplib::DataSink& sink) {
    auto send = [&sink](const json& j) {
      const std::string line = "data: " + dump(j) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    auto chunk = [&](json choices) {
      return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                  {"model", model}, {"choices", std::move(choices)}};
    };
    auto piece = [chat](size_t index, json delta, json logprobs) {
      json j = {{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}};
      if (chat) j["delta"] = std::move(delta);
      else j["text"] = std::move(delta);
      return j;
    };
    std::vector<bool> opened;  // chat: the choice's first event (its role) went out
    auto open = [&](size_t index) {
      if (!chat) return true;
      if (opened.size() <= index) opened.resize(index + 1, false);
      if (opened[index]) return true;
      opened[index] = true;
      return send(chunk(json::array({piece(index, {{"role", "assistant"}, {"content", ""}}, nullptr)})));
    };
    // Per choice: tokens whose log-probabilities went out, and the characters of text streamed
    // (each event's text_offset starts there, as vLLM's previous_text_lens).
    std::vector<size_t> sent, offset;
    std::vector<ToolCallStream> calls;  // per choice, when tool calls are parsed
    auto grow = [&](size_t index) {
      if (sent.size() <= index) sent.resize(index + 1, 0), offset.resize(index + 1, 0), calls.resize(index + 1);
    };
    // While no piece comes (the request waits or computes its prompt) the socket is checked, so a
    // client that left before its request ran does not cost it a slot and its compute.
    const AliveFn alive = [&sink] { return !sink.is_writable || sink.is_writable(); };
    auto r = run(*p, [&](const CompletionDelta& d) {
      if (!open(d.index)) return false;
      grow(d.index);
      sent[d.index] += d.token_ids.size();
      size_t at = offset[d.index];
      json lp = logprobs_of(d.token_ids, d.logprobs, &at);
      offset[d.index] += utf8_chars(d.text);
      const std::string text = tool_calls ? calls[d.index].push(d.text) : d.text;
      if (text.empty() && lp.is_null()) return true;  // held back (a tool call may be starting)
      return send(chunk(json::array({piece(d.index, chat ? json{{"content", text}} : json(text), std::move(lp))})));
    }, alive);
    if (!r.ok()) {
      send(error_json(r.error()));
    } else {
      for (size_t i = 0; i < r->size(); ++i) {
        open(i);
        grow(i);
        json last = choice_json(i, (*r)[i], false, sent[i], &offset[i]);
        if (tool_calls) {
          ToolCallStream::End end = calls[i].finish();
          if (!end.content.empty()) send(chunk(json::array({piece(i, {{"content", end.content}}, nullptr)})));
          if (!end.tool_calls.empty()) {
            send(chunk(json::array({piece(i, {{"tool_calls", end.tool_calls}}, nullptr)})));
            last["finish_reason"] = "tool_calls";
          }
        }
        send(chunk(json::array({std::move(last)})));
      }
      if (p->req.include_usage) {
        json last = chunk(json::array());
        last["usage"] = usage_of(*r);
        last["lragent"] = lragent_json(*r);
        send(last);
      }
    }
    const std::string done = "data: [DONE]\n\n";
    sink.write(done.data(), done.size());
    sink.done();
    return true;
  });
}

}  // namespace lragent::server
