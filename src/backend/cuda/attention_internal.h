// Entry points of the numbered kernel versions; `attention()` (attention.cu) validates the
// parameters and dispatches here.
#pragma once

#include "backend/cuda/attention.cuh"

namespace lragent::cuda {

cudaError_t attention_v0(const AttnParams& p);
cudaError_t attention_v1(const AttnParams& p);
int attention_v1_num_splits(const AttnParams& p);
size_t attention_v1_workspace_bytes(const AttnParams& p, int max_splits);
cudaError_t attention_v2(const AttnParams& p);
int attention_v2_num_splits(const AttnParams& p);
cudaError_t attention_v3(const AttnParams& p);
int attention_v3_num_splits(const AttnParams& p);
cudaError_t attention_v4(const AttnParams& p);
int attention_v4_num_splits(const AttnParams& p);

}  // namespace lragent::cuda
