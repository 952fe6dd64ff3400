// Decode GEMV versions (ops.cu v1, gemv.cu v2, gemv_v3_mma.cu v3) at 1-8 rows (v3 also 12 and 16) on the weight shapes of a Llama-3.1-8B decode
// step, against the device-to-device copy ceiling measured in the same run. "v2" is gemv.cu's entry
// point: its stream mode where that applies (x staged, rows unsplit), the v2 kernel elsewhere;
// LRAGENT_GEMV_STREAM=0 measures the v2 kernel alone.
//   bytes moved = weights + x + y (the weights dominate); GB/s and fraction of the copy ceiling.
// Each timing replays a CUDA graph of 20 launches that rotate over a 2 GiB weight pool (no L2
// reuse between launches), as the decode graphs of the engine launch them; median of 15 replays.
// Correctness: every version against a double-precision CPU reference on 256 sampled outputs of
// every shape (relative L2 <= 1e-5 expected: both accumulate in f32 over bf16 weights; past 8 rows
// against x rounded to bf16, as version 3 reads it there).
// Then the model's grouped calls at the current versions ("cur": gemv.cu's entry points, v2 for one
// row and v3 past it): q/k/v as one launch of three segments, and gate/up with SwiGLU.
// Usage: lragent_gemv_bench [--out FILE.json]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/ops.cuh"
#include "bench_check.cuh"

namespace lc = lragent::cuda;

