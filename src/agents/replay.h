// Replaying an agent script over one shared trajectory under a KV sharing mode.
// Script: {"steps": [{"append": "text"} | {"append_tokens": [ids]} |
//                    {"agent": "NAME", "generate": N, "stop": ["\n"]} |
//                    {"agent": "NAME", "force_tokens": [ids]}]}
// One action per step; "label", "round" and "comment" may annotate any step, other keys are
// refused. A generate step stops at a stop string or after N tokens, not at EOS.
// The trajectory starts with BOS. A generate step catches the agent up on the tokens it has
// not processed (as the mode defines) and decodes greedily; every generated token but the
// last is forwarded by the generating agent, the last is left for whoever runs next.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/guide/token_guide.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/suffix_decoding.h"
#include "kv/sharing.h"
#include "model/llama.h"
#include "model/lora.h"
#include "tokenizer/tokenizer.h"

namespace lragent {

struct ReplayStep {
  enum class Kind { kAppendText, kAppendTokens, kGenerate, kForce } kind = Kind::kAppendText;
  std::string text;                // kAppendText
  std::vector<int32_t> tokens;     // kAppendTokens, kForce
  std::string agent;               // kGenerate, kForce
  int generate = 0;                // kGenerate
  std::vector<std::string> stop;   // kGenerate
};

// Parses a script; `source` names it in errors ("script.json: step 3: 'generate' must be ...").
Result<std::vector<ReplayStep>> parse_replay_script(const std::string& json_text, const std::string& source);

struct StepResult {
  std::string agent;               // empty for append steps
  // generate steps: "stop" (a stop string or stop id ended it), "length" (the token budget),
  // "abort" (AgentDecode::on_token asked to stop)
  std::string finish_reason;
  int64_t prefilled_tokens = 0;    // tokens this agent computed in its catch-up
  std::vector<int32_t> output_tokens;
  std::string text;
  std::vector<std::vector<float>> logits;  // [decoded or forced tokens][vocab] (when kept)
  std::vector<StepLogprobs> logprobs;      // [output_tokens] (when AgentDecode::logprobs >= 0)
  // [prompt tokens - 1] (when AgentDecode::prompt_logprobs >= 0): each prompt token after the
  // first, given the ones before it, with its rank.
  std::vector<StepLogprobs> prompt_logprobs;
  double seconds = 0;
  DraftCounts drafts;  // speculative decoding (ReplayOptions::speculative)
};

struct ReplayResult {
  std::vector<StepResult> steps;
  std::vector<int32_t> trajectory;
  CacheBytes cache;                          // at the end
  KvUsage kv_usage;                          // peak bytes and evictions over the replay
  std::vector<int64_t> computed_per_agent;  // forward-pass tokens per agent (catch-up + decode)
  std::vector<int64_t> partial_per_agent;   // catch-up tokens run through only some layers (droidspeak)
};

struct ReplayOptions {
  SharingOptions sharing;
  bool keep_logits = false;
  // Decode lookahead (as the Generator's, engine/generator.h): an agent's decode pass t+1 is
  // launched before pass t's pick is read back, its token taken on the device. The tokens, the
  // caches' contents and the per-agent counts are the same either way (see run_agent).
  bool decode_lookahead = true;
  // Speculative decoding by n-gram lookup over the trajectory (engine/speculative.h) in every
  // step that picks its tokens (greedy or sampled, with any logits processor, guide or logprobs):
  // each decode pass also checks the drafts, so that one
  // pass may give several tokens, the same ones (a seeded step's too: each row is picked with
  // the draw one pass a token makes). Such a step decodes without lookahead.
  SpeculativeOptions speculative;
  // run_replay: called after each step with its index and result, as it completes (progress
  // for long scripts).
  std::function<void(size_t, const StepResult&)> on_step;
};

// How a generate step picks and ends (AgentSession::run_agent); the default is the replay's:
// greedy, ended by stop strings or the token budget only.
struct AgentDecode {
  SamplingParams sampling;          // temperature 0: greedy
  // Over the trajectory before the step (the "prompt") and the step's tokens. Active penalties
  // pick on the host from each step's logits (no decode lookahead).
  PenaltyParams penalties;
  std::vector<int32_t> stop_ids;    // generation ends after emitting one of these (e.g. EOS)
  // >= 0: each generated token's log-probability and its row's `logprobs` most likely tokens
  // (StepResult::logprobs; decoding then runs step by step, as with penalties).
  int logprobs = -1;
  // >= 0: vLLM's prompt_logprobs, each prompt token's log-probability given the tokens before it,
  // its rank and its position's `prompt_logprobs` most likely tokens (StepResult::prompt_logprobs).
  // The agent must compute the whole prompt itself (a fresh trajectory: no entry of it cached),
  // its rows coming to the host in chunks; with n_generate 0 the step computes the prompt only.
  int prompt_logprobs = -1;
  // vLLM's logits processors, in vLLM's order: logit_bias and min_tokens, then the penalties,
  // then temperature and min_p, then top-k / top-p. Any of them picks on the host, step by step.
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to those ids' logits
  int min_tokens = 0;  // stop_ids cannot be picked before this many tokens (their logits are -inf)
  float min_p = 0.f;   // sampled rows keep only tokens of probability >= min_p x the top one's
  std::vector<int32_t> allowed_ids;  // vLLM's allowed_token_ids: no other id is picked (empty: any)
  // vLLM's bad_words, each as token ids: a word's last id is not picked when the tokens generated
  // last are the rest of it (a one-token word is never picked).
  std::vector<std::vector<int32_t>> bad_words;
  // A thinking budget (vLLM's thinking_token_budget, Anthropic's budget_tokens): once the open
  // thinking block holds this many tokens, only the ids of `reasoning_end` can be picked, in
  // order, until it is written; the model then answers. -1: none. As vLLM counts it, the block
  // opens after the last `reasoning_start` the generated tokens hold and a generated
  // `reasoning_end` closes it (a later start opens another, counted afresh); before either, the
  // step starts inside a block that already holds `reasoning_open` tokens (the prompt's, after
  // a "<think>" the template wrote), or outside one when it is -1.
  int reasoning_budget = -1;
  std::vector<int32_t> reasoning_start;  // the start-of-thinking marker's ids ("<think>"); empty: none
  std::vector<int32_t> reasoning_end;    // the end-of-thinking marker's ids ("</think>")
  int64_t reasoning_open = 0;
  // Structured output (vLLM's guided decoding): each pick keeps the step's text a prefix of a
  // match of this guide, a stop id may end the step only at a whole match, and the step ends
  // ("stop") once the text is a match nothing can extend. Applied after logit_bias and
  // min_tokens, before the penalties. Null: free. Not owned: the caller keeps it for the step.
  guide::TokenGuide* guide = nullptr;
  // Called with each generated token as it is taken (not with a stop id, which ends the step
  // first), and its log-probabilities when asked for (else null); returning false ends the step
  // there (finish_reason "abort": the caller knows why, e.g. a streaming client went away, or
  // the server found a stop string in its own text). The token stays in the step.
  std::function<bool(int32_t, const StepLogprobs*)> on_token;
  // The tokens this step produced before it was stopped to make room (a server preempting it by
  // recompute, as vLLM does): they end the session's trajectory, and the resumed step takes them
  // as its own first output (its token budget, min_tokens, stop ids and penalties count them, its
  // result holds them) without passing them to on_token again; the sampler skips their draws, so
  // a seeded step picks what it would have picked had it never stopped.
  std::vector<int32_t> resumed;
  std::vector<StepLogprobs> resumed_logprobs;  // [resumed] when `logprobs` >= 0
};

// The tokens inside the thinking block left open after `tokens` (after its last `start` marker),
// or -1 when `end` closed it; with neither marker in them, `open_before` + their count when a
// block was open before them with `open_before` tokens, else -1. AgentDecode::reasoning_budget
// counts these.
int64_t thinking_tokens(std::span<const int32_t> tokens, std::span<const int32_t> start, std::span<const int32_t> end,
                        int64_t open_before);

// A trajectory shared by agents, each an adapter (or null for the bare base model).
class AgentSession {
 public:
  static Result<std::unique_ptr<AgentSession>> create(LlamaModel& model, const Tokenizer* tok,
                                                      std::vector<std::string> agent_names,
                                                      std::vector<const LoraAdapter*> adapters,
                                                      const ReplayOptions& opts);
  const std::vector<int32_t>& trajectory() const { return traj_; }
  void append(const std::vector<int32_t>& ids) { traj_.insert(traj_.end(), ids.begin(), ids.end()); }
  // Cuts the trajectory back to its first `tokens` positions and forgets every cache entry past
  // them (TrajectoryKv::truncate): the next agent computes from there.
  void truncate(int64_t tokens);
  Result<std::vector<int32_t>> encode(const std::string& text) const;
  // Makes this session, a fresh one, `src`'s first `tokens` positions: their tokens and every
  // cache entry src holds for them, copied (TrajectoryKv::copy_prefix) so that no agent computes
  // them again. src may hold other agents (a server that loaded or unloaded an adapter since):
  // an agent of the same name and adapter takes its private entries, another computes what it
  // reads as in a new trajectory. Compute counts start at zero, or with `keep_counts` at src's
  // (by agent; the session takes src's place). On error it stays fresh.
  Status start_from(const AgentSession& src, int64_t tokens, bool keep_counts = false);
  const std::vector<const LoraAdapter*>& adapters() const { return adapters_; }
  // A generate (forced empty) or force step for agent `name`; `decode` null: greedy, no stop ids.
  Result<StepResult> run_agent(const std::string& name, int n_generate, const std::vector<int32_t>& forced,
                               const std::vector<std::string>& stop, const AgentDecode* decode = nullptr);
  // The registered agent of that name, or -1.
  int agent_index(const std::string& name) const;
  Result<StepResult> run_step(const ReplayStep& step);
  CacheBytes cache_bytes() const { return kv_->bytes(); }
  // Tokens each agent ran through every layer (catch-up and decode), and catch-up tokens it ran
  // through only the first kv().catchup_layers() layers (droidspeak; not in computed_per_agent).
  const std::vector<int64_t>& computed_per_agent() const { return computed_; }
  const std::vector<int64_t>& partial_per_agent() const { return partial_; }
  const std::vector<std::string>& agent_names() const { return names_; }
  TrajectoryKv& kv() { return *kv_; }
  const TrajectoryKv& kv() const { return *kv_; }
  // From the next step on: keep each decoded token's logits (StepResult::logits; decoding then
  // runs step by step), or pick on the device only.
  void keep_logits(bool on) { keep_logits_ = on; }
  // vLLM's logits processors on one row of logits (AgentDecode's logit_bias, allowed_ids,
  // bad_words, the thinking budget and min_tokens before the penalties; min_p after them), given
  // the step's generated tokens so far.
  static void shape_logits(std::span<float> row, const AgentDecode& dec, std::span<const int32_t> generated,
                           bool before_penalties);

