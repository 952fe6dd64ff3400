// The device-side token pick (src/backend/cuda/sampling.cu) against the CPU reference
// (sample_row, backend/sampling_ref.h) for the same u:
//   separated rows   a few "hot" ids carry the mass; every row whose CPU pick is stable under a
//                    1e-5 nudge of u and of top_p (the decision is not at a rounding boundary)
//                    must get the identical id; at most 5% of sampled rows may be that close;
//   ties, near ties  quantised logits, adjacent floats, NaN and +-inf: >= 99% identical ids
//                    (expf may differ from the host's by an ulp; sums are fixed point on the device);
//   split rows       128k rows (several blocks each) over top-k 1..100000 and top-p 0.01..0.999,
//                    boundary ties in every block's chunk, all mass in the last chunk, full ties
//                    (exact), 256 short rows; a row alone and in a batch (other block counts)
//                    picks the same id;
//   recorded passes  the op inside begin_pass/end_pass with CUDA graphs on, a fresh u every
//                    step: the graph must replay (not be re-captured) and pick what the eager
//                    backend and the CPU pick for each step's u (also over split 128k rows);
//   decode           a synthetic model sampling 2 sequences for 120 steps with forward_sample:
//                    graphs on gives the eager tokens (f32 logits are bit-identical there); the
//                    engine's Generator picks the same tokens on the device as from host logits.
// Every test skips (with a message) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "backend/backend.h"
#include "backend/sampling_ref.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "kv/full_cache.h"
#include "model/llama.h"
#include "model/synthetic.h"

