#include "server/session_pool.h"

#include <algorithm>

namespace lragent::server {
namespace {

int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int64_t>(ia - a.begin());
}

}  // namespace

std::vector<AgentGroup> SessionPool::groups_for(const std::string& base_name,
                                                const std::vector<std::string>& adapter_names,
                                                const std::vector<const LoraAdapter*>& adapters, ShareMode mode) {
  AgentGroup all{adapter_names, adapters};
  if (mode == ShareMode::kBaseLr && !adapters.empty()) {
    return {std::move(all), AgentGroup{{base_name}, {nullptr}}};
  }
  all.names.insert(all.names.begin(), base_name);
  all.adapters.insert(all.adapters.begin(), nullptr);
  return {std::move(all)};
}

Result<std::unique_ptr<SessionPool>> SessionPool::create(LlamaModel& model, const Tokenizer* tok,
                                                         std::vector<AgentGroup> groups, SessionPoolOptions opts) {
  if (opts.max_sessions < 1)
    return make_error(ErrorCode::kInvalidArgument, "max_sessions must be at least 1, not {}", opts.max_sessions);
  std::unique_ptr<SessionPool> p(new SessionPool(model));
  p->tok_ = tok;
  p->groups_ = std::move(groups);
  p->opts_ = std::move(opts);
  SpeculativeOptions& spec = p->opts_.replay.speculative;
  if (spec.on() && spec.method == SpeculativeMethod::kSuffix && !spec.corpus) {
    // One corpus for every trajectory: a request drafts from the outputs of all that finished.
    p->corpus_ = std::make_unique<SuffixCorpus>(spec.max_cached_requests);
    spec.corpus = p->corpus_.get();
  }
  SharingOptions& so = p->opts_.replay.sharing;
  if (p->opts_.share_blocks && !so.arena && so.arena_bytes <= 0) {
    // One arena for max_sessions trajectories of the largest group, each pool capped as its own
    // arena would hold it; a slab a pool of every trajectory as slack (partly used slabs, and a
    // slab size above the smaller groups' own).
    if (!so.backend) so.backend = pool_backend(model.backend());
    int64_t per = 0;
    for (int g = 0; g < static_cast<int>(p->groups_.size()); ++g) {
      LRA_ASSIGN_OR_RETURN(const int64_t bytes, p->plan_group(g));
      per = std::max(per, bytes);
    }
    const int64_t slab = p->slab_bytes_;
    per = (per + slab - 1) / slab * slab;
    const int64_t all = per * p->opts_.max_sessions;
    const int64_t bytes = p->opts_.pool_bytes > 0 ? std::min(p->opts_.pool_bytes, all) : all;
    p->oversubscribed_ = bytes < all;
    LRA_ASSIGN_OR_RETURN(p->arena_, KvArena::create(bytes, so.backend, slab));
    so.arena = p->arena_.get();
    so.cap_pools = true;
  }
  // Each group's trajectory must be possible (e.g. base-lr's shared-A check): fail at start-up,
  // not at the first request. The sessions made here are kept as the first ones.
  for (int g = 0; g < static_cast<int>(p->groups_.size()); ++g) {
    if (static_cast<int>(p->entries_.size()) >= p->opts_.max_sessions) break;
    LRA_ASSIGN_OR_RETURN(Entry * e, p->create_session(g));
    (void)e;
  }
  return p;
}

