// plan_kv_memory on the GPU (vLLM's --gpu-memory-utilization): the KV memory it plans for a
// fraction of the device, allocated beside the weights, leaves room for the largest pass it
// profiled, and the whole process then stays within that fraction (the pool's high-water mark);
// a fraction the weights alone exceed is an out-of-memory error naming what takes the memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "cuda/cuda_test_util.h"
#include "backend/backend.h"
#include "engine/generator.h"
#include "engine/memory_plan.h"
#include "kv/kv_arena.h"
#include "model/lora.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

TEST(CudaMemoryPlan, TheKvMemoryLeavesTheFractionOfTheDevice) {
  if (!testing::have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto be = make_cuda_backend(CudaBackendOptions{});
  ASSERT_TRUE(be.ok()) << be.error().message;
  SyntheticSpec spec;
  spec.hidden = 1024;
  spec.heads = 8;
  spec.kv_heads = 2;
  spec.layers = 4;
  spec.intermediate = 2816;
  auto model = make_synthetic_model(spec, **be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto adapters = make_synthetic_adapters((*model)->config(), 16, 7);
  for (auto& a : adapters) ASSERT_TRUE(upload_adapter(*a, **be).ok());
  const int64_t pass = 2048;
  const double fraction = 0.5;
  auto plan = plan_kv_memory(**model, adapters[0].get(), fraction, pass);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const MemoryStats m = (*be)->memory_stats();
  EXPECT_EQ(plan->device_bytes, m.capacity);
  EXPECT_GT(plan->in_use, 0);       // the weights and adapters
  EXPECT_GT(plan->pass_peak, 0);    // a 2048-token pass's activations
  EXPECT_LT(plan->pass_peak, plan->device_bytes / 10);
  EXPECT_EQ(plan->kv_bytes + plan->in_use + plan->pass_peak,
            static_cast<int64_t>(fraction * static_cast<double>(plan->device_bytes)));
  // Allocated, the KV memory fits beside the weights; the same pass runs beside it, and the
  // process's high-water mark stays within the fraction (1% for the pass's own small cache,
  // which the profile counted, and allocator rounding).
  auto arena = KvArena::create(plan->kv_bytes, be->get());
  ASSERT_TRUE(arena.ok()) << arena.error().message;
  (*be)->reset_peak_memory();
  GenerateRequest req;
  for (int64_t i = 0; i < pass; ++i) req.prompt.push_back(static_cast<int32_t>(1 + i % 250));
  req.max_tokens = 4;
  req.adapter = adapters[0].get();
  EngineOptions eo;
  eo.max_batch_tokens = pass;
  Generator gen(**model, eo);
  auto ran = gen.run({req});
  ASSERT_TRUE(ran.ok()) << ran.error().message;
  (*be)->synchronize();
  EXPECT_LE((*be)->memory_stats().peak, static_cast<int64_t>(1.01 * fraction * static_cast<double>(plan->device_bytes)));
  arena->reset();
  // A fraction below what the weights take leaves nothing.
  auto none = plan_kv_memory(**model, nullptr, 0.5 * static_cast<double>(plan->in_use) / plan->device_bytes, pass);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(none.error().message.find("leaves no room for the KV cache"), std::string::npos) << none.error().message;
}

}  // namespace
}  // namespace lragent
