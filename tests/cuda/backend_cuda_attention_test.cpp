// The CUDA backend's attention against the CPU backend's (the CudaOps suite of
// backend_cuda_test.cpp, both dtypes): one sequence at a time over paged caches with LoRA terms,
// then attention_batch's shared launches (decode rows over several KV arenas and adapters, forks
// that share a prefix). Every test skips (with a message) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/backend_cuda_test_util.h"
#include "cuda/cuda_test_util.h"
#include "agents/replay.h"
#include "engine/generator.h"
#include "backend/backend.h"
#include "core/dtype.h"
#include "kv/block_pool.h"
#include "model/llama.h"
#include "model/lora.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"


namespace lragent {
namespace {

using testing::CudaOps;
using testing::cuda_backend;
using testing::host_values;
using testing::random_host;
using testing::rel_l2;

TEST_P(CudaOps, AttentionMatchesCpu) {
  const DType dt = GetParam();
  struct Case { int hd, heads, kv_heads, n_ctx, n_q, page, rank; bool k_lr, v_lr; };
  const Case cases[] = {
      {8, 4, 1, 97, 17, 1, 8, true, true},      {32, 4, 4, 17, 1, 16, 4, false, true},
      {64, 8, 2, 97, 17, 16, 16, false, true},  {128, 8, 2, 4097, 1, 16, 16, false, true},
      {128, 4, 1, 300, 97, 16, 16, true, true}, {128, 4, 4, 1, 1, 1, 0, false, false},
      {64, 16, 2, 1000, 128, 16, 64, false, false},
      {128, 8, 2, 2000, 300, 16, 16, true, true},  {128, 8, 2, 1500, 256, 1, 8, true, false},
      {64, 16, 2, 1100, 128, 16, 4, true, true},
      {128, 8, 2, 16500, 160, 16, 16, true, true},  // 640 rows over >= 16k keys: materialised
      {128, 8, 2, 16500, 96, 16, 8, true, false},   // 384 rows: fused
  };
  for (const Case& c : cases) {
    const int64_t materialized_before = gpu->graph_stats().materialized_k;
    const int64_t width = static_cast<int64_t>(c.kv_heads) * c.hd;
    const int64_t blocks = (c.n_ctx + c.page - 1) / c.page;
    Tensor kh = random_host({c.n_ctx, width}, 11), vh = random_host({c.n_ctx, width}, 12);
    Tensor lkh = random_host({c.n_ctx, std::max(c.rank, 1)}, 13), lvh = random_host({c.n_ctx, std::max(c.rank, 1)}, 14);
    Tensor bk = random_host({width, std::max(c.rank, 1)}, 15, 0.3f), bv = random_host({width, std::max(c.rank, 1)}, 16, 0.3f);
    Tensor q = random_host({c.n_q, c.heads, c.hd}, 17);
    std::vector<int32_t> slots(static_cast<size_t>(c.n_ctx)), q_pos(static_cast<size_t>(c.n_q));
    for (int i = 0; i < c.n_ctx; ++i) slots[static_cast<size_t>(i)] = i;
    for (int i = 0; i < c.n_q; ++i) q_pos[static_cast<size_t>(i)] = c.n_ctx - c.n_q + i;
    std::vector<float> inv_freq(static_cast<size_t>(c.hd / 2));
    for (int i = 0; i < c.hd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.f, -2.f * i / c.hd);

    std::vector<float> outs[2];
    Backend* bes[2] = {cpu.get(), gpu.get()};
    for (int side = 0; side < 2; ++side) {
      Backend& be = *bes[side];
      Backend* pb = pool_backend(be);
      auto pk = BlockPool::create("k", 1, c.page, width, blocks, pb);
      auto pv = BlockPool::create("v", 1, c.page, width, blocks, pb);
      auto plk = BlockPool::create("lrk", 1, c.page, std::max(c.rank, 1), blocks, pb);
      auto plv = BlockPool::create("lrv", 1, c.page, std::max(c.rank, 1), blocks, pb);
      ASSERT_TRUE(pk.ok() && pv.ok() && plk.ok() && plv.ok());
      // Each pool's blocks as allocated, in a shuffled order: [blocks] block ids per pool.
      std::vector<int32_t> tables[4];
      BlockPool* pools[4] = {pk->get(), pv->get(), plk->get(), plv->get()};
      for (int i = 0; i < 4; ++i) {
        std::vector<int32_t> ids;
        for (int64_t b = 0; b < blocks; ++b) {
          auto id = pools[i]->allocate();
          ASSERT_TRUE(id.ok()) << id.error().message;
          ids.push_back(*id);
        }
        // A seeded shuffle (a stride permutation such as (5b + 3) mod n repeats ids when 5 divides n).
        std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<uint32_t>(7 + i)));
        tables[i] = std::move(ids);
      }
      struct Release {
        BlockPool** pools;
        std::vector<int32_t>* tables;
        ~Release() {
          for (int i = 0; i < 4; ++i)
            for (int32_t b : tables[i]) pools[i]->release(b);
        }
      } release{pools, tables};
      auto dev = [&](const Tensor& t) { return side ? be.upload(t.view(), DType::kF32) : Tensor(); };
      auto view_of = [&](const Tensor& host, const Tensor& d) { return side ? d.view() : host.view(); };
      Tensor kd = dev(kh), vd = dev(vh), lkd = dev(lkh), lvd = dev(lvh), qd = dev(q);
      Tensor bkd = side ? be.upload(bk.view(), be.weight_dtype()) : Tensor();
      Tensor bvd = side ? be.upload(bv.view(), be.weight_dtype()) : Tensor();
      be.store_rows(view_of(kh, kd), (*pk)->layer_view(0, tables[0].data()), slots.data());
      be.store_rows(view_of(vh, vd), (*pv)->layer_view(0, tables[1].data()), slots.data());
      be.store_rows(view_of(lkh, lkd), (*plk)->layer_view(0, tables[2].data()), slots.data());
      be.store_rows(view_of(lvh, lvd), (*plv)->layer_view(0, tables[3].data()), slots.data());
      Tensor out = be.alloc(DType::kF32, {c.n_q, c.heads, c.hd});
      AttentionParams p;
      p.n_heads = c.heads;
      p.n_kv_heads = c.kv_heads;
      p.head_dim = c.hd;
      p.softmax_scale = 1.f / std::sqrt(static_cast<float>(c.hd));
      p.n_q = c.n_q;
      p.q = view_of(q, qd).f32();
      p.q_pos = q_pos.data();
      p.n_ctx = c.n_ctx;
      p.k = (*pk)->layer_view(0, tables[0].data());
      p.v = (*pv)->layer_view(0, tables[1].data());
      const TensorView& bkv = side ? bkd.view() : bk.view();
      const TensorView& bvv = side ? bvd.view() : bv.view();
      if (c.k_lr) p.k_lr = {(*plk)->layer_view(0, tables[2].data()), bkv.data, c.rank, 0.7f, bkv.dtype};
      if (c.v_lr) p.v_lr = {(*plv)->layer_view(0, tables[3].data()), bvv.data, c.rank, 0.7f, bvv.dtype};
      p.inv_freq = inv_freq.data();
      p.out = out.f32();
      be.attention(p);
      outs[side] = host_values(be, out.view());
    }
    const double e = rel_l2(outs[1], outs[0]);
    EXPECT_LE(e, dt == DType::kF32 ? 1e-5 : 1e-2)
        << "hd " << c.hd << " heads " << c.heads << "/" << c.kv_heads << " ctx " << c.n_ctx << " q " << c.n_q
        << " page " << c.page << " rank " << c.rank << (c.k_lr ? " K-LoRA" : "") << (c.v_lr ? " V-LoRA" : "");
    const bool materializes = dt == DType::kBF16 && c.k_lr && (c.hd == 64 || c.hd == 128) &&
                              static_cast<int64_t>(c.n_q) * (c.heads / c.kv_heads) >= (c.n_ctx >= 16384 ? 512 : 1024);
    EXPECT_EQ(gpu->graph_stats().materialized_k - materialized_before, materializes ? 1 : 0)
        << "hd " << c.hd << " ctx " << c.n_ctx << " q " << c.n_q << ": K materialised or not as expected";
    std::printf("  attention %s hd=%d heads=%d/%d ctx=%d q=%d page=%d rank=%d k_lr=%d v_lr=%d rel_l2=%.2e\n",
                dtype_name(dt), c.hd, c.heads, c.kv_heads, c.n_ctx, c.n_q, c.page, c.rank, c.k_lr, c.v_lr, e);
  }
}