namespace lragent {
namespace {

using testing::have_gpu;

#define REQUIRE_GPU()                                                   \
  if (!have_gpu()) {                                                    \
    GTEST_SKIP() << "no CUDA device: CUDA sampling tests skipped";      \
  }

constexpr float kInf = std::numeric_limits<float>::infinity();

std::unique_ptr<Backend> cuda_backend(bool graphs = true) {
  CudaBackendOptions o;
  o.dtype = DType::kF32;
  o.graphs = graphs;
  auto be = make_cuda_backend(o);
  EXPECT_TRUE(be.ok()) << be.error().message;
  return be.ok() ? std::move(*be) : nullptr;
}

// A row where min(vocab, 24) hot ids hold distinct logits in [0, 8] and the rest sit near -20
// (some NaN / -inf / +inf among them), so the picked intervals are wide.
std::vector<float> separated_row(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> nd(-20.f, 1.f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = nd(rng);
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[static_cast<size_t>(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t hot = std::min<int64_t>(vocab, 24);
  std::uniform_real_distribution<float> level(0.f, 8.f);
  for (int64_t j = 0; j < hot; ++j) l[static_cast<size_t>(ids[static_cast<size_t>(j)])] = level(rng);
  for (int64_t j = hot; j < std::min<int64_t>(vocab, hot + 6); ++j)
    l[static_cast<size_t>(ids[static_cast<size_t>(j)])] = j % 3 == 0 ? std::nanf("") : j % 3 == 1 ? -kInf : kInf;
  return l;
}

// Quantised logits (many exact ties), adjacent floats (near ties), and specials.
std::vector<float> tied_row(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 2.f);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = std::round(nd(rng) * 2.f) / 2.f;
  for (int j = 0; j < 1 + static_cast<int>(vocab / 16); ++j) {
    const size_t i = static_cast<size_t>(any(rng));
    l[i] = std::nextafter(l[i], j % 2 ? kInf : -kInf);
  }
  for (int j = 0; j < 3 && vocab > 8; ++j) l[static_cast<size_t>(any(rng))] = j == 0 ? std::nanf("") : j == 1 ? -kInf : kInf;
  return l;
}

RowSampling random_params(int64_t vocab, std::mt19937& rng) {
  const float temps[] = {0.f, 0.7f, 1.f, 1.5f};
  const int top_ks[] = {0, 1, 5, 20, static_cast<int>(vocab) + 3};
  const float top_ps[] = {1.f, 0.9f, 0.5f, 1e-6f};
  std::uniform_int_distribution<int> pick(0, 19);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  return {temps[pick(rng) % 4], top_ks[pick(rng) % 5], top_ps[pick(rng) % 4], uni(rng)};
}

// Whether the CPU pick of this row stays the same when u and top_p move by 1e-5: if so, no
// rounding difference between host and device can change it.
bool stable_pick(const float* l, int64_t vocab, const RowSampling& p) {
  const int32_t want = sample_row(l, vocab, p);
  for (float du : {-1e-5f, 1e-5f}) {
    RowSampling q = p;
    q.u = std::clamp(p.u + du, 0.f, 1.f - 0x1.0p-24f);
    if (sample_row(l, vocab, q) != want) return false;
    if (p.top_p < 1.f) {
      q = p;
      q.top_p = std::max(p.top_p + du, 0.f);
      if (sample_row(l, vocab, q) != want) return false;
    }
  }
  return true;
}

// [rows, vocab] logits on the device with row stride ld (>= vocab; the padding holds NaN, which
// the kernel must never read as a candidate).
struct DeviceRows {
  Tensor t;
  TensorView view;
};
DeviceRows upload_rows(Backend& gpu, const std::vector<std::vector<float>>& rows, int64_t ld) {
  const int64_t n = static_cast<int64_t>(rows.size()), vocab = static_cast<int64_t>(rows[0].size());
  Tensor host = Tensor::empty(DType::kF32, {n, ld});
  std::fill(host.f32(), host.f32() + n * ld, std::nanf(""));
  for (int64_t r = 0; r < n; ++r) std::copy(rows[r].begin(), rows[r].end(), host.f32() + r * ld);
  DeviceRows d;
  d.t = gpu.upload(host.view(), DType::kF32);
  d.view = d.t.view();
  d.view.shape = {n, vocab};
  d.view.strides = {ld, 1};
  return d;
}

// Hand-checked rows whose arithmetic is exact on both sides (weights exp(0) = 1, integer sums):
// the tie rules, the strict "exceeds u · W'" pick, the greedy fallbacks.
TEST(CudaSampling, HandCheckedRowsPickTheSameIds) {
  REQUIRE_GPU();
  auto gpu = cuda_backend();
  ASSERT_TRUE(gpu);
  const float nan = std::nanf("");
  struct Case {
    std::vector<float> l;
    RowSampling p;
    int32_t want;
  };
  const Case cases[] = {
      {{0.f, 0.f, 0.f, 0.f}, {1.f, 0, 1.f, 0.f}, 0},
      {{0.f, 0.f, 0.f, 0.f}, {1.f, 0, 1.f, 0.25f}, 1},  // prefix 1 does not exceed 1
      {{0.f, 0.f, 0.f, 0.f}, {1.f, 0, 1.f, 0.75f}, 3},
      {{1.f, 2.f, 2.f, 2.f, 0.f}, {1.f, 2, 1.f, 0.f}, 1},     // top-k 2 keeps the three 2s
      {{1.f, 2.f, 2.f, 2.f, 0.f}, {1.f, 2, 1.f, 0.99f}, 3},
      {{0.f, 5.f, 1.f, 5.f}, {1.f, 0, 0.f, 0.5f}, 3},         // top_p 0: both maxima
      {{2.f, 2.f, 1.f}, {1.f, 0, 0.3f, 0.75f}, 1},            // the tied group stays whole
      {{2.f, 2.f, 1.f}, {1.f, 0, 0.3f, 0.999f}, 1},           // ... and id 2 is gone
      {{-0.f, 0.f, -3.f}, {1.f, 1, 1.f, 0.5f}, 1},            // -0 and +0 are one logit
      {{nan, 1.f, -kInf, 1.f, kInf}, {0.5f, 0, 1.f, 0.6f}, 3},  // NaN, +-inf never sampled
      {{nan, kInf, -kInf}, {1.f, 0, 1.f, 0.5f}, 1},           // no finite logit: greedy
      {{nan, nan}, {1.f, 0, 1.f, 0.5f}, 0},
      {{1.f, 3.f, 3.f}, {0.f, 0, 1.f, 0.9f}, 1},              // greedy: lowest id of the maximum
      {{7.f}, {1.f, 3, 0.5f, 0.9f}, 0},
  };
  for (const Case& c : cases) {
    const int64_t vocab = static_cast<int64_t>(c.l.size());
    ASSERT_EQ(sample_row(c.l.data(), vocab, c.p), c.want) << "the CPU reference disagrees with the hand value";
    // Next to a sampled row, so the kernel runs even for greedy cases.
    std::vector<float> other(c.l.size(), 0.f);
    const std::vector<RowSampling> ps = {c.p, {1.f, 0, 1.f, 0.f}};
    const DeviceRows d = upload_rows(*gpu, {c.l, other}, vocab);
    std::vector<int32_t> got(2);
    gpu->sample_rows(d.view, ps, got.data());
    EXPECT_EQ(got[0], c.want) << "vocab " << vocab << " T " << c.p.temperature << " top_k " << c.p.top_k << " top_p "
                              << c.p.top_p << " u " << c.p.u;
    EXPECT_EQ(got[1], 0);
  }
}

TEST(CudaSampling, SeparatedRowsMatchCpuExactly) {
  REQUIRE_GPU();
  auto gpu = cuda_backend();
  ASSERT_TRUE(gpu);
  std::mt19937 rng(77);
  int64_t compared = 0, sampled = 0, boundary = 0;
  for (int64_t vocab : {1, 17, 97, 4097, 128256}) {
    for (int64_t n_rows : {1, 3, 8}) {
      for (int round = 0; round < (vocab > 4097 ? 4 : 12); ++round) {
        std::vector<std::vector<float>> rows;
        std::vector<RowSampling> ps;
        for (int64_t r = 0; r < n_rows; ++r) {
          rows.push_back(separated_row(vocab, rng));
          ps.push_back(random_params(vocab, rng));
        }
        if (round == 0 && n_rows == 8) {  // rows the greedy rule takes, and top_p 0
          std::fill(rows[1].begin(), rows[1].end(), std::nanf(""));
          std::fill(rows[2].begin(), rows[2].end(), -kInf);
          ps[1].temperature = ps[2].temperature = 1.f;
          ps[3] = {1.f, 0, 0.f, 0.99f};
        }
        const int64_t ld = vocab == 4097 ? 4100 : vocab;  // one strided case
        const DeviceRows d = upload_rows(*gpu, rows, ld);
        std::vector<int32_t> got(static_cast<size_t>(n_rows));
        gpu->sample_rows(d.view, ps, got.data());
        for (int64_t r = 0; r < n_rows; ++r) {
          const auto& l = rows[static_cast<size_t>(r)];
          const RowSampling& p = ps[static_cast<size_t>(r)];
          const int32_t want = sample_row(l.data(), vocab, p);
          sampled += p.temperature > 0.f;
          if (!stable_pick(l.data(), vocab, p)) {
            ++boundary;
            continue;
          }
          ++compared;
          EXPECT_EQ(got[static_cast<size_t>(r)], want)
              << "vocab " << vocab << " row " << r << " of " << n_rows << ": T " << p.temperature << " top_k "
              << p.top_k << " top_p " << p.top_p << " u " << p.u;
        }
      }
    }
  }
  std::printf("  separated rows: %lld compared (identical ids required), %lld sampled, %lld at a boundary\n",
              static_cast<long long>(compared), static_cast<long long>(sampled), static_cast<long long>(boundary));
  EXPECT_LE(boundary * 20, sampled) << "more than 5% of rows at a boundary: the test compares too little";
}

TEST(CudaSampling, TiesAndNearTiesAgreeOnMostRows) {
  REQUIRE_GPU();
  auto gpu = cuda_backend();
  ASSERT_TRUE(gpu);
  std::mt19937 rng(78);
  int64_t rows_total = 0, same = 0;
  for (int64_t vocab : {17, 97, 4097, 128256}) {
    for (int round = 0; round < (vocab > 4097 ? 12 : 40); ++round) {
      const int64_t n_rows = 8;
      std::vector<std::vector<float>> rows;
      std::vector<RowSampling> ps;
      for (int64_t r = 0; r < n_rows; ++r) {
        rows.push_back(tied_row(vocab, rng));
        ps.push_back(random_params(vocab, rng));
        if (ps.back().temperature == 0.f) ps.back().temperature = 1.f;  // every row samples
      }
      const DeviceRows d = upload_rows(*gpu, rows, vocab);
      std::vector<int32_t> got(static_cast<size_t>(n_rows));
      gpu->sample_rows(d.view, ps, got.data());
      for (int64_t r = 0; r < n_rows; ++r) {
        const int32_t want = sample_row(rows[static_cast<size_t>(r)].data(), vocab, ps[static_cast<size_t>(r)]);
        ++rows_total;
        same += got[static_cast<size_t>(r)] == want;
        ASSERT_TRUE(got[static_cast<size_t>(r)] >= 0 && got[static_cast<size_t>(r)] < vocab);
        ASSERT_TRUE(std::isfinite(rows[static_cast<size_t>(r)][static_cast<size_t>(got[static_cast<size_t>(r)])]))
            << "a non-finite logit was sampled";
      }
    }
  }
  std::printf("  tied rows: %lld of %lld identical ids\n", static_cast<long long>(same),
              static_cast<long long>(rows_total));
  EXPECT_GE(same * 100, rows_total * 99);
}

// ---------------------------------------------------------------- rows split over several blocks
// A 128,256 vocab is split over many blocks per row (fewer when many rows share the GPU), so the
// cases below reach the multi-block steps: the radix selects' shared histograms, the boundary
// ties spread over several blocks' chunks, and the pick's prefix across blocks.

// Device picks against the CPU's: identical ids, except for rows whose CPU pick moves under a
// 1e-5 nudge of u or top_p (a rounding boundary: the device sums in fixed point), of which at
// most max_boundary. Every pick must be a finite logit in range. Returns the boundary count.
int64_t expect_cpu_picks(const std::vector<std::vector<float>>& rows, const std::vector<RowSampling>& ps,
                         const std::vector<int32_t>& got, int64_t max_boundary, const char* what) {
  int64_t boundary = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& l = rows[r];
    const int64_t vocab = static_cast<int64_t>(l.size());
    const RowSampling& p = ps[r];
    EXPECT_TRUE(got[r] >= 0 && got[r] < vocab) << what << " row " << r << ": id " << got[r];
    if (got[r] < 0 || got[r] >= vocab) continue;
    const bool some_finite = std::any_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); });
    if (p.temperature > 0.f && some_finite) {
      EXPECT_TRUE(std::isfinite(l[static_cast<size_t>(got[r])])) << what << " row " << r << ": a non-finite logit";
    }
    const int32_t want = sample_row(l.data(), vocab, p);
    if (got[r] == want) continue;
    if (!stable_pick(l.data(), vocab, p)) {
      ++boundary;
      continue;
    }
    ADD_FAILURE() << what << " row " << r << ": got " << got[r] << ", the CPU picks " << want << " (T " << p.temperature
                  << " top_k " << p.top_k << " top_p " << p.top_p << " u " << p.u << ")";
  }
  EXPECT_LE(boundary, max_boundary) << what << ": too many rows at a rounding boundary";
  return boundary;
}

