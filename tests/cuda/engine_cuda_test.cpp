// The whole engine on the GPU against the CPU: weights placed with progress, `replay` of a real
// trajectory script on tinystories with real PEFT adapters in every sharing mode (f32: identical
// tokens; bf16: agreement reported, near-ties allowed), DroidSpeak's partial catch-up, and Qwen3
// against PEFT goldens. Every test skips (with a message) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/backend_cuda_test_util.h"
#include "cuda/cuda_test_util.h"
#include "agents/replay.h"
#include "engine/generator.h"
#include "backend/backend.h"
#include "core/dtype.h"
#include "kv/block_pool.h"
#include "model/llama.h"
#include "model/lora.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"


namespace lragent {
namespace {

using testing::cuda_backend;
using testing::rel_l2;


struct ReplayRun {
  std::vector<int32_t> trajectory;
  std::vector<float> first_logits;
  std::vector<int32_t> outputs;             // [generated] every step's output tokens, in order
  std::vector<std::vector<float>> logits;   // [generated, vocab] the logits each was picked from
};

// droidspeak recomputes layer 0 (the CLI's default), its catch-up partial in depth unless
// `partial_catchup` is off (SharingOptions::partial_catchup).
ReplayRun run_on(Backend& be, const std::string& set, ShareMode mode, bool keep_logits = true,
                 bool partial_catchup = true) {
  ReplayRun out;
  auto model = LlamaModel::load(testing::tinystories_dir(), be);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return out;
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  EXPECT_TRUE(tok.ok());
  std::vector<std::unique_ptr<LoraAdapter>> owned;
  std::vector<const LoraAdapter*> ads;
  const std::vector<std::string> names = {"plan", "action", "reflect"};
  for (const std::string& role : names) {
    auto a = load_lora_adapter(role, testing::adapters_dir() + "/" + set + "/" + role, (*model)->config());
    EXPECT_TRUE(a.ok()) << a.error().message;
    EXPECT_TRUE(upload_adapter(**a, be).ok());
    owned.push_back(std::move(*a));
    ads.push_back(owned.back().get());
  }
  auto steps = parse_replay_script(testing::read_file(testing::source_dir() + "/examples/replay-hotpotqa.json"),
                                   "replay-hotpotqa.json");
  EXPECT_TRUE(steps.ok());
  ReplayOptions o;
  o.sharing.mode = mode;
  o.sharing.page_size = 16;
  o.sharing.max_tokens = 2048;
  if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {0};
  o.sharing.partial_catchup = partial_catchup;
  o.keep_logits = keep_logits;  // false: greedy picks on the device (forward_argmax)
  auto r = run_replay(**model, tok->get(), names, ads, *steps, o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  if (!r.ok()) return out;
  out.trajectory = r->trajectory;
  for (const StepResult& s : r->steps) {
    if (out.first_logits.empty() && !s.logits.empty()) out.first_logits = s.logits.front();
    out.outputs.insert(out.outputs.end(), s.output_tokens.begin(), s.output_tokens.end());
    out.logits.insert(out.logits.end(), s.logits.begin(), s.logits.end());
  }
  return out;
}

// Placing the weights on the GPU reports progress per tensor: increasing, ending at the total,
// which is the CPU's (every tensor's bytes, the tied embedding once).
TEST(CudaLoad, ReportsProgressPerTensor) {
  REQUIRE_GPU();
  int64_t cpu_total = -1;
  {
    auto cpu = make_cpu_backend(1);
    auto m = LlamaModel::load(testing::tinystories_dir(), *cpu, [&](int64_t, int64_t total) { cpu_total = total; });
    ASSERT_TRUE(m.ok()) << m.error().message;
  }
  auto g = cuda_backend(DType::kBF16);
  ASSERT_TRUE(g);
  std::vector<std::pair<int64_t, int64_t>> calls;
  auto m = LlamaModel::load(testing::tinystories_dir(), *g, [&](int64_t done, int64_t total) {
    calls.emplace_back(done, total);
  });
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(calls.size(), 20u);  // lm_head (= the embedding), 9 per layer, the final norm
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, cpu_total) << i;
    if (i > 0) EXPECT_GT(calls[i].first, calls[i - 1].first) << i;
  }
  EXPECT_EQ(calls.back().first, cpu_total);
}

class CudaEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngine, ReplayMatchesCpuInEveryMode) {
  REQUIRE_GPU();
  // With a GPU the fixtures are there (scripts/device-bundle.sh packs them): missing is a failure.
  ASSERT_TRUE(std::filesystem::exists(testing::tinystories_dir())) << testing::tinystories_dir() << " is missing";
  const std::string set = GetParam();
  std::vector<ShareMode> modes(std::begin(kAllShareModes), std::end(kAllShareModes));
  modes.push_back(ShareMode::kIcarus);  // two sequences a pass: the base model's rows and the decoder's
  for (ShareMode mode : modes) {
    if (mode == ShareMode::kBaseLr && set == "qv-indep-a-r8") continue;  // refused by design
    ReplayRun ref, f32, bf16;
    {
      auto cpu = make_cpu_backend(4);
      ref = run_on(*cpu, set, mode);
    }
    {
      auto g = cuda_backend(DType::kF32);
      ASSERT_TRUE(g);
      f32 = run_on(*g, set, mode);
    }
    {
      auto g = cuda_backend(DType::kBF16);
      ASSERT_TRUE(g);
      bf16 = run_on(*g, set, mode);
    }
    ASSERT_FALSE(ref.trajectory.empty());
    EXPECT_EQ(f32.trajectory, ref.trajectory) << set << " " << share_mode_name(mode) << ": f32 GPU tokens differ";
    {
      auto g = cuda_backend(DType::kF32);
      ASSERT_TRUE(g);
      const ReplayRun picked = run_on(*g, set, mode, /*keep_logits=*/false);
      EXPECT_EQ(picked.trajectory, ref.trajectory)
          << set << " " << share_mode_name(mode) << ": f32 GPU tokens picked on the device differ";
    }
    size_t same = 0;
    for (size_t i = 0; i < std::min(bf16.trajectory.size(), ref.trajectory.size()); ++i)
      same += bf16.trajectory[i] == ref.trajectory[i];
    const double agree = static_cast<double>(same) / static_cast<double>(ref.trajectory.size());
    const double e32 = rel_l2(f32.first_logits, ref.first_logits), e16 = rel_l2(bf16.first_logits, ref.first_logits);
    std::printf("  replay %s %-10s tokens %zu: f32 identical=%d logits rel_l2=%.1e | bf16 agreement=%.3f logits "
                "rel_l2=%.1e\n",
                set.c_str(), share_mode_name(mode), ref.trajectory.size(), f32.trajectory == ref.trajectory, e32, agree,
                e16);
    EXPECT_LE(e32, 1e-4);
    EXPECT_LE(e16, 5e-2);
    // bf16 picks the CPU's token at every position up to the first where they part, and there
    // the part must be a near-tie that bf16's own logit error explains: the CPU's top-2 margin at
    // most twice the largest |bf16 - CPU| logit of that row (both runs had the same context so far).
    ASSERT_EQ(ref.logits.size(), ref.outputs.size());
    ASSERT_EQ(bf16.logits.size(), bf16.outputs.size());
    size_t same_prefix = 0;
    for (; same_prefix < std::min(ref.outputs.size(), bf16.outputs.size()); ++same_prefix) {
      if (bf16.outputs[same_prefix] == ref.outputs[same_prefix]) continue;
      const std::vector<float>& c = ref.logits[same_prefix];
      const std::vector<float>& g = bf16.logits[same_prefix];
      ASSERT_EQ(c.size(), g.size());
      const float err = testing::max_abs_diff(c, g);
      std::vector<float> top(c);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      EXPECT_LE(top[0] - top[1], 2 * err) << set << " " << share_mode_name(mode) << ": bf16 output " << same_prefix
                                          << " differs where the CPU's margin " << top[0] - top[1]
                                          << " exceeds twice bf16's logit error " << err;
      std::printf("    bf16 parts from the CPU at generated token %zu of %zu: CPU margin %.4f, bf16 logit error %.4f\n",
                  same_prefix, ref.outputs.size(), top[0] - top[1], err);
      break;
    }
    if (same_prefix == ref.outputs.size()) EXPECT_EQ(bf16.outputs.size(), ref.outputs.size());
  }
}