// One decode row's attention: its query at q (one token), its last key at n_ctx - 1.
static AttentionParams decode_row(int heads, int kv_heads, int hd, const float* q, const int32_t* q_pos, int n_ctx,
                                  const PagedView& k, const PagedView& v, float* out) {
  AttentionParams p;
  p.n_heads = heads;
  p.n_kv_heads = kv_heads;
  p.head_dim = hd;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(hd));
  p.n_q = 1;
  p.q = q;
  p.q_pos = q_pos;
  p.n_ctx = n_ctx;
  p.k = k;
  p.v = v;
  p.out = out;
  return p;
}

// attention_batch over the decode rows of a pass whose sequences live in different trajectories:
// each sequence's K, V and LRv pools (and with k_term its LRk pool) in a KV arena of its own, each
// its own adapter's B (two sequences share one), awkward context lengths, one sequence without
// adapter terms between others (the run is split there). Against the CPU backend's attention,
// sequence by sequence. In bf16 the CUDA backend must have served the two runs of LoRA rows with
// one launch each (with k_term: v4's in-place K rebuild, each sequence's B_k by b_seq).
static void attention_batch_over_arenas(Backend* cpu, Backend* gpu, DType dt, bool k_term) {
  constexpr int kHd = 128, kHeads = 8, kKv = 2, kPage = 16, kRank = 16;
  const int kPools = k_term ? 4 : 3;  // K, V, LRv, LRk
  const int64_t width = static_cast<int64_t>(kKv) * kHd, row = static_cast<int64_t>(kHeads) * kHd;
  const std::vector<int> ctx = {97, 1, 4097, 300, 17, 65};
  const std::vector<int> b_of = {0, 1, -1, 0, 2, 1};  // which B each sequence's adapter has (-1: none)
  const auto n = static_cast<int64_t>(ctx.size());
  Tensor q = random_host({n, kHeads, kHd}, 21);
  std::vector<Tensor> bs, bks;
  for (int b = 0; b < 3; ++b) bs.push_back(random_host({width, kRank}, 30 + static_cast<uint32_t>(b), 0.3f));
  for (int b = 0; b < 3; ++b) bks.push_back(random_host({width, kRank}, 40 + static_cast<uint32_t>(b), 0.05f));
  std::vector<float> inv_freq(kHd / 2);
  for (int i = 0; i < kHd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.f, -2.f * i / kHd);
  std::vector<float> outs[2];
  Backend* bes[2] = {cpu, gpu};
  const GraphStats before = gpu->graph_stats();
  for (int side = 0; side < 2; ++side) {
    Backend& be = *bes[side];
    Backend* pb = pool_backend(be);
    std::vector<std::unique_ptr<BlockPool>> pools;  // [n, kPools] K, V, LRv, LRk
    std::vector<std::vector<int32_t>> tables;       // [n, kPools] block tables
    std::vector<int32_t> q_pos(static_cast<size_t>(n));
    std::vector<Tensor> keep;  // device copies alive until the attention ran
    for (int64_t s = 0; s < n; ++s) {
      const int c = ctx[static_cast<size_t>(s)];
      const int64_t blocks = (c + kPage - 1) / kPage;
      std::vector<int32_t> slots(static_cast<size_t>(c));
      for (int i = 0; i < c; ++i) slots[static_cast<size_t>(i)] = i;
      q_pos[static_cast<size_t>(s)] = c - 1;
      const int64_t widths[4] = {width, width, kRank, kRank};
      for (int k = 0; k < kPools; ++k) {
        auto pool = BlockPool::create("seq" + std::to_string(s), 1, kPage, widths[k], blocks + 3, pb);
        ASSERT_TRUE(pool.ok()) << pool.error().message;
        std::vector<int32_t> t;
        for (int64_t b = 0; b < blocks + 3; ++b) {
          auto id = (*pool)->allocate();
          ASSERT_TRUE(id.ok());
          t.push_back(*id);
        }
        std::reverse(t.begin(), t.end());  // blocks out of order
        Tensor h = random_host({c, widths[k]}, static_cast<uint32_t>(100 + 4 * s + k));
        Tensor d = side ? be.upload(h.view(), DType::kF32) : Tensor();
        be.store_rows(side ? d.view() : h.view(), (*pool)->layer_view(0, t.data()), slots.data());
        keep.push_back(std::move(d));
        pools.push_back(std::move(*pool));
        tables.push_back(std::move(t));
      }
    }
    Tensor qd = side ? be.upload(q.view(), DType::kF32) : Tensor();
    std::vector<Tensor> bd, bkd;
    for (const Tensor& b : bs) bd.push_back(side ? be.upload(b.view(), be.weight_dtype()) : Tensor());
    for (const Tensor& b : bks) bkd.push_back(side ? be.upload(b.view(), be.weight_dtype()) : Tensor());
    Tensor out = be.alloc(DType::kF32, {n, kHeads, kHd});
    std::vector<AttentionParams> ps;
    for (int64_t s = 0; s < n; ++s) {
      const auto us = static_cast<size_t>(s);
      const size_t pi = static_cast<size_t>(kPools) * us;
      AttentionParams p = decode_row(kHeads, kKv, kHd, (side ? qd : q).f32() + s * row, &q_pos[us], ctx[us],
                                     pools[pi]->layer_view(0, tables[pi].data()),
                                     pools[pi + 1]->layer_view(0, tables[pi + 1].data()), out.f32() + s * row);
      if (b_of[us] >= 0) {
        const auto bi = static_cast<size_t>(b_of[us]);
        const TensorView b = side ? bd[bi].view() : bs[bi].view();
        p.v_lr = {pools[pi + 2]->layer_view(0, tables[pi + 2].data()), b.data, kRank, 0.7f, b.dtype};
        if (k_term) {
          const TensorView bk = side ? bkd[bi].view() : bks[bi].view();
          p.k_lr = {pools[pi + 3]->layer_view(0, tables[pi + 3].data()), bk.data, kRank, 2.0f, bk.dtype};
          p.inv_freq = inv_freq.data();
        }
      }
      ps.push_back(p);
    }
    be.attention_batch(ps);
    outs[side] = host_values(be, out.view());
    for (size_t i = 0; i < pools.size(); ++i)
      for (int32_t b : tables[i]) pools[i]->release(b);
  }
  for (int64_t s = 0; s < n; ++s) {
    const auto from = outs[0].begin() + s * row;
    const std::vector<float> ref(from, from + row), got(outs[1].begin() + s * row, outs[1].begin() + (s + 1) * row);
    EXPECT_LE(rel_l2(got, ref), dt == DType::kF32 ? 1e-5 : 1e-2)
        << "sequence " << s << " ctx " << ctx[static_cast<size_t>(s)] << (k_term ? " (K term)" : "");
  }
  const GraphStats after = gpu->graph_stats();
  std::printf("  attention_batch %s%s: %lld launches served %lld sequences at once\n", dtype_name(dt),
              k_term ? " with K terms" : "",
              static_cast<long long>(after.batched_attention - before.batched_attention),
              static_cast<long long>(after.batched_attention_seqs - before.batched_attention_seqs));
  if (dt == DType::kBF16) {  // [0, 1] and [3, 4, 5]: the row without a V term splits the run
    EXPECT_EQ(after.batched_attention - before.batched_attention, 2);
    EXPECT_EQ(after.batched_attention_seqs - before.batched_attention_seqs, 5);
  }
}

