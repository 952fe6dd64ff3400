// --kv-share / --recompute-layers / --page-size / KV memory flags shared by replay and run;
// fidelity and profile-layers take the two or one of them that they use.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "kv/sharing.h"
#include "model/lora.h"

namespace lragent::cli {

struct SharingFlags {
  std::string mode = "none";
  std::string recompute_layers;  // "0,5,7"
  int page_size = 16;
  int64_t max_context = 4096;  // tokens each KV stream is sized for
  double kv_memory_gb = 0;     // > 0: one KV arena of this size shared by every cache (no per-cache cap)
  bool no_kv_evict = false;    // SharingOptions::evict_private off
  // Every flag; `default_mode` is --kv-share's default and `modes_help` describes any mode the
  // command adds to the five (serve's auto).
  void add_to(CLI::App* app, const std::string& default_mode = "none", const std::string& modes_help = "");
  void add_page_size(CLI::App* app);
  void add_recompute_layers(CLI::App* app);
  // --kv-share droidspeak without --recompute-layers recomputes layer 0, as DroidSpeak does.
  Result<SharingOptions> options() const;
  Result<SharingOptions> options_for(const std::string& mode_name) const;
};

// One line saying how many private caches were dropped for room, when any were.
void print_evictions(const KvUsage& u);

// The registered adapters as agents, in registration order.
std::pair<std::vector<std::string>, std::vector<const LoraAdapter*>> agents_of(const AdapterRegistry& reg);

}  // namespace lragent::cli
