// plan_kv_memory (vLLM's --gpu-memory-utilization) on the CPU: the host backend has no device
// memory to take a fraction of, which is an error that says so, as is a fraction outside (0, 1].
// The plan itself is checked on the GPU (tests/cuda/memory_plan_cuda_test.cpp).
#include <gtest/gtest.h>

#include "engine/memory_plan.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

TEST(MemoryPlan, NeedsADeviceWithItsOwnMemoryAndAFractionOfIt) {
  auto be = make_cpu_backend(1);
  auto model = make_synthetic_model(SyntheticSpec{}, *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto plan = plan_kv_memory(**model, nullptr, 0.9, 64);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(plan.error().message.find("needs a device with its own memory"), std::string::npos) << plan.error().message;
  for (double bad : {0.0, -0.5, 1.5}) {
    auto p = plan_kv_memory(**model, nullptr, bad, 64);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error().code, ErrorCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace lragent
