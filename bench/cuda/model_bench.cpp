// Whole-model benchmark on the CUDA backend: a synthetic model with the real shapes of a
// published checkpoint (model/presets.h; weights generated on the device), run through the
// engine's own forward pass (LlamaModel + paged KV cache), as a user's request would be.
//   prefill  one sequence of --prefill tokens: time, TFLOP/s (linear layers + causal attention +
//            the last token's LM head), to compare with the bf16 GEMM ceiling measured in the
//            same gpu-check run;
//   decode   batch 1 at --ctx tokens of context: median step time (forward + greedy pick on the
//            device, the id to the host: LlamaModel::forward_argmax, as the engine's greedy
//            decode does) against (weight bytes read + KV bytes read) / copy bandwidth;
//            also with a LoRA r16 adapter on q/v: base-lr sharing (Flash-LoRA attention) and a
//            private full cache (Non-Shared); and with decode lookahead (the Generator's way:
//            each step launched before the previous step's id is read back).
//   batch    with --batch N: N sequences of --ctx tokens each decoding together (the base model,
//            greedy): median step time of the N-row pass, as `lragent serve` runs N clients'
//            decode steps (products of up to 8 rows take the decode GEMVs, more take cuBLASLt).
// Writes JSON (--out); make_report.py folds it into bench/results/kernels-*.{json,md}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "kv/full_cache.h"
#include "kv/sharing.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/presets.h"

using namespace lragent;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Host time of recording one pass between two graph_stats() snapshots (the forward code before
// its graph launches): the GPU is idle through it, since each step waits for the previous token.
double record_ms_per_pass(const GraphStats& before, const GraphStats& after) {
  const int64_t passes = after.recorded - before.recorded;
  return passes > 0 ? (after.record_host_ms - before.record_host_ms) / static_cast<double>(passes) : 0.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int32_t> token_ids(int64_t n, int vocab, uint32_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));  // [n] deterministic ids spread over the vocabulary
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + salt * 104729 + 11) % vocab);
  return ids;
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