std::vector<int32_t> device_picks(Backend& gpu, const std::vector<std::vector<float>>& rows,
                                  const std::vector<RowSampling>& ps) {
  const DeviceRows d = upload_rows(gpu, rows, static_cast<int64_t>(rows[0].size()));
  std::vector<int32_t> got(rows.size());
  gpu.sample_rows(d.view, ps, got.data());
  return got;
}

// A 128k row like a model's: most logits around -2, a tail up to ~12, a few NaN / +-inf.
std::vector<float> model_like_row(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> nd(-2.f, 2.5f);
  std::exponential_distribution<float> tail(0.6f);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = nd(rng);
  for (int j = 0; j < 400; ++j) l[static_cast<size_t>(any(rng))] = 4.f + tail(rng);
  l[static_cast<size_t>(any(rng))] = std::nanf("");
  l[static_cast<size_t>(any(rng))] = kInf;
  l[static_cast<size_t>(any(rng))] = -kInf;
  return l;
}

TEST(CudaSampling, SplitRowsMatchCpuOverTopKAndTopP) {
  REQUIRE_GPU();
  auto gpu = cuda_backend();
  ASSERT_TRUE(gpu);
  std::mt19937 rng(80);
  const int64_t vocab = 128256, n_rows = 64;
  const int top_ks[] = {0, 1, 2, 50, 1000, 100000};
  const float top_ps[] = {1.f, 0.01f, 0.5f, 0.9f, 0.999f};
  const float temps[] = {0.7f, 1.f, 1.5f};
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  int64_t boundary = 0;
  for (int batch = 0; batch < 2; ++batch) {  // the 30 (top_k, top_p) pairs over 128 rows, random u
    std::vector<std::vector<float>> rows;
    std::vector<RowSampling> ps;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t c = batch * n_rows + r;
      rows.push_back(model_like_row(vocab, rng));
      ps.push_back({temps[c % 3], top_ks[(c / 5) % 6], top_ps[c % 5], uni(rng)});
    }
    boundary += expect_cpu_picks(rows, ps, device_picks(*gpu, rows, ps), n_rows / 10, "128k batch");
  }
  std::printf("  split rows: %lld of %lld at a rounding boundary\n", static_cast<long long>(boundary),
              static_cast<long long>(2 * n_rows));
}