// droidspeak's partial-depth catch-up (layer 0 only over positions the shared layer holds) on
// the GPU against the catch-up through every layer, on the same backend: f32 the same tokens and
// logits to rounding; bf16 the same tokens up to a near-tie that the two runs' own logit
// difference explains (their GEMMs see different row counts, so they round differently).
TEST_P(CudaEngine, DroidSpeakPartialCatchUpMatchesFullDepth) {
  REQUIRE_GPU();
  ASSERT_TRUE(std::filesystem::exists(testing::tinystories_dir())) << testing::tinystories_dir() << " is missing";
  const std::string set = GetParam();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    ReplayRun full, part;
    {
      auto g = cuda_backend(dt);
      ASSERT_TRUE(g);
      full = run_on(*g, set, ShareMode::kDroidSpeak, true, /*partial_catchup=*/false);
      part = run_on(*g, set, ShareMode::kDroidSpeak, true, /*partial_catchup=*/true);
    }
    const char* name = dt == DType::kF32 ? "f32" : "bf16";
    ASSERT_FALSE(full.outputs.empty());
    ASSERT_EQ(full.logits.size(), full.outputs.size());
    ASSERT_EQ(part.logits.size(), part.outputs.size());
    size_t same_prefix = 0;
    double worst = 0;  // largest |partial - full| logit over the rows with the same context
    for (; same_prefix < std::min(full.outputs.size(), part.outputs.size()); ++same_prefix) {
      const std::vector<float>& f = full.logits[same_prefix];
      const std::vector<float>& p = part.logits[same_prefix];
      ASSERT_EQ(f.size(), p.size());
      const float err = testing::max_abs_diff(f, p);
      worst = std::max(worst, static_cast<double>(err));
      if (part.outputs[same_prefix] == full.outputs[same_prefix]) continue;
      std::vector<float> top(f);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      EXPECT_LE(top[0] - top[1], 2 * err) << set << " " << name << ": output " << same_prefix
                                          << " differs where the full-depth margin " << top[0] - top[1]
                                          << " exceeds twice the runs' logit difference " << err;
      std::printf("    %s %s: partial parts from full depth at generated token %zu of %zu: margin %.4f, logit "
                  "difference %.4f\n",
                  set.c_str(), name, same_prefix, full.outputs.size(), top[0] - top[1], err);
      break;
    }
    std::printf("  droidspeak[0] %s %s: partial vs full-depth catch-up: %zu of %zu outputs before any parting, "
                "largest logit difference %.2e\n",
                set.c_str(), name, same_prefix, full.outputs.size(), worst);
    if (dt == DType::kF32) {
      EXPECT_EQ(part.trajectory, full.trajectory) << set << " f32";
      EXPECT_LE(worst, 1e-3) << set << " f32: logits differ beyond rounding";
    }
  }
}

