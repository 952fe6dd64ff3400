// Helpers shared by the CUDA tests (built only with -DLRAGENT_CUDA=ON).
#pragma once

#include <cuda_runtime.h>

namespace lragent::testing {

// Whether a CUDA device is usable here: without one the CUDA tests skip with a message.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace lragent::testing
