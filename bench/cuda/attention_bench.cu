// Attention kernel benchmark at Llama-3.1-8B attention shapes (32 q heads, 8 kv heads,
// head_dim 128, bf16, page size 16, shuffled block tables):
//   prefill: a causal chunk of 1024 queries at the end of 8k / 32k / 64k contexts:
//            plain, Flash-LoRA (r=16, V side), Flash-LoRA + K residual (r=16),
//            materialise-then-attend (V_full = V + s·LRv·B^T written to HBM, then plain)
//   decode:  8 sequences x 32k private paged caches, one launch (split-K): plain, FLA, FLA+K;
//            and one sequence over 4k (a batch-1 decode step's attention per layer): plain, FLA
//   agents:  8 agents x one query over ONE shared 32k base (+LR) cache, own B_k/B_v each,
//            vs the 8 private-cache decodes above
// Timing: CUDA events per repetition, warm-up, median of >= 20 repetitions (prefill: the
// default kernel's variants and materialise-then-attend interleaved), inputs rotated
// (disjoint page sets / query buffers) where one set would fit in L2. Also a D2D copy ceiling.
// Writes JSON to --out (default attention_bench.json) and prints a table. --quick: shorter
// contexts; --decode-only: no prefill section (for A/B runs of decode variants); --kterm-chunks:
// only the K term at chunk sizes 8..1024, fused against materialised (kchunk rows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention.cuh"

namespace lc = lragent::cuda;
using lc::bf16;

