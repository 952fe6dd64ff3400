// The token-pick reference (backend/sampling_ref.h) against an independent brute force that
// sorts every candidate, on random rows with ties, NaN, +-inf, at awkward vocab sizes up to
// Llama 3's; the pick reproduces the filtered softmax (every u of a fine grid, and a seeded
// Sampler under a chi-square bound); the hand-checked HF tie rules; the CPU backend's
// sample_rows; the Sampler's seeded draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling_ref.h"
#include "engine/sampler.h"

namespace lragent {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Which ids may be picked (the filtered set) and their weights, by sorting: the semantics of
// sampling_ref.h written out the slow, obvious way. Empty when the row is picked greedily.
struct Filtered {
  std::vector<char> kept;    // [vocab]
  std::vector<float> w;      // [vocab] f32 weights (0 where not kept)
};
Filtered brute_filter(const std::vector<float>& l, const RowSampling& p) {
  Filtered f;
  const int64_t vocab = static_cast<int64_t>(l.size());
  std::vector<int32_t> order;  // finite ids, largest logit first (equal logits: id order)
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isfinite(l[static_cast<size_t>(i)])) order.push_back(static_cast<int32_t>(i));
  if (!(p.temperature > 0.f) || order.empty()) return f;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const float m = l[static_cast<size_t>(order[0])];
  f.kept.assign(l.size(), 0);
  f.w.assign(l.size(), 0.f);
  size_t n = order.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    const float kth = l[static_cast<size_t>(order[static_cast<size_t>(p.top_k) - 1])];
    while (n > 0 && l[static_cast<size_t>(order[n - 1])] < kth) --n;  // ties with the k-th stay
  }
  std::vector<float> w(n);  // [n] weights in sorted order
  double total = 0;
  for (size_t j = 0; j < n; ++j) total += w[j] = std::exp((l[static_cast<size_t>(order[j])] - m) / p.temperature);
  if (p.top_p < 1.f) {
    // mass strictly above position j = the prefix up to the first position of j's logit
    size_t keep = 0;
    double before_group = 0, prefix = 0;
    for (size_t j = 0; j < n; ++j) {
      if (j == 0 || l[static_cast<size_t>(order[j])] != l[static_cast<size_t>(order[j - 1])]) before_group = prefix;
      const bool in = before_group < static_cast<double>(p.top_p) * total || l[static_cast<size_t>(order[j])] == m;
      if (!in) break;
      keep = j + 1;
      prefix += w[j];
    }
    n = keep;
  }
  for (size_t j = 0; j < n; ++j) {
    f.kept[static_cast<size_t>(order[j])] = 1;
    f.w[static_cast<size_t>(order[j])] = w[j];
  }
  return f;
}

int32_t brute_pick(const std::vector<float>& l, const RowSampling& p) {
  const Filtered f = brute_filter(l, p);
  if (f.kept.empty()) {  // greedy: first index of the largest non-NaN value
    int32_t best = -1;
    for (size_t i = 0; i < l.size(); ++i)
      if (!std::isnan(l[i]) && (best < 0 || l[i] > l[static_cast<size_t>(best)])) best = static_cast<int32_t>(i);
    return std::max(best, 0);
  }
  std::vector<double> prefix(l.size());  // [vocab] inclusive prefix sums of kept weights, id order
  double run = 0;
  for (size_t i = 0; i < l.size(); ++i) prefix[i] = run += f.kept[i] ? f.w[i] : 0.f;
  const double target = static_cast<double>(p.u) * run;
  for (size_t i = 0; i < l.size(); ++i)
    if (f.kept[i] && f.w[i] > 0.f && prefix[i] > target) return static_cast<int32_t>(i);
  for (size_t i = l.size(); i-- > 0;)
    if (f.kept[i] && f.w[i] > 0.f) return static_cast<int32_t>(i);
  ADD_FAILURE() << "no kept id has a positive weight";
  return -1;
}

