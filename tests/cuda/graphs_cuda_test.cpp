// CUDA graphs for decode steps (src/backend/cuda/graph_tape.h) against the same steps launched
// op by op (--enforce-eager). A synthetic model with head_dim 128 takes the tuned attention
// kernels in bf16 (split-K decode sized for a bucketed context) and the generic kernel in f32;
// decode runs long enough to cross several context buckets, as one sequence, as a batch of two
// sequences of different lengths, as a LoRA agent on a base-lr shared cache, and as ten agents
// taking turns (graphs of one shape rewritten in place with cudaGraphExecUpdate).
//   f32: the graph replays the very kernels with the very inputs: logits bit-identical.
//   bf16: the split count may follow the bucket, not the exact length (another f32 summation
//   order of the split partials, then bf16 activations): logits within 5e-3, the graph run being
//   fed the eager run's tokens (free-running, the first near-tie of two logits would part them).
//   At these lengths every split is one key tile either way and the logits come out
//   bit-identical (H100, 20261124).
// And the graphs are really used: most steps are replays.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "backend/backend.h"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/graph_tape.h"
#include "agents/replay.h"
#include "kv/full_cache.h"
#include "kv/sharing.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

using testing::have_gpu;

double rel_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return 1e30;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

SyntheticSpec spec() { return testing::small_synthetic_spec(); }

// kTenAgents: ten LoRA agents take turns on one base-lr cache, more decode graphs of one shape
// than the tape keeps (2 by default): every step rewrites a cached graph with cudaGraphExecUpdate.
// kLoraPrivate: one LoRA agent (q/v) on a private full cache, whose v_full expand a recorded
// pass computes in the store kernel (GraphStats::fused_lora_stores).
// kTwelveSeqs: a decode pass of 12 sequences (more than 8 rows, recorded since session 36).
enum class Scenario { kOneSeq, kTwoSeqs, kLoraBaseLr, kTenAgents, kLoraPrivate, kTwelveSeqs };

struct DecodeRun {
  std::vector<std::vector<float>> logits;  // [steps * seqs][vocab]
  std::vector<int32_t> picks;              // [(1 + steps) * seqs] greedy picks: prefill's, then each step's
  GraphStats stats;
};

