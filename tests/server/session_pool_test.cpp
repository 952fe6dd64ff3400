// The server's trajectory pool on tinystories-656k with the plan/action/reflect adapters:
// which trajectory a request lands on, and that a trajectory cut back to a shared prefix
// (TrajectoryKv::truncate) then computes exactly what a trajectory that never held the cut
// tokens computes, in every sharing mode.
#include <gtest/gtest.h>

#include <cmath>

#include "server/session_pool.h"
#include "test_util.h"
#include "tiny_agents.h"

namespace lragent::server {
namespace {

class SessionPoolTest : public testing::TinyAgentsTest {
 protected:
  static SessionPoolOptions options(ShareMode mode, int max_sessions = 4) {
    SessionPoolOptions o;
    o.replay.sharing.mode = mode;
    o.replay.sharing.max_tokens = 256;
    if (mode == ShareMode::kDroidSpeak) o.replay.sharing.recompute_layers = {1};
    o.max_sessions = max_sessions;
    return o;
  }
  std::unique_ptr<SessionPool> pool(ShareMode mode, int max_sessions = 4) {
    auto p = SessionPool::create(*model_, tok_.get(), SessionPool::groups_for("base", names_, ptrs_, mode),
                                 options(mode, max_sessions));
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? std::move(*p) : nullptr;
  }
  // One request at a time: the lease is released at once (it must not be waiting for another).
  static Result<SessionPool::Lease> acquire(SessionPool& p, const std::string& agent, const std::vector<int32_t>& prompt) {
    LRA_ASSIGN_OR_RETURN(std::optional<SessionPool::Lease> l, p.acquire(agent, prompt));
    if (!l) return make_error(ErrorCode::kInternal, "the pool made a lone request wait");
    p.release(l->id);
    return *l;
  }
  // A pool of one group (every agent, the base model too) that keeps each step's logits.
  std::unique_ptr<SessionPool> logits_pool(ShareMode mode) {
    SessionPoolOptions o = options(mode);
    o.replay.keep_logits = true;
    auto p = SessionPool::create(*model_, tok_.get(), {AgentGroup{names_, ptrs_}}, o);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? std::move(*p) : nullptr;
  }
  // Each agent in turn generates n tokens on the session; the steps' results.
  static std::vector<StepResult> run_each(AgentSession& s, std::initializer_list<const char*> agents, int n) {
    std::vector<StepResult> out;
    for (const char* agent : agents) {
      auto r = s.run_agent(agent, n, {}, {});
      EXPECT_TRUE(r.ok()) << agent << ": " << r.error().message;
      if (!r.ok()) break;
      out.push_back(std::move(*r));
    }
    return out;
  }
  // The largest |difference| between two steps' logits (same shape).
  static double worst_logit_diff(const StepResult& a, const StepResult& b) {
    EXPECT_EQ(a.logits.size(), b.logits.size());
    double worst = 0;
    for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i)
      for (size_t v = 0; v < std::min(a.logits[i].size(), b.logits[i].size()); ++v)
        worst = std::max(worst, static_cast<double>(std::abs(a.logits[i][v] - b.logits[i][v])));
    return worst;
  }
  std::vector<int32_t> encode(const std::string& text) {
    auto ids = tok_->encode(text, true);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
};

TEST_F(SessionPoolTest, GroupsKeepTheBaseModelApartOnlyUnderBaseLr) {
  for (ShareMode mode : kAllShareModes) {
    auto groups = SessionPool::groups_for("base", names_, ptrs_, mode);
    if (mode == ShareMode::kBaseLr) {
      ASSERT_EQ(groups.size(), 2u);
      EXPECT_EQ(groups[0].names, names_);
      EXPECT_EQ(groups[1].names, std::vector<std::string>{"base"});
      EXPECT_EQ(groups[1].adapters, std::vector<const LoraAdapter*>{nullptr});
    } else {
      ASSERT_EQ(groups.size(), 1u) << share_mode_name(mode);
      EXPECT_EQ(groups[0].names, (std::vector<std::string>{"base", "plan", "action", "reflect"}));
    }
    // Every group can hold a trajectory (base-lr's shared-A check passes with the base apart).
    EXPECT_NE(pool(mode), nullptr) << share_mode_name(mode);
  }
}

TEST_F(SessionPoolTest, AgentTurnsExtendOneTrajectoryAndOthersStartTheirOwn) {
  auto p = pool(ShareMode::kBaseLr, 3);
  ASSERT_NE(p, nullptr);
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog.\nThought 1:");
  auto l1 = acquire(*p, "plan", prompt);
  ASSERT_TRUE(l1.ok()) << l1.error().message;
  EXPECT_EQ(l1->reused_tokens, 1);  // the BOS a new trajectory holds
  auto r1 = l1->session->run_agent("plan", 6, {}, {});
  ASSERT_TRUE(r1.ok()) << r1.error().message;
  EXPECT_EQ(r1->prefilled_tokens, static_cast<int64_t>(prompt.size()));

  // The action agent's prompt extends the trajectory (plan's output included).
  std::vector<int32_t> turn2 = l1->session->trajectory();
  const std::vector<int32_t> obs = {13, 29909, 29901};  // any ids inside the vocabulary
  for (int32_t id : obs) turn2.push_back(id % model_->config().vocab_size);
  auto l2 = acquire(*p, "action", turn2);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->id, l1->id);
  EXPECT_FALSE(l2->fresh);  // a kept trajectory, extended
  EXPECT_EQ(l2->reused_tokens, static_cast<int64_t>(turn2.size() - obs.size()));
  auto r2 = l2->session->run_agent("action", 4, {}, {});
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  // base-lr: action computes only what no agent has (plan's unprocessed last token and the observation).
  EXPECT_EQ(r2->prefilled_tokens, static_cast<int64_t>(obs.size()) + 1);

