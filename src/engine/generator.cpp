#include "engine/generator.h"

#include <algorithm>

namespace lragent {
namespace {

struct Running {
  size_t index = 0;
  std::unique_ptr<FullKvCache> kv;
  std::vector<int32_t> tokens;  // prompt then generated tokens
  int64_t processed = 0;        // tokens already in the cache
  Sampler sampler;
  bool done = false;
  explicit Running(SamplingParams p) : sampler(p) {}
};

}  // namespace

Result<std::vector<GenerateResult>> Generator::run(const std::vector<GenerateRequest>& reqs,
                                                   const std::function<void(size_t, int32_t)>& on_token) {
  const ModelConfig& cfg = model_.config();
  int64_t blocks = opts_.kv_blocks;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].prompt.empty())
      return make_error(ErrorCode::kInvalidArgument, "request {}: the prompt is empty", i);
    const int64_t need = static_cast<int64_t>(reqs[i].prompt.size()) + reqs[i].max_tokens;
    if (cfg.max_position_embeddings > 0 && need > cfg.max_position_embeddings)
      return make_error(ErrorCode::kInvalidArgument,
                        "request {}: prompt ({} tokens) + max tokens ({}) exceeds the model's context of {} tokens; "
                        "shorten the prompt or lower --max-tokens",
                        i, reqs[i].prompt.size(), reqs[i].max_tokens, cfg.max_position_embeddings);
    if (opts_.kv_blocks == 0) blocks += KvPools::blocks_for(1, need, opts_.page_size);
  }
  LRA_ASSIGN_OR_RETURN(KvPools pools, KvPools::create(cfg, opts_.page_size, std::max<int64_t>(blocks, 1), "generate",
                                                      pool_backend(model_.backend())));

  std::vector<GenerateResult> results(reqs.size());
  std::vector<Running> run;
  run.reserve(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    Running r(reqs[i].sampling);
    r.index = i;
    r.kv = std::make_unique<FullKvCache>(pools.k.get(), pools.v.get());
    r.tokens = reqs[i].prompt;
    r.done = reqs[i].max_tokens <= 0;
    run.push_back(std::move(r));
  }

  for (;;) {
    // Schedule: decode steps first (one token each), then prompt chunks within the budget.
    std::vector<SeqInput> batch;
    std::vector<Running*> members;
    int64_t budget = opts_.max_batch_tokens;
    for (int pass = 0; pass < 2; ++pass) {
      for (Running& r : run) {
        if (r.done) continue;
        const int64_t pending = static_cast<int64_t>(r.tokens.size()) - r.processed;
        const bool decoding = pending == 1;
        if ((pass == 0) != decoding || budget <= 0) continue;
        const int64_t take = std::min(pending, std::max<int64_t>(budget, 1));
        SeqInput in;
        in.tokens = r.tokens.data() + r.processed;
        in.n_tokens = static_cast<int>(take);
        in.start_pos = r.processed;
        in.kv = r.kv.get();
        in.adapter = reqs[r.index].adapter;
        batch.push_back(in);
        members.push_back(&r);
        budget -= take;
      }
    }
    if (batch.empty()) break;
    // Greedy everywhere and no logits wanted: pick on the device, only the ids come back.
    bool device_greedy = true;
    for (const Running* r : members) {
      const GenerateRequest& req = reqs[r->index];
      device_greedy = device_greedy && req.sampling.temperature <= 0.f &&
                      !(req.keep_first_logits && results[r->index].output.empty());
    }
    Tensor logits;
    std::vector<int32_t> picked;  // [batch] when device_greedy
    if (device_greedy) {
      LRA_ASSIGN_OR_RETURN(picked, model_.forward_argmax(batch));
    } else {
      LRA_ASSIGN_OR_RETURN(logits, model_.forward(batch));
    }
    for (size_t b = 0; b < batch.size(); ++b) {
      Running& r = *members[b];
      r.processed += batch[b].n_tokens;
      if (r.processed < static_cast<int64_t>(r.tokens.size())) continue;  // prompt chunk, no sample yet
      GenerateResult& res = results[r.index];
      const GenerateRequest& req = reqs[r.index];
      int32_t tok = 0;
      if (device_greedy) {
        tok = picked[b];
      } else {
        const float* row = logits.f32() + static_cast<int64_t>(b) * cfg.vocab_size;
        if (req.keep_first_logits && res.output.empty()) res.first_logits.assign(row, row + cfg.vocab_size);
        tok = r.sampler.sample(row, cfg.vocab_size);
      }
      res.output.push_back(tok);
      r.tokens.push_back(tok);
      if (on_token) on_token(r.index, tok);
      if (std::find(req.stop_ids.begin(), req.stop_ids.end(), tok) != req.stop_ids.end()) {
        res.finish_reason = "stop";
        r.done = true;
      } else if (static_cast<int>(res.output.size()) >= req.max_tokens) {
        res.finish_reason = "length";
        r.done = true;
      }
      if (r.done) r.kv.reset();  // give the blocks back to the pool for other sequences
    }
  }
  return results;
}

}  // namespace lragent
