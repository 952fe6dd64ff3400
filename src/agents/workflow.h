// The ReAct multi-agent workflow of the LRAgent poster: three agents (LoRA adapters named plan,
// action and reflect) take turns on one shared trajectory:
//
//   <system prompt>Question: <question>\n
//   Thought 1:<plan agent, one line>\n
//   Action 1:<action agent, one line: Tool[arg]>\n
//   Observation 1: <tool result>\n
//   Thought 2: ...                                   (until Finish[...] or max_steps)
//   Action k: Finish[answer]\n
//   Observation k: Please reflect your answer.\nReflect:<reflect agent, one line>\n
//
// Reflect[wrong] hands the episode back to the plan agent (Thought k+1); anything else ends it.
// Every agent decodes greedily until a newline or its token budget, so the loop terminates
// whatever the models write; nonsense actions only produce "Invalid action" observations.
// How much each agent recomputes of the shared trajectory is the session's KV sharing mode.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agents/replay.h"
#include "agents/tools.h"

namespace lragent {

// The prompt of the HotpotQA ReAct trajectories (agent-trajectories/*_hotpotqa_200.json).
extern const char kReactSystemPrompt[];
// The same instructions in two lines, for models whose context cannot hold the full prompt.
extern const char kReactCompactPrompt[];

struct WorkflowTurn {
  int step = 0;                  // 1-based Thought/Action round
  std::string agent;             // "plan", "action" or "reflect"
  int64_t context_tokens = 0;    // trajectory length when the agent started
  int64_t prefilled_tokens = 0;  // trajectory tokens the agent computed to catch up (mode-dependent)
  int64_t decoded_tokens = 0;
  double seconds = 0;  // the agent's forward passes
  std::string text;    // the agent's line, trimmed
  ToolStep tool;       // action and reflect turns: the call and its observation
};

struct AgentTotals {
  std::string agent;
  int turns = 0;
  int64_t prefilled_tokens = 0, decoded_tokens = 0;
  int64_t computed_tokens = 0;  // forward-pass tokens (catch-up + decode), from the session
  int64_t partial_tokens = 0;   // catch-up tokens run through only droidspeak's first layers
  double seconds = 0;
};

struct WorkflowReport {
  std::string question, gold_answer;  // gold empty when unknown
  std::vector<WorkflowTurn> turns;
  std::vector<AgentTotals> agents;  // plan, action, reflect
  CacheBytes cache;
  KvUsage kv_usage;  // peak bytes and evictions over the run
  int64_t trajectory_tokens = 0;
  int steps = 0;                // rounds whose Thought ran
  std::string stop_reason;      // "finished", "max_steps" or "context_full"
  std::string answer, verdict;  // the last Finish argument; "right" / "wrong" / ""
  bool correct = false;         // answer matches the gold answer (exact match)
  double wall_seconds = 0;
};

struct ReactOptions {
  int max_steps = 6;        // Thought/Action/Observation rounds
  int thought_tokens = 48;  // decode budgets per turn
  int action_tokens = 24;
  int reflect_tokens = 24;
  std::string system_prompt = kReactSystemPrompt;
  // The session's trajectory capacity: the loop stops ("context_full") before a turn that could
  // overflow it. 0: unchecked (the model reports an overflow as an error).
  int64_t max_context_tokens = 0;
  // What the error for a system prompt and question that cannot fit the context advises (a
  // caller with flags names them, e.g. the CLI's --system-prompt compact).
  std::string context_advice = "use a shorter system prompt or question, a smaller thought budget, or a larger context";
  std::function<void(const WorkflowTurn&)> on_turn;  // after each agent turn, e.g. to print it
  // When set and it returns text for (step, agent), that turn's line is this text instead of a
  // generated one: teacher-forced (its tokens run through the agent as the replay's force_tokens
  // do, so the caches are what generating it would have left). For replaying recorded turns, a
  // human answering for an agent, or tests that need a given action (e.g. "Finish[...]").
  std::function<std::optional<std::string>(int step, const std::string& agent)> forced_turn;
};

// Runs one episode on `session` (fresh: the trajectory holds at most BOS), whose agents must
// include plan, action and reflect. Errors: missing agents, bad options, a first turn that
// cannot fit the context, tokenizer or model failures.
Result<WorkflowReport> run_react(AgentSession& session, const Tokenizer& tok, ToolEnv& env, const ReactOptions& opts);

}  // namespace lragent