int fail(const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset_name = "llama3.1-8b", out_path;
  int64_t ctx = 4096, prefill = 8192;
  int steps = 32, reps = 3;
  bool eager = false, base_decode = true;
  int batch = 0;  // --batch: rows of the batched decode measurement (0: none)
  bool batch_icarus = false;  // --batch-icarus: those sequences in ICaRus mode (two rows each a step)
  std::vector<ShareMode> lora_modes;  // empty: base-lr, none and icarus
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--preset") preset_name = val();
    else if (a == "--ctx") ctx = std::stoll(val());
    else if (a == "--prefill") prefill = std::stoll(val());
    else if (a == "--steps") steps = std::stoi(val());
    else if (a == "--reps") reps = std::stoi(val());
    else if (a == "--out") out_path = val();
    else if (a == "--quick") { steps = 8; reps = 1; }
    else if (a == "--eager") eager = true;
    else if (a == "--no-base-decode") base_decode = false;
    else if (a == "--batch") batch = std::stoi(val());
    else if (a == "--batch-icarus") batch_icarus = true;
    else if (a == "--lora-mode") {
      auto m = parse_share_mode(val());
      if (!m.ok()) return fail(m.error());
      if (*m != ShareMode::kBaseLr && *m != ShareMode::kNone && *m != ShareMode::kIcarus) {
        std::fprintf(stderr, "error: --lora-mode takes base-lr, none or icarus\n");
        return 2;
      }
      lora_modes.push_back(*m);
    } else {
      std::fprintf(stderr,
                   "usage: lragent_model_bench [--preset NAME] [--ctx N] [--prefill N] [--steps N] [--reps N] "
                   "[--out FILE.json] [--quick] [--eager] [--no-base-decode] [--lora-mode MODE ...] [--batch N]\n"
                   "  --prefill 0 skips the prefill measurement; --eager launches decode op by op (no CUDA graphs)\n"
                   "  --batch N also times decode steps of N sequences of --ctx tokens together (base model;\n"
                   "  --batch-icarus: each an ICaRus sequence, a LoRA r16 q/v decoder over the base model's cache)\n"
                   "  --no-base-decode skips the base model's decode steps; --lora-mode (repeatable) picks the\n"
                   "  LoRA decode measurements (base-lr, none, icarus; default all three). With\n"
                   "  LRAGENT_CUDA_PROFILE=1 and --eager, these isolate one kind of step's ops.\n");
      return a == "--help" ? 0 : 2;
    }
  }
  auto preset = model_preset(preset_name);
  if (!preset.ok()) return fail(preset.error());
  CudaBackendOptions bo;
  bo.graphs = !eager;
  auto be_r = make_cuda_backend(bo);
  if (!be_r.ok()) return fail(be_r.error());
  Backend& be = **be_r;
  const double t_load = now_ms();
  auto model_r = make_preset_model(*preset, be);
  if (!model_r.ok()) return fail(model_r.error());
  LlamaModel& model = **model_r;
  be.synchronize();
  const ModelConfig& c = model.config();
  std::printf("model %s on %s: %d layers, hidden %d, generated in %.0f ms; device memory in use %.2f GB\n",
              preset_name.c_str(), be.name().c_str(), c.num_layers, c.hidden_size, now_ms() - t_load,
              be.memory_stats().in_use / 1e9);

  const int64_t h = c.hidden_size, kvw = static_cast<int64_t>(c.num_kv_heads) * c.head_dim,
                qw = static_cast<int64_t>(c.num_heads) * c.head_dim, inter = c.intermediate_size;
  const double linear_params = static_cast<double>(c.num_layers) * (h * qw * 2 + h * kvw * 2 + 3.0 * h * inter);
  const double head_params = static_cast<double>(h) * c.vocab_size;
  const int page = 16;
  constexpr int kDrafts = 4;  // a speculative verify pass: the last token and 4 drafts
  // greedy, sampled, lookahead steps, then the verify passes
  const int64_t max_tokens = std::max(prefill, ctx + 3 * (steps + 2) + 2 + (kDrafts + 1) * (steps + 2));
  auto pools = KvPools::create(c, page, KvPools::blocks_for(1, max_tokens, page), "bench", &be);
  if (!pools.ok()) return fail(pools.error());

  std::string json = fmt::format(R"({{"preset": "{}", "backend": "{}", "layers": {}, "hidden": {}, "vocab": {})",
                                 preset_name, be.name(), c.num_layers, c.hidden_size, c.vocab_size);

  json += fmt::format(R"(, "graphs": {})", eager ? "false" : "true");
  // ---- prefill of `prefill` tokens in one chunk
  if (prefill > 0) {
    const auto ids = token_ids(prefill, c.vocab_size, 1);
    std::vector<double> ms;
    for (int r = 0; r < reps + 1; ++r) {  // the first run warms cuBLASLt plans and the allocator
      FullKvCache kv(pools->kv.get());
      SeqInput in{ids.data(), static_cast<int>(prefill), 0, &kv, nullptr, false};
      be.synchronize();
      const double t0 = now_ms();
      auto logits = model.forward({in});
      if (!logits.ok()) return fail(logits.error());
      be.synchronize();
      if (r > 0) ms.push_back(now_ms() - t0);
    }
    double keys = 0;
    for (int64_t i = 0; i < prefill; ++i) keys += static_cast<double>(i + 1);
    const double attn_flops = 4.0 * c.head_dim * c.num_heads * keys * c.num_layers;
    const double flops = 2.0 * linear_params * prefill + attn_flops + 2.0 * head_params;
    const double t = median(ms);
    std::printf("prefill %lld tokens: %.2f ms, %.1f TFLOP/s (%.2f of them attention)\n",
                static_cast<long long>(prefill), t, flops / (t * 1e-3) / 1e12, attn_flops / flops);
    json += fmt::format(R"(, "prefill": {{"tokens": {}, "median_ms": {:.4f}, "flops": {:.6e}, "tflops": {:.2f}}})",
                        prefill, t, flops, flops / (t * 1e-3) / 1e12);
  }

  // ---- decode at `ctx` tokens of context, batch 1: base model and a LoRA r16 agent (base-lr)
  const double weight_bytes = (linear_params + head_params) * static_cast<double>(dtype_size(be.weight_dtype()));
  const double cache_bytes = 2.0 * static_cast<double>(c.num_layers) * static_cast<double>(ctx) * kvw *
                             static_cast<double>(dtype_size(be.cache_dtype()));
  if (base_decode) {
    FullKvCache kv(pools->kv.get());
    const auto ids = token_ids(ctx, c.vocab_size, 2);
    SeqInput in{ids.data(), static_cast<int>(ctx), 0, &kv, nullptr, false};
    auto first = model.forward({in});
    if (!first.ok()) return fail(first.error());
    int32_t tok = argmax(first->f32(), c.vocab_size);
    std::vector<double> ms;
    GraphStats g0;
    for (int s = 0; s < steps + 2; ++s) {
      be.synchronize();
      if (s == 2) g0 = be.graph_stats();
      const double t0 = now_ms();
      SeqInput d{&tok, 1, ctx + s, &kv, nullptr, false};
      auto ids = model.forward_argmax({d});  // the greedy pick comes back, not the logits
      if (!ids.ok()) return fail(ids.error());
      tok = ids->front();
      if (s >= 2) ms.push_back(now_ms() - t0);
    }
    const double t = median(ms);
    const double host_ms = record_ms_per_pass(g0, be.graph_stats());
    std::printf("decode batch 1 at %lld context: %.3f ms/step (%.1f tok/s; host recording %.3f ms of it); "
                "weights %.2f GB + KV %.3f GB\n",
                static_cast<long long>(ctx), t, 1e3 / t, host_ms, weight_bytes / 1e9, cache_bytes / 1e9);
    json += fmt::format(
        R"(, "decode": {{"ctx": {}, "median_ms": {:.4f}, "host_record_ms": {:.4f}, "weight_bytes": {:.6e}, )"
        R"("cache_bytes": {:.6e}, "steps": {}}})",
        ctx, t, host_ms, weight_bytes, cache_bytes, steps);
    // As many steps again, continuing the sequence (decode appends at the end: re-running earlier
    // positions would leave the tuned attention kernels), with a sampled pick on the device
    // (temperature 0.8, top-p 0.95, one host draw per step): what such sampling adds to a step.
    Sampler sampler({0.8f, 0, 0.95f, 11});
    std::vector<double> ms_s;
    for (int s = 0; s < steps + 2; ++s) {
      const RowSampling rs = sampler.next_row();
      be.synchronize();
      const double t0 = now_ms();
      SeqInput d{&tok, 1, ctx + steps + 2 + s, &kv, nullptr, false};
      auto ids = model.forward_sample({d}, std::span<const RowSampling>(&rs, 1));
      if (!ids.ok()) return fail(ids.error());
      tok = ids->front();
      if (s >= 2) ms_s.push_back(now_ms() - t0);
    }
    const double ts = median(ms_s);
    const char* env = std::getenv("LRAGENT_CUDA_DEVICE_SAMPLING");
    const bool on_host = env && std::string(env) == "0";
    std::printf("decode batch 1 at %lld context, sampled (T 0.8, top-p 0.95) on the %s: %.3f ms/step\n",
                static_cast<long long>(ctx), on_host ? "host" : "device", ts);
    json += fmt::format(R"(, "decode_sampled": {{"ctx": {}, "median_ms": {:.4f}}})", ctx, ts);
    // Greedy again, continuing the sequence, with decode lookahead (as the Generator decodes):
    // step s + 1 is recorded and launched, its token read on the device from step s's pick,
    // before step s's id is read back, so the host's recording overlaps the GPU's step.
    const std::vector<RowSampling> greedy(1);
    int64_t pos = ctx + 2 * (steps + 2);
    {
      SeqInput d{&tok, 1, pos++, &kv, nullptr, false};
      if (Status st = model.launch_sample({d}, greedy); !st.ok()) return fail(st.error());
    }
    std::vector<double> ms_l;
    for (int s = 0; s < steps + 2; ++s) {
      const double t0 = now_ms();
      SeqInput d{nullptr, 1, pos++, &kv, nullptr, false};
      d.feed_row = 0;
      if (Status st = model.launch_sample({d}, greedy); !st.ok()) return fail(st.error());
      auto ids = model.take_picks();  // the step before's id
      if (!ids.ok()) return fail(ids.error());
      tok = ids->front();
      if (s >= 2) ms_l.push_back(now_ms() - t0);
    }
    if (auto last = model.take_picks(); !last.ok()) return fail(last.error());
    const double tl = median(ms_l);
    std::printf("decode batch 1 at %lld context, with decode lookahead (the Generator's way): %.3f ms/step\n",
                static_cast<long long>(ctx), tl);
    json += fmt::format(R"(, "decode_lookahead": {{"ctx": {}, "median_ms": {:.4f}}})", ctx, tl);
    // A speculative decoding pass (--speculative-config): the last token and kDrafts drafts, a
    // greedy pick for each of their rows on the device (all_logits), as the engine checks n-gram
    // drafts. Its time over a decode step's is the break-even: the drafts a pass must keep on
    // average to pay for itself (each kept draft is a token without a pass of its own).
    {
      std::vector<int32_t> toks(kDrafts + 1);
      const std::vector<RowSampling> rows(kDrafts + 1);
      std::vector<double> ms_v;
      for (int s = 0; s < steps + 2; ++s) {
        for (int j = 0; j <= kDrafts; ++j) toks[static_cast<size_t>(j)] = (tok + 37 * j) % c.vocab_size;
        be.synchronize();
        const double t0 = now_ms();
        SeqInput d{toks.data(), kDrafts + 1, pos, &kv, nullptr, true};
        auto ids = model.forward_sample({d}, rows);
        if (!ids.ok()) return fail(ids.error());
        tok = ids->back();
        pos += kDrafts + 1;
        if (s >= 2) ms_v.push_back(now_ms() - t0);
      }
      const double tv = median(ms_v);
      std::printf("decode batch 1 at %lld context, a speculative pass (last token + %d drafts, %d greedy picks): "
                  "%.3f ms = %.2fx a decode step\n",
                  static_cast<long long>(ctx), kDrafts, kDrafts + 1, tv, tv / t);
      json += fmt::format(R"(, "decode_verify": {{"ctx": {}, "drafts": {}, "median_ms": {:.4f}}})", ctx, kDrafts, tv);
    }
  }
  {
    auto adapters = make_preset_adapters(c, 16, true, 7);
    for (auto& a : adapters)
      if (Status st = upload_adapter(*a, be); !st.ok()) return fail(st.error());
    // base-lr: the KV holds base K/V and x·A_v (Flash-LoRA attention); none: the agent's own
    // full K/V (its v LoRA delta expanded beside the base projection), as in Non-Shared traces;
    // icarus: the base model's full K/V, the adapter a decoder row beside the base model's row
    // (SeqInput::decoder: a step runs two rows, one storing, one giving the logits).
    if (lora_modes.empty()) lora_modes = {ShareMode::kBaseLr, ShareMode::kNone, ShareMode::kIcarus};
    for (ShareMode mode : lora_modes) {
      const bool icarus = mode == ShareMode::kIcarus;
      auto agent = [&](SeqInput& in) {
        (icarus ? in.decoder : in.adapter) = adapters[0].get();
        if (icarus) in.adapter = nullptr;
      };
      SharingOptions so;
      so.mode = mode;
      so.page_size = page;
      so.max_tokens = ctx + steps + 4;
      so.backend = &be;
      auto traj = TrajectoryKv::create(c, {adapters[0].get()}, so);
      if (!traj.ok()) return fail(traj.error());
      const auto ids = token_ids(ctx, c.vocab_size, 3);
      auto bind = (*traj)->bind(0);
      SeqInput in{ids.data(), static_cast<int>(ctx), 0, bind.get(), nullptr, false};
      agent(in);
      auto first = model.forward({in});
      if (!first.ok()) return fail(first.error());
      (*traj)->advance(0, ctx);
      int32_t tok = argmax(first->f32(), c.vocab_size);
      std::vector<double> ms;
      GraphStats g0;
      for (int s = 0; s < steps + 2; ++s) {
        be.synchronize();
        if (s == 2) g0 = be.graph_stats();
        const double t0 = now_ms();
        auto b = (*traj)->bind(0);
        SeqInput d{&tok, 1, ctx + s, b.get(), nullptr, false};
        agent(d);
        auto ids = model.forward_argmax({d});
        if (!ids.ok()) return fail(ids.error());
        (*traj)->advance(0, ctx + s + 1);
        tok = ids->front();
        if (s >= 2) ms.push_back(now_ms() - t0);
      }
      const double t = median(ms);
      const double host_ms = record_ms_per_pass(g0, be.graph_stats());
      const char* what = mode == ShareMode::kBaseLr ? "base-lr" : icarus ? "icarus (two rows)" : "private full";
      const char* key = mode == ShareMode::kBaseLr ? "base_lr" : icarus ? "icarus" : "full";
      std::printf("decode batch 1 at %lld context, LoRA r16 q/v, %s cache: %.3f ms/step (host recording %.3f ms)\n",
                  static_cast<long long>(ctx), what, t, host_ms);
      json += fmt::format(R"(, "decode_lora_{}": {{"ctx": {}, "median_ms": {:.4f}, "host_record_ms": {:.4f}}})", key,
                          ctx, t, host_ms);
    }
  }
  // ---- decode of `batch` sequences together, base model, greedy: the N-row pass of a server
  // with N clients decoding (each sequence its own --ctx tokens of context)
  if (batch > 0) {
    auto bpools = KvPools::create(c, page, KvPools::blocks_for(batch, ctx + steps + 4, page), "batch", &be);
    if (!bpools.ok()) return fail(bpools.error());
    std::vector<std::unique_ptr<FullKvCache>> kvs;
    std::vector<int32_t> toks(static_cast<size_t>(batch));  // [batch] each sequence's next token
    std::vector<std::unique_ptr<LoraAdapter>> decoders;     // --batch-icarus: the decoders
    if (batch_icarus) {
      decoders = make_preset_adapters(c, 16, true, 7);
      for (auto& d : decoders)
        if (Status st = upload_adapter(*d, be); !st.ok()) return fail(st.error());
    }
    // Sequence i's decoder (ICaRus) or none.
    auto decoder = [&](int i) { return batch_icarus ? decoders[static_cast<size_t>(i) % decoders.size()].get() : nullptr; };
    for (int i = 0; i < batch; ++i) {
      kvs.push_back(std::make_unique<FullKvCache>(bpools->kv.get()));
      const auto ids = token_ids(ctx, c.vocab_size, 20 + static_cast<uint32_t>(i));
      SeqInput in{ids.data(), static_cast<int>(ctx), 0, kvs.back().get(), nullptr, false};
      in.decoder = decoder(i);
      auto first = model.forward({in});  // one prefill a sequence: its activations stay small
      if (!first.ok()) return fail(first.error());
      toks[static_cast<size_t>(i)] = argmax(first->f32(), c.vocab_size);
    }
    std::vector<double> ms;
    for (int s = 0; s < steps + 2; ++s) {
      std::vector<SeqInput> rows;
      for (int i = 0; i < batch; ++i) {
        rows.push_back({&toks[static_cast<size_t>(i)], 1, ctx + s, kvs[static_cast<size_t>(i)].get(), nullptr, false});
        rows.back().decoder = decoder(i);
      }
      be.synchronize();
      const double t0 = now_ms();
      auto ids = model.forward_argmax(rows);
      if (!ids.ok()) return fail(ids.error());
      for (int i = 0; i < batch; ++i) toks[static_cast<size_t>(i)] = (*ids)[static_cast<size_t>(i)];
      if (s >= 2) ms.push_back(now_ms() - t0);
    }
    const double t = median(ms);
    std::printf("decode batch %d%s at %lld context each: %.3f ms/step (%.1f tok/s)\n", batch,
                batch_icarus ? " (ICaRus sequences)" : "", static_cast<long long>(ctx), t, 1e3 * batch / t);
    json += fmt::format(R"(, "decode_batch": {{"rows": {}, "icarus": {}, "ctx": {}, "median_ms": {:.4f}}})", batch,
                        batch_icarus ? "true" : "false", ctx, t);
  }
  const MemoryStats m = be.memory_stats();
  json += fmt::format(R"(, "peak_device_bytes": {}, "device_capacity_bytes": {}}})", m.peak, m.capacity);
  std::printf("peak device memory %.2f GB of %.2f GB\n", m.peak / 1e9, m.capacity / 1e9);
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s\n", out_path.c_str());
      return 1;
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  return 0;
}
