// AgentTurn and step_turns on tinystories-656k with the plan/action/reflect adapters: turns of
// several trajectories batched into one pass pick what each picks run alone (AgentSession::run_agent
// with decode lookahead, the replay's and the trace bench's path), their catch-ups chunked by the
// token budget; a pass that fails fails only its own turn; decode_turns' lookahead windows (the
// server's way of decoding) pick what step_turns picks pass by pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <regex>

#include "agents/agent_turn.h"
#include "engine/sampler.h"
#include "kv/full_cache.h"
#include "tiny_agents.h"

namespace lragent {
namespace {

class AgentTurnTest : public testing::TinyAgentsTest {
 protected:
  std::unique_ptr<AgentSession> session(ShareMode mode, int64_t max_tokens = 256, bool lookahead = true) {
    ReplayOptions o;
    o.decode_lookahead = lookahead;
    o.sharing.max_tokens = max_tokens;
    return agents_session(mode, o);
  }
  std::vector<int32_t> encode(const std::string& text) {
    auto ids = tok_->encode(text, false);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  // One request of the batch: a trajectory, what runs on it before, and the step.
  struct Case {
    ShareMode mode;
    std::string text;
    std::string before;  // an agent that runs 5 tokens first (empty: none), so the step catches up
    std::string agent;
    int n;
    AgentDecode dec;
  };
  std::vector<Case> cases() {
    std::vector<Case> cs;
    cs.push_back({ShareMode::kBaseLr, "Once upon a time, there was a little dog named Max. He liked", "plan", "action", 20, {}});
    AgentDecode sampled;
    sampled.sampling = {0.9f, 40, 0.95f, 7};
    cs.push_back({ShareMode::kNone, "Lily and Ben went to the park with their mom.", "reflect", "plan", 17, sampled});
    AgentDecode logprobs;
    logprobs.logprobs = 3;
    logprobs.penalties = {1.2f, 0.3f, 0.f};
    cs.push_back({ShareMode::kBase, "The sun was hot and the birds sang in the big green tree.", "", "reflect", 12, logprobs});
    AgentDecode shaped;
    shaped.sampling = {1.0f, 0, 1.f, 11};
    shaped.min_p = 0.1f;
    shaped.logit_bias = {{13, -5.f}};
    cs.push_back({ShareMode::kDroidSpeak, "A big red ball rolled down the hill and a cat ran after it.", "action", "plan", 9, shaped});
    // A structured output, sampled: the guide's state follows the step's tokens (and a resumed
    // step's, replayed), and its mask comes before the sampler's draw.
    if (!trie_) trie_ = guide::VocabTrie::build(*tok_);
    if (!guide_) {
      auto g = guide::TokenGuide::compile("[a-z ]{20,60}\\.", *trie_);
      EXPECT_TRUE(g.ok()) << g.error().message;
      if (g.ok()) guide_ = std::move(*g);
    }
    AgentDecode guided;
    guided.sampling = {1.0f, 0, 1.f, 5};
    guided.guide = guide_.get();
    cs.push_back({ShareMode::kNone, "The cat sat on the mat and", "", "action", 12, guided});
    cs.push_back({ShareMode::kFull, "Tom had a toy car.", "", "plan", 1, {}});
    // ICaRus: each pass runs its rows through the base model and its last row again through the
    // agent's adapter (SeqInput::decoder), batched and in lookahead windows alike.
    cs.push_back({ShareMode::kIcarus, "The little bird could not fly, so", "reflect", "action", 14, {}});
    return cs;
  }
  std::unique_ptr<guide::VocabTrie> trie_;
  std::unique_ptr<guide::TokenGuide> guide_;
  // The session of a case with its prompt in place and `before` run.
  std::unique_ptr<AgentSession> prepare(const Case& c, bool lookahead = true) {
    auto s = session(c.mode, 256, lookahead);
    if (!s) return nullptr;
    s->append(encode(c.text));
    if (!c.before.empty()) EXPECT_TRUE(s->run_agent(c.before, 5, {}, {}).ok());
    return s;
  }
};

TEST_F(AgentTurnTest, BatchedTurnsPickWhatEachPicksAlone) {
  const std::vector<Case> cs = cases();
  std::vector<StepResult> alone;
  std::vector<std::vector<int64_t>> alone_computed;
  for (const Case& c : cs) {
    auto s = prepare(c);
    ASSERT_NE(s, nullptr);
    auto r = s->run_agent(c.agent, c.n, {}, {}, &c.dec);
    ASSERT_TRUE(r.ok()) << r.error().message;
    alone.push_back(std::move(*r));
    alone_computed.push_back(s->computed_per_agent());
  }
  // The guided case's text stays a prefix of its language: [a-z ]{20,60}\. (12 tokens may end it early).
  EXPECT_TRUE(std::regex_match(alone[4].text, std::regex("[a-z ]{1,60}\\.?"))) << alone[4].text;
  for (int64_t budget : {int64_t{7}, int64_t{1} << 20}) {
    SCOPED_TRACE(budget);
    std::vector<std::unique_ptr<AgentSession>> sessions;
    std::vector<std::unique_ptr<AgentTurn>> turns;
    for (const Case& c : cs) {
      sessions.push_back(prepare(c));
      ASSERT_NE(sessions.back(), nullptr);
      auto t = AgentTurn::start(*sessions.back(), c.agent, c.n, {}, {}, c.dec);
      ASSERT_TRUE(t.ok()) << t.error().message;
      turns.push_back(std::move(*t));
    }
    int passes = 0;
    int64_t most = 0;  // largest batch
    for (;;) {
      std::vector<AgentTurn*> live;
      for (auto& t : turns)
        if (!t->done()) live.push_back(t.get());
      if (live.empty()) break;
      const TurnStep step = step_turns(*model_, live, budget);
      for (const Status& st : step.status) ASSERT_TRUE(st.ok()) << st.error().message;
      EXPECT_LE(step.tokens, std::max<int64_t>(budget, step.sequences));  // decodes may pass a tiny budget
      most = std::max(most, step.sequences);
      ASSERT_LT(++passes, 1000);
    }
    // Every turn in one pass; with a budget of 7 the one-token turn ends before the longest
    // catch-up is through.
    EXPECT_EQ(most, static_cast<int64_t>(cs.size()) - (budget == 7 ? 1 : 0));
    for (size_t i = 0; i < cs.size(); ++i) {
      SCOPED_TRACE(i);
      const StepResult r = turns[i]->result();
      EXPECT_EQ(r.output_tokens, alone[i].output_tokens);
      EXPECT_EQ(r.text, alone[i].text);
      EXPECT_EQ(r.finish_reason, alone[i].finish_reason);
      EXPECT_EQ(r.prefilled_tokens, alone[i].prefilled_tokens);
      EXPECT_EQ(sessions[i]->computed_per_agent(), alone_computed[i]);
      ASSERT_EQ(r.logprobs.size(), alone[i].logprobs.size());
      for (size_t k = 0; k < r.logprobs.size(); ++k) {
        EXPECT_NEAR(r.logprobs[k].logprob, alone[i].logprobs[k].logprob, 1e-4);
        ASSERT_EQ(r.logprobs[k].top.size(), 3u);
        for (size_t t = 0; t < 3; ++t) EXPECT_EQ(r.logprobs[k].top[t].id, alone[i].logprobs[k].top[t].id);
      }
    }
  }
  // The cases differ from what greedy steps of their agents give (else sampling shows nothing).
  auto greedy = prepare(cs[1]);
  auto g = greedy->run_agent(cs[1].agent, cs[1].n, {}, {});
  ASSERT_TRUE(g.ok());
  EXPECT_NE(g->output_tokens, alone[1].output_tokens);
}

// A step stopped part way (a server preempting it to make room: its trajectory dropped) and
// resumed on a fresh trajectory holding the prompt and the tokens it had produced picks what the
// unstopped step picks: the same sampled draws (the sampler skips the resumed tokens' draws),
// penalties over the same output, the same logprobs; on_token sees only the new tokens.
TEST_F(AgentTurnTest, AStepResumedOnAFreshTrajectoryPicksWhatItWouldHave) {
  const std::vector<Case> cs = cases();
  for (size_t i = 0; i < cs.size(); ++i) {
    const Case& c = cs[i];
    if (c.n < 5) continue;
    SCOPED_TRACE(i);
    auto whole_s = prepare(c);
    ASSERT_NE(whole_s, nullptr);
    const std::vector<int32_t> prompt = whole_s->trajectory();
    auto whole = whole_s->run_agent(c.agent, c.n, {}, {}, &c.dec);
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    ASSERT_GT(whole->output_tokens.size(), 4u);
    // Stopped after 3 tokens.
    auto first_s = prepare(c);
    auto first = AgentTurn::start(*first_s, c.agent, c.n, {}, {}, c.dec);
    ASSERT_TRUE(first.ok()) << first.error().message;
    AgentTurn* const one[1] = {first->get()};
    while ((*first)->progress().output_tokens.size() < 3) {
      const TurnStep step = step_turns(*model_, one, 1 << 20);
      ASSERT_TRUE(step.status.front().ok());
    }
    const StepResult& so_far = (*first)->progress();
    // Resumed: a fresh trajectory of the prompt (the agent before the step run on it again: in
    // the sharing modes an entry is the computing agent's) and those tokens.
    auto again = prepare(c);
    again->append(so_far.output_tokens);
    std::vector<int32_t> traj = prompt;
    traj.insert(traj.end(), so_far.output_tokens.begin(), so_far.output_tokens.end());
    ASSERT_EQ(again->trajectory(), traj);
    AgentDecode dec = c.dec;
    dec.resumed = so_far.output_tokens;
    dec.resumed_logprobs = so_far.logprobs;
    std::vector<int32_t> seen;
    dec.on_token = [&seen](int32_t t, const StepLogprobs*) {
      seen.push_back(t);
      return true;
    };
    first->reset();
    auto resumed = AgentTurn::start(*again, c.agent, c.n, {}, {}, dec);
    ASSERT_TRUE(resumed.ok()) << resumed.error().message;
    ASSERT_TRUE((*resumed)->run_alone().ok());
    const StepResult r = (*resumed)->result();
    EXPECT_EQ(r.output_tokens, whole->output_tokens);
    EXPECT_EQ(r.finish_reason, whole->finish_reason);
    EXPECT_EQ(r.text, whole->text);
    EXPECT_EQ(seen, std::vector<int32_t>(whole->output_tokens.begin() + 3, whole->output_tokens.end()));
    ASSERT_EQ(r.logprobs.size(), whole->logprobs.size());
    for (size_t k = 0; k < r.logprobs.size(); ++k) EXPECT_NEAR(r.logprobs[k].logprob, whole->logprobs[k].logprob, 1e-4);
  }
  // Resumed tokens that are not the trajectory's end, or that are the whole budget, are refused.
  auto s = prepare(cs[0]);
  AgentDecode bad;
  bad.resumed = {5, 6};
  EXPECT_FALSE(AgentTurn::start(*s, cs[0].agent, cs[0].n, {}, {}, bad).ok());
  const std::vector<int32_t> tail(s->trajectory().end() - 2, s->trajectory().end());
  bad.resumed = tail;
  EXPECT_FALSE(AgentTurn::start(*s, cs[0].agent, 2, {}, {}, bad).ok());
  EXPECT_TRUE(AgentTurn::start(*s, cs[0].agent, 3, {}, {}, bad).ok());
}

// Beside a decoding turn, a catch-up longer than what the budget leaves runs in chunks of it,
// picking only at its end, and picks what one pass over it picks (logits within f32 rounding);
// alone, a catch-up runs whole whatever the budget.
TEST_F(AgentTurnTest, ACatchUpBesideDecodingRunsInChunksOfTheBudget) {
  const std::string text = "Once upon a time, there was a little girl named Lily. She loved to play in the park with her red ball.";
  auto whole = session(ShareMode::kBaseLr);
  whole->append(encode(text));
  whole->keep_logits(true);
  auto ref = whole->run_agent("plan", 3, {}, {});
  ASSERT_TRUE(ref.ok());

  auto other = session(ShareMode::kNone);  // decodes throughout
  other->append(encode("Tom had a toy car."));
  auto d = AgentTurn::start(*other, "action", 60, {}, {}, AgentDecode{});
  ASSERT_TRUE(d.ok());
  AgentTurn* alone[1] = {d->get()};
  const TurnStep first = step_turns(*model_, alone, 2);
  ASSERT_TRUE(first.status[0].ok());
  EXPECT_EQ(first.tokens, static_cast<int64_t>(other->trajectory().size()) - 1);  // whole, not 2
  ASSERT_EQ((*d)->pending_tokens(), 1);

  auto s = session(ShareMode::kBaseLr);
  s->append(encode(text));
  s->keep_logits(true);
  auto t = AgentTurn::start(*s, "plan", 3, {}, {}, AgentDecode{});
  ASSERT_TRUE(t.ok());
  AgentTurn* both[2] = {d->get(), t->get()};
  const int64_t prompt = static_cast<int64_t>(s->trajectory().size());
  int64_t pending = (*t)->pending_tokens();
  EXPECT_EQ(pending, prompt);
  int chunks = 0;
  while (pending > 1) {
    const TurnStep step = step_turns(*model_, both, 10);
    ASSERT_TRUE(step.status[0].ok() && step.status[1].ok());
    EXPECT_EQ(step.sequences, 2);
    EXPECT_EQ(step.tokens, 1 + std::min<int64_t>(pending, 9));  // the decode token, then what is left
    EXPECT_EQ(s->trajectory().size(), static_cast<size_t>(prompt) + (pending <= 9 ? 1 : 0));  // a pick only at the end
    pending = (*t)->pending_tokens();
    ++chunks;
  }
  EXPECT_EQ(chunks, (prompt + 8) / 9);
  while (!(*t)->done()) ASSERT_TRUE(step_turns(*model_, both, 10).status[1].ok());
  const StepResult r = (*t)->result();
  EXPECT_EQ(r.output_tokens, ref->output_tokens);
  ASSERT_EQ(r.logits.size(), ref->logits.size());
  double worst = 0;
  for (size_t i = 0; i < r.logits.size(); ++i)
    for (size_t v = 0; v < r.logits[i].size(); ++v)
      worst = std::max(worst, static_cast<double>(std::abs(r.logits[i][v] - ref->logits[i][v])));
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(s->computed_per_agent()[0], static_cast<int64_t>(prompt) + 2);  // the prompt and 2 decode passes

  // A bound on every pass (max_pass_tokens: a server whose working memory was planned for it)
  // chunks a catch-up with nothing decoding beside it too, and it picks what one pass picks.
  auto bounded = session(ShareMode::kBaseLr);
  bounded->append(encode(text));
  bounded->keep_logits(true);
  auto b = AgentTurn::start(*bounded, "plan", 3, {}, {}, AgentDecode{});
  ASSERT_TRUE(b.ok());
  AgentTurn* lone[1] = {b->get()};
  int bounded_chunks = 0;
  for (int64_t done = 0; bounded->trajectory().size() == static_cast<size_t>(prompt); ++bounded_chunks) {
    const TurnStep step = step_turns(*model_, lone, 1 << 20, 7);  // no pick until the catch-up's end
    ASSERT_TRUE(step.status[0].ok());
    EXPECT_EQ(step.tokens, std::min<int64_t>(prompt - done, 7));
    done += step.tokens;
  }
  EXPECT_EQ(bounded_chunks, (prompt + 6) / 7);
  while (!(*b)->done()) ASSERT_TRUE(step_turns(*model_, lone, 1 << 20, 7).status[0].ok());
  const StepResult rb = (*b)->result();
  EXPECT_EQ(rb.output_tokens, ref->output_tokens);
  ASSERT_EQ(rb.logits.size(), ref->logits.size());
  for (size_t i = 0; i < rb.logits.size(); ++i)
    for (size_t v = 0; v < rb.logits[i].size(); ++v) EXPECT_NEAR(rb.logits[i][v], ref->logits[i][v], 1e-4);
}

// A turn whose trajectory runs out of KV memory fails alone; the turns batched with it go on and
// pick what they pick alone.
TEST_F(AgentTurnTest, APassThatFailsFailsOnlyItsTurn) {
  const std::vector<Case> cs = cases();
  // Greedy, sampled (a device pick: its retried pass must use the same draw) and logprobs with
  // penalties (host rows, so the batch's rows all come to the host).
  const std::vector<size_t> healthy = {0, 1, 2};
  std::vector<StepResult> alone;
  for (size_t i : healthy) {
    auto s = prepare(cs[i]);
    auto r = s->run_agent(cs[i].agent, cs[i].n, {}, {}, &cs[i].dec);
    ASSERT_TRUE(r.ok());
    alone.push_back(std::move(*r));
  }
  std::vector<std::unique_ptr<AgentSession>> sessions;
  sessions.push_back(prepare(cs[0]));
  auto small = session(ShareMode::kNone, 32);  // room for 32 positions
  small->append(encode("Once upon a time, there was a little dog named Max."));
  sessions.push_back(std::move(small));
  sessions.push_back(prepare(cs[1]));
  sessions.push_back(prepare(cs[2]));
  std::vector<std::unique_ptr<AgentTurn>> turns;
  for (size_t i = 0; i < 4; ++i) {
    const Case* c = i == 1 ? nullptr : &cs[i == 0 ? 0 : i - 1];
    auto t = c ? AgentTurn::start(*sessions[i], c->agent, c->n, {}, {}, c->dec)
               : AgentTurn::start(*sessions[i], "plan", 40, {}, {}, AgentDecode{});
    ASSERT_TRUE(t.ok());
    turns.push_back(std::move(*t));
  }
  bool failed = false;
  for (int pass = 0; pass < 1000; ++pass) {
    std::vector<AgentTurn*> live;
    std::vector<size_t> which;
    for (size_t i = 0; i < turns.size(); ++i)
      if (turns[i] && !turns[i]->done()) live.push_back(turns[i].get()), which.push_back(i);
    if (live.empty()) break;
    const TurnStep step = step_turns(*model_, live, 1 << 20);
    for (size_t k = 0; k < live.size(); ++k) {
      if (step.status[k].ok()) continue;
      EXPECT_EQ(which[k], 1u) << step.status[k].error().message;
      EXPECT_EQ(step.status[k].error().code, ErrorCode::kOutOfMemory);
      // The failed turn holds no binding any more: its session can go first (as the server drops
      // a failed request's trajectory; the sanitizer build would see a use after free).
      sessions[which[k]].reset();
      turns[which[k]].reset();
      failed = true;
    }
  }
  EXPECT_TRUE(failed);
  EXPECT_EQ(turns[0]->result().output_tokens, alone[0].output_tokens);
  EXPECT_EQ(turns[2]->result().output_tokens, alone[1].output_tokens);
  const StepResult lp = turns[3]->result();
  EXPECT_EQ(lp.output_tokens, alone[2].output_tokens);
  ASSERT_EQ(lp.logprobs.size(), alone[2].logprobs.size());
  for (size_t k = 0; k < lp.logprobs.size(); ++k) EXPECT_NEAR(lp.logprobs[k].logprob, alone[2].logprobs[k].logprob, 1e-4);
}

// decode_turns runs decoding turns pass after pass with lookahead: each turn gets the tokens,
// finish reason and per-agent counts it gets alone, whether its step ends by length, on a stop id,
// on on_token declining (a cancelled request) or by running out of KV memory (that turn alone
// fails, after its thrown-away lookahead pass could not be launched), whether a window ends on a
// finished turn or on keep_going; nothing is left in flight between windows.
TEST_F(AgentTurnTest, DecodeWindowsPickWhatEachPicksAlone) {
  const std::vector<Case> base = cases();
  std::vector<Case> cs = {base[0], base[1], base[4]};
  cs[1].n = 40;  // still sampling when the small trajectory below runs out
  // Ends on a stop id: the 7th token case 0's agent decodes on case 0's trajectory.
  {
    auto s = prepare(base[0]);
    auto r = s->run_agent(base[0].agent, base[0].n, {}, {}, &base[0].dec);
    ASSERT_TRUE(r.ok());
    ASSERT_GE(r->output_tokens.size(), 7u);
    Case stop = base[0];
    stop.dec.stop_ids = {r->output_tokens[6]};
    cs.push_back(stop);
  }
  // Ends when on_token declines the 5th token (a client that went away), sampled.
  Case abort = base[1];
  abort.n = 30;
  cs.push_back(abort);
  auto with_abort = [](AgentDecode dec) {
    auto seen = std::make_shared<int>(0);
    dec.on_token = [seen](int32_t, const StepLogprobs*) { return ++*seen < 5; };
    return dec;
  };
  std::vector<StepResult> alone;
  std::vector<std::vector<int64_t>> alone_computed;
  for (size_t i = 0; i < cs.size(); ++i) {
    auto s = prepare(cs[i]);
    ASSERT_NE(s, nullptr);
    const AgentDecode dec = i + 1 == cs.size() ? with_abort(cs[i].dec) : cs[i].dec;
    auto r = s->run_agent(cs[i].agent, cs[i].n, {}, {}, &dec);
    ASSERT_TRUE(r.ok()) << r.error().message;
    alone.push_back(std::move(*r));
    alone_computed.push_back(s->computed_per_agent());
  }
  EXPECT_EQ(alone[3].finish_reason, "stop");
  EXPECT_LE(alone[3].output_tokens.size(), 7u);  // the stop id is the last token
  EXPECT_EQ(alone[4].finish_reason, "abort");
  EXPECT_EQ(alone[4].output_tokens.size(), 5u);

  for (int every : {3, 1000}) {  // keep_going declines before every `every`-th launch
    SCOPED_TRACE(every);
    std::vector<std::unique_ptr<AgentSession>> sessions;
    std::vector<std::unique_ptr<AgentTurn>> turns;
    for (size_t i = 0; i < cs.size(); ++i) {
      sessions.push_back(prepare(cs[i]));
      ASSERT_NE(sessions.back(), nullptr);
      const AgentDecode dec = i + 1 == cs.size() ? with_abort(cs[i].dec) : cs[i].dec;
      auto t = AgentTurn::start(*sessions.back(), cs[i].agent, cs[i].n, {}, {}, dec);
      ASSERT_TRUE(t.ok()) << t.error().message;
      turns.push_back(std::move(*t));
    }
    // Room for 32 positions (two blocks), 40 tokens asked for: it runs out while the sampled
    // case 1 decodes beside it (whose draws must stay in order across the failed lookahead launch).
    auto small = session(ShareMode::kNone, 32);
    small->append(encode("Once upon a time, there was a little dog named Max."));
    sessions.push_back(std::move(small));
    auto t = AgentTurn::start(*sessions.back(), "plan", 40, {}, {}, AgentDecode{});
    ASSERT_TRUE(t.ok());
    turns.push_back(std::move(*t));
    const size_t oom = turns.size() - 1;

    int asked = 0, windows = 0, window_passes = 0;
    bool failed = false, lookahead_failed = false;
    auto keep_going = [&] { return ++asked % every != 0; };
    for (int round = 0; round < 1000; ++round) {
      std::vector<AgentTurn*> live;
      std::vector<size_t> which;
      for (size_t i = 0; i < turns.size(); ++i)
        if (turns[i] && !turns[i]->done()) live.push_back(turns[i].get()), which.push_back(i);
      if (live.empty()) break;
      std::vector<Status> status;
      if (std::all_of(live.begin(), live.end(), [](const AgentTurn* x) { return x->looks_ahead(); })) {
        TurnWindow w = decode_turns(*model_, live, keep_going);
        if (w.ran) {
          ++windows;
          window_passes += static_cast<int>(w.passes.size());
          ASSERT_FALSE(w.passes.empty());
          EXPECT_LE(w.passes.front(), static_cast<int64_t>(live.size()));
          status = std::move(w.status);
          if (w.lookahead_failed) {
            lookahead_failed = true;
            EXPECT_FALSE(turns[1]->done());  // the sampled turn's draws are kept across it
          }
        }
      }
      if (status.empty()) status = step_turns(*model_, live, 1 << 20).status;
      EXPECT_EQ(model_->pending_picks(), 0u);
      for (size_t k = 0; k < live.size(); ++k) {
        if (status[k].ok()) continue;
        EXPECT_EQ(which[k], oom) << status[k].error().message;
        EXPECT_EQ(status[k].error().code, ErrorCode::kOutOfMemory);
        sessions[which[k]].reset();
        turns[which[k]].reset();
        failed = true;
      }
    }
    EXPECT_TRUE(failed);
    if (every == 1000) EXPECT_TRUE(lookahead_failed);  // else a declined launch may come first
    EXPECT_GT(windows, 0);
    EXPECT_GT(window_passes, windows);  // windows ran more than one pass
    for (size_t i = 0; i < cs.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_TRUE(turns[i] && turns[i]->done());
      const StepResult r = turns[i]->result();
      EXPECT_EQ(r.output_tokens, alone[i].output_tokens);
      EXPECT_EQ(r.text, alone[i].text);
      EXPECT_EQ(r.finish_reason, alone[i].finish_reason);
      EXPECT_EQ(sessions[i]->computed_per_agent(), alone_computed[i]);
      // What the thrown-away lookahead rows reserved went back, and what they wrote is not
      // counted as held: the next agent's step on the same trajectory picks what it picks after
      // the step-by-step run.
      auto ref_session = prepare(cs[i], /*lookahead=*/false);  // step by step throughout
      const AgentDecode dec = i + 1 == cs.size() ? with_abort(cs[i].dec) : cs[i].dec;
      ASSERT_TRUE(ref_session->run_agent(cs[i].agent, cs[i].n, {}, {}, &dec).ok());
      EXPECT_EQ(sessions[i]->cache_bytes().allocated, ref_session->cache_bytes().allocated);
      auto next = sessions[i]->run_agent("reflect", 4, {}, {});
      auto ref_next = ref_session->run_agent("reflect", 4, {}, {});
      ASSERT_TRUE(next.ok() && ref_next.ok());
      EXPECT_EQ(next->output_tokens, ref_next->output_tokens);
    }
  }
}

// --kv-share icarus (ICaRus): the base model writes every entry and each agent's adapter only
// reads them. tests/model/golden_test.cpp checks the decoder's logits against transformers + PEFT.
class IcarusTest : public testing::TinyAgentsTest {
 protected:
  // One pass over `toks` from position 0 through a fresh cache: logits of every row; with
  // `decoder`, as ICaRus runs it (the base model's entries, the decoder's rows), else the
  // ordinary pass of `adapter`. `cache` keeps the entries for a pass after it.
  std::vector<float> pass(const std::vector<int32_t>& toks, const LoraAdapter* adapter, const LoraAdapter* decoder,
                          FullKvCache& cache, int64_t start = 0) {
    SeqInput in;
    in.tokens = toks.data();
    in.n_tokens = static_cast<int>(toks.size());
    in.start_pos = start;
    in.kv = &cache;
    in.adapter = adapter;
    in.decoder = decoder;
    in.all_logits = true;
    auto r = model_->forward({in});
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return {};
    return std::vector<float>(r->f32(), r->f32() + r->numel());
  }
  std::vector<int32_t> argmax_rows(const std::vector<float>& logits) {
    const int vocab = model_->config().vocab_size;
    std::vector<int32_t> ids;
    for (size_t r = 0; r * vocab < logits.size(); ++r) ids.push_back(Sampler::argmax(logits.data() + r * vocab, vocab));
    return ids;
  }
  std::vector<int32_t> encode(const std::string& text) {
    auto ids = tok_->encode(text, false);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
};

TEST_F(IcarusTest, TheCacheHoldsTheBaseModelsEntries) {
  std::vector<int32_t> toks = encode("One day, a little girl named Sue found a shiny key in the grass.");
  toks.insert(toks.begin(), 1);
  const std::vector<int32_t> next = {toks[5], toks[9], toks[2]};
  auto pools = KvPools::create(model_->config(), 16, 16, "icarus");
  ASSERT_TRUE(pools.ok());
  // The plan agent as ICaRus decoder over the text, then the base model over three more tokens
  // reading those entries: the base model's own logits over the whole text (entries the adapter
  // wrote would change them; the plan adapter adapts v).
  FullKvCache icarus(pools->kv.get()), base(pools->kv.get()), adapted(pools->kv.get());
  const std::vector<float> dec = pass(toks, nullptr, ptrs_[0], icarus);
  const std::vector<float> after = pass(next, nullptr, nullptr, icarus, static_cast<int64_t>(toks.size()));
  std::vector<int32_t> all = toks;
  all.insert(all.end(), next.begin(), next.end());
  const std::vector<float> whole = pass(all, nullptr, nullptr, base);
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  ASSERT_EQ(after.size(), next.size() * vocab);
  const std::vector<float> tail(whole.end() - static_cast<ptrdiff_t>(after.size()), whole.end());
  EXPECT_LE(testing::max_abs_diff(after, tail), 1e-4f);
  // Not a test that cannot fail: the adapter's own entries give other logits there.
  (void)pass(toks, ptrs_[0], nullptr, adapted);
  const std::vector<float> after_adapted = pass(next, nullptr, nullptr, adapted, static_cast<int64_t>(toks.size()));
  EXPECT_GT(testing::max_abs_diff(after_adapted, tail), 1e-3f);
  // And the decoder's rows are the adapter's, not the base model's (the golden test has their values).
  FullKvCache plain(pools->kv.get());
  const std::vector<float> base_rows = pass(toks, nullptr, nullptr, plain);
  EXPECT_GT(testing::max_abs_diff(dec, base_rows), 1e-3f);
}

TEST_F(IcarusTest, AgentsPickWhatOnePassOverTheTrajectoryGivesThem) {
  // Turns of three agents (catch-ups, decode passes with lookahead, a prompt no one computed):
  // each agent's tokens are the argmax of the decoder rows one ICaRus pass over the final
  // trajectory gives that agent, so the entries every turn read were the base model's, whichever
  // agent's turn computed them.
  ReplayOptions o;
  o.decode_lookahead = true;
  auto s = agents_session(ShareMode::kIcarus, o);
  ASSERT_NE(s, nullptr);
  s->append({1});
  s->append(encode("Once upon a time, there was a little boy named Tim. Tim had a big red kite."));
  struct Turn {
    int agent;
    int64_t begin;
    std::vector<int32_t> out;
  };
  std::vector<Turn> turns;
  const std::pair<int, int> plan[] = {{0, 12}, {1, 10}, {2, 8}, {0, 6}, {1, 6}};
  for (const auto& [a, n] : plan) {
    const int64_t begin = static_cast<int64_t>(s->trajectory().size());
    auto r = s->run_agent(names_[static_cast<size_t>(a)], n, {}, {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(static_cast<int>(r->output_tokens.size()), n);
    turns.push_back({a, begin, r->output_tokens});
    if (a == 2) s->append(encode(" Then the wind came."));  // a tool observation: computed by the next turn
  }
  // Every token computed once, for all agents (as full): the trajectory's length in all.
  int64_t computed = 0;
  for (int64_t c : s->computed_per_agent()) computed += c;
  EXPECT_LE(computed, static_cast<int64_t>(s->trajectory().size()) + static_cast<int64_t>(std::size(plan)));
  const std::vector<int32_t> traj = s->trajectory();
  auto pools = KvPools::create(model_->config(), 16, 64, "icarus");
  ASSERT_TRUE(pools.ok());
  int differs_from_base = 0;
  FullKvCache base_cache(pools->kv.get());
  const std::vector<int32_t> base_picks = argmax_rows(pass(traj, nullptr, nullptr, base_cache));
  for (int a = 0; a < 3; ++a) {
    FullKvCache cache(pools->kv.get());
    const std::vector<int32_t> picks = argmax_rows(pass(traj, nullptr, ptrs_[static_cast<size_t>(a)], cache));
    ASSERT_EQ(picks.size(), traj.size());
    for (const Turn& t : turns) {
      if (t.agent != a) continue;
      for (size_t i = 0; i < t.out.size(); ++i) {
        const size_t row = static_cast<size_t>(t.begin) + i - 1;  // the row before the token
        EXPECT_EQ(t.out[i], picks[row]) << names_[static_cast<size_t>(a)] << " token " << i;
        differs_from_base += picks[row] != base_picks[row];
      }
    }
  }
  EXPECT_GT(differs_from_base, 0);  // the adapters decide tokens the base model would not pick
}

TEST_F(IcarusTest, AnAgentsTokensDoNotDependOnWhoComputedTheText) {
  // The plan agent's turn, then action's: the same action tokens whether the plan agent's tokens
  // were computed by its own passes or appended as text and computed in action's catch-up (in
  // full mode the entries of the plan agent's passes are its adapter's: action reads other ones).
  const std::vector<int32_t> prompt = encode("Ben saw a small frog by the pond. He wanted to");
  std::vector<std::vector<int32_t>> action_out;
  for (ShareMode mode : {ShareMode::kIcarus, ShareMode::kFull}) {
    SCOPED_TRACE(share_mode_name(mode));
    auto ran = agents_session(mode);
    auto appended = agents_session(mode);
    ASSERT_TRUE(ran && appended);
    for (auto* s : {ran.get(), appended.get()}) {
      s->append({1});
      s->append(prompt);
    }
    auto p = ran->run_agent("plan", 16, {}, {});
    ASSERT_TRUE(p.ok());
    appended->append(p->output_tokens);
    auto a1 = ran->run_agent("action", 16, {}, {});
    auto a2 = appended->run_agent("action", 16, {}, {});
    ASSERT_TRUE(a1.ok() && a2.ok());
    if (mode == ShareMode::kIcarus) EXPECT_EQ(a1->output_tokens, a2->output_tokens);
    action_out.push_back(a1->output_tokens);
    action_out.push_back(a2->output_tokens);
  }
  // Full mode's two runs read different entries; their outputs may differ (they do on this text:
  // the check that the ICaRus equality is not that of a text the adapters leave alone).
  EXPECT_NE(action_out[2], action_out[3]);
}

}  // namespace
}  // namespace lragent
