// KV-cache sharing across agents (adapters) that work on one trajectory (LRAgent).
//
// Per layer and token, with s the adapter's LoRA scale:
//   base entries  K_base = RoPE(X·W_k), V_base = X·W_v           [n_kv_heads * head_dim] each
//   LR entries    LRk = X·A_k (pre-RoPE, when k is adapted), LRv = X·A_v      [rank] each
//   full entries  K = RoPE(X·(W_k + s·A_k·B_k)), V = X·(W_v + s·A_v·B_v)
// Agent a attends with K_j = K_base_j + RoPE_j(s·LRk_j·B_k^a), V_j = V_base_j + s·LRv_j·B_v^a
// in the base modes, never materialising V (Flash-LoRA: O = P·V_base + (P·LRv)·sB_v).
//
// Modes (--kv-share):
//   none        each agent keeps a private full cache and computes every token it has not processed
//   full        one full cache; entries come from the token's origin (first agent to compute it)
//   base        shared base cache + private LR cache per agent (computed from its own hidden states)
//   base-lr     shared base and LR caches (from the origin's hidden states); needs shared-A adapters
//   droidspeak  as full, but the layers in --recompute-layers are private per agent as in none
//   icarus      one full cache whose entries are all the base model's (ICaRus: the base model is
//               the logical encoder that writes every entry, prompt and generated tokens alike;
//               each adapter is a logical decoder that only reads them: SeqInput::decoder), so the
//               cache is the same whichever agent computes a token, and exact for adapters trained
//               that way (others read entries their own K/V LoRA terms did not make)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_binding.h"
#include "model/config.h"
#include "model/lora.h"

namespace lragent {

enum class ShareMode { kNone, kFull, kBase, kBaseLr, kDroidSpeak, kIcarus };
Result<ShareMode> parse_share_mode(std::string_view name);
// The modes' names as errors list them (parse_share_mode; serve adds its auto).
std::string share_mode_choices();
const char* share_mode_name(ShareMode mode);
// The LRAgent poster's five modes (the trace benchmark's columns; icarus is not among them).
inline constexpr ShareMode kAllShareModes[] = {ShareMode::kNone, ShareMode::kFull, ShareMode::kDroidSpeak,
                                               ShareMode::kBase, ShareMode::kBaseLr};
// Whether the mode keeps one full K/V cache for every agent (full, icarus).
inline bool shares_full_cache(ShareMode m) { return m == ShareMode::kFull || m == ShareMode::kIcarus; }

// The base modes keep k_proj's LoRA term as x·A and add RoPE(s·(x·A)·B) to the base key, which
// needs the key to be linear in x. A model that RMS-norms its keys (Qwen3's k_norm) breaks that:
// kUnsupported naming the first adapter that adapts k_proj when `mode` is base or base-lr, else Ok.
Status check_low_rank_k(const ModelConfig& cfg, const std::vector<const LoraAdapter*>& adapters, ShareMode mode);

// base-lr keeps one low-rank cache for every agent, so all adapters (null: the base model, which
// adapts nothing) must project k and v with bit-identical lora_A in every layer: kInvalidArgument
// naming the first target, layer and pair that differ, else Ok.
Status check_shared_a(const std::vector<const LoraAdapter*>& adapters, int num_layers);

// Exact entry bytes by component; allocated = bytes of the pool blocks its streams hold (blocks
// shared with another trajectory, copy_prefix, counted in each).
struct CacheBytes {
  int64_t base = 0, lr = 0, full = 0, allocated = 0;
  int64_t reserved = 0;  // the KV arena's bytes (reserved up front; shared arena: all of it)
  int64_t total() const { return base + lr + full; }
  int64_t page_overhead() const { return allocated - total(); }
};

// What a trajectory's caches went through: their largest bytes() and the private caches dropped
// for room (SharingOptions::evict_private) with the tokens those held.
struct KvUsage {
  CacheBytes peak;
  int64_t evictions = 0, evicted_tokens = 0;
};

struct SharingOptions {
  ShareMode mode = ShareMode::kNone;
  int page_size = 16;
  int64_t max_tokens = 4096;           // longest trajectory; sizes the pools
  std::vector<int> recompute_layers;   // droidspeak: layers kept private per agent
  int64_t value_bytes = 4;             // bytes per cached value (set from the backend's cache dtype)
  Backend* backend = nullptr;          // where the pools live (null: host f32)
  KvArena* arena = nullptr;            // draw every pool from this shared arena (must outlive the trajectory)
  // With `arena`: cap every pool at max_tokens, as the trajectory's own arena would hold (a
  // server's trajectories share one arena, so that forks share blocks, but keep their own limits).
  bool cap_pools = false;
  int64_t arena_bytes = 0;             // without `arena`: the trajectory's own arena size (0: max_tokens in every pool)
  // When a forward pass finds the KV memory full, drop the private caches (none: full K/V; base:
  // LR rows; droidspeak: its private layers) of the least recently run other agent and retry, as
  // vLLM preempts by recompute: that agent runs its forward pass over the whole trajectory at its
  // next call. Shared entries are never dropped. Off: the pass fails with kOutOfMemory.
  bool evict_private = true;
  // droidspeak: an agent's catch-up over positions the shared layers already hold runs only the
  // layers up to its highest recompute layer (TrajectoryKv::catchup_layers): the private entries
  // it computes depend on nothing above. Off: every layer runs (the same entries, more time).
  bool partial_catchup = true;
};

// The cache state of one trajectory shared by agents 0..n-1 (agent i uses adapters[i],
// null meaning the bare base model).
class TrajectoryKv {
 public:
  static Result<std::unique_ptr<TrajectoryKv>> create(const ModelConfig& cfg,
                                                      std::vector<const LoraAdapter*> adapters,
                                                      SharingOptions opts);
  // The arena a trajectory of these options would make for itself (opts.arena ignored): its bytes,
  // slab size and pool count; nothing is allocated. A server sizes one arena for its trajectories so.
  struct ArenaPlan {
    int64_t bytes = 0, slab_bytes = 0;
    int n_pools = 0;
  };
  static Result<ArenaPlan> plan_arena(const ModelConfig& cfg, std::vector<const LoraAdapter*> adapters,
                                      SharingOptions opts);
  ~TrajectoryKv();