namespace {


struct Shape {
  const char* name;
  int64_t in, out;
};

using GemvFn = cudaError_t (*)(const lragent::cuda::GemvCall&);

// x's values as the product reads them: bf16 past kGemvMaxRows rows.
float x_as_read(float v, int rows) {
  if (rows <= lragent::cuda::kGemvMaxRows) return v;
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;  // round to nearest even (finite values)
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}

// Milliseconds a launch: a CUDA graph of kLaunch launches (launch(i) enqueues the i-th, each on
// rotating weights), replayed 16 times, the first left out; the median.
template <class Launch>
double graph_ms(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, Launch launch) {
  const int kLaunch = 20;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kLaunch; ++i) CK(launch(i));
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<float> ms;
  for (int rep = 0; rep < 16; ++rep) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (rep > 0) ms.push_back(t / kLaunch);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One measurement: a line on stdout and an entry of the JSON results.
struct Row {
  const char* shape;
  int64_t in, out;
  const char* version;
  int rows;
  double ms, bytes, rel;
};
void report(const Row& r, double copy_gbs, std::string& json, bool& first) {
  const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
  std::printf("%-10s %6lld %7lld %4s %3d %9.2f %8.0f %6.3f %9.2e\n", r.shape, static_cast<long long>(r.in),
              static_cast<long long>(r.out), r.version, r.rows, r.ms * 1e3, gbs, gbs / copy_gbs, r.rel);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s{\"shape\": \"%s\", \"in\": %lld, \"out\": %lld, \"version\": \"%s\", \"rows\": %d, \"us\": %.3f, "
                "\"gbs\": %.1f, \"frac_copy\": %.4f, \"rel_l2\": %.3e}",
                first ? "" : ", ", r.shape, static_cast<long long>(r.in), static_cast<long long>(r.out), r.version,
                r.rows, r.ms * 1e3, gbs, gbs / copy_gbs, r.rel);
  json += buf;
  first = false;
}

float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: lragent_gemv_bench [--out FILE.json]\n");
      return 2;
    }
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA device: gemv bench skipped\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  const size_t pool_bytes = size_t{2} << 30;
  void* pool = nullptr;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(lc::fill_random(pool, lc::Elem::kBF16, static_cast<int64_t>(pool_bytes / 2), 1234, 0.02f, st));
  const int64_t max_in = 14336, max_rows = lc::kGemvV3MaxRows;
  float *x = nullptr, *y = nullptr;
  CK(cudaMalloc(&x, max_rows * max_in * 4));
  CK(cudaMalloc(&y, max_rows * 131072 * 4));
  void* x16 = nullptr;
  CK(cudaMalloc(&x16, max_rows * max_in * 2));
  // x16 = x's first `in` columns, bf16, [max_rows, in] contiguous.
  auto make_x16 = [&](int64_t in) {
    CK(lc::convert_rows(x, lc::Elem::kF32, max_in, x16, lc::Elem::kBF16, in, max_rows, in, st));
  };
  CK(lc::fill_random(x, lc::Elem::kF32, max_rows * max_in, 99, 1.f, st));
  CK(cudaStreamSynchronize(st));

  // Copy ceiling: 1 GiB device to device, bytes read + written.
  float copy_gbs = 0;
  {
    const size_t half = size_t{1} << 30;
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {
      CK(cudaEventRecord(e0, st));
      CK(cudaMemcpyAsync(pool, static_cast<char*>(pool) + half, half, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (i > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    copy_gbs = static_cast<float>(2.0 * half / (ms[ms.size() / 2] * 1e-3) / 1e9);
    CK(lc::fill_random(pool, lc::Elem::kBF16, static_cast<int64_t>(pool_bytes / 2), 1234, 0.02f, st));
  }
  std::printf("%s: copy ceiling %.0f GB/s\n", prop.name, copy_gbs);

  const Shape shapes[] = {{"q_proj", 4096, 4096},   {"k_proj", 4096, 1024},    {"o_proj", 4096, 4096},
                          {"gate_proj", 4096, 14336}, {"down_proj", 14336, 4096}, {"lm_head", 4096, 128256},
                          {"odd", 4104, 1031}};
  const struct {
    const char* name;
    GemvFn fn;
  } versions[] = {{"v1", &lc::gemv_bf16_v1}, {"v2", &lc::gemv_bf16_v2}, {"v3", &lc::gemv_bf16_v3}};
  std::string json = "{\"gpu\": \"" + std::string(prop.name) + "\", \"copy_gbs\": " + std::to_string(copy_gbs) +
                     ", \"results\": [";
  bool first = true, all_ok = true;
  std::printf("%-10s %6s %7s %4s %3s %9s %8s %6s %9s\n", "shape", "in", "out", "ver", "r", "us", "GB/s", "frac",
              "rel_l2");
  for (const Shape& sh : shapes) {
    const int64_t wbytes = sh.in * sh.out * 2;
    const int64_t n_bufs = std::max<int64_t>(1, static_cast<int64_t>(pool_bytes) / wbytes);
    // Host copy of buffer 0 for the reference.
    std::vector<uint16_t> wh(static_cast<size_t>(sh.in * sh.out));
    CK(cudaMemcpy(wh.data(), pool, static_cast<size_t>(wbytes), cudaMemcpyDeviceToHost));
    std::vector<float> xh(static_cast<size_t>(max_rows * max_in));
    CK(cudaMemcpy(xh.data(), x, xh.size() * 4, cudaMemcpyDeviceToHost));
    make_x16(sh.in);
    // One launch's operands: x [max_rows, max_in] (x16 its first sh.in columns in bf16), y [rows, sh.out].
    auto call_of = [&](const void* w, int rows) {
      lc::GemvCall c;
      c.w = w;
      c.ldw = sh.in;
      c.x = x;
      c.ldx = max_in;
      c.y = y;
      c.ldy = sh.out;
      c.rows = rows;
      c.in = sh.in;
      c.out = sh.out;
      c.x16 = x16;
      c.stream = st;
      return c;
    };
    for (const auto& v : versions) {
      for (int rows : {1, 2, 3, 4, 8, 12, 16}) {
        if (rows > lc::kGemvMaxRows && v.fn != &lc::gemv_bf16_v3) continue;  // the CUDA-core kernels' most
        // Correctness on buffer 0 at every row count (v3 pads x to 8 or 16 rows: each count its own case).
        double rel = 0;
        {
          CK(v.fn(call_of(pool, rows)));
          std::vector<float> yh(static_cast<size_t>(rows * sh.out));
          CK(cudaMemcpyAsync(yh.data(), y, yh.size() * 4, cudaMemcpyDeviceToHost, st));
          CK(cudaStreamSynchronize(st));
          double num = 0, den = 0;
          for (int s = 0; s < 256; ++s) {
            const int64_t o = (s * 7919 + 13) % sh.out;
            for (int r = 0; r < rows; ++r) {
              double ref = 0;
              for (int64_t k = 0; k < sh.in; ++k)
                ref += static_cast<double>(bf16_to_float(wh[static_cast<size_t>(o * sh.in + k)])) *
                       x_as_read(xh[static_cast<size_t>(r * max_in + k)], rows);
              const double got = yh[static_cast<size_t>(r * sh.out + o)];
              num += (got - ref) * (got - ref);
              den += ref * ref;
            }
          }
          rel = std::sqrt(num / std::max(den, 1e-30));
          if (!(rel <= 1e-5)) all_ok = false;
        }
        // Timing: a graph of 20 launches over rotating buffers.
        const double t_ms = graph_ms(st, e0, e1, [&](int i) {
          const void* w = static_cast<const char*>(pool) + (i % n_bufs) * wbytes;
          return v.fn(call_of(w, rows));
        });
        report({sh.name, sh.in, sh.out, v.name, rows, t_ms, static_cast<double>(wbytes) + 4.0 * rows * (sh.in + sh.out),
                rel},
               copy_gbs, json, first);
      }
    }
  }
  // The model's grouped calls, as a decode pass makes them (gemv.cu's entry points: v2 for one row,
  // v3 past it): q/k/v in one launch of three segments, and the MLP's gate/up pair with SwiGLU.
  {
    const int64_t in = 4096;
    const int64_t qkv_out[3] = {4096, 1024, 1024};
    for (const bool swiglu : {false, true}) {
      const char* name = swiglu ? "gate_up_swiglu" : "qkv_grouped";
      const int n_segs = swiglu ? 2 : 3;
      int64_t outs[3], total_out = 0;
      for (int i = 0; i < n_segs; ++i) total_out += outs[i] = swiglu ? 14336 : qkv_out[i];
      const int64_t gbytes = in * total_out * 2;  // the group's weights, segments back to back
      const int64_t n_bufs = std::max<int64_t>(1, static_cast<int64_t>(pool_bytes) / gbytes);
      std::vector<uint16_t> wh(static_cast<size_t>(in * total_out));
      CK(cudaMemcpy(wh.data(), pool, static_cast<size_t>(gbytes), cudaMemcpyDeviceToHost));
      std::vector<float> xh(static_cast<size_t>(max_rows * max_in));
      CK(cudaMemcpy(xh.data(), x, xh.size() * 4, cudaMemcpyDeviceToHost));
      make_x16(in);
      // y: segment i at column offset Σ outs[<i], rows of total_out floats.
      auto call = [&](const char* wbase, int rows) {
        if (swiglu) {
          lc::GemvSwigluCall c;
          c.w_gate = wbase;
          c.ldg = in;
          c.w_up = wbase + outs[0] * in * 2;
          c.ldu = in;
          c.x = x;
          c.ldx = max_in;
          c.y = y;
          c.ldy = total_out;
          c.rows = rows;
          c.in = in;
          c.out = outs[0];
          c.x16 = x16;
          c.stream = st;
          return lc::gemv_bf16_swiglu(c);
        }
        lc::GemvGroupCall c;
        c.n_segs = n_segs;
        int64_t col = 0;
        for (int i = 0; i < n_segs; ++i) {
          c.segs[i] = {wbase + col * in * 2, in, y + col, total_out, outs[i]};
          col += outs[i];
        }
        c.x = x;
        c.ldx = max_in;
        c.rows = rows;
        c.in = in;
        c.x16 = x16;
        c.stream = st;
        return lc::gemv_bf16_grouped(c);
      };
      for (int rows : {1, 2, 3, 4, 8, 12, 16}) {
        double rel = 0;
        {
          CK(call(static_cast<const char*>(pool), rows));
          std::vector<float> yh(static_cast<size_t>(rows * total_out));
          CK(cudaMemcpyAsync(yh.data(), y, yh.size() * 4, cudaMemcpyDeviceToHost, st));
          CK(cudaStreamSynchronize(st));
          auto dot = [&](int64_t o, int r) {
            double d = 0;
            for (int64_t k = 0; k < in; ++k)
              d += static_cast<double>(bf16_to_float(wh[static_cast<size_t>(o * in + k)])) *
                   x_as_read(xh[static_cast<size_t>(r * max_in + k)], rows);
            return d;
          };
          double num = 0, den = 0;
          const int64_t checked = swiglu ? outs[0] : total_out;
          for (int smp = 0; smp < 256; ++smp) {
            const int64_t o = (smp * 7919 + 13) % checked;
            for (int r = 0; r < rows; ++r) {
              double ref = dot(o, r);
              if (swiglu) ref = ref / (1.0 + std::exp(-ref)) * dot(outs[0] + o, r);
              const double got = yh[static_cast<size_t>(r * total_out + o)];
              num += (got - ref) * (got - ref);
              den += ref * ref;
            }
          }
          rel = std::sqrt(num / std::max(den, 1e-30));
          if (!(rel <= 1e-5)) all_ok = false;
        }
        const double t_ms = graph_ms(st, e0, e1, [&](int i) {
          return call(static_cast<const char*>(pool) + (i % n_bufs) * gbytes, rows);
        });
        report({name, in, total_out, "cur", rows, t_ms, static_cast<double>(gbytes) + 4.0 * rows * (in + total_out), rel},
               copy_gbs, json, first);
      }
    }
  }
  json += "]}";
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f) {
      std::fprintf(f, "%s\n", json.c_str());
      std::fclose(f);
    }
  }
  std::printf("gemv correctness: %s\n", all_ok ? "all versions within 1e-5 of the reference" : "FAILED");
  return all_ok ? 0 : 1;
}