TEST_P(CudaOps, AttentionBatchOverSeveralArenasAndAdaptersMatchesCpu) {
  attention_batch_over_arenas(cpu.get(), gpu.get(), GetParam(), false);
}

// The same batch with k_proj adapters too: K_j = K_base_j + RoPE_j(s_k·LRk_j·B_k^T) per sequence.
TEST_P(CudaOps, AttentionBatchWithKTermsOverSeveralArenasAndAdaptersMatchesCpu) {
  attention_batch_over_arenas(cpu.get(), gpu.get(), GetParam(), true);
}

// attention_batch over decode rows of agents that forked from one trajectory: their block tables
// start with the same blocks (K, V and the V term's LR rows), then each continues in blocks of its
// own. Against the CPU backend's attention, sequence by sequence. In bf16 (LRAGENT_CUDA_SHARED_
// PREFIX_MIN_KEYS=1: any shared page counts) the CUDA backend must serve a run whose rows fit v4's
// agents mode (n x G <= 32) as one shared-prefix attention, a larger one in groups of 8 forks (G =
// 4), and one that shares nothing as a plain batch. Rows that share every key (the same length
// over the same blocks, as an ICaRus step's two rows) must take one launch over them alone.
struct SharedPrefixCase {
  int page = 16;
  int rank = 0;                    // V term rank (0: none)
  int k_rank = 0;                  // K term rank (0: none; needs the V term)
  std::vector<int> shared_pages;   // per sequence: leading pages it takes from the shared blocks
  std::vector<int> own;            // per sequence: keys after them, in blocks of its own
  std::vector<int> b_of;           // per sequence: its B (with a V term)
  int runs = 0, seqs = 0;          // shared-prefix launches expected in bf16, and the rows they serve
  int same_runs = 0;               // same-keys launches expected in bf16 (rows: every sequence's)
  int trim = 0;                    // keys cut from the shared blocks' end (own keys 0: a partial last page)
  int group = 1;                   // > 1: each run of `group` sequences reads its first one's blocks (own
                                   // keys equal), as several sequences' ICaRus rows over their own caches
};

