// Speculative decoding by n-gram lookup on the GPU (ReplayOptions / EngineOptions::speculative):
// the verify pass runs the last token and its drafts with a device pick for every row. In f32,
// agents on shared caches in every mode (the synthetic model with head_dim 128, and tinystories
// with its real adapters) and the Generator pick exactly the tokens of one pass a token. In bf16 a
// multi-row pass takes the GEMM and prefill-attention kernels where one row takes the GEMV and
// decode kernels, so a near tie may pick differently and the text go on from there: the synthetic
// model's random weights are full of near ties, so bf16 is checked on tinystories' real weights,
// its agreement reported. Seeded sampled steps and requests speculate too, each row picked with
// the draw one pass a token makes for its token: in f32 the same tokens as well. Drafts are found
// and kept (checked, so the comparison covers them).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "agents/replay.h"
#include "backend/backend.h"
#include "cuda/cuda_test_util.h"
#include "engine/generator.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/synthetic.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

using testing::have_gpu;

SpeculativeOptions spec() {
  SpeculativeOptions o;
  o.num_tokens = 4;
  o.lookup_min = 1;
  o.lookup_max = 3;
  return o;
}

using Agents = testing::SyntheticAgents;

// Three rounds of every agent on one trajectory; each step's tokens, and the drafts kept.
std::vector<std::vector<int32_t>> run_agents(Agents& ag, ShareMode mode, SpeculativeOptions so, int64_t* kept) {
  std::vector<std::vector<int32_t>> out;
  ReplayOptions ro;
  ro.sharing.mode = mode;
  ro.sharing.max_tokens = 1024;
  ro.speculative = so;
  auto s = AgentSession::create(*ag.model, nullptr, ag.names, ag.ptrs, ro);
  EXPECT_TRUE(s.ok()) << s.error().message;
  if (!s.ok()) return out;
  std::vector<int32_t> prompt(120);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 29) % 250);
  (*s)->append(prompt);
  for (int round = 0; round < 3; ++round)
    for (const std::string& name : ag.names) {
      auto r = (*s)->run_agent(name, 40, {}, {});
      EXPECT_TRUE(r.ok()) << r.error().message;
      if (!r.ok()) return out;
      out.push_back(r->output_tokens);
      *kept += r->drafts.accepted;
    }
  return out;
}

// Tokens at the same place in both, over all tokens of `want`.
double agreement(const std::vector<std::vector<int32_t>>& got, const std::vector<std::vector<int32_t>>& want) {
  size_t same = 0, all = 0;
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t k = 0; k < want[i].size(); ++k) {
      ++all;
      same += i < got.size() && k < got[i].size() && got[i][k] == want[i][k];
    }
  return all ? static_cast<double>(same) / static_cast<double>(all) : 0.0;
}

TEST(CudaSpeculative, AgentsPickTheTokensOfOnePassAToken) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA speculative decoding test skipped";
  Agents ag;
  ASSERT_TRUE(testing::make_cuda_agents(DType::kF32, ag));
  // The suffix method (up to 32 drafts a pass: verify passes of 33 rows) as well as n-gram lookup.
  SpeculativeOptions suffix;
  suffix.method = SpeculativeMethod::kSuffix;
  suffix.num_tokens = 32;
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kFull, ShareMode::kBase, ShareMode::kBaseLr}) {
    SCOPED_TRACE(share_mode_name(mode));
    int64_t kept_plain = 0, kept = 0, kept_suffix = 0;
    const auto plain = run_agents(ag, mode, {}, &kept_plain);
    const auto fast = run_agents(ag, mode, spec(), &kept);
    const auto by_suffix = run_agents(ag, mode, suffix, &kept_suffix);
    ASSERT_EQ(plain.size(), 9u);
    EXPECT_EQ(kept_plain, 0);
    EXPECT_GT(kept, 20) << "drafts must be kept for the comparison to cover them";
    EXPECT_GT(kept_suffix, 20) << "drafts must be kept for the comparison to cover them";
    std::printf("  speculative agents, synthetic f32 %s: %lld drafts kept (ngram), %lld (suffix)\n",
                share_mode_name(mode), static_cast<long long>(kept), static_cast<long long>(kept_suffix));
    EXPECT_EQ(fast, plain);
    EXPECT_EQ(by_suffix, plain);
  }
}

// tinystories on the GPU with the plan/action/reflect adapters of qv-shared-a-r8: a story the
// agents take turns on, each step 32 tokens.
std::vector<std::vector<int32_t>> run_tiny(LlamaModel& model, const Tokenizer& tok,
                                           const std::vector<std::string>& names,
                                           const std::vector<const LoraAdapter*>& ptrs, ShareMode mode,
                                           SpeculativeOptions so, int64_t* kept, const AgentDecode* dec = nullptr) {
  std::vector<std::vector<int32_t>> out;
  ReplayOptions ro;
  ro.sharing.mode = mode;
  ro.sharing.max_tokens = 512;
  ro.speculative = so;
  auto s = AgentSession::create(model, &tok, names, ptrs, ro);
  EXPECT_TRUE(s.ok()) << s.error().message;
  if (!s.ok()) return out;
  auto ids = tok.encode("Once upon a time, there was a little girl named Lily. Lily had a red ball. Lily", false);
  EXPECT_TRUE(ids.ok());
  (*s)->append(*ids);
  for (int round = 0; round < 3; ++round)
    for (const std::string& name : names) {
      auto r = (*s)->run_agent(name, 32, {}, {}, dec);
      EXPECT_TRUE(r.ok()) << r.error().message;
      if (!r.ok()) return out;
      out.push_back(r->output_tokens);
      *kept += r->drafts.accepted;
    }
  return out;
}