// Prefill `prompt` tokens, then `steps` greedy decode steps; every step's logits. With `force`
// (another run's picks), that run's tokens are fed instead of this run's own picks: bf16 runs
// whose logits legitimately differ in the last bits (another split count) must not part ways at
// the first near-tie of two logits, or the comparison after it compares different texts.
DecodeRun decode(DType dt, bool graphs, Scenario sc, int prompt, int steps,
                 const std::vector<int32_t>* force = nullptr) {
  DecodeRun out;
  CudaBackendOptions o;
  o.dtype = dt;
  o.graphs = graphs;
  auto be_r = make_cuda_backend(o);
  EXPECT_TRUE(be_r.ok()) << be_r.error().message;
  if (!be_r.ok()) return out;
  Backend& be = **be_r;
  auto model_r = make_synthetic_model(spec(), be);
  EXPECT_TRUE(model_r.ok()) << model_r.error().message;
  if (!model_r.ok()) return out;
  LlamaModel& model = **model_r;
  const ModelConfig& c = model.config();
  const int page = 16, max_tokens = prompt + steps + 64;
  const int n_seqs = sc == Scenario::kTwoSeqs ? 2 : sc == Scenario::kTwelveSeqs ? 12 : 1;
  const int stagger = n_seqs > 2 ? 13 : 37;  // prompt lengths prompt - stagger * s

  auto pools = KvPools::create(c, page, KvPools::blocks_for(std::max(2, n_seqs), max_tokens, page), "graphs-test", &be);
  EXPECT_TRUE(pools.ok());
  if (!pools.ok()) return out;
  std::vector<std::unique_ptr<LoraAdapter>> adapters;
  std::unique_ptr<TrajectoryKv> traj;
  std::vector<std::unique_ptr<FullKvCache>> caches;
  const bool shared = sc == Scenario::kLoraBaseLr || sc == Scenario::kTenAgents;
  const bool lora = shared || sc == Scenario::kLoraPrivate;
  const int n_agents = sc == Scenario::kTenAgents ? 10 : 2;
  if (lora) {
    adapters = make_synthetic_adapters(c, 16, 7);
    for (float f : {-0.5f, 0.25f, -2.f}) {  // ten agents: more with the same A (base-lr shares X·A), other B
      if (sc != Scenario::kTenAgents) break;
      for (auto& a : make_synthetic_adapters(c, 16, 7)) {
        for (auto& layer : a->layers)
          for (auto& m : layer)
            if (m) {
              float* b = m->b.f32();
              for (int64_t i = 0; i < m->b.numel(); ++i) b[i] *= f;
            }
        adapters.push_back(std::move(a));
      }
    }
    for (auto& a : adapters) EXPECT_TRUE(upload_adapter(*a, be).ok());
  }
  if (shared) {
    SharingOptions so;
    so.mode = ShareMode::kBaseLr;
    so.page_size = page;
    so.max_tokens = max_tokens;
    so.backend = &be;
    std::vector<const LoraAdapter*> agents;
    for (int a = 0; a < n_agents; ++a) agents.push_back(adapters[static_cast<size_t>(a)].get());
    auto t = TrajectoryKv::create(c, agents, so);
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) return out;
    traj = std::move(*t);
  } else {
    for (int s = 0; s < n_seqs; ++s) caches.push_back(std::make_unique<FullKvCache>(pools->kv.get()));
  }

  // Prefill: sequence s gets prompt - stagger * s tokens (every sequence another length).
  std::vector<int32_t> next(static_cast<size_t>(n_seqs));
  std::vector<int64_t> len(static_cast<size_t>(n_seqs));
  for (int s = 0; s < n_seqs; ++s) {
    const int n = prompt - stagger * s;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = 3 + (i * 31 + s * 7) % 250;
    std::unique_ptr<KvBinding> bind;
    KvBinding* kv = nullptr;
    if (traj) {
      bind = traj->bind(0);
      kv = bind.get();
    } else {
      kv = caches[static_cast<size_t>(s)].get();
    }
    SeqInput in{ids.data(), n, 0, kv, lora ? adapters[0].get() : nullptr, false};
    auto lg = model.forward({in});
    EXPECT_TRUE(lg.ok()) << lg.error().message;
    if (!lg.ok()) return out;
    if (traj) traj->advance(0, n);
    next[static_cast<size_t>(s)] =
        static_cast<int32_t>(std::max_element(lg->f32(), lg->f32() + c.vocab_size) - lg->f32());
    out.picks.push_back(next[static_cast<size_t>(s)]);
    if (force) next[static_cast<size_t>(s)] = (*force)[static_cast<size_t>(s)];
    len[static_cast<size_t>(s)] = n;
  }
  // Decode: in the LoRA scenarios the agents (adapters 0, 1, ...) take turns on the shared cache.
  for (int step = 0; step < steps; ++step) {
    std::vector<SeqInput> batch;
    std::vector<std::unique_ptr<KvBinding>> binds;
    for (int s = 0; s < n_seqs; ++s) {
      const size_t si = static_cast<size_t>(s);
      if (traj) {
        const int agent = step % n_agents;
        binds.push_back(traj->bind(agent));
        batch.push_back({&next[si], 1, len[si], binds.back().get(), adapters[static_cast<size_t>(agent)].get(), false});
      } else {
        batch.push_back({&next[si], 1, len[si], caches[si].get(), lora ? adapters[0].get() : nullptr, false});
      }
    }
    auto lg = model.forward(batch);
    EXPECT_TRUE(lg.ok()) << lg.error().message;
    if (!lg.ok()) return out;
    for (int s = 0; s < n_seqs; ++s) {
      const float* row = lg->f32() + static_cast<int64_t>(s) * c.vocab_size;
      out.logits.emplace_back(row, row + c.vocab_size);
      const size_t si = static_cast<size_t>(s);
      ++len[si];
      if (traj) traj->advance(step % n_agents, len[si]);
      next[si] = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
      out.picks.push_back(next[si]);
      if (force) next[si] = (*force)[out.picks.size() - 1];
    }
  }
  out.stats = be.graph_stats();
  return out;
}

