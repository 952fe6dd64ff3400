// What the CUDA-vs-CPU op tests share (backend_cuda_test.cpp, backend_cuda_attention_test.cpp,
// engine_cuda_test.cpp): the backends, host tensors, the error measure, and the CudaOps fixture
// (instantiated for f32 and bf16 in backend_cuda_test.cpp, for every file's TEST_Ps).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "cuda/cuda_test_util.h"

#define REQUIRE_GPU()                                                       \
  if (!::lragent::testing::have_gpu()) {                                    \
    GTEST_SKIP() << "no CUDA device: CUDA backend tests skipped";           \
  }

namespace lragent::testing {

inline std::unique_ptr<Backend> cuda_backend(DType dt) {
  CudaBackendOptions o;
  o.dtype = dt;
  auto be = make_cuda_backend(o);
  EXPECT_TRUE(be.ok()) << be.error().message;
  return be.ok() ? std::move(*be) : nullptr;
}

inline Tensor random_host(std::vector<int64_t> shape, uint32_t seed, float scale = 1.f) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = nd(rng);
  return t;
}

inline std::vector<float> host_values(Backend& be, const TensorView& v) {
  Tensor h = be.device() == Device::kCpu ? Tensor() : be.to_host(v);
  const float* p = be.device() == Device::kCpu ? v.f32() : h.f32();
  return std::vector<float>(p, p + v.numel());
}

// Relative L2 error ||a - b|| / ||b||; NaN anywhere, different lengths or nothing to compare is an
// error of 1e30.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return 1e30;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double tol(DType dt) { return dt == DType::kF32 ? 2e-5 : 1e-2; }

// An f32 [rows, cols] host tensor of NaNs: an output that must be written everywhere (or must not
// be read) starts as this.
inline Tensor nan_host(int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::nanf("");
  return t;
}

// Every op test: the CUDA backend in the test's dtype, and a CPU backend as the reference.
class CudaOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    gpu = cuda_backend(GetParam());
    cpu = make_cpu_backend(2);
    ASSERT_TRUE(gpu);
  }
  std::unique_ptr<Backend> gpu, cpu;
};

}  // namespace lragent::testing
