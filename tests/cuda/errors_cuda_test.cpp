// The CUDA backend's error channel (Backend::take_error): a failed op is an error returned by
// the forward pass, not an abort; the process and the backend live on, and the next pass gives
// the results of a clean run. Faults are injected with LRAGENT_CUDA_INJECT_FAULT=<op>[:N] (the
// Nth launch of that op fails), in an eager prefill and inside a recorded decode pass (graphs on).
// Out-of-memory for the KV arena is an error naming the size, with the backend still usable.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "backend/backend.h"
#include "engine/generator.h"
#include "kv/full_cache.h"
#include "kv/kv_arena.h"
#include "model/llama.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

using testing::have_gpu;

SyntheticSpec spec() {
  SyntheticSpec s;
  s.hidden = 256;  // 2 heads of 128, 1 KV head
  s.heads = 2;
  s.kv_heads = 1;
  s.layers = 2;
  s.intermediate = 512;
  s.max_positions = 1024;
  return s;
}

struct FaultRun {
  std::vector<float> prefill_logits;  // [vocab] of the last prompt token
  std::vector<int32_t> tokens;        // greedy decode picks
  std::vector<std::string> errors;    // errors met (then retried)
  GraphStats graphs;                  // the backend's, at the end
};

// An f32 backend (bit-faithful: a recovered pass must equal the clean one exactly) whose launches
// fail as `inject` says (null: none), and the synthetic model on it; both null on a setup error.
struct Faulty {
  std::unique_ptr<Backend> be;
  std::unique_ptr<LlamaModel> model;
};
Faulty faulty(const char* inject) {
  Faulty f;
  if (inject) setenv("LRAGENT_CUDA_INJECT_FAULT", inject, 1);
  CudaBackendOptions o;
  o.dtype = DType::kF32;
  auto be = make_cuda_backend(o);
  unsetenv("LRAGENT_CUDA_INJECT_FAULT");
  EXPECT_TRUE(be.ok()) << be.error().message;
  if (!be.ok()) return f;
  auto model = make_synthetic_model(spec(), **be);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return f;
  f.be = std::move(*be);
  f.model = std::move(*model);
  return f;
}

// Prefill 40 tokens, then 12 greedy decode steps; a failed pass is retried once.
FaultRun run_with(const char* inject) {
  FaultRun out;
  Faulty f = faulty(inject);
  if (!f.model) return out;
  const ModelConfig& c = f.model->config();
  auto pools = KvPools::create(c, 16, KvPools::blocks_for(1, 64, 16), "errors-test", f.be.get());
  EXPECT_TRUE(pools.ok());
  if (!pools.ok()) return out;
  FullKvCache kv(pools->kv.get());
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 3 + static_cast<int32_t>(i * 13) % 200;
  SeqInput in{ids.data(), 40, 0, &kv, nullptr, false};
  auto lg = f.model->forward({in});
  if (!lg.ok()) {
    out.errors.push_back(lg.error().message);
    lg = f.model->forward({in});  // the same positions again: overwrites what the failed pass left
  }
  EXPECT_TRUE(lg.ok()) << lg.error().message;
  if (!lg.ok()) return out;
  out.prefill_logits.assign(lg->f32(), lg->f32() + c.vocab_size);
  int32_t next = static_cast<int32_t>(std::max_element(out.prefill_logits.begin(), out.prefill_logits.end()) -
                                      out.prefill_logits.begin());
  for (int step = 0; step < 12; ++step) {
    SeqInput d{&next, 1, 40 + step, &kv, nullptr, false};
    auto pick = f.model->forward_argmax({d});
    if (!pick.ok()) {
      out.errors.push_back(pick.error().message);
      pick = f.model->forward_argmax({d});
    }
    EXPECT_TRUE(pick.ok()) << pick.error().message;
    if (!pick.ok()) return out;
    next = (*pick)[0];
    out.tokens.push_back(next);
  }
  out.graphs = f.be->graph_stats();
  return out;
}

