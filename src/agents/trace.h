// Benchmark traces (`lragent bench trace`): a real multi-agent ReAct episode (system prompt,
// question, then plan / action / observation rounds and the reflect agent's turn) resized to an
// exact final length in tokens, for models without a tokenizer (the synthetic presets).
//
// How a trace is made (docs/bench.md has the worked example):
//  * Source: one trajectory of bench/trace/trajectories.json (scripts/make_traces.py picks them
//    from the LRAgent release): system prompt, question, rounds {agent, thought, action,
//    observation, retrieval}.
//  * Text -> tokens: the pseudo tokenizer cuts a text's UTF-8 bytes into 4-byte chunks (the
//    last may be shorter); chunk c becomes id 3 + FNV-1a-64(c) mod (vocab - 3). Real tokenizers
//    average about 4 bytes per token on English, so lengths match a real run's within ~20%.
//  * Layout, in order ("+" appends tokens, "call" runs an agent that decodes n tokens):
//      BOS, + system prompt, + "Question: <question>\n"
//      per plan round k:    + "Thought k:", call plan  n = tokens(" <thought>\n")
//                           + "Action k:",  call action n = tokens(" <action>\n")
//                           + "Observation k: ", + content, + "\n"     (when it has one)
//      per reflect round k: + "Thought k:", call reflect n = tokens(" <thought>\nAction k: <action>\n")
//                           + "Observation k: ", + content, + "\n"     (after Reflect[wrong])
//    A generated span has the length of the real text it replaces; its ids are whatever the
//    model decodes (greedy), so every system decodes exactly n tokens per call.
//  * Length: final = 1 + appended + generated tokens. Everything but the contents of retrieval
//    observations (BingSearch / Retrieve / Lookup results) is fixed. The retrieval contents
//    share C = target - fixed tokens (at least 1 each) in proportion to their real lengths
//    (largest remainder, ties to the earlier one); a content of n tokens is the first n tokens
//    of the real one, repeated from its start when n is longer. When the target is too short
//    for the whole system prompt (short CPU test traces only), the prompt and the retrieval
//    contents share what is left in proportion to their real lengths, the prompt keeping its
//    first tokens. A target below the fixed part (system prompt empty, one token per retrieval
//    observation) is an error naming the minimum.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "agents/replay.h"
#include "core/result.h"

namespace lragent {

struct TraceRound {
  std::string agent;  // "plan" (thought by plan, action by action) or "reflect"
  std::string thought, action, observation;  // observation empty when the episode ends there
  bool retrieval = false;  // observation is a tool result whose size the trace scales
};

struct SourceTrajectory {
  std::string id, question, answer, system_prompt;
  std::vector<TraceRound> rounds;
};

struct TrajectoryBundle {
  std::string source;
  std::vector<SourceTrajectory> trajectories;
};

// Parses bench/trace/trajectories.json; `source` names it in errors.
Result<TrajectoryBundle> parse_trajectory_bundle(const std::string& json_text, const std::string& source);
Result<TrajectoryBundle> load_trajectory_bundle(const std::string& path);

// The pseudo tokenizer (see the header comment); vocab_size must exceed 3.
std::vector<int32_t> pseudo_tokenize(std::string_view text, int vocab_size);
inline int64_t pseudo_token_count(std::string_view text) { return (static_cast<int64_t>(text.size()) + 3) / 4; }

struct TraceStep {
  enum class Kind { kAppend, kCall } kind = Kind::kAppend;
  std::string label;             // append: system, question, prefix, observation, newline; call: thought, action, reflect
  int round = 0;                 // 1-based round; 0 for the system prompt and question
  std::vector<int32_t> tokens;   // kAppend
  std::string agent;             // kCall: plan | action | reflect
  int generate = 0;              // kCall: tokens the agent decodes
};

struct Trace {
  std::string source_id;         // "70b_hotpotqa_200.json#0"
  int64_t target_tokens = 0;
  int64_t system_tokens = 0, system_tokens_full = 0;  // system prompt kept / in the source
  int64_t observation_tokens = 0;  // retrieval contents after scaling
  std::vector<TraceStep> steps;

  int64_t final_tokens() const;  // 1 (BOS) + appended + generated
  int agent_calls() const;
  int64_t generated_tokens() const;
  // The steps as a replay script (append_tokens / generate), for run_replay / AgentSession.
  std::vector<ReplayStep> replay_steps() const;
  // {"source", "target_tokens", "final_tokens", ..., "steps": [{"append_tokens": [...], "label",
  //  "round"} | {"agent", "generate", "label", "round"}]}: a `lragent replay` script too.
  nlohmann::json to_json() const;
};

// The smallest target make_trace accepts for this trajectory.
int64_t trace_min_tokens(const SourceTrajectory& t);
// The trace of `t` whose final length is exactly target_tokens (see the header comment).
Result<Trace> make_trace(const SourceTrajectory& t, int64_t target_tokens, int vocab_size);

}  // namespace lragent