  // A prompt sharing only its first tokens starts another trajectory; the first is kept whole.
  const size_t before = l2->session->trajectory().size();
  auto l3 = acquire(*p, "reflect", encode("Once upon a time the sun was hot."));
  ASSERT_TRUE(l3.ok());
  EXPECT_NE(l3->id, l1->id);
  EXPECT_TRUE(l3->fresh);  // made for it
  auto infos = p->sessions();
  const auto first = std::find_if(infos.begin(), infos.end(), [&](const auto& i) { return i.id == l1->id; });
  ASSERT_NE(first, infos.end());
  EXPECT_EQ(first->tokens, static_cast<int64_t>(before));

  // Re-sending the first turn (most of it shared) cuts the trajectory back rather than starting anew.
  auto l4 = acquire(*p, "plan", prompt);
  ASSERT_TRUE(l4.ok());
  EXPECT_EQ(l4->id, l1->id);
  EXPECT_FALSE(l4->fresh);  // a kept one, cut back
  EXPECT_EQ(l4->reused_tokens, static_cast<int64_t>(prompt.size()) - 1);
  EXPECT_EQ(l4->session->trajectory(), prompt);

  // The base model lives in its own group under base-lr.
  auto l5 = acquire(*p, "base", prompt);
  ASSERT_TRUE(l5.ok());
  EXPECT_NE(l5->id, l1->id);
  EXPECT_EQ(acquire(*p, "nobody", prompt).error().code, ErrorCode::kNotFound);
}

// vLLM's cache_salt: a trajectory serves only requests of its salt. The same prompt under
// another salt starts a trajectory of its own (no entry extended, cut back or copied from the
// other's), and under its own salt extends it as ever.
TEST_F(SessionPoolTest, ASaltedRequestSharesOnlyWithItsSalt) {
  auto p = pool(ShareMode::kBaseLr, 4);
  ASSERT_NE(p, nullptr);
  std::vector<int32_t> prompt = encode("Question: where is the red ball? It is under the bed, said Tom.");
  auto acquire_salted = [&](const std::string& agent, const std::vector<int32_t>& ids, const std::string& salt) {
    auto l = p->acquire(agent, ids, /*reuse=*/true, salt);
    EXPECT_TRUE(l.ok() && l->has_value());
    SessionPool::Lease lease = **l;
    p->release(lease.id);
    return lease;
  };
  const SessionPool::Lease a = acquire_salted("plan", prompt, "tenant-a");
  ASSERT_TRUE(a.session->run_agent("plan", 3, {}, {}).ok());
  const std::vector<int32_t> turn = a.session->trajectory();
  // Another tenant, the same text: a new trajectory that holds nothing of it (only the BOS every
  // trajectory starts with), neither extended nor copied.
  const SessionPool::Lease b = acquire_salted("action", turn, "tenant-b");
  EXPECT_NE(b.id, a.id);
  EXPECT_LE(b.reused_tokens, 1);
  EXPECT_TRUE(b.fresh);
  // No salt is a salt of its own too.
  const SessionPool::Lease none = acquire_salted("action", turn, "");
  EXPECT_NE(none.id, a.id);
  EXPECT_NE(none.id, b.id);
  EXPECT_LE(none.reused_tokens, 1);
  // The first tenant's next turn extends its trajectory.
  const SessionPool::Lease again = acquire_salted("action", turn, "tenant-a");
  EXPECT_EQ(again.id, a.id);
  EXPECT_EQ(again.reused_tokens, static_cast<int64_t>(turn.size()) - 1);
}

// Two conversations that share a prefix and take turns keep a trajectory each while slots are
// free (cutting one back for the other would recompute it at every turn); the end of a
// previous completion that tokenizes differently is cut back instead of copied.
TEST_F(SessionPoolTest, ConversationsThatPartKeepTheirOwnTrajectories) {
  auto p = pool(ShareMode::kBaseLr, 4);
  ASSERT_NE(p, nullptr);
  std::vector<int32_t> a = encode("Question: where is the red ball? It is under the bed.");
  std::vector<int32_t> b = encode("Question: where is the red ball? It is in the garden.");
  int64_t id_a = 0, id_b = 0;
  for (int turn = 0; turn < 3; ++turn) {
    auto la = acquire(*p, "plan", a);
    ASSERT_TRUE(la.ok());
    if (turn == 0) id_a = la->id;
    EXPECT_EQ(la->id, id_a);
    if (turn > 0) EXPECT_EQ(la->reused_tokens, static_cast<int64_t>(a.size()) - 3);  // all but the new turn
    ASSERT_TRUE(la->session->run_agent("plan", 2, {}, {}).ok());
    a = la->session->trajectory();
    a.insert(a.end(), {13, 13, 13});
    auto lb = acquire(*p, "action", b);
    ASSERT_TRUE(lb.ok());
    if (turn == 0) id_b = lb->id;
    EXPECT_EQ(lb->id, id_b);
    EXPECT_NE(id_b, id_a);
    ASSERT_TRUE(lb->session->run_agent("action", 2, {}, {}).ok());
    b = lb->session->trajectory();
    b.insert(b.end(), {13, 13, 13});
  }
  // A next prompt whose last completion tokens differ (retokenized): the trajectory is cut back.
  std::vector<int32_t> retok(a.begin(), a.end() - 4);
  retok.insert(retok.end(), {29, 13, 13});
  auto lr = acquire(*p, "reflect", retok);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->id, id_a);
  EXPECT_EQ(lr->reused_tokens, static_cast<int64_t>(a.size()) - 4);
}

