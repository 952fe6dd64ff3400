// Next-token sampling: greedy, temperature, top-k, top-p (HF order: temperature, top-k, top-p).
// The rules are those of sample_row (backend/sampling_ref.h), so a pick made on a backend's
// device (Backend::sample_rows) and one made here from host logits agree; the Sampler owns the
// seeded generator that draws each sampled row's u.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/sampling_ref.h"

namespace lragent {

struct SamplingParams {
  float temperature = 0.f;  // <= 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;        // 1: off
  uint64_t seed = 0;
};

// vLLM's (and the OpenAI API's) penalties, applied to a row's logits before temperature and
// the pick: for each token id t, with c_t its count among the generated tokens,
//   repetition (HF's CTRL rule, over the prompt and the generated tokens): if t occurs,
//     logit_t = logit_t > 0 ? logit_t / repetition : logit_t * repetition
//   frequency and presence (generated tokens only): logit_t -= frequency * c_t + presence * [c_t > 0]
struct PenaltyParams {
  float repetition = 1.f;  // 1: off
  float frequency = 0.f;
  float presence = 0.f;
  bool active() const { return repetition != 1.f || frequency != 0.f || presence != 0.f; }
};
// logits [vocab]; prompt and generated hold ids (ids outside [0, vocab) are ignored).
void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt, std::span<const int32_t> generated,
                     const PenaltyParams& p);

// A generated token's log-probability and the most likely tokens of its row: the raw model
// output, log_softmax of the logits before penalties and temperature (vLLM's default
// logprobs_mode, "raw_logprobs").
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
};
struct StepLogprobs {
  float logprob = 0.f;            // of the token taken
  std::vector<TokenLogprob> top;  // the `top` most likely, highest first (ties: lower id first)
  // 1 + the number of tokens more likely than the one taken (vLLM's rank); 0 when not asked for.
  int32_t rank = 0;
};
// log_softmax over logits [vocab] (in double), the value at `token` and the top `top` entries.
// NaN logits count as -inf (never among the top).
// with_rank: StepLogprobs::rank too (a prompt token's, as vLLM's prompt_logprobs give it).
StepLogprobs step_logprobs(std::span<const float> logits, int32_t token, int top, bool with_rank = false);

class Sampler {
 public:
  explicit Sampler(SamplingParams p) : p_(p), rng_(p.seed) {}
  // The parameters of the next sampled row, with its u drawn from the seeded generator (one
  // std::mt19937_64 draw per row; greedy rows draw nothing and get u = 0).
  RowSampling next_row();
  // The rows the next n next_row() calls will give, drawing nothing (a speculative pass's draft
  // rows: each is drawn, by next_row(), only once its token is taken).
  std::vector<RowSampling> peek_rows(int n) const;
  // next_row() applied to host logits [vocab]: sample_row(logits, vocab, next_row()).
  int32_t sample(const float* logits, int vocab);
  // Greedy: ties go to the lowest id (torch.argmax does the same), NaN never picked.
  static int32_t argmax(const float* logits, int vocab) { return argmax_row(logits, vocab); }
  bool greedy() const { return !(p_.temperature > 0.f); }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace lragent
