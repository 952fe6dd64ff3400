// KV sharing modes: single-agent exactness, equivalence of `none` with plain generate,
// analytic memory accounting for 1 / 3 / 8 agents, and clear errors for invalid set-ups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "agents/replay.h"
#include "engine/generator.h"
#include "model/lora.h"
#include "test_util.h"

namespace lragent {
namespace {

class Sharing : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(2);
    auto m = LlamaModel::load(testing::tinystories_dir(), *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  const LoraAdapter* adapter(const std::string& set, const std::string& role, const std::string& name) {
    auto a = load_lora_adapter(name, testing::adapters_dir() + "/" + set + "/" + role, model_->config());
    EXPECT_TRUE(a.ok()) << a.error().message;
    owned_.push_back(std::move(*a));
    return owned_.back().get();
  }
  // Two agents (plan, action) in none mode whose caches share one host arena that holds `tokens`
  // tokens of one agent's full cache.
  // With three_agents, reflect is the third.
  std::unique_ptr<TrajectoryKv> none_in_arena(int64_t tokens, bool three_agents = false) {
    const ModelConfig& c = model_->config();
    SharingOptions o;
    o.mode = ShareMode::kNone;
    o.max_tokens = 1024;
    o.arena_bytes = static_cast<int64_t>(c.num_layers) * 2 * c.num_kv_heads * c.head_dim * 4 * tokens;
    std::vector<const LoraAdapter*> agents = {adapter("qv-shared-a-r8", "plan", "plan"),
                                              adapter("qv-shared-a-r8", "action", "action")};
    if (three_agents) agents.push_back(adapter("qv-shared-a-r8", "reflect", "reflect"));
    auto kv = TrajectoryKv::create(c, agents, o);
    EXPECT_TRUE(kv.ok()) << kv.error().message;
    return kv.ok() ? std::move(*kv) : nullptr;
  }
  // Agent a's pass over positions [0, tokens): bound, reserved and advanced. The binding is
  // returned (live while kept); null when the reserve fails.
  static std::unique_ptr<KvBinding> pass(TrajectoryKv& kv, int a, int64_t tokens) {
    auto b = kv.bind(a);
    if (!b->reserve(tokens).ok()) return nullptr;
    kv.advance(a, tokens);
    return b;
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<std::unique_ptr<LoraAdapter>> owned_;
};

std::vector<int32_t> prompt_ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(3 + (i * 53) % 2000);
  return ids;
}

using testing::max_abs_diff;

// Replay options for mode m with every logits row kept (droidspeak keeps layer 1 private).
ReplayOptions logits_options(ShareMode m) {
  ReplayOptions o;
  o.sharing.mode = m;
  o.keep_logits = true;
  if (m == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {1};
  return o;
}

TEST_F(Sharing, OneAgentEveryModeEqualsNoneAndNoneEqualsGenerate) {
  for (const std::string set : {"qv-shared-a-r8", "qkvo-shared-a-r4"}) {
    const LoraAdapter* plan = adapter(set, "plan", "plan");
    std::vector<ReplayStep> steps(5);
    steps[0].kind = ReplayStep::Kind::kAppendTokens;
    steps[0].tokens = prompt_ids(30);
    steps[1].kind = ReplayStep::Kind::kGenerate;
    steps[1].agent = "plan";
    steps[1].generate = 9;
    steps[2].kind = ReplayStep::Kind::kAppendTokens;
    steps[2].tokens = prompt_ids(11);
    steps[3] = steps[1];
    steps[4].kind = ReplayStep::Kind::kForce;
    steps[4].agent = "plan";
    steps[4].tokens = {5, 38, 116, 1643};
    std::vector<ReplayResult> results;
    for (ShareMode m : kAllShareModes) {
      auto r = run_replay(*model_, nullptr, {"plan"}, {plan}, steps, logits_options(m));
      ASSERT_TRUE(r.ok()) << share_mode_name(m) << ": " << r.error().message;
      results.push_back(std::move(*r));
    }
    const ReplayResult& none = results[0];
    ASSERT_EQ(none.steps.size(), steps.size());
    // One logits row per generated or forced token: 9, 9 and 4 (the loops below compare them all).
    ASSERT_EQ(none.steps[1].logits.size(), 9u);
    ASSERT_EQ(none.steps[3].logits.size(), 9u);
    ASSERT_EQ(none.steps[4].logits.size(), 4u);
    for (size_t mi = 1; mi < results.size(); ++mi) {
      ASSERT_EQ(results[mi].steps.size(), none.steps.size()) << share_mode_name(kAllShareModes[mi]);
      for (size_t s = 0; s < none.steps.size(); ++s) {
        EXPECT_EQ(results[mi].steps[s].output_tokens, none.steps[s].output_tokens) << set << " mode " << mi << " step " << s;
        EXPECT_EQ(results[mi].steps[s].prefilled_tokens, none.steps[s].prefilled_tokens);
        ASSERT_EQ(results[mi].steps[s].logits.size(), none.steps[s].logits.size()) << set << " mode " << mi << " step " << s;
        for (size_t row = 0; row < none.steps[s].logits.size(); ++row)
          EXPECT_LE(max_abs_diff(results[mi].steps[s].logits[row], none.steps[s].logits[row]), 1e-5f)
              << set << " mode " << share_mode_name(kAllShareModes[mi]) << " step " << s << " row " << row;
      }
    }
    // `none` is plain generation over the trajectory so far with the agent's adapter.
    Generator gen(*model_, EngineOptions{});
    std::vector<int32_t> traj = {1};
    traj.insert(traj.end(), steps[0].tokens.begin(), steps[0].tokens.end());
    GenerateRequest req;
    req.prompt = traj;
    req.max_tokens = 9;
    req.adapter = plan;
    req.keep_first_logits = true;
    auto g = gen.run({req});
    ASSERT_TRUE(g.ok());
    EXPECT_EQ((*g)[0].output, none.steps[1].output_tokens);
    EXPECT_LE(max_abs_diff((*g)[0].first_logits, none.steps[1].logits[0]), 1e-5f);
  }
}

// Qwen3 norms q and k per head before RoPE. A q/v adapter keeps every mode exact (a query is
// computed whole, and V has no norm); a k_proj adapter cannot have its term kept as x·A, so the
// base modes refuse it by name and the others stay exact.
TEST(SharingQwen3, QvAdaptersShareEveryModeAndKAdaptersOnlyTheFullOnes) {
  auto be = make_cpu_backend(2);
  auto model = LlamaModel::load(testing::fixtures_dir() + "/models/synthetic-qwen3", *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  for (const std::string name : {"qv", "qkvo"}) {
    auto ad = load_lora_adapter(name, testing::fixtures_dir() + "/adapters/synthetic-qwen3/" + name, (*model)->config());
    ASSERT_TRUE(ad.ok()) << ad.error().message;
    std::vector<ReplayStep> steps(4);
    steps[0].kind = ReplayStep::Kind::kAppendTokens;
    for (int i = 0; i < 23; ++i) steps[0].tokens.push_back(3 + (i * 37) % 300);
    steps[1].kind = ReplayStep::Kind::kGenerate;
    steps[1].agent = name;
    steps[1].generate = 7;
    steps[2].kind = ReplayStep::Kind::kAppendTokens;
    steps[2].tokens = {40, 41, 42, 300, 5};
    steps[3] = steps[1];
    std::vector<ReplayResult> results;
    for (ShareMode m : kAllShareModes) {
      auto r = run_replay(**model, nullptr, {name}, {ad->get()}, steps, logits_options(m));
      const bool low_rank_k = name == "qkvo" && (m == ShareMode::kBase || m == ShareMode::kBaseLr);
      if (low_rank_k) {
        ASSERT_FALSE(r.ok()) << share_mode_name(m);
        EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
        EXPECT_NE(r.error().message.find(std::string("--kv-share ") + share_mode_name(m) +
                                         " keeps k_proj's LoRA term in low-rank form, but Qwen3ForCausalLM RMS-norms "
                                         "every key (k_norm)"),
                  std::string::npos)
            << r.error().message;
        EXPECT_NE(r.error().message.find("adapter 'qkvo' adapts k_proj"), std::string::npos) << r.error().message;
        continue;
      }
      ASSERT_TRUE(r.ok()) << name << " " << share_mode_name(m) << ": " << r.error().message;
      results.push_back(std::move(*r));
    }
    ASSERT_EQ(results.size(), name == "qv" ? 5u : 3u);
    const ReplayResult& none = results[0];
    ASSERT_EQ(none.steps[1].logits.size(), 7u);
    ASSERT_EQ(none.steps[3].logits.size(), 7u);
    for (size_t mi = 1; mi < results.size(); ++mi)
      for (size_t s = 0; s < none.steps.size(); ++s) {
        EXPECT_EQ(results[mi].steps[s].output_tokens, none.steps[s].output_tokens) << name << " " << mi << " " << s;
        ASSERT_EQ(results[mi].steps[s].logits.size(), none.steps[s].logits.size());
        for (size_t row = 0; row < none.steps[s].logits.size(); ++row)
          EXPECT_LE(max_abs_diff(results[mi].steps[s].logits[row], none.steps[s].logits[row]), 1e-5f)
              << name << " mode " << mi << " step " << s << " row " << row;
      }
    // none is plain generation with the adapter (which the goldens check against PEFT).
    Generator gen(**model, EngineOptions{});
    GenerateRequest req;
    req.prompt = {1};
    req.prompt.insert(req.prompt.end(), steps[0].tokens.begin(), steps[0].tokens.end());
    req.max_tokens = 7;
    req.adapter = ad->get();
    auto g = gen.run({req});
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ((*g)[0].output, none.steps[1].output_tokens) << name;
  }
}

// n agents generate `total / n` tokens each after a 40-token prompt.
struct MemoryRun {
  CacheBytes bytes;
  std::vector<int64_t> processed;
  int64_t trajectory = 0;
};

TEST_F(Sharing, ReportedBytesFollowTheAnalyticFormula) {
  const ModelConfig& c = model_->config();
  const int64_t L = c.num_layers, W = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const char* roles[] = {"plan", "action", "reflect"};
  std::map<int, int64_t> base_bytes_by_agents;
  for (int n_agents : {1, 3, 8}) {
    const int per_agent = 24 / n_agents;
    std::vector<std::string> names;
    std::vector<const LoraAdapter*> ads;
    for (int i = 0; i < n_agents; ++i) {
      names.push_back("agent" + std::to_string(i));
      ads.push_back(adapter("qv-shared-a-r8", roles[i % 3], names.back()));
    }
    std::vector<ReplayStep> steps(1);
    steps[0].kind = ReplayStep::Kind::kAppendTokens;
    steps[0].tokens = prompt_ids(40);
    for (int i = 0; i < n_agents; ++i) {
      ReplayStep s;
      s.kind = ReplayStep::Kind::kGenerate;
      s.agent = names[static_cast<size_t>(i)];
      s.generate = per_agent;
      steps.push_back(s);
    }
    const int64_t final_len = 1 + 40 + 24;
    const int64_t shared = final_len - 1;  // the last generated token is never forwarded
    std::vector<int64_t> processed;        // each agent: trajectory before its turn + its tokens but the last
    for (int i = 0; i < n_agents; ++i) processed.push_back(41 + static_cast<int64_t>(i) * per_agent + per_agent - 1);
    int64_t sum_processed = 0;
    for (int64_t p : processed) sum_processed += p;
    const int64_t rank = 8, vb = 4;
    for (ShareMode m : kAllShareModes) {
      ReplayOptions o;
      o.sharing.mode = m;
      if (m == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {0};
      auto r = run_replay(*model_, nullptr, names, ads, steps, o);
      ASSERT_TRUE(r.ok()) << r.error().message;
      const CacheBytes& b = r->cache;
      CacheBytes want;
      switch (m) {
        case ShareMode::kNone: want.full = sum_processed * L * 2 * W * vb; break;
        case ShareMode::kFull: want.full = shared * L * 2 * W * vb; break;
        case ShareMode::kDroidSpeak: want.full = (shared * (L - 1) + sum_processed * 1) * 2 * W * vb; break;
        case ShareMode::kBase:
          want.base = shared * L * 2 * W * vb;
          want.lr = sum_processed * L * rank * vb;  // q/v adapters: LR holds only X·A_v
          break;
        case ShareMode::kBaseLr:
          want.base = shared * L * 2 * W * vb;
          want.lr = shared * L * rank * vb;
          break;
      }
      EXPECT_EQ(b.base, want.base) << share_mode_name(m) << " agents " << n_agents;
      EXPECT_EQ(b.lr, want.lr) << share_mode_name(m) << " agents " << n_agents;
      EXPECT_EQ(b.full, want.full) << share_mode_name(m) << " agents " << n_agents;
      EXPECT_GE(b.page_overhead(), 0);
      if (m == ShareMode::kBase) base_bytes_by_agents[n_agents] = b.base;
    }
  }
  // One base cache whatever the number of agents.
  EXPECT_EQ(base_bytes_by_agents[1], base_bytes_by_agents[3]);
  EXPECT_EQ(base_bytes_by_agents[1], base_bytes_by_agents[8]);
}

// K and V of every cache share one block table (one pool, K planes then V planes), which the GPU
// prefill kernel needs to compute one address per key; their rows must still be disjoint.
TEST_F(Sharing, KAndVShareOneBlockTableInEveryMode) {
  const ModelConfig& c = model_->config();
  std::vector<const LoraAdapter*> ads = {adapter("qv-shared-a-r8", "plan", "plan"),
                                         adapter("qv-shared-a-r8", "action", "action")};
  for (ShareMode m : kAllShareModes) {
    SharingOptions o;
    o.mode = m;
    o.max_tokens = 100;
    if (m == ShareMode::kDroidSpeak) o.recompute_layers = {1};
    auto kv = TrajectoryKv::create(c, ads, o);
    ASSERT_TRUE(kv.ok()) << share_mode_name(m) << ": " << kv.error().message;
    for (int a = 0; a < 2; ++a) {
      auto b = (*kv)->bind(a);
      ASSERT_TRUE(b->reserve(40).ok()) << share_mode_name(m);
      for (int l = 0; l < c.num_layers; ++l) {
        AttentionParams p;
        b->attention_views(l, p);
        EXPECT_EQ(p.k.table, p.v.table) << share_mode_name(m) << " layer " << l;
        EXPECT_EQ(p.k.page_size, p.v.page_size);
        EXPECT_EQ(p.k.block_step(), p.v.block_step());
        // V's rows of every block lie past K's rows of the same block and layer, never on them.
        const auto* k0 = static_cast<const char*>(p.k.data);
        const auto* v0 = static_cast<const char*>(p.v.data);
        EXPECT_GE(v0 - k0, static_cast<std::ptrdiff_t>(p.k.page_size * p.k.row_stride * dtype_size(p.k.dtype)))
            << share_mode_name(m) << " layer " << l;
      }
    }
  }
}

// check_shared_a on its own (what `serve --kv-share auto` asks before it picks base-lr): the
// shared-A set passes whole and with the base model among it; the independent set fails naming
// the first layer and pair, and one adapter alone always passes.
TEST_F(Sharing, CheckSharedAComparesEveryKAndVLoraA) {
  const int L = model_->config().num_layers;
  std::vector<const LoraAdapter*> shared = {adapter("qv-shared-a-r8", "plan", "plan"),
                                            adapter("qv-shared-a-r8", "action", "action"),
                                            adapter("qv-shared-a-r8", "reflect", "reflect")};
  EXPECT_TRUE(check_shared_a(shared, L).ok());
  std::vector<const LoraAdapter*> indep = {adapter("qv-indep-a-r8", "plan", "plan"),
                                           adapter("qv-indep-a-r8", "reflect", "reflect")};
  const Status st = check_shared_a(indep, L);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message.find("v_proj of layer 0 has a different lora_A in 'plan' and 'reflect'"),
            std::string::npos)
      << st.error().message;
  EXPECT_TRUE(check_shared_a({indep[0]}, L).ok());
  EXPECT_TRUE(check_shared_a({}, L).ok());
  // The base model adapts nothing: beside an adapter with v_proj its "A" differs.
  const Status with_base = check_shared_a({nullptr, shared[0]}, L);
  ASSERT_FALSE(with_base.ok());
  EXPECT_NE(with_base.error().message.find("in the base model and 'plan'"), std::string::npos)
      << with_base.error().message;
}

TEST_F(Sharing, InvalidSetupsFailClearly) {
  std::vector<const LoraAdapter*> indep = {adapter("qv-indep-a-r8", "plan", "plan"),
                                           adapter("qv-indep-a-r8", "action", "action")};
  SharingOptions o;
  o.mode = ShareMode::kBaseLr;
  auto r = TrajectoryKv::create(model_->config(), indep, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  // The LR cache holds X·A of v_proj (not q_proj): the first A it would share differs in layer 0.
  EXPECT_NE(r.error().message.find("base-lr needs shared-A adapters, but v_proj of layer 0 has a different lora_A "
                                   "in 'plan' and 'action'"),
            std::string::npos)
      << r.error().message;
  o.mode = ShareMode::kDroidSpeak;
  o.recompute_layers = {7};
  auto d = TrajectoryKv::create(model_->config(), indep, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(d.error().message.find("layer 7 is out of range; the model has 2 layers (0-1)"), std::string::npos)
      << d.error().message;
  auto bad_mode = parse_share_mode("fully");
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_EQ(bad_mode.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad_mode.error().message, "'fully' is not a sharing mode; choose none, full, base, base-lr, droidspeak or icarus");
  for (ShareMode m : kAllShareModes) {  // every name the error lists parses back to its mode
    auto back = parse_share_mode(share_mode_name(m));
    ASSERT_TRUE(back.ok()) << share_mode_name(m);
    EXPECT_EQ(*back, m);
  }
  SharingOptions zero;
  zero.page_size = 0;  // sizes the pools by dividing by it
  auto z = TrajectoryKv::create(model_->config(), indep, zero);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(z.error().message.find("page size (0) and max tokens"), std::string::npos) << z.error().message;
}

// Replay input the session refuses as input, not as an internal error: forced ids outside the
// vocabulary (the last one too, which joins the trajectory without being forwarded), and an agent
// step on an empty trajectory (a model without BOS, before anything is appended).
TEST_F(Sharing, BadReplayInputIsAnInputError) {
  const LoraAdapter* plan = adapter("qv-shared-a-r8", "plan", "plan");
  const int vocab = model_->config().vocab_size;
  for (bool lookahead : {true, false}) {
    ReplayOptions o;
    o.decode_lookahead = lookahead;
    auto s = AgentSession::create(*model_, nullptr, {"plan"}, {plan}, o);
    ASSERT_TRUE(s.ok());
    (*s)->append(prompt_ids(5));
    const size_t before = (*s)->trajectory().size();
    for (const std::vector<int32_t>& ids : {std::vector<int32_t>{vocab}, std::vector<int32_t>{5, 6, vocab + 7},
                                            std::vector<int32_t>{-1}}) {
      ReplayStep st;
      st.kind = ReplayStep::Kind::kForce;
      st.agent = "plan";
      st.tokens = ids;
      auto r = (*s)->run_step(st);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
      EXPECT_NE(r.error().message.find("force_tokens: id"), std::string::npos) << r.error().message;
      EXPECT_EQ((*s)->trajectory().size(), before) << "nothing joins the trajectory";
    }
  }
  // tinystories-656k without bos_token_id in its config.json (and no tokenizer to name one).
  const std::string dir = testing::temp_dir("no-bos");
  std::filesystem::copy_file(testing::tinystories_dir() + "/model.safetensors", dir + "/model.safetensors");
  auto cfg = nlohmann::json::parse(testing::read_file(testing::tinystories_dir() + "/config.json"));
  cfg.erase("bos_token_id");
  std::ofstream(dir + "/config.json") << cfg.dump();
  auto bare = LlamaModel::load(dir, *be_);
  ASSERT_TRUE(bare.ok()) << bare.error().message;
  ASSERT_LT((*bare)->config().bos_token_id, 0);
  auto s = AgentSession::create(**bare, nullptr, {"plan"}, {plan}, ReplayOptions{});
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_TRUE((*s)->trajectory().empty());
  auto r = (*s)->run_agent("plan", 2, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("the trajectory is empty"), std::string::npos) << r.error().message;
}

// A session started from another's prefix (AgentSession::start_from) in one shared KV arena
// takes the prefix's whole blocks by reference (copy-on-write) instead of copying them. In every
// mode: the fork decodes the tokens and logits of a fork made by copying (separate arenas); the
// source, cut back inside a shared block and continued with other tokens afterwards, decodes as
// if there were no fork (a shared block is never written); and the fork goes on decoding the same
// after the source and its pools are gone (the fork's pools adopt the shared blocks' slabs).
TEST_F(Sharing, ForksInOneArenaShareThePrefixBlocks) {
  const std::vector<std::string> names = {"plan", "action"};
  const std::vector<const LoraAdapter*> agents = {adapter("qv-shared-a-r8", "plan", "plan"),
                                                  adapter("qv-shared-a-r8", "action", "action")};
  for (ShareMode m : kAllShareModes) {
    SCOPED_TRACE(share_mode_name(m));
    ReplayOptions o = logits_options(m);
    o.sharing.max_tokens = 256;
    auto arena = KvArena::create(64 << 20, nullptr, 1 << 20);
    ASSERT_TRUE(arena.ok());
    ReplayOptions shared = o;
    shared.sharing.arena = arena->get();
    // Source: a 45-token prompt, plan decodes 6, action 5 (a fork point inside a block of 16).
    auto run_source = [&](const ReplayOptions& ro) {
      auto s = AgentSession::create(*model_, nullptr, names, agents, ro);
      EXPECT_TRUE(s.ok()) << s.error().message;
      (*s)->append(prompt_ids(45));
      EXPECT_TRUE((*s)->run_agent("plan", 6, {}, {}).ok());
      EXPECT_TRUE((*s)->run_agent("action", 5, {}, {}).ok());
      return std::move(*s);
    };
    auto fork_of = [&](const AgentSession& src, const ReplayOptions& ro, int64_t at) {
      auto f = AgentSession::create(*model_, nullptr, names, agents, ro);
      EXPECT_TRUE(f.ok()) << f.error().message;
      EXPECT_TRUE((*f)->start_from(src, at).ok());
      return std::move(*f);
    };
    auto decode = [](AgentSession& s, const std::string& agent, const std::vector<int32_t>& more) {
      s.append(more);
      auto r = s.run_agent(agent, 7, {}, {});
      EXPECT_TRUE(r.ok()) << r.error().message;
      return r.ok() ? *r : StepResult{};
    };
    const std::vector<int32_t> q1 = {11, 12, 13}, q2 = {21, 22};
    // References: a copied fork, and a source that never had one.
    auto ref_src = run_source(o);
    auto ref_fork = fork_of(*ref_src, o, 53);
    const StepResult want_fork = decode(*ref_fork, "action", q1);
    const StepResult want_fork2 = decode(*ref_fork, "plan", q2);
    ref_src->truncate(40);
    const StepResult want_src = decode(*ref_src, "plan", q2);

    auto src = run_source(shared);
    auto fork = fork_of(*src, shared, 53);
    const StepResult got_fork = decode(*fork, "action", q1);
    EXPECT_EQ(got_fork.output_tokens, want_fork.output_tokens);
    ASSERT_EQ(got_fork.logits.size(), want_fork.logits.size());
    for (size_t i = 0; i < got_fork.logits.size(); ++i)
      EXPECT_LE(max_abs_diff(got_fork.logits[i], want_fork.logits[i]), 1e-5f) << "fork logits row " << i;
    src->truncate(40);  // inside the block [32, 48) the fork shares
    const StepResult got_src = decode(*src, "plan", q2);
    EXPECT_EQ(got_src.output_tokens, want_src.output_tokens);
    for (size_t i = 0; i < got_src.logits.size() && i < want_src.logits.size(); ++i)
      EXPECT_LE(max_abs_diff(got_src.logits[i], want_src.logits[i]), 1e-5f) << "source logits row " << i;
    src.reset();  // the source and its pools go; the fork's shared blocks stay, adopted by its pools
    EXPECT_EQ((*arena)->orphan_slabs(), 0);
    const StepResult got_fork2 = decode(*fork, "plan", q2);
    EXPECT_EQ(got_fork2.output_tokens, want_fork2.output_tokens);
    for (size_t i = 0; i < got_fork2.logits.size() && i < want_fork2.logits.size(); ++i)
      EXPECT_LE(max_abs_diff(got_fork2.logits[i], want_fork2.logits[i]), 1e-5f) << "fork logits row " << i;
    fork.reset();
    EXPECT_EQ((*arena)->free_slabs(), (*arena)->n_slabs());
  }
}

// A session copied into another set of agents (a server that loads or unloads an adapter):
// start_from maps agents by name and adapter. In every mode, a copy that adds reflect and one
// that drops plan decode what a session that always had those agents decodes after the same
// turns, and the agents kept compute only the new tokens (their private entries were taken);
// a name whose adapter changed (unloaded, loaded again from another directory) takes nothing.
TEST_F(Sharing, ACopyIntoOtherAgentsKeepsWhatTheyShare) {
  const LoraAdapter* plan = adapter("qv-shared-a-r8", "plan", "plan");
  const LoraAdapter* action = adapter("qv-shared-a-r8", "action", "action");
  const LoraAdapter* reflect = adapter("qv-shared-a-r8", "reflect", "reflect");
  const LoraAdapter* action2 = adapter("qv-shared-a-r8", "action", "action");  // the same files again
  for (ShareMode m : kAllShareModes) {
    SCOPED_TRACE(share_mode_name(m));
    ReplayOptions o = logits_options(m);
    o.sharing.max_tokens = 256;
    auto arena = KvArena::create(64 << 20, nullptr, 1 << 20);
    ASSERT_TRUE(arena.ok());
    o.sharing.arena = arena->get();
    auto session = [&](std::vector<std::string> names, std::vector<const LoraAdapter*> ads) {
      auto s = AgentSession::create(*model_, nullptr, std::move(names), std::move(ads), o);
      EXPECT_TRUE(s.ok()) << s.error().message;
      return s.ok() ? std::move(*s) : nullptr;
    };
    auto turns = [&](AgentSession& s) {
      s.append(prompt_ids(45));
      ASSERT_TRUE(s.run_agent("plan", 6, {}, {}).ok());
      ASSERT_TRUE(s.run_agent("action", 5, {}, {}).ok());
      s.append({11, 12, 13});
    };
    auto decode = [](AgentSession& s, const std::string& agent) {
      auto r = s.run_agent(agent, 7, {}, {});
      EXPECT_TRUE(r.ok()) << r.error().message;
      return r.ok() ? *r : StepResult{};
    };
    auto same = [](const StepResult& got, const StepResult& want, const char* what) {
      EXPECT_EQ(got.output_tokens, want.output_tokens) << what;
      ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
      for (size_t i = 0; i < got.logits.size(); ++i)
        EXPECT_LE(max_abs_diff(got.logits[i], want.logits[i]), 1e-5f) << what << " logits row " << i;
    };
    auto src = session({"plan", "action"}, {plan, action});
    turns(*src);
    const int64_t n = static_cast<int64_t>(src->trajectory().size());
    const int64_t action_computed = src->computed_per_agent()[1];

    // reflect added: the reference had three agents from the start.
    auto ref3 = session({"plan", "action", "reflect"}, {plan, action, reflect});
    turns(*ref3);
    auto grown = session({"plan", "action", "reflect"}, {plan, action, reflect});
    ASSERT_TRUE(grown->start_from(*src, n, /*keep_counts=*/true).ok());
    EXPECT_EQ(grown->trajectory(), src->trajectory());
    EXPECT_EQ(grown->computed_per_agent()[1], action_computed);
    same(decode(*grown, "reflect"), decode(*ref3, "reflect"), "reflect, added");
    const StepResult act = decode(*grown, "action"), ref_act = decode(*ref3, "action");
    same(act, ref_act, "action, kept");
    // action computed only what it had not, as in the reference (its private entries were taken).
    EXPECT_EQ(act.prefilled_tokens, ref_act.prefilled_tokens);
    EXPECT_LT(act.prefilled_tokens, n);

    // plan dropped: action goes on as in the source.
    auto ref2 = session({"plan", "action"}, {plan, action});
    turns(*ref2);
    auto shrunk = session({"action"}, {action});
    ASSERT_TRUE(shrunk->start_from(*src, n, /*keep_counts=*/true).ok());
    same(decode(*shrunk, "action"), decode(*ref2, "action"), "action, plan dropped");

    // The same name on another adapter object takes none of the old one's private entries.
    auto reloaded = session({"plan", "action"}, {plan, action2});
    ASSERT_TRUE(reloaded->start_from(*src, n, /*keep_counts=*/true).ok());
    EXPECT_EQ(reloaded->computed_per_agent()[1], 0);
    EXPECT_EQ(reloaded->kv().processed(1), 0);
    EXPECT_EQ(reloaded->kv().processed(0), src->kv().processed(0));
  }
}

TEST_F(Sharing, ExhaustedPoolIsAnErrorAndKeepsTheTrajectory) {
  const LoraAdapter* plan = adapter("qv-shared-a-r8", "plan", "plan");
  ReplayOptions o;
  o.sharing.mode = ShareMode::kBaseLr;
  o.sharing.max_tokens = 32;
  auto s = AgentSession::create(*model_, nullptr, {"plan"}, {plan}, o);
  ASSERT_TRUE(s.ok());
  (*s)->append(prompt_ids(20));
  auto ok = (*s)->run_agent("plan", 4, {}, {});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  (*s)->append(prompt_ids(30));
  auto full = (*s)->run_agent("plan", 4, {}, {});
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::kOutOfMemory);
  EXPECT_EQ((*s)->trajectory().size(), 1u + 20 + 4 + 30);  // nothing lost
}

// Under a KV budget that holds about 1.6 agents' private caches, the third agent's call drops the
// least recently run agent's (SharingOptions::evict_private); that agent recomputes them at its
// next call. The tokens and logits are those of an unbudgeted run; without eviction the same
// budget is an out-of-memory error.
TEST_F(Sharing, EvictionUnderAKvBudgetRecomputesAndKeepsTheTokens) {
  const std::vector<const LoraAdapter*> agents = {adapter("qv-shared-a-r8", "plan", "plan"),
                                                  adapter("qv-shared-a-r8", "action", "action"),
                                                  adapter("qv-shared-a-r8", "reflect", "reflect")};
  const std::vector<std::string> names = {"plan", "action", "reflect"};
  std::vector<ReplayStep> steps;
  auto append = [&](int n, int salt) {
    ReplayStep st;
    st.kind = ReplayStep::Kind::kAppendTokens;
    for (int i = 0; i < n; ++i) st.tokens.push_back(3 + (i * 53 + salt * 7) % 2000);
    steps.push_back(st);
  };
  auto generate = [&](const char* agent) {
    ReplayStep st;
    st.kind = ReplayStep::Kind::kGenerate;
    st.agent = agent;
    st.generate = 6;
    steps.push_back(st);
  };
  append(120, 0);
  generate("plan");
  append(60, 1);
  generate("action");
  append(60, 2);
  generate("reflect");
  append(40, 3);
  generate("plan");
  generate("action");
  const ModelConfig& c = model_->config();
  const int64_t row = 2LL * c.num_kv_heads * c.head_dim * 4;  // f32 K + V of one token and layer
  for (ShareMode mode : {ShareMode::kNone, ShareMode::kDroidSpeak}) {
    SCOPED_TRACE(share_mode_name(mode));
    ReplayOptions o;
    o.keep_logits = true;
    o.sharing.mode = mode;
    o.sharing.max_tokens = 512;
    if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {1};
    auto ref = run_replay(*model_, nullptr, names, agents, steps, o);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    const int64_t final_tokens = static_cast<int64_t>(ref->trajectory.size());  // 1 + 280 + 30 = 311
    // Private bytes per agent at the end; the budget holds 1.6 agents' and the shared layers.
    const int64_t priv_layers = mode == ShareMode::kNone ? c.num_layers : 1;
    const int64_t per_agent = final_tokens * priv_layers * row;
    o.sharing.arena_bytes = (c.num_layers - priv_layers) * final_tokens * row + per_agent * 8 / 5;
    auto evicting = AgentSession::create(*model_, nullptr, names, agents, o);
    ASSERT_TRUE(evicting.ok()) << evicting.error().message;
    std::vector<StepResult> got;
    for (const ReplayStep& st : steps) {
      auto r = (*evicting)->run_step(st);
      ASSERT_TRUE(r.ok()) << r.error().message;
      got.push_back(std::move(*r));
    }
    TrajectoryKv& kv = (*evicting)->kv();
    EXPECT_GE(kv.evictions(), 2) << "the budget must force evictions for this test to mean anything";
    EXPECT_GT(kv.evicted_tokens(), 0);
    EXPECT_EQ((*evicting)->trajectory(), ref->trajectory);
    int64_t computed = 0, ref_computed = 0;
    for (size_t a = 0; a < 3; ++a) {
      computed += (*evicting)->computed_per_agent()[a];
      ref_computed += ref->computed_per_agent[a];
    }
    // An evicted agent computes its dropped tokens again if it is called again (the last evicted
    // one may not be).
    EXPECT_GT(computed, ref_computed);
    EXPECT_LE(computed - ref_computed, kv.evicted_tokens());
    for (size_t i = 0; i < steps.size(); ++i) {
      ASSERT_EQ(got[i].output_tokens, ref->steps[i].output_tokens) << "step " << i;
      ASSERT_EQ(got[i].logits.size(), ref->steps[i].logits.size());
      for (size_t t = 0; t < got[i].logits.size(); ++t)
        EXPECT_LT(max_abs_diff(got[i].logits[t], ref->steps[i].logits[t]), 1e-3f) << "step " << i << " token " << t;
    }
    const CacheBytes peak = kv.peak_bytes(), now = kv.bytes();
    EXPECT_LE(peak.allocated, kv.bytes().reserved);
    EXPECT_GE(peak.total(), now.total());
    EXPECT_LT(now.total(), ref->cache.total()) << "an evicted agent holds fewer tokens than in the unbudgeted run";

    // The same budget without eviction runs out of memory at the third agent's call, naming it.
    o.sharing.evict_private = false;
    auto strict = run_replay(*model_, nullptr, names, agents, steps, o);
    ASSERT_FALSE(strict.ok());
    EXPECT_EQ(strict.error().code, ErrorCode::kOutOfMemory);
    EXPECT_NE(strict.error().message.find("exhausted"), std::string::npos) << strict.error().message;
  }
}

// An agent whose binding is alive (its views may be in the same batch) is never dropped; once the
// binding is gone it is, and its processed position goes back to 0.
TEST_F(Sharing, LiveBindingsAreNeverEvicted) {
  auto kv = none_in_arena(400);  // one agent's 300 tokens, not two
  ASSERT_TRUE(kv);
  auto b0 = pass(*kv, 0, 300);
  ASSERT_TRUE(b0);
  {
    auto b1 = kv->bind(1);
    const Status st = b1->reserve(300);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::kOutOfMemory);
    EXPECT_EQ(kv->evictions(), 0);
    EXPECT_EQ(kv->processed(0), 300);
  }
  b0.reset();
  auto b1 = kv->bind(1);
  ASSERT_TRUE(b1->reserve(300).ok());
  EXPECT_EQ(kv->evictions(), 1);
  EXPECT_EQ(kv->evicted_tokens(), 300);
  EXPECT_EQ(kv->processed(0), 0);
  EXPECT_EQ(kv->catchup_start(0), 0) << "agent 0 recomputes from the start";
}

// A pass that would not fit the whole arena by itself drops nothing: the error says so and the
// other agents keep their caches.
TEST_F(Sharing, APassLargerThanTheArenaEvictsNothing) {
  auto kv = none_in_arena(400);
  ASSERT_TRUE(kv);
  ASSERT_TRUE(pass(*kv, 0, 300));
  auto b1 = kv->bind(1);
  const Status st = b1->reserve(800);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(st.error().message.find("alone need more than the whole KV memory"), std::string::npos)
      << st.error().message;
  EXPECT_EQ(kv->evictions(), 0);
  EXPECT_EQ(kv->processed(0), 300);
  ASSERT_TRUE(b1->reserve(300).ok()) << "a pass that fits alone still evicts";
  EXPECT_EQ(kv->evictions(), 1);
}

// A pass that fits the arena alone, but not beside caches that cannot be dropped (an agent running
// in the same batch), drops nothing either: the droppable agent keeps its cache.
TEST_F(Sharing, APassThatCannotFitBesideLiveCachesEvictsNothing) {
  auto kv = none_in_arena(700, /*three_agents=*/true);
  ASSERT_TRUE(kv);
  ASSERT_TRUE(pass(*kv, 2, 100));
  auto b0 = pass(*kv, 0, 300);  // live: agent 1's pass runs beside it
  ASSERT_TRUE(b0);
  {
    auto b1 = kv->bind(1);
    const Status st = b1->reserve(600);  // fits the arena alone; beside agent 0's 300 tokens it cannot
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::kOutOfMemory);
    EXPECT_NE(st.error().message.find("would not make room"), std::string::npos) << st.error().message;
    EXPECT_EQ(kv->evictions(), 0);
    EXPECT_EQ(kv->processed(2), 100) << "agent 2's cache is kept";
    ASSERT_TRUE(b1->reserve(350).ok()) << "a pass that fits once agent 2 is dropped still evicts";
    EXPECT_EQ(kv->evictions(), 1);
    EXPECT_EQ(kv->processed(2), 0);
    EXPECT_EQ(kv->processed(0), 300);
  }
}

// Pools sized per cache (no shared budget) never evict: another agent's blocks would not make room.
TEST_F(Sharing, PerCachePoolsDoNotEvict) {
  const LoraAdapter* plan = adapter("qv-shared-a-r8", "plan", "plan");
  const LoraAdapter* action = adapter("qv-shared-a-r8", "action", "action");
  ReplayOptions o;
  o.sharing.mode = ShareMode::kNone;
  o.sharing.max_tokens = 64;
  auto s = AgentSession::create(*model_, nullptr, {"plan", "action"}, {plan, action}, o);
  ASSERT_TRUE(s.ok());
  (*s)->append(prompt_ids(40));
  ASSERT_TRUE((*s)->run_agent("plan", 2, {}, {}).ok());
  (*s)->append(prompt_ids(30));
  auto r = (*s)->run_agent("action", 2, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOutOfMemory);
  EXPECT_EQ((*s)->kv().evictions(), 0);
  EXPECT_EQ((*s)->kv().processed(0), 42) << "plan's cache is kept";
}

}  // namespace
}  // namespace lragent