 private:
  friend class AgentTurn;  // runs a step a pass at a time (agents/agent_turn.h)
  AgentSession(LlamaModel& m) : model_(m) {}
  // Agent a's pass over `toks` (which must outlive it) from position `begin`, through `kv`.
  SeqInput agent_input(int a, const std::vector<int32_t>& toks, int64_t begin, KvBinding* kv) const;
  // Agent a's adapter on `in`: as its adapter, or under icarus as its decoder (SeqInput::decoder).
  void set_agent(SeqInput& in, int a) const;
  // The part of agent a's catch-up from `begin` that needs fewer layers than the model has
  // (TrajectoryKv::catchup_layers): run through those only; `begin` moves past it. The positions
  // the shared layers do not hold yet, and the last one (its logits are read), are left.
  Status catch_up_partial(int a, int64_t& begin);
  // Every id is inside the model's vocabulary (`what` names the step kind in the error).
  Status check_ids(const std::vector<int32_t>& ids, const char* what) const;
  // The error for an agent pass with no position to run: an empty trajectory (no BOS) is the
  // caller's input; anything else a bug.
  Error nothing_to_forward(int a, int64_t begin) const;
  // Whether the decoded output contains one of the stop strings (never without a tokenizer).
  bool stops(const std::vector<std::string>& stop, const std::vector<int32_t>& output) const;
  // Whether the step ends after its latest output token: a stop string or stop id (r's
  // finish_reason becomes "stop") or on_token declining more ("abort").
  bool ends(const std::vector<std::string>& stop, const AgentDecode& dec, StepResult& r) const;

  LlamaModel& model_;
  const Tokenizer* tok_ = nullptr;
  std::vector<std::string> names_;
  std::vector<const LoraAdapter*> adapters_;
  std::unique_ptr<TrajectoryKv> kv_;
  std::vector<int32_t> traj_;
  std::vector<int64_t> computed_;
  std::vector<int64_t> partial_;  // [n_agents] see partial_per_agent()
  bool keep_logits_ = false;
  bool lookahead_ = true;
  SpeculativeOptions spec_;
  std::unique_ptr<SuffixCorpus> corpus_;  // spec_.corpus when the options gave none
};

// Runs a whole script.
Result<ReplayResult> run_replay(LlamaModel& model, const Tokenizer* tok, std::vector<std::string> agent_names,
                                std::vector<const LoraAdapter*> adapters, const std::vector<ReplayStep>& steps,
                                const ReplayOptions& opts);

}  // namespace lragent
