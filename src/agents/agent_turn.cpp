#include "agents/agent_turn.h"

#include <algorithm>
#include <cassert>
#include <limits>

namespace lragent {

Result<std::unique_ptr<AgentTurn>> AgentTurn::start(AgentSession& s, const std::string& name, int n_generate,
                                                    std::vector<int32_t> forced, std::vector<std::string> stop,
                                                    AgentDecode decode) {
  const int a = s.agent_index(name);
  if (a < 0)
    return make_error(ErrorCode::kNotFound, "agent '{}' is not registered (register it with --adapter {}=DIR)", name, name);
  std::unique_ptr<AgentTurn> t(new AgentTurn(s));
  t->t0_ = std::chrono::steady_clock::now();
  t->a_ = a;
  t->forced_ = std::move(forced);
  t->stop_ = std::move(stop);
  t->dec_ = std::move(decode);
  t->sampler_ = std::make_unique<Sampler>(t->dec_.sampling);
  t->r_.agent = name;
  t->r_.finish_reason = "length";
  t->n_ = t->forced_.empty() ? n_generate : static_cast<int>(t->forced_.size());
  const size_t resumed = t->dec_.resumed.size();
  if (resumed > 0) {
    if (!t->forced_.empty() || resumed >= s.traj_.size() ||
        !std::equal(t->dec_.resumed.begin(), t->dec_.resumed.end(), s.traj_.end() - static_cast<ptrdiff_t>(resumed)))
      return make_error(ErrorCode::kInvalidArgument,
                        "AgentTurn: a resumed step's tokens must end the trajectory (and it must generate)");
    if (static_cast<int>(resumed) >= t->n_)
      return make_error(ErrorCode::kInvalidArgument, "AgentTurn: a resumed step has {} of its {} tokens already",
                        resumed, t->n_);
    if (t->dec_.guide) {  // the guide's state after the tokens the step had produced
      t->guide_state_ = t->dec_.guide->start();
      for (int32_t tok : t->dec_.resumed) t->guide_state_ = t->dec_.guide->advance(t->guide_state_, tok);
      if (t->guide_state_ == guide::TokenGuide::kDead)
        return make_error(ErrorCode::kInvalidArgument, "AgentTurn: a resumed step's tokens do not follow its guide");
    }
    t->r_.output_tokens = std::move(t->dec_.resumed);
    t->r_.logprobs = std::move(t->dec_.resumed_logprobs);
    for (size_t i = 0; i < resumed; ++i) (void)t->sampler_->next_row();  // one draw per token, in token order
  }
  t->begin_ = s.kv_->catchup_start(a);
  const auto traj = static_cast<int64_t>(s.traj_.size());
  t->prompt_lp_ = t->dec_.prompt_logprobs >= 0 && t->forced_.empty();
  if (t->prompt_lp_ && t->begin_ != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "AgentTurn: prompt log-probabilities need a trajectory that agent '{}' computes from its start "
                      "({} positions are cached already)",
                      name, t->begin_);
  const bool runs = t->n_ > 0 || t->prompt_lp_;
  t->r_.prefilled_tokens = runs ? traj - t->begin_ : 0;
  if (runs) LRA_RETURN_IF_ERROR(s.catch_up_partial(a, t->begin_));
  t->prompt_len_ = s.traj_.size() - resumed;
  const bool free_pick = t->forced_.empty();
  t->penalize_ = t->dec_.penalties.active() && free_pick;
  t->want_logprobs_ = t->dec_.logprobs >= 0 && free_pick;
  if (t->dec_.guide && resumed == 0) t->guide_state_ = t->dec_.guide->start();
  t->shape_ = free_pick && (!t->dec_.logit_bias.empty() || t->dec_.min_tokens > 0 || t->dec_.min_p > 0.f ||
                            t->dec_.guide != nullptr || !t->dec_.allowed_ids.empty() || !t->dec_.bad_words.empty() ||
                            t->dec_.reasoning_budget >= 0);
  t->host_ = s.keep_logits_ || t->penalize_ || t->want_logprobs_ || t->shape_ || t->prompt_lp_;
  // Any step that picks its tokens: each row of a pass with drafts is picked as decoding a token
  // a pass picks it (complete_drafts), so the tokens are the same, sampled ones included. (Prompt
  // log-probabilities come from the catch-up's rows, before any pass with drafts.)
  t->speculate_ = s.spec_.on() && free_pick;
  t->done_ = !runs;
  return t;
}

AgentTurn::~AgentTurn() = default;

int64_t AgentTurn::pending_tokens() const {
  return done_ ? 0 : std::max<int64_t>(static_cast<int64_t>(s_.traj_.size()) - begin_, 1);
}

Result<AgentTurn::Pass> AgentTurn::next_pass(int64_t max_tokens) {
  if (done_) return make_error(ErrorCode::kInternal, "AgentTurn::next_pass after the step ended");
  const auto end = static_cast<int64_t>(s_.traj_.size());
  if (end == begin_) return s_.nothing_to_forward(a_, begin_);
  Pass p;
  all_rows_ = prompt_lp_ && begin_ + 1 < static_cast<int64_t>(prompt_len_);
  if (all_rows_) {
    // Every row of the chunk comes to the host: chunks of at most ~128 MB of logits.
    const int64_t rows = std::max<int64_t>((int64_t{32} << 20) / std::max(s_.model_.config().vocab_size, 1), 1);
    max_tokens = std::min(max_tokens, rows);
    p.host_logits = true;
  }
  p.produces_token = end - begin_ <= std::max<int64_t>(max_tokens, 1);
  chunk_end_ = p.produces_token ? end : begin_ + std::max<int64_t>(max_tokens, 1);
  binding_.reset();  // a binding of an earlier try of this pass goes first (it pins the agent's caches)
  binding_ = s_.kv_->bind(a_);
  toks_.assign(s_.traj_.begin() + begin_, s_.traj_.begin() + chunk_end_);
  drafts_.clear();
  const int cap = s_.spec_.disable_by_batch_size;
  if (speculate_ && end - begin_ == 1 && (cap == 0 || decode_batch_ <= cap)) {
    // Drafts past the token budget could never be kept (the pass's last row gives a token too),
    // and none goes past the trajectory's length (nor the model's context): a pass there would
    // fail where decoding a token a pass does not.
    const int left = n_ - static_cast<int>(r_.output_tokens.size());
    int64_t room = s_.kv_->max_tokens() - end;  // drafts sit at positions end, end + 1, ...
    if (const int64_t ctx = s_.model_.config().max_position_embeddings; ctx > 0) room = std::min(room, ctx - end);
    const auto most = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>({s_.spec_.num_tokens, left - 1, room})));
    drafts_ = propose_drafts(s_.traj_, s_.spec_, most);
    toks_.insert(toks_.end(), drafts_.begin(), drafts_.end());
  }
  p.input = s_.agent_input(a_, toks_, begin_, binding_.get());
  p.input.all_logits = all_rows_ || !drafts_.empty();
  p.drafts = static_cast<int>(drafts_.size());
  if (p.produces_token) {
    // One draw per token, in token order (as step by step), however often the pass is retried.
    if (!drawn_ && forced_.empty()) pick_ = sampler_->next_row();
    drawn_ = true;
    p.pick = forced_.empty() ? pick_ : RowSampling{};
    p.host_logits = host_;
    if (!drafts_.empty()) p.draft_picks = sampler_->peek_rows(p.drafts);
  }
  return p;
}