Result<int64_t> SessionPool::plan_group(int g) {
  SharingOptions one = opts_.replay.sharing;
  one.arena = nullptr;
  if (model_.config().max_position_embeddings > 0)
    one.max_tokens = std::min<int64_t>(one.max_tokens, model_.config().max_position_embeddings);
  const AgentGroup& group = groups_[static_cast<size_t>(g)];
  LRA_ASSIGN_OR_RETURN(TrajectoryKv::ArenaPlan plan, TrajectoryKv::plan_arena(model_.config(), group.adapters, one));
  // What one agent's catch-up writes: the caches a trajectory of that agent alone has (in none
  // its own full caches, not every agent's; in base the base and its own low-rank rows).
  std::vector<double> bytes;
  std::vector<int> pools;
  for (const LoraAdapter* a : group.adapters) {
    LRA_ASSIGN_OR_RETURN(TrajectoryKv::ArenaPlan alone, TrajectoryKv::plan_arena(model_.config(), {a}, one));
    bytes.push_back(static_cast<double>(alone.bytes) / static_cast<double>(std::max<int64_t>(one.max_tokens, 1)));
    pools.push_back(alone.n_pools);
  }
  token_bytes_.resize(groups_.size());
  n_pools_.resize(groups_.size());
  token_bytes_[static_cast<size_t>(g)] = std::move(bytes);
  n_pools_[static_cast<size_t>(g)] = std::move(pools);
  // The arena's slab is fixed once made: a group planned later counts its pools at that size.
  if (!arena_) slab_bytes_ = std::max(slab_bytes_, plan.slab_bytes);
  return plan.bytes + static_cast<int64_t>(plan.n_pools) * slab_bytes_;
}

Status SessionPool::add_agent(const std::string& name, const LoraAdapter* adapter) {
  for (const AgentGroup& g : groups_)
    if (std::find(g.names.begin(), g.names.end(), name) != g.names.end())
      return make_error(ErrorCode::kInvalidArgument, "an agent named '{}' is already served", name);
  const ShareMode mode = opts_.replay.sharing.mode;
  // The group it joins: the one of every agent, or in base-lr the first whose adapters share its A
  // (the base model, which has no low-rank rows, is in a group of its own there).
  int join = -1;
  for (size_t g = 0; g < groups_.size() && join < 0; ++g) {
    const AgentGroup& grp = groups_[g];
    if (mode != ShareMode::kBaseLr) {
      join = static_cast<int>(g);
    } else if (!grp.adapters.empty() && grp.adapters.front()) {
      std::vector<const LoraAdapter*> with = grp.adapters;
      with.push_back(adapter);
      if (check_shared_a(with, model_.config().num_layers).ok()) join = static_cast<int>(g);
    }
  }
  const std::vector<AgentGroup> before = groups_;
  if (join < 0) {
    join = static_cast<int>(groups_.size());
    groups_.push_back({});
  }
  groups_[static_cast<size_t>(join)].names.push_back(name);
  groups_[static_cast<size_t>(join)].adapters.push_back(adapter);
  // The same checks (and plan) a trajectory of the group makes; on error plan_group has changed
  // nothing, so the groups alone go back.
  const Result<int64_t> per = plan_group(join);
  if (!per.ok()) {
    groups_ = before;
    return per.error();
  }
  // More agents with private caches than the arena was sized for: requests may now fill it, which
  // the server resolves as with a smaller --kv-cache-memory (it drops idle trajectories, then preempts).
  if (arena_ && *per * opts_.max_sessions > arena_->capacity_bytes()) oversubscribed_ = true;
  sync_agents();
  return Status::Ok();
}

Status SessionPool::remove_agent(const std::string& name) {
  for (AgentGroup& g : groups_) {
    const auto it = std::find(g.names.begin(), g.names.end(), name);
    if (it == g.names.end()) continue;
    const auto i = static_cast<size_t>(it - g.names.begin());
    if (!g.adapters[i]) return make_error(ErrorCode::kInvalidArgument, "'{}' is the base model, not an adapter", name);
    g.names.erase(it);
    g.adapters.erase(g.adapters.begin() + static_cast<long>(i));
    const int gi = static_cast<int>(&g - groups_.data());
    if (!g.adapters.empty()) (void)plan_group(gi);  // a subset of a group that planned: it plans too
    sync_agents();
    return Status::Ok();
  }
  return make_error(ErrorCode::kNotFound, "no adapter named '{}' is served", name);
}

bool SessionPool::holds(const LoraAdapter* adapter) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) {
    const auto& a = e.session->adapters();
    return std::find(a.begin(), a.end(), adapter) != a.end();
  });
}

