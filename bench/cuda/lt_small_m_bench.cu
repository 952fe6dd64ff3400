// cuBLASLt on the decode GEMMs of batched passes (a few rows): the heuristic's first algorithm,
// which the CUDA backend's LtGemm takes, against the fastest of the heuristic's top candidates,
// on the weight shapes of a Llama-3.1-8B decode step, at M = 1, 2, 4, 8, 16 rows. Operands as
// the backend's: x [M, in] and w [out, in] bf16, y [M, out] f32, f32 accumulation.
//   bytes moved = weights (they dominate) + x + y; GB/s and the fraction of the device-to-device
//   copy bandwidth measured in the same run.
// Each timing rotates over a 2 GiB pool of weight copies (no L2 reuse between launches), 20
// launches per sample, median of 9 samples. Every candidate's output is checked against the
// first's (relative L2 <= 1e-3: the same products summed in another order).
// Usage: lragent_lt_small_m_bench [--out FILE.json]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_check.cuh"

namespace {

#define CB(x)                                                                            \
  do {                                                                                   \
    cublasStatus_t s_ = (x);                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "error: %s failed: status %d (line %d)\n", #x, s_, __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

struct Shape {
  const char* name;
  int64_t in, out;
};

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65535.f - 0.5f) * 0.05f);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: lragent_lt_small_m_bench [--out FILE.json]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  const size_t ws_bytes = 32u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  const int64_t pool_bytes = 2ll << 30;
  __nv_bfloat16* pool;
  CK(cudaMalloc(&pool, pool_bytes));
  fill_bf16<<<1024, 256, 0, st>>>(pool, pool_bytes / 2, 7);
  const int64_t max_rows = 16, max_in = 14336, max_out = 128256;
  __nv_bfloat16* x;
  float *y, *y_ref;
  CK(cudaMalloc(&x, max_rows * max_in * 2));
  CK(cudaMalloc(&y, max_rows * max_out * 4));
  CK(cudaMalloc(&y_ref, max_rows * max_out * 4));
  fill_bf16<<<256, 256, 0, st>>>(x, max_rows * max_in, 11);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  // Copy ceiling: 1 GiB device-to-device.
  double copy_gbs = 0;
  {
    std::vector<double> t;
    for (int r = 0; r < 7; ++r) {
      CK(cudaEventRecord(e0, st));
      CK(cudaMemcpyAsync(pool + pool_bytes / 4, pool, pool_bytes / 2, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    copy_gbs = 2.0 * (pool_bytes / 2) / (median(t) * 1e-3) / 1e9;
    fill_bf16<<<1024, 256, 0, st>>>(pool, pool_bytes / 2, 7);
  }
  std::printf("copy ceiling %.0f GB/s\n", copy_gbs);

  const Shape shapes[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672},
                          {"down", 14336, 4096}, {"lm_head", 4096, 128256}};
  std::string json = "{\"copy_gbs\": " + std::to_string(copy_gbs) + ", \"rows\": [";
  bool first_row = true;
  std::printf("%-8s %4s %10s %10s %7s %7s %6s %s\n", "shape", "M", "first us", "best us", "first", "best", "algos",
              "best/first speed-up");
  for (const Shape& sh : shapes) {
    const int64_t wbytes = sh.in * sh.out * 2;
    const int64_t copies = std::max<int64_t>(pool_bytes / wbytes, 1);
    for (int m : {1, 2, 4, 8, 16}) {
      cublasLtMatmulDesc_t desc;
      CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof(tr)));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt)));
      cublasLtMatrixLayout_t a, b, c;
      CB(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, sh.in, sh.out, sh.in));
      CB(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, sh.in, m, sh.in));
      CB(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, sh.out, m, sh.out));
      cublasLtMatmulPreference_t pref;
      CB(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t wsb = ws_bytes;
      CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
      cublasLtMatmulHeuristicResult_t res[16];
      int found = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, 16, res, &found));
      const float alpha = 1.f, beta = 0.f;
      std::vector<double> us(static_cast<size_t>(found), 1e30);
      std::vector<float> ref(static_cast<size_t>(m * sh.out)), got(ref.size());
      for (int k = 0; k < found; ++k) {
        // Correctness on copy 0 against the first algorithm's output.
        if (cublasLtMatmul(lt, desc, &alpha, pool, a, x, b, &beta, k == 0 ? y_ref : y, c, k == 0 ? y_ref : y, c,
                           &res[k].algo, ws, ws_bytes, st) != CUBLAS_STATUS_SUCCESS)
          continue;
        if (k > 0) {
          CK(cudaMemcpyAsync(ref.data(), y_ref, ref.size() * 4, cudaMemcpyDeviceToHost, st));
          CK(cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, st));
          CK(cudaStreamSynchronize(st));
          double num = 0, den = 0;
          for (size_t i = 0; i < ref.size(); ++i) {
            num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
            den += double(ref[i]) * ref[i];
          }
          if (!(std::sqrt(num / std::max(den, 1e-30)) <= 1e-3)) {
            std::fprintf(stderr, "%s M=%d algo %d: wrong output, skipped\n", sh.name, m, k);
            continue;
          }
        }
        std::vector<double> t;
        for (int r = 0; r < 9; ++r) {
          CK(cudaEventRecord(e0, st));
          for (int l = 0; l < 20; ++l) {
            const __nv_bfloat16* w = pool + (l % copies) * (sh.in * sh.out);
            CB(cublasLtMatmul(lt, desc, &alpha, w, a, x, b, &beta, y, c, y, c, &res[k].algo, ws, ws_bytes, st));
          }
          CK(cudaEventRecord(e1, st));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          t.push_back(ms * 1e3 / 20);
        }
        us[static_cast<size_t>(k)] = median(t);
      }
      const size_t best = static_cast<size_t>(std::min_element(us.begin(), us.end()) - us.begin());
      const double bytes = static_cast<double>(wbytes) + 2.0 * m * sh.in + 4.0 * m * sh.out;
      const double f = bytes / (us[0] * 1e-6) / 1e9 / copy_gbs, fb = bytes / (us[best] * 1e-6) / 1e9 / copy_gbs;
      std::printf("%-8s %4d %10.1f %10.1f %7.2f %7.2f %6d %.2fx (algo %zu)\n", sh.name, m, us[0], us[best], f, fb,
                  found, us[0] / us[best], best);
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "%s{\"shape\": \"%s\", \"in\": %lld, \"out\": %lld, \"rows\": %d, \"first_us\": %.2f, "
                    "\"best_us\": %.2f, \"first_of_copy\": %.3f, \"best_of_copy\": %.3f, \"candidates\": %d}",
                    first_row ? "" : ", ", sh.name, static_cast<long long>(sh.in), static_cast<long long>(sh.out), m,
                    us[0], us[best], f, fb, found);
      json += buf;
      first_row = false;
      cublasLtMatmulPreferenceDestroy(pref);
      for (auto* l : {a, b, c}) cublasLtMatrixLayoutDestroy(l);
      cublasLtMatmulDescDestroy(desc);
    }
  }
  json += "]}\n";
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