// A penalized step picks from its logits after the penalties, with the trajectory before the
// step as the prompt: recomputed here from the raw logits the session keeps.
TEST_F(SessionPoolTest, PenaltiesApplyOverTheTrajectoryAndTheStepsTokens) {
  SessionPoolOptions o = options(ShareMode::kBaseLr);
  o.replay.keep_logits = true;
  auto s = AgentSession::create(*model_, tok_.get(), names_, ptrs_, o.replay);
  ASSERT_TRUE(s.ok());
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max.");
  (*s)->append(std::vector<int32_t>(prompt.begin() + 1, prompt.end()));
  AgentDecode dec;
  dec.penalties = {1.3f, 0.8f, 0.4f};
  auto r = (*s)->run_agent("plan", 24, {}, {}, &dec);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->logits.size(), r->output_tokens.size());
  const int vocab = model_->config().vocab_size;
  for (size_t i = 0; i < r->output_tokens.size(); ++i) {
    std::vector<float> row = r->logits[i];
    std::vector<int> count(static_cast<size_t>(vocab), 0);
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    for (int32_t t : prompt) seen[static_cast<size_t>(t)] = true;
    for (size_t j = 0; j < i; ++j) {
      seen[static_cast<size_t>(r->output_tokens[j])] = true;
      ++count[static_cast<size_t>(r->output_tokens[j])];
    }
    for (size_t t = 0; t < row.size(); ++t) {
      if (seen[t]) row[t] = row[t] > 0 ? row[t] / 1.3f : row[t] * 1.3f;
      if (count[t] > 0) row[t] -= 0.8f * static_cast<float>(count[t]) + 0.4f;
    }
    EXPECT_EQ(r->output_tokens[i], std::max_element(row.begin(), row.end()) - row.begin()) << i;
  }
  // The penalties change this output (else the test shows nothing).
  (*s)->truncate(static_cast<int64_t>(prompt.size()) - 1);  // the last prompt token runs again
  (*s)->append({prompt.back()});
  auto unpenalized = (*s)->run_agent("plan", 24, {}, {});
  ASSERT_TRUE(unpenalized.ok());
  EXPECT_NE(unpenalized->output_tokens, r->output_tokens);
}

TEST_F(SessionPoolTest, TheLeastRecentlyUsedTrajectoryMakesRoom) {
  auto p = pool(ShareMode::kBase, 2);
  ASSERT_NE(p, nullptr);
  auto a = acquire(*p, "plan", encode("Alpha alpha alpha alpha."));
  ASSERT_TRUE(a.ok());
  const int64_t id_a = a->id;
  auto b = acquire(*p, "plan", encode("Beta beta beta beta beta."));
  ASSERT_TRUE(b.ok());
  const int64_t id_b = b->id;
  EXPECT_NE(id_a, id_b);
  ASSERT_TRUE(acquire(*p, "action", encode("Alpha alpha alpha alpha. More")).ok());  // touches a
  auto c = acquire(*p, "plan", encode("Gamma gamma gamma gamma."));
  ASSERT_TRUE(c.ok());
  std::vector<int64_t> ids;
  for (const auto& i : p->sessions()) ids.push_back(i.id);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_NE(std::find(ids.begin(), ids.end(), id_a), ids.end());
  EXPECT_EQ(std::find(ids.begin(), ids.end(), id_b), ids.end());
  EXPECT_EQ(p->evicted_sessions(), 1);
  p->drop(id_a);
  EXPECT_EQ(p->sessions().size(), 1u);
}

