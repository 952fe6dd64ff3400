// One agent's generate (or force) step on an AgentSession, run one forward pass at a time, so
// that a scheduler can put the passes of many steps, on different trajectories, into one batch
// (continuous batching across requests: the server's engine loop).
//
// A turn's passes: its catch-up (the trajectory positions the agent has not processed, as the
// sharing mode defines them), in chunks of at most the token budget it is given, the last chunk
// picking the first token; then one pass per generated token. Each pass's pick is made either on
// the backend's device (only the id comes back) or, when the step needs the row's logits
// (penalties, logit_bias, min_tokens, min_p, logprobs, kept logits), on the host. The tokens are
// those of AgentSession::run_agent's step-by-step loop, which is this class run alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "agents/replay.h"

namespace lragent {

class AgentTurn;
struct TurnWindow;
struct TurnStep;
TurnWindow decode_turns(LlamaModel& model, std::span<AgentTurn* const> turns, const std::function<bool()>& keep_going);

class AgentTurn {
 public:
  // Starts agent `name`'s step on `session` (n_generate tokens, or `forced` ones when not empty).
  // A droidspeak catch-up over the positions the shared layers hold already runs here, in a
  // pass of its own (it runs fewer layers). The session must not run another step until this one
  // is done, and must outlive it.
  static Result<std::unique_ptr<AgentTurn>> start(AgentSession& session, const std::string& name, int n_generate,
                                                  std::vector<int32_t> forced, std::vector<std::string> stop,
                                                  AgentDecode decode);
  ~AgentTurn();

  bool done() const { return done_; }
  // Tokens of the next pass, were it given no budget (1 while decoding).
  int64_t pending_tokens() const;

  // The next pass. `max_tokens` (>= 1) bounds a catch-up chunk; a chunk short of the catch-up's
  // end picks nothing (produces_token false). The input points into this turn and holds its KV
  // binding: it is valid until complete() or the next call of next_pass() (which may be called
  // again, e.g. to run the pass alone after a batch failed; the token it picks is the same).
  struct Pass {
    SeqInput input;
    bool produces_token = false;
    bool host_logits = false;  // complete() needs the row's logits
    // input.all_logits: complete() takes every row of the pass ([n_tokens, vocab], the last one
    // the pick's), for the prompt's log-probabilities; host_logits is then set too.
    RowSampling pick;          // the device pick's parameters (its u drawn once per token)
    // Speculative decoding (ReplayOptions::speculative): the pass runs the step's last token and
    // this many drafts after it, input.all_logits set, its first row picked with `pick` and row
    // 1 + j with draft_picks[j]; the picks (or, with host_logits, the rows) go to complete_drafts.
    int drafts = 0;
    // [drafts] the rows' parameters after the first: the u each would draw were the tokens
    // before it taken (Sampler::peek_rows; drawn only when they are), so that with a draft that
    // is the pick kept, every token is the one decoding a token a pass picks from the same draws.
    std::vector<RowSampling> draft_picks;
  };
  Result<Pass> next_pass(int64_t max_tokens);
  // The pass ran. `row` [vocab]: its logits when host_logits (may be changed in place), else
  // null ([n_tokens, vocab] when the pass asked for all_logits); `picked`: the device's pick otherwise. Ends the step at a stop, on_token declining, or
  // the token budget.
  Status complete(float* row, int32_t picked);
  // A pass with drafts ran: `picks` [1 + drafts] are its rows' picks (made with pick and
  // draft_picks). The step takes the first, then each next one while the draft before it was that
  // pick (its entries then hold the right token), up to a stop or the token budget; the entries
  // past the last token taken are dropped. With host_logits, `rows` [1 + drafts, vocab] are the
  // pass's logits (changed in place) and the step picks each row itself, as complete() does, in
  // order, each with the state the tokens before it left (penalties, guide, min_tokens); `picks`
  // is then ignored. A sampled draft is thus kept with the probability the target gives it, and a
  // rejected one's row yields a token of the target's distribution without it: n-gram drafts are
  // one-hot proposals, for which this is speculative sampling's rejection rule.
  Status complete_drafts(std::span<const int32_t> picks, float* rows = nullptr);
  // The pending pass failed and will not complete: releases its KV binding (which pins the
  // session's caches), so the session may go before the turn. step_turns calls it.
  void abort_pass();
  // Runs the whole step with no other turn (AgentSession::run_agent): in decode_turns windows
  // when no pass needs its logits on the host, else pass by pass, the catch-up in one.
  Status run_alone();
  // Whether decode_turns may take this turn: its picks are made on the device (no host logits)
  // and its session has decode lookahead on.
  bool looks_ahead() const;
  // Whether its decode passes check n-gram drafts (ReplayOptions::speculative): any step that
  // picks its tokens (not forced).
  bool speculates() const { return speculate_; }
  // The step's result (call once, when done()).
  StepResult result();
  // What the step has produced so far (its tokens and their log-probabilities): what a step
  // stopped before its end resumes from (AgentDecode::resumed).
  const StepResult& progress() const { return r_; }

