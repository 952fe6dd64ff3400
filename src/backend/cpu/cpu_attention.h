// CPU reference attention (plain, Flash-LoRA V term, K-side deferred-RoPE term).
#pragma once

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace lragent {

// Rotate-half RoPE of one token's heads: x[heads, head_dim] at `pos`.
void cpu_rope_rows(float* x, int64_t heads, int64_t head_dim, int32_t pos, const float* inv_freq);

void cpu_attention(const AttentionParams& p, ThreadPool& pool);

}  // namespace lragent
