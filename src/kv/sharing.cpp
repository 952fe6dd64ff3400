#include "kv/sharing.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <span>

namespace lragent {

Result<ShareMode> parse_share_mode(std::string_view name) {
  for (ShareMode m : kAllShareModes)
    if (name == share_mode_name(m)) return m;
  if (name == share_mode_name(ShareMode::kIcarus)) return ShareMode::kIcarus;
  return make_error(ErrorCode::kInvalidArgument, "'{}' is not a sharing mode; choose {}", name, share_mode_choices());
}

std::string share_mode_choices() { return "none, full, base, base-lr, droidspeak or icarus"; }

const char* share_mode_name(ShareMode mode) {
  switch (mode) {
    case ShareMode::kNone: return "none";
    case ShareMode::kFull: return "full";
    case ShareMode::kBase: return "base";
    case ShareMode::kBaseLr: return "base-lr";
    case ShareMode::kDroidSpeak: return "droidspeak";
    case ShareMode::kIcarus: return "icarus";
  }
  return "?";
}

namespace {

const LoraModule* module_of(const LoraAdapter* a, int layer, LoraTarget t) {
  if (!a) return nullptr;
  const auto& m = a->layers[static_cast<size_t>(layer)][static_cast<size_t>(t)];
  return m ? &*m : nullptr;
}

// The rank of target t in adapter a if every layer uses the same one (0 when not adapted).
Result<int> uniform_rank(const LoraAdapter* a, int n_layers, LoraTarget t) {
  int rank = -1;
  for (int l = 0; l < n_layers; ++l) {
    const LoraModule* m = module_of(a, l, t);
    const int r = m ? m->rank : 0;
    if (rank >= 0 && r != rank)
      return make_error(ErrorCode::kUnsupported,
                        "adapter '{}': {} has rank {} in one layer and {} in another; the low-rank cache modes "
                        "need one rank (and every layer adapted) per module",
                        a->name, lora_target_name(t), rank, r);
    rank = r;
  }
  return std::max(rank, 0);
}

// The stores of one layer's write, issued together (Backend::store_rows_multi): rows [from, n) of
// a [n, width] block go to `dst` at positions start_pos + i.
class LayerStores {
 public:
  LayerStores(int64_t start_pos, int64_t n) : start_(start_pos), n_(n) {}
  void add(const float* rows, int64_t width, int64_t from, const PagedView& dst) {
    if (from >= n_) return;
    assert(count_ < kMax && "LayerStores: more stores than a layer writes");
    auto& slots = slots_[count_];  // [n - from] target positions
    slots.resize(static_cast<size_t>(n_ - from));
    for (int64_t i = from; i < n_; ++i) slots[static_cast<size_t>(i - from)] = static_cast<int32_t>(start_ + i);
    jobs_[count_] = {TensorView(DType::kF32, {n_ - from, width}, const_cast<float*>(rows + from * width)), dst,
                     slots.data()};
    ++count_;
  }
  void flush(Backend& be) {
    if (count_ > 0) be.store_rows_multi(std::span<const Backend::StoreJob>(jobs_.data(), count_));
    count_ = 0;
  }