  ShareMode mode() const { return opts_.mode; }
  int n_agents() const { return static_cast<int>(adapters_.size()); }
  // The first trajectory position agent `a` must run its forward pass on before decoding.
  int64_t catchup_start(int a) const;
  // Layers a catch-up must run over positions below shared_tokens() (which the shared layers
  // hold already): droidspeak (SharingOptions::partial_catchup) 1 + its highest recompute layer;
  // every other mode all of them (their private entries are in every layer, or there is no
  // catch-up). Positions from shared_tokens() on, and the one whose logits are read, run all.
  int catchup_layers() const;
  // Whether an agent's catch-up costs less over positions another agent computed: it starts past
  // them (full, base-lr) or runs fewer layers there (droidspeak's partial catch-up). In none and
  // base every agent computes every position it reads, whoever computed it before.
  bool reads_others_entries() const { return !per_agent_catchup() || catchup_layers() < cfg_.num_layers; }
  // Binding for agent a's next forward pass over positions [catchup_start(a), ...). A pass that
  // may not happen (decode lookahead's speculative pass) binds with may_evict false: running out
  // of room is then an error instead of dropping other agents' caches for a pass that may be
  // thrown away.
  std::unique_ptr<KvBinding> bind(int a, bool may_evict = true);
  // Gives back the blocks agent a's streams (its private ones and the shared ones) hold beyond
  // `tokens` positions: what a thrown-away speculative pass reserved past the trajectory.
  void release_beyond(int a, int64_t tokens);
  // Agent a has processed positions [0, end).
  void advance(int a, int64_t end);
  // Starts this trajectory, which must hold no entries yet, with `src`'s entries at positions
  // [0, tokens): the shared ones and each agent's private ones there, copied block by block
  // (copy_rows) instead of computed, and each agent's processed positions with them; when both
  // trajectories draw from one KvArena, their whole blocks are shared instead (copy-on-write: a
  // partial last block is copied, and truncate() never cuts inside a shared block). A request
  // that parts from a trajectory another request is running (or that shares only a prefix with
  // it) starts from a copy of that prefix. src must be a trajectory of the same model, agents
  // (adapters) and mode. Errors: a mismatch (kInvalidArgument), no room (kOutOfMemory); on error
  // this trajectory is left empty.
  // `agent_map` (empty: the same agents in the same order) lets src hold other agents: for each
  // of this trajectory's agents, the index of the src agent with the same adapter whose private
  // entries it takes, or -1 for an agent src lacks (it has processed nothing; shared entries are
  // copied all the same). So a server copies its trajectories when it loads or unloads an adapter.
  Status copy_prefix(const TrajectoryKv& src, int64_t tokens, const std::vector<int>& agent_map = {});
  // Forgets every entry at positions >= tokens (the trajectory is cut back there, e.g. a server
  // request that shares only a prefix of it): no agent has processed them, no stream holds
  // blocks past them. Entries below stay as they are; but a cut inside a block shared with
  // another trajectory (copy_prefix) goes back to that block's start, which is then computed again.
  void truncate(int64_t tokens);
  CacheBytes bytes() const;
  // The largest bytes() so far (by total()): caches shrink only when an agent's are evicted.
  CacheBytes peak_bytes() const;
  // Private caches dropped to make room (SharingOptions::evict_private), and the tokens they held.
  int64_t evictions() const { return evictions_; }
  int64_t evicted_tokens() const { return evicted_tokens_; }
  KvUsage usage() const { return {peak_bytes(), evictions_, evicted_tokens_}; }
  int64_t shared_tokens() const { return shared_; }
  int64_t max_tokens() const { return opts_.max_tokens; }  // SharingOptions::max_tokens
  int64_t processed(int a) const { return processed_[static_cast<size_t>(a)]; }

