// The server's engine thread (continuous batching, see server.h): admitting queued requests,
// one engine pass after another over every running choice (prefill chunks beside decode rows),
// streaming their text, and preempting the youngest when the KV memory runs short, as vLLM
// does. Requests are prepared (server.cpp) and answered (server_http.cpp) elsewhere.
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

}  // namespace lragent::server
