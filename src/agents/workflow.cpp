#include "agents/workflow.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>

namespace lragent {

const char kReactSystemPrompt[] =
    "I want you to be a good multi-hop question answerer ,solving a question answering task with interleaving "
    "Thought, Action, Observation steps. Thought can reason about the current situation, and Action can be five "
    "types : \n"
    "(1) BingSearch[query], which searches the exact detailed query on the Internet and returns the relevant "
    "information to the query. Be specific and precise with your query to increase the chances of getting relevant "
    "results. For example, Bingsearch[popular dog breeds in the United States]\n"
    "(2) Retrieve[entity], which retrieves the exact entity on Wikipedia and returns the first paragraph if it "
    "exists. If not, it will return some similar entities to retrieve. For example, Retrieve[Milhouse]\n"
    "(3) Lookup[keyword], which returns the next sentence containing the keyword in the last passage successfully "
    "found by Retrieve or BingSearch. For example, Lookup[river].\n\n"
    "(4) Finish[answer], which returns a definite answer. For example, Finish[Richard Nixon] (If it is a judgement "
    "question, please Finish[yes] or Finish[no])\n"
    "(5) Reflect[right/wrong], which reflects the answer right or wrong based on the context history. For example, "
    "Reflect[right]\n"
    "Note that Reflect must be the next Action after Finish. You may take as many steps as necessary.\n";

const char kReactCompactPrompt[] =
    "Answer the question with Thought, Action, Observation steps. Actions: BingSearch[query], Retrieve[entity], "
    "Lookup[keyword], Finish[answer].\nAfter Finish, Reflect[right] or Reflect[wrong].\n";

namespace {

const char* const kRoles[] = {"plan", "action", "reflect"};

std::string first_line(const std::string& text) {
  std::string s = text.substr(0, text.find('\n'));
  const size_t b = s.find_first_not_of(" \t\r");
  const size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// One episode's moving parts.
class ReactRun {
 public:
  ReactRun(AgentSession& s, const Tokenizer& tok, const ReactOptions& o) : s_(s), tok_(tok), o_(o) {}

  // Encodes the newline that closes a turn; before the first turn.
  Status init() {
    LRA_ASSIGN_OR_RETURN(newline_, tok_.encode("\n", /*add_special_tokens=*/false));
    // SentencePiece encodes a lone "\n" with a leading-space piece; the bare newline token is enough.
    const auto bare =
        std::find_if(newline_.begin(), newline_.end(), [&](int32_t id) { return tok_.token_bytes(id) == "\n"; });
    if (bare != newline_.end()) newline_ = {*bare};
    return Status::Ok();
  }

  // Appends `prefix`, then `agent` decodes up to `budget` tokens of one line; the line is then
  // closed with a newline if the agent did not write one. nullopt: the turn could overflow the
  // context, so nothing was appended.
  Result<std::optional<WorkflowTurn>> turn(int step, const char* agent, const std::string& prefix, int budget) {
    LRA_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tok_.encode(prefix, /*add_special_tokens=*/false));
    std::vector<int32_t> forced;  // [n] the turn's teacher-forced line (ReactOptions::forced_turn)
    std::optional<std::string> forced_text;
    if (o_.forced_turn) forced_text = o_.forced_turn(step, agent);
    if (forced_text) {
      LRA_ASSIGN_OR_RETURN(forced, tok_.encode(*forced_text, /*add_special_tokens=*/false));
      if (forced.empty())
        return make_error(ErrorCode::kInvalidArgument, "forced {} turn of step {} is empty", agent, step);
      budget = static_cast<int>(forced.size());
    }
    const int64_t need = static_cast<int64_t>(s_.trajectory().size() + ids.size() + newline_.size()) + budget;
    if (o_.max_context_tokens > 0 && need > o_.max_context_tokens) {
      if (!report_.turns.empty()) return std::optional<WorkflowTurn>();
      return make_error(ErrorCode::kInvalidArgument,
                        "the system prompt and question take {} tokens and the first thought may decode {} more: {} "
                        "in all, but the context holds {}; {}",
                        need - budget, budget, need, o_.max_context_tokens, o_.context_advice);
    }
    s_.append(ids);
    WorkflowTurn t;
    t.step = step;
    t.agent = agent;
    t.context_tokens = static_cast<int64_t>(s_.trajectory().size());
    LRA_ASSIGN_OR_RETURN(StepResult r, forced.empty() ? s_.run_agent(agent, budget, {}, {"\n"})
                                                       : s_.run_agent(agent, 0, forced, {}));
    if (r.text.empty() || r.text.back() != '\n') s_.append(newline_);
    t.prefilled_tokens = r.prefilled_tokens;
    t.decoded_tokens = static_cast<int64_t>(r.output_tokens.size());
    t.seconds = r.seconds;
    // A forced line is the text given (its encoding may drop characters the vocabulary lacks,
    // as any appended text's does); a generated one is what the agent wrote.
    t.text = first_line(forced_text ? *forced_text : r.text);
    return std::optional<WorkflowTurn>(std::move(t));
  }

  void record(WorkflowTurn t) {
    if (o_.on_turn) o_.on_turn(t);
    report_.turns.push_back(std::move(t));
  }

  WorkflowReport& report() { return report_; }

 private:
  AgentSession& s_;
  const Tokenizer& tok_;
  const ReactOptions& o_;
  std::vector<int32_t> newline_;  // [n] ids of "\n" (a separate encode may add a prefix piece)
  WorkflowReport report_;
};

Status check_setup(const AgentSession& session, const ReactOptions& o) {
  std::string missing;
  for (const char* role : kRoles) {
    const auto& names = session.agent_names();
    if (std::find(names.begin(), names.end(), role) == names.end())
      missing += (missing.empty() ? "" : ", ") + std::string(role);
  }
  if (!missing.empty())
    return make_error(ErrorCode::kNotFound,
                      "the react workflow needs agents (adapters) named plan, action and reflect; missing: {}",
                      missing);
  if (o.max_steps < 1 || o.thought_tokens < 1 || o.action_tokens < 1 || o.reflect_tokens < 1)
    return make_error(ErrorCode::kInvalidArgument,
                      "react options: max_steps and the thought/action/reflect token budgets must be at least 1 "
                      "(got {}, {}, {}, {})",
                      o.max_steps, o.thought_tokens, o.action_tokens, o.reflect_tokens);
  if (session.trajectory().size() > 1)
    return make_error(ErrorCode::kInvalidArgument, "run_react needs a fresh session (its trajectory holds {} tokens)",
                      session.trajectory().size());
  return Status::Ok();
}

void summarize(const AgentSession& session, const ToolEnv& env, WorkflowReport& rep) {
  for (const char* role : kRoles) {
    AgentTotals a;
    a.agent = role;
    for (const WorkflowTurn& t : rep.turns) {
      if (t.agent != role) continue;
      ++a.turns;
      a.prefilled_tokens += t.prefilled_tokens;
      a.decoded_tokens += t.decoded_tokens;
      a.seconds += t.seconds;
    }
    const auto& names = session.agent_names();
    const size_t i = static_cast<size_t>(std::find(names.begin(), names.end(), role) - names.begin());
    a.computed_tokens = session.computed_per_agent()[i];
    a.partial_tokens = session.partial_per_agent()[i];
    rep.agents.push_back(a);
  }
  rep.cache = session.cache_bytes();
  rep.kv_usage = session.kv().usage();
  rep.trajectory_tokens = static_cast<int64_t>(session.trajectory().size());
  rep.question = env.question().question;
  rep.gold_answer = env.question().answer;
  rep.answer = env.answer();
  rep.verdict = env.verdict();
  rep.correct = env.answer_correct();
}

}  // namespace

Result<WorkflowReport> run_react(AgentSession& session, const Tokenizer& tok, ToolEnv& env, const ReactOptions& o) {
  LRA_RETURN_IF_ERROR(check_setup(session, o));
  const auto t0 = std::chrono::steady_clock::now();
  ReactRun run(session, tok, o);
  LRA_RETURN_IF_ERROR(run.init());
  WorkflowReport& rep = run.report();
  std::string prompt = o.system_prompt;
  if (!prompt.empty() && prompt.back() != '\n') prompt += '\n';
  // Text appended before the next Thought: the prompt, then each step's observation.
  std::string pending = prompt + "Question: " + env.question().question + "\n";
  rep.stop_reason = "max_steps";
  for (int k = 1; k <= o.max_steps; ++k) {
    LRA_ASSIGN_OR_RETURN(auto plan, run.turn(k, "plan", pending + fmt::format("Thought {}:", k), o.thought_tokens));
    if (!plan) {
      rep.stop_reason = "context_full";
      break;
    }
    rep.steps = k;
    run.record(std::move(*plan));
    LRA_ASSIGN_OR_RETURN(auto act, run.turn(k, "action", fmt::format("Action {}:", k), o.action_tokens));
    if (!act) {
      rep.stop_reason = "context_full";
      break;
    }
    act->tool = env.act(act->text);
    const ToolStep done = act->tool;
    run.record(std::move(*act));
    if (done.tool != "Finish") {
      pending = fmt::format("Observation {}: {}\n", k, done.observation);
      continue;
    }
    LRA_ASSIGN_OR_RETURN(
        auto refl,
        run.turn(k, "reflect", fmt::format("Observation {}: {}\nReflect:", k, done.observation), o.reflect_tokens));
    if (!refl) {
      rep.stop_reason = "context_full";
      break;
    }
    refl->tool = env.reflect(refl->text);
    run.record(std::move(*refl));
    if (env.verdict() != "wrong") {
      rep.stop_reason = "finished";
      break;
    }
    pending.clear();  // the reflect line itself hands the episode back to the plan agent
  }
  summarize(session, env, rep);
  rep.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::move(rep);
}

}  // namespace lragent