// A request whose trajectory runs another request starts on a copy of it in a free slot (it
// neither waits nor cuts the held one back); when every slot is held it waits (nullopt), and a
// held trajectory is never dropped to make room.
TEST_F(SessionPoolTest, AHeldTrajectoryIsCopiedForAnotherRequestAndNeverDropped) {
  auto p = pool(ShareMode::kBase, 2);  // one group: the pool starts with one fresh trajectory
  ASSERT_NE(p, nullptr);
  const std::vector<int32_t> alpha = encode("Alpha alpha alpha alpha.");
  auto a = p->acquire("plan", alpha);
  ASSERT_TRUE(a.ok() && a->has_value());
  std::vector<int32_t> next = alpha;
  next.push_back(13);
  auto copy = p->acquire("action", next);  // the next turn of a's conversation, sent early
  ASSERT_TRUE(copy.ok() && copy->has_value());
  EXPECT_NE((*copy)->id, (*a)->id);
  EXPECT_TRUE((*copy)->fresh);  // a copy made for it: a request that then waits drops it
  EXPECT_EQ((*copy)->session->trajectory(), next);
  EXPECT_EQ((*copy)->reused_tokens, static_cast<int64_t>(alpha.size()));
  EXPECT_EQ(p->copied_sessions(), 1);
  EXPECT_EQ(p->copied_tokens(), static_cast<int64_t>(alpha.size()));
  auto resent = p->acquire("plan", alpha);  // n > 1: the same prompt again; both slots are held
  ASSERT_TRUE(resent.ok());
  EXPECT_FALSE(resent->has_value());
  auto c = p->acquire("plan", encode("Gamma gamma gamma gamma."));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->has_value());
  EXPECT_EQ(p->evicted_sessions(), 0);
  ASSERT_EQ(p->sessions().size(), 2u);
  for (const auto& info : p->sessions()) EXPECT_TRUE(info.running) << info.id;
  EXPECT_EQ((*a)->session->trajectory(), alpha);  // untouched by the others
  // Released, a's trajectory takes the re-sent request; the copy's released slot then makes room
  // for gamma (a new conversation: nothing in common but BOS, so nothing is copied).
  p->release((*a)->id);
  auto a2 = p->acquire("plan", alpha);
  ASSERT_TRUE(a2.ok() && a2->has_value());
  EXPECT_EQ((*a2)->id, (*a)->id);
  auto c2 = p->acquire("plan", encode("Gamma gamma gamma gamma."));
  ASSERT_TRUE(c2.ok());
  EXPECT_FALSE(c2->has_value());  // a (held again) and the copy (held) fill both slots
  p->release((*copy)->id);
  auto c3 = p->acquire("plan", encode("Gamma gamma gamma gamma."));
  ASSERT_TRUE(c3.ok() && c3->has_value());
  EXPECT_EQ(p->evicted_sessions(), 1);
  EXPECT_NE((*c3)->id, (*copy)->id);
  EXPECT_EQ(p->copied_sessions(), 1);
}

// Parallel agents on one prompt under base-lr: the second waits while the first still computes
// the prompt (a copy then would make it compute the prompt again), then runs on a copy that holds
// the prompt's entries and computes only its last position. In none, whose agents read only their
// own entries, another agent's copy is taken at once; the same agent's waits.
TEST_F(SessionPoolTest, AParallelAgentCopiesThePromptOnceItIsComputed) {
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max.");
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    auto made = SessionPool::create(*model_, tok_.get(), {AgentGroup{names_, ptrs_}}, options(mode));
    ASSERT_TRUE(made.ok()) << made.error().message;
    SessionPool& p = **made;
    auto first = p.acquire("plan", prompt);
    ASSERT_TRUE(first.ok() && first->has_value());
    auto second = p.acquire("action", prompt);
    ASSERT_TRUE(second.ok());
    if (mode == ShareMode::kBaseLr) {
      EXPECT_FALSE(second->has_value()) << "copied before the prompt was computed";
      ASSERT_TRUE((*first)->session->run_agent("plan", 4, {}, {}).ok());  // computes the prompt, then decodes
      second = p.acquire("action", prompt);
      ASSERT_TRUE(second.ok());
    }
    ASSERT_TRUE(second->has_value());
    EXPECT_NE((*second)->id, (*first)->id);
    EXPECT_EQ((*second)->reused_tokens, static_cast<int64_t>(prompt.size()) - 1);
    auto r = (*second)->session->run_agent("action", 4, {}, {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->prefilled_tokens, mode == ShareMode::kBaseLr ? 1 : static_cast<int64_t>(prompt.size()));
  }
  // The same agent again (a second choice of one prompt) in none: it reads its own entries, so it
  // waits for them even there, then computes only the last position.
  auto made = SessionPool::create(*model_, tok_.get(), {AgentGroup{names_, ptrs_}}, options(ShareMode::kNone));
  ASSERT_TRUE(made.ok());
  SessionPool& p = **made;
  auto first = p.acquire("plan", prompt);
  ASSERT_TRUE(first.ok() && first->has_value());
  auto second = p.acquire("plan", prompt);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->has_value()) << "copied before the prompt was computed";
  ASSERT_TRUE((*first)->session->run_agent("plan", 4, {}, {}).ok());
  second = p.acquire("plan", prompt);
  ASSERT_TRUE(second.ok() && second->has_value());
  auto r = (*second)->session->run_agent("plan", 4, {}, {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->prefilled_tokens, 1);
}