// Rows built so that the interesting part lands across or at the end of the blocks' chunks.
TEST(CudaSampling, SplitRowsBoundaryTiesAndTails) {
  REQUIRE_GPU();
  auto gpu = cuda_backend();
  ASSERT_TRUE(gpu);
  const int64_t vocab = 128256;
  std::mt19937 rng(81);
  std::normal_distribution<float> nd(-12.f, 1.f);
  std::vector<std::vector<float>> rows;
  std::vector<RowSampling> ps;
  auto add = [&](std::vector<float> l, RowSampling p) {
    rows.push_back(std::move(l));
    ps.push_back(p);
  };
  // The top-k / top-p boundary is a value held by 129 ids, one every 997 ids (so in every
  // block's chunk), above a noise floor, with 10 larger logits at the front.
  std::vector<float> ties(static_cast<size_t>(vocab));
  for (float& v : ties) v = nd(rng);
  for (int64_t i = 0; i < vocab; i += 997) ties[static_cast<size_t>(i)] = 2.f;
  for (int64_t i = 0; i < 10; ++i) ties[static_cast<size_t>(13 + i * 3)] = 4.f + 0.25f * static_cast<float>(i);
  for (float u : {0.f, 0.3f, 0.6f, 0.97f, 0.9999f}) {
    add(ties, {1.f, 20, 1.f, u});    // the k-th largest is 2: all 129 ties stay
    add(ties, {1.f, 11, 1.f, u});    // the 11th largest is the first tie
    add(ties, {1.f, 0, 0.9f, u});    // top-p ends inside the tie group: all of it stays
    add(ties, {0.8f, 140, 0.99f, u});
  }
  // All the mass in the last block's chunk: the rest underflows to weight 0 (kept by top-k
  // 100000 but never picked) or is -inf.
  std::vector<float> tail(static_cast<size_t>(vocab), -300.f);
  for (int64_t i = 0; i < 5000; ++i) tail[static_cast<size_t>(i * 7)] = -kInf;
  for (int64_t i = vocab - 40; i < vocab; ++i) tail[static_cast<size_t>(i)] = static_cast<float>(i % 7) * 0.5f;
  for (float u : {0.f, 0.5f, 0.999f}) {
    add(tail, {1.f, 0, 1.f, u});
    add(tail, {1.f, 100000, 1.f, u});
    add(tail, {1.f, 0, 0.5f, u});
  }
  // Only the very last id is finite; only the first.
  std::vector<float> last_only(static_cast<size_t>(vocab), -kInf), first_only(static_cast<size_t>(vocab), std::nanf(""));
  last_only.back() = 1.f;
  first_only.front() = -3.f;
  add(last_only, {1.f, 5, 0.5f, 0.7f});
  add(first_only, {1.f, 0, 1.f, 0.9f});
  // Full ties: every weight is exactly 1 on both sides, so the pick is exact: floor(u * vocab).
  const std::vector<float> flat(static_cast<size_t>(vocab), 0.25f);
  for (float u : {0.f, 0.5f, 0.75f, 0.999f})
    for (const RowSampling& p : {RowSampling{1.f, 0, 1.f, u}, RowSampling{1.f, 50, 1.f, u}, RowSampling{0.5f, 1, 0.01f, u}})
      add(flat, p);
  const std::vector<int32_t> got = device_picks(*gpu, rows, ps);
  expect_cpu_picks(rows, ps, got, 0, "boundary rows");
  // The same rows one at a time (each split over many more blocks): the same ids, bit for bit.
  for (size_t r = 0; r < rows.size(); r += 3) {
    const std::vector<int32_t> one = device_picks(*gpu, {rows[r]}, {ps[r]});
    EXPECT_EQ(one[0], got[r]) << "row " << r << " alone picks another id than in the batch";
  }
}

