// Fidelity of the sharing modes (the poster's motivation and accuracy analysis):
//  * per layer, cosine similarity across agent pairs of full caches, base caches, adapter
//    outputs (X·A·B) and hidden states, all on the same trajectory;
//  * per mode vs `none`, teacher-forced along the trajectory `none` generates: argmax agreement
//    and mean KL(none ‖ mode) of next-token distributions, and the tokens each mode computed.
#pragma once

#include <string>
#include <vector>

#include "agents/replay.h"

namespace lragent {

struct LayerSimilarity {
  int layer = 0;
  double full = 0, base = 0, adapter = 0, hidden = 0;  // mean cosine over agent pairs
};

struct ModeFidelity {
  ShareMode mode = ShareMode::kNone;
  double argmax_agreement = 0;  // fraction of decoded positions with the same argmax as none
  double mean_kl = 0;           // mean KL(none || mode) in nats
  int64_t positions = 0;        // decoded/forced positions compared
  int64_t computed_tokens = 0;  // forward-pass tokens summed over agents (every layer)
  int64_t partial_tokens = 0;   // droidspeak catch-up tokens run through only its first layers
  CacheBytes cache;
};

struct SkippedMode {
  ShareMode mode = ShareMode::kNone;
  std::string reason;  // why the mode cannot run with these agents
};

struct FidelityReport {
  std::vector<LayerSimilarity> layers;
  std::vector<ModeFidelity> modes;
  std::vector<SkippedMode> skipped;  // modes of FidelityOptions::modes without a row
  int64_t trajectory_tokens = 0;
};

struct FidelityOptions {
  std::vector<ShareMode> modes = {std::begin(kAllShareModes), std::end(kAllShareModes)};
  std::vector<int> droidspeak_layers;  // recompute set for the droidspeak row
  int page_size = 16;
};

// `steps` is the script; agents are (names[i], adapters[i]).
Result<FidelityReport> measure_fidelity(LlamaModel& model, const Tokenizer* tok, const std::vector<std::string>& names,
                                        const std::vector<const LoraAdapter*>& adapters,
                                        const std::vector<ReplayStep>& steps, const FidelityOptions& opts);

// Teacher-forced comparison of one sharing configuration with `none` (used by profile-layers).
Result<ModeFidelity> compare_with_none(LlamaModel& model, const Tokenizer* tok, const std::vector<std::string>& names,
                                       const std::vector<const LoraAdapter*>& adapters,
                                       const std::vector<ReplayStep>& forced_steps,
                                       const std::vector<std::vector<float>>& none_rows, const SharingOptions& so);

// The script with every generate step replaced by force_tokens of what `none` produced, and
// none's logits rows in order. A script without agent steps has nothing to compare: kInvalidArgument.
Result<std::pair<std::vector<ReplayStep>, std::vector<std::vector<float>>>> force_along_none(
    LlamaModel& model, const Tokenizer* tok, const std::vector<std::string>& names,
    const std::vector<const LoraAdapter*>& adapters, const std::vector<ReplayStep>& steps, int page_size);

// Ranks layers by the divergence (mean KL vs none) caused by sharing that layer alone
// (all other layers private); returns (layer, kl) sorted from most to least divergent.
Result<std::vector<std::pair<int, double>>> profile_layers(LlamaModel& model, const Tokenizer* tok,
                                                           const std::vector<std::string>& names,
                                                           const std::vector<const LoraAdapter*>& adapters,
                                                           const std::vector<ReplayStep>& steps, int page_size);

}  // namespace lragent