enum class RowKind { kNormal, kTies, kSpecials, kAllNaN, kAllNegInf, kOneFinite };

std::vector<float> make_row(int64_t vocab, RowKind kind, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = nd(rng);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1);
  switch (kind) {
    case RowKind::kNormal: break;
    case RowKind::kTies:  // a few levels, and the maximum repeated
      for (float& v : l) v = std::round(v * 1.5f) / 1.5f;
      l[static_cast<size_t>(any(rng))] = *std::max_element(l.begin(), l.end());
      break;
    case RowKind::kSpecials:  // NaN, -inf and +inf are never sampled
      for (int j = 0; j < 1 + static_cast<int>(vocab / 8); ++j) {
        const int64_t i = any(rng);
        l[static_cast<size_t>(i)] = j % 3 == 0 ? std::nanf("") : j % 3 == 1 ? -kInf : kInf;
      }
      break;
    case RowKind::kAllNaN: std::fill(l.begin(), l.end(), std::nanf("")); break;
    case RowKind::kAllNegInf: std::fill(l.begin(), l.end(), -kInf); break;
    case RowKind::kOneFinite: {
      const float keep = l[static_cast<size_t>(any(rng))];
      std::fill(l.begin(), l.end(), -kInf);
      l[static_cast<size_t>(any(rng))] = keep;
      l[static_cast<size_t>(any(rng))] = std::nanf("");
      break;
    }
  }
  return l;
}

TEST(SamplingRef, MatchesBruteForce) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  const float temps[] = {0.f, 0.5f, 1.f, 2.f};
  const float top_ps[] = {1.f, 0.95f, 0.5f, 1e-6f, 0.f};
  int checked = 0, sampled = 0;
  for (int64_t vocab : {1, 17, 97, 4097, 128256}) {
    const int top_ks[] = {0, 1, 3, 50, static_cast<int>(vocab), static_cast<int>(vocab) + 5};
    for (RowKind kind : {RowKind::kNormal, RowKind::kTies, RowKind::kSpecials, RowKind::kAllNaN, RowKind::kAllNegInf,
                         RowKind::kOneFinite}) {
      const std::vector<float> l = make_row(vocab, kind, rng);
      // Every combination at small vocabularies; a random dozen at the large ones (brute force
      // sorts the whole row each time).
      std::vector<RowSampling> ps;
      for (float t : temps)
        for (int k : top_ks)
          for (float p : top_ps) ps.push_back({t, k, p, uni(rng)});
      if (vocab > 97) {
        std::shuffle(ps.begin(), ps.end(), rng);
        ps.resize(12);
      }
      ps.push_back({1.f, 0, 1.f, 0.f});                 // the lowest u
      ps.push_back({1.f, 0, 0.9f, 1.f - 0x1.0p-24f});  // the highest u a Sampler draws
      for (const RowSampling& p : ps) {
        const int32_t want = brute_pick(l, p);
        ASSERT_EQ(sample_row(l.data(), vocab, p), want)
            << "vocab " << vocab << " kind " << static_cast<int>(kind) << " T " << p.temperature << " top_k "
            << p.top_k << " top_p " << p.top_p << " u " << p.u;
        ASSERT_TRUE(want >= 0 && want < vocab);
        if (p.temperature > 0.f && std::isfinite(l[static_cast<size_t>(want)])) ++sampled;
        ++checked;
      }
    }
  }
  EXPECT_GT(sampled, checked / 3) << "most cases must take the sampling path, not the greedy fallback";
}

