// Entry points of the numbered kernel versions; `attention()` (attention.cu) validates the
// parameters and dispatches here.
#pragma once

#include "backend/cuda/attention.cuh"

#include <algorithm>

namespace lragent::cuda {

// Split-K grids put n_seqs x n_splits blocks in grid.z, which holds at most 65535.
inline int max_grid_splits(const AttnParams& p) { return std::max(1, 65535 / std::max(1, p.n_seqs)); }

// Each version records itself when it launches its own kernel (attention_last_kernel()).
void note_attention_kernel(AttnKernel k);

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
cudaError_t attention_v5(const AttnParams& p);
int attention_v5_num_splits(const AttnParams& p);
cudaError_t attention_v6(const AttnParams& p);
int attention_v6_num_splits(const AttnParams& p);

// Elements per cp.async chunk of LR rows: 8 (16 bytes) when every row starts 16-byte aligned
// (rank, row stride and block stride multiples of 8, data 16-byte aligned), else 4. v1-v3 use it.
int attention_lr_copy_chunk(const DevLowRank& t);
// Shared by the wgmma kernels (v5, v6): LR rows that copy as 16-byte chunks (rank 8 or 16, rows
// and blocks 16-byte aligned), and whether this process's device is an sm_90 GPU.
bool attention_lr_rows_16b(const DevLowRank& t);
bool attention_device_is_sm90();

// v3's split-K combine (partials [n_splits, n_seqs, max_q, n_heads, head_dim] f32 normalised per
// split, log2-sum-exp [n_splits, n_seqs, max_q, n_heads]), shared with v5 (same partial format).
cudaError_t attention_split_combine(const AttnParams& p, float* part_o, float* part_lse, int n_splits);

// The split plan of v3's prefill grid (128 GQA-packed rows x 64-key tiles per block, about two
// waves of blocks, >= 8 tiles per split, clamped to the workspace), which v5 shares: its row
// tiles and the split count.
int attention_prefill_row_tiles(const AttnParams& p);
int attention_prefill_splits(const AttnParams& p);

}  // namespace lragent::cuda
