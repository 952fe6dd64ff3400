#include "engine/generator.h"

#include <algorithm>
#include <optional>

#include "engine/guide/token_guide.h"
#include "engine/suffix_decoding.h"

namespace lragent {
namespace {

struct Running {
  size_t index = 0;
  std::unique_ptr<FullKvCache> kv;
  std::vector<int32_t> tokens;  // prompt then generated tokens
  int64_t processed = 0;        // tokens already in the cache
  Sampler sampler;
  int32_t guide_state = 0;  // the request's guide's state after its output so far
  bool speculates = false;  // EngineOptions::speculative on: its decode passes check drafts
  std::vector<int32_t> spec;  // [1 + drafts] the pending pass's tokens when it checks drafts
  bool done = false;
  explicit Running(SamplingParams p) : sampler(p) {}
};

}  // namespace

Generator::Generator(LlamaModel& model, EngineOptions opts) : model_(model), opts_(opts) {
  SpeculativeOptions& so = opts_.speculative;
  if (so.on() && so.method == SpeculativeMethod::kSuffix && !so.corpus) {
    corpus_ = std::make_unique<SuffixCorpus>(so.max_cached_requests);
    so.corpus = corpus_.get();
  }
}

Generator::~Generator() = default;

Result<std::vector<GenerateResult>> Generator::run(const std::vector<GenerateRequest>& reqs,
                                                   const std::function<void(size_t, int32_t)>& on_token) {
  const ModelConfig& cfg = model_.config();
  int64_t blocks = opts_.kv_blocks;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].prompt.empty())
      return make_error(ErrorCode::kInvalidArgument, "request {}: the prompt is empty", i);
    // max_tokens <= 0 generates nothing: it must not shrink the pool the other requests share.
    const int64_t need = static_cast<int64_t>(reqs[i].prompt.size()) + std::max(reqs[i].max_tokens, 0);
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
    if (reqs[i].guide) r.guide_state = reqs[i].guide->start();
    r.speculates = opts_.speculative.on();
    r.done = reqs[i].max_tokens <= 0;
    if (r.done) results[i].finish_reason = "length";  // nothing to generate: the length is reached
    run.push_back(std::move(r));
  }
  // A pass still in flight when run() returns early (an error) has its picks dropped first, and
  // before the caches it writes go (declared after them: destroyed before them).
  struct DropPending {
    LlamaModel& m;
    ~DropPending() { m.discard_picks(); }
  } drop_pending{model_};

  // One forward pass: its sequences, and which rows yield a token.
  struct Pass {
    std::vector<SeqInput> batch;
    std::vector<Running*> members;
    std::vector<char> samples;  // [batch] row b's pick is a token of its sequence
    std::vector<int> drafts;    // [batch] drafts sequence b's pass checks (its rows: 1 + drafts)
  };
  // A pick becomes a token: appended, streamed, checked against the stops. A sequence that
  // finished on the pass before (after this one was launched with it) drops its pick.
  std::vector<float> masked;  // [vocab] a guided row
  auto accept = [&](Running& r, int32_t tok, const float* logits_row) -> Status {
    GenerateResult& res = results[r.index];
    const GenerateRequest& req = reqs[r.index];
    if (logits_row) {
      if (req.keep_first_logits && res.output.empty()) res.first_logits.assign(logits_row, logits_row + cfg.vocab_size);
      if (req.guide) {
        masked.assign(logits_row, logits_row + cfg.vocab_size);
        if (req.guide->mask(r.guide_state, masked, req.stop_ids) == 0)
          return make_error(ErrorCode::kInvalidArgument,
                            "request {}: the structured output cannot go on after {} tokens: {}", r.index,
                            res.output.size(), req.guide->dead_end());
        logits_row = masked.data();
      }
      tok = r.sampler.sample(logits_row, cfg.vocab_size);  // the same rules as the device pick
    }
    res.output.push_back(tok);
    r.tokens.push_back(tok);
    if (on_token) on_token(r.index, tok);
    const bool stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), tok) != req.stop_ids.end();
    if (req.guide && !stop) r.guide_state = req.guide->advance(r.guide_state, tok);
    if (stop) {
      res.finish_reason = "stop";
      r.done = true;
    } else if (static_cast<int>(res.output.size()) >= req.max_tokens) {
      res.finish_reason = "length";
      r.done = true;
    } else if (req.guide && !req.guide->can_continue(r.guide_state)) {
      res.finish_reason = "stop";  // a whole match nothing extends
      r.done = true;
    }
    if (r.done) {
      r.kv.reset();  // give the blocks back to the pool for other sequences
      remember_output(opts_.speculative, res.output);  // the suffix method's corpus
    }
    return Status::Ok();
  };
  auto take = [&](const Pass& p) -> Status {
    LRA_ASSIGN_OR_RETURN(std::vector<int32_t> picked, model_.take_picks());
    for (size_t b = 0; b < p.batch.size(); ++b)
      if (p.samples[b] && !p.members[b]->done) LRA_RETURN_IF_ERROR(accept(*p.members[b], picked[b], nullptr));
    return Status::Ok();
  };

  // Decode lookahead (opts_.decode_lookahead): the pass after a launched one is built and launched
  // before the launched one's picks are taken; a sequence whose token that pass will pick takes
  // it on the device (SeqInput::feed_row). The host's work for a step then overlaps the device's
  // work for the step before. A sequence that stops on a token wastes its row of the next pass.
  std::optional<Pass> inflight;
  for (;;) {
    // Schedule: decode steps first (one token each), then prompt chunks within the budget.
    std::vector<int> fed_from(run.size(), -1);  // [run] row of the in-flight pass picking r's next token
    if (inflight)
      for (size_t b = 0; b < inflight->batch.size(); ++b)
        if (inflight->samples[b] && !inflight->members[b]->done)
          fed_from[inflight->members[b]->index] = static_cast<int>(b);
    Pass next;
    int64_t budget = opts_.max_batch_tokens;
    int64_t decoding_now = 0;  // sequences this pass decodes (SpeculativeOptions::disable_by_batch_size)
    for (const Running& r : run)
      decoding_now += !r.done && (fed_from[r.index] >= 0 || static_cast<int64_t>(r.tokens.size()) - r.processed == 1);
    const int spec_cap = opts_.speculative.disable_by_batch_size;
    const bool drafts_ok = spec_cap == 0 || decoding_now <= spec_cap;
    for (int pass = 0; pass < 2; ++pass) {
      for (Running& r : run) {
        if (r.done) continue;
        if (fed_from[r.index] >= 0) {
          // Its in-flight pick is its next token; unless that token is its last by length, the
          // step after takes it from the device.
          const auto produced = static_cast<int64_t>(results[r.index].output.size()) + 1;
          if (pass != 0 || produced >= reqs[r.index].max_tokens) continue;
          SeqInput in;
          in.n_tokens = 1;
          in.start_pos = r.processed;
          in.kv = r.kv.get();
          in.adapter = reqs[r.index].adapter;
          in.feed_row = fed_from[r.index];
          next.batch.push_back(in);
          next.members.push_back(&r);
          next.samples.push_back(1);
          next.drafts.push_back(0);
          budget -= 1;
          continue;
        }
        const int64_t pending = static_cast<int64_t>(r.tokens.size()) - r.processed;
        if (pending <= 0) continue;  // its next token is picked in flight, and it is its last
        const bool decoding = pending == 1;
        if ((pass == 0) != decoding || budget <= 0) continue;
        const int64_t take_n = std::min(pending, std::max<int64_t>(budget, 1));
        SeqInput in;
        in.tokens = r.tokens.data() + r.processed;
        in.n_tokens = static_cast<int>(take_n);
        in.start_pos = r.processed;
        in.kv = r.kv.get();
        in.adapter = reqs[r.index].adapter;
        int drafts = 0;
        if (decoding && r.speculates && drafts_ok && !results[r.index].output.empty()) {
          // Drafts past max_tokens could never be kept: the pass's last row gives a token too.
          const int left = reqs[r.index].max_tokens - static_cast<int>(results[r.index].output.size());
          const std::vector<int32_t> d = propose_drafts(r.tokens, opts_.speculative,
                                                        std::min(opts_.speculative.num_tokens, left - 1));
          if (!d.empty()) {
            r.spec.assign(1, r.tokens.back());
            r.spec.insert(r.spec.end(), d.begin(), d.end());
            in.tokens = r.spec.data();
            in.n_tokens = static_cast<int>(r.spec.size());
            in.all_logits = true;
            drafts = static_cast<int>(d.size());
          }
        }
        next.batch.push_back(in);
        next.members.push_back(&r);
        next.samples.push_back(r.processed + take_n >= static_cast<int64_t>(r.tokens.size()) ? 1 : 0);
        next.drafts.push_back(drafts);
        budget -= take_n + drafts;
      }
    }
    // Unless some member wants this step's logits (keep_first_logits, or a guide to mask them),
    // the picks are made on the device and only the ids come back. The u of each row that samples is drawn here, on the
    // host; rows of unfinished prompt chunks sample nothing (greedy, no draw, id discarded).
    bool want_logits = false;
    for (size_t b = 0; b < next.batch.size(); ++b) {
      const size_t i = next.members[b]->index;
      want_logits = want_logits ||
                    (next.samples[b] && next.batch[b].feed_row < 0 &&
                     ((reqs[i].keep_first_logits && results[i].output.empty()) || reqs[i].guide != nullptr));
    }
    // A speculating sequence's next pass depends on which drafts this one keeps: no lookahead.
    bool speculating = false;
    for (const Running* m : next.members) speculating = speculating || m->speculates;
    const bool lookahead = opts_.decode_lookahead && !want_logits && !speculating && !next.batch.empty();
    if (inflight && !lookahead) {  // take the launched pass's tokens first, then schedule again
      LRA_RETURN_IF_ERROR(take(*inflight));
      inflight.reset();
      continue;
    }
    if (next.batch.empty()) break;
    // [logits rows] one per row: a pass with drafts has 1 + drafts, the drafts' rows with the
    // draws they would make were the tokens before them taken (drawn only when they are: below).
    std::vector<RowSampling> rows;
    for (size_t b = 0; b < next.batch.size(); ++b) {
      const bool picks = !want_logits && next.samples[b];
      rows.push_back(picks ? next.members[b]->sampler.next_row() : RowSampling{});
      if (next.drafts[b] > 0) {
        const std::vector<RowSampling> ahead = next.members[b]->sampler.peek_rows(next.drafts[b]);
        if (picks) rows.insert(rows.end(), ahead.begin(), ahead.end());
        else rows.insert(rows.end(), ahead.size(), RowSampling{});
      }
    }
    if (lookahead) {
      LRA_RETURN_IF_ERROR(model_.launch_sample(next.batch, rows));
      for (size_t b = 0; b < next.batch.size(); ++b) next.members[b]->processed += next.batch[b].n_tokens;
      if (inflight) LRA_RETURN_IF_ERROR(take(*inflight));
      inflight = std::move(next);
      continue;
    }
    Tensor logits;
    std::vector<int32_t> picked;  // [logits rows] when !want_logits
    if (!want_logits) {
      LRA_ASSIGN_OR_RETURN(picked, model_.forward_sample(next.batch, rows));
    } else {
      LRA_ASSIGN_OR_RETURN(logits, model_.forward(next.batch));
    }
    int64_t at = 0;  // the sequence's first logits row
    for (size_t b = 0; b < next.batch.size(); ++b) {
      Running& r = *next.members[b];
      const int drafts = next.drafts[b];
      const int64_t row = at;
      at += drafts + 1;
      if (drafts > 0) {
        // The pick after the last token, then each next row's while the draft before it was that
        // pick (its entries hold the right token); the entries after the last token taken go.
        // Each row is picked as decoding a token a pass picks it, from the draw it would make (a
        // sampled draft is thus kept with the probability the target gives it: speculative
        // sampling's rule for a one-hot proposal), and a guided row masked in the guide's state
        // after the tokens before it.
        const int64_t first = r.processed;  // the last token's position
        GenerateResult& res = results[r.index];
        res.drafts.passes += 1;
        res.drafts.drafted += drafts;
        int taken = 0;
        for (int j = 0; j <= drafts; ++j) {
          const int64_t rj = row + j;
          const size_t before = res.output.size();
          if (want_logits) {
            LRA_RETURN_IF_ERROR(accept(r, 0, logits.f32() + rj * cfg.vocab_size));  // draws row j's u
          } else {
            if (j > 0) (void)r.sampler.next_row();  // row j's draw, the one its pick was made with
            LRA_RETURN_IF_ERROR(accept(r, picked[static_cast<size_t>(rj)], nullptr));
          }
          const int32_t tok = res.output[before];
          ++taken;
          const bool kept = j < drafts && tok == r.spec[static_cast<size_t>(j) + 1];
          if (kept) ++res.drafts.accepted;
          if (r.done || !kept) break;
        }
        r.processed = first + taken;
        if (r.kv) r.kv->truncate(r.processed);
        continue;
      }
      r.processed += next.batch[b].n_tokens;
      if (!next.samples[b]) continue;  // prompt chunk, no sample yet
      if (!want_logits)
        LRA_RETURN_IF_ERROR(accept(r, picked[static_cast<size_t>(row)], nullptr));
      else
        LRA_RETURN_IF_ERROR(accept(r, 0, logits.f32() + row * cfg.vocab_size));
    }
  }
  return results;
}

}  // namespace lragent