TEST(CudaSpeculative, TinystoriesAgentsInF32AndBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA speculative decoding test skipped";
  ASSERT_TRUE(std::filesystem::exists(testing::tinystories_dir())) << testing::tinystories_dir() << " is missing";
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CudaBackendOptions bo;
    bo.dtype = dt;
    auto be = make_cuda_backend(bo);
    ASSERT_TRUE(be.ok()) << be.error().message;
    auto model = LlamaModel::load(testing::tinystories_dir(), **be);
    ASSERT_TRUE(model.ok()) << model.error().message;
    std::vector<std::unique_ptr<LoraAdapter>> adapters;
    std::vector<const LoraAdapter*> ptrs;
    std::vector<std::string> names;
    for (const char* role : {"plan", "action", "reflect"}) {
      auto a = load_lora_adapter(role, testing::adapters_dir() + "/qv-shared-a-r8/" + role, (*model)->config());
      ASSERT_TRUE(a.ok()) << a.error().message;
      ASSERT_TRUE(upload_adapter(**a, **be).ok());
      names.push_back(role);
      ptrs.push_back(a->get());
      adapters.push_back(std::move(*a));
    }
    for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + share_mode_name(mode));
      int64_t kept_plain = 0, kept = 0;
      const auto plain = run_tiny(**model, **tok, names, ptrs, mode, {}, &kept_plain);
      const auto fast = run_tiny(**model, **tok, names, ptrs, mode, spec(), &kept);
      ASSERT_EQ(plain.size(), 9u);
      EXPECT_GT(kept, 10) << "drafts must be kept for the comparison to cover them";
      const double agree = agreement(fast, plain);
      std::printf("  speculative agents, tinystories %s %s: %lld drafts kept, token agreement %.4f\n",
                  dtype_name(dt), share_mode_name(mode), static_cast<long long>(kept), agree);
      // f32 is the exact check. bf16 on an H200 (session 50): none 0.81 (one near tie flips a
      // step, which goes on differently from there), base-lr 1.00; below 0.6 something is wrong.
      if (dt == DType::kF32)
        EXPECT_EQ(fast, plain);
      else
        EXPECT_GE(agree, 0.6);
      if (dt != DType::kF32) continue;
      // Sampled steps (seeded): each row picked on the device with the draw one pass a token
      // makes for that token, so in f32 the same tokens; the logprobs variant picks on the host.
      for (bool logprobs : {false, true}) {
        AgentDecode dec;
        dec.sampling = {0.3f, 0, 0.95f, 21};
        if (logprobs) dec.logprobs = 1;
        int64_t kept_sampled = 0, unused = 0;
        const auto plain_sampled = run_tiny(**model, **tok, names, ptrs, mode, {}, &unused, &dec);
        const auto fast_sampled = run_tiny(**model, **tok, names, ptrs, mode, spec(), &kept_sampled, &dec);
        ASSERT_EQ(plain_sampled.size(), 9u);
        std::printf("  speculative agents, tinystories f32 %s sampled%s: %lld drafts kept\n", share_mode_name(mode),
                    logprobs ? " with logprobs" : "", static_cast<long long>(kept_sampled));
        EXPECT_GT(kept_sampled, 0) << "drafts must be kept for the comparison to cover them";
        EXPECT_EQ(fast_sampled, plain_sampled) << (logprobs ? "logprobs" : "device picks");
      }
    }
  }
}

TEST(CudaSpeculative, GeneratorPicksTheTokensOfOnePassAToken) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA speculative decoding test skipped";
  Agents ag;
  ASSERT_TRUE(testing::make_cuda_agents(DType::kF32, ag));
  std::vector<GenerateRequest> reqs(4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (int t = 0; t < 9 + 23 * static_cast<int>(i); ++t) reqs[i].prompt.push_back(3 + (t * 13 + static_cast<int>(i)) % 250);
    reqs[i].max_tokens = 80 + 5 * static_cast<int>(i);
    reqs[i].adapter = i == 0 ? nullptr : ag.ptrs[i % ag.ptrs.size()];
    if (i == 3) reqs[i].sampling = {0.3f, 30, 0.9f, 5};  // sampled: each row with its own draw
  }
  auto plain = Generator(*ag.model, EngineOptions{}).run(reqs);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EngineOptions o;
  o.speculative = spec();
  auto fast = Generator(*ag.model, o).run(reqs);
  ASSERT_TRUE(fast.ok()) << fast.error().message;
  int64_t kept = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*fast)[i].output, (*plain)[i].output) << i;
    kept += (*fast)[i].drafts.accepted;
  }
  EXPECT_GT((*fast)[3].drafts.passes, 0);
  EXPECT_GT(kept, 0);
  std::printf("  speculative generator f32: %lld drafts kept (%lld by the sampled request)\n",
              static_cast<long long>(kept), static_cast<long long>((*fast)[3].drafts.accepted));
}

}  // namespace
}  // namespace lragent
