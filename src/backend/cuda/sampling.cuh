// Launcher of the device-side token pick (sampling.cu): temperature, top-k, top-p and the pick
// by a host-drawn u, one block per logits row, with the rules of backend/sampling_ref.h.
// Plain types only: the host-compiled backend (cuda_backend.cpp) includes this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling_ref.h"

namespace lragent::cuda {

struct SampleRowsParams {
  const float* logits = nullptr;        // [rows, ld] f32, the first vocab of each row used
  int64_t ld = 0;                       // row stride (elements)
  int64_t rows = 0, vocab = 0;
  const RowSampling* params = nullptr;  // [rows] on the device (step-varying: the upload path)
  int32_t* out = nullptr;               // [rows] on the device
};
// out[r] = sample_row(logits row r, vocab, params[r]). vocab < 1: cudaErrorInvalidValue.
cudaError_t sample_rows(const SampleRowsParams& p, cudaStream_t s);

}  // namespace lragent::cuda