Status AgentTurn::complete(float* row, int32_t picked) {
  if (done_ || !binding_) return make_error(ErrorCode::kInternal, "AgentTurn::complete without a pass");
  if (all_rows_) {
    if (!row) return make_error(ErrorCode::kInternal, "AgentTurn::complete: the pass needs all its logits rows");
    record_prompt_logprobs(row);
    row += static_cast<int64_t>(chunk_end_ - begin_ - 1) * s_.model_.config().vocab_size;  // the pick's row
  }
  binding_.reset();
  s_.kv_->advance(a_, chunk_end_);
  s_.computed_[static_cast<size_t>(a_)] += chunk_end_ - begin_;
  begin_ = chunk_end_;
  if (begin_ < static_cast<int64_t>(s_.traj_.size())) return Status::Ok();  // a catch-up chunk: no pick
  if (n_ <= 0) {  // only the prompt's log-probabilities were wanted
    done_ = true;
    return Status::Ok();
  }
  int32_t tok = picked;
  if (host_) {
    if (!row) return make_error(ErrorCode::kInternal, "AgentTurn::complete: the pass needs its logits row");
    LRA_ASSIGN_OR_RETURN(tok, pick_on_host(row));
  }
  accept(tok);
  return Status::Ok();
}

Result<int32_t> AgentTurn::pick_on_host(float* row) {
  const int vocab = s_.model_.config().vocab_size;
  const std::span<float> logits(row, static_cast<size_t>(vocab));
  if (s_.keep_logits_) r_.logits.emplace_back(row, row + vocab);
  const bool changed = penalize_ || shape_;
  std::vector<float> raw;  // [vocab] the model's row (log-probabilities are of its output)
  if (want_logprobs_ && changed) raw.assign(row, row + vocab);
  const size_t generated = r_.output_tokens.size();
  if (shape_) AgentSession::shape_logits(logits, dec_, r_.output_tokens, /*before_penalties=*/true);
  if (dec_.guide && dec_.guide->mask(guide_state_, logits, dec_.stop_ids) == 0)
    return make_error(ErrorCode::kInvalidArgument, "the structured output cannot go on after {} tokens: {}",
                      generated, dec_.guide->dead_end());
  if (penalize_) apply_penalties(logits, {s_.traj_.data(), prompt_len_}, r_.output_tokens, dec_.penalties);
  if (shape_ && !sampler_->greedy()) AgentSession::shape_logits(logits, dec_, r_.output_tokens, /*before_penalties=*/false);
  const int32_t tok = sampler_->greedy() ? Sampler::argmax(row, vocab) : sample_row(row, vocab, pick_);
  if (want_logprobs_)
    r_.logprobs.push_back(step_logprobs(changed ? std::span<const float>(raw) : std::span<const float>(logits), tok,
                                        dec_.logprobs));
  return tok;
}

