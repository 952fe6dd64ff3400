// Backend factory pieces that do not depend on the device: the CUDA entry point of builds
// without CUDA (the CUDA build defines it in cuda/cuda_backend.cpp).
#include "backend/backend.h"

namespace lragent {

#ifndef LRAGENT_HAVE_CUDA
bool cuda_compiled() { return false; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return make_error(ErrorCode::kUnsupported,
                    "--device cuda: this lragent was built without CUDA; rebuild with "
                    "`cmake -DLRAGENT_CUDA=ON` (needs nvcc) or use --device cpu");
}
#endif

}  // namespace lragent
