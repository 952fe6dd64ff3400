// Applying LoRA deltas to a batch that mixes adapters (Punica SGMV / S-LoRA style):
// shrink x·A once per shared-A group, expand (x·A)·B per adapter, never merging weights.
#pragma once

#include <span>
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

// One target's LoRA term in a projection stage (see project_with_lora).
struct LoraTargetOut {
  LoraTarget target = LoraTarget::kQ;
  // [n, out]: gets scale · (x·A)·B^T on the rows of every segment whose adapter adapts the
  // target; null: only the shrink x·A runs (the base-sharing modes keep just that).
  TensorView* y = nullptr;
  // [n, out] or null. With it, y = base + delta on every segment (rows of unadapted segments are
  // copied): a full K/V beside its base one without a separate copy kernel.
  const TensorView* base = nullptr;
  // When given: per segment, x·A of its rows [n_rows, rank] (a view into a tensor appended to
  // `keep`), or a view without data when the segment's adapter does not adapt the target.
  std::vector<TensorView>* lr_out = nullptr;
  // When given, this target's expand jobs are appended here instead of run: the caller hands them
  // to an op that applies them on the way (Backend::rope_pair_lora for q). In place only (no base).
  std::vector<Backend::LoraExpandJob>* defer = nullptr;
  // When given: per segment, nonzero where nothing reads this target's output rows (an ICaRus
  // decoder's K and V: it stores no entries), so neither its shrink nor its expand runs there, as
  // if its adapter did not adapt the target.
  const std::vector<char>* unused = nullptr;
};

// One projection stage of a layer: the base projections that read x (q/k/v; o; gate/up; down)
// and the LoRA terms of the targets that read the same x.
//   - Shrinks x·A run once per shared-A group. A group that covers the whole batch, or any group
//     of a decode-sized batch (<= kLoraFoldRows rows, where a bandwidth-bound GEMV costs the same
//     for all rows as for some; the CUDA decode GEMVs take up to 16), rides in the base projections' matmul_group: on the CUDA decode
//     path no launch of its own. Other groups take their rows (a range, else gathered).
//   - Every expand of the stage is one lora_expand call (one launch on the CUDA decode path).
//   - With `norm`, the stage reads rms_norm(h) and x is scratch for it: the projections and the
//     shrinks that ride with them take h through Backend::rms_norm_matmul_group (a backend that
//     folds the norm never writes x); only a stage with groups of their own norms into x first.
// Tensors that lr_out views point into are appended to `keep`; they must outlive those views.
// kOutOfMemory when the backend cannot allocate the x·A (or gathered x) buffers.
inline constexpr int64_t kLoraFoldRows = 16;
struct NormedInput {
  const TensorView* h = nullptr;       // [n, in] the residual stream
  const TensorView* weight = nullptr;  // [in] the RMSNorm's weight
  float eps = 0.f;
};
Status project_with_lora(Backend& be, int layer, const TensorView& x, std::span<const Backend::MatmulOut> base_outs,
                       std::span<const LoraTargetOut> targets, const std::vector<LoraSegment>& segs,
                       std::vector<Tensor>& keep, ForwardStats& stats, const NormedInput* norm = nullptr);

}  // namespace lragent