 private:
  friend TurnWindow decode_turns(LlamaModel&, std::span<AgentTurn* const>, const std::function<bool()>&);
  friend TurnStep step_turns(LlamaModel&, std::span<AgentTurn* const>, int64_t, int64_t);
  AgentTurn(AgentSession& s) : s_(s) {}
  // Takes token `tok` as the step's next output (the tail of complete() and decode_turns'): a
  // stop or the token budget ends the step.
  void accept(int32_t tok);
  // The pick from the pending token's logits `row` [vocab] on the host (changed in place): kept
  // logits, logits processors, guide, penalties, then pick_'s pick; the token's log-probabilities
  // recorded. Fails when the guide leaves no token.
  Result<int32_t> pick_on_host(float* row);
  // The prompt's log-probabilities from the rows [n_tokens, vocab] of the pass over positions
  // [begin_, chunk_end_): position p's row gives the prompt token at p + 1.
  void record_prompt_logprobs(const float* rows);
  // decode_turns' steps on this turn's session (AgentTurn is the session's friend):
  // the pass next_pass() gave was launched: its positions count as processed;
  void launched();
  // a binding for the pass over position trajectory().size() that does not evict (the pass may
  // be thrown away), and that pass, its token row `feed_row` of the pass in flight (or the
  // forced token);
  std::unique_ptr<KvBinding> bind_fed();
  SeqInput fed_pass(int feed_row, KvBinding* kv) const;
  // that pass is wanted (the turn goes on after the token it was fed): position `pos` processed;
  void keep_fed(int64_t pos);
  // or not (the turn ended, or the pass did not launch): what it reserved from `pos` on goes back,
  // and a draw it made is kept for the pass that runs that position instead.
  void drop_fed(int64_t pos, const RowSampling& row);

  AgentSession& s_;
  int a_ = 0;
  int n_ = 0;                  // tokens to produce
  std::vector<int32_t> forced_;
  std::vector<std::string> stop_;
  AgentDecode dec_;
  std::unique_ptr<Sampler> sampler_;
  StepResult r_;
  std::chrono::steady_clock::time_point t0_;
  int64_t begin_ = 0;          // first trajectory position the agent has not processed
  int64_t chunk_end_ = 0;      // end of the pending pass's positions
  size_t prompt_len_ = 0;      // penalties' "prompt": the trajectory before this step
  bool host_ = false;          // every token pass picks on the host
  bool penalize_ = false, want_logprobs_ = false, shape_ = false;
  bool prompt_lp_ = false;     // dec_.prompt_logprobs >= 0: catch-up passes over the prompt return all their rows
  bool all_rows_ = false;      // the pending pass returns all its rows (next_pass decides, complete reads)
  int32_t guide_state_ = 0;    // dec_.guide's state after the step's tokens so far
  bool drawn_ = false;         // pick_ holds the next token's draw
  RowSampling pick_;
  bool speculate_ = false;     // decode passes check drafts (speculates())
  int64_t decode_batch_ = 1;   // sequences the next pass decodes (step_turns sets it: disable_by_batch_size)
  std::vector<int32_t> drafts_;  // [drafts] the pending pass's drafts, after the step's last token
  std::vector<int32_t> toks_;  // [chunk] the pending pass's tokens (the drafts last)
  std::unique_ptr<KvBinding> binding_;
  bool done_ = false;
};

// One forward pass over the next pass of each turn in `turns` (none of them done, each on its own
// session), their catch-up chunks sharing `max_batch_tokens` (decode passes first, then catch-ups
// in order; a turn left without budget sits this pass out). A pass without a decode runs its
// first catch-up whole: the budget is there so that decoding turns do not wait long.
// When the batched pass fails, each turn's pass runs alone, so that only a turn whose own pass
// fails gets an error (and is left with no pass: abort_pass). `max_pass_tokens` > 0 bounds that
// whole first catch-up too (a server whose memory was planned for passes of that size).
struct TurnStep {
  std::vector<Status> status;  // [turns]
  int64_t sequences = 0;       // turns the pass served
  int64_t tokens = 0;          // tokens it ran
};
TurnStep step_turns(LlamaModel& model, std::span<AgentTurn* const> turns, int64_t max_batch_tokens,
                    int64_t max_pass_tokens = 0);

// Decode lookahead over turns (run_alone, and the server's engine loop over its decoding turns):
// every turn of `turns` must be looks_ahead(). The first pass runs each turn's whole catch-up;
// then passes run back to back, pass t + 1 launched before pass t's picks are read, each turn's
// token taken on the device from pass t's pick (or given: a forced token), so the host's
// recording of a step overlaps the device's work for the step before. Each pass's sampling row
// is drawn when it is launched, in pass order, as step by step draws them. The window ends,
// leaving nothing in flight, when a turn's step ends (its client may be waiting for the whole
// answer), when `keep_going` returns false (checked before each launch: a new request is
// waiting), or when a pass cannot be launched (a lookahead pass may not evict; its draw is kept
// for the pass that runs its position instead). A turn that ends wastes its row of the pass
// launched after its last token: what that row reserved is given back and its position is left
// unprocessed, so whichever agent runs it next stores its entries over the ones written (the
// bookkeeping, not the pages, says what a cache holds). The tokens, the caches' contents and the
// per-agent counts are thus those of step_turns pass by pass.
struct TurnWindow {
  bool ran = false;               // false: the first pass did not launch; nothing changed (run step_turns)
  std::vector<Status> status;     // [turns]
  std::vector<int64_t> passes;    // [passes] the turns each pass ran (one token each)
  bool lookahead_failed = false;  // a lookahead pass could not be launched (it ended the window)
};
TurnWindow decode_turns(LlamaModel& model, std::span<AgentTurn* const> turns, const std::function<bool()>& keep_going);

}  // namespace lragent