// Many short rows (one block each) next to each other: the random mix of the tests above.
TEST(CudaSampling, ManyShortRowsMatchCpu) {
  REQUIRE_GPU();
  auto gpu = cuda_backend();
  ASSERT_TRUE(gpu);
  std::mt19937 rng(82);
  const int64_t vocab = 4097, n_rows = 256;
  std::vector<std::vector<float>> rows;
  std::vector<RowSampling> ps;
  for (int64_t r = 0; r < n_rows; ++r) {
    rows.push_back(r % 2 ? separated_row(vocab, rng) : tied_row(vocab, rng));
    ps.push_back(random_params(vocab, rng));
  }
  const std::vector<int32_t> got = device_picks(*gpu, rows, ps);
  expect_cpu_picks(rows, ps, got, n_rows / 20, "256 rows");
  EXPECT_EQ(device_picks(*gpu, rows, ps), got) << "the same rows and draws must pick the same ids";
}

// Each step's params through sample_rows inside a recorded pass (PassScope, what
// LlamaModel::forward does around a decode step) on a fresh backend, graphs on or off: the ids
// per step ([steps][rows]), and the backend's graph counts in *stats.
std::vector<std::vector<int32_t>> recorded_picks(const std::vector<std::vector<float>>& rows, int64_t vocab,
                                                 const std::vector<std::vector<RowSampling>>& params, bool graphs,
                                                 GraphStats* stats) {
  std::vector<std::vector<int32_t>> picks;
  auto gpu = cuda_backend(graphs);
  if (!gpu) return picks;
  const int64_t n_rows = static_cast<int64_t>(rows.size());
  const DeviceRows d = upload_rows(*gpu, rows, vocab);
  for (const auto& st : params) {
    std::vector<int32_t> got(static_cast<size_t>(n_rows));
    {
      PassScope pass(*gpu, n_rows);
      gpu->sample_rows(d.view, st, got.data());
    }
    picks.push_back(got);
  }
  *stats = gpu->graph_stats();
  return picks;
}