 private:
  static constexpr size_t kMax = 4;
  int64_t start_, n_;
  size_t count_ = 0;
  std::array<Backend::StoreJob, kMax> jobs_;
  std::array<std::vector<int32_t>, kMax> slots_;
};

}  // namespace

Status check_low_rank_k(const ModelConfig& cfg, const std::vector<const LoraAdapter*>& adapters, ShareMode mode) {
  if (!cfg.qk_norm || (mode != ShareMode::kBase && mode != ShareMode::kBaseLr)) return Status::Ok();
  for (const LoraAdapter* ad : adapters)
    for (int l = 0; ad && l < cfg.num_layers; ++l)
      if (module_of(ad, l, LoraTarget::kK))
        return make_error(ErrorCode::kUnsupported,
                          "--kv-share {} keeps k_proj's LoRA term in low-rank form, but {} RMS-norms every key "
                          "(k_norm), so a key is not its base plus a low-rank term; adapter '{}' adapts k_proj. "
                          "Use --kv-share none (private caches) or full, or adapters without k_proj",
                          share_mode_name(mode), cfg.architecture, ad->name);
  return Status::Ok();
}

Status check_shared_a(const std::vector<const LoraAdapter*>& adapters, int num_layers) {
  if (adapters.empty()) return Status::Ok();
  for (LoraTarget t : {LoraTarget::kK, LoraTarget::kV}) {
    for (int l = 0; l < num_layers; ++l) {
      const LoraModule* first = module_of(adapters[0], l, t);
      for (size_t a = 1; a < adapters.size(); ++a) {
        const LoraModule* other = module_of(adapters[a], l, t);
        const bool same = (!first && !other) ||
                          (first && other && first->rank == other->rank &&
                           first->a.view().nbytes() == other->a.view().nbytes() &&
                           std::memcmp(first->a.view().data, other->a.view().data, first->a.view().nbytes()) == 0);
        if (!same) {
          auto name = [](const LoraAdapter* ad) { return ad ? "'" + ad->name + "'" : std::string("the base model"); };
          return make_error(ErrorCode::kInvalidArgument,
                            "--kv-share base-lr needs shared-A adapters, but {} of layer {} has a different lora_A "
                            "in {} and {}; use --kv-share base (private LR cache per agent) instead",
                            lora_target_name(t), l, name(adapters[0]), name(adapters[a]));
        }
      }
    }
  }
  return Status::Ok();
}

// The binding of one agent's forward pass (see the mode table in sharing.h).
class SharedBinding final : public KvBinding {
 public:
  SharedBinding(TrajectoryKv& kv, int agent, bool may_evict)
      : kv_(kv), a_(agent), may_evict_(may_evict), shared_at_bind_(kv.shared_) {
    kv_.live_[static_cast<size_t>(a_)] += 1;
  }
  ~SharedBinding() override { kv_.live_[static_cast<size_t>(a_)] -= 1; }

  Status reserve(int64_t total) override {
    int dropped = 0;
    for (;;) {
      Status st = try_reserve(total);
      if (st.ok() || st.error().code != ErrorCode::kOutOfMemory || !kv_.opts_.evict_private || !may_evict_) return st;
      // Dropping other agents' caches cannot help a pass that would not fit the arena alone (a
      // pool ran out, so there are pools).
      const int64_t arena_slabs = kv_.pools_.front()->arena().n_slabs();
      if (dropped == 0 && slabs_for(total, /*alone=*/true) > arena_slabs)
        return make_error(ErrorCode::kOutOfMemory, "{} (this agent's caches alone need more than the whole KV memory)",
                          st.error().message);
      // Nor one that would not fit with every droppable cache gone: what else holds the arena
      // (agents running beside this one, other trajectories of a shared arena) stays.
      if (dropped == 0 && slabs_for(total, /*alone=*/false) > kv_.droppable_slabs(a_))
        return make_error(ErrorCode::kOutOfMemory,
                          "{} (dropping the other agents' private caches would not make room beside what cannot be "
                          "dropped: agents running now and other users of the KV memory; nothing was dropped)",
                          st.error().message);
      if (kv_.evict_lru(a_)) {
        ++dropped;
        continue;
      }
      if (dropped == 0) return st;
      return make_error(ErrorCode::kOutOfMemory, "{} (after dropping the private caches of {} other agent{})",
                        st.error().message, dropped, dropped == 1 ? "" : "s");
    }
  }

  // Arena slabs the streams this pass writes need to hold `total` tokens each: all of them when
  // `alone` (an empty arena), else only those beyond each stream's table and the free blocks in
  // its pool's slabs.
  int64_t slabs_for(int64_t total, bool alone) const {
    const auto ua = static_cast<size_t>(a_);
    int64_t slabs = 0;
    for (const PagedStream* s : {&kv_.priv_kv_[ua], &kv_.priv_k_[ua], &kv_.priv_v_[ua], &kv_.shared_kv_,
                                 &kv_.shared_lrk_, &kv_.shared_lrv_}) {
      const BlockPool* pool = s->pool();
      if (!pool) continue;
      int64_t blocks = (total + pool->page_size() - 1) / pool->page_size();
      if (!alone) blocks -= static_cast<int64_t>(s->table().size()) + pool->free_in_slabs();
      if (blocks > 0) slabs += (blocks + pool->blocks_per_slab() - 1) / pool->blocks_per_slab();
    }
    return slabs;
  }