#define CK(x)                                                                                               \
  do {                                                                                                      \
    cudaError_t e_ = (x);                                                                                   \
    if (e_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

namespace {

constexpr int kHeads = 32, kKv = 8, kD = 128, kPage = 16, kWidth = kKv * kD, kRank = 16;

__global__ void fill_kernel(bf16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (static_cast<uint32_t>(i >> 32) + seed) * 0x9e3779b9u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    const float u = (static_cast<float>(h & 0xffffff) + 0.5f) / 16777216.f;  // (0,1), never 0
    p[i] = __float2bfloat16((u - 0.5f) * 3.4641f * scale);                   // unit variance
  }
}
void fill(bf16* p, size_t n, uint32_t seed, float scale = 1.f) {
  fill_kernel<<<1024, 256>>>(p, n, seed, scale);
  CK(cudaGetLastError());
}

template <typename T>
T* dalloc(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}
template <typename T>
T* dupload(const std::vector<T>& h) {
  T* p = dalloc<T>(h.size());
  CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Stats {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int reps = 0;
};

// Times fns[v](launch) per repetition with events, the variants interleaved (round i runs
// variant 0, 1, ... once each), so that the ones whose ratio is reported see the same clocks and
// temperature (timed one after the other, a ratio moved by up to 0.1 between runs); `launch`
// counts every call, so rotating inputs by it keeps consecutive launches on different data.
// Median per variant.
std::vector<Stats> time_interleaved(const std::vector<std::function<void(int)>>& fns, int warmup, int reps) {
  const size_t nv = fns.size();
  int launch = 0;
  for (int i = 0; i < warmup; ++i)
    for (const auto& fn : fns) fn(launch++);
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * nv * static_cast<size_t>(reps));  // [rep][variant][start, end]
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i)
    for (size_t v = 0; v < nv; ++v) {
      CK(cudaEventRecord(ev[2 * (i * nv + v)]));
      fns[v](launch++);
      CK(cudaEventRecord(ev[2 * (i * nv + v) + 1]));
    }
  CK(cudaDeviceSynchronize());
  std::vector<Stats> out(nv);
  for (size_t v = 0; v < nv; ++v) {
    std::vector<double> ms(static_cast<size_t>(reps));
    for (int i = 0; i < reps; ++i) {
      float t = 0;
      CK(cudaEventElapsedTime(&t, ev[2 * (i * nv + v)], ev[2 * (i * nv + v) + 1]));
      ms[i] = t;
    }
    std::sort(ms.begin(), ms.end());
    out[v].reps = reps;
    out[v].median_ms = ms[ms.size() / 2];
    out[v].min_ms = ms.front();
    out[v].max_ms = ms.back();
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  return out;
}

// Times fn(rep) per repetition with events; median.
template <typename F>
Stats time_it(F&& fn, int warmup, int reps) {
  return time_interleaved({std::function<void(int)>(std::forward<F>(fn))}, warmup, reps)[0];
}

struct Result {
  std::string group, name;
  int ctx = 0, n_q = 0, seqs = 0, splits = 1;
  Stats t;
  double flops = 0, bytes = 0;
  std::string note;
};

// The shared paged pools: K, V, V_full [blocks, 16, 1024], LRk, LRv [blocks, 16, 16]; K_full and
// V's dense copy [65536, 1024] (materialise_k's outputs, read through the identity table dense_table).
struct Pools {
  int n_blocks = 0;
  bf16 *k = nullptr, *v = nullptr, *vfull = nullptr, *lrk = nullptr, *lrv = nullptr;
  bf16 *kfull = nullptr, *vdense = nullptr;
  int32_t* dense_table = nullptr;  // [65536 / 16] 0, 1, 2, ...
  bf16 *bk = nullptr, *bv = nullptr;  // [8 adapters, 1024, 16]
  float* inv_freq = nullptr;
  unsigned int* counters = nullptr;  // [kCounters] v4 decode's split-K counters, zero at rest
};
constexpr int64_t kCounters = 4096;

lc::DevPagedView view(const bf16* data, const int32_t* table, int64_t table_stride, int64_t row) {
  lc::DevPagedView v;
  v.data = data;
  v.table = table;
  v.table_stride = table_stride;
  v.page_size = kPage;
  v.row_stride = row;
  v.block_stride = kPage * row;
  return v;
}

// Attention params for n_seqs sequences of ctx tokens with n_q queries each.
lc::AttnParams make_params(const Pools& P, const int32_t* table, int64_t table_stride, const int32_t* q_start,
                           const int32_t* ctx_len, int n_seqs, int n_q, int ctx, const bf16* q, bf16* out, bool vlr,
                           bool klr, void* ws, size_t ws_bytes) {
  lc::AttnParams p;
  p.n_heads = kHeads;
  p.n_kv_heads = kKv;
  p.head_dim = kD;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(kD));
  p.n_seqs = n_seqs;
  p.q_start = q_start;
  p.ctx_len = ctx_len;
  p.max_q = n_q;
  p.max_ctx = ctx;
  p.q = q;
  p.k = view(P.k, table, table_stride, kWidth);
  p.v = view(P.v, table, table_stride, kWidth);
  if (klr) {
    p.k_lr.lr = view(P.lrk, table, table_stride, kRank);
    p.k_lr.b = P.bk;
    p.k_lr.b_agent_stride = static_cast<int64_t>(kWidth) * kRank;
    p.k_lr.rank = kRank;
    p.k_lr.scale = 2.f;
    p.inv_freq = P.inv_freq;
  }
  if (vlr) {
    p.v_lr.lr = view(P.lrv, table, table_stride, kRank);
    p.v_lr.b = P.bv;
    p.v_lr.b_agent_stride = static_cast<int64_t>(kWidth) * kRank;
    p.v_lr.rank = kRank;
    p.v_lr.scale = 2.f;
  }
  p.out = out;
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;
  p.split_counters = P.counters;
  p.split_counters_capacity = kCounters;
  return p;
}

double rel_l2(const bf16* a_dev, const bf16* b_dev, size_t n) {
  std::vector<uint16_t> a(n), b(n);
  CK(cudaMemcpy(a.data(), a_dev, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), b_dev, n * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t ua = static_cast<uint32_t>(a[i]) << 16, ub = static_cast<uint32_t>(b[i]) << 16;
    float fa, fb;
    std::memcpy(&fa, &ua, 4);
    std::memcpy(&fb, &ub, 4);
    if (!std::isfinite(fa) || !std::isfinite(fb)) return INFINITY;
    num += (double(fa) - fb) * (double(fa) - fb);
    den += double(fb) * fb;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "attention_bench.json";
  int reps = 30;
  bool quick = false;
  bool decode_only = false;  // skip both prefill sections (A/B runs of decode variants)
  bool kterm_chunks = false;  // only the K term's chunk-size sweep (kchunk rows)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out_path = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(20, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--decode-only"))
      decode_only = true;
    else if (!std::strcmp(argv[i], "--kterm-chunks"))
      kterm_chunks = true;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const int warmup = 3;

  // ---- pools: 8 x 32k tokens (covers one 64k context too) ----
  const int kSeqs = 8, kDecodeCtx = 32768;
  Pools P;
  P.n_blocks = kSeqs * kDecodeCtx / kPage;  // 16384 blocks = 262144 tokens
  const size_t slots = static_cast<size_t>(P.n_blocks) * kPage;
  P.k = dalloc<bf16>(slots * kWidth);
  P.v = dalloc<bf16>(slots * kWidth);
  P.vfull = dalloc<bf16>(slots * kWidth);
  constexpr int kMaxDense = 65536;
  P.kfull = dalloc<bf16>(static_cast<size_t>(kMaxDense) * kWidth);
  P.vdense = dalloc<bf16>(static_cast<size_t>(kMaxDense) * kWidth);
  {
    std::vector<int32_t> id(kMaxDense / kPage);
    std::iota(id.begin(), id.end(), 0);
    P.dense_table = dupload(id);
  }
  P.lrk = dalloc<bf16>(slots * kRank);
  P.lrv = dalloc<bf16>(slots * kRank);
  P.bk = dalloc<bf16>(static_cast<size_t>(kSeqs) * kWidth * kRank);
  P.bv = dalloc<bf16>(static_cast<size_t>(kSeqs) * kWidth * kRank);
  fill(P.k, slots * kWidth, 1);
  fill(P.v, slots * kWidth, 2);
  fill(P.lrk, slots * kRank, 3);
  fill(P.lrv, slots * kRank, 4);
  fill(P.bk, static_cast<size_t>(kSeqs) * kWidth * kRank, 5, 0.05f);
  fill(P.bv, static_cast<size_t>(kSeqs) * kWidth * kRank, 6, 0.05f);
  {
    std::vector<float> f(kD / 2);
    for (int i = 0; i < kD / 2; ++i) f[i] = std::pow(500000.f, -2.f * i / kD);
    P.inv_freq = dupload(f);
  }
  P.counters = dalloc<unsigned int>(kCounters);
  CK(cudaMemset(P.counters, 0, kCounters * sizeof(unsigned int)));
  // A shuffled permutation of all blocks; tables are slices of it (disjoint page sets).
  std::vector<int32_t> perm(static_cast<size_t>(P.n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
  int32_t* d_perm = dupload(perm);

  const size_t ws_bytes = 64u << 20;
  void* ws = dalloc<char>(ws_bytes);
  const int kQSets = 4, kMaxQ = 1024;
  bf16* qbuf = dalloc<bf16>(static_cast<size_t>(kQSets) * kMaxQ * kHeads * kD);
  fill(qbuf, static_cast<size_t>(kQSets) * kMaxQ * kHeads * kD, 7);
  bf16* out = dalloc<bf16>(static_cast<size_t>(kMaxQ) * kHeads * kD);
  bf16* out2 = dalloc<bf16>(static_cast<size_t>(kMaxQ) * kHeads * kD);
  CK(cudaDeviceSynchronize());

  std::vector<Result> results;
  // Full-size consistency check: the default kernel vs the v0 oracle on the same inputs
  // (out vs out2, the first n output elements).
  auto check_vs_v0 = [&](lc::AttnParams p, const std::string& name, int ctx, size_t n) {
    CK(lc::attention(p));
    p.out = out2;
    CK(lc::attention(p, lc::AttnKernel::kV0Naive));
    CK(cudaDeviceSynchronize());
    Result c;
    c.group = "check";
    c.name = name;
    c.ctx = ctx;
    c.note = std::to_string(rel_l2(out, out2, n));
    std::printf("check    %s rel_l2=%s\n", c.name.c_str(), c.note.c_str());
    results.push_back(c);
  };
  auto report = [&](const Result& r) {
    const double tflops = r.flops / (r.t.median_ms * 1e-3) / 1e12;
    const double gbs = r.bytes / (r.t.median_ms * 1e-3) / 1e9;
    std::printf("%-8s %-34s ctx=%-6d nq=%-5d splits=%-3d %9.3f ms  %7.1f TFLOP/s  %7.1f GB/s %s\n", r.group.c_str(),
                r.name.c_str(), r.ctx, r.n_q, r.splits, r.t.median_ms, tflops, gbs, r.note.c_str());
    std::fflush(stdout);
    results.push_back(r);
  };

  // ---- copy ceiling ----
  {
    const size_t bytes = 1ull << 30;
    char *a = dalloc<char>(bytes), *b = dalloc<char>(bytes);
    CK(cudaMemset(a, 1, bytes));
    Result r;
    r.group = "ceiling";
    r.name = "d2d_copy_1GiB";
    r.t = time_it([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, warmup, reps);
    r.bytes = 2.0 * bytes;
    report(r);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  // ---- JSON (the end of every run) ----
  auto write_json = [&]() -> int {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"shape\": {\"heads\": %d, \"kv_heads\": %d, "
                 "\"head_dim\": %d, \"page_size\": %d, \"rank\": %d},\n  \"reps\": %d,\n  \"results\": [\n",
                 json_escape(prop.name).c_str(), prop.multiProcessorCount, kHeads, kKv, kD, kPage, kRank, reps);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const double s = r.t.median_ms * 1e-3;
      std::fprintf(f,
                   "    {\"group\": \"%s\", \"name\": \"%s\", \"ctx\": %d, \"n_q\": %d, \"seqs\": %d, \"splits\": %d, "
                   "\"median_ms\": %.6f, \"min_ms\": %.6f, \"max_ms\": %.6f, \"flops\": %.6e, \"bytes\": %.6e, "
                   "\"tflops\": %.3f, \"gbps\": %.2f, \"note\": \"%s\"}%s\n",
                   r.group.c_str(), r.name.c_str(), r.ctx, r.n_q, r.seqs, r.splits, r.t.median_ms, r.t.min_ms,
                   r.t.max_ms, r.flops, r.bytes, s > 0 ? r.flops / s / 1e12 : 0.0, s > 0 ? r.bytes / s / 1e9 : 0.0,
                   json_escape(r.note).c_str(), i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrote %s\n", out_path.c_str());
    return 0;
  };

  // The K side materialised (what the CUDA backend runs for a prefill chunk from
  // materialize_k_min_rows query rows with a K term): K_full = K_base + RoPE(s·LRk·B_k^T) and V's
  // dense copy under one identity table, then the Flash-LoRA V kernel with no K term over them.
  auto dense_kv = [&](lc::AttnParams p) {
    p.k = view(P.kfull, P.dense_table, 0, kWidth);
    p.v = view(P.vdense, P.dense_table, 0, kWidth);
    p.k_lr = lc::DevLowRank{};
    return p;
  };
  auto materialise_k = [&](const lc::AttnParams& p) {
    CK(lc::materialize_k(p, P.kfull, P.vdense));
    CK(lc::attention(dense_kv(p)));
  };

  // ---- --kterm-chunks: the K term at prefill chunk sizes, fused (the default kernel rebuilds K
  // tile by tile) against materialised (K_full and V's dense copy, then the Flash-LoRA V kernel:
  // what the CUDA backend runs from materialize_k_min_rows query rows), interleaved, at 8k
  // and 32k contexts: where the two cross places that threshold. Only this section runs. ----
  if (kterm_chunks) {
    for (int ctx : {8192, 32768}) {
      const int pages = ctx / kPage;
      const int n_sets = std::max(1, std::min(4, P.n_blocks / pages));
      int32_t* d_ctx = dupload(std::vector<int32_t>{ctx});
      for (int nq : {8, 16, 32, 64, 128, 256, 512, 1024}) {
        int32_t* d_qs = dupload(std::vector<int32_t>{0, nq});
        auto params = [&](int rep) {
          return make_params(P, d_perm + static_cast<size_t>(rep % n_sets) * pages, 0, d_qs, d_ctx, 1, nq, ctx,
                             qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, out, true, true, ws,
                             ws_bytes);
        };
        const std::vector<std::function<void(int)>> fns = {[&](int rep) { CK(lc::attention(params(rep))); },
                                                           [&](int rep) { materialise_k(params(rep)); }};
        const std::vector<Stats> st = time_interleaved(fns, warmup, reps);
        double keys = 0;
        for (int i = 0; i < nq; ++i) keys += ctx - nq + i + 1;
        for (int v = 0; v < 2; ++v) {
          Result r;
          r.group = "kchunk";
          r.name = v == 0 ? "fused_kv_r16" : "materialise_k_kv_r16";
          r.ctx = ctx;
          r.n_q = nq;
          r.seqs = 1;
          r.splits = v == 0 ? lc::attention_num_splits(params(0)) : 1;
          r.t = st[static_cast<size_t>(v)];
          r.flops = 4.0 * kD * kHeads * keys;
          r.bytes = 2.0 * ctx * kWidth * 2 + 2.0 * ctx * kRank * 2 + (v ? 4.0 * ctx * kWidth * 2 : 0);
          r.note = "rows " + std::to_string(nq * (kHeads / kKv));
          report(r);
        }
        CK(cudaFree(d_qs));
      }
      CK(cudaFree(d_ctx));
    }
    return write_json();
  }

  // ---- prefill: 1024 queries at the end of 8k / 32k / 64k ----
  const int n_q = 1024;
  std::vector<int> prefill_ctx = quick ? std::vector<int>{8192} : std::vector<int>{8192, 32768, 65536};
  if (decode_only) prefill_ctx.clear();
  int32_t* d_qs1 = dupload(std::vector<int32_t>{0, n_q});
  for (int ctx : prefill_ctx) {
    const int pages = ctx / kPage;
    const int n_sets = std::max(1, std::min(4, P.n_blocks / pages));  // disjoint page sets to rotate
    int32_t* d_ctx = dupload(std::vector<int32_t>{ctx});
    double keys = 0;
    for (int i = 0; i < n_q; ++i) keys += ctx - n_q + i + 1;
    const double flops = 4.0 * kD * kHeads * keys;
    auto params = [&](int rep, bool vlr, bool klr) {
      const int set = rep % n_sets;
      return make_params(P, d_perm + static_cast<size_t>(set) * pages, 0, d_qs1, d_ctx, 1, n_q, ctx,
                         qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, out, vlr, klr, ws, ws_bytes);
    };
    const double kv_bytes = 2.0 * ctx * kWidth * 2;
    const double lr_bytes = static_cast<double>(ctx) * kRank * 2;
    struct V {
      const char* name;
      bool vlr, klr;
    } variants[] = {{"plain", false, false}, {"flash_lora_v_r16", true, false}, {"flash_lora_kv_r16", true, true}};
    // The default kernel's variants and materialise-then-attend, interleaved: their ratios are
    // the acceptance figures.
    // Materialise-then-attend on given params: V_full to HBM, then plain attention over it.
    auto materialise_v = [&](lc::AttnParams p) {
      CK(lc::materialize_v(p, P.vfull));
      p.v.data = P.vfull;
      p.v_lr = lc::DevLowRank{};
      CK(lc::attention(p));
    };
    auto materialise_then_attend = [&](int rep) { materialise_v(params(rep, true, false)); };
    auto materialise_k_then_attend = [&](int rep) { materialise_k(params(rep, true, true)); };
    // Consistency at full size, same inputs: the fused kernel into out, `materialised` into
    // out2; their relative L2 as a check row.
    auto check_same = [&](const char* name, const char* label, const lc::AttnParams& fused,
                          const std::function<void(lc::AttnParams)>& materialised) {
      CK(lc::attention(fused));
      lc::AttnParams p = fused;
      p.out = out2;
      materialised(p);
      CK(cudaDeviceSynchronize());
      Result c;
      c.group = "check";
      c.name = name;
      c.ctx = ctx;
      c.note = std::to_string(rel_l2(out, out2, static_cast<size_t>(n_q) * kHeads * kD));
      std::printf("check    %s ctx=%d rel_l2=%s\n", label, ctx, c.note.c_str());
      results.push_back(c);
    };
    std::vector<std::function<void(int)>> fns;
    for (const auto& var : variants)
      fns.push_back([&, var](int rep) { CK(lc::attention(params(rep, var.vlr, var.klr))); });
    fns.push_back(materialise_then_attend);
    fns.push_back(materialise_k_then_attend);
    const std::vector<Stats> st = time_interleaved(fns, warmup, reps);
    for (size_t vi = 0; vi < std::size(variants); ++vi) {
      const auto& var = variants[vi];
      Result r;
      r.group = "prefill";
      r.name = var.name;
      r.ctx = ctx;
      r.n_q = n_q;
      r.seqs = 1;
      r.splits = lc::attention_num_splits(params(0, var.vlr, var.klr));
      r.t = st[vi];
      r.flops = flops;
      r.bytes = kv_bytes + (var.vlr ? lr_bytes : 0) + (var.klr ? lr_bytes : 0);
      report(r);
      // The same shape on v5 (the previous default), v3 (mma.sync) and v2, to see the change.
      const std::pair<lc::AttnKernel, const char*> previous[] = {
          {lc::AttnKernel::kV5Wgmma, "v5_"}, {lc::AttnKernel::kV3Mma, "v3_"}, {lc::AttnKernel::kV2Mma, "v2_"}};
      for (const auto& [kern, prefix] : previous) {
        Result r2 = r;
        r2.name = std::string(prefix) + var.name;
        r2.splits = lc::attention_num_splits(params(0, var.vlr, var.klr), kern);
        r2.t = time_it([&](int rep) { CK(lc::attention(params(rep, var.vlr, var.klr), kern)); }, warmup, reps);
        report(r2);
      }
    }
    // A prefill row of this context (the chunk's FLOPs; bytes as each variant moves them).
    auto prefill_row = [&](const char* name, const Stats& t, double bytes) {
      Result r;
      r.group = "prefill";
      r.name = name;
      r.ctx = ctx;
      r.n_q = n_q;
      r.seqs = 1;
      r.t = t;
      r.flops = flops;
      r.bytes = bytes;
      return r;
    };
    // materialise-then-attend: V_full to HBM, then plain attention over it
    report(prefill_row("materialise_then_attend_r16", st[std::size(variants)],
                       kv_bytes + lr_bytes + 2.0 * ctx * kWidth * 2));
    check_same("fla_vs_materialise_rel_l2", "fla vs materialise", params(0, true, false), materialise_v);
    {  // K materialised, then Flash-LoRA V: against the fused FLA+K kernel on the same inputs
      const Result r = prefill_row("materialise_k_flash_lora_kv_r16", st[std::size(variants) + 1],
                                   kv_bytes + 2 * lr_bytes + 2.0 * ctx * kWidth * 2);
      report(r);
      check_same("fla_kv_vs_materialise_k_rel_l2", "fla+k vs materialise k", params(0, true, true), materialise_k);
      // Its two parts apart: the materialisation (K_full and V's dense copy) alone, and the
      // attention over them.
      Result a1 = r, a2 = r;
      a1.name = "part_materialise_k_only";
      a1.t = time_it([&](int rep) { CK(lc::materialize_k(params(rep, true, true), P.kfull, P.vdense)); }, warmup,
                     reps);
      a1.flops = 0;
      a1.bytes = 4.0 * ctx * kWidth * 2 + lr_bytes;
      report(a1);
      a2.name = "part_attend_dense_kv_fla_v";
      a2.t = time_it([&](int rep) { CK(lc::attention(dense_kv(params(rep, true, true)))); }, warmup, reps);
      report(a2);
    }
    CK(cudaFree(d_ctx));
  }

  // ---- decode: 8 sequences x 32k private caches ----
  const int dctx = quick ? 8192 : kDecodeCtx;
  {
    const int pages = dctx / kPage;
    std::vector<int32_t> qs(kSeqs + 1), cl(kSeqs, dctx);
    for (int s = 0; s <= kSeqs; ++s) qs[s] = s;
    int32_t* d_qs = dupload(qs);
    int32_t* d_cl = dupload(cl);
    const double flops = 4.0 * kD * kHeads * dctx * kSeqs;
    const double kv_bytes = 2.0 * kSeqs * dctx * kWidth * 2 + 2.0 * kSeqs * kHeads * kD * 2;
    const double lr_bytes = static_cast<double>(kSeqs) * dctx * kRank * 2;
    auto params = [&](int rep, bool vlr, bool klr) {
      return make_params(P, d_perm, pages, d_qs, d_cl, kSeqs, 1, dctx,
                         qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, out, vlr, klr, ws, ws_bytes);
    };
    struct V {
      const char* name;
      bool vlr, klr;
    } variants[] = {{"private_plain", false, false},
                    {"private_flash_lora_v_r16", true, false},
                    {"private_flash_lora_kv_r16", true, true}};
    for (const auto& var : variants) {
      Result r;
      r.group = "decode";
      r.name = var.name;
      r.ctx = dctx;
      r.n_q = 1;
      r.seqs = kSeqs;
      r.splits = lc::attention_num_splits(params(0, var.vlr, var.klr));
      r.t = time_it([&](int rep) { CK(lc::attention(params(rep, var.vlr, var.klr))); }, warmup, reps);
      r.flops = flops;
      r.bytes = kv_bytes + (var.vlr ? lr_bytes : 0) + (var.klr ? lr_bytes : 0);
      report(r);
      {  // the same shape on v1 (the previous version), to see the change
        Result r1 = r;
        r1.name = std::string("v1_") + var.name;
        r1.splits = lc::attention_num_splits(params(0, var.vlr, var.klr), lc::AttnKernel::kV1Mma);
        r1.t = time_it([&](int rep) { CK(lc::attention(params(rep, var.vlr, var.klr), lc::AttnKernel::kV1Mma)); },
                       warmup, reps);
        report(r1);
      }
      // the default (decode: v4's kernel; split-K) vs v0 oracle at full size.
      check_vs_v0(params(0, var.vlr, var.klr), std::string("decode_default_vs_v0_rel_l2_") + var.name, dctx,
                  static_cast<size_t>(kSeqs) * kHeads * kD);
    }
    {  // materialise-then-attend for decode: V_full written to HBM, then plain decode over it
      Result r;
      r.group = "decode";
      r.name = "private_materialise_then_attend_r16";
      r.ctx = dctx;
      r.n_q = 1;
      r.seqs = kSeqs;
      r.t = time_it(
          [&](int rep) {
            lc::AttnParams p = params(rep, true, false);
            CK(lc::materialize_v(p, P.vfull));
            p.v.data = P.vfull;
            p.v_lr = lc::DevLowRank{};
            CK(lc::attention(p));
          },
          warmup, reps);
      r.flops = flops;
      r.bytes = kv_bytes + lr_bytes + 2.0 * kSeqs * dctx * kWidth * 2;  // + V_full written and read
      report(r);
    }
    CK(cudaFree(d_qs));
    CK(cudaFree(d_cl));
  }

  // ---- decode: one sequence over 4k (an 8B model's batch-1 decode step, per layer) and 32k ----
  // The default (v4's decode kernel) against v1, which ran this shape before v4. Each repetition
  // reads another 32k slice of the pool, so the 16.8 MB of K/V at 4k are not L2-resident.
  for (const int ctx1 : {4096, dctx}) {
    const int slice = kDecodeCtx / kPage;
    const char* group = ctx1 == 4096 ? "decode1" : "decode1_long";
    int32_t* d_qs = dupload(std::vector<int32_t>{0, 1});
    int32_t* d_cl = dupload(std::vector<int32_t>{ctx1});
    auto params = [&](int rep, bool vlr) {
      return make_params(P, d_perm + static_cast<size_t>(rep % kSeqs) * slice, slice, d_qs, d_cl, 1, 1, ctx1,
                         qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, out, vlr, false, ws,
                         ws_bytes);
    };
    for (bool vlr : {false, true}) {
      for (lc::AttnKernel kern : {lc::AttnKernel::kV4Decode, lc::AttnKernel::kV1Mma}) {
        Result r;
        r.group = group;
        r.name = std::string(kern == lc::AttnKernel::kV1Mma ? "v1_" : "") + (vlr ? "flash_lora_v_r16" : "plain");
        r.ctx = ctx1;
        r.n_q = 1;
        r.seqs = 1;
        r.splits = lc::attention_num_splits(params(0, vlr), kern);
        r.t = time_it([&](int rep) { CK(lc::attention(params(rep, vlr), kern)); }, warmup, reps);
        r.flops = 4.0 * kD * kHeads * ctx1;
        r.bytes = 2.0 * ctx1 * kWidth * 2 + (vlr ? static_cast<double>(ctx1) * kRank * 2 : 0);
        report(r);
      }
      check_vs_v0(params(0, vlr), std::string(group) + "_v4_vs_v0_rel_l2_" + (vlr ? "flash_lora_v_r16" : "plain"), ctx1,
                  static_cast<size_t>(kHeads) * kD);
    }
    CK(cudaFree(d_qs));
    CK(cudaFree(d_cl));
  }

  // ---- shared-base multi-agent decode: 8 agents (and the poster's 3) over one 32k context ----
  for (const int n_agents : {kSeqs, 3}) {
    const int pages = dctx / kPage;
    int32_t* d_qs = dupload(std::vector<int32_t>{0, n_agents});
    int32_t* d_cl = dupload(std::vector<int32_t>{dctx});
    const double flops = 4.0 * kD * kHeads * dctx * n_agents;
    const double bytes = 2.0 * dctx * kWidth * 2 + 2.0 * n_agents * kHeads * kD * 2;
    const double lr_bytes = static_cast<double>(dctx) * kRank * 2;
    const int n_sets = std::min(4, P.n_blocks / pages);
    auto params = [&](int rep, bool vlr, bool klr) {
      lc::AttnParams p =
          make_params(P, d_perm + static_cast<size_t>(rep % n_sets) * pages, 0, d_qs, d_cl, 1, n_agents, dctx,
                      qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, out, vlr, klr, ws, ws_bytes);
      p.agents = true;
      return p;
    };
    struct V {
      const char* name;
      bool vlr, klr;
    } variants[] = {{"shared_plain", false, false},
                    {"shared_flash_lora_v_r16", true, false},
                    {"shared_flash_lora_kv_r16", true, true}};
    const std::string group = n_agents == kSeqs ? "agents" : "agents" + std::to_string(n_agents);
    if (n_agents != kSeqs) {
      // The same agents on private caches: n_agents sequences of dctx tokens, one decode each (the
      // 8-agent comparison uses the decode group's 8 private sequences).
      std::vector<int32_t> qs(n_agents + 1), cl(n_agents, dctx);
      for (int i = 0; i <= n_agents; ++i) qs[i] = i;
      int32_t* d_pqs = dupload(qs);
      int32_t* d_pcl = dupload(cl);
      for (const bool vlr : {false, true}) {
        auto pparams = [&](int rep) {
          return make_params(P, d_perm, pages, d_pqs, d_pcl, n_agents, 1, dctx,
                             qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, out, vlr, false, ws,
                             ws_bytes);
        };
        Result r;
        r.group = group;
        r.name = vlr ? "private_flash_lora_v_r16" : "private_plain";
        r.ctx = dctx;
        r.n_q = 1;
        r.seqs = n_agents;
        r.splits = lc::attention_num_splits(pparams(0));
        r.t = time_it([&](int rep) { CK(lc::attention(pparams(rep))); }, warmup, reps);
        r.flops = flops;
        r.bytes = 2.0 * n_agents * dctx * kWidth * 2 + (vlr ? static_cast<double>(n_agents) * lr_bytes : 0);
        report(r);
      }
      CK(cudaFree(d_pqs));
      CK(cudaFree(d_pcl));
    }
    for (const auto& var : variants) {
      Result r;
      r.group = group;
      r.name = var.name;
      r.ctx = dctx;
      r.n_q = n_agents;
      r.seqs = 1;
      r.splits = lc::attention_num_splits(params(0, var.vlr, var.klr));
      r.t = time_it([&](int rep) { CK(lc::attention(params(rep, var.vlr, var.klr))); }, warmup, reps);
      r.flops = flops;
      r.bytes = bytes + (var.vlr ? lr_bytes : 0) + (var.klr ? lr_bytes : 0);
      report(r);
      {  // the same shape on v1 (the previous version), to see the change
        Result r1 = r;
        r1.name = std::string("v1_") + var.name;
        r1.splits = lc::attention_num_splits(params(0, var.vlr, var.klr), lc::AttnKernel::kV1Mma);
        r1.t = time_it([&](int rep) { CK(lc::attention(params(rep, var.vlr, var.klr), lc::AttnKernel::kV1Mma)); },
                       warmup, reps);
        report(r1);
      }
      check_vs_v0(params(0, var.vlr, var.klr), group + "_default_vs_v0_rel_l2_" + var.name, dctx,
                  static_cast<size_t>(n_agents) * kHeads * kD);
    }
    CK(cudaFree(d_qs));
    CK(cudaFree(d_cl));
  }

  // ---- forks: 8 agents that share a 32k trajectory (the same pages) and then hold 256 keys
  // each of their own (their answers so far): one decode batch over every fork's whole table
  // (what private copies cost), against the shared-prefix attention the CUDA backend runs for such
  // a batch (cuda_backend_attention.cpp, run_shared_prefix): v4's agents mode over the shared
  // pages, the batch over each fork's own keys, both with lse_out, then attention_merge. The
  // same for 2 and 4 forks and 1k / 4k shared keys: where the shared-prefix pass starts to pay
  // (CudaBackend::kSharedPrefixMinKeys); and for 16 forks, more than one agents-mode sequence
  // takes at G = 4: two groups of 8, each a sequence of one agents-mode launch over the same
  // pages, as the backend runs them (their Bs the 8 adapters' in turn). ----
  for (const int shared_ctx : {1024, 4096, dctx})
  for (const int n_forks : {2, 4, kSeqs, 2 * kSeqs}) {
    constexpr int kOwn = 256;
    const int pages = shared_ctx / kPage, own_pages = kOwn / kPage, stride = pages + own_pages;
    std::vector<int32_t> ft(static_cast<size_t>(n_forks) * stride);  // [n_forks, stride] fork tables
    for (int s = 0; s < n_forks; ++s)
      for (int j = 0; j < stride; ++j)
        ft[static_cast<size_t>(s) * stride + j] = perm[j < pages ? j : pages + s * own_pages + (j - pages)];
    int32_t* d_ft = dupload(ft);
    std::vector<int32_t> qs(n_forks + 1), cl(n_forks, shared_ctx + kOwn), cl_own(n_forks, kOwn);
    for (int s = 0; s <= n_forks; ++s) qs[s] = s;
    int32_t* d_qs = dupload(qs);
    int32_t* d_cl = dupload(cl);
    int32_t* d_cl_own = dupload(cl_own);
    // The shared pass's groups (run_shared_prefix): at most 32 rows a kv head each, about equal.
    const int per = lc::kAgentsMaxRows / (kHeads / kKv), n_groups = (n_forks + per - 1) / per;
    const int group = (n_forks + n_groups - 1) / n_groups;
    std::vector<int32_t> qs_a(static_cast<size_t>(n_groups) + 1), cl_a(static_cast<size_t>(n_groups), shared_ctx);
    for (int g = 0; g <= n_groups; ++g) qs_a[static_cast<size_t>(g)] = std::min(n_forks, g * group);
    int32_t* d_qs_a = dupload(qs_a);
    int32_t* d_cl_a = dupload(cl_a);
    std::vector<const bf16*> bp(n_forks), bkp(n_forks);
    for (int s = 0; s < n_forks; ++s) bp[s] = P.bv + static_cast<size_t>(s % kSeqs) * kWidth * kRank;
    for (int s = 0; s < n_forks; ++s) bkp[s] = P.bk + static_cast<size_t>(s % kSeqs) * kWidth * kRank;
    const bf16* const* d_bp = dupload(bp);
    const bf16* const* d_bkp = dupload(bkp);
    const size_t rows = static_cast<size_t>(n_forks) * kHeads;
    float* o_batch = dalloc<float>(rows * kD);   // [n_forks, 32 heads, 128]
    float* o_own = dalloc<float>(rows * kD);     // [n_forks, 32 heads, 128]
    float* o_shared = dalloc<float>(rows * kD);  // [n_forks, 32 heads, 128]
    float* lse = dalloc<float>(2 * rows);        // [2, n_forks, 32 heads]: the shared pass's, the own keys'
    auto batch = [&](int rep, bool vlr, bool klr) {
      lc::AttnParams p = make_params(P, d_ft, stride, d_qs, d_cl, n_forks, 1, shared_ctx + kOwn,
                                     qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD, nullptr, vlr,
                                     klr, ws, ws_bytes);
      p.out_f32 = o_batch;
      if (vlr) p.v_lr.b_seq = d_bp;
      if (klr) p.k_lr.b_seq = d_bkp;
      return p;
    };
    auto shared_prefix = [&](int rep, bool vlr, bool klr) {
      const bf16* q = qbuf + static_cast<size_t>(rep % kQSets) * kMaxQ * kHeads * kD;
      lc::AttnParams a = make_params(P, d_ft, 0, d_qs_a, d_cl_a, n_groups, group, shared_ctx, q, nullptr, vlr, klr,
                                     ws, ws_bytes);
      a.agents = true;
      a.out_f32 = o_shared;
      a.lse_out = lse;
      lc::AttnParams o = make_params(P, d_ft + pages, stride, d_qs, d_cl_own, n_forks, 1, kOwn, q, nullptr, vlr, klr,
                                     ws, ws_bytes);
      o.out_f32 = o_own;
      o.lse_out = lse + rows;
      if (vlr) a.v_lr.b_seq = o.v_lr.b_seq = d_bp;
      if (klr) {
        a.k_lr.b_seq = o.k_lr.b_seq = d_bkp;
        o.k_pos0 = shared_ctx;  // the own keys' RoPE positions
      }
      CK(lc::attention(a));
      CK(lc::attention(o));
      lc::AttnMerge m;
      m.o_a = o_shared;
      m.lse_a = lse;
      m.o_b = o_own;
      m.lse_b = lse + rows;
      m.out = o_own;
      m.rows = static_cast<int64_t>(rows);
      m.head_dim = kD;
      CK(lc::attention_merge(m, nullptr));
    };
    for (const int var : {0, 1, 2}) {  // plain, V term, K and V terms
      const bool vlr = var >= 1, klr = var == 2;
      const std::string tag = klr ? "flash_lora_kv_r16" : vlr ? "flash_lora_v_r16" : "plain";
      const std::vector<Stats> t = time_interleaved({[&](int rep) { CK(lc::attention(batch(rep, vlr, klr))); },
                                                     [&](int rep) { shared_prefix(rep, vlr, klr); }},
                                                    warmup, reps);
      for (int v = 0; v < 2; ++v) {
        Result r;
        r.group = "forks";
        r.name = (v == 0 ? "batch_" : "shared_prefix_") + tag + "_x" + std::to_string(n_forks);
        r.ctx = shared_ctx + kOwn;
        r.n_q = 1;
        r.seqs = n_forks;
        r.t = t[static_cast<size_t>(v)];
        r.flops = 4.0 * kD * kHeads * (shared_ctx + kOwn) * n_forks;
        r.bytes = v == 0 ? 2.0 * n_forks * (shared_ctx + kOwn) * kWidth * 2
                         : 2.0 * (shared_ctx + n_forks * kOwn) * kWidth * 2;
        if (v == 1) r.note = "speed-up " + std::to_string(t[0].median_ms / t[1].median_ms);
        report(r);
      }
      // The two on the same inputs: relative L2 of the shared-prefix output to the batch's.
      CK(lc::attention(batch(0, vlr, klr)));
      shared_prefix(0, vlr, klr);
      CK(cudaDeviceSynchronize());
      std::vector<float> a(rows * kD), b(rows * kD);
      CK(cudaMemcpy(a.data(), o_batch, a.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), o_own, b.size() * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += a[i] * a[i];
      }
      Result c;
      c.group = "check";
      c.name = "forks_shared_prefix_vs_batch_rel_l2_" + tag + "_x" + std::to_string(n_forks);
      c.ctx = shared_ctx + kOwn;
      c.note = std::to_string(std::sqrt(num / std::max(den, 1e-30)));
      std::printf("check    %s rel_l2=%s\n", c.name.c_str(), c.note.c_str());
      results.push_back(c);
    }
    for (void* ptr : {static_cast<void*>(d_ft), static_cast<void*>(d_qs), static_cast<void*>(d_cl),
                      static_cast<void*>(d_cl_own), static_cast<void*>(d_qs_a), static_cast<void*>(d_cl_a),
                      const_cast<void*>(static_cast<const void*>(d_bp)),
                      const_cast<void*>(static_cast<const void*>(d_bkp)), static_cast<void*>(o_batch),
                      static_cast<void*>(o_own), static_cast<void*>(o_shared), static_cast<void*>(lse)})
      CK(cudaFree(ptr));
  }

  // ---- (last, so its 128 MB of buffers disturb no other figure) prefill from position 0: the
  // causal square of one chunk (a model's first prefill, e.g.
  // the 8B model bench's 8k pass); row tiles then range from 1 to ctx / 64 key tiles ----
  if (!decode_only) {
    const int sq = quick ? 4096 : 8192;
    const size_t q_elems = static_cast<size_t>(sq) * kHeads * kD;
    bf16* qsq = dalloc<bf16>(q_elems);  // [sq, 32 heads, 128]
    bf16* osq = dalloc<bf16>(q_elems);  // [sq, 32 heads, 128]
    fill(qsq, q_elems, 9);
    int32_t* d_qs = dupload(std::vector<int32_t>{0, sq});
    int32_t* d_c = dupload(std::vector<int32_t>{sq});
    const double flops = 4.0 * kD * kHeads * (static_cast<double>(sq) * (sq + 1) / 2);
    const std::pair<lc::AttnKernel, const char*> kernels[] = {{lc::AttnKernel::kV6WgmmaWs, ""},
                                                              {lc::AttnKernel::kV5Wgmma, "v5_"}};
    for (const bool vlr : {false, true}) {
      for (const auto& [kern, prefix] : kernels) {
        const lc::AttnParams p = make_params(P, d_perm, 0, d_qs, d_c, 1, sq, sq, qsq, osq, vlr, false, ws, ws_bytes);
        Result r;
        r.group = "prefill_square";
        r.name = std::string(prefix) + (vlr ? "flash_lora_v_r16" : "plain");
        r.ctx = sq;
        r.n_q = sq;
        r.seqs = 1;
        r.splits = lc::attention_num_splits(p, kern);
        r.t = time_it([&](int) { CK(lc::attention(p, kern)); }, warmup, reps);
        r.flops = flops;
        r.bytes = 2.0 * sq * kWidth * 2 + (vlr ? static_cast<double>(sq) * kRank * 2 : 0);
        report(r);
      }
    }
  }

  return write_json();
}