// A request that lands on a copy of a held trajectory computes exactly what it computes on that
// trajectory once it is released (the old way: waiting for it), in every mode: the same tokens,
// logits and catch-up, and so the same entries (base modes: the base rows plan computed, which
// the second agent could not have computed itself). plan, whose private caches were copied,
// catches up from where they end, as on the original.
TEST_F(SessionPoolTest, ACopiedTrajectoryComputesAsTheOneItCopies) {
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max.");
  for (ShareMode mode : kAllShareModes) {
    SCOPED_TRACE(share_mode_name(mode));
    auto made = logits_pool(mode);
    ASSERT_NE(made, nullptr);
    SessionPool& p = *made;
    auto held = p.acquire("plan", prompt);
    ASSERT_TRUE(held.ok() && held->has_value());
    AgentSession& orig = *(*held)->session;
    ASSERT_TRUE(orig.run_agent("plan", 8, {}, {}).ok());
    ASSERT_TRUE(orig.run_agent("action", 5, {}, {}).ok());  // plan and action hold entries
    std::vector<int32_t> next = orig.trajectory();
    const std::vector<int32_t> obs = encode(" Observation: the dog ran.");
    next.insert(next.end(), obs.begin() + 1, obs.end());  // without its BOS

    auto copied = p.acquire("reflect", next);  // orig is still held: a copy
    ASSERT_TRUE(copied.ok() && copied->has_value());
    ASSERT_NE((*copied)->id, (*held)->id);
    EXPECT_EQ((*copied)->reused_tokens, static_cast<int64_t>(orig.trajectory().size()));
    const std::vector<StepResult> on_copy = run_each(*(*copied)->session, {"reflect", "plan"}, 6);
    ASSERT_EQ(on_copy.size(), 2u);
    const std::vector<int64_t> copy_computed = (*copied)->session->computed_per_agent();
    p.release((*copied)->id);
    p.release((*held)->id);

    auto back = p.acquire("reflect", next);  // the original, extended
    ASSERT_TRUE(back.ok() && back->has_value());
    ASSERT_EQ((*back)->id, (*held)->id);
    const std::vector<int64_t> before = orig.computed_per_agent();
    const std::vector<StepResult> on_orig = run_each(orig, {"reflect", "plan"}, 6);
    ASSERT_EQ(on_orig.size(), 2u);
    for (size_t s = 0; s < on_orig.size(); ++s) {
      SCOPED_TRACE(on_orig[s].agent);
      EXPECT_EQ(on_copy[s].output_tokens, on_orig[s].output_tokens);
      EXPECT_EQ(on_copy[s].prefilled_tokens, on_orig[s].prefilled_tokens);
      EXPECT_EQ(worst_logit_diff(on_copy[s], on_orig[s]), 0.0);
    }
    // The copy's agents computed what the original's computed for these steps, no more.
    for (size_t a = 0; a < copy_computed.size(); ++a)
      EXPECT_EQ(copy_computed[a], orig.computed_per_agent()[a] - before[a]) << names_[a];
    EXPECT_EQ((*copied)->session->cache_bytes().total(), orig.cache_bytes().total());
    EXPECT_EQ(p.copied_sessions(), 1);
  }
}

// Every trajectory draws from one KV arena, so a copy shares its source's whole blocks; the source
// is then not dropped for room while the copy lives (the copy, less recently used or not, goes
// first). With share_blocks off each trajectory has an arena of its own and nothing is pinned.
TEST_F(SessionPoolTest, ACopysSourceStaysWhileTheCopyLives) {
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max. Max liked to run and play in the sun.");
  ASSERT_GE(prompt.size(), 17u);  // more than a page: whole blocks to share
  for (bool share : {true, false}) {
    SCOPED_TRACE(share ? "one arena" : "an arena each");
    SessionPoolOptions o = options(ShareMode::kFull, 2);
    o.share_blocks = share;
    auto made = SessionPool::create(*model_, tok_.get(), SessionPool::groups_for("base", names_, ptrs_, ShareMode::kFull), o);
    ASSERT_TRUE(made.ok()) << made.error().message;
    SessionPool& p = **made;
    EXPECT_EQ(p.shared_arena() != nullptr, share);
    auto src = p.acquire("plan", prompt);
    ASSERT_TRUE(src.ok() && src->has_value());
    ASSERT_TRUE((*src)->session->run_agent("plan", 4, {}, {}).ok());
    const int64_t used_before = share ? p.shared_arena()->lent_bytes() : 0;
    auto copy = p.acquire("action", prompt);  // the source is held: a copy beside it
    ASSERT_TRUE(copy.ok() && copy->has_value());
    ASSERT_NE((*copy)->id, (*src)->id);
    ASSERT_TRUE((*copy)->session->run_agent("action", 4, {}, {}).ok());
    if (share) EXPECT_LT(p.shared_arena()->lent_bytes(), 2 * used_before) << "the copy stored the prefix again";
    p.release((*src)->id);
    p.release((*copy)->id);
    // Both slots are taken; a new conversation needs one. The source is the least recently used.
    auto other = acquire(p, "plan", encode("The sun was hot and the sky was blue."));
    ASSERT_TRUE(other.ok()) << other.error().message;
    std::vector<int64_t> ids;
    for (const SessionPool::Info& i : p.sessions()) ids.push_back(i.id);
    const bool has_src = std::find(ids.begin(), ids.end(), (*src)->id) != ids.end();
    const bool has_copy = std::find(ids.begin(), ids.end(), (*copy)->id) != ids.end();
    EXPECT_EQ(has_src, share) << "the source goes first only when nothing is shared";
    EXPECT_EQ(has_copy, !share);
  }
}