  Status try_reserve(int64_t total) {
    const auto ua = static_cast<size_t>(a_);
    for (PagedStream* s : {&kv_.priv_kv_[ua], &kv_.priv_k_[ua], &kv_.priv_v_[ua]})
      if (s->pool()) LRA_RETURN_IF_ERROR(s->reserve(total));
    for (PagedStream* s : {&kv_.shared_kv_, &kv_.shared_lrk_, &kv_.shared_lrv_})
      if (s->pool()) LRA_RETURN_IF_ERROR(s->reserve(total));
    return Status::Ok();
  }

  void write(Backend& be, const LayerKvRows& r) override {
    const int l = r.layer;
    const auto ua = static_cast<size_t>(a_);
    const int64_t width = static_cast<int64_t>(kv_.cfg_.num_kv_heads) * kv_.cfg_.head_dim;
    end_ = std::max(end_, r.start_pos + r.n);
    // Rows at positions >= shared_at_bind_ have no shared entries yet: this agent is their origin.
    const int64_t first_new = std::clamp<int64_t>(shared_at_bind_ - r.start_pos, 0, r.n);
    const ShareMode m = kv_.opts_.mode;
    LayerStores st(r.start_pos, r.n);
    if (kv_.layer_private(l)) {
      const int pl = kv_.private_index_[static_cast<size_t>(l)];
      st.add(r.k_full, width, 0, kv_k_view(kv_.priv_kv_[ua], pl));
      st.add(r.v_full, width, 0, kv_v_view(kv_.priv_kv_[ua], pl));
    } else if (shares_full_cache(m) || m == ShareMode::kDroidSpeak) {
      const int sl = kv_.shared_index_[static_cast<size_t>(l)];
      st.add(r.k_full, width, first_new, kv_k_view(kv_.shared_kv_, sl));
      st.add(r.v_full, width, first_new, kv_v_view(kv_.shared_kv_, sl));
    } else {
      // Base modes: base entries from the origin; LR entries private (base) or from the origin (base-lr).
      st.add(r.k_base, width, first_new, kv_k_view(kv_.shared_kv_, l));
      st.add(r.v_base, width, first_new, kv_v_view(kv_.shared_kv_, l));
      if (m == ShareMode::kBase) {
        if (r.lr_k) st.add(r.lr_k, r.rank_k, 0, kv_.priv_k_[ua].view(l));
        if (r.lr_v) st.add(r.lr_v, r.rank_v, 0, kv_.priv_v_[ua].view(l));
      } else {
        if (r.lr_k) st.add(r.lr_k, r.rank_k, first_new, kv_.shared_lrk_.view(l));
        if (r.lr_v) st.add(r.lr_v, r.rank_v, first_new, kv_.shared_lrv_.view(l));
      }
    }
    st.flush(be);
  }

  void attention_views(int l, AttentionParams& p) const override {
    const auto ua = static_cast<size_t>(a_);
    p.n_ctx = static_cast<int>(end_);
    const ShareMode m = kv_.opts_.mode;
    if (kv_.layer_private(l)) {
      const int pl = kv_.private_index_[static_cast<size_t>(l)];
      p.k = kv_k_view(kv_.priv_kv_[ua], pl);
      p.v = kv_v_view(kv_.priv_kv_[ua], pl);
      return;
    }
    if (shares_full_cache(m) || m == ShareMode::kDroidSpeak) {
      const int sl = kv_.shared_index_[static_cast<size_t>(l)];
      p.k = kv_k_view(kv_.shared_kv_, sl);
      p.v = kv_v_view(kv_.shared_kv_, sl);
      return;
    }
    p.k = kv_k_view(kv_.shared_kv_, l);
    p.v = kv_v_view(kv_.shared_kv_, l);
    const LoraAdapter* ad = kv_.adapters_[ua];
    const bool priv = m == ShareMode::kBase;
    if (const LoraModule* mk = module_of(ad, l, LoraTarget::kK))
      p.k_lr = {priv ? kv_.priv_k_[ua].view(l) : kv_.shared_lrk_.view(l), mk->b_use().data, mk->rank, mk->scale,
                mk->b_use().dtype};
    if (const LoraModule* mv = module_of(ad, l, LoraTarget::kV))
      p.v_lr = {priv ? kv_.priv_v_[ua].view(l) : kv_.shared_lrv_.view(l), mv->b_use().data, mv->rank, mv->scale,
                mv->b_use().dtype};
  }

