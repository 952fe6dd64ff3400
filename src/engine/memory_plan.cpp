#include "engine/memory_plan.h"

#include <algorithm>
#include <string>

#include <fmt/core.h>

#include "engine/generator.h"

namespace lragent {
namespace {

std::string gb(int64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace

Result<KvMemoryPlan> plan_kv_memory(LlamaModel& model, const LoraAdapter* adapter, double fraction,
                                    int64_t pass_tokens) {
  if (!(fraction > 0.0 && fraction <= 1.0))
    return make_error(ErrorCode::kInvalidArgument, "the GPU memory utilization must be in (0, 1], not {}", fraction);
  Backend& be = model.backend();
  be.synchronize();
  const MemoryStats before = be.memory_stats();
  if (before.capacity <= 0)
    return make_error(ErrorCode::kUnsupported,
                      "a GPU memory utilization needs a device with its own memory ({} has none): size the KV cache "
                      "memory in GB instead",
                      be.name());
  KvMemoryPlan plan;
  plan.device_bytes = before.capacity;
  plan.in_use = before.in_use;
  // The largest pass the server runs: a prompt chunk of pass_tokens tokens (within the model's
  // context), one token picked.
  const ModelConfig& cfg = model.config();
  int64_t n = std::max<int64_t>(pass_tokens, 1);
  if (cfg.max_position_embeddings > 0) n = std::min<int64_t>(n, cfg.max_position_embeddings - 1);
  plan.pass_tokens = n;
  GenerateRequest req;
  req.prompt.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) req.prompt[static_cast<size_t>(i)] = static_cast<int32_t>(1 + i % (cfg.vocab_size - 1));
  req.max_tokens = 1;
  req.adapter = adapter;
  EngineOptions eo;
  eo.max_batch_tokens = n;
  eo.decode_lookahead = false;
  be.reset_peak_memory();
  {
    Generator gen(model, eo);
    auto ran = gen.run({req});
    if (!ran.ok())
      return make_error(ran.error().code, "profiling one pass of {} tokens for the KV memory plan: {}", n,
                        ran.error().message);
    be.synchronize();
  }
  const MemoryStats after = be.memory_stats();
  plan.pass_peak = std::max<int64_t>(after.peak - before.in_use, 0);
  plan.kv_bytes = static_cast<int64_t>(fraction * static_cast<double>(plan.device_bytes)) - plan.in_use - plan.pass_peak;
  if (plan.kv_bytes <= 0)
    return make_error(ErrorCode::kOutOfMemory,
                      "a GPU memory utilization of {} leaves no room for the KV cache: of {} the weights and buffers take "
                      "{} and a pass of {} tokens {}; raise the utilization or lower --max-num-batched-tokens",
                      fraction, gb(plan.device_bytes), gb(plan.in_use), n, gb(plan.pass_peak));
  return plan;
}

}  // namespace lragent
