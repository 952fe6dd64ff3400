#include "backend/cuda/device_props.h"

#include <cuda_runtime.h>

namespace lragent::cuda {

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      v = 0;
    return v > 0 ? v : 132;
  }();
  return n;
}

}  // namespace lragent::cuda