// A prefill without adapters takes the bf16 path whose normalised and SwiGLU activations exist
// only as bf16 GEMM operands (set_matmul_only_outputs): its logits against the CPU's.
// GraphTape's op memory (closures kept in chunks the tape reuses every pass): ops of several
// sizes and alignments, one larger than a chunk, run once each and in order on a signature's
// first (eager) run; a closure's captures live until the next begin() or discard() and are
// destroyed then; a second, longer pass reuses the chunks and grows them. The eager path makes no
// CUDA call, so this runs without a GPU too.
TEST(CudaGraphTape, KeepsEveryOpClosureUntilTheNextPass) {
  struct Counted {  // a capture that counts its live copies
    int* live;
    explicit Counted(int* l) : live(l) { ++*live; }
    Counted(const Counted& o) : live(o.live) { ++*live; }
    ~Counted() { --*live; }
  };
  struct alignas(64) Wide {
    double v[8];
  };
  struct Big {
    unsigned char bytes[100000];  // larger than a chunk (64 KB)
  };
  cuda::GraphTape tape(nullptr);
  std::vector<int> order;
  int live = 0, misaligned = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const int n = 1000 * (pass + 1);
    tape.begin();
    EXPECT_EQ(live, 0) << "begin() destroys the last pass's closures";
    tape.sig(pass);  // a new signature: its first run is eager
    order.clear();
    for (int i = 0; i < n; ++i) {
      switch (i % 4) {
        case 0:
          tape.push([&order, i] {
            order.push_back(i);
            return cudaSuccess;
          });
          break;
        case 1:
          tape.push([&order, i, c = Counted(&live)] {
            order.push_back(i + 0 * *c.live);
            return cudaSuccess;
          });
          break;
        case 2: {
          Wide w{};
          w.v[7] = i;
          tape.push([&order, &misaligned, w] {
            misaligned += reinterpret_cast<uintptr_t>(&w) % alignof(Wide) != 0;
            order.push_back(static_cast<int>(w.v[7]));
            return cudaSuccess;
          });
          break;
        }
        default:
          if (i == n / 2 + 3) {
            Big b{};
            b.bytes[sizeof(b.bytes) - 1] = 7;
            tape.push([&order, i, b] {
              order.push_back(b.bytes[sizeof(b.bytes) - 1] == 7 ? i : -1);
              return cudaSuccess;
            });
          } else {
            tape.push([&order, i, c = Counted(&live), pad = std::array<int64_t, 9>{}] {
              order.push_back(i + static_cast<int>(pad[8]) + 0 * *c.live);
              return cudaSuccess;
            });
          }
      }
    }
    EXPECT_EQ(live, n / 2 - 1) << "every counted capture is held once, by its closure";
    ASSERT_EQ(tape.run(), cudaSuccess);
    ASSERT_EQ(static_cast<int>(order.size()), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(order[i], i) << "pass " << pass;
    EXPECT_EQ(misaligned, 0);
    EXPECT_EQ(live, n / 2 - 1) << "the closures outlive the run (a capture reruns them)";
  }
  tape.discard();
  EXPECT_EQ(live, 0) << "discard() destroys them too";
}

// A pass run in two segments (run_segment, what the backend does to start the GPU on a step's
// first ops while it records the rest): each op runs once, in record order, the first segment's
// as soon as run_segment is called; the first segment's closures are gone after it (the second
// segment reuses their memory); the pass counts once, its first segment in `segments`. Runs
// without a GPU: first sights of a signature run eagerly, which makes no CUDA call.
TEST(CudaGraphTape, RunsAPassInSegmentsInRecordOrder) {
  struct Counted {
    int* live;
    explicit Counted(int* l) : live(l) { ++*live; }
    Counted(const Counted& o) : live(o.live) { ++*live; }
    ~Counted() { --*live; }
  };
  cuda::GraphTape tape(nullptr);
  std::vector<int> order;
  int live = 0;
  auto push = [&](int i) {
    tape.push([&order, i, c = Counted(&live)] {
      order.push_back(i + 0 * *c.live);
      return cudaSuccess;
    });
  };
  tape.begin();
  tape.sig(7);
  for (int i = 0; i < 5; ++i) push(i);
  EXPECT_EQ(tape.size(), 5u);
  EXPECT_TRUE(order.empty()) << "nothing runs while recording";
  ASSERT_EQ(tape.run_segment(), cudaSuccess);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4})) << "the first segment runs at once";
  EXPECT_TRUE(tape.recording()) << "the pass goes on recording";
  EXPECT_EQ(tape.size(), 0u);
  EXPECT_EQ(live, 0) << "the first segment's closures are destroyed after it ran";
  tape.sig(8);
  for (int i = 5; i < 12; ++i) push(i);
  ASSERT_EQ(tape.run(), cudaSuccess);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})) << "the second segment after the first";
  EXPECT_FALSE(tape.recording());
  EXPECT_EQ(tape.stats().passes, 1);
  EXPECT_EQ(tape.stats().segments, 1);
  EXPECT_EQ(tape.stats().eager, 2) << "each segment a first sight of its key";
  tape.discard();
  EXPECT_EQ(live, 0);
}