Status AgentTurn::complete_drafts(std::span<const int32_t> picks, float* rows) {
  if (done_ || !binding_ || (!host_ && picks.size() != drafts_.size() + 1))
    return make_error(ErrorCode::kInternal, "AgentTurn::complete_drafts: {} picks for a pass with {} drafts",
                      picks.size(), drafts_.size());
  binding_.reset();
  const int64_t first = begin_;  // the pass's first position: the step's last token's
  r_.drafts.passes += 1;
  r_.drafts.drafted += static_cast<int64_t>(drafts_.size());
  if (host_ && !rows)
    return make_error(ErrorCode::kInternal, "AgentTurn::complete_drafts: the pass needs its logits rows");
  const int vocab = s_.model_.config().vocab_size;
  Status status = Status::Ok();
  for (size_t j = 0; j <= drafts_.size(); ++j) {
    // Row j's draw is taken only now, its token's (row 0's was drawn with the pass): the draws
    // are those of decoding a token a pass, however many drafts are kept.
    if (j > 0) pick_ = sampler_->next_row();
    int32_t tok = host_ ? 0 : picks[j];
    if (host_) {
      auto picked = pick_on_host(rows + static_cast<int64_t>(j) * vocab);  // before accept: on_token gets its logprobs
      if (!picked.ok()) {
        status = picked.error();  // as complete() fails there: the tokens before it stay
        break;
      }
      tok = *picked;
    }
    accept(tok);  // begin_ becomes its position, first + 1 + j
    const bool kept = j < drafts_.size() && tok == drafts_[j];
    if (kept) ++r_.drafts.accepted;
    if (done_ || !kept) break;
  }
  // Positions [first, begin_) hold this agent's entries of the trajectory's tokens: the last
  // token's and each kept draft's. Those of the drafts after them are dropped, as decoding one
  // token a pass leaves the caches: room for the positions processed, no more. A guide's dead
  // end at row j leaves the last token taken processed too (row j is its row), as complete()
  // failing on that token's pass leaves it.
  if (!status.ok()) begin_ = static_cast<int64_t>(s_.traj_.size());
  s_.kv_->advance(a_, begin_);
  s_.computed_[static_cast<size_t>(a_)] += begin_ - first;
  s_.kv_->release_beyond(a_, begin_);
  drafts_.clear();
  return status;
}