static void attention_batch_shared_prefix(Backend* cpu, Backend* gpu, DType dt, const SharedPrefixCase& c) {
  constexpr int kHd = 128, kHeads = 8, kKv = 2;
  const int64_t width = static_cast<int64_t>(kKv) * kHd, row = static_cast<int64_t>(kHeads) * kHd;
  const auto n = static_cast<int64_t>(c.own.size());
  const int max_shared = *std::max_element(c.shared_pages.begin(), c.shared_pages.end());
  Tensor q = random_host({n, kHeads, kHd}, 61);
  std::vector<Tensor> bs, bks;
  for (int b = 0; b < 3; ++b) bs.push_back(random_host({width, std::max(c.rank, 1)}, 70 + static_cast<uint32_t>(b), 0.3f));
  for (int b = 0; b < 3; ++b) bks.push_back(random_host({width, std::max(c.k_rank, 1)}, 80 + static_cast<uint32_t>(b), 0.05f));
  std::vector<float> inv_freq(kHd / 2);
  for (int i = 0; i < kHd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.f, -2.f * i / kHd);
  std::vector<int> ctx(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s)
    ctx[static_cast<size_t>(s)] = c.shared_pages[static_cast<size_t>(s)] * c.page + c.own[static_cast<size_t>(s)] - c.trim;
  std::vector<float> outs[2];
  Backend* bes[2] = {cpu, gpu};
  const GraphStats before = gpu->graph_stats();
  const int kPools = c.k_rank > 0 ? 4 : c.rank > 0 ? 3 : 2;  // K, V, LRv, LRk
  for (int side = 0; side < 2; ++side) {
    Backend& be = *bes[side];
    Backend* pb = pool_backend(be);
    int64_t blocks = max_shared;
    for (int64_t s = 0; s < n; ++s) blocks += (ctx[static_cast<size_t>(s)] + c.page - 1) / c.page;
    const int64_t widths[4] = {width, width, std::max(c.rank, 1), std::max(c.k_rank, 1)};
    std::vector<std::unique_ptr<BlockPool>> pools;
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n * kPools));  // [n, kPools]
    std::vector<Tensor> keep;
    for (int k = 0; k < kPools; ++k) {
      auto pool = BlockPool::create("pool" + std::to_string(k), 1, c.page, widths[k], blocks, pb);
      ASSERT_TRUE(pool.ok()) << pool.error().message;
      std::vector<int32_t> shared;
      for (int i = 0; i < max_shared; ++i) shared.push_back(*(*pool)->allocate());
      std::reverse(shared.begin(), shared.end());  // blocks out of order
      // The shared blocks' rows, stored once through a table of them alone.
      if (max_shared > 0) {
        const int rows = max_shared * c.page;
        std::vector<int32_t> slots(static_cast<size_t>(rows));
        for (int i = 0; i < rows; ++i) slots[static_cast<size_t>(i)] = i;
        Tensor h = random_host({rows, widths[k]}, static_cast<uint32_t>(200 + k));
        Tensor d = side ? be.upload(h.view(), DType::kF32) : Tensor();
        be.store_rows(side ? d.view() : h.view(), (*pool)->layer_view(0, shared.data()), slots.data());
        keep.push_back(std::move(d));
      }
      for (int64_t s = 0; s < n; ++s) {
        const int sp = c.shared_pages[static_cast<size_t>(s)], cs = ctx[static_cast<size_t>(s)];
        std::vector<int32_t>& t = tables[static_cast<size_t>(s * kPools + k)];
        if (s % c.group != 0) {  // its group's first sequence's blocks, rows already stored
          t = tables[static_cast<size_t>((s - s % c.group) * kPools + k)];
          continue;
        }
        t.assign(shared.begin(), shared.begin() + sp);
        while (static_cast<int64_t>(t.size()) * c.page < cs) t.push_back(*(*pool)->allocate());
        const int own_rows = std::max(cs - sp * c.page, 0);
        std::vector<int32_t> slots(static_cast<size_t>(own_rows));
        for (int i = 0; i < own_rows; ++i) slots[static_cast<size_t>(i)] = sp * c.page + i;
        Tensor h = random_host({own_rows, widths[k]}, static_cast<uint32_t>(300 + 8 * s + k));
        Tensor d = side ? be.upload(h.view(), DType::kF32) : Tensor();
        be.store_rows(side ? d.view() : h.view(), (*pool)->layer_view(0, t.data()), slots.data());
        keep.push_back(std::move(d));
      }
      pools.push_back(std::move(*pool));
    }
    Tensor qd = side ? be.upload(q.view(), DType::kF32) : Tensor();
    std::vector<Tensor> bd, bkd;
    for (const Tensor& b : bs) bd.push_back(side ? be.upload(b.view(), be.weight_dtype()) : Tensor());
    for (const Tensor& b : bks) bkd.push_back(side ? be.upload(b.view(), be.weight_dtype()) : Tensor());
    Tensor out = be.alloc(DType::kF32, {n, kHeads, kHd});
    std::vector<int32_t> q_pos(static_cast<size_t>(n));
    std::vector<AttentionParams> ps;
    for (int64_t s = 0; s < n; ++s) {
      const auto us = static_cast<size_t>(s);
      q_pos[us] = ctx[us] - 1;
      AttentionParams p = decode_row(kHeads, kKv, kHd, (side ? qd : q).f32() + s * row, &q_pos[us], ctx[us],
                                     pools[0]->layer_view(0, tables[us * kPools].data()),
                                     pools[1]->layer_view(0, tables[us * kPools + 1].data()), out.f32() + s * row);
      if (c.rank > 0) {
        const TensorView b = side ? bd[static_cast<size_t>(c.b_of[us])].view() : bs[static_cast<size_t>(c.b_of[us])].view();
        p.v_lr = {pools[2]->layer_view(0, tables[us * kPools + 2].data()), b.data, c.rank, 0.7f, b.dtype};
      }
      if (c.k_rank > 0) {
        const auto bi = static_cast<size_t>(c.b_of[us]);
        const TensorView bk = side ? bkd[bi].view() : bks[bi].view();
        p.k_lr = {pools[3]->layer_view(0, tables[us * kPools + 3].data()), bk.data, c.k_rank, 2.0f, bk.dtype};
        p.inv_freq = inv_freq.data();
      }
      ps.push_back(p);
    }
    be.attention_batch(ps);
    outs[side] = host_values(be, out.view());
  }
  for (int64_t s = 0; s < n; ++s) {
    const auto from = outs[0].begin() + s * row;
    const std::vector<float> ref(from, from + row), got(outs[1].begin() + s * row, outs[1].begin() + (s + 1) * row);
    EXPECT_LE(rel_l2(got, ref), dt == DType::kF32 ? 1e-5 : 1e-2)
        << "sequence " << s << " of " << n << ", ctx " << ctx[static_cast<size_t>(s)] << ", page " << c.page
        << ", rank " << c.rank;
  }
  const GraphStats after = gpu->graph_stats();
  const int64_t runs = after.shared_prefix_attention - before.shared_prefix_attention;
  const int64_t same = after.same_keys_attention - before.same_keys_attention;
  std::printf("  attention_batch %s, %lld forks, page %d, rank %d, K rank %d, ctx %d: %lld shared-prefix launches, "
              "%lld over the same keys\n",
              dtype_name(dt), static_cast<long long>(n), c.page, c.rank, c.k_rank, ctx[0], static_cast<long long>(runs),
              static_cast<long long>(same));
  if (dt == DType::kBF16) {
    EXPECT_EQ(runs, c.runs) << n << " forks, page " << c.page;
    EXPECT_EQ(after.shared_prefix_seqs - before.shared_prefix_seqs, c.seqs);
    EXPECT_EQ(same, c.same_runs) << n << " forks, page " << c.page;
    EXPECT_EQ(after.same_keys_seqs - before.same_keys_seqs, c.same_runs > 0 ? n : 0);
    if (c.runs == 0 && c.same_runs == 0)  // still one launch for the run
      EXPECT_EQ(after.batched_attention - before.batched_attention, 1);
  }
}

