// Applying LoRA deltas to a batch that mixes adapters (Punica SGMV / S-LoRA style):
// shrink x·A once per shared-A group, expand (x·A)·B per adapter, never merging weights.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/llama.h"
#include "model/lora.h"

namespace lragent {

// Rows [row_begin, row_begin + n_rows) of the batch belong to `adapter` (null: base model).
struct LoraSegment {
  int64_t row_begin = 0;
  int64_t n_rows = 0;
  const LoraAdapter* adapter = nullptr;
};

// y[rows] += scale · (x[rows] · A^T) · B^T for every segment whose adapter adapts
// (layer, target); with y null only the shrink runs (callers that need just x·A).
// When `lr_out` is given it receives, per segment, the shrink result
// x·A as a tensor [n_rows, rank] (empty tensor when the segment is not adapted).
void apply_lora(Backend& be, int layer, LoraTarget target, const TensorView& x, TensorView* y,
                const std::vector<LoraSegment>& segs, std::vector<Tensor>* lr_out, ForwardStats& stats);

}  // namespace lragent
