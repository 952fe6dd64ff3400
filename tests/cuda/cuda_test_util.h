// Helpers shared by the CUDA tests (built only with -DLRAGENT_CUDA=ON).
#pragma once

#include <cuda_runtime.h>

#include "model/synthetic.h"

namespace lragent::testing {

// A small synthetic model with the tuned kernels' head_dim: 4 heads of 128 (hidden 512), 2 KV
// heads, 2 layers, positions up to 4096.
inline SyntheticSpec small_synthetic_spec() {
  SyntheticSpec s;
  s.hidden = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.layers = 2;
  s.intermediate = 1024;
  s.max_positions = 4096;
  return s;
}

// Whether a CUDA device is usable here: without one the CUDA tests skip with a message.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace lragent::testing