// The op in a recorded pass: with graphs on, each step's u goes up through the pass's argument
// region, so the captured graph replays with fresh draws. Every step must pick what the eager
// backend and the CPU pick for that step's u.
TEST(CudaSampling, RecordedPassesReplayWithFreshDraws) {
  REQUIRE_GPU();
  const int64_t vocab = 4097, n_rows = 4;
  const int steps = 40;
  std::mt19937 rng(79);
  std::vector<std::vector<float>> rows;
  for (int64_t r = 0; r < n_rows; ++r) rows.push_back(separated_row(vocab, rng));
  std::vector<std::vector<RowSampling>> params(steps);  // [steps][rows]
  const RowSampling base[] = {{1.f, 0, 1.f, 0.f}, {0.7f, 20, 1.f, 0.f}, {1.f, 0, 0.9f, 0.f}, {0.f, 0, 1.f, 0.f}};
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  for (auto& st : params)
    for (int64_t r = 0; r < n_rows; ++r) {
      st.push_back(base[r]);
      st.back().u = uni(rng);
    }
  GraphStats gs, es;
  const auto graph = recorded_picks(rows, vocab, params, true, &gs);
  const auto eager = recorded_picks(rows, vocab, params, false, &es);
  ASSERT_EQ(graph.size(), static_cast<size_t>(steps));
  ASSERT_EQ(eager.size(), static_cast<size_t>(steps));
  std::set<int32_t> distinct;
  for (int s = 0; s < steps; ++s)
    for (int64_t r = 0; r < n_rows; ++r) {
      const auto& l = rows[static_cast<size_t>(r)];
      const RowSampling& p = params[static_cast<size_t>(s)][static_cast<size_t>(r)];
      const int32_t g = graph[static_cast<size_t>(s)][static_cast<size_t>(r)];
      EXPECT_EQ(g, eager[static_cast<size_t>(s)][static_cast<size_t>(r)]) << "step " << s << " row " << r;
      if (stable_pick(l.data(), vocab, p)) EXPECT_EQ(g, sample_row(l.data(), vocab, p)) << "step " << s << " row " << r;
      if (r == 0) distinct.insert(g);
    }
  std::printf("  recorded passes: %lld recorded, %lld replayed, %lld captured; row 0 drew %zu distinct ids\n",
              static_cast<long long>(gs.recorded), static_cast<long long>(gs.replayed),
              static_cast<long long>(gs.captured), distinct.size());
  EXPECT_EQ(es.recorded, 0);
  EXPECT_GE(gs.recorded, steps);
  EXPECT_GE(gs.replayed, steps - 2) << "one eager pass, one capture, then replays: u must not enter the signature";
  EXPECT_GE(distinct.size(), 4u) << "fresh draws must reach the replayed graph";
}

// Recorded passes over split rows: the multi-block steps (their counters and histograms live in
// the pass's scratch, which the kernels initialise) replay with fresh draws and pick the eager ids.
TEST(CudaSampling, SplitRowsReplayInGraphs) {
  REQUIRE_GPU();
  const int64_t vocab = 128256, n_rows = 2;
  const int steps = 10;
  std::mt19937 rng(83);
  std::vector<std::vector<float>> rows;
  for (int64_t r = 0; r < n_rows; ++r) rows.push_back(model_like_row(vocab, rng));
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::vector<std::vector<RowSampling>> params(steps);  // [steps][rows]
  for (auto& st : params) st = {{1.f, 1000, 0.95f, uni(rng)}, {0.8f, 0, 0.9f, uni(rng)}};
  GraphStats gs, es;
  const auto graph = recorded_picks(rows, vocab, params, true, &gs);
  const auto eager = recorded_picks(rows, vocab, params, false, &es);
  ASSERT_EQ(graph.size(), static_cast<size_t>(steps));
  ASSERT_EQ(eager.size(), static_cast<size_t>(steps));
  EXPECT_EQ(graph, eager);
  for (int s = 0; s < steps; ++s) expect_cpu_picks(rows, params[static_cast<size_t>(s)], graph[static_cast<size_t>(s)], 1, "replayed step");
  EXPECT_GE(gs.replayed, steps - 2);
}

