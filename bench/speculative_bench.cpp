// Host cost of proposing speculative drafts (--speculative-config), per decode pass: n-gram
// lookup (vLLM's defaults, 4 drafts) and suffix decoding (vLLM's defaults: depth 24, up to 32
// drafts, min probability 0.1), over real agent text: the ReAct trajectories of
// ../shared/data/agent-trajectories (LRAGENT_SHARED) tokenized by tinystories' tokenizer, cut to
// 4k and 33k tokens; suffix decoding also with a corpus of 1000 earlier outputs. Skipped when the
// data is not there. The proposal runs on the host before each pass with drafts; a decode step of
// an 8B model is ~4.5 ms on an H200.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/speculative.h"
#include "engine/suffix_decoding.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

// The trajectories' text as tokens (empty when the data is missing).
const std::vector<int32_t>& agent_text() {
  static const std::vector<int32_t> tokens = [] {
    std::vector<int32_t> out;
    const char* env = std::getenv("LRAGENT_SHARED");
    const std::string shared = env ? env : std::string(LRAGENT_SOURCE_DIR) + "/../shared";
    auto tok = Tokenizer::load_dir(shared + "/models/tinystories-656k");
    std::ifstream f(shared + "/data/agent-trajectories/70b_hotpotqa_200.json");
    if (!tok.ok() || !f) return out;
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (!j.is_array()) return out;
    for (const auto& t : j) {
      if (out.size() > 40000) break;
      auto ids = (*tok)->encode(t.dump(), false);
      if (ids.ok()) out.insert(out.end(), ids->begin(), ids->end());
    }
    return out;
  }();
  return tokens;
}

void BM_Ngram(benchmark::State& state) {
  const auto& all = agent_text();
  if (all.size() < static_cast<size_t>(state.range(0))) return state.SkipWithError("no agent trajectories");
  const std::vector<int32_t> ctx(all.begin(), all.begin() + state.range(0));
  SpeculativeOptions o;
  o.num_tokens = 4;
  int64_t drafted = 0;
  for (auto _ : state) drafted += static_cast<int64_t>(propose_ngram(ctx, o, 4).size());
  state.counters["drafts"] = static_cast<double>(drafted) / static_cast<double>(state.iterations());
}

void BM_Suffix(benchmark::State& state) {
  const auto& all = agent_text();
  if (all.size() < static_cast<size_t>(state.range(0))) return state.SkipWithError("no agent trajectories");
  const std::vector<int32_t> ctx(all.begin(), all.begin() + state.range(0));
  SpeculativeOptions o;
  o.method = SpeculativeMethod::kSuffix;
  o.num_tokens = 32;
  std::unique_ptr<SuffixCorpus> corpus;
  if (state.range(1) > 0) {  // 1000 outputs of 40 tokens from the text
    corpus = std::make_unique<SuffixCorpus>(10000);
    for (size_t k = 0; k < 1000; ++k) {
      const size_t at = (k * 37) % (all.size() - 40);
      corpus->add(std::vector<int32_t>(all.begin() + static_cast<ptrdiff_t>(at), all.begin() + static_cast<ptrdiff_t>(at + 40)));
    }
  }
  int64_t drafted = 0;
  for (auto _ : state) drafted += static_cast<int64_t>(propose_suffix(ctx, o, corpus.get(), 32).size());
  state.counters["drafts"] = static_cast<double>(drafted) / static_cast<double>(state.iterations());
}

BENCHMARK(BM_Ngram)->Arg(4096)->Arg(33700)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Suffix)->Args({4096, 0})->Args({33700, 0})->Args({33700, 1})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lragent