// A failed request's trajectory is dropped at once (SessionPool::drop), even while a copy shares
// its pages: the copy's pools adopt those pages' slabs (none is left without an owner), the copy
// decodes on into their free blocks, and once it goes too every slab is back in the KV memory.
TEST_F(SessionPoolTest, ADroppedSourcesSharedPagesStayWithItsCopy) {
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max. Max liked to run and play in the sun.");
  ASSERT_GE(prompt.size(), 17u);  // more than a page: whole blocks to share
  auto made = SessionPool::create(*model_, tok_.get(), SessionPool::groups_for("base", names_, ptrs_, ShareMode::kFull),
                                  options(ShareMode::kFull, 2));
  ASSERT_TRUE(made.ok()) << made.error().message;
  SessionPool& p = **made;
  ASSERT_NE(p.shared_arena(), nullptr);
  const KvArena& arena = *p.shared_arena();
  const int64_t lent0 = arena.lent_bytes();
  auto src = p.acquire("plan", prompt);
  ASSERT_TRUE(src.ok() && src->has_value());
  ASSERT_TRUE((*src)->session->run_agent("plan", 4, {}, {}).ok());
  auto copy = p.acquire("action", prompt);  // the source is held: a copy beside it, sharing its pages
  ASSERT_TRUE(copy.ok() && copy->has_value());
  const int64_t copy_id = (*copy)->id;
  AgentSession& copy_session = *(*copy)->session;
  ASSERT_TRUE(copy_session.run_agent("action", 4, {}, {}).ok());
  p.drop((*src)->id);
  EXPECT_EQ(arena.orphan_slabs(), 0) << arena.summary();
  auto more = copy_session.run_agent("plan", 24, {}, {});
  ASSERT_TRUE(more.ok()) << more.error().message;
  EXPECT_FALSE(more->output_tokens.empty());
  p.release(copy_id);
  p.drop(copy_id);
  EXPECT_EQ(arena.lent_bytes(), lent0) << "a slab stayed lent after every trajectory that held it went: " << arena.summary();
}

// A conversation that parts from a kept one after at least a page in common starts as a copy of
// that prefix (its entries are not computed again) when cutting the kept one back would lose
// more than its last completion; with private caches (none) it then computes what a pool that
// never held the other conversation computes.
TEST_F(SessionPoolTest, AConversationThatPartsStartsFromACopyOfTheCommonPrefix) {
  const std::vector<int32_t> shared_part = encode("Once upon a time, there was a little dog named Max. Max liked to run and play in the sun with his friends. One day, Max saw a big red ball near the old tree");
  ASSERT_GE(shared_part.size(), 17u);  // more than a page (16)
  const std::vector<int32_t> tail_a = encode(" in the park with his ball.");
  const std::vector<int32_t> tail_b = encode(" to the big red barn every day.");
  auto with = [&](const std::vector<int32_t>& tail) {
    std::vector<int32_t> v = shared_part;
    v.insert(v.end(), tail.begin() + 1, tail.end());  // without its BOS
    return v;
  };
  const std::vector<int32_t> a = with(tail_a), b = with(tail_b);
  auto made = logits_pool(ShareMode::kNone);
  ASSERT_NE(made, nullptr);
  SessionPool& p = *made;
  auto la = acquire(p, "plan", a);
  ASSERT_TRUE(la.ok()) << la.error().message;
  ASSERT_TRUE(la->session->run_agent("plan", 12, {}, {}).ok());
  // b shares only shared_part with a's trajectory: a new trajectory, a copy of that part.
  auto lb = acquire(p, "plan", b);
  ASSERT_TRUE(lb.ok()) << lb.error().message;
  EXPECT_NE(lb->id, la->id);
  const auto common = static_cast<int64_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  EXPECT_EQ(lb->reused_tokens, common);
  EXPECT_EQ(p.copied_sessions(), 1);
  EXPECT_EQ(la->session->trajectory().size(), a.size() + 12);  // a's trajectory is not cut back
  auto on_copy = lb->session->run_agent("plan", 8, {}, {});
  ASSERT_TRUE(on_copy.ok()) << on_copy.error().message;
  EXPECT_EQ(on_copy->prefilled_tokens, static_cast<int64_t>(b.size()) - common);

  auto fresh_pool = logits_pool(ShareMode::kNone);
  ASSERT_NE(fresh_pool, nullptr);
  auto lf = acquire(*fresh_pool, "plan", b);
  ASSERT_TRUE(lf.ok());
  auto ref = lf->session->run_agent("plan", 8, {}, {});
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  EXPECT_EQ(ref->prefilled_tokens, static_cast<int64_t>(b.size()));  // BOS too: a fresh trajectory computed nothing
  EXPECT_EQ(on_copy->output_tokens, ref->output_tokens);
  EXPECT_LT(worst_logit_diff(*on_copy, *ref), 1e-4);
}