// A launch that fails while a pass runs op by op (first sight of its key) stops the pass there,
// and failed_op() names it for the backend's error ("recorded pass: op 'matmul' failed when it
// ran: invalid argument", not the bare CUDA string); a clean run clears it. No GPU needed: a
// first sight runs the closures eagerly and these launch nothing.
TEST(CudaGraphTape, NamesTheOpWhoseLaunchFailed) {
  cuda::GraphTape tape(nullptr);
  std::vector<int> ran;
  auto pass = [&](bool fail_second) {
    tape.begin();
    tape.sig(fail_second ? 1 : 2);
    tape.push("embedding", [&ran] {
      ran.push_back(0);
      return cudaSuccess;
    });
    tape.push("matmul", [&ran, fail_second] {
      ran.push_back(1);
      return fail_second ? cudaErrorInvalidValue : cudaSuccess;
    });
    tape.push([&ran] {  // unnamed
      ran.push_back(2);
      return cudaSuccess;
    });
    return tape.run();
  };
  EXPECT_EQ(pass(true), cudaErrorInvalidValue);
  EXPECT_EQ(ran, (std::vector<int>{0, 1})) << "the ops after the failed one do not run";
  ASSERT_NE(tape.failed_op(), nullptr);
  EXPECT_STREQ(tape.failed_op(), "matmul");
  ran.clear();
  EXPECT_EQ(pass(false), cudaSuccess);
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(tape.failed_op(), nullptr) << "a clean run clears it";
  // An unnamed op that fails is still reported as one.
  tape.begin();
  tape.sig(3);
  tape.push([] { return cudaErrorInvalidValue; });
  EXPECT_EQ(tape.run(), cudaErrorInvalidValue);
  ASSERT_NE(tape.failed_op(), nullptr);
  EXPECT_STREQ(tape.failed_op(), "(unnamed)");
}

TEST(CudaPrefill, NoAdapterPrefillMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA prefill test skipped";
  const int n = 300;
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = 3 + (i * 17) % 250;
  auto run = [&](Backend& be) {
    std::vector<float> out;
    auto model = make_synthetic_model(spec(), be);
    EXPECT_TRUE(model.ok());
    if (!model.ok()) return out;
    const ModelConfig& c = (*model)->config();
    auto pools = KvPools::create(c, 16, KvPools::blocks_for(1, n, 16), "prefill-test", &be);
    EXPECT_TRUE(pools.ok());
    if (!pools.ok()) return out;
    FullKvCache kv(pools->kv.get());
    SeqInput in{ids.data(), n, 0, &kv, nullptr, true};  // every row's logits
    auto lg = (*model)->forward({in});
    EXPECT_TRUE(lg.ok());
    if (lg.ok()) out.assign(lg->f32(), lg->f32() + lg->numel());
    return out;
  };
  std::vector<float> ref, f32, bf16, bf16_v6;
  {
    auto cpu = make_cpu_backend(4);
    ref = run(*cpu);
  }
  // bf16 runs the tuned prefill attention (head_dim 128, 600 GQA rows): v5, then v6. On an
  // sm_90 device the last layer's attention must have launched that kernel, not a fallback
  // (LRAGENT_CUDA_PREFILL_KERNEL, when set, overrides the option: this then fails, as it should).
  cudaDeviceProp prop{};
  const bool sm90 = cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
  for (int variant = 0; variant < 3; ++variant) {
    CudaBackendOptions o;
    o.dtype = variant == 0 ? DType::kF32 : DType::kBF16;
    o.prefill_attention = variant == 2 ? 6 : 5;
    auto be = make_cuda_backend(o);
    ASSERT_TRUE(be.ok()) << be.error().message;
    (variant == 0 ? f32 : variant == 1 ? bf16 : bf16_v6) = run(**be);
    if (variant > 0 && sm90)
      EXPECT_EQ(static_cast<int>(cuda::attention_last_kernel()), o.prefill_attention)
          << "the prefill attention ran another kernel than v" << o.prefill_attention;
  }
  ASSERT_EQ(ref.size(), f32.size());
  ASSERT_EQ(ref.size(), bf16.size());
  ASSERT_EQ(ref.size(), bf16_v6.size());
  const double e32 = rel_l2(f32.data(), ref.data(), static_cast<int64_t>(ref.size()));
  const double e16 = rel_l2(bf16.data(), ref.data(), static_cast<int64_t>(ref.size()));
  const double e16_v6 = rel_l2(bf16_v6.data(), ref.data(), static_cast<int64_t>(ref.size()));
  std::printf("  prefill %d tokens, all logits vs CPU: f32 rel_l2 %.2e, bf16 rel_l2 %.2e (attention v6: %.2e)\n", n,
              e32, e16, e16_v6);
  EXPECT_LE(e32, 1e-4);
  EXPECT_LE(e16, 3e-2);
  EXPECT_LE(e16_v6, 3e-2);
}

