// `lragent fidelity` and `lragent profile-layers`: how much each sharing mode changes what
// the agents compute, measured against the Non-Shared reference.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "agents/fidelity.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sharing_flags.h"
#include "core/text_file.h"

namespace lragent::cli {
namespace {

struct FidelityFlags {
  ModelFlags model;
  SharingFlags sharing;
  std::string script;
  int top = 0;
  bool json = false;
};

struct Loaded {
  LoadedModel lm;
  std::vector<ReplayStep> steps;
  std::vector<std::string> names;
  std::vector<const LoraAdapter*> adapters;
};

Result<Loaded> load_all(const FidelityFlags& f, const char* command) {
  Loaded out;
  auto text = read_text_file(f.script);
  if (!text.ok()) return make_error(text.error().code, "--script {}", text.error().message);
  LRA_ASSIGN_OR_RETURN(out.steps, parse_replay_script(*text, f.script));
  LRA_ASSIGN_OR_RETURN(out.lm, load_model(f.model));
  if (out.lm.adapters->size() < 2)
    return make_error(ErrorCode::kInvalidArgument, "{} compares agents: register at least two with --adapter NAME=DIR",
                      command);
  std::tie(out.names, out.adapters) = agents_of(*out.lm.adapters);
  return out;
}

int run_fidelity(const FidelityFlags& f) {
  auto l = load_all(f, "fidelity");
  if (!l.ok()) return report(l.error());
  auto so = f.sharing.options_for("droidspeak");  // its recompute set (layer 0 unless --recompute-layers)
  if (!so.ok()) return report(so.error());
  FidelityOptions fo;
  fo.page_size = f.sharing.page_size;
  fo.droidspeak_layers = so->recompute_layers;
  auto rep = measure_fidelity(*l->lm.model, l->lm.tokenizer.get(), l->names, l->adapters, l->steps, fo);
  if (!rep.ok()) return report(rep.error());
  if (f.json) {
    nlohmann::json j;
    j["trajectory_tokens"] = rep->trajectory_tokens;
    for (const auto& s : rep->layers)
      j["layers"].push_back({{"layer", s.layer}, {"full_cache", s.full}, {"base_cache", s.base},
                             {"adapter_output", s.adapter}, {"hidden_state", s.hidden}});
    for (const auto& m : rep->modes)
      j["modes"].push_back({{"mode", share_mode_name(m.mode)}, {"argmax_agreement", m.argmax_agreement},
                            {"mean_kl", m.mean_kl}, {"positions", m.positions}, {"computed_tokens", m.computed_tokens},
                            {"partial_tokens", m.partial_tokens},
                            {"total_bytes", m.cache.total()}});
    j["skipped_modes"] = nlohmann::json::array();
    for (const auto& s : rep->skipped)
      j["skipped_modes"].push_back({{"mode", share_mode_name(s.mode)}, {"reason", s.reason}});
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("Cosine similarity across agent pairs (trajectory of {} tokens)\n", rep->trajectory_tokens);
  fmt::print("{:>5} | {:>10} | {:>10} | {:>14} | {:>12}\n", "layer", "full cache", "base cache", "adapter output",
             "hidden state");
  for (const auto& s : rep->layers)
    fmt::print("{:>5} | {:>10.4f} | {:>10.4f} | {:>14.4f} | {:>12.4f}\n", s.layer, s.full, s.base, s.adapter, s.hidden);
  fmt::print("\nEach mode vs none, teacher-forced along none's trajectory (droidspeak recomputes layers {})\n",
             fmt::join(fo.droidspeak_layers, ","));
  fmt::print("{:>10} | {:>9} | {:>10} | {:>21} | {:>11}\n", "mode", "argmax ok", "mean KL", "tokens computed",
             "cache bytes");
  for (const auto& m : rep->modes) {
    // droidspeak: tokens through every layer + catch-up tokens through its recompute layers only
    const std::string computed = m.partial_tokens > 0 ? fmt::format("{} + {} partial", m.computed_tokens, m.partial_tokens)
                                                      : fmt::format("{}", m.computed_tokens);
    fmt::print("{:>10} | {:>8.1f}% | {:>10.2e} | {:>21} | {:>11}\n", share_mode_name(m.mode), 100 * m.argmax_agreement,
               m.mean_kl, computed, m.cache.total());
  }
  for (const auto& s : rep->skipped) fmt::print("{:>10} | not run: {}\n", share_mode_name(s.mode), s.reason);
  return 0;
}

int run_profile_layers(const FidelityFlags& f) {
  auto l = load_all(f, "profile-layers");
  if (!l.ok()) return report(l.error());
  auto ranking = profile_layers(*l->lm.model, l->lm.tokenizer.get(), l->names, l->adapters, l->steps, f.sharing.page_size);
  if (!ranking.ok()) return report(ranking.error());
  const int top = f.top > 0 ? f.top : std::max(1, static_cast<int>(ranking->size()) / 4);
  std::vector<int> pick;
  for (int i = 0; i < top && i < static_cast<int>(ranking->size()); ++i) pick.push_back((*ranking)[static_cast<size_t>(i)].first);
  std::sort(pick.begin(), pick.end());
  if (f.json) {
    nlohmann::json j;
    for (const auto& [layer, kl] : *ranking) j["ranking"].push_back({{"layer", layer}, {"mean_kl", kl}});
    j["recompute_layers"] = pick;
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("Layers ranked by the divergence from none caused by sharing that layer alone:\n");
  for (const auto& [layer, kl] : *ranking) fmt::print("  layer {:>3}: mean KL {:.3e}\n", layer, kl);
  fmt::print("suggested: --kv-share droidspeak --recompute-layers {}\n", fmt::join(pick, ","));
  return 0;
}

// Only the flags these commands use: they run every mode themselves, teacher-forced step by
// step, with caches sized for the script.
void add_common(CLI::App* cmd, FidelityFlags* f) {
  f->model.add_to(cmd, true, /*decodes=*/false);
  f->sharing.add_page_size(cmd);
  cmd->add_option("--script", f->script, "Replay script (see `lragent replay --help`)")->required();
  cmd->add_flag("--json", f->json, "Print JSON instead of tables");
}

}  // namespace

void register_fidelity(CLI::App& app, std::function<int()>& action) {
  static FidelityFlags flags;
  FidelityFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand(
      "fidelity",
      "Per-layer similarity of caches, adapter outputs and hidden states across agents, and each sharing mode's "
      "argmax agreement and KL against none (teacher-forced)");
  add_common(cmd, f);
  f->sharing.add_recompute_layers(cmd);
  cmd->callback([f, &action] { action = [f] { return run_fidelity(*f); }; });

  static FidelityFlags pflags;
  FidelityFlags* p = &pflags;
  CLI::App* prof = app.add_subcommand("profile-layers",
                                      "Rank layers by the divergence their sharing causes; suggests droidspeak's "
                                      "--recompute-layers");
  add_common(prof, p);
  prof->add_option("--top", p->top, "How many layers to suggest (0, the default: a quarter of them)")
      ->check(cli::non_negative());
  prof->callback([p, &action] { action = [p] { return run_profile_layers(*p); }; });
}

}  // namespace lragent::cli
