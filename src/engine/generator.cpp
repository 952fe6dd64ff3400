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
    r.kv = std::make_unique<FullKvCache>(pools.kv.get());
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
    // Unless some member wants this step's logits (keep_first_logits), the picks are made on the
    // device and only the ids come back. The u of each row that samples is drawn here, on the
    // host; rows of unfinished prompt chunks sample nothing (greedy, no draw, id discarded).
    auto samples = [&](size_t b) {
      return members[b]->processed + batch[b].n_tokens >= static_cast<int64_t>(members[b]->tokens.size());
    };
    bool want_logits = false;
    for (size_t b = 0; b < batch.size(); ++b) {
      const size_t i = members[b]->index;
      want_logits = want_logits || (samples(b) && reqs[i].keep_first_logits && results[i].output.empty());
    }
    Tensor logits;
    std::vector<int32_t> picked;  // [batch] when !want_logits
    if (!want_logits) {
      std::vector<RowSampling> rows(batch.size());  // [batch] one per logits row
      for (size_t b = 0; b < batch.size(); ++b)
        if (samples(b)) rows[b] = members[b]->sampler.next_row();
      LRA_ASSIGN_OR_RETURN(picked, model_.forward_sample(batch, rows));
    } else {
      LRA_ASSIGN_OR_RETURN(logits, model_.forward(batch));
    }
    for (size_t b = 0; b < batch.size(); ++b) {
      Running& r = *members[b];
      const bool sampled = samples(b);
      r.processed += batch[b].n_tokens;
      if (!sampled) continue;  // prompt chunk, no sample yet
      GenerateResult& res = results[r.index];
      const GenerateRequest& req = reqs[r.index];
      int32_t tok = 0;
      if (!want_logits) {
        tok = picked[b];
      } else {
        const float* row = logits.f32() + static_cast<int64_t>(b) * cfg.vocab_size;
        if (req.keep_first_logits && res.output.empty()) res.first_logits.assign(row, row + cfg.vocab_size);
        tok = r.sampler.sample(row, cfg.vocab_size);  // the same rules as the device pick
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
