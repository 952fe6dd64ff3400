// The fixture the server and agent-turn tests share: tinystories-656k on a 2-thread CPU backend, its tokenizer,
// and the plan/action/reflect adapters of qv-shared-a-r8 (the agents).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "agents/replay.h"
#include "backend/backend.h"
#include "model/llama.h"
#include "model/lora.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent::testing {

class TinyAgentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(2);
    auto m = LlamaModel::load(tinystories_dir(), *be_);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    auto t = Tokenizer::load_dir(tinystories_dir());
    ASSERT_TRUE(t.ok()) << t.error().message;
    tok_ = std::move(*t);
    for (const char* role : {"plan", "action", "reflect"}) {
      auto a = load_lora_adapter(role, adapters_dir() + "/qv-shared-a-r8/" + role, model_->config());
      ASSERT_TRUE(a.ok()) << a.error().message;
      names_.push_back(role);
      ptrs_.push_back(a->get());
      adapters_.push_back(std::move(*a));
    }
  }

  // A session of the three agents under `mode`, with `o`'s other options: private caches never
  // evicted, droidspeak recomputing layer 1.
  std::unique_ptr<AgentSession> agents_session(ShareMode mode, ReplayOptions o = {}) {
    o.sharing.mode = mode;
    o.sharing.evict_private = false;
    if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {1};
    auto s = AgentSession::create(*model_, tok_.get(), names_, ptrs_, o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<Backend> be_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::unique_ptr<LoraAdapter>> adapters_;  // owned here unless a test moves them
  std::vector<std::string> names_;                      // plan, action, reflect
  std::vector<const LoraAdapter*> ptrs_;                // [3] stay valid when adapters_ are moved
};

}  // namespace lragent::testing