 private:
  friend class SharedBinding;
  TrajectoryKv() = default;
  // create(), or with plan_only set plan_arena(): the same checks and pool plan, then the plan
  // written there and a null trajectory returned.
  static Result<std::unique_ptr<TrajectoryKv>> build(const ModelConfig& cfg, std::vector<const LoraAdapter*> adapters,
                                                     SharingOptions opts, ArenaPlan* plan_only);
  bool layer_private(int layer) const;  // droidspeak recompute layer / none mode
  bool per_agent_catchup() const;
  // Whether agent b's private caches may be dropped for agent `keep`'s pass: b holds some and has
  // no live binding.
  bool droppable(int b, int keep) const;
  // The arena's free slabs plus the slabs that dropping every droppable agent would give back.
  int64_t droppable_slabs(int keep) const;
  // Drops the private caches of the least recently bound droppable agent; false when none is.
  bool evict_lru(int keep);

  ModelConfig cfg_;
  SharingOptions opts_;
  std::vector<const LoraAdapter*> adapters_;
  std::vector<int64_t> processed_;  // [n_agents] positions each agent ran forward on
  std::vector<uint64_t> last_bound_;  // [n_agents] bind() tick of each agent's latest pass (LRU order)
  std::vector<int> live_;             // [n_agents] bindings alive (never evicted while > 0)
  uint64_t tick_ = 0;
  int64_t evictions_ = 0, evicted_tokens_ = 0;
  CacheBytes peak_;  // bytes() just before the largest eviction (between evictions caches only grow)
  int64_t shared_ = 0;              // positions with shared entries
  std::vector<int> private_index_, shared_index_;  // [n_layers] -> layer slot in its pool, or -1
  int rank_k_ = 0, rank_v_ = 0;     // base-lr shared LR widths

  std::unique_ptr<KvArena> own_arena_;             // when not drawing from SharingOptions::arena
  std::vector<std::unique_ptr<BlockPool>> pools_;  // destroyed before own_arena_ (declared after it)
  // Shared streams: K/V (full modes: full K/V; base modes: base K/V; K planes then V planes,
  // kv_k_view / kv_v_view) and, in base-lr, the LR rows.
  PagedStream shared_kv_, shared_lrk_, shared_lrv_;
  // Private streams per agent: none/droidspeak full K/V (priv_kv_), base LR K and V rows.
  std::vector<PagedStream> priv_kv_, priv_k_, priv_v_;
};

}  // namespace lragent