// Frequencies of the pick: every u of a grid of N reproduces the filtered softmax to one count
// per id (the pick maps [0, 1) onto consecutive intervals of width p_i), and a seeded Sampler's
// draws pass a chi-square bound. NaN, -inf, the dropped ids never come up.
TEST(SamplingRef, PickReproducesTheFilteredSoftmax) {
  const std::vector<float> l = {1.f, 2.5f, 2.5f, std::nanf(""), 0.3f, -kInf, 3.f, -1.f, 2.f, 0.7f, 2.5f, -0.5f};
  const int64_t vocab = static_cast<int64_t>(l.size());
  for (const RowSampling& p : {RowSampling{0.8f, 6, 0.9f, 0.f}, RowSampling{1.f, 0, 1.f, 0.f},
                               RowSampling{2.f, 0, 0.5f, 0.f}, RowSampling{0.5f, 3, 1.f, 0.f}}) {
    // The filtered softmax, straight from its definition (f64 exp over the brute force's kept set).
    const Filtered f = brute_filter(l, p);
    ASSERT_FALSE(f.kept.empty());
    float m = -kInf;
    for (float v : l)
      if (std::isfinite(v)) m = std::max(m, v);
    std::vector<double> prob(l.size(), 0.0);  // [vocab]
    double z = 0;
    for (size_t i = 0; i < l.size(); ++i)
      if (f.kept[i]) z += prob[i] = std::exp((static_cast<double>(l[i]) - m) / p.temperature);
    for (double& v : prob) v /= z;
    int n_kept = 0;
    for (char k : f.kept) n_kept += k;

    const int n = 1 << 16;
    std::vector<int> grid(l.size(), 0);
    for (int j = 0; j < n; ++j) {
      RowSampling q = p;
      q.u = static_cast<float>(j) / n;  // exact in f32
      ++grid[static_cast<size_t>(sample_row(l.data(), vocab, q))];
    }
    for (size_t i = 0; i < l.size(); ++i)
      EXPECT_LE(std::abs(grid[i] - n * prob[i]), 1.0 + 1e-6 * n) << "id " << i << " T " << p.temperature;

    Sampler s({p.temperature, p.top_k, p.top_p, 99});
    const int draws = 200000;
    std::vector<int> seen(l.size(), 0);
    for (int j = 0; j < draws; ++j) ++seen[static_cast<size_t>(s.sample(l.data(), static_cast<int>(vocab)))];
    double chi2 = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!f.kept[i]) {
        EXPECT_EQ(seen[i], 0) << "id " << i << " is filtered out but was drawn";
        continue;
      }
      const double e = draws * prob[i];
      chi2 += (seen[i] - e) * (seen[i] - e) / e;
    }
    // At most 9 degrees of freedom here; chi2(9) exceeds 34 with probability 1e-4 (the seed is
    // fixed, so this is one deterministic draw that a wrong distribution would fail by far).
    EXPECT_LT(chi2, 34.0) << "kept " << n_kept << " T " << p.temperature << " top_k " << p.top_k;
  }
}