TEST_P(CudaOps, AttentionBatchOfForksSharesTheirPrefix) {
  gpu.reset();  // one CUDA backend per process
  setenv("LRAGENT_CUDA_SHARED_PREFIX_MIN_KEYS", "1", 1);
  gpu = cuda_backend(GetParam());  // the threshold is read when the backend is made
  unsetenv("LRAGENT_CUDA_SHARED_PREFIX_MIN_KEYS");
  ASSERT_TRUE(gpu);
  const std::vector<SharedPrefixCase> cases = {
      // Six forks with V terms (three Bs); the fourth leaves the shared blocks 30 pages early, so
      // the pass covers 34 pages; own keys of awkward counts, one a whole page.
      {16, 16, 0, {64, 64, 64, 34, 64, 64}, {1, 17, 97, 5, 16, 33}, {0, 1, 2, 0, 1, 2}, 1, 6},
      // The same with k_proj adapters (K term rank 16: per-agent B_k in the shared pass, the own
      // keys' RoPE positions from the shared keys' end).
      {16, 16, 16, {64, 64, 64, 34, 64, 64}, {1, 17, 97, 5, 16, 33}, {0, 1, 2, 0, 1, 2}, 1, 6},
      // Pages of one token, rank 8, 97 shared keys; and with a K term of rank 4.
      {1, 8, 0, {97, 97, 97}, {1, 3, 17}, {2, 0, 1}, 1, 3},
      {1, 8, 4, {97, 97, 97}, {1, 3, 17}, {2, 0, 1}, 1, 3},
      // Eight forks without adapter terms (full sharing: 32 rows, v4's two row tiles), 4096 shared keys.
      {16, 0, 0, {256, 256, 256, 256, 256, 256, 256, 256}, {1, 2, 3, 4, 5, 6, 7, 4097 - 4096}, {}, 1, 8},
      // A single shared page and rank 4.
      {16, 4, 0, {1, 1}, {1, 16}, {0, 1}, 1, 2},
      // Nine forks at G = 4 are 36 rows, more than one agents-mode sequence takes: one launch of
      // two groups (5 + 4 agents, a sequence each over the same pages); seventeen go as 6 + 6 + 5,
      // with V terms and with K and V terms (each group's agents index the Bs from its first on).
      {16, 16, 0, {8, 8, 8, 8, 8, 8, 8, 8, 8}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 1, 2, 0, 1, 2, 0, 1, 2}, 1, 9},
      {16, 16, 0, std::vector<int>(17, 8), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17},
       {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1}, 1, 17},
      {16, 16, 16, std::vector<int>(17, 8), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17},
       {2, 1, 0, 0, 1, 2, 0, 1, 2, 2, 1, 0, 0, 1, 2, 0, 1}, 1, 17},
      // Ten sequences that share nothing: one plain decode batch.
      {16, 16, 0, std::vector<int>(10, 0), {5, 17, 33, 1, 2, 3, 4, 97, 16, 9}, {0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, 0, 0},
      // Forks at one length (parallel agents decoding in lockstep): the same tables but for their
      // last page, a shared prefix, not the same keys.
      {16, 16, 0, {8, 8, 8}, {5, 5, 5}, {0, 1, 2}, 1, 3},
      // Rows over the very same keys (an ICaRus step's base row and decoder row): one launch, no
      // own keys and no merge. 4097 keys (the last page holds one), two rows, no terms; 1019 keys
      // with V terms; one key; 97 keys on pages of one token with K and V terms; nine rows (two
      // groups) of 17 keys with K and V terms.
      {16, 0, 0, {257, 257}, {0, 0}, {}, 0, 0, 1, 15},
      {16, 16, 0, {64, 64, 64}, {0, 0, 0}, {2, 0, 1}, 0, 0, 1, 5},
      {16, 16, 0, {1, 1}, {0, 0}, {1, 0}, 0, 0, 1, 15},
      {1, 8, 4, {97, 97, 97}, {0, 0, 0}, {2, 0, 1}, 0, 0, 1, 0},
      {16, 16, 16, std::vector<int>(9, 2), std::vector<int>(9, 0), {0, 1, 2, 0, 1, 2, 0, 1, 2}, 0, 0, 1, 15},
      // Several sequences' rows in groups over their own blocks (each sequence's base row and
      // decoder row in ICaRus): one agents-mode launch, a group a sequence. Three pairs at 1, 97
      // and 4097 keys; four triples with V terms (three Bs) at 17, 16, 33 and 1 keys; two pairs
      // with K and V terms on pages of one token at 5 and 97.
      {16, 0, 0, {0, 0, 0, 0, 0, 0}, {1, 1, 97, 97, 4097, 4097}, {}, 0, 0, 1, 0, 2},
      {16, 16, 0, std::vector<int>(12, 0), {17, 17, 17, 16, 16, 16, 33, 33, 33, 1, 1, 1},
       {0, 1, 2, 2, 1, 0, 1, 1, 2, 0, 0, 2}, 0, 0, 1, 0, 3},
      {1, 8, 4, {0, 0, 0, 0}, {5, 5, 97, 97}, {2, 0, 1, 0}, 0, 0, 1, 0, 2},
  };
  for (const SharedPrefixCase& c : cases) attention_batch_shared_prefix(cpu.get(), gpu.get(), GetParam(), c);
}


}  // namespace
}  // namespace lragent