void AgentTurn::accept(int32_t tok) {
  drawn_ = false;
  if (!forced_.empty()) tok = forced_[r_.output_tokens.size()];
  r_.output_tokens.push_back(tok);
  begin_ = static_cast<int64_t>(s_.traj_.size());
  s_.traj_.push_back(tok);  // the step's last token is left for whoever runs next
  const bool guided = dec_.guide && forced_.empty();
  const bool stop_id = guided && std::find(dec_.stop_ids.begin(), dec_.stop_ids.end(), tok) != dec_.stop_ids.end();
  if (guided && !stop_id) guide_state_ = dec_.guide->advance(guide_state_, tok);
  if (s_.ends(stop_, dec_, r_) || static_cast<int>(r_.output_tokens.size()) >= n_) {
    done_ = true;
  } else if (guided && !stop_id && guide_state_ != guide::TokenGuide::kDead && !dec_.guide->can_continue(guide_state_)) {
    done_ = true;  // a whole match nothing extends: the structured output is complete
    r_.finish_reason = "stop";
  }
}

void AgentTurn::record_prompt_logprobs(const float* rows) {
  const int vocab = s_.model_.config().vocab_size;
  const auto prompt_end = static_cast<int64_t>(prompt_len_);
  for (int64_t p = begin_; p < chunk_end_ && p + 1 < prompt_end; ++p) {
    const std::span<const float> row(rows + (p - begin_) * vocab, static_cast<size_t>(vocab));
    r_.prompt_logprobs.push_back(step_logprobs(row, s_.traj_[static_cast<size_t>(p + 1)], dec_.prompt_logprobs,
                                               /*with_rank=*/true));
  }
}

bool AgentTurn::looks_ahead() const { return !done_ && !host_ && s_.lookahead_ && !speculate_; }

void AgentTurn::launched() {
  binding_.reset();  // only read while the pass is recorded
  s_.kv_->advance(a_, chunk_end_);
  s_.computed_[static_cast<size_t>(a_)] += chunk_end_ - begin_;
  begin_ = chunk_end_;
}

std::unique_ptr<KvBinding> AgentTurn::bind_fed() { return s_.kv_->bind(a_, /*may_evict=*/false); }

SeqInput AgentTurn::fed_pass(int feed_row, KvBinding* kv) const {
  SeqInput in;
  in.n_tokens = 1;
  in.start_pos = static_cast<int64_t>(s_.traj_.size());
  in.kv = kv;
  s_.set_agent(in, a_);
  if (forced_.empty())
    in.feed_row = feed_row;
  else
    in.tokens = &forced_[r_.output_tokens.size()];  // the token the pass in flight is forced to
  return in;
}

void AgentTurn::keep_fed(int64_t pos) {
  s_.kv_->advance(a_, pos + 1);
  s_.computed_[static_cast<size_t>(a_)] += 1;
  begin_ = pos + 1;
}