// The synthetic Qwen3's adapter `name` (tests/fixtures/adapters/synthetic-qwen3; "": none, null)
// loaded for model and uploaded to be; null on failure, which it reports.
std::unique_ptr<LoraAdapter> load_qwen3_adapter(const std::string& name, LlamaModel& model, Backend& be) {
  if (name.empty()) return nullptr;
  auto a = load_lora_adapter(name, testing::fixtures_dir() + "/adapters/synthetic-qwen3/" + name, model.config());
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.error().message);
  if (!a.ok()) return nullptr;
  const Status up = upload_adapter(**a, be);
  EXPECT_TRUE(up.ok()) << (up.ok() ? "" : up.error().message);
  if (!up.ok()) return nullptr;
  return std::move(*a);
}

// Qwen3 (q_norm and k_norm before RoPE, head_dim 64 beside hidden 64, tied embeddings) on the
// GPU: generation against HF transformers + PEFT's goldens, and a replay in every sharing mode
// the adapter allows against the CPU's. f32: the goldens' tokens and the CPU's, exactly; bf16:
// agreement reported, first logits checked.
TEST(CudaQwen3, GenerateMatchesPeftAndReplayMatchesCpu) {
  REQUIRE_GPU();
  const std::string mdir = testing::fixtures_dir() + "/models/synthetic-qwen3";
  for (const std::string name : {"", "qv", "qkvo"}) {
    const auto golden = nlohmann::json::parse(testing::read_file(
        testing::fixtures_dir() + "/goldens/synthetic-qwen3" + (name.empty() ? "" : "-" + name) + ".json"));
    ASSERT_FALSE(golden["cases"].empty());
    std::vector<ReplayStep> steps(4);  // a prompt, a turn, a tool observation, a turn
    steps[0].kind = ReplayStep::Kind::kAppendTokens;
    for (int i = 0; i < 150; ++i) steps[0].tokens.push_back(3 + (i * 37) % 300);
    steps[1].kind = ReplayStep::Kind::kGenerate;
    steps[1].agent = "agent";
    steps[1].generate = 24;
    steps[2].kind = ReplayStep::Kind::kAppendTokens;
    for (int i = 0; i < 40; ++i) steps[2].tokens.push_back(5 + (i * 11) % 300);
    steps[3] = steps[1];
    std::vector<std::vector<int32_t>> cpu_traj;  // per mode
    for (int b = 0; b < 3; ++b) {
      std::unique_ptr<Backend> be = b == 0 ? make_cpu_backend(4) : cuda_backend(b == 1 ? DType::kF32 : DType::kBF16);
      ASSERT_TRUE(be);
      const char* bname = b == 0 ? "cpu" : (b == 1 ? "f32" : "bf16");
      auto model = LlamaModel::load(mdir, *be);
      ASSERT_TRUE(model.ok()) << model.error().message;
      std::unique_ptr<LoraAdapter> ad = load_qwen3_adapter(name, **model, *be);
      ASSERT_TRUE(name.empty() || ad);
      if (b > 0) {  // the goldens, as one batch of every case
        std::vector<GenerateRequest> reqs;
        for (const auto& c : golden["cases"]) {
          GenerateRequest r;
          r.prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
          r.max_tokens = static_cast<int>(c["output_tokens"].size());
          r.keep_first_logits = true;
          r.adapter = ad.get();
          reqs.push_back(std::move(r));
        }
        Generator gen(**model, EngineOptions{});
        auto res = gen.run(reqs);
        ASSERT_TRUE(res.ok()) << res.error().message;
        size_t same = 0, total = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
          const auto& c = golden["cases"][i];
          const auto want = c["output_tokens"].get<std::vector<int32_t>>();
          const double e = rel_l2((*res)[i].first_logits, c["last_logits"].get<std::vector<float>>());
          for (size_t t = 0; t < want.size() && t < (*res)[i].output.size(); ++t) same += (*res)[i].output[t] == want[t];
          total += want.size();
          if (b == 1) {
            EXPECT_EQ((*res)[i].output, want) << "qwen3 " << name << " f32 case " << i;
            EXPECT_LE(e, 1e-4) << "qwen3 " << name << " f32 case " << i;
          } else {
            EXPECT_LE(e, 5e-2) << "qwen3 " << name << " bf16 case " << i;
          }
        }
        std::printf("  qwen3 %-4s %s: %zu of %zu golden tokens\n", name.empty() ? "base" : name.c_str(), bname, same,
                    total);
      }
      int mi = 0;
      for (ShareMode mode : kAllShareModes) {
        if (name == "qkvo" && (mode == ShareMode::kBase || mode == ShareMode::kBaseLr)) continue;  // refused (k_norm)
        ReplayOptions o;
        o.sharing.mode = mode;
        o.sharing.max_tokens = 512;
        if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {0};
        auto r = run_replay(**model, nullptr, {"agent"}, {ad.get()}, steps, o);
        ASSERT_TRUE(r.ok()) << bname << " " << share_mode_name(mode) << ": " << r.error().message;
        if (b == 0) {
          cpu_traj.push_back(r->trajectory);
        } else {
          const std::vector<int32_t>& ref = cpu_traj[static_cast<size_t>(mi)];
          size_t same = 0;
          for (size_t i = 0; i < std::min(ref.size(), r->trajectory.size()); ++i) same += ref[i] == r->trajectory[i];
          std::printf("  qwen3 %-4s %s replay %-10s: %zu of %zu trajectory tokens as the CPU's\n",
                      name.empty() ? "base" : name.c_str(), bname, share_mode_name(mode), same, ref.size());
          if (b == 1) EXPECT_EQ(r->trajectory, ref) << "qwen3 " << name << " f32 " << share_mode_name(mode);
        }
        ++mi;
      }
    }
  }
}

