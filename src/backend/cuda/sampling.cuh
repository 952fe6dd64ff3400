// Launcher of the device-side token pick (sampling.cu): temperature, top-k, top-p and the pick
// by a host-drawn u, each row split over several blocks, with the rules of backend/sampling_ref.h.
// Plain types only: the host-compiled backend (cuda_backend.cpp) includes this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/sampling_ref.h"

namespace lragent::cuda {

struct SampleRowsParams {
  const float* logits = nullptr;        // [rows, ld] f32, the first vocab of each row used
  int64_t ld = 0;                       // row stride (elements)
  int64_t rows = 0, vocab = 0;
  const RowSampling* params = nullptr;  // [rows] on the device (step-varying: the upload path)
  int32_t* out = nullptr;               // [rows] on the device
  void* workspace = nullptr;            // [workspace_bytes] device scratch, any contents (the kernels
  size_t workspace_bytes = 0;           // initialise what they use); >= sample_rows_workspace_bytes
};
// Device scratch one sample_rows call of this shape needs (a few KB, plus 16 KB per row when a
// row is split over several blocks; the same for the same shape on the same device).
size_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab);
// out[r] = sample_row(logits row r, vocab, params[r]), with a fixed number of kernel launches
// and no host synchronisation (graph-capturable). vocab < 1 or too small a workspace:
// cudaErrorInvalidValue.
cudaError_t sample_rows(const SampleRowsParams& p, cudaStream_t s);

}  // namespace lragent::cuda