  bool wants_full() const override {
    return kv_.opts_.mode != ShareMode::kBase && kv_.opts_.mode != ShareMode::kBaseLr;
  }

 private:
  TrajectoryKv& kv_;
  int a_;
  bool may_evict_;
  int64_t shared_at_bind_;
  int64_t end_ = 0;
};

TrajectoryKv::~TrajectoryKv() = default;

bool TrajectoryKv::layer_private(int layer) const {
  return opts_.mode == ShareMode::kNone ||
         (opts_.mode == ShareMode::kDroidSpeak && private_index_[static_cast<size_t>(layer)] >= 0);
}

bool TrajectoryKv::per_agent_catchup() const {
  return opts_.mode == ShareMode::kNone || opts_.mode == ShareMode::kBase ||
         (opts_.mode == ShareMode::kDroidSpeak && !opts_.recompute_layers.empty());
}

Result<std::unique_ptr<TrajectoryKv>> TrajectoryKv::create(const ModelConfig& cfg,
                                                           std::vector<const LoraAdapter*> adapters,
                                                           SharingOptions opts) {
  return build(cfg, std::move(adapters), std::move(opts), nullptr);
}

Result<TrajectoryKv::ArenaPlan> TrajectoryKv::plan_arena(const ModelConfig& cfg, std::vector<const LoraAdapter*> adapters,
                                                         SharingOptions opts) {
  opts.arena = nullptr;
  ArenaPlan plan;
  auto r = build(cfg, std::move(adapters), std::move(opts), &plan);
  if (!r.ok()) return r.error();
  return plan;
}

Result<std::unique_ptr<TrajectoryKv>> TrajectoryKv::build(const ModelConfig& cfg,
                                                          std::vector<const LoraAdapter*> adapters,
                                                          SharingOptions opts, ArenaPlan* plan_only) {
  if (adapters.empty()) return make_error(ErrorCode::kInvalidArgument, "a trajectory needs at least one agent");
  if (opts.page_size < 1 || opts.max_tokens < 1)
    return make_error(ErrorCode::kInvalidArgument, "KV sharing: page size ({}) and max tokens ({}) must be positive",
                      opts.page_size, opts.max_tokens);
  std::unique_ptr<TrajectoryKv> kv(new TrajectoryKv());
  kv->cfg_ = cfg;
  if (opts.backend) opts.value_bytes = static_cast<int64_t>(dtype_size(opts.backend->cache_dtype()));
  kv->opts_ = opts;
  kv->adapters_ = std::move(adapters);
  const int L = cfg.num_layers;
  const size_t n = kv->adapters_.size();
  kv->processed_.assign(n, 0);
  kv->last_bound_.assign(n, 0);
  kv->live_.assign(n, 0);
  kv->priv_kv_.resize(n);
  kv->priv_k_.resize(n);
  kv->priv_v_.resize(n);
  kv->private_index_.assign(static_cast<size_t>(L), -1);
  kv->shared_index_.assign(static_cast<size_t>(L), -1);
  const int64_t width = static_cast<int64_t>(cfg.num_kv_heads) * cfg.head_dim;
  const int64_t blocks = (opts.max_tokens + opts.page_size - 1) / opts.page_size;

  if (opts.mode != ShareMode::kDroidSpeak && !opts.recompute_layers.empty())
    return make_error(ErrorCode::kInvalidArgument, "--recompute-layers only applies to --kv-share droidspeak");
  for (size_t i = 0; i < opts.recompute_layers.size(); ++i) {
    const int l = opts.recompute_layers[i];
    if (l < 0 || l >= L)
      return make_error(ErrorCode::kInvalidArgument,
                        "--recompute-layers: layer {} is out of range; the model has {} layers (0-{})", l, L, L - 1);
    // The byte accounting counts the list's entries as private layers: each one once.
    if (std::find(opts.recompute_layers.begin(), opts.recompute_layers.begin() + static_cast<long>(i), l) !=
        opts.recompute_layers.begin() + static_cast<long>(i))
      return make_error(ErrorCode::kInvalidArgument, "--recompute-layers: layer {} is listed twice", l);
  }

  // The pools are planned first, then made in one arena: the shared one of opts.arena, or one of
  // the trajectory's own that holds max_tokens in every pool (opts.arena_bytes to size it).
  struct PoolPlan {
    std::string name;
    int layers;
    int64_t width;
    PagedStream* stream;
    int64_t footprint;  // slab bytes of one block (BlockPool::footprint_for)
  };
  std::vector<PoolPlan> plans;
  const DType dt = opts.backend ? opts.backend->cache_dtype() : DType::kF32;
  auto plan = [&](std::string name, int layers, int64_t w, PagedStream* stream) {
    plans.push_back({std::move(name), layers, w, stream, BlockPool::footprint_for(layers, opts.page_size, w, dt)});
  };
  auto make_pools = [&]() -> Result<std::unique_ptr<TrajectoryKv>> {
    KvArena* arena = opts.arena;
    if (!arena) {
      int64_t largest = 0, exact = 0;  // exact: bytes of max_tokens in every pool
      for (const PoolPlan& pp : plans) {
        largest = std::max(largest, pp.footprint);
        exact += blocks * pp.footprint;
      }
      int64_t bytes = opts.arena_bytes;
      const int64_t slab = KvArena::slab_for(largest, bytes > 0 ? bytes : exact, static_cast<int>(plans.size()));
      if (bytes <= 0)
        for (const PoolPlan& pp : plans) bytes += BlockPool::arena_bytes_for(pp.layers, pp.footprint, blocks, slab);
      if (plan_only) {
        *plan_only = {bytes / slab * slab, slab, static_cast<int>(plans.size())};
        return std::unique_ptr<TrajectoryKv>();
      }
      LRA_ASSIGN_OR_RETURN(kv->own_arena_, KvArena::create(bytes, opts.backend, slab));
      arena = kv->own_arena_.get();
    }
    // Sized from max_tokens: each cache holds exactly that many tokens, as --max-context says (in a
    // shared arena too with cap_pools).
    const bool capped = (!opts.arena && opts.arena_bytes <= 0) || (opts.arena && opts.cap_pools);
    // Each pool capped at its own share: dropping another agent's blocks cannot make room. (In a
    // server's arena smaller than every trajectory's caps it can, but the server makes room across
    // trajectories itself, least recently used first: Server::make_room.)
    if (capped) kv->opts_.evict_private = false;
    for (const PoolPlan& pp : plans) {
      LRA_ASSIGN_OR_RETURN(auto pool, BlockPool::create(pp.name, pp.layers, opts.page_size, pp.width, arena));
      if (capped) pool->set_max_blocks(blocks);
      *pp.stream = PagedStream(pool.get());
      kv->pools_.push_back(std::move(pool));
    }
    return std::move(kv);
  };

  const ShareMode m = opts.mode;
  if (m == ShareMode::kNone || shares_full_cache(m) || m == ShareMode::kDroidSpeak) {
    int n_priv = 0, n_shared = 0;
    for (int l = 0; l < L; ++l) {
      const bool priv = m == ShareMode::kNone ||
                        std::find(opts.recompute_layers.begin(), opts.recompute_layers.end(), l) !=
                            opts.recompute_layers.end();
      (priv ? kv->private_index_ : kv->shared_index_)[static_cast<size_t>(l)] = priv ? n_priv++ : n_shared++;
    }
    if (n_shared > 0) {
      plan("full.kv", 2 * n_shared, width, &kv->shared_kv_);
    }
    if (n_priv > 0) {
      for (size_t a = 0; a < n; ++a) {
        plan(fmt::format("agent{}.full.kv", a), 2 * n_priv, width, &kv->priv_kv_[a]);
      }
    }
    return make_pools();
  }

  // Base modes: one shared base cache.
  LRA_RETURN_IF_ERROR(check_low_rank_k(cfg, kv->adapters_, m));
  plan("base.kv", 2 * L, width, &kv->shared_kv_);
  if (m == ShareMode::kBase) {
    for (size_t a = 0; a < n; ++a) {
      LRA_ASSIGN_OR_RETURN(int rk, uniform_rank(kv->adapters_[a], L, LoraTarget::kK));
      LRA_ASSIGN_OR_RETURN(int rv, uniform_rank(kv->adapters_[a], L, LoraTarget::kV));
      if (rk > 0) plan(fmt::format("agent{}.lr.k", a), L, rk, &kv->priv_k_[a]);
      if (rv > 0) plan(fmt::format("agent{}.lr.v", a), L, rv, &kv->priv_v_[a]);
    }
    return make_pools();
  }
  // base-lr: the LR cache is shared, so every agent must project with the same A.
  LRA_RETURN_IF_ERROR(check_shared_a(kv->adapters_, L));
  LRA_ASSIGN_OR_RETURN(kv->rank_k_, uniform_rank(kv->adapters_[0], L, LoraTarget::kK));
  LRA_ASSIGN_OR_RETURN(kv->rank_v_, uniform_rank(kv->adapters_[0], L, LoraTarget::kV));
  if (kv->rank_k_ > 0) plan("lr.k", L, kv->rank_k_, &kv->shared_lrk_);
  if (kv->rank_v_ > 0) plan("lr.v", L, kv->rank_v_, &kv->shared_lrv_);
  return make_pools();
}

int64_t TrajectoryKv::catchup_start(int a) const {
  return per_agent_catchup() ? processed_[static_cast<size_t>(a)] : shared_;
}

int TrajectoryKv::catchup_layers() const {
  const std::vector<int>& r = opts_.recompute_layers;
  if (opts_.mode != ShareMode::kDroidSpeak || !opts_.partial_catchup || r.empty()) return cfg_.num_layers;
  return 1 + *std::max_element(r.begin(), r.end());
}

std::unique_ptr<KvBinding> TrajectoryKv::bind(int a, bool may_evict) {
  last_bound_[static_cast<size_t>(a)] = ++tick_;
  return std::make_unique<SharedBinding>(*this, a, may_evict);
}

void TrajectoryKv::release_beyond(int a, int64_t tokens) {
  const auto ua = static_cast<size_t>(a);
  for (PagedStream* s : {&priv_kv_[ua], &priv_k_[ua], &priv_v_[ua], &shared_kv_, &shared_lrk_, &shared_lrv_})
    if (s->pool()) s->release_beyond(tokens);
}

void TrajectoryKv::truncate(int64_t tokens) {
  tokens = std::max<int64_t>(tokens, 0);
  // A block that another trajectory shares (a fork's prefix, or this fork's source's) is never
  // written: when the cut falls inside one, cut back to its start (its rows are computed again).
  const int page = opts_.page_size;
  if (tokens % page != 0) {
    bool shared_tail = false;
    for (const PagedStream* s : {&shared_kv_, &shared_lrk_, &shared_lrv_}) shared_tail |= s->shares_row(tokens);
    for (size_t a = 0; a < processed_.size(); ++a)
      for (const PagedStream* s : {&priv_kv_[a], &priv_k_[a], &priv_v_[a]}) shared_tail |= s->shares_row(tokens);
    if (shared_tail) tokens = tokens / page * page;
  }
  for (auto& p : processed_) p = std::min(p, tokens);
  shared_ = std::min(shared_, tokens);
  for (PagedStream* s : {&shared_kv_, &shared_lrk_, &shared_lrv_})
    if (s->pool()) s->release_beyond(tokens);
  for (size_t a = 0; a < processed_.size(); ++a)
    for (PagedStream* s : {&priv_kv_[a], &priv_k_[a], &priv_v_[a]})
      if (s->pool()) s->release_beyond(tokens);
}

void TrajectoryKv::advance(int a, int64_t end) {
  auto& p = processed_[static_cast<size_t>(a)];
  p = std::max(p, end);
  shared_ = std::max(shared_, end);
}

Status TrajectoryKv::copy_prefix(const TrajectoryKv& src, int64_t tokens, const std::vector<int>& agent_map) {
  if (&src == this) return make_error(ErrorCode::kInvalidArgument, "KV copy: a trajectory cannot copy itself");
  // from[a]: the src agent whose private entries agent a takes (-1: none).
  std::vector<int> from = agent_map;
  if (from.empty()) {
    if (src.adapters_ != adapters_)
      return make_error(ErrorCode::kInvalidArgument, "KV copy: the trajectories differ in agents");
    for (int a = 0; a < n_agents(); ++a) from.push_back(a);
  }
  if (static_cast<int>(from.size()) != n_agents())
    return make_error(ErrorCode::kInvalidArgument, "KV copy: the agent map has {} entries for {} agents", from.size(),
                      n_agents());
  for (size_t a = 0; a < from.size(); ++a)
    if (from[a] >= src.n_agents() || (from[a] >= 0 && src.adapters_[static_cast<size_t>(from[a])] != adapters_[a]))
      return make_error(ErrorCode::kInvalidArgument, "KV copy: agent {} is mapped to agent {}, of another adapter", a,
                        from[a]);
  if (src.opts_.mode != opts_.mode || src.cfg_.num_layers != cfg_.num_layers ||
      src.cfg_.num_kv_heads != cfg_.num_kv_heads || src.cfg_.head_dim != cfg_.head_dim ||
      src.opts_.page_size != opts_.page_size || src.opts_.recompute_layers != opts_.recompute_layers)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV copy: the trajectories differ in model, sharing mode or page size");
  if (shared_ > 0 || std::any_of(processed_.begin(), processed_.end(), [](int64_t p) { return p > 0; }))
    return make_error(ErrorCode::kInvalidArgument, "KV copy: the destination trajectory already holds entries");
  tokens = std::max<int64_t>(tokens, 0);
  const int64_t shared = std::min(src.shared_, tokens);
  std::vector<int64_t> processed(processed_.size(), 0);
  for (size_t a = 0; a < processed.size(); ++a)
    if (from[a] >= 0) processed[a] = std::min(src.processed_[static_cast<size_t>(from[a])], tokens);
  // In one arena the prefix's whole blocks are shared, not copied (PagedStream::share_prefix).
  auto copy = [](const PagedStream& from, PagedStream& to, int64_t n) -> Status {
    if (!to.pool() || n <= 0) return Status::Ok();
    if (from.pool() && to.pool()->same_geometry(*from.pool())) return to.share_prefix(from, n);
    LRA_RETURN_IF_ERROR(to.reserve(n));
    return copy_rows(from, to, n);
  };
  auto copy_all = [&]() -> Status {
    LRA_RETURN_IF_ERROR(copy(src.shared_kv_, shared_kv_, shared));
    LRA_RETURN_IF_ERROR(copy(src.shared_lrk_, shared_lrk_, shared));
    LRA_RETURN_IF_ERROR(copy(src.shared_lrv_, shared_lrv_, shared));
    for (size_t a = 0; a < processed.size(); ++a) {
      if (from[a] < 0) continue;
      const auto j = static_cast<size_t>(from[a]);
      LRA_RETURN_IF_ERROR(copy(src.priv_kv_[j], priv_kv_[a], processed[a]));
      LRA_RETURN_IF_ERROR(copy(src.priv_k_[j], priv_k_[a], processed[a]));
      LRA_RETURN_IF_ERROR(copy(src.priv_v_[j], priv_v_[a], processed[a]));
    }
    return Status::Ok();
  };
  if (Status st = copy_all(); !st.ok()) {
    truncate(0);  // gives back what was reserved: the trajectory stays empty
    return st;
  }
  shared_ = shared;
  processed_ = std::move(processed);
  peak_ = CacheBytes{};
  return Status::Ok();
}

CacheBytes TrajectoryKv::peak_bytes() const {
  const CacheBytes now = bytes();
  return now.total() > peak_.total() ? now : peak_;
}

bool TrajectoryKv::droppable(int b, int keep) const {
  const auto ub = static_cast<size_t>(b);
  const bool holds = !priv_kv_[ub].table().empty() || !priv_k_[ub].table().empty() || !priv_v_[ub].table().empty();
  // An agent with a live binding may be in the same batch as `keep`: its views must stay.
  return b != keep && holds && live_[ub] == 0;
}

int64_t TrajectoryKv::droppable_slabs(int keep) const {
  // Every private pool belongs to one agent: dropping its streams gives all the pool's slabs back.
  int64_t slabs = pools_.empty() ? 0 : pools_.front()->arena().free_slabs();
  for (int b = 0; b < n_agents(); ++b) {
    if (!droppable(b, keep)) continue;
    const auto ub = static_cast<size_t>(b);
    for (const PagedStream* s : {&priv_kv_[ub], &priv_k_[ub], &priv_v_[ub]})
      if (s->pool()) slabs += s->pool()->held_slabs();
  }
  return slabs;
}

bool TrajectoryKv::evict_lru(int keep) {
  int victim = -1;
  for (int b = 0; b < n_agents(); ++b) {
    if (!droppable(b, keep)) continue;
    if (victim < 0 || last_bound_[static_cast<size_t>(b)] < last_bound_[static_cast<size_t>(victim)]) victim = b;
  }
  if (victim < 0) return false;
  peak_ = peak_bytes();
  const auto uv = static_cast<size_t>(victim);
  // The victim's last pass was issued before this one on the same stream, so its blocks can be
  // rewritten by the passes that follow.
  priv_kv_[uv].clear();
  priv_k_[uv].clear();
  priv_v_[uv].clear();
  evictions_ += 1;
  evicted_tokens_ += processed_[uv];
  // Its private entries are gone: its next call catches up from the start (shared entries stay).
  processed_[uv] = 0;
  return true;
}

CacheBytes TrajectoryKv::bytes() const {
  CacheBytes b;
  const int64_t L = cfg_.num_layers, vb = opts_.value_bytes;
  const int64_t full_row = 2LL * cfg_.num_kv_heads * cfg_.head_dim * vb;  // K + V of one token and layer
  int64_t sum_processed = 0;
  for (int64_t p : processed_) sum_processed += p;
  switch (opts_.mode) {
    case ShareMode::kNone: b.full = sum_processed * L * full_row; break;
    case ShareMode::kFull:
    case ShareMode::kIcarus: b.full = shared_ * L * full_row; break;
    case ShareMode::kDroidSpeak: {
      const int64_t r = static_cast<int64_t>(opts_.recompute_layers.size());
      b.full = shared_ * (L - r) * full_row + sum_processed * r * full_row;
      break;
    }
    case ShareMode::kBase:
      b.base = shared_ * L * full_row;
      for (size_t a = 0; a < processed_.size(); ++a) {
        const int64_t w = (priv_k_[a].pool() ? priv_k_[a].pool()->width() : 0) +
                          (priv_v_[a].pool() ? priv_v_[a].pool()->width() : 0);
        b.lr += processed_[a] * L * w * vb;
      }
      break;
    case ShareMode::kBaseLr:
      b.base = shared_ * L * full_row;
      b.lr = shared_ * L * (rank_k_ + rank_v_) * vb;
      break;
  }
  for (const auto& pool : pools_) b.allocated += pool->used_blocks() * static_cast<int64_t>(pool->block_bytes());
  if (!pools_.empty()) b.reserved = pools_.front()->arena().capacity_bytes();
  return b;
}

}  // namespace lragent
