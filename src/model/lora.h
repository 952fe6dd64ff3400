// PEFT LoRA adapters: loading adapter_config.json + adapter_model.safetensors for a Llama-family
// model, and a registry that finds adapters whose lora_A matrices are bit-identical (shared-A
// adapters) so the forward pass can shrink x·A once for all of them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/tensor.h"
#include "model/config.h"

namespace lragent {

enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
// The PEFT module name of a target: "q_proj", ..., "down_proj".
const char* lora_target_name(LoraTarget t);

struct LoraModule {
  int rank = 0;
  float scale = 0.f;   // lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
  Tensor a;            // [r, in_features] f32
  Tensor b;            // [out_features, r] f32
  uint64_t a_hash = 0; // hash of the raw A bytes as stored in the file
  // Set by the AdapterRegistry that holds this module: the first registered module (same layer
  // and target) with a bit-identical A, itself when none; null outside a registry.
  const LoraModule* a_lead = nullptr;
  // Whether this module's A is bit-identical to `o`'s: true at once when one registry found them
  // so (the same a_lead), else the hashes and then a compare of the matrices decide.
  bool same_a_as(const LoraModule& o) const;
  // Copies on a non-CPU serving backend (upload_adapter), in its weight dtype; empty on the CPU.
  Tensor a_dev;        // [r, in_features]
  Tensor b_dev;        // [out_features, r]
  // The matrices the forward pass multiplies with (device copies when present).
  const TensorView& a_use() const { return a_dev.view().data ? a_dev.view() : a.view(); }
  const TensorView& b_use() const { return b_dev.view().data ? b_dev.view() : b.view(); }
};

struct LoraAdapter {
  std::string name, dir;
  int default_rank = 0;
  float lora_alpha = 0.f;
  bool use_rslora = false;
  // [num_layers][target]: empty when the module is not adapted.
  std::vector<std::array<std::optional<LoraModule>, kNumLoraTargets>> layers;
  bool targets(LoraTarget t) const;  // true when some layer adapts `t`
  int max_rank() const;              // the highest rank of its modules (0: adapts nothing)
};

// Loads DIR/adapter_config.json + DIR/adapter_model.safetensors for a model with `cfg`.
// A/B are converted to f32 and checked against the model dims. Refuses (naming the file and
// the cause) what the forward pass cannot apply exactly: DoRA, biases, modules_to_save,
// embedding/lm_head targets, layers_to_transform, fan_in_fan_out, non-LORA peft types.
Result<std::unique_ptr<LoraAdapter>> load_lora_adapter(const std::string& name, const std::string& dir,
                                                       const ModelConfig& cfg);

class SafetensorsFile;
// The same from memory: adapter_config.json's text and the opened adapter_model.safetensors
// (the sources name them in errors). `dir` of the result is left empty.
Result<std::unique_ptr<LoraAdapter>> parse_lora_adapter(const std::string& name, const std::string& config_json,
                                                        const std::string& config_source, const SafetensorsFile& file,
                                                        const std::string& tensors_source, const ModelConfig& cfg);

class Backend;
// Copies every module's A and B to `backend` (a no-op on the CPU backend). The host f32 copies
// stay: shared-A detection compares them. kOutOfMemory when the device has no room.
Status upload_adapter(LoraAdapter& adapter, Backend& backend);

// The adapters being served, by name, with their shared-A groups.
class AdapterRegistry {
 public:
  // Adapters of one (layer, target) whose A matrices are bit-identical.
  struct ShareGroup {
    int layer = 0;
    LoraTarget target = LoraTarget::kQ;
    std::vector<int> members;  // adapter indices (add order), ascending, at least two
  };

  // Refuses a duplicate name or a layer count that differs from the adapters already added;
  // on error the registry is unchanged and its adapters stay usable.
  Status add(std::unique_ptr<LoraAdapter> adapter);
  const LoraAdapter* find(const std::string& name) const;  // nullptr when absent
  // Takes the adapter of that name out (null when absent) and regroups the rest. Its modules lead
  // themselves (a_lead), so that no module, in or out of the registry, leads from a freed one.
  std::unique_ptr<LoraAdapter> remove(const std::string& name);
  const LoraAdapter& at(int index) const { return *adapters_.at(static_cast<size_t>(index)); }
  int size() const { return static_cast<int>(adapters_.size()); }
  // Sorted by (layer, target).
  const std::vector<ShareGroup>& shared_a_groups() const { return groups_; }
  // One line per module kind and member set, e.g.
  // "q_proj: {plan, action, reflect} share A in all 2 layers\n".
  std::string describe_groups() const;

 private:
  void rebuild_groups();

  std::vector<std::unique_ptr<LoraAdapter>> adapters_;
  std::vector<ShareGroup> groups_;
};

}  // namespace lragent
