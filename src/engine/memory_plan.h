// How much KV cache memory a server can take on its device (vLLM's --gpu-memory-utilization):
// what leaves the process a given fraction of the device's memory once the weights, the adapters
// and one forward pass's working memory are counted. The pass is measured by running one (vLLM
// profiles a dummy batch the same way), not estimated.
#pragma once

#include <cstdint>

#include "core/result.h"
#include "model/llama.h"

namespace lragent {

struct KvMemoryPlan {
  int64_t device_bytes = 0;  // the device's memory
  int64_t in_use = 0;        // held before the profiling pass: weights, adapters, buffers
  int64_t pass_tokens = 0;   // the profiling pass's tokens (pass_tokens, within the model's context)
  int64_t pass_peak = 0;     // the profiling pass's peak above in_use (its activations and its own small cache)
  int64_t kv_bytes = 0;      // fraction × device_bytes − in_use − pass_peak
};

// Runs one prefill of `pass_tokens` tokens (the server's --max-num-batched-tokens: its largest
// pass) through `adapter` (null: the base model) and returns the KV memory that keeps the
// process within `fraction` (0, 1] of the device. Errors: a backend without device memory
// (kUnsupported: the CPU), a fraction outside (0, 1] (kInvalidArgument), no room left
// (kOutOfMemory, naming what takes the memory).
Result<KvMemoryPlan> plan_kv_memory(LlamaModel& model, const LoraAdapter* adapter, double fraction,
                                    int64_t pass_tokens);

}  // namespace lragent