// Batch-1 decode steps take the decode GEMVs (SwiGLU in the gate/up GEMV's epilogue; in bf16
// the RMSNorms folded into the GEMVs of every layer without LoRA terms, whose residual adds go
// into the o and down projections), RoPE's bf16 copy of q and the v4 decode attention (head_dim
// 128): every step's logits against the CPU's, which runs the separate ops. Without an adapter,
// and with one that adapts only layer 0 or only layer 1 (a layer that folds after one that
// does not, and the other way round).
TEST(CudaDecode, NoAdapterDecodeMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA decode test skipped";
  const int prompt = 97, steps = 6;
  std::vector<int32_t> ids(prompt + steps);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(5 + (i * 31) % 240);
  // adapted_layer: -1 none, else the one layer the adapter keeps.
  auto run = [&](Backend& be, int adapted_layer) {
    std::vector<float> out;
    auto model = make_synthetic_model(spec(), be);
    EXPECT_TRUE(model.ok());
    if (!model.ok()) return out;
    const ModelConfig& c = (*model)->config();
    std::unique_ptr<LoraAdapter> adapter;
    if (adapted_layer >= 0) {
      adapter = std::move(make_synthetic_adapters(c, 8, 3).front());
      for (int l = 0; l < c.num_layers; ++l)
        if (l != adapted_layer)
          for (auto& m : adapter->layers[static_cast<size_t>(l)]) m.reset();
      if (Status st = upload_adapter(*adapter, be); !st.ok()) {
        ADD_FAILURE() << st.error().message;
        return out;
      }
    }
    auto pools = KvPools::create(c, 16, KvPools::blocks_for(1, prompt + steps, 16), "decode-test", &be);
    EXPECT_TRUE(pools.ok());
    if (!pools.ok()) return out;
    FullKvCache kv(pools->kv.get());
    SeqInput pre{ids.data(), prompt, 0, &kv, adapter.get(), false};
    EXPECT_TRUE((*model)->forward({pre}).ok());
    for (int t = 0; t < steps; ++t) {
      SeqInput in{ids.data() + prompt + t, 1, prompt + t, &kv, adapter.get(), false};
      auto lg = (*model)->forward({in});
      EXPECT_TRUE(lg.ok());
      if (lg.ok()) out.insert(out.end(), lg->f32(), lg->f32() + lg->numel());
    }
    return out;
  };
  for (int adapted_layer : {-1, 0, 1}) {
    std::vector<float> ref, f32, bf16;
    {
      auto cpu = make_cpu_backend(4);
      ref = run(*cpu, adapted_layer);
    }
    for (DType dt : {DType::kF32, DType::kBF16}) {
      CudaBackendOptions o;
      o.dtype = dt;
      auto be = make_cuda_backend(o);
      ASSERT_TRUE(be.ok()) << be.error().message;
      (dt == DType::kF32 ? f32 : bf16) = run(**be, adapted_layer);
    }
    ASSERT_EQ(ref.size(), f32.size());
    ASSERT_EQ(ref.size(), bf16.size());
    const double e32 = rel_l2(f32.data(), ref.data(), static_cast<int64_t>(ref.size()));
    const double e16 = rel_l2(bf16.data(), ref.data(), static_cast<int64_t>(ref.size()));
    std::printf("  decode %d steps after %d tokens, adapted layer %d, logits vs CPU: f32 rel_l2 %.2e, bf16 rel_l2 %.2e\n",
                steps, prompt, adapted_layer, e32, e16);
    EXPECT_LE(e32, 1e-4) << "adapted layer " << adapted_layer;
    EXPECT_LE(e16, 3e-2) << "adapted layer " << adapted_layer;
  }
}

