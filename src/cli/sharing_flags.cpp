#include "cli/sharing_flags.h"

#include <fmt/core.h>

#include "cli/common.h"

namespace lragent::cli {

void SharingFlags::add_recompute_layers(CLI::App* app) {
  app->add_option("--recompute-layers", recompute_layers,
                  "droidspeak: comma-separated layers each agent keeps and computes itself (default 0; see "
                  "`lragent profile-layers`). Catching up on tokens other agents computed runs only the layers "
                  "up to the highest of them, so low layers are cheap");
}

void SharingFlags::add_page_size(CLI::App* app) {
  app->add_option("--page-size,--block-size", page_size, "Tokens per KV cache page (--block-size: vLLM's name)")->default_val(16)->check(cli::in_range(1, 1024));
}

void SharingFlags::add_to(CLI::App* app, const std::string& default_mode, const std::string& modes_help) {
  app->add_option("--kv-share", mode,
                  "KV sharing mode: none (private full caches), full (one full cache), base (shared base cache, "
                  "private low-rank caches), base-lr (shared base and low-rank caches; shared-A adapters), "
                  "droidspeak (full, with --recompute-layers private), icarus (one full cache written by the base "
                  "model alone; each agent's adapter only reads it: exact for adapters trained as ICaRus decoders, "
                  "and the same cache whichever agent computed a token)" + modes_help)
      ->default_val(default_mode);
  add_recompute_layers(app);
  add_page_size(app);
  app->add_option("--max-context", max_context,
                  "Longest trajectory the KV pools are sized for, in tokens (capped at the model's context); "
                  "memory is reserved up front, so a larger value costs memory even when unused")
      ->default_val(4096)
      ->check(cli::positive());
  app->add_option("--kv-memory", kv_memory_gb,
                  "KV cache memory in GB, reserved up front as one pool that every cache of the trajectory draws "
                  "from (shared base, low-rank rows, each agent's private caches): memory goes to whichever "
                  "cache needs it, and running out is reported with what each cache holds. 0 (default): size "
                  "it so that every cache holds --max-context tokens")
      ->default_val(0)
      ->check(cli::memory_gb());
  app->add_flag("--no-kv-evict", no_kv_evict,
                "When the KV memory is full, fail with an out-of-memory error instead of dropping the private "
                "caches of the least recently run other agent (which then recomputes them at its next call; "
                "shared caches are never dropped)");
}

Result<SharingOptions> SharingFlags::options_for(const std::string& mode_name) const {
  SharingOptions o;
  auto parsed = parse_share_mode(mode_name);
  if (!parsed.ok()) return make_error(parsed.error().code, "--kv-share {}", parsed.error().message);
  o.mode = *parsed;
  o.page_size = page_size;
  o.max_tokens = max_context;
  o.arena_bytes = static_cast<int64_t>(kv_memory_gb * 1e9);
  o.evict_private = !no_kv_evict;
  if (!recompute_layers.empty()) {
    auto ids = parse_id_list(recompute_layers);
    if (!ids.ok())
      return make_error(ErrorCode::kInvalidArgument, "--recompute-layers '{}': expected layer numbers like 0,5,7",
                        recompute_layers);
    o.recompute_layers.assign(ids->begin(), ids->end());
  } else if (o.mode == ShareMode::kDroidSpeak) {
    o.recompute_layers = {0};  // DroidSpeak's usual choice: recompute the first layer
  }
  return o;
}

Result<SharingOptions> SharingFlags::options() const { return options_for(mode); }

void print_evictions(const KvUsage& u) {
  if (u.evictions > 0)
    fmt::print("KV memory full: {} private caches dropped ({} tokens, computed again by their agents); peak {} B\n",
               u.evictions, u.evicted_tokens, u.peak.total());
}

std::pair<std::vector<std::string>, std::vector<const LoraAdapter*>> agents_of(const AdapterRegistry& reg) {
  std::vector<std::string> names;
  std::vector<const LoraAdapter*> adapters;
  for (int i = 0; i < reg.size(); ++i) {
    names.push_back(reg.at(i).name);
    adapters.push_back(&reg.at(i));
  }
  return {names, adapters};
}

}  // namespace lragent::cli