// ---------------------------------------------------------------- the model and the engine

SyntheticSpec spec() {
  SyntheticSpec s;  // the shape of graphs_cuda_test.cpp: head_dim 128, the tuned kernels' shape
  s.hidden = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.layers = 2;
  s.intermediate = 1024;
  return s;
}

// Prefill two prompts, then `steps` decode steps of both with forward_sample (u from seeded
// Samplers): every sampled token, [steps][2].
std::vector<std::vector<int32_t>> sampled_decode(bool graphs, uint64_t seed, int steps, GraphStats* stats) {
  std::vector<std::vector<int32_t>> out;
  auto gpu = cuda_backend(graphs);
  if (!gpu) return out;
  auto model_r = make_synthetic_model(spec(), *gpu);
  EXPECT_TRUE(model_r.ok()) << model_r.error().message;
  if (!model_r.ok()) return out;
  LlamaModel& model = **model_r;
  const int page = 16, prompt = 60;
  auto pools = KvPools::create(model.config(), page, KvPools::blocks_for(2, prompt + steps + 16, page), "sampling-test",
                               gpu.get());
  EXPECT_TRUE(pools.ok());
  if (!pools.ok()) return out;
  std::vector<std::unique_ptr<FullKvCache>> kv;
  std::vector<Sampler> samplers = {Sampler({1.f, 40, 0.9f, seed}), Sampler({0.7f, 0, 0.8f, seed + 1})};
  std::vector<int32_t> next(2);
  std::vector<int64_t> len(2);
  for (int s = 0; s < 2; ++s) {
    kv.push_back(std::make_unique<FullKvCache>(pools->kv.get()));
    const int n = prompt - 23 * s;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = 3 + (i * 29 + s * 5) % 250;
    const std::vector<RowSampling> row = {samplers[static_cast<size_t>(s)].next_row()};
    auto picked = model.forward_sample({SeqInput{ids.data(), n, 0, kv.back().get(), nullptr, false}}, row);
    EXPECT_TRUE(picked.ok()) << picked.error().message;
    if (!picked.ok()) return out;
    next[static_cast<size_t>(s)] = picked->front();
    len[static_cast<size_t>(s)] = n;
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<SeqInput> batch;
    std::vector<RowSampling> rows;
    for (size_t s = 0; s < 2; ++s) {
      batch.push_back({&next[s], 1, len[s], kv[s].get(), nullptr, false});
      rows.push_back(samplers[s].next_row());
    }
    auto picked = model.forward_sample(batch, rows);
    EXPECT_TRUE(picked.ok()) << picked.error().message;
    if (!picked.ok()) return out;
    out.push_back(*picked);
    for (size_t s = 0; s < 2; ++s) {
      next[s] = (*picked)[s];
      ++len[s];
    }
  }
  *stats = gpu->graph_stats();
  return out;
}

TEST(CudaSampling, DecodeWithGraphsSamplesTheEagerTokens) {
  REQUIRE_GPU();
  const int steps = 120;
  GraphStats gs, es, os;
  const auto graph = sampled_decode(true, 5, steps, &gs);
  const auto eager = sampled_decode(false, 5, steps, &es);
  const auto other = sampled_decode(true, 6, steps, &os);
  ASSERT_EQ(graph.size(), static_cast<size_t>(steps));
  ASSERT_EQ(eager.size(), static_cast<size_t>(steps));
  ASSERT_EQ(other.size(), static_cast<size_t>(steps));
  int first_diff = -1;
  for (int s = 0; s < steps && first_diff < 0; ++s)
    if (graph[static_cast<size_t>(s)] != eager[static_cast<size_t>(s)]) first_diff = s;
  std::printf("  sampled decode: %d steps x 2 seqs, graphs %lld replayed of %lld; first graph/eager difference at "
              "step %d (-1: none)\n",
              steps, static_cast<long long>(gs.replayed), static_cast<long long>(gs.recorded), first_diff);
  EXPECT_EQ(first_diff, -1) << "f32 graph replays give bit-identical logits, so the same draws must pick the same ids";
  EXPECT_GE(gs.replayed, steps - 16);
  EXPECT_NE(other, graph) << "another seed must sample another text";
  // Every pick on the device, the one-row prefill picks included (a fresh scratch slot once
  // handed out a null buffer for <= 4 bytes, and those picks went to the host unnoticed).
  EXPECT_EQ(gs.host_picks, 0);
  EXPECT_EQ(es.host_picks, 0);
}