// A trajectory cut back to L tokens (then re-extended) computes what one that only ever held
// those tokens computes: the same tokens and logits, in every mode. Reference: a fresh session
// where plan is forced through the kept part of its own output, so every kept position has the
// same origin (plan) as in the cut trajectory.
// A preempted request's trajectory is kept cut back to what it held before the request took it
// (Server::preempt), but not when that is less than a page: a fresh trajectory's BOS kept alone
// would be extended by the next request of any agent, which in base-lr then reads this agent's
// BOS entry instead of computing its own (an answer that depends on what ran before; seen as a
// flaky logprob in ServerTest.AKvMemoryTooSmallForEveryRequestPreemptsAndEachGetsWhatItGetsAlone).
TEST_F(SessionPoolTest, APreemptedTrajectoryCutToLessThanAPageIsDropped) {
  auto p = pool(ShareMode::kBaseLr, 4);
  ASSERT_NE(p, nullptr);
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max.");
  auto held = p->acquire("plan", prompt);
  ASSERT_TRUE(held.ok() && *held);
  const SessionPool::Lease l = **held;
  EXPECT_EQ(l.reused_tokens, 1);  // the BOS a new trajectory starts with
  ASSERT_TRUE(l.session->run_agent("plan", 4, {}, {}).ok());
  p->cut_and_release(l.id, l.reused_tokens);
  for (const auto& i : p->sessions()) EXPECT_NE(i.id, l.id);
  // The next request of another agent starts a trajectory of its own, not on plan's BOS.
  auto next = acquire(*p, "reflect", encode("Sam found a shell"));
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(next->fresh);
  EXPECT_EQ(next->session->kv().processed(next->session->agent_index("plan")), 0);
  // A page or more is kept, cut back.
  auto again = p->acquire("plan", prompt);
  ASSERT_TRUE(again.ok() && *again);
  ASSERT_TRUE((*again)->session->run_agent("plan", 20, {}, {}).ok());
  const int64_t page = options(ShareMode::kBaseLr).replay.sharing.page_size;
  p->cut_and_release((*again)->id, page);
  bool kept = false;
  for (const auto& i : p->sessions()) kept = kept || (i.id == (*again)->id && i.tokens == page && !i.running);
  EXPECT_TRUE(kept);
}

TEST_F(SessionPoolTest, ACutTrajectoryComputesAsOneThatNeverHeldTheCutTokens) {
  const std::vector<int32_t> prompt = encode("Once upon a time, there was a little dog named Max.");
  for (ShareMode mode : kAllShareModes) {
    SCOPED_TRACE(share_mode_name(mode));
    SessionPoolOptions o = options(mode);
    o.replay.keep_logits = true;
    auto cut_pool = logits_pool(mode);
    ASSERT_NE(cut_pool, nullptr);
    auto l1 = acquire(*cut_pool, "plan", prompt);
    ASSERT_TRUE(l1.ok());
    auto r1 = l1->session->run_agent("plan", 10, {}, {});
    ASSERT_TRUE(r1.ok()) << r1.error().message;
    ASSERT_TRUE(l1->session->run_agent("action", 5, {}, {}).ok());  // entries past the cut, from action
    const std::vector<int32_t> full = l1->session->trajectory();
    const size_t L = prompt.size() + 6;  // inside plan's output
    const std::vector<int32_t> kept(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(L));
    // Plan, whose own entries went past the cut, runs again from it; then reflect.
    auto l2 = acquire(*cut_pool, "plan", kept);
    ASSERT_TRUE(l2.ok());
    ASSERT_EQ(l2->id, l1->id);
    const std::vector<StepResult> cut = run_each(*l2->session, {"plan", "reflect"}, 6);
    ASSERT_EQ(cut.size(), 2u);

    auto fresh = AgentSession::create(*model_, tok_.get(), names_, ptrs_, o.replay);
    ASSERT_TRUE(fresh.ok());
    (*fresh)->append(std::vector<int32_t>(prompt.begin() + 1, prompt.end()));  // the session starts with BOS
    ASSERT_TRUE((*fresh)->run_agent("plan", 0, std::vector<int32_t>(kept.begin() + static_cast<std::ptrdiff_t>(prompt.size()), kept.end()), {}).ok());
    ASSERT_EQ((*fresh)->trajectory(), kept);
    const std::vector<StepResult> ref = run_each(**fresh, {"plan", "reflect"}, 6);
    ASSERT_EQ(ref.size(), 2u);

    for (size_t s = 0; s < ref.size(); ++s) {
      SCOPED_TRACE(ref[s].agent);
      EXPECT_EQ(cut[s].output_tokens, ref[s].output_tokens);
      EXPECT_EQ(cut[s].prefilled_tokens, ref[s].prefilled_tokens);
      EXPECT_LT(worst_logit_diff(cut[s], ref[s]), 1e-5);
    }
    // Nothing past the cut is still counted: with only shared caches (action's private ones in the
    // other modes hold its kept positions, which the reference never gave it) the bytes are equal.
    if (mode == ShareMode::kFull || mode == ShareMode::kBaseLr)
      EXPECT_EQ(l2->session->cache_bytes().total(), (*fresh)->cache_bytes().total());
  }
}

