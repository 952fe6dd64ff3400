// Token picking from one logits row: the reference every backend's sample_rows follows (the
// CPU backend runs it; the CUDA kernel in cuda/sampling.cu implements the same rules) and the
// engine's Sampler calls. It lives in src/backend so that both the backends and src/engine can
// use it without src/backend depending on src/engine.
//
// Semantics (HF's warpers: temperature, then top-k, then top-p), for a row l[0..vocab):
//   greedy     temperature <= 0 (or NaN): argmax_row below.
//   candidates the finite logits (NaN, +inf and -inf are never sampled); a row without any
//              finite logit falls back to argmax_row. m = the largest finite logit.
//   weights    w_i = expf((l_i - m) / temperature), computed in f32 exactly as written.
//   top-k      top_k > 0 and fewer than the finite count: keep ids whose logit >= the k-th
//              largest finite logit (counted with multiplicity), so ties at the boundary are all
//              kept (HF's TopKLogitsWarper).
//   top-p      top_p < 1: among the ids top-k kept, with W = their total weight (f64) and
//              S(i) = the total weight (f64) of kept ids whose logit is strictly larger than
//              l_i, keep i iff S(i) < top_p · W, or l_i == m. That is the smallest set, taken
//              from the top, whose mass reaches top_p, with the ties at its boundary all kept
//              and never fewer than the maximal logit(s) (top_p <= 0 keeps only those). Larger
//              logit means larger or equal weight, so this is HF's "strictly larger weight"
//              rule except where expf rounds two distinct logits to the same f32 weight.
//   pick       u in [0, 1) (drawn by the caller, on the host): with W' = the total kept weight
//              (f64), the smallest id with w_i > 0 whose inclusive prefix sum of kept weights in
//              id order (f64) exceeds u · W'; if rounding leaves none, the last kept id with
//              w_i > 0. Zero-weight ids are never picked.
// A device implementation may add in another order (f64), or add exactly in fixed point with at
// least 44 fractional bits (the CUDA pick: each weight rounded up to a multiple of 2^-F, so that
// w_i > 0 keeps a positive mass, and the sums compared with top_p · W and u · W' in f64), so
// results differ only at rounding boundaries; its expf may differ from the host's by an ulp or
// two; everything else is exact.
#pragma once

#include <cstdint>

namespace lragent {

// Sampling parameters of one logits row (uploaded as is to a GPU: keep it 16 plain bytes).
struct RowSampling {
  float temperature = 0.f;  // <= 0: greedy
  int32_t top_k = 0;        // <= 0: off
  float top_p = 1.f;        // >= 1: off
  float u = 0.f;            // uniform in [0, 1), one host draw per sampled row
};
static_assert(sizeof(RowSampling) == 16, "RowSampling is uploaded to the device as 16 bytes");

// The greedy pick: the id of the largest value of x [n]; ties go to the lowest id (torch.argmax
// does the same); NaN is never picked (an all-NaN row gives 0).
int32_t argmax_row(const float* x, int64_t n);

// The pick of the semantics above from logits [vocab].
int32_t sample_row(const float* logits, int64_t vocab, const RowSampling& p);

}  // namespace lragent
