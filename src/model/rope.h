// RoPE inverse frequencies, including llama3 and linear scaling (as HF transformers).
#pragma once

#include <vector>

#include "model/config.h"

namespace lragent {

// [head_dim / 2] inverse frequencies, rounded to f32 like HF's inv_freq buffer.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

}  // namespace lragent
