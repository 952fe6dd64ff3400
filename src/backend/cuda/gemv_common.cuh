// What the decode GEMV kernels share: their argument block (one launch's weight segments, x, y,
// norm mode's g) and version 3's launch. Version 2 (gemv.cu) takes one row of x, version 3
// (gemv_v3_mma.cu) 2 to 16 rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.cuh"

namespace lragent::cuda {

struct GemvArgs {
  const __nv_bfloat16* w[kMaxGemvSegs];  // segment s: [out_s, ldw_s]
  int64_t ldw[kMaxGemvSegs];
  float* y[kMaxGemvSegs];  // segment s: [rows, ldy_s]
  int64_t ldy[kMaxGemvSegs];
  int64_t end[kMaxGemvSegs];  // prefix sums of out_s: global row o is in the first s with o < end[s]
  int n_segs;
  const float* x;  // [rows, ldx]
  int64_t ldx;
  // [rows, in] bf16, contiguous: x as version 3 reads it past kGemvMaxRows rows (two x tiles), where
  // it does not read x; null otherwise.
  const __nv_bfloat16* x16;
  int64_t in, out;  // out = end[n_segs - 1]
  float alpha, beta;
  int wpr;  // warps per output row (v2): 1, 2, 4, 8
  // Norm mode: g [in] (f32 or bf16); x's rows are normed first (see gemv_norm_kernel).
  const void* norm_w;
  int norm_bf16;
  float norm_eps;
};
// SwiGLU mode: 2 segments (gate, up) of the same height; y[0] gets silu(gate) · up. Rows are
// taken in pairs: a block's kWarps / wpr rows are kWarps / (2 wpr) gate rows, then the same up rows
// (v3: a unit is a gate tile of 16 rows and the same up tile, their batches alternating).

// Version 3 (gemv_v3_mma.cu): `rows` (1..kGemvV3MaxRows) rows of x through tensor cores, segments and SwiGLU
// mode (no norm mode: a.norm_w must be null). `a` as launch_grouped fills it.
cudaError_t gemv_v3_launch(GemvArgs& a, int64_t rows, bool swiglu, bool pdl, cudaStream_t s);

}  // namespace lragent::cuda
