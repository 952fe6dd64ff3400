#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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

// The compiler's own _Float16 conversion (GCC >= 12 on x86-64: IEEE round-to-nearest-even) is the
// reference, bit for bit, over random values of every magnitude (subnormals, overflow included).
TEST(DType, F16MatchesIeeeOnRandomValues) {
#ifndef __FLT16_MANT_DIG__
  GTEST_SKIP() << "this compiler has no _Float16 on this target (clang < 15 on x86-64); the release "
                  "build (GCC) runs this test";
#else
  auto ieee = [](float x) {
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t bits;
    std::memcpy(&bits, &h, sizeof bits);
    return bits;
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    ASSERT_EQ(f32_to_f16(x), ieee(x)) << x;
    const float back = f16_to_f32(f32_to_f16(x));
    EXPECT_EQ(back, static_cast<float>(static_cast<_Float16>(x))) << x;
  }
  // Every f32 whose low 13 mantissa bits sit at a rounding edge (ties, one below and above)
  // across the normal and subnormal f16 range.
  for (int e = -26; e <= 15; ++e)
    for (uint32_t m : {0x1000u, 0x0fffu, 0x1001u, 0x3000u, 0x1fffu, 0x0001u}) {
      uint32_t u32 = (static_cast<uint32_t>(e + 127) << 23) | (0x155555u & ~0x1fffu) | m;
      float x;
      std::memcpy(&x, &u32, sizeof x);
      EXPECT_EQ(f32_to_f16(x), ieee(x)) << x;
      EXPECT_EQ(f32_to_f16(-x), ieee(-x)) << -x;
    }
#endif
}

TEST(DType, F16RoundsTiesToEvenWrittenOut) {
  // Ties to even, written out: 1 + 2^-11 -> 1.0, 1 + 3 * 2^-11 -> 1 + 2^-9; 2^-25 -> +0,
  // 3 * 2^-26 -> the smallest subnormal; 65520 -> inf.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -26)), 0x0001);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);
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
