// The trajectories a server keeps between requests, so that agents (adapters) that send the
// same growing text share its KV cache as `lragent replay` agents do.
//
// A multi-agent client calls the server once per agent turn, each prompt being the whole
// trajectory so far: plan's prompt, then that prompt + plan's output + an observation for the
// action agent, and so on. Each kept trajectory is an AgentSession over all the agents of one
// group, under the server's sharing mode. A request goes to the trajectory whose tokens share
// the longest prefix with its prompt:
//   - a trajectory that is a whole prefix of the prompt is extended (the usual agent turn);
//   - else one is cut back to the common prefix when that loses only its last completion: the
//     prompt lies inside it (a re-sent turn, n > 1), or the prompt holds all of the last
//     request's prompt (the client edited the completion, or its end tokenized differently once
//     text followed it); also, when no slot is free, one that shares at least half of the prompt;
//   - else a new trajectory is started (the least recently used one making room beyond
//     max_sessions), so that two conversations that part keep their own trajectories.
// A new trajectory never computes what another already holds: it starts as a copy of the
// prompt's longest common prefix with a kept trajectory (AgentSession::start_from). So a request
// whose trajectory another request is running (parallel agents on one prompt, a turn sent early)
// runs beside it on a copy instead of waiting, and a conversation that parts from another after
// a long common prefix does not compute that prefix again. Every trajectory draws from one KV
// arena (SessionPoolOptions::share_blocks), so the copy takes the prefix's whole blocks by
// reference instead of storing them again (copy-on-write: TrajectoryKv::copy_prefix); each
// trajectory's pools keep their --max-context caps, which count shared blocks, so a trajectory
// never runs out of room because of another. A trajectory whose blocks a live copy shares is not
// dropped for room before that copy is (the shared blocks would stay, held by the copy). Parallel
// agents on one prompt then decode over the same blocks, and the CUDA backend reads those once for
// all of them (shared-prefix attention, docs/backend-cuda.md). With --kv-memory each trajectory
// has an arena of its own and a copy holds its own blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/replay.h"

namespace lragent::server {

// Agents that can share one trajectory: every served model name is in exactly one group (the
// base model is alone when base-lr's shared low-rank cache cannot hold it; see SessionPool::groups_for).
struct AgentGroup {
  std::vector<std::string> names;
  std::vector<const LoraAdapter*> adapters;  // null: the base model
};

struct SessionPoolOptions {
  ReplayOptions replay;  // sharing mode and KV sizing of every trajectory, decode lookahead
  int max_sessions = 4;  // trajectories kept (each reserves its KV memory when created)
  // One KV arena for all trajectories, sized for max_sessions of them, so that copies share blocks
  // (without replay.sharing.arena_bytes, the per-trajectory --kv-memory; false: an arena each).
  bool share_blocks = true;
  // share_blocks: the arena's bytes (vLLM's KV cache memory). 0: max_sessions trajectories at
  // their caps, so that no request ever waits for memory once it runs. Less lets max_sessions
  // requests run on what they hold now (trajectories take blocks as they grow, up to their caps);
  // the arena may then fill while requests run, which the server resolves (it drops idle
  // trajectories, then preempts the latest request by recompute).
  int64_t pool_bytes = 0;
};

class SessionPool {
 public:
  static Result<std::unique_ptr<SessionPool>> create(LlamaModel& model, const Tokenizer* tok,
                                                     std::vector<AgentGroup> groups, SessionPoolOptions opts);
  // The groups for a base model named `base_name` and adapters under `mode`: one group holding
  // them all, except that base-lr keeps the base model apart (its trajectory has no low-rank
  // rows, and the adapters' shared A would have to be its too).
  static std::vector<AgentGroup> groups_for(const std::string& base_name, const std::vector<std::string>& adapter_names,
                                            const std::vector<const LoraAdapter*>& adapters, ShareMode mode);