// Adapters loaded and unloaded while the pool runs (the server's /v1/load_lora_adapter): in
// every mode, reflect added later lands on the trajectory plan wrote (one trajectory, the prompt
// reused) and computes only what the mode makes it compute; removed while a request holds that
// trajectory, the adapter stays held until the request releases it, and a later request of
// another agent goes on on the same tokens without it.
TEST_F(SessionPoolTest, AnAgentAddedLaterJoinsTheTrajectoryAndOneRemovedLeavesIt) {
  for (ShareMode mode : kAllShareModes) {
    SCOPED_TRACE(share_mode_name(mode));
    auto p = SessionPool::create(*model_, tok_.get(), SessionPool::groups_for("base", {"plan"}, {ptrs_[0]}, mode),
                                 options(mode));
    ASSERT_TRUE(p.ok()) << p.error().message;
    SessionPool& pool = **p;
    auto failed_with = [](const auto& r, ErrorCode code) { return !r.ok() && r.error().code == code; };
    const std::vector<int32_t> prompt = encode("Once upon a time, there was a little girl named Lily.");
    auto first = acquire(pool, "plan", prompt);
    ASSERT_TRUE(first.ok()) << first.error().message;
    ASSERT_TRUE(first->session->run_agent("plan", 6, {}, {}).ok());
    std::vector<int32_t> turn = first->session->trajectory();
    turn.push_back(prompt[3]);

    EXPECT_TRUE(failed_with(pool.acquire("reflect", turn), ErrorCode::kNotFound));
    ASSERT_TRUE(pool.add_agent("reflect", ptrs_[2]).ok());
    EXPECT_TRUE(failed_with(pool.add_agent("reflect", ptrs_[2]), ErrorCode::kInvalidArgument));
    auto held = pool.acquire("reflect", turn);
    ASSERT_TRUE(held.ok() && *held) << (held.ok() ? "waits" : held.error().message);
    EXPECT_EQ((*held)->id, first->id) << "reflect extends the trajectory plan wrote";
    EXPECT_EQ((*held)->reused_tokens, static_cast<int64_t>(turn.size()) - 1);
    auto r = (*held)->session->run_agent("reflect", 4, {}, {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    // Modes that read other agents' entries compute the new token only; none and base all of it.
    const bool reads = (*held)->session->kv().reads_others_entries();
    if (mode != ShareMode::kDroidSpeak)
      EXPECT_EQ(r->prefilled_tokens, reads ? 2 : static_cast<int64_t>(turn.size()));

    ASSERT_TRUE(pool.remove_agent("reflect").ok());
    EXPECT_TRUE(failed_with(pool.remove_agent("reflect"), ErrorCode::kNotFound));
    EXPECT_TRUE(failed_with(pool.remove_agent("base"), ErrorCode::kInvalidArgument));
    EXPECT_TRUE(pool.holds(ptrs_[2])) << "a request runs reflect on it";
    const std::vector<int32_t> after = (*held)->session->trajectory();
    pool.release((*held)->id);
    EXPECT_FALSE(pool.holds(ptrs_[2]));
    EXPECT_TRUE(failed_with(pool.acquire("reflect", after), ErrorCode::kNotFound));
    std::vector<int32_t> next = after;
    next.push_back(prompt[4]);
    auto again = acquire(pool, "plan", next);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ(again->id, first->id);
    EXPECT_EQ(again->reused_tokens, static_cast<int64_t>(next.size()) - 1);
    const std::vector<std::string>& left = again->session->agent_names();
    EXPECT_EQ(std::count(left.begin(), left.end(), "reflect"), 0);
    EXPECT_EQ(std::count(left.begin(), left.end(), "plan"), 1);
  }
}

// An adapter no trajectory of the pool can hold is refused with the mode's reason and leaves the
// pool as it was: on the synthetic Qwen3 (k_norm) under base-lr, one that adapts k_proj cannot
// keep that term in low-rank form; the q/v adapter served before goes on, and the refused name
// is not served.
TEST_F(SessionPoolTest, AnAdapterNoTrajectoryCanHoldIsRefusedAndChangesNothing) {
  auto be = make_cpu_backend(1);
  auto model = LlamaModel::load(testing::fixtures_dir() + "/models/synthetic-qwen3", *be);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto adapter = [&](const char* name) {
    auto a = load_lora_adapter(name, testing::fixtures_dir() + "/adapters/synthetic-qwen3/" + name, (*model)->config());
    EXPECT_TRUE(a.ok()) << a.error().message;
    return a.ok() ? std::move(*a) : nullptr;
  };
  auto qv = adapter("qv"), qkvo = adapter("qkvo");
  ASSERT_TRUE(qv && qkvo);
  SessionPoolOptions o = options(ShareMode::kBaseLr);
  auto p = SessionPool::create(**model, nullptr, SessionPool::groups_for("base", {"qv"}, {qv.get()}, ShareMode::kBaseLr), o);
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 17};
  ASSERT_TRUE(acquire(**p, "qv", prompt).ok());
  const Status st = (*p)->add_agent("qkvo", qkvo.get());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(st.error().message.find("k_norm"), std::string::npos) << st.error().message;
  EXPECT_FALSE((*p)->holds(qkvo.get()));
  auto refused = (*p)->acquire("qkvo", prompt);
  EXPECT_TRUE(!refused.ok() && refused.error().code == ErrorCode::kNotFound);
  auto again = acquire(**p, "qv", prompt);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->session->agent_names(), std::vector<std::string>{"qv"});
  // Under none the same adapter is served beside it (private full caches hold any k_proj term).
  auto none = SessionPool::create(**model, nullptr, SessionPool::groups_for("base", {"qv"}, {qv.get()}, ShareMode::kNone),
                                  options(ShareMode::kNone));
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE((*none)->add_agent("qkvo", qkvo.get()).ok());
  EXPECT_TRUE(acquire(**none, "qkvo", prompt).ok());
}

}  // namespace
}  // namespace lragent::server