// The Generator on the GPU: sampled requests pick on the device, except the step whose logits a
// request keeps (keep_first_logits), which picks from host logits with the CPU reference. Same
// logits, same draws: the same tokens (a flip needs a draw within ~1e-7 of an interval boundary).
TEST(CudaSampling, GeneratorDevicePicksMatchHostPicks) {
  REQUIRE_GPU();
  auto run = [](bool keep_logits) {
    std::vector<std::vector<int32_t>> out;
    auto gpu = cuda_backend();
    if (!gpu) return out;
    auto model = make_synthetic_model(spec(), *gpu);
    EXPECT_TRUE(model.ok());
    if (!model.ok()) return out;
    std::vector<GenerateRequest> reqs(3);
    for (size_t i = 0; i < reqs.size(); ++i) {
      for (int t = 0; t < 20 + 9 * static_cast<int>(i); ++t) reqs[i].prompt.push_back(3 + (t * 13 + static_cast<int>(i)) % 250);
      reqs[i].max_tokens = 24;
      reqs[i].sampling = {0.8f, i == 0 ? 0 : 30, i == 1 ? 1.f : 0.9f, 100 + i};
      reqs[i].keep_first_logits = keep_logits;
    }
    Generator gen(**model, EngineOptions{});
    auto res = gen.run(reqs);
    EXPECT_TRUE(res.ok()) << res.error().message;
    if (res.ok())
      for (const auto& r : *res) out.push_back(r.output);
    return out;
  };
  const auto device = run(false);
  const auto host_first = run(true);
  ASSERT_EQ(device.size(), 3u);
  EXPECT_EQ(device, host_first);
  for (const auto& o : device) EXPECT_EQ(o.size(), 24u);
}

// Decode lookahead on the GPU (each step launched before the previous step's ids come back, its
// token read from the previous pass's picks on the device, in recorded graphs): the same tokens
// as the step-by-step loop in f32, for greedy and sampled requests, with stop ids met mid-run
// (speculative rows dropped) and prompts of different lengths; graphs still replay.
TEST(CudaSampling, GeneratorDecodeLookaheadMatchesStepByStep) {
  REQUIRE_GPU();
  auto run = [](bool lookahead, const std::vector<int32_t>& stops, GraphStats* stats) {
    std::vector<GenerateResult> out;
    auto gpu = cuda_backend();
    if (!gpu) return out;
    auto model = make_synthetic_model(spec(), *gpu);
    EXPECT_TRUE(model.ok());
    if (!model.ok()) return out;
    std::vector<GenerateRequest> reqs(4);
    for (size_t i = 0; i < reqs.size(); ++i) {
      for (int t = 0; t < 5 + 11 * static_cast<int>(i); ++t) reqs[i].prompt.push_back(3 + (t * 13 + static_cast<int>(i)) % 250);
      reqs[i].max_tokens = 20 + 3 * static_cast<int>(i);
      reqs[i].sampling = {i == 3 ? 0.f : 0.8f, i == 0 ? 0 : 30, 0.9f, 300 + i};
      if (!stops.empty()) reqs[i].stop_ids = {stops[i]};
    }
    EngineOptions opts;
    opts.decode_lookahead = lookahead;
    Generator gen(**model, opts);
    auto res = gen.run(reqs);
    EXPECT_TRUE(res.ok()) << res.error().message;
    if (res.ok()) out = *res;
    if (stats) *stats = gpu->graph_stats();
    return out;
  };
  GraphStats st;
  const auto plain = run(false, {}, nullptr);
  const auto ahead = run(true, {}, &st);
  ASSERT_EQ(plain.size(), 4u);
  ASSERT_EQ(ahead.size(), 4u);
  std::vector<int32_t> stops;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ahead[i].output, plain[i].output) << "request " << i;
    stops.push_back(plain[i].output[3 + i]);  // each stops a few tokens in
  }
  EXPECT_GE(st.replayed, st.recorded / 2) << "lookahead passes replay their graphs";
  const auto plain_stop = run(false, stops, nullptr), ahead_stop = run(true, stops, nullptr);
  ASSERT_EQ(ahead_stop.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ahead_stop[i].output, plain_stop[i].output) << "request " << i << " with a stop id";
    EXPECT_EQ(ahead_stop[i].finish_reason, "stop") << i;
  }
  std::printf("  lookahead: %lld recorded passes, %lld replayed\n", static_cast<long long>(st.recorded),
              static_cast<long long>(st.replayed));
}

}  // namespace
}  // namespace lragent