  // Serves `name` (an adapter loaded while the server runs) from now on: it joins a group whose
  // trajectories it can share (in base-lr the adapters whose A it shares; when none can hold it,
  // a group of its own), and the kept trajectories of that group take it on, as copies made with
  // the new agents (their entries taken by reference in one KV arena, not computed again), when
  // no request holds them. Errors: a name already served (kInvalidArgument); an adapter no
  // trajectory can hold (base modes: k_proj under k_norm, kUnsupported), the pool unchanged.
  Status add_agent(const std::string& name, const LoraAdapter* adapter);
  // Stops serving the adapter `name`: a request for it fails (kNotFound), and each kept
  // trajectory is copied without it once no request holds it, its private entries given back.
  // kNotFound when no adapter of that name is served (the base model is always served).
  Status remove_agent(const std::string& name);
  // Whether a kept trajectory still holds `adapter` (a running request's, or one not copied yet):
  // its weights must stay until none does.
  bool holds(const LoraAdapter* adapter) const;

  struct Lease {
    AgentSession* session = nullptr;
    int64_t id = 0;
    // Prompt tokens kept from the trajectory (all but the last, which always runs again). Whether
    // this agent computes them anyway is the sharing mode's (StepResult::prefilled_tokens).
    int64_t reused_tokens = 0;
    // Made for this request (a new trajectory, or a copy of another's prefix): it holds nothing
    // another request left (unacquire() drops it).
    bool fresh = false;
  };
  // The trajectory that will run `agent` on `prompt` (which then is its whole token sequence),
  // held by the caller until release(). The one this prompt belongs on, when another request
  // holds it, is copied into a new slot, once that request has computed the common prefix where
  // this agent would read its entries (full, droidspeak, base-lr; or the same agent). nullopt:
  // that prefix is still being computed, every slot holds a trajectory a request runs on, or room
  // for a new one can only be made by dropping a held one; ask again after the next engine pass.
  // Held trajectories are never cut back or dropped.
  // Errors: unknown agent (kNotFound), no memory for a new trajectory (kOutOfMemory).
  // reuse false: a new trajectory that holds none of the prompt (no other is extended, cut back
  // or copied), for a request that must compute all of it (prompt log-probabilities).
  // salt (vLLM's cache_salt): only trajectories made for requests of the same salt are extended,
  // cut back or copied, so that clients that do not share a salt never share cache entries (nor
  // learn from a request's speed what another client sent).
  Result<std::optional<Lease>> acquire(const std::string& agent, const std::vector<int32_t>& prompt,
                                       bool reuse = true, const std::string& salt = {});
  // The request running on trajectory `id` is done with it.
  void release(int64_t id);
  // The caller ran nothing on the lease after all (the request waits for KV room, or its client
  // left): a trajectory made for it goes again, another is released. Kept, a fresh copy would
  // hold the blocks it took while the request waits, be dropped for room, and be made again at the
  // next try (a livelock seen once on the GPU: docs/server.md).
  void unacquire(const Lease& lease);
  // Forgets a trajectory (after a failed request its state is not trusted).
  void drop(int64_t id);
  // The request running on trajectory `id` stops before its end (preempted to make room in the
  // KV memory): the trajectory is cut back to its first `keep` tokens (what it held when that
  // request took it, Lease::reused_tokens, computed by whichever agents computed them) and kept
  // unheld, its pages past them back to the memory. The request resumes on it, computing only its
  // own tokens again and reading the same entries as before, unless the memory needed it dropped
  // too (evict_idle), as vLLM's prefix cache keeps a preempted request's shared blocks. Cut back to
  // less than a page, it is dropped instead.
  void cut_and_release(int64_t id, int64_t keep);
  // Drops the least recently used trajectory that holds KV memory, no request holds, and no
  // live copy shares blocks with (it is kept only for a later request's prefix); false when there
  // is none. (One holding nothing, e.g. made for a request that then waited, frees nothing.)
  bool evict_idle() { return evict_lru(0, /*holding_memory=*/true); }
  // Trajectories a request holds now.
  int held_sessions() const;
  // Whether the arena is smaller than max_sessions trajectories at their caps (pool_bytes), so
  // that requests running at once may fill it.
  bool oversubscribed() const { return oversubscribed_; }
  // Whether the shared arena's free slabs hold the catch-up agent `agent` must compute on the
  // held trajectory `id` before its first token, beside what the other held trajectories' requests
  // have yet to compute of theirs: at the bytes a token takes in the caches the agent writes (an
  // upper bound), plus a slab in each of those pools on a trajectory that holds nothing yet (else one); true
  // without a shared arena. A request that starts without that room would likely fill the arena
  // part way through its prompt and be preempted, its work thrown away.
  bool has_room(int64_t id, const std::string& agent);

