// `lragent demo`: the main job. Runs the ReAct plan/action/reflect workflow on the built-in
// synthetic model and its three shared-A role adapters under all five sharing modes, and
// prints what each mode stores and computes.
#include <chrono>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "agents/hotpotqa.h"
#include "agents/workflow.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/synthetic.h"

namespace lragent::cli {
namespace {

struct DemoFlags {
  int max_steps = 3;
  int threads = 0;
  bool json = false;
};

struct ModeRow {
  ShareMode mode;
  WorkflowReport report;
  int64_t computed = 0, prefilled = 0, decoded = 0;
};

int run_demo(const DemoFlags& f) {
  fmt::print(stderr,
             "lragent demo: the ReAct workflow (plan -> action -> observation -> ... -> reflect) under every KV "
             "sharing mode.\nModel: the built-in synthetic Llama-shaped model with three synthetic shared-A LoRA "
             "agents (random weights: the text is meaningless; the cache and compute figures are real).\n"
             "Use `lragent run --model DIR --adapter plan=DIR ...` for a real model.\n\n");
  auto be = make_cpu_backend(f.threads);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  if (!model.ok()) return report(model.error());
  auto tok = make_byte_tokenizer();
  auto adapters = make_synthetic_adapters((*model)->config());
  std::vector<std::string> names;
  std::vector<const LoraAdapter*> ptrs;
  for (const auto& a : adapters) {
    names.push_back(a->name);
    ptrs.push_back(a.get());
  }
  std::vector<ModeRow> rows;
  for (ShareMode mode : kAllShareModes) {
    ReplayOptions ro;
    ro.sharing.mode = mode;
    if (mode == ShareMode::kDroidSpeak) ro.sharing.recompute_layers = {0};
    auto session = AgentSession::create(**model, tok.get(), names, ptrs, ro);
    if (!session.ok()) return report(session.error());
    ToolEnv env(builtin_question());
    ReactOptions opts;
    opts.max_steps = f.max_steps;
    opts.system_prompt = kReactCompactPrompt;
    opts.max_context_tokens = (*model)->config().max_position_embeddings;
    fmt::print(stderr, "[{:>10}] running ...", share_mode_name(mode));
    auto rep = run_react(**session, *tok, env, opts);
    if (!rep.ok()) return report(rep.error());
    ModeRow row{mode, std::move(*rep)};
    for (const auto& a : row.report.agents) {
      row.computed += a.computed_tokens;
      row.prefilled += a.prefilled_tokens;
      row.decoded += a.decoded_tokens;
    }
    fmt::print(stderr, " {} turns, {} tokens, {:.2f} s\n", row.report.turns.size(), row.report.trajectory_tokens,
               row.report.wall_seconds);
    rows.push_back(std::move(row));
  }
  const ModeRow& none = rows.front();
  if (f.json) {
    nlohmann::json j;
    for (const auto& r : rows)
      j["modes"].push_back({{"mode", share_mode_name(r.mode)}, {"trajectory_tokens", r.report.trajectory_tokens},
                            {"computed_tokens", r.computed}, {"prefilled_tokens", r.prefilled},
                            {"decoded_tokens", r.decoded}, {"base_bytes", r.report.cache.base},
                            {"lr_bytes", r.report.cache.lr}, {"full_bytes", r.report.cache.full},
                            {"total_bytes", r.report.cache.total()}, {"seconds", r.report.wall_seconds}});
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("\n{:>10} | {:>6} | {:>8} | {:>9} | {:>9} | {:>9} | {:>10} | {:>7} | {:>7} | {:>7}\n", "mode", "tokens",
             "computed", "base KiB", "LR KiB", "full KiB", "total KiB", "memory", "compute", "time s");
  for (const auto& r : rows) {
    const CacheBytes& b = r.report.cache;
    fmt::print("{:>10} | {:>6} | {:>8} | {:>9.1f} | {:>9.1f} | {:>9.1f} | {:>10.1f} | {:>6.2f}x | {:>6.2f}x | {:>7.2f}\n",
               share_mode_name(r.mode), r.report.trajectory_tokens, r.computed, b.base / 1024.0, b.lr / 1024.0,
               b.full / 1024.0, b.total() / 1024.0,
               static_cast<double>(b.total()) / static_cast<double>(std::max<int64_t>(none.report.cache.total(), 1)),
               static_cast<double>(r.computed) / static_cast<double>(std::max<int64_t>(none.computed, 1)),
               r.report.wall_seconds);
  }
  fmt::print("\nmemory and compute are relative to none (Non-Shared). Trajectories differ slightly between modes\n"
             "because sharing changes what the agents generate; `lragent fidelity` measures that.\n");
  return 0;
}

}  // namespace

void register_demo(CLI::App& app, std::function<int()>& action) {
  static DemoFlags flags;
  DemoFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand(
      "demo", "The main job: the ReAct agent workflow on the built-in synthetic model under all five sharing modes");
  cmd->add_option("--max-steps", f->max_steps, "Thought/Action rounds per episode")->default_val(3)->check(cli::positive());
  add_threads_flag(cmd, f->threads);
  cmd->add_flag("--json", f->json, "Print the comparison as JSON");
  cmd->callback([f, &action] { action = [f] { return run_demo(*f); }; });
}

}  // namespace lragent::cli
