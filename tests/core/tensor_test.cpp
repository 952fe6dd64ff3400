// TensorView's shape and strides (Dims: extents held inline, core/dims.h) and row views.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace lragent {
namespace {

TEST(Dims, BehavesAsTheVectorItReplaces) {
  Dims d{2, 3, 4};
  EXPECT_EQ(d.size(), 3u);
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(d[1], 3);
  EXPECT_EQ(d.back(), 4);
  d[1] = 5;
  const std::vector<int64_t> v = d;  // to a vector and back, equal both ways
  EXPECT_EQ(v, (std::vector<int64_t>{2, 5, 4}));
  EXPECT_EQ(Dims(v), d);
  EXPECT_NE(d, (Dims{2, 5}));
  EXPECT_NE(d, (Dims{2, 5, 5}));
  int64_t prod = 1;
  for (int64_t x : d) prod *= x;
  EXPECT_EQ(prod, 40);
  EXPECT_THROW((void)d.at(3), std::out_of_range);
  d.clear();
  EXPECT_TRUE(d.empty());
  Dims full;
  for (size_t i = 0; i < Dims::kMaxRank; ++i) full.push_back(static_cast<int64_t>(i));
  EXPECT_EQ(full.size(), Dims::kMaxRank);
  EXPECT_EQ(Dims(3, 7), (Dims{7, 7, 7}));
}

TEST(TensorView, CopiesKeepShapeStridesAndRows) {
  Tensor t = Tensor::zeros(DType::kF32, {4, 3});
  for (int64_t i = 0; i < 12; ++i) t.f32()[i] = static_cast<float>(i);
  TensorView v = t.view();
  TensorView r = v.rows(1, 3);
  EXPECT_EQ(r.shape, (Dims{2, 3}));
  EXPECT_EQ(v.shape, (Dims{4, 3}));  // the copy did not share extents with the original
  EXPECT_EQ(r.f32()[0], 3.f);
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(v.contiguous_strides(), (Dims{3, 1}));
  EXPECT_EQ(v.shape_str(), "[4, 3]");
  TensorView s = v;
  s.strides = {6, 1};  // every other row
  s.shape = {2, 3};
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.rows(1, 2).f32()[0], 6.f);
}

}  // namespace
}  // namespace lragent