  struct Info {
    int64_t id = 0;
    int group = 0;
    bool running = false;  // a request holds it (acquire() until release())
    // A live copy shares its blocks (with one KV arena): evict_idle() does not drop it first.
    bool copied = false;
    int64_t tokens = 0;
    CacheBytes bytes;
    std::vector<std::string> agents;
    std::vector<int64_t> computed;  // forward-pass tokens per agent, as in replay
  };
  std::vector<Info> sessions() const;
  // The longest trajectory (in tokens, at most `upto`) every agent can run alone in one
  // trajectory's KV memory: its shared caches and the agent's private ones. Measured by reserving
  // pages in the fresh trajectories create() made (nothing is computed); call before any request.
  int64_t capacity_tokens(int64_t upto);
  int64_t evicted_sessions() const { return evicted_; }
  // Trajectories started as a copy of another's prefix, and the prompt tokens those copies held.
  int64_t copied_sessions() const { return copied_; }
  int64_t copied_tokens() const { return copied_tokens_; }
  // The arena every trajectory draws from (share_blocks), else null.
  const KvArena* shared_arena() const { return arena_.get(); }

 private:
  struct Entry {
    std::unique_ptr<AgentSession> session;
    int64_t id = 0;
    int group = 0;
    uint64_t last_used = 0;
    int64_t last_prompt = 0;  // tokens of the latest request's prompt (where its completion began)
    bool held = false;        // a request runs on it (acquire() until release())
    std::string agent;        // the agent of the latest request on it
    int64_t source = 0;       // the trajectory it was copied from (0: none)
    std::string salt;         // the cache_salt of the requests it serves (acquire)
  };
  SessionPool(LlamaModel& m) : model_(m) {}
  // A new trajectory of `group`; out of memory, the least recently used unheld one other than
  // `spare` makes room. Entry pointers taken before it are invalid after it.
  Result<Entry*> create_session(int group, int64_t spare = 0);
  // The same when every slot is taken, too. nullopt: only held trajectories (or `spare`, the one
  // a copy is made from) could make room.
  Result<std::optional<Entry*>> new_session(int group, int64_t spare);
  Entry* find(int64_t id);
  // Drops the least recently used trajectory no request holds, never `spare`; false when none can go.
  bool evict_lru(int64_t spare = 0, bool holding_memory = false);
  // Bytes `agent`'s catch-up on e (the positions it has yet to compute) will take, at most.
  double catchup_bytes(const Entry& e, const std::string& agent) const;

  // Whether a live trajectory was copied from `id` (its blocks may hold that one's prefix).
  bool copied_from(int64_t id) const;
  // Group g's trajectory planned (the checks a trajectory of it makes, nothing allocated): its
  // token_bytes_ and n_pools_ (read with a shared arena), and the bytes of one at its caps with a
  // slab of slack per pool (what the arena is sized by). On error nothing is changed.
  Result<int64_t> plan_group(int g);
  // Whether e's trajectory serves other agents than its group does now (add_agent, remove_agent).
  bool stale(const Entry& e) const;
  // Every stale trajectory no request holds becomes a copy with its group's agents
  // (AgentSession::start_from); one that cannot be copied (no room; a group left without
  // agents) is dropped.
  void sync_agents();

  LlamaModel& model_;
  const Tokenizer* tok_ = nullptr;
  std::vector<AgentGroup> groups_;  // grows with add_agent; a group emptied by remove_agent stays (entries index it)
  SessionPoolOptions opts_;
  std::unique_ptr<KvArena> arena_;  // share_blocks: every trajectory's (outlives entries_)
  std::unique_ptr<SuffixCorpus> corpus_;  // --speculative-config's suffix method: every trajectory's (outlives entries_)
  int64_t slab_bytes_ = 0;          // share_blocks: the arena's slab (the largest group's at create())
  bool oversubscribed_ = false;
  // [groups][agents] bytes a token takes in the caches an agent's catch-up writes, and their pools
  std::vector<std::vector<double>> token_bytes_;
  std::vector<std::vector<int>> n_pools_;
  std::vector<Entry> entries_;
  int64_t next_id_ = 1;
  uint64_t tick_ = 0;
  int64_t evicted_ = 0;
  int64_t copied_ = 0, copied_tokens_ = 0;
};

}  // namespace lragent::server
