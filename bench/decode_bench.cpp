// CPU decode throughput of the tiny TinyStories model (falls back to the synthetic model when
// ../shared is not beside the checkout). Reports tokens/s as a counter.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "engine/generator.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

std::unique_ptr<LlamaModel> load_bench_model(Backend& be) {
  const std::string dir = std::string(LRAGENT_SOURCE_DIR) + "/../shared/models/tinystories-656k";
  if (std::filesystem::exists(dir + "/config.json")) {
    auto m = LlamaModel::load(dir, be);
    if (m.ok()) return std::move(*m);
  }
  auto m = make_synthetic_model(SyntheticSpec{}, be);
  return m.ok() ? std::move(*m) : nullptr;
}

void BM_Decode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  auto be = make_cpu_backend(1);
  auto model = load_bench_model(*be);
  if (!model) {
    state.SkipWithError("no model");
    return;
  }
  std::vector<GenerateRequest> reqs(static_cast<size_t>(batch));
  for (auto& r : reqs) {
    r.prompt = {1, 100, 200, 300};
    r.max_tokens = 128;
  }
  Generator gen(*model, EngineOptions{});
  int64_t tokens = 0;
  for (auto _ : state) {
    auto res = gen.run(reqs);
    if (!res.ok()) {
      state.SkipWithError(res.error().message.c_str());
      return;
    }
    for (const auto& r : *res) tokens += static_cast<int64_t>(r.output.size());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace lragent

BENCHMARK_MAIN();
