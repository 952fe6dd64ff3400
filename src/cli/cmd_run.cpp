// `lragent run --workflow react`: the plan / action / reflect agents answer one HotpotQA
// question over a shared trajectory under a KV sharing mode, with offline tools.
#include <algorithm>
#include <cstdio>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "agents/workflow.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sharing_flags.h"
#include "core/text_file.h"

namespace lragent::cli {
namespace {

struct RunFlags {
  ModelFlags model;
  SharingFlags sharing;
  std::string workflow = "react";
  std::string question, question_id, questions_file;
  std::string system_prompt = "full", system_prompt_file;
  int max_steps = 6, thought_tokens = 48, action_tokens = 24, reflect_tokens = 24;
  bool json = false;
};

// The agents come from --adapter NAME=DIR; check the names before loading anything.
Status check_agents(const RunFlags& f) {
  std::string missing;
  for (const char* role : {"plan", "action", "reflect"}) {
    const bool given = std::any_of(f.model.adapters.begin(), f.model.adapters.end(), [&](const std::string& spec) {
      return spec.rfind(std::string(role) + "=", 0) == 0;
    });
    if (!given) missing += fmt::format(" --adapter {}=DIR", role);
  }
  if (missing.empty()) return Status::Ok();
  return make_error(
      ErrorCode::kInvalidArgument, "--workflow react runs three agents, each a LoRA adapter of the --model: pass{}{}",
      missing, f.model.model_dir.empty() ? " (and --model DIR: the built-in synthetic model has no adapters)" : "");
}

Result<HotpotQuestion> pick_question(const RunFlags& f) {
  if (f.question.empty() == f.question_id.empty())
    return make_error(ErrorCode::kInvalidArgument, "pass exactly one of --question TEXT and --question-id ID");
  std::vector<HotpotQuestion> questions{builtin_question()};
  std::string source = "the built-in question";
  if (!f.questions_file.empty()) {
    LRA_ASSIGN_OR_RETURN(questions, load_hotpot_questions(f.questions_file));
    source = f.questions_file;
  }
  if (!f.question_id.empty()) return find_question_by_id(questions, f.question_id, source);
  return question_for_text(questions, f.question);
}

Result<std::string> system_prompt(const RunFlags& f) {
  if (!f.system_prompt_file.empty()) {
    auto text = read_text_file(f.system_prompt_file);
    if (!text.ok()) return make_error(text.error().code, "--system-prompt-file {}", text.error().message);
    return std::move(*text);
  }
  return std::string(f.system_prompt == "compact" ? kReactCompactPrompt : kReactSystemPrompt);
}

// At most `n` bytes of `s`, cut on a UTF-8 character boundary.
std::string clip(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

void print_turn(const WorkflowTurn& t) {
  const char* label = t.agent == "plan" ? "Thought" : t.agent == "action" ? "Action" : "Reflect";
  fmt::print("[{} {:<7}] prefilled {:>5}  decoded {:>3}  {:.3f} s | {} {}: {}\n", t.step, t.agent, t.prefilled_tokens,
             t.decoded_tokens, t.seconds, label, t.step, t.text);
  if (t.agent != "plan") fmt::print("{:>13}-> {}\n", "", clip(t.tool.observation, 200));
  std::fflush(stdout);  // the turns appear as they happen, also through a pipe
}

nlohmann::json report_json(const WorkflowReport& r, const HotpotQuestion& q, const std::string& mode) {
  nlohmann::json j;
  j["workflow"] = "react";
  j["mode"] = mode;
  j["question"] = {{"id", q.id}, {"level", q.level}, {"text", q.question}, {"gold_answer", q.answer}};
  j["turns"] = nlohmann::json::array();
  for (const WorkflowTurn& t : r.turns) {
    nlohmann::json o = {{"step", t.step},
                        {"agent", t.agent},
                        {"context_tokens", t.context_tokens},
                        {"prefilled_tokens", t.prefilled_tokens},
                        {"decoded_tokens", t.decoded_tokens},
                        {"seconds", t.seconds},
                        {"text", t.text}};
    if (t.agent != "plan")
      o["tool"] = {
          {"name", t.tool.tool}, {"arg", t.tool.arg}, {"valid", t.tool.valid}, {"observation", t.tool.observation}};
    j["turns"].push_back(std::move(o));
  }
  for (const AgentTotals& a : r.agents)
    j["agents"].push_back({{"agent", a.agent},
                           {"turns", a.turns},
                           {"prefilled_tokens", a.prefilled_tokens},
                           {"decoded_tokens", a.decoded_tokens},
                           {"computed_tokens", a.computed_tokens},
                           {"partial_tokens", a.partial_tokens},
                           {"seconds", a.seconds}});
  const CacheBytes& b = r.cache;
  j["cache"] = {{"base_bytes", b.base},           {"lr_bytes", b.lr},
                {"full_bytes", b.full},           {"total_bytes", b.total()},
                {"allocated_bytes", b.allocated}, {"page_overhead_bytes", b.page_overhead()},
                {"reserved_bytes", b.reserved}};
  j["cache_peak_total_bytes"] = r.kv_usage.peak.total();
  j["evictions"] = r.kv_usage.evictions;
  j["evicted_tokens"] = r.kv_usage.evicted_tokens;
  j["trajectory_tokens"] = r.trajectory_tokens;
  j["steps"] = r.steps;
  j["stop_reason"] = r.stop_reason;
  j["answer"] = r.answer;
  j["verdict"] = r.verdict;
  j["correct"] = r.correct;
  j["wall_seconds"] = r.wall_seconds;
  return j;
}

void print_summary(const WorkflowReport& r, const std::string& mode) {
  fmt::print("\n{:<8} | {:>5} | {:>9} | {:>7} | {:>8} | {:>9} | {:>9}\n", "agent", "turns", "prefilled", "decoded",
             "computed", "seconds", "s / turn");
  AgentTotals all;
  all.agent = "total";
  for (const AgentTotals& a : r.agents) {
    all.turns += a.turns;
    all.prefilled_tokens += a.prefilled_tokens;
    all.decoded_tokens += a.decoded_tokens;
    all.computed_tokens += a.computed_tokens;
    all.seconds += a.seconds;
  }
  for (const AgentTotals& a : r.agents)
    fmt::print("{:<8} | {:>5} | {:>9} | {:>7} | {:>8} | {:>9.3f} | {:>9.3f}\n", a.agent, a.turns, a.prefilled_tokens,
               a.decoded_tokens, a.computed_tokens, a.seconds, a.turns ? a.seconds / a.turns : 0.0);
  fmt::print("{:<8} | {:>5} | {:>9} | {:>7} | {:>8} | {:>9.3f} | {:>9.3f}\n", all.agent, all.turns,
             all.prefilled_tokens, all.decoded_tokens, all.computed_tokens, all.seconds,
             all.turns ? all.seconds / all.turns : 0.0);
  const CacheBytes& b = r.cache;
  fmt::print("cache ({}): base {} B, lr {} B, full {} B, total {} B (+{} B page rounding)\n", mode, b.base, b.lr,
             b.full, b.total(), b.page_overhead());
  print_evictions(r.kv_usage);
  fmt::print("trajectory {} tokens, {} steps, stopped: {}, wall {:.3f} s\n", r.trajectory_tokens, r.steps,
             r.stop_reason, r.wall_seconds);
  if (r.answer.empty())
    fmt::print("answer: none\n");
  else
    fmt::print(
        "answer: \"{}\" (reflect: {}){}\n", r.answer, r.verdict.empty() ? "no verdict" : r.verdict,
        r.gold_answer.empty() ? "" : fmt::format("; gold \"{}\": {}", r.gold_answer, r.correct ? "correct" : "wrong"));
}

int run_cmd(const RunFlags& f) {
  if (auto st = check_agents(f); !st.ok()) return report(st.error());
  auto question = pick_question(f);
  if (!question.ok()) return report(question.error());
  auto prompt = system_prompt(f);
  if (!prompt.ok()) return report(prompt.error());
  auto so = f.sharing.options();
  if (!so.ok()) return report(so.error());
  auto spec = speculative_options(f.model.speculative_config);
  if (!spec.ok()) return report(spec.error());
  auto loaded = load_model(f.model);
  if (!loaded.ok()) return report(loaded.error());
  if (!loaded->tokenizer)
    return report(make_error(ErrorCode::kNotFound, "--model {}: no tokenizer.json, but the agents read and write text",
                             f.model.model_dir));
  ReplayOptions ro;
  ro.sharing = *so;
  ro.decode_lookahead = !f.model.no_decode_lookahead;
  ro.speculative = *spec;
  auto [names, adapters] = agents_of(*loaded->adapters);
  auto session = AgentSession::create(*loaded->model, loaded->tokenizer.get(), names, adapters, ro);
  if (!session.ok()) return report(session.error());
  ToolEnv env(*question);
  ReactOptions opts;
  opts.max_steps = f.max_steps;
  opts.thought_tokens = f.thought_tokens;
  opts.action_tokens = f.action_tokens;
  opts.reflect_tokens = f.reflect_tokens;
  opts.system_prompt = *prompt;
  // The session sizes its cache for this many tokens (AgentSession::create clamps the same way).
  const int max_pos = loaded->model->config().max_position_embeddings;
  opts.max_context_tokens = max_pos > 0 ? std::min<int64_t>(so->max_tokens, max_pos) : so->max_tokens;
  const std::string mode = share_mode_name(so->mode);
  if (!f.json) {
    fmt::print("question ({}{}): {}\n", question->id, question->level.empty() ? "" : ", " + question->level,
               question->question);
    opts.on_turn = print_turn;
  }
  const bool full_prompt = f.system_prompt_file.empty() && f.system_prompt == "full";
  // What to change when the prompt and question do not fit: --max-context only while the
  // model's own context is not what binds.
  opts.context_advice = full_prompt ? "the built-in full prompt is long: try --system-prompt compact"
                                    : "use a shorter system prompt or question";
  opts.context_advice += ", or a smaller --thought-tokens";
  if (max_pos > 0 && so->max_tokens >= max_pos)
    opts.context_advice += fmt::format(" (the model's context is {} positions)", max_pos);
  else
    opts.context_advice += ", or a larger --max-context";
  auto rep = run_react(**session, *loaded->tokenizer, env, opts);
  if (!rep.ok()) return report(rep.error());
  if (f.json)
    fmt::print("{}\n",
               report_json(*rep, *question, mode).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  else
    print_summary(*rep, mode);
  return 0;
}

}  // namespace

void register_run(CLI::App& app, std::function<int()>& action) {
  static RunFlags flags;
  RunFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run a multi-agent workflow: plan, action and reflect agents (LoRA adapters) answer a question over one "
      "shared trajectory, calling offline tools over the question's own paragraphs");
  cmd->add_option("--workflow", f->workflow,
                  "Workflow to run. react: Thought (plan agent) -> Action (action agent) -> Observation (tool) steps "
                  "until Finish[answer], then Reflect (reflect agent)")
      ->default_val("react")
      ->check(CLI::IsMember({"react"}));
  f->model.add_to(cmd, true);
  add_speculative_flag(cmd, f->model.speculative_config);
  f->sharing.add_to(cmd);
  auto* q = cmd->add_option("--question", f->question,
                            "Question to answer. If it matches a question of --questions (ignoring case and "
                            "punctuation), that question's paragraphs and gold answer are used; otherwise the tools "
                            "search the built-in paragraphs (Eiffel Tower, Paris, Seine)");
  auto* qid = cmd->add_option("--question-id", f->question_id,
                              "Id of the question to answer from --questions (the built-in one is builtin-seine)");
  q->excludes(qid);
  cmd->add_option("--questions", f->questions_file,
                  "HotpotQA questions JSON: {\"easy\": [...], ...} or [...] of {id, question, answer, context}. "
                  "Omitted: only the built-in question");
  cmd->add_option("--max-steps", f->max_steps, "Most Thought/Action/Observation rounds before giving up")
      ->default_val(6)
      ->check(cli::positive());
  cmd->add_option("--thought-tokens", f->thought_tokens, "Most tokens the plan agent decodes per Thought")
      ->default_val(48)
      ->check(cli::positive());
  cmd->add_option("--action-tokens", f->action_tokens, "Most tokens the action agent decodes per Action")
      ->default_val(24)
      ->check(cli::positive());
  cmd->add_option("--reflect-tokens", f->reflect_tokens, "Most tokens the reflect agent decodes")
      ->default_val(24)
      ->check(cli::positive());
  auto* prompt = cmd->add_option("--system-prompt", f->system_prompt,
                  "Built-in system prompt: full (the HotpotQA ReAct prompt of the LRAgent trajectories, ~190 words) "
                  "or compact (two lines, for models with a short context)")
      ->default_val("full")
      ->check(CLI::IsMember({"full", "compact"}));
  cmd->add_option("--system-prompt-file", f->system_prompt_file, "Read the system prompt from this file instead")
      ->excludes(prompt);
  cmd->add_flag("--json", f->json,
                "Print one JSON object: question, turns (agent, prefilled/decoded tokens, seconds, text, tool call), "
                "per-agent totals, cache bytes by component, trajectory length, stop reason, answer");
  cmd->callback([f, &action] { action = [f] { return run_cmd(*f); }; });
}

}  // namespace lragent::cli
