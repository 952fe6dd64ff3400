#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/tensor.h"

namespace lragent {
namespace {

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16MatchesIeeeOnRandomValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  for (int i = 0; i < 20000; ++i) {
    float x = u(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    float back = f16_to_f32(f32_to_f16(x));
    if (std::fabs(x) >= 65520.f) {  // halfway to the next binade rounds to inf
      EXPECT_TRUE(std::isinf(back));
    } else if (std::fabs(x) > 6.2e-5f) {
      EXPECT_LE(std::fabs(back - x), std::fabs(x) * (1.0f / 2048.f)) << x;
    } else {
      EXPECT_LE(std::fabs(back - x), std::ldexp(1.0f, -25)) << x;
    }
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
}

TEST(DType, SafetensorsNames) {
  EXPECT_EQ(*dtype_from_safetensors("BF16"), DType::kBF16);
  auto bad = dtype_from_safetensors("F8_E4M3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("F8_E4M3"), std::string::npos);
}

TEST(Tensor, RowsViewAndShape) {
  Tensor t = Tensor::from_f32({1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_EQ(t.view().shape_str(), "[3, 2]");
  TensorView r = t.view().rows(1, 3);
  EXPECT_EQ(r.dim(0), 2);
  EXPECT_EQ(r.f32()[0], 3.0f);
  EXPECT_TRUE(r.is_contiguous());
}

}  // namespace
}  // namespace lragent