bool SessionPool::stale(const Entry& e) const {
  const AgentGroup& g = groups_[static_cast<size_t>(e.group)];
  return e.session->agent_names() != g.names || e.session->adapters() != g.adapters;
}

void SessionPool::sync_agents() {
  for (size_t i = 0; i < entries_.size();) {
    Entry& e = entries_[i];
    if (e.held || !stale(e)) {
      ++i;
      continue;
    }
    const AgentGroup& g = groups_[static_cast<size_t>(e.group)];
    bool kept = false;
    if (!g.names.empty()) {
      auto s = AgentSession::create(model_, tok_, g.names, g.adapters, opts_.replay);
      const auto n = static_cast<int64_t>(e.session->trajectory().size());
      if (s.ok() && (*s)->start_from(*e.session, n, /*keep_counts=*/true).ok()) {
        e.session = std::move(*s);
        kept = true;
      }
    }
    if (kept) {
      ++i;
    } else {
      entries_.erase(entries_.begin() + static_cast<long>(i));
      ++evicted_;
    }
  }
}

Result<SessionPool::Entry*> SessionPool::create_session(int group, int64_t spare) {
  const AgentGroup& g = groups_[static_cast<size_t>(group)];
  for (;;) {
    auto s = AgentSession::create(model_, tok_, g.names, g.adapters, opts_.replay);
    if (s.ok()) {
      Entry e;
      e.session = std::move(*s);
      e.id = next_id_++;
      e.group = group;
      e.last_used = ++tick_;
      entries_.push_back(std::move(e));
      return &entries_.back();
    }
    // Out of memory: the least recently used trajectory gives its KV memory back, then retry.
    if (s.error().code != ErrorCode::kOutOfMemory || !evict_lru(spare)) return s.error();
  }
}

Result<std::optional<SessionPool::Entry*>> SessionPool::new_session(int group, int64_t spare) {
  if (static_cast<int>(entries_.size()) >= opts_.max_sessions && !evict_lru(spare)) return std::optional<Entry*>();
  auto made = create_session(group, spare);
  if (made.ok()) return std::optional<Entry*>(*made);
  // Out of memory with only held trajectories left to drop waits for one to be released.
  if (made.error().code == ErrorCode::kOutOfMemory && held_sessions() > 0) return std::optional<Entry*>();
  return made.error();
}

SessionPool::Entry* SessionPool::find(int64_t id) {
  for (Entry& e : entries_)
    if (e.id == id) return &e;
  return nullptr;
}

bool SessionPool::copied_from(int64_t id) const {
  return std::any_of(entries_.begin(), entries_.end(), [id](const Entry& e) { return e.source == id; });
}

bool SessionPool::evict_lru(int64_t spare, bool holding_memory) {
  auto lru = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (!it->held && it->id != spare && (!arena_ || !copied_from(it->id)) &&
        (!holding_memory || it->session->cache_bytes().allocated > 0) &&
        (lru == entries_.end() || it->last_used < lru->last_used))
      lru = it;
  if (lru == entries_.end()) return false;
  entries_.erase(lru);
  ++evicted_;
  return true;
}

int SessionPool::held_sessions() const {
  return static_cast<int>(std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.held; }));
}

void SessionPool::release(int64_t id) {
  for (Entry& e : entries_)
    if (e.id == id) e.held = false;
  sync_agents();
}

