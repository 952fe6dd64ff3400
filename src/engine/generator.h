// Batched generation with a simple continuous-batching scheduler: every step runs one
// forward pass over all running sequences, decoding sequences contribute their last token
// and waiting prompts are prefilled in chunks within a token budget, so prefill and decode
// share a batch.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "kv/full_cache.h"
#include "model/llama.h"

namespace lragent {

namespace guide {
class TokenGuide;
}

struct GenerateRequest {
  std::vector<int32_t> prompt;        // ids, BOS included when wanted
  int max_tokens = 64;
  SamplingParams sampling;
  const LoraAdapter* adapter = nullptr;
  std::vector<int32_t> stop_ids;      // e.g. EOS; generation ends after emitting one
  bool keep_first_logits = false;     // keep the logits of the first generated token
  // Structured output (engine/guide/token_guide.h): every pick keeps the text a prefix of the
  // guide's language, a stop id may end it only at a whole match, and a whole match nothing
  // extends ends the request ("stop"). Its steps pick on the host (no decode lookahead). Not
  // owned; it may serve several requests (each keeps its own state), all on run()'s thread.
  guide::TokenGuide* guide = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> output;
  std::vector<float> first_logits;    // [vocab] when requested
  std::string finish_reason;          // "length" | "stop"
  DraftCounts drafts;                 // speculative decoding's (EngineOptions::speculative)
};

struct EngineOptions {
  int page_size = 16;
  int64_t kv_blocks = 0;              // 0: enough for every request's prompt + max_tokens
  int64_t max_batch_tokens = 512;     // token budget of one forward step
  // Build and launch each decode step before the previous step's tokens are read back, the new
  // step taking them on the device (LlamaModel::launch_sample): the host's per-step work overlaps
  // the GPU's. The tokens are the same either way.
  bool decode_lookahead = true;
  // Speculative decoding by n-gram lookup (engine/speculative.h) for every request: each decode
  // pass also checks drafts from the request's own tokens, so one pass may give several tokens,
  // the same ones (sampled and guided requests' too: each row is picked with the draw and the
  // guide state of one pass a token). Requests then decode without lookahead.
  SpeculativeOptions speculative;
};

class Generator {
 public:
  // Method suffix without a corpus given: the Generator keeps its own, of its finished outputs.
  Generator(LlamaModel& model, EngineOptions opts);
  ~Generator();
  // Runs all requests to completion. `on_token(request_index, token)` streams tokens.
  Result<std::vector<GenerateResult>> run(const std::vector<GenerateRequest>& reqs,
                                          const std::function<void(size_t, int32_t)>& on_token = {});

 private:
  LlamaModel& model_;
  EngineOptions opts_;
  std::unique_ptr<SuffixCorpus> corpus_;  // opts_.speculative.corpus when none was given
};

}  // namespace lragent
