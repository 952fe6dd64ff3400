// Error checks for the standalone CUDA benchmarks (bench/cuda/*.cu): a failed call prints what
// failed and where, and ends the benchmark (a benchmark has no caller to return an error to).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "error: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