// The agents tests' set-up (testing::make_cuda_agents) and a 150-token prompt.
struct AgentsSetup : testing::SyntheticAgents {
  std::vector<int32_t> prompt;
};

bool make_agents(DType dt, AgentsSetup& ag) {
  if (!testing::make_cuda_agents(dt, ag)) return false;
  ag.prompt.resize(150);
  for (size_t i = 0; i < ag.prompt.size(); ++i) ag.prompt[i] = static_cast<int32_t>(3 + (i * 29) % 250);
  return true;
}

// Agents on shared caches (AgentSession) decoding with lookahead against step by step, in
// bf16 with graphs: pass t+1 launched before pass t's pick is read, its token fed on the device.
// The same tokens and, for a last step over the caches, bit-identical logits.
TEST(CudaAgents, DecodeLookaheadMatchesStepByStep) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA agents test skipped";
  AgentsSetup ag;
  ASSERT_TRUE(make_agents(DType::kBF16, ag));
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kBaseLr, ShareMode::kFull}) {
    std::vector<std::vector<int32_t>> outputs[2];
    std::vector<float> last[2];
    int64_t computed[2] = {0, 0};
    for (int la = 0; la < 2; ++la) {
      ReplayOptions ro;
      ro.sharing.mode = mode;
      ro.sharing.max_tokens = 1024;
      ro.decode_lookahead = la == 1;
      auto s = AgentSession::create(*ag.model, nullptr, ag.names, ag.ptrs, ro);
      ASSERT_TRUE(s.ok()) << s.error().message;
      (*s)->append(ag.prompt);
      for (int round = 0; round < 3; ++round)
        for (int a = 0; a < static_cast<int>(ag.names.size()); ++a) {
          const auto& name = ag.names[static_cast<size_t>(a)];
          auto r = a == 1 && round == 1 ? (*s)->run_agent(name, 0, {9, 10, 11}, {}) : (*s)->run_agent(name, 20 + 7 * a, {}, {});
          ASSERT_TRUE(r.ok()) << r.error().message;
          outputs[la].push_back(r->output_tokens);
        }
      (*s)->keep_logits(true);
      auto r = (*s)->run_agent(ag.names[0], 1, {}, {});
      ASSERT_TRUE(r.ok()) << r.error().message;
      last[la] = r->logits.at(0);
      for (int64_t n : (*s)->computed_per_agent()) computed[la] += n;
    }
    EXPECT_EQ(outputs[1], outputs[0]) << share_mode_name(mode);
    EXPECT_EQ(computed[1], computed[0]) << share_mode_name(mode);
    EXPECT_EQ(last[1], last[0]) << share_mode_name(mode) << ": the caches must hold the same entries";
  }
  const GraphStats st = ag.be->graph_stats();
  std::printf("  agents lookahead: %lld recorded passes, %lld replayed\n", static_cast<long long>(st.recorded),
              static_cast<long long>(st.replayed));
  EXPECT_GE(st.replayed, st.recorded / 2);
  EXPECT_EQ(st.host_picks, 0) << "every greedy pick (one row: the catch-up passes' too) on the device";
}

// Agents under one KV memory budget that holds about 1.6 agents' private caches (f32, graphs and
// lookahead on): each call drops the least recently run agent's caches, which that agent
// recomputes at its next call. The tokens are those of the unbudgeted run.
TEST(CudaAgents, EvictionUnderAKvMemoryBudgetKeepsTheTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA agents test skipped";
  AgentsSetup ag;
  ASSERT_TRUE(make_agents(DType::kF32, ag));
  const ModelConfig& c = ag.model->config();
  const int64_t row = 2LL * c.num_kv_heads * c.head_dim * 4;  // f32 K + V of one token and layer
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kDroidSpeak}) {
    std::vector<std::vector<int32_t>> outputs[2];
    int64_t evictions = 0;
    int64_t final_tokens = 0;
    for (int budget = 0; budget < 2; ++budget) {
      ReplayOptions ro;
      ro.sharing.mode = mode;
      ro.sharing.max_tokens = 1024;
      if (mode == ShareMode::kDroidSpeak) ro.sharing.recompute_layers = {0};
      const int64_t priv_layers = mode == ShareMode::kNone ? c.num_layers : 1;
      if (budget == 1)
        ro.sharing.arena_bytes =
            (c.num_layers - priv_layers) * final_tokens * row + final_tokens * priv_layers * row * 8 / 5;
      auto s = AgentSession::create(*ag.model, nullptr, ag.names, ag.ptrs, ro);
      ASSERT_TRUE(s.ok()) << s.error().message;
      (*s)->append(ag.prompt);
      for (int round = 0; round < 3; ++round)
        for (int a = 0; a < static_cast<int>(ag.names.size()); ++a) {
          auto r = (*s)->run_agent(ag.names[static_cast<size_t>(a)], 20 + 7 * a, {}, {});
          ASSERT_TRUE(r.ok()) << share_mode_name(mode) << ": " << r.error().message;
          outputs[budget].push_back(r->output_tokens);
          (*s)->append({static_cast<int32_t>(5 + round), static_cast<int32_t>(6 + a)});
        }
      final_tokens = static_cast<int64_t>((*s)->trajectory().size());
      evictions = (*s)->kv().evictions();
    }
    EXPECT_GE(evictions, 3) << share_mode_name(mode) << ": the budget must force evictions";
    EXPECT_EQ(outputs[1], outputs[0]) << share_mode_name(mode);
    std::printf("  %s under a budget: %lld evictions\n", share_mode_name(mode), static_cast<long long>(evictions));
  }
}