// A fault when the op runs, not when it is recorded: "<op>@run:N" fails the Nth run of its
// closure with cudaErrorInvalidValue (a launch the GPU refuses), and the error names the op. Run 3 of the decode steps' embedding falls in the capture of the second decode step's
// graph: the capture is discarded (never cached and replayed without that op), the pass reports
// the error, and every later step equals the clean run. Run 2 is that step's first, eager run.
TEST(CudaErrors, FaultWhileAGraphIsCapturedIsNotCached) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA error-path tests skipped";
  const FaultRun clean = run_with(nullptr);
  ASSERT_TRUE(clean.errors.empty());
  EXPECT_EQ(clean.graphs.capture_failures, 0);
  EXPECT_GT(clean.graphs.replayed, 0) << "the decode steps replay graphs";
  // attention@run:6: the second layer's attention in that capture, after other ops were captured.
  for (const char* fault : {"embedding@run:2", "embedding@run:3", "attention@run:6"}) {
    SCOPED_TRACE(fault);
    const FaultRun r = run_with(fault);
    ASSERT_EQ(r.errors.size(), 1u) << "one injected fault, one error";
    EXPECT_NE(r.errors[0].find("when it ran"), std::string::npos) << r.errors[0];
    const std::string op(fault, std::strchr(fault, '@'));
    EXPECT_NE(r.errors[0].find("op '" + op + "' failed"), std::string::npos) << "names the op: " << r.errors[0];
    EXPECT_NE(r.errors[0].find(cudaGetErrorString(cudaErrorInvalidValue)), std::string::npos) << r.errors[0];
    EXPECT_EQ(r.prefill_logits, clean.prefill_logits);
    EXPECT_EQ(r.tokens, clean.tokens);
    std::printf("  %s: capture failures %lld, graphs captured %lld, replayed %lld\n", fault,
                static_cast<long long>(r.graphs.capture_failures), static_cast<long long>(r.graphs.captured),
                static_cast<long long>(r.graphs.replayed));
  }
  const FaultRun in_capture = run_with("embedding@run:3");
  EXPECT_EQ(in_capture.graphs.capture_failures, 1) << "run 3 is inside a capture";
  EXPECT_GT(in_capture.graphs.replayed, 0) << "a failed op does not leave its shape eager for good";
}

TEST(CudaErrors, FailedOpIsReturnedAndTheNextPassEqualsACleanRun) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA error-path tests skipped";
  const FaultRun clean = run_with(nullptr);
  ASSERT_TRUE(clean.errors.empty());
  ASSERT_EQ(clean.tokens.size(), 12u);
  // The 1st embedding is the prefill's (eager); the 5th is the 4th decode step's, by then a
  // recorded pass that replays a CUDA graph; rms_norm:3 and attention:20 fail after other ops
  // of their pass were launched or recorded.
  for (const char* fault : {"embedding", "embedding:5", "rms_norm:3", "attention:20"}) {
    SCOPED_TRACE(fault);
    const FaultRun r = run_with(fault);
    ASSERT_EQ(r.errors.size(), 1u) << "one injected fault, one error";
    EXPECT_NE(r.errors[0].find("injected fault"), std::string::npos) << r.errors[0];
    EXPECT_NE(r.errors[0].find("CUDA backend"), std::string::npos) << r.errors[0];
    EXPECT_EQ(r.prefill_logits, clean.prefill_logits);
    EXPECT_EQ(r.tokens, clean.tokens);
  }
}

// Decode lookahead meets a failed op: the Generator returns the error with no launched pass left
// queued (the backend's and the model's queues of deferred picks stay in step), and the next run
// on the same model and backend decodes the tokens of a clean run.
std::vector<std::vector<int32_t>> generate_with(const char* inject, std::vector<std::string>* errors,
                                                size_t* pending) {
  std::vector<std::vector<int32_t>> out;
  Faulty f = faulty(inject);
  if (!f.model) return out;
  GenerateRequest req;
  for (int i = 0; i < 30; ++i) req.prompt.push_back(3 + (i * 17) % 200);
  req.max_tokens = 16;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Generator gen(*f.model, EngineOptions{});  // decode lookahead on (the default)
    auto r = gen.run({req});
    if (pending) *pending = std::max(*pending, f.model->pending_picks());
    if (!r.ok()) {
      errors->push_back(r.error().message);
      continue;
    }
    out.push_back((*r)[0].output);
    break;
  }
  return out;
}

TEST(CudaErrors, LookaheadFaultLeavesNoPickBehind) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA error-path tests skipped";
  std::vector<std::string> errors;
  const auto clean = generate_with(nullptr, &errors, nullptr);
  ASSERT_TRUE(errors.empty());
  ASSERT_EQ(clean.size(), 1u);
  ASSERT_EQ(clean[0].size(), 16u);
  // embedding:4 is the third decode step's (a fed token, launched while the step before is in
  // flight); argmax:6 the pick of a later one.
  for (const char* fault : {"embedding:4", "argmax:6"}) {
    SCOPED_TRACE(fault);
    std::vector<std::string> errs;
    size_t pending = 0;
    const auto r = generate_with(fault, &errs, &pending);
    ASSERT_EQ(errs.size(), 1u) << "one injected fault, one error";
    EXPECT_NE(errs[0].find("injected fault"), std::string::npos) << errs[0];
    EXPECT_EQ(pending, 0u) << "a pass left queued after the error";
    EXPECT_EQ(r, clean);
  }
}

TEST(CudaErrors, KvArenaTooLargeIsAnErrorAndTheBackendStaysUsable) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA error-path tests skipped";
  auto be = make_cuda_backend({});
  ASSERT_TRUE(be.ok()) << be.error().message;
  auto arena = KvArena::create(int64_t{1} << 38, be->get());  // 256 GiB: more than any one GPU has
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(arena.error().message.find("cannot allocate"), std::string::npos) << arena.error().message;
  EXPECT_TRUE((*be)->take_error().ok());
  auto small = KvArena::create(4 << 20, be->get(), 1 << 20);  // four 1 MiB slabs
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_EQ((*small)->capacity_bytes(), 4 << 20);
}

}  // namespace
}  // namespace lragent