Result<std::optional<SessionPool::Lease>> SessionPool::acquire(const std::string& agent, const std::vector<int32_t>& prompt,
                                                               bool reuse, const std::string& salt) {
  int group = -1;
  for (size_t g = 0; g < groups_.size() && group < 0; ++g)
    if (std::find(groups_[g].names.begin(), groups_[g].names.end(), agent) != groups_[g].names.end())
      group = static_cast<int>(g);
  if (group < 0) return make_error(ErrorCode::kNotFound, "no agent named '{}'", agent);
  sync_agents();  // a trajectory released since an adapter was loaded or unloaded

  Entry* extend = nullptr;  // a trajectory that is a whole prefix of the prompt (longest)
  Entry* best = nullptr;    // the longest common prefix otherwise
  int64_t extend_len = -1, best_len = -1;
  for (Entry& e : entries_) {
    if (e.group != group || e.salt != salt || !reuse) continue;
    const std::vector<int32_t>& traj = e.session->trajectory();
    const int64_t l = common_prefix(traj, prompt);
    if (l == static_cast<int64_t>(traj.size()) && l > extend_len) {
      extend = &e;
      extend_len = l;
    }
    if (l > best_len) {
      best = &e;
      best_len = l;
    }
  }
  Entry* use = nullptr;
  int64_t keep = 0;
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  const bool full = static_cast<int>(entries_.size()) >= opts_.max_sessions;
  if (extend) {
    use = extend;
    keep = extend_len;
  } else if (best && best_len > 0 &&
             (best_len >= prompt_len - 1 ||         // the prompt lies inside it: a re-sent turn, or n > 1
              best_len >= best->last_prompt - 1 ||  // it parts within its last completion
              (full && 2 * best_len >= prompt_len))) {
    // Cutting it back loses at most a completion, or there is no free slot and it holds most of
    // the prompt. (A completion's last tokens may tokenize differently once the next prompt's
    // text follows them: BPE merges across the boundary.)
    use = best;
    keep = best_len;
  }
  // A new trajectory starts as a copy of the prompt's longest prefix another one holds (its
  // cache entries copied, not computed): the one this request belongs on while another request
  // runs on it (parallel agents on one prompt, a turn sent early), or the one it parts from.
  int64_t copy_id = 0, copy_len = 0;
  if (use && use->held) {
    // When the running request computes entries this agent would read (the same agent, e.g. a
    // second choice of one prompt; or any agent where catch-ups read others' entries,
    // TrajectoryKv::reads_others_entries), a copy taken before they are computed would make this
    // request compute them again beside it: wait until they are (but the last position: a
    // completion's last token is never computed in its own trajectory). Else the copy is taken at once.
    const TrajectoryKv& kv = use->session->kv();
    const int64_t need = std::min(keep, prompt_len - 1) - 1;
    if (kv.reads_others_entries() && kv.shared_tokens() < need) return std::optional<Lease>();
    const int ai = use->session->agent_index(agent);
    if (use->agent == agent && ai >= 0 && kv.processed(ai) < need) return std::optional<Lease>();
    copy_id = use->id;
    copy_len = keep;
    use = nullptr;
  } else if (!use && best && best_len >= opts_.replay.sharing.page_size) {
    // At least a page in common (as vLLM's prefix cache shares whole blocks): less is not worth
    // tying a new conversation to another's entries.
    copy_id = best->id;
    copy_len = best_len;
  }
  const bool fresh = !use;
  if (!use) {
    auto made = new_session(group, copy_id);
    if (!made.ok()) return made.error();
    if (!*made) return std::optional<Lease>();  // every slot runs a request, or only they hold memory: wait
    use = **made;
    use->salt = salt;
    keep = common_prefix(use->session->trajectory(), prompt);  // the BOS a new trajectory starts with
    if (copy_id > 0) {
      const Entry* from = find(copy_id);
      assert(from && "the trajectory to copy from is held while the new one is made");
      const int64_t n = std::min(copy_len, prompt_len - 1);
      // Should the copy not fit (it always should: the new trajectory has the same KV memory),
      // the prefix is computed instead.
      if (n > keep && use->session->start_from(*from->session, n).ok()) {
        keep = n;
        use->source = copy_id;
        ++copied_;
        copied_tokens_ += n;
      }
    }
  }
  use->held = true;
  use->agent = agent;
  use->last_used = ++tick_;
  use->last_prompt = prompt_len;
  // The prompt's last position always runs again: its logits pick the first token, and an agent
  // that processed the whole prompt before (a re-sent request) would have nothing to forward.
  keep = std::min<int64_t>(keep, static_cast<int64_t>(prompt.size()) - 1);
  AgentSession& s = *use->session;
  s.truncate(keep);
  s.append(std::vector<int32_t>(prompt.begin() + keep, prompt.end()));
  return std::optional<Lease>(Lease{&s, use->id, keep, fresh});
}