// A recorded bf16 decode step on Qwen3 holds its q/k norm for the kernel after it: the decode
// attention that rotates and stores (batch 1, no q LoRA term), or the RoPE-and-stores launch (a
// q/v adapter's q LoRA term added before the norm). Their bits are qk_norm's, so each golden
// prompt decoded alone gives the very same tokens as with the norm launched alone
// (LRAGENT_CUDA_FUSE_QK_NORM=0); the tiny random model's greedy margins (~1e-3) would turn a
// one-ulp difference into other tokens.
TEST(CudaQwen3, FusedDecodeNormsGiveTheTokensOfTheirOwnLaunches) {
  REQUIRE_GPU();
  const std::string mdir = testing::fixtures_dir() + "/models/synthetic-qwen3";
  for (const std::string name : {"", "qv"}) {
    const auto golden = nlohmann::json::parse(testing::read_file(
        testing::fixtures_dir() + "/goldens/synthetic-qwen3" + (name.empty() ? "" : "-" + name) + ".json"));
    ASSERT_FALSE(golden["cases"].empty());
    std::vector<std::vector<int32_t>> out[2];
    GraphStats stats[2];
    for (int fused = 0; fused < 2; ++fused) {
      if (fused == 0) setenv("LRAGENT_CUDA_FUSE_QK_NORM", "0", 1);
      std::unique_ptr<Backend> be = cuda_backend(DType::kBF16);
      unsetenv("LRAGENT_CUDA_FUSE_QK_NORM");  // read when the backend is made
      ASSERT_TRUE(be);
      auto model = LlamaModel::load(mdir, *be);
      ASSERT_TRUE(model.ok()) << model.error().message;
      std::unique_ptr<LoraAdapter> ad = load_qwen3_adapter(name, **model, *be);
      ASSERT_TRUE(name.empty() || ad);
      for (const auto& c : golden["cases"]) {
        GenerateRequest r;
        r.prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
        r.max_tokens = static_cast<int>(c["output_tokens"].size());
        r.adapter = ad.get();
        Generator gen(**model, EngineOptions{});
        auto res = gen.run({r});
        ASSERT_TRUE(res.ok()) << res.error().message;
        out[fused].push_back((*res)[0].output);
      }
      stats[fused] = be->graph_stats();
    }
    const std::string what = name.empty() ? "base" : name;
    EXPECT_EQ(stats[0].fused_qk_norms, 0) << what << ": with the fusion off every norm is a launch of its own";
    EXPECT_GE(stats[1].fused_qk_norms, 32) << what << ": recorded decode steps norm q and k in the kernel after them";
    if (name.empty()) EXPECT_GE(stats[1].fused_rope_attention, 32) << "batch-1 steps without LoRA: in the attention";
    std::printf("  qwen3 %s bf16 decode: %lld norms done by the kernel after them (%lld decode attentions did RoPE "
                "and stores)\n",
                what.c_str(), static_cast<long long>(stats[1].fused_qk_norms),
                static_cast<long long>(stats[1].fused_rope_attention));
    ASSERT_EQ(out[0].size(), out[1].size());
    for (size_t i = 0; i < out[0].size(); ++i) EXPECT_EQ(out[1][i], out[0][i]) << what << " golden prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, CudaEngine, ::testing::Values("qv-shared-a-r8", "qv-indep-a-r8", "qkvo-shared-a-r4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });


}  // namespace
}  // namespace lragent