// A session started as a copy of another's prefix (AgentSession::start_from: its pages copied
// on the device between two KV arenas, as the server does for a request beside the one running
// on a trajectory) computes what the original computes from there, in bf16 with graphs and
// lookahead, in every mode: the same tokens and bit-identical logits (the same entries, the same
// kernels). The copy is taken while the original's last pass may still run on the stream.
TEST(CudaAgents, ACopiedTrajectoryComputesAsTheOriginal) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA agents test skipped";
  AgentsSetup ag;
  ASSERT_TRUE(make_agents(DType::kBF16, ag));
  for (ShareMode mode : kAllShareModes) {
    ReplayOptions ro;
    ro.sharing.mode = mode;
    ro.sharing.max_tokens = 1024;
    if (mode == ShareMode::kDroidSpeak) ro.sharing.recompute_layers = {0};
    auto orig = AgentSession::create(*ag.model, nullptr, ag.names, ag.ptrs, ro);
    auto copy = AgentSession::create(*ag.model, nullptr, ag.names, ag.ptrs, ro);
    ASSERT_TRUE(orig.ok() && copy.ok());
    (*orig)->append(ag.prompt);
    for (int a = 0; a < 2; ++a) ASSERT_TRUE((*orig)->run_agent(ag.names[static_cast<size_t>(a)], 17 + a, {}, {}).ok());
    const auto n = static_cast<int64_t>((*orig)->trajectory().size());
    Status st = (*copy)->start_from(**orig, n);
    ASSERT_TRUE(st.ok()) << share_mode_name(mode) << ": " << st.error().message;
    ASSERT_EQ((*copy)->trajectory(), (*orig)->trajectory());
    (*orig)->keep_logits(true);
    (*copy)->keep_logits(true);
    for (AgentSession* s : {orig->get(), copy->get()}) s->append({7, 8, 9});
    for (int a : {2, 0}) {  // an agent that ran nothing, then one whose private caches were copied
      const std::string& name = ag.names[static_cast<size_t>(a)];
      auto r0 = (*orig)->run_agent(name, 12, {}, {});
      auto r1 = (*copy)->run_agent(name, 12, {}, {});
      ASSERT_TRUE(r0.ok() && r1.ok()) << share_mode_name(mode);
      EXPECT_EQ(r1->output_tokens, r0->output_tokens) << share_mode_name(mode) << " " << name;
      EXPECT_EQ(r1->prefilled_tokens, r0->prefilled_tokens) << share_mode_name(mode) << " " << name;
      ASSERT_EQ(r1->logits.size(), r0->logits.size());
      for (size_t i = 0; i < r0->logits.size(); ++i)
        ASSERT_TRUE(r1->logits[i] == r0->logits[i]) << share_mode_name(mode) << " " << name << " step " << i;
    }
  }
}

struct Case {
  DType dt;
  Scenario sc;
  const char* name;
};

