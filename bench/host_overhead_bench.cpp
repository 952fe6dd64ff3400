// Host cost of the model's forward code for one decode step, with every kernel a no-op: what a
// GPU backend adds on top of its kernels before a recorded step can launch (the GPU idles through
// it, since each step waits for the previous step's token). A backend whose compute ops do
// nothing runs a 32-layer model of tiny widths (the per-layer host work does not depend on widths),
// with and without a LoRA adapter on q/v.
#include <benchmark/benchmark.h>

#include "kv/full_cache.h"
#include "model/lora.h"
#include "model/presets.h"

namespace lragent {
namespace {

// Memory and data movement from the CPU backend; every compute op does nothing.
class NullComputeBackend : public Backend {
 public:
  NullComputeBackend() : cpu_(make_cpu_backend(1)) {}
  std::string name() const override { return "null-compute"; }
  Device device() const override { return Device::kCpu; }
  Tensor upload(const TensorView& host, DType dtype) override { return cpu_->upload(host, dtype); }
  void fill_random(TensorView& t, uint64_t seed, float stddev) override {}
  void fill(TensorView& t, float value) override {}
  Tensor alloc(DType t, Dims shape) override { return cpu_->alloc(t, std::move(shape)); }
  void copy(const TensorView& src, TensorView& dst) override {}
  void gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) override {}
  Tensor to_host(const TensorView& src) override { return cpu_->to_host(src); }
  void matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y, float alpha,
              float beta) override {}
  void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) override {}
  void rope(TensorView& x, const int32_t* positions, const float* inv_freq) override {}
  void silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) override {}
  void add(TensorView& y, const TensorView& x) override {}
  void embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) override {}
  void store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) override {}
  void attention(const AttentionParams& p) override {}
  void argmax_rows(const TensorView& x, int32_t* out) override { out[0] = 0; }

 private:
  std::unique_ptr<Backend> cpu_;
};

void BM_DecodeStepHostOverhead(benchmark::State& state) {
  const bool lora = state.range(0) != 0;
  NullComputeBackend be;
  auto preset = model_preset("tiny");
  if (!preset.ok()) return state.SkipWithError(preset.error().message.c_str());
  preset->config.num_layers = 32;  // Llama-3.1-8B's layer count
  auto model = make_preset_model(*preset, be);
  if (!model.ok()) return state.SkipWithError(model.error().message.c_str());
  const ModelConfig& c = (*model)->config();
  auto adapters = make_preset_adapters(c, 8, true, 7);
  for (auto& a : adapters)
    if (Status st = upload_adapter(*a, be); !st.ok()) return state.SkipWithError(st.error().message.c_str());
  const int page = 16, ctx = 4096;
  auto pools = KvPools::create(c, page, KvPools::blocks_for(1, ctx + 4096, page), "bench", &be);
  if (!pools.ok()) return state.SkipWithError(pools.error().message.c_str());
  FullKvCache kv(pools->kv.get());
  if (Status st = kv.reserve(ctx); !st.ok()) return state.SkipWithError(st.error().message.c_str());
  int32_t tok = 1;
  int64_t pos = ctx;
  for (auto _ : state) {
    SeqInput d{&tok, 1, pos, &kv, lora ? adapters[0].get() : nullptr, false};
    auto ids = (*model)->forward_argmax({d});
    if (!ids.ok()) return state.SkipWithError(ids.error().message.c_str());
    if (++pos >= ctx + 4000) pos = ctx;
  }
}
BENCHMARK(BM_DecodeStepHostOverhead)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lragent