// HF's tie rules by hand: top-k keeps every id equal to the k-th largest logit; top-p keeps a
// whole group of equal logits even when part of it would reach top_p; the largest logit(s)
// always stay.
TEST(SamplingRef, TiesAtTheBoundariesAreKept) {
  auto pickable = [](const std::vector<float>& l, RowSampling p) {
    std::vector<int> ids;
    for (int j = 0; j < 4096; ++j) {
      p.u = static_cast<float>(j) / 4096;
      const int id = sample_row(l.data(), static_cast<int64_t>(l.size()), p);
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  // k = 2: the 2nd largest is 2, held by ids 1, 2 and 3.
  EXPECT_EQ(pickable({1.f, 2.f, 2.f, 2.f, 0.f}, {1.f, 2, 1.f, 0.f}), (std::vector<int>{1, 2, 3}));
  // weights {1, 1, e^-1}: one of the two maxima alone (0.42) reaches 0.3, both stay; id 2 has 2.0
  // of 2.37 above it.
  EXPECT_EQ(pickable({2.f, 2.f, 1.f}, {1.f, 0, 0.3f, 0.f}), (std::vector<int>{0, 1}));
  // 0.85 needs the third id: mass above it is 2 / 2.37 = 0.84 < 0.85.
  EXPECT_EQ(pickable({2.f, 2.f, 1.f}, {1.f, 0, 0.85f, 0.f}), (std::vector<int>{0, 1, 2}));
  // top_p 0 keeps the maxima only; top_k 1 with a tied maximum keeps both.
  EXPECT_EQ(pickable({0.f, 5.f, 1.f, 5.f}, {1.f, 0, 0.f, 0.f}), (std::vector<int>{1, 3}));
  EXPECT_EQ(pickable({0.f, 5.f, 1.f, 5.f}, {1.f, 1, 1.f, 0.f}), (std::vector<int>{1, 3}));
  // -0 and +0 are one logit.
  EXPECT_EQ(pickable({-0.f, 0.f, -3.f}, {1.f, 1, 1.f, 0.f}), (std::vector<int>{0, 1}));
  // The pick is the first prefix that strictly exceeds u · W': four weights of 1, W' = 4.
  const std::vector<float> flat = {0.f, 0.f, 0.f, 0.f};
  for (int j = 0; j < 4; ++j) EXPECT_EQ(sample_row(flat.data(), 4, {1.f, 0, 1.f, j / 4.f}), j) << "u = " << j / 4.f;
  // Greedy: the lowest id of the maximum; NaN never; no finite logit: the greedy rule.
  EXPECT_EQ(sample_row(std::vector<float>{1.f, 3.f, 3.f}.data(), 3, {0.f, 0, 1.f, 0.5f}), 1);
  EXPECT_EQ(sample_row(std::vector<float>{std::nanf(""), kInf, -kInf}.data(), 3, {1.f, 0, 1.f, 0.5f}), 1);
  EXPECT_EQ(sample_row(std::vector<float>{std::nanf(""), std::nanf("")}.data(), 2, {1.f, 0, 1.f, 0.5f}), 0);
}

// The CPU backend's sample_rows is the reference row by row (strided rows too).
TEST(SamplingRef, CpuBackendSampleRows) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(5);
  const int64_t rows = 5, vocab = 97, ld = 100;
  std::vector<float> x(static_cast<size_t>(rows * ld), std::nanf(""));  // padding columns are NaN
  std::vector<RowSampling> ps;
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> l = make_row(vocab, r == 2 ? RowKind::kTies : RowKind::kNormal, rng);
    std::copy(l.begin(), l.end(), x.begin() + r * ld);
    ps.push_back({r == 0 ? 0.f : 0.7f, static_cast<int32_t>(r * 3), r == 4 ? 0.8f : 1.f, uni(rng)});
  }
  Tensor t = Tensor::from_f32(x, {rows, ld});
  TensorView v = t.view();
  v.shape = {rows, vocab};
  v.strides = {ld, 1};
  std::vector<int32_t> got(static_cast<size_t>(rows));
  be->sample_rows(v, ps, got.data());
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(got[static_cast<size_t>(r)], sample_row(x.data() + r * ld, vocab, ps[static_cast<size_t>(r)])) << r;
}

// One u per sampled row from the seeded generator: the same seed replays the same picks, another
// seed does not; greedy samplers draw nothing.
TEST(SamplingRef, SamplerDrawsAreSeeded) {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  Sampler a({1.f, 0, 1.f, 42}), b({1.f, 0, 1.f, 42}), c({1.f, 0, 1.f, 43});
  std::vector<int32_t> pa, pb, pc;
  for (int i = 0; i < 200; ++i) {
    const RowSampling ra = a.next_row();
    EXPECT_TRUE(ra.u >= 0.f && ra.u < 1.f);
    EXPECT_EQ(ra.temperature, 1.f);
    pa.push_back(sample_row(l.data(), 64, ra));
    pb.push_back(b.sample(l.data(), 64));
    pc.push_back(c.sample(l.data(), 64));
  }
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pa, pc);
  EXPECT_GT(std::set<int32_t>(pa.begin(), pa.end()).size(), 10u) << "near-uniform weights: many ids drawn";
  Sampler g({0.f, 0, 1.f, 42});
  EXPECT_EQ(g.next_row().u, 0.f);
}

}  // namespace
}  // namespace lragent