void AgentTurn::drop_fed(int64_t pos, const RowSampling& row) {
  if (done_) {
    // What step by step holds here: room for positions [0, pos). The thrown-away pass (or a
    // failed launch's partial reserve) may have taken a block for pos.
    s_.kv_->release_beyond(a_, pos);
    return;
  }
  pick_ = row;  // the pass that runs pos instead picks with this draw: the draws stay in token order
  drawn_ = true;
}

void AgentTurn::abort_pass() { binding_.reset(); }

Status AgentTurn::run_alone() {
  AgentTurn* const self[1] = {this};
  while (!done_) {
    // A window ends with the step, or early on a lookahead pass that could not be launched: the
    // next window's first pass (which may evict, as step by step) runs that pass again, and
    // should it fail too, step_turns reports the error.
    if (looks_ahead()) {
      TurnWindow w = decode_turns(s_.model_, self, [] { return true; });
      if (w.ran) {
        LRA_RETURN_IF_ERROR(w.status.front());
        continue;
      }
    }
    const TurnStep step = step_turns(s_.model_, self, std::numeric_limits<int64_t>::max());
    LRA_RETURN_IF_ERROR(step.status.front());
  }
  return Status::Ok();
}

StepResult AgentTurn::result() {
  if (s_.tok_) r_.text = s_.tok_->decode(r_.output_tokens);
  // A finished output goes to the suffix method's corpus (other trajectories draft from it).
  if (forced_.empty() && (r_.finish_reason == "stop" || r_.finish_reason == "length"))
    remember_output(s_.spec_, r_.output_tokens);
  r_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  return std::move(r_);
}

TurnWindow decode_turns(LlamaModel& model, std::span<AgentTurn* const> turns, const std::function<bool()>& keep_going) {
  TurnWindow out;
  out.status.assign(turns.size(), Status::Ok());
  // Every way out takes or drops the picks it launched; should an exception pass through, none is
  // left for the model's next caller's take_picks.
  struct DropPending {
    LlamaModel& m;
    ~DropPending() {
      if (m.pending_picks() > 0) m.discard_picks();
    }
  } drop_pending{model};
  // The rows of a launched pass: row b runs turn who[b] at position pos[b] with draw rows[b].
  struct Flight {
    std::vector<size_t> who;
    std::vector<int64_t> pos;
    std::vector<SeqInput> batch;
    std::vector<RowSampling> rows;
  };
  // The first pass: each turn's pending positions (its whole catch-up), their tokens given.
  Flight cur;
  for (size_t i = 0; i < turns.size(); ++i) {
    assert(turns[i]->looks_ahead() && "decode_turns takes turns that pick on the device");
    auto p = turns[i]->next_pass(std::numeric_limits<int64_t>::max());
    if (!p.ok()) {
      for (AgentTurn* t : turns) t->abort_pass();
      return out;  // step_turns runs it and reports the turn's error
    }
    cur.who.push_back(i);
    cur.pos.push_back(p->input.start_pos);
    cur.batch.push_back(p->input);
    cur.rows.push_back(p->pick);
  }
  const Status first = model.launch_sample(cur.batch, cur.rows);
  if (!first.ok()) {
    model.discard_picks();
    for (AgentTurn* t : turns) t->abort_pass();
    return out;  // nothing advanced: step_turns runs the same pass (with its draws) and isolates the failure
  }
  out.ran = true;
  out.passes.push_back(static_cast<int64_t>(cur.who.size()));
  for (AgentTurn* t : turns) t->launched();
  bool go = true;
  while (!cur.who.empty()) {
    // The pass after cur, for each turn that goes on past the token cur picks for it (unless
    // that token is its last by length), launched before cur's picks are read.
    Flight next;
    std::vector<std::unique_ptr<KvBinding>> bindings;  // [next rows] read only while recording
    bool launched = false;
    if (go && keep_going()) {
      for (size_t b = 0; b < cur.who.size(); ++b) {
        AgentTurn& t = *turns[cur.who[b]];
        if (t.done_ || static_cast<int>(t.r_.output_tokens.size()) + 1 >= t.n_) continue;
        bindings.push_back(t.bind_fed());
        next.who.push_back(cur.who[b]);
        next.batch.push_back(t.fed_pass(static_cast<int>(b), bindings.back().get()));
        next.pos.push_back(next.batch.back().start_pos);
        next.rows.push_back(t.forced_.empty() ? t.sampler_->next_row() : RowSampling{});
      }
      // A pass that cannot be launched (out of KV memory: it may not evict) ends the window; step
      // by step, the same pass is launched again only if it is wanted.
      if (!next.who.empty()) {
        launched = model.launch_sample(next.batch, next.rows).ok();
        out.lookahead_failed = !launched;
      }
    }
    bindings.clear();
    auto picked = model.take_picks();
    if (!picked.ok()) {
      model.discard_picks();
      for (size_t i : cur.who) out.status[i] = picked.error();
      for (size_t i : next.who) out.status[i] = picked.error();
      return out;
    }
    for (size_t b = 0; b < cur.who.size(); ++b) {
      AgentTurn& t = *turns[cur.who[b]];
      if (t.done_) {  // ended on the token before: this row was not wanted
        t.drop_fed(cur.pos[b], cur.rows[b]);
        continue;
      }
      t.accept((*picked)[b]);
      if (t.done_) go = false;  // its answer is complete: the engine loop hands it back
    }
    for (size_t b = 0; b < next.who.size(); ++b) {
      AgentTurn& t = *turns[next.who[b]];
      if (!launched)
        t.drop_fed(next.pos[b], next.rows[b]);
      else if (!t.done_)
        t.keep_fed(next.pos[b]);
      // else: its row is dropped when next's picks are taken
    }
    if (!launched) break;
    out.passes.push_back(static_cast<int64_t>(next.who.size()));
    cur = std::move(next);
  }
  return out;
}

