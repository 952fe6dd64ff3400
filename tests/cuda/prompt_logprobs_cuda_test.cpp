// Prompt log-probabilities on the GPU (AgentDecode::prompt_logprobs: every row of the catch-up
// passes comes to the host) against the CPU backend's, on the synthetic model with r16 role
// adapters, in every sharing mode: f32 within 2e-3 with the same ranks and top ids where the
// logits are not near a tie, bf16 within bf16's reach. The prompt is computed in chunks (a
// chunk short of the end picks nothing) so the rows of several passes are stitched together.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "agents/agent_turn.h"
#include "agents/replay.h"
#include "backend/backend.h"
#include "cuda/cuda_test_util.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

using testing::have_gpu;

using Agents = testing::SyntheticAgents;

Agents make(std::unique_ptr<Backend> be, bool upload) {
  Agents ag;
  EXPECT_TRUE(testing::make_synthetic_agents(std::move(be), upload, ag));
  return ag;
}

// Agent `agent`'s prompt log-probabilities (top 3) over `prompt` and 4 generated tokens, the
// prompt in passes of `chunk`.
StepResult prompt_logprobs(Agents& ag, ShareMode mode, const std::string& agent, const std::vector<int32_t>& prompt,
                           int64_t chunk) {
  ReplayOptions ro;
  ro.sharing.mode = mode;
  ro.sharing.max_tokens = 1024;
  auto s = AgentSession::create(*ag.model, nullptr, ag.names, ag.ptrs, ro);
  EXPECT_TRUE(s.ok()) << s.error().message;
  (*s)->truncate(0);  // a new session holds BOS: the prompt is the whole trajectory
  (*s)->append(prompt);
  AgentDecode dec;
  dec.prompt_logprobs = 3;
  auto turn = AgentTurn::start(**s, agent, 4, {}, {}, dec);
  EXPECT_TRUE(turn.ok()) << turn.error().message;
  AgentTurn* const t[1] = {turn->get()};
  while (!(*turn)->done()) {
    const TurnStep step = step_turns(*ag.model, t, chunk, chunk);
    EXPECT_TRUE(step.status.front().ok()) << step.status.front().error().message;
    if (!step.status.front().ok()) return {};
  }
  return (*turn)->result();
}

TEST(CudaPromptLogprobs, MatchTheCpuInEveryMode) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA prompt logprobs test skipped";
  std::vector<int32_t> prompt(97);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 31) % 250);
  Agents cpu = make(make_cpu_backend(2), false);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CudaBackendOptions bo;
    bo.dtype = dt;
    auto be = make_cuda_backend(bo);
    ASSERT_TRUE(be.ok()) << be.error().message;
    Agents gpu = make(std::move(*be), true);
    // f32: the CPU's values up to summation order. bf16 weights and caches move a log-probability
    // by a few hundredths (0.066 at worst over these 96 positions on an H200): bounded per position
    // and, as the kernel checks are, in relative L2 over the whole vector.
    const double tol = dt == DType::kF32 ? 2e-3 : 0.15;
    for (ShareMode mode : {ShareMode::kNone, ShareMode::kFull, ShareMode::kBase, ShareMode::kBaseLr}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + share_mode_name(mode));
      const StepResult want = prompt_logprobs(cpu, mode, cpu.names[1], prompt, 1 << 20);
      const StepResult got = prompt_logprobs(gpu, mode, gpu.names[1], prompt, 17);
      ASSERT_EQ(want.prompt_logprobs.size(), prompt.size() - 1);
      ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
      double worst = 0, num = 0, den = 0;
      int rank_checked = 0;
      for (size_t i = 0; i < want.prompt_logprobs.size(); ++i) {
        const StepLogprobs& w = want.prompt_logprobs[i];
        const StepLogprobs& g = got.prompt_logprobs[i];
        ASSERT_TRUE(std::isfinite(g.logprob)) << "position " << i + 1;
        const double d = static_cast<double>(w.logprob) - g.logprob;
        worst = std::max(worst, std::abs(d));
        num += d * d;
        den += static_cast<double>(w.logprob) * w.logprob;
        // Ranks and top ids where the CPU's top entries are apart by more than the tolerance.
        bool apart = w.top.size() == 3;
        for (size_t k = 0; apart && k + 1 < w.top.size(); ++k) apart = w.top[k].logprob - w.top[k + 1].logprob > 4 * tol;
        if (apart && dt == DType::kF32) {
          for (size_t k = 0; k < 3; ++k) EXPECT_EQ(g.top[k].id, w.top[k].id) << "position " << i + 1;
          if (w.rank <= 3) EXPECT_EQ(g.rank, w.rank) << "position " << i + 1;
          ++rank_checked;
        }
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      EXPECT_LE(worst, tol);
      EXPECT_LE(rel, dt == DType::kF32 ? 1e-4 : 1e-2);
      if (dt == DType::kF32) EXPECT_GT(rank_checked, 10);
      std::printf("  prompt logprobs %s %s: worst |cpu - gpu| %.2e, rel L2 %.2e over %zu positions\n", dtype_name(dt),
                  share_mode_name(mode), worst, rel, want.prompt_logprobs.size());
    }
  }
}

}  // namespace
}  // namespace lragent