double SessionPool::catchup_bytes(const Entry& e, const std::string& agent) const {
  const AgentSession& s = *e.session;
  const int a = s.agent_index(agent);
  if (a < 0) return 0;
  const auto tokens = static_cast<double>(static_cast<int64_t>(s.trajectory().size()) - s.kv().catchup_start(a));
  return tokens * token_bytes_[static_cast<size_t>(e.group)][static_cast<size_t>(a)];
}

bool SessionPool::has_room(int64_t id, const std::string& agent) {
  const Entry* e = find(id);
  if (!arena_ || !e) return true;
  // What the running requests have yet to compute of their own catch-ups takes memory first
  // (choices started in one engine round have not allocated anything yet).
  double need = catchup_bytes(*e, agent);
  for (const Entry& o : entries_)
    if (o.held && o.id != id) need += catchup_bytes(o, o.agent);
  // A trajectory that holds nothing yet takes a slab in each pool the agent writes; else a slab of slack.
  const int a = e->session->agent_index(agent);
  const int64_t slabs = e->session->cache_bytes().allocated > 0 || a < 0
                            ? 1
                            : n_pools_[static_cast<size_t>(e->group)][static_cast<size_t>(a)];
  need += static_cast<double>(slabs * arena_->slab_bytes());
  return need <= static_cast<double>(arena_->free_bytes());
}

int64_t SessionPool::capacity_tokens(int64_t upto) {
  int64_t cap = upto;
  for (Entry& e : entries_) {
    TrajectoryKv& kv = e.session->kv();
    for (int a = 0; a < kv.n_agents(); ++a) {
      auto fits = [&](int64_t n) {
        const bool ok = kv.bind(a)->reserve(n).ok();
        kv.release_beyond(a, 0);
        return ok;
      };
      if (fits(cap)) continue;
      int64_t lo = 0, hi = cap;  // fits(lo) (0 trivially), !fits(hi)
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      cap = lo;
    }
  }
  return cap;
}

void SessionPool::unacquire(const Lease& lease) {
  if (lease.fresh) {
    drop(lease.id);
  } else {
    release(lease.id);
  }
}

void SessionPool::cut_and_release(int64_t id, int64_t keep) {
  Entry* e = find(id);
  if (!e) return;
  // Less than a page (a fresh trajectory's BOS, most often) is not worth keeping for a later
  // request's prefix, as a copy is not taken for less (acquire) and vLLM's prefix cache keeps only
  // whole blocks. Kept, another agent's request would extend it and, in base-lr, read a BOS entry
  // this agent computed: its answer would then depend on which request ran before.
  if (keep < opts_.replay.sharing.page_size) return drop(id);
  e->session->truncate(keep);
  e->held = false;
  e->last_prompt = static_cast<int64_t>(e->session->trajectory().size());
  sync_agents();
}

void SessionPool::drop(int64_t id) {
  std::erase_if(entries_, [id](const Entry& e) { return e.id == id; });
}

std::vector<SessionPool::Info> SessionPool::sessions() const {
  std::vector<Info> out;
  for (const Entry& e : entries_) {
    Info i;
    i.id = e.id;
    i.group = e.group;
    i.running = e.held;
    i.copied = arena_ && copied_from(e.id);
    i.tokens = static_cast<int64_t>(e.session->trajectory().size());
    i.bytes = e.session->cache_bytes();
    i.agents = e.session->agent_names();
    i.computed = e.session->computed_per_agent();
    out.push_back(std::move(i));
  }
  return out;
}

}  // namespace lragent::server