namespace {

// One forward pass over `passes` (each turn's, in order). A failed forward completes no turn and
// is the error returned; after a forward that ran, each turn's completion has its own status in
// `done` (a turn that completed must not run the pass again).
Status run_passes(LlamaModel& model, std::span<AgentTurn* const> turns, std::span<const AgentTurn::Pass> passes,
                  std::span<Status> done) {
  std::vector<SeqInput> batch;
  std::vector<RowSampling> picks;  // [logits rows] a pass's pick for each of its rows (drafts: 1 + drafts)
  bool host = false;
  for (const AgentTurn::Pass& p : passes) {
    batch.push_back(p.input);
    picks.push_back(p.pick);
    picks.insert(picks.end(), p.draft_picks.begin(), p.draft_picks.end());
    host = host || p.host_logits;
  }
  if (host) {  // some turn needs its rows: every row comes to the host, the others picked there
    LRA_ASSIGN_OR_RETURN(Tensor logits, model.forward(batch));
    const int vocab = model.config().vocab_size;
    int64_t at = 0;  // the pass's first row
    for (size_t i = 0; i < passes.size(); ++i) {
      const AgentTurn::Pass& p = passes[i];
      const int64_t rows = p.input.all_logits ? p.input.n_tokens : 1;
      float* first = logits.f32() + at * vocab;
      at += rows;
      if (p.drafts > 0) {  // the turn picks its rows itself, or here with each row's parameters
        std::vector<int32_t> ids;
        if (!p.host_logits)
          for (int64_t r = 0; r < rows; ++r)
            ids.push_back(sample_row(first + r * vocab, vocab, r == 0 ? p.pick : p.draft_picks[static_cast<size_t>(r - 1)]));
        done[i] = turns[i]->complete_drafts(ids, p.host_logits ? first : nullptr);
        continue;
      }
      const int32_t id =
          p.produces_token && !p.host_logits ? sample_row(first + (rows - 1) * vocab, vocab, p.pick) : 0;
      done[i] = turns[i]->complete(p.host_logits ? first : nullptr, id);
    }
    return Status::Ok();
  }
  LRA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, model.forward_sample(batch, picks));
  size_t at = 0;  // the pass's first row
  for (size_t i = 0; i < passes.size(); ++i) {
    const auto rows = static_cast<size_t>(passes[i].drafts) + 1;
    done[i] = passes[i].drafts > 0 ? turns[i]->complete_drafts({ids.data() + at, rows})
                                   : turns[i]->complete(nullptr, ids[at]);
    at += rows;
  }
  return Status::Ok();
}

}  // namespace

