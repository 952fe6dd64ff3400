// CPU backend ops against plain double-precision loops, at awkward sizes and with weights
// in every float dtype the loader keeps (f32, f16, bf16), including strided weight rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"

namespace lragent {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Weights [out, in] stored in `t` with a row stride of `ld` elements.
Tensor store_weights(const std::vector<float>& w, int64_t out, int64_t in, int64_t ld, DType t) {
  Tensor buf = Tensor::zeros(t, {out, ld});
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) {
      const float x = w[static_cast<size_t>(r * in + c)];
      char* dst = static_cast<char*>(buf.view().data) + static_cast<size_t>(r * ld + c) * dtype_size(t);
      if (t == DType::kF32) {
        std::memcpy(dst, &x, 4);
      } else {
        const uint16_t h = t == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
        std::memcpy(dst, &h, 2);
      }
    }
  return buf;
}

TEST(CpuOps, MatmulEveryWeightDtypeAndStride) {
  auto be = make_cpu_backend(2);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t n : {1, 17})
      for (int64_t out : {1, 97, 300}) {
        const int64_t in = 33, ld = 40;  // rows padded: a strided slice of a larger matrix
        const auto x = randn(static_cast<size_t>(n * in), 1);
        const auto w = randn(static_cast<size_t>(out * in), 2);
        const auto b = randn(static_cast<size_t>(out), 3);
        Tensor wt = store_weights(w, out, in, ld, t);
        TensorView wv = wt.view();
        wv.shape = {out, in};
        wv.strides = {ld, 1};
        Tensor xt = Tensor::from_f32(x, {n, in});
        Tensor bias = Tensor::from_f32(b, {out});
        Tensor y = Tensor::from_f32(randn(static_cast<size_t>(n * out), 4), {n, out});
        const std::vector<float> y0(y.f32(), y.f32() + n * out);
        be->matmul(xt.view(), wv, &bias.view(), y.view(), 0.5f, 2.0f);
        double max_err = 0, max_ref = 0;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t o = 0; o < out; ++o) {
            double acc = 0;
            for (int64_t c = 0; c < in; ++c) {
              float wq = w[static_cast<size_t>(o * in + c)];  // the value the dtype can hold
              if (t == DType::kF16) wq = f16_to_f32(f32_to_f16(wq));
              if (t == DType::kBF16) wq = bf16_to_f32(f32_to_bf16(wq));
              acc += static_cast<double>(x[static_cast<size_t>(i * in + c)]) * wq;
            }
            const double ref = 0.5 * acc + 2.0 * y0[static_cast<size_t>(i * out + o)] + b[static_cast<size_t>(o)];
            const double err = std::fabs(ref - y.f32()[i * out + o]);
            max_err = std::isfinite(err) ? std::max(max_err, err) : INFINITY;  // NaN must fail, not vanish
            max_ref = std::max(max_ref, std::fabs(ref));
          }
        EXPECT_LE(max_err / max_ref, 1e-5) << dtype_name(t) << " n " << n << " out " << out;
      }
}

TEST(CpuOps, NormRopeSiluEmbeddingGather) {
  auto be = make_cpu_backend(2);
  const int64_t n = 17, d = 64;
  const auto x = randn(static_cast<size_t>(n * d), 5);
  const auto w = randn(static_cast<size_t>(d), 6);
  Tensor xt = Tensor::from_f32(x, {n, d}), wt = Tensor::from_f32(w, {d}), y = Tensor::empty(DType::kF32, {n, d});
  be->rms_norm(xt.view(), wt.view(), 1e-6f, y.view());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[static_cast<size_t>(i * d + j)]) * x[static_cast<size_t>(i * d + j)];
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t j = 0; j < d; ++j)
      EXPECT_NEAR(y.f32()[i * d + j], w[static_cast<size_t>(j)] * x[static_cast<size_t>(i * d + j)] * inv, 1e-5);
  }
  // RoPE: rotation keeps each pair's norm and matches the rotate-half formula.
  Tensor r = Tensor::from_f32(x, {n, 2, d / 2});
  std::vector<float> inv_freq(d / 4);
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.f, -2.f * static_cast<float>(i) / (d / 2));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 37);
  be->rope(r.view(), pos.data(), inv_freq.data());
  const int64_t hd = d / 2, half = hd / 2;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t k = 0; k < half; ++k) {
        const double ang = static_cast<float>(pos[static_cast<size_t>(i)]) * inv_freq[static_cast<size_t>(k)];
        const double a = x[static_cast<size_t>(i * d + h * hd + k)], b = x[static_cast<size_t>(i * d + h * hd + k + half)];
        EXPECT_NEAR(r.f32()[i * d + h * hd + k], a * std::cos(ang) - b * std::sin(ang), 1e-4);
        EXPECT_NEAR(r.f32()[i * d + h * hd + k + half], b * std::cos(ang) + a * std::sin(ang), 1e-4);
      }
  // SiLU(gate) * up.
  Tensor g = Tensor::from_f32(x, {n, d}), u = Tensor::from_f32(randn(static_cast<size_t>(n * d), 7), {n, d});
  Tensor o = Tensor::empty(DType::kF32, {n, d});
  be->silu_mul(g.view(), u.view(), o.view());
  for (int64_t i = 0; i < n * d; ++i)
    EXPECT_NEAR(o.f32()[i], x[static_cast<size_t>(i)] / (1 + std::exp(-static_cast<double>(x[static_cast<size_t>(i)]))) * u.f32()[i], 1e-5);
  // Embedding from a bf16 table and gather_rows.
  Tensor table = store_weights(x, n, d, d, DType::kBF16);
  const int32_t ids[3] = {16, 0, 5};
  Tensor e = Tensor::empty(DType::kF32, {3, d});
  be->embedding(table.view(), ids, 3, e.view());
  Tensor gathered = Tensor::empty(DType::kF32, {3, d});
  be->gather_rows(xt.view(), ids, 3, gathered.view());
  for (int k = 0; k < 3; ++k)
    for (int64_t j = 0; j < d; ++j) {
      const float want = x[static_cast<size_t>(ids[k] * d + j)];
      EXPECT_EQ(e.f32()[k * d + j], bf16_to_f32(f32_to_bf16(want)));
      EXPECT_EQ(gathered.f32()[k * d + j], want);
    }
}

// argmax_rows: the greedy pick, the lowest index on ties, NaN never picked (Sampler::argmax).
TEST(CpuOps, ArgmaxRowsTiesAndNaN) {
  auto be = make_cpu_backend(1);
  const int64_t rows = 4, cols = 97;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) - 5.f;  // many ties at 5
  x[static_cast<size_t>(2 * cols + 50)] = std::nanf("");
  x[static_cast<size_t>(3 * cols + 96)] = 9.f;  // a unique maximum in the last column
  Tensor t = Tensor::from_f32(x, {rows, cols});
  std::vector<int32_t> got(static_cast<size_t>(rows));
  be->argmax_rows(t.view(), got.data());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t want = -1;
    for (int64_t i = 0; i < cols; ++i) {
      const float v = x[static_cast<size_t>(r * cols + i)];
      if (v == v && (want < 0 || v > x[static_cast<size_t>(r * cols + want)])) want = i;
    }
    EXPECT_EQ(got[static_cast<size_t>(r)], want) << "row " << r;
  }
  EXPECT_EQ(got[3], 96);
}

}  // namespace
}  // namespace lragent