class CudaGraphs : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGraphs, DecodeMatchesEager) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA graph tests skipped";
  const Case cs = GetParam();
  // 200 prompt tokens + 400 steps: contexts 200..600 cross the 256 and 512 buckets.
  const int prompt = 200, steps = 400;
  const DecodeRun eager = decode(cs.dt, false, cs.sc, prompt, steps);
  const DecodeRun graph = decode(cs.dt, true, cs.sc, prompt, steps, &eager.picks);
  ASSERT_EQ(eager.logits.size(), graph.logits.size());
  ASSERT_EQ(eager.picks.size(), graph.picks.size());
  ASSERT_FALSE(eager.logits.empty());
  double worst = 0;
  size_t identical = 0;
  for (size_t i = 0; i < eager.logits.size(); ++i) {
    const auto& a = graph.logits[i];
    const auto& b = eager.logits[i];
    worst = std::max(worst, rel_l2(a.data(), b.data(), static_cast<int64_t>(a.size())));
    identical += a == b;
  }
  size_t same_picks = 0;
  for (size_t i = 0; i < eager.picks.size(); ++i) same_picks += eager.picks[i] == graph.picks[i];
  std::printf("  graphs %-18s: %zu steps, %zu bit-identical, worst rel_l2 %.2e, %zu/%zu same greedy picks; passes "
              "%lld: %lld replayed, %lld captured, %lld updated, %lld eager\n",
              cs.name, eager.logits.size(), identical, worst, same_picks, eager.picks.size(), static_cast<long long>(graph.stats.recorded),
              static_cast<long long>(graph.stats.replayed), static_cast<long long>(graph.stats.captured),
              static_cast<long long>(graph.stats.updated), static_cast<long long>(graph.stats.eager));
  EXPECT_EQ(eager.stats.recorded, 0) << "graphs=false must not record";
  EXPECT_GE(graph.stats.recorded, steps);
  if (cs.sc == Scenario::kTenAgents) {
    // Ten signatures of one shape, two cached graphs: rewritten graphs, hardly any eager pass
    // (16, each of a split pass's two segments counted).
    EXPECT_GE(graph.stats.updated, steps / 2);
    EXPECT_LE(graph.stats.eager, graph.stats.segments > 0 ? 32 : 16);
  } else {
    // Each bucket costs one eager pass and one capture; everything else must be a replay.
    EXPECT_GE(graph.stats.replayed, steps - 16);
  }
  if (cs.sc == Scenario::kLoraPrivate) {
    EXPECT_EQ(eager.stats.fused_lora_stores, 0) << "eager passes launch the expand";
    EXPECT_GE(graph.stats.fused_lora_stores, steps) << "every recorded step's v_full is computed by its stores";
  }
  if (cs.dt == DType::kBF16 && cs.sc == Scenario::kOneSeq) {
    EXPECT_EQ(eager.stats.fused_rope_attention, 0) << "eager passes launch RoPE and stores before attention";
    EXPECT_GE(graph.stats.fused_rope_attention, steps) << "a recorded step's attentions do their RoPE and stores";
  }
  if (cs.dt == DType::kF32) {
    EXPECT_EQ(identical, eager.logits.size()) << "f32 graph replays must be bit-identical to eager";
    EXPECT_EQ(same_picks, eager.picks.size());
  } else {
    // Twelve sequences of twelve lengths round differently in bf16 recorded and eager (H200: worst
    // 5.8e-3, 3744 of 4800 rows bit-identical, 4806 of 4812 greedy picks the same; f32 is
    // bit-identical): a recorded pass sizes its launches for its bucketed longest context, an
    // eager one for the exact one. One or two sequences stay within 2e-3.
    EXPECT_LE(worst, cs.sc == Scenario::kTwelveSeqs ? 1e-2 : 5e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGraphs,
                         ::testing::Values(Case{DType::kF32, Scenario::kOneSeq, "f32_one_seq"},
                                           Case{DType::kBF16, Scenario::kOneSeq, "bf16_one_seq"},
                                           Case{DType::kBF16, Scenario::kTwoSeqs, "bf16_two_seqs"},
                                           Case{DType::kF32, Scenario::kTwelveSeqs, "f32_twelve_seqs"},
                                           Case{DType::kBF16, Scenario::kTwelveSeqs, "bf16_twelve_seqs"},
                                           Case{DType::kF32, Scenario::kLoraBaseLr, "f32_lora_base_lr"},
                                           Case{DType::kBF16, Scenario::kLoraBaseLr, "bf16_lora_base_lr"},
                                           Case{DType::kF32, Scenario::kTenAgents, "f32_ten_agents"},
                                           Case{DType::kF32, Scenario::kLoraPrivate, "f32_lora_private"},
                                           Case{DType::kBF16, Scenario::kLoraPrivate, "bf16_lora_private"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace lragent
