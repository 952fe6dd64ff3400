// Backend factory pieces that do not depend on the device: the CUDA entry point of builds
// without CUDA (the CUDA build defines it in cuda/cuda_backend.cpp).
#include "backend/backend.h"

#include <algorithm>
#include <cassert>

namespace lragent {

void Backend::argmax_rows(const TensorView& x, int32_t* out) {
  assert(x.rank() == 2 && x.dtype == DType::kF32 && "argmax_rows takes f32 [rows, cols]");
  Tensor host = device() == Device::kCpu ? Tensor() : to_host(x);
  const TensorView v = device() == Device::kCpu ? x : host.view();
  const int64_t rows = v.dim(0), cols = v.dim(1);
  const int64_t ld = v.strides.empty() ? cols : v.strides[0];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = v.f32() + r * ld;
    int64_t best = -1;
    for (int64_t i = 0; i < cols; ++i)  // lowest index on ties (Sampler::argmax); NaN never picked
      if (row[i] == row[i] && (best < 0 || row[i] > row[best])) best = i;
    out[r] = static_cast<int32_t>(std::max<int64_t>(best, 0));
  }
}

#ifndef LRAGENT_HAVE_CUDA
bool cuda_compiled() { return false; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return make_error(ErrorCode::kUnsupported,
                    "--device cuda: this lragent was built without CUDA; rebuild with "
                    "`cmake -DLRAGENT_CUDA=ON` (needs nvcc) or use --device cpu");
}
#endif

}  // namespace lragent
