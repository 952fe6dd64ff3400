// `lragent replay`: run an agent script over one shared trajectory under a sharing mode.
#include <cstdio>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "agents/replay.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sharing_flags.h"
#include "core/text_file.h"

namespace lragent::cli {
namespace {

struct ReplayFlags {
  ModelFlags model;
  SharingFlags sharing;
  std::string script;
  bool json = false, logits = false;
};

nlohmann::json cache_json(const CacheBytes& b) {
  return {{"base_bytes", b.base}, {"lr_bytes", b.lr}, {"full_bytes", b.full}, {"total_bytes", b.total()},
          {"allocated_bytes", b.allocated}, {"page_overhead_bytes", b.page_overhead()}, {"reserved_bytes", b.reserved}};
}

int run_replay_cmd(const ReplayFlags& f) {
  if (f.model.adapters.empty())
    return report(make_error(ErrorCode::kInvalidArgument,
                             "replay runs agents: register each one the script names with --adapter NAME=DIR"));
  auto text = read_text_file(f.script);
  if (!text.ok()) return report(make_error(text.error().code, "--script {}", text.error().message));
  auto steps = parse_replay_script(*text, f.script);
  if (!steps.ok()) return report(steps.error());
  auto spec = speculative_options(f.model.speculative_config);
  if (!spec.ok()) return report(spec.error());
  auto loaded = load_model(f.model);
  if (!loaded.ok()) return report(loaded.error());
  auto opts = f.sharing.options();
  if (!opts.ok()) return report(opts.error());
  ReplayOptions ro;
  ro.sharing = *opts;
  ro.keep_logits = f.logits;
  ro.decode_lookahead = !f.model.no_decode_lookahead;
  ro.speculative = *spec;
  if (!f.json)  // each agent's line as its step completes
    ro.on_step = [](size_t, const StepResult& s) {
      if (s.agent.empty()) return;
      fmt::print("[{}] prefilled {} decoded {} ({:.3f} s): {}\n", s.agent, s.prefilled_tokens, s.output_tokens.size(),
                 s.seconds, s.text);
      std::fflush(stdout);
    };
  auto [names, adapters] = agents_of(*loaded->adapters);
  auto res = run_replay(*loaded->model, loaded->tokenizer.get(), names, adapters, *steps, ro);
  // A step's error names the script ("S: step 3: ..."); one from setting up the trajectory comes
  // from the flags (--kv-share, --recompute-layers, --kv-memory) and is reported as it is.
  if (!res.ok() && res.error().message.starts_with("step "))
    return report(make_error(res.error().code, "{}: {}", f.script, res.error().message));
  if (!res.ok()) return report(res.error());
  if (f.json) {
    nlohmann::json j;
    j["mode"] = share_mode_name(ro.sharing.mode);
    j["steps"] = nlohmann::json::array();
    for (const StepResult& s : res->steps) {
      if (s.agent.empty()) continue;  // append steps produce no output
      nlohmann::json o = {{"agent", s.agent}, {"prefilled_tokens", s.prefilled_tokens}, {"output_tokens", s.output_tokens},
                          {"text", s.text}, {"seconds", s.seconds}};
      if (s.drafts.passes > 0)  // --speculative-config
        o["speculative"] = s.drafts;
      if (f.logits) {
        o["first_logits"] = s.logits.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.logits[0]);
        o["logits"] = s.logits;
      }
      j["steps"].push_back(std::move(o));
    }
    j["cache"] = cache_json(res->cache);
    j["cache_peak"] = cache_json(res->kv_usage.peak);
    j["evictions"] = res->kv_usage.evictions;
    j["evicted_tokens"] = res->kv_usage.evicted_tokens;
    j["trajectory_tokens"] = res->trajectory.size();
    j["trajectory"] = res->trajectory;
    j["backend"] = loaded->backend->name();
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  const CacheBytes& b = res->cache;
  fmt::print("cache ({}): base {} B, lr {} B, full {} B, total {} B (+{} B page rounding)\n", share_mode_name(ro.sharing.mode),
             b.base, b.lr, b.full, b.total(), b.page_overhead());
  print_evictions(res->kv_usage);
  return 0;
}

}  // namespace

void register_replay(CLI::App& app, std::function<int()>& action) {
  static ReplayFlags flags;
  ReplayFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand("replay", "Replay an agent script over one shared trajectory under a KV sharing mode");
  f->model.add_to(cmd, true);
  add_speculative_flag(cmd, f->model.speculative_config);
  f->sharing.add_to(cmd);
  cmd->add_option("--script", f->script,
                  "JSON script: {\"steps\": [{\"append\": TEXT} | {\"append_tokens\": [IDS]} | "
                  "{\"agent\": NAME, \"generate\": N, \"stop\": [STR]} | {\"agent\": NAME, \"force_tokens\": [IDS]}]}, "
                  "one action per step (\"label\", \"round\" and \"comment\" may annotate any step). A generate step "
                  "decodes greedily until a stop string or N tokens; the end-of-sequence token does not stop it, so "
                  "every mode decodes the same number of tokens")
      ->required();
  auto* json = cmd->add_flag("--json", f->json,
                             "Print one JSON object: per step agent, prefilled_tokens, output_tokens, text; cache bytes");
  cmd->add_flag("--logits", f->logits, "With --json: first_logits and logits (one row per decoded or forced token)")
      ->needs(json);
  cmd->callback([f, &action] { action = [f] { return run_replay_cmd(*f); }; });
}

}  // namespace lragent::cli