TurnStep step_turns(LlamaModel& model, std::span<AgentTurn* const> turns, int64_t max_batch_tokens,
                    int64_t max_pass_tokens) {
  TurnStep out;
  out.status.assign(turns.size(), Status::Ok());
  std::vector<Status>& status = out.status;
  // Tokens each turn's pass gets: decodes (and one-token catch-ups) first, then catch-up chunks
  // in order from what is left. The budget bounds how long decoding turns wait for a pass; with
  // none in it, the first catch-up runs whole (chunks would only make it slower).
  std::vector<int64_t> give(turns.size(), 0);
  int64_t left = std::max<int64_t>(max_batch_tokens, 1);
  bool decoding = false;
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i]->pending_tokens() == 1) {
      give[i] = 1;
      --left;
      decoding = true;
    }
  for (size_t i = 0; i < turns.size() && (left > 0 || !decoding); ++i)
    if (turns[i]->pending_tokens() > 1) {
      give[i] = decoding ? std::min(turns[i]->pending_tokens(), left) : turns[i]->pending_tokens();
      if (max_pass_tokens > 0) give[i] = std::min(give[i], max_pass_tokens);
      left -= give[i];
      decoding = true;  // the catch-ups after it share what is left, if anything
    }
  const auto decoding_turns = static_cast<int64_t>(std::count_if(turns.begin(), turns.end(), [](const AgentTurn* t) {
    return t->pending_tokens() == 1;
  }));
  for (AgentTurn* t : turns) t->decode_batch_ = decoding_turns;
  std::vector<AgentTurn*> run;
  std::vector<AgentTurn::Pass> passes;
  std::vector<size_t> index;  // [run] the turn's index in `turns`
  for (size_t i = 0; i < turns.size(); ++i) {
    if (give[i] == 0) continue;
    auto p = turns[i]->next_pass(give[i]);
    if (!p.ok()) {
      status[i] = p.error();
      continue;
    }
    run.push_back(turns[i]);
    passes.push_back(*p);
    index.push_back(i);
    out.tokens += p->input.n_tokens;
  }
  out.sequences = static_cast<int64_t>(run.size());
  if (run.empty()) return out;
  std::vector<Status> done(run.size(), Status::Ok());  // [run]
  const Status batched = run_passes(model, run, passes, done);
  if (batched.ok()) {
    for (size_t k = 0; k < run.size(); ++k) status[index[k]] = done[k];
  } else if (run.size() == 1) {
    status[index.front()] = batched;
  } else {
    // Which turn's pass failed is not known: each runs alone (no turn advanced, and what the
    // failed pass wrote to a cache is past what the bookkeeping says it holds: written again).
    model.discard_picks();
    for (size_t k = 0; k < run.size(); ++k) {
      auto p = run[k]->next_pass(give[index[k]]);
      if (!p.ok()) {
        status[index[k]] = p.error();
        continue;
      }
      Status alone = Status::Ok();
      const Status ran = run_passes(model, {&run[k], 1}, {&*p, 1}, {&alone, 1});
      status[index[k]] = ran.ok() ? alone : ran;
    }
  }
  // A turn whose pass failed lets go of its KV binding now: its session may be dropped first.
  for (size_t i = 0; i < turns.size(); ++i)
    if (!status[i].ok()) turns[i]->abort_pass();
  return out;
}

}  // namespace lragent
