// The CUDA backend against the CPU backend, op by op (ggml's test-backend-ops idea), at awkward
// sizes, in both CUDA dtypes; then the whole engine: `replay` of a real trajectory script on
// tinystories with real PEFT adapters, every sharing mode, GPU vs CPU greedy tokens.
//   f32 path: identical tokens required; bf16 path: agreement reported, first-step logits checked.
// Every test skips (with a message) when no CUDA device is present.
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

using testing::have_gpu;

#define REQUIRE_GPU()                                                       \
  if (!have_gpu()) {                                                        \
    GTEST_SKIP() << "no CUDA device: CUDA backend tests skipped";           \
  }

std::unique_ptr<Backend> cuda_backend(DType dt) {
  CudaBackendOptions o;
  o.dtype = dt;
  auto be = make_cuda_backend(o);
  EXPECT_TRUE(be.ok()) << be.error().message;
  return be.ok() ? std::move(*be) : nullptr;
}

Tensor random_host(std::vector<int64_t> shape, uint32_t seed, float scale = 1.f) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = nd(rng);
  return t;
}

std::vector<float> host_values(Backend& be, const TensorView& v) {
  Tensor h = be.device() == Device::kCpu ? Tensor() : be.to_host(v);
  const float* p = be.device() == Device::kCpu ? v.f32() : h.f32();
  return std::vector<float>(p, p + v.numel());
}

// Relative L2 error ||a - b|| / ||b||; NaN anywhere, different lengths or nothing to compare is an
// error of 1e30.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return 1e30;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

double tol(DType dt) { return dt == DType::kF32 ? 2e-5 : 1e-2; }

// An f32 [rows, cols] host tensor of NaNs: an output that must be written everywhere (or must not
// be read) starts as this.
Tensor nan_host(int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::nanf("");
  return t;
}

// Every op test: the CUDA backend in the test's dtype, and a CPU backend as the reference.
class CudaOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    gpu = cuda_backend(GetParam());
    cpu = make_cpu_backend(2);
    ASSERT_TRUE(gpu);
  }
  std::unique_ptr<Backend> gpu, cpu;
};

TEST_P(CudaOps, MatmulMatchesCpu) {
  const DType dt = GetParam();
  struct Shape { int64_t n, in, out; };
  // n <= 16 with in % 8 == 0 takes the GEMV kernels in bf16 (v2 one row, v3 2-16: 8x64, 3x4096,
  // 2x4104, 5x8, 8x2048, 4x1032, 3x4096 . 4096; two x tiles: 9x64, 16x4096, 13x1032, 11x14336,
  // 16x8); the rest cuBLASLt (17x64, 97x128). Of the one-row GEMVs, those
  // whose rows fill the GPU unsplit and whose x fits the staging (1x256, 1x4096 . 4099,
  // 1x12032 . 4096) run the persistent stream mode, the others v2. 1x12288 . 4096
  // (Ministral-8B's down projection) stages exactly 48 KiB, which with the kernel's static buffer
  // is more than a launch gets: it must take v2, not fail the launch.
  for (Shape s : {Shape{1, 17, 97}, Shape{17, 64, 33}, Shape{97, 128, 4097}, Shape{4, 1, 5}, Shape{1, 256, 300},
                  Shape{8, 64, 33}, Shape{3, 4096, 17}, Shape{9, 64, 97}, Shape{1, 14336, 97}, Shape{2, 4104, 1031},
                  Shape{5, 8, 7}, Shape{8, 2048, 4099}, Shape{1, 4096, 4099}, Shape{4, 1032, 2113},
                  Shape{1, 12288, 4096}, Shape{1, 12032, 4096}, Shape{3, 4096, 4096}, Shape{16, 4096, 4099},
                  Shape{13, 1032, 2113}, Shape{11, 14336, 97}, Shape{16, 8, 7}, Shape{10, 4096, 1}}) {
    Tensor x = random_host({s.n, s.in}, 1), w = random_host({s.out, s.in}, 2), bias = random_host({s.out}, 3);
    Tensor y0 = random_host({s.n, s.out}, 4);
    Tensor xd = gpu->upload(x.view(), DType::kF32), wd = gpu->upload(w.view(), dt);
    Tensor bd = gpu->upload(bias.view(), DType::kF32), yd = gpu->upload(y0.view(), DType::kF32);
    TensorView yc = y0.view();
    cpu->matmul(x.view(), w.view(), &bias.view(), yc, 0.5f, 1.f);
    gpu->matmul(xd.view(), wd.view(), &bd.view(), yd.view(), 0.5f, 1.f);
    const double e = rel_l2(host_values(*gpu, yd.view()), host_values(*cpu, yc));
    EXPECT_LE(e, tol(dt)) << s.n << "x" << s.in << " . " << s.out << "x" << s.in;
    // beta = 0 must not read y: poison it with NaN.
    Tensor yn = gpu->upload(nan_host(s.n, s.out).view(), DType::kF32);
    cpu->matmul(x.view(), w.view(), nullptr, yc, 1.f, 0.f);
    gpu->matmul(xd.view(), wd.view(), nullptr, yn.view(), 1.f, 0.f);
    const double e0 = rel_l2(host_values(*gpu, yn.view()), host_values(*cpu, yc));
    EXPECT_LE(e0, tol(dt)) << "beta=0 " << s.n << "x" << s.in << " . " << s.out << "x" << s.in;
  }
}

// silu(x·W_gate^T) * (x·W_up^T) in one call (matmul_swiglu) against the CPU's matmuls + silu_mul:
// the fused decode GEMV (n <= 16, in % 8 == 0, bf16) and the fallback (cuBLASLt + SwiGLU kernel),
// at odd heights (a block's last pair half-used), a single pair (out 1) and the 8B MLP width.
TEST_P(CudaOps, MatmulSwigluMatchesCpu) {
  const DType dt = GetParam();
  struct Shape { int64_t n, in, out; };
  for (Shape s : {Shape{1, 64, 17}, Shape{1, 8, 1}, Shape{3, 4096, 97}, Shape{8, 2048, 4099}, Shape{1, 4096, 14336},
                  Shape{2, 16384, 33}, Shape{9, 64, 97}, Shape{4, 17, 5}, Shape{5, 256, 1031},
                  Shape{16, 4096, 14336}, Shape{12, 2048, 4099}, Shape{17, 64, 97}}) {
    Tensor x = random_host({s.n, s.in}, 11), wg = random_host({s.out, s.in}, 12), wu = random_host({s.out, s.in}, 13);
    Tensor xd = gpu->upload(x.view(), DType::kF32), wgd = gpu->upload(wg.view(), dt), wud = gpu->upload(wu.view(), dt);
    Tensor gc = Tensor::empty(DType::kF32, {s.n, s.out}), uc = Tensor::empty(DType::kF32, {s.n, s.out});
    const Backend::MatmulOut outs[] = {{&wg.view(), nullptr, &gc.view()}, {&wu.view(), nullptr, &uc.view()}};
    cpu->matmul_group(x.view(), outs);
    cpu->silu_mul(gc.view(), uc.view(), gc.view());
    // Poisoned outputs: every element of gate must be written (up is scratch).
    const Tensor nan = nan_host(s.n, s.out);
    Tensor gd = gpu->upload(nan.view(), DType::kF32), ud = gpu->upload(nan.view(), DType::kF32);
    gpu->matmul_swiglu(xd.view(), wgd.view(), wud.view(), gd.view(), ud.view());
    const double e = rel_l2(host_values(*gpu, gd.view()), host_values(*cpu, gc.view()));
    EXPECT_LE(e, tol(dt)) << "matmul_swiglu " << s.n << "x" << s.in << " . 2x" << s.out;
  }
}

// GEMV version 3 (2-16 rows, bf16) splits units of 16 weight rows between the warps of a cluster of
// two blocks, and the warp where a unit ends adds the pieces in share order (the peer block's
// through distributed shared memory): against the CPU, and the same bits at every call. q/o-sized
// (the tile schedule by default, one even wave; forced onto the cluster schedule with
// LRAGENT_GEMV3_SCHED=cluster: 256 units, ~2 a cluster, each split over ~8 warps), a SwiGLU of 3
// units (one a cluster, each over 16 warps), an odd-sized SwiGLU, and 1031 rows over 14336 (the
// down projection's k); the same past 8 rows (two x tiles a warp).
TEST_P(CudaOps, GemvOfSeveralRowsIsTheSameEveryCall) {
  const DType dt = GetParam();
  struct Shape { int64_t n, in, out; bool swiglu; };
  for (Shape s : {Shape{3, 4096, 4096, false}, Shape{2, 16384, 33, true}, Shape{8, 2048, 4099, true},
                  Shape{5, 14336, 1031, false}, Shape{16, 4096, 4096, false}, Shape{12, 16384, 33, true},
                  Shape{9, 2048, 4099, true}, Shape{16, 14336, 1031, false}}) {
    Tensor x = random_host({s.n, s.in}, 51), wg = random_host({s.out, s.in}, 52), wu = random_host({s.out, s.in}, 53);
    Tensor xd = gpu->upload(x.view(), DType::kF32), wgd = gpu->upload(wg.view(), dt), wud = gpu->upload(wu.view(), dt);
    Tensor yc = Tensor::empty(DType::kF32, {s.n, s.out}), uc = Tensor::empty(DType::kF32, {s.n, s.out});
    if (s.swiglu) {
      const Backend::MatmulOut outs[] = {{&wg.view(), nullptr, &yc.view()}, {&wu.view(), nullptr, &uc.view()}};
      cpu->matmul_group(x.view(), outs);
      cpu->silu_mul(yc.view(), uc.view(), yc.view());
    } else {
      TensorView ycv = yc.view();
      cpu->matmul(x.view(), wg.view(), nullptr, ycv, 1.f, 0.f);
    }
    std::vector<float> first;
    for (int call = 0; call < 3; ++call) {
      Tensor yd = gpu->upload(nan_host(s.n, s.out).view(), DType::kF32);
      Tensor ud = gpu->upload(nan_host(s.n, s.out).view(), DType::kF32);
      if (s.swiglu)
        gpu->matmul_swiglu(xd.view(), wgd.view(), wud.view(), yd.view(), ud.view());
      else
        gpu->matmul(xd.view(), wgd.view(), nullptr, yd.view(), 1.f, 0.f);
      const std::vector<float> got = host_values(*gpu, yd.view());
      if (call == 0) {
        first = got;
        EXPECT_LE(rel_l2(got, host_values(*cpu, yc.view())), tol(dt)) << s.n << "x" << s.in << " . " << s.out;
      } else {
        EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * 4))
            << "call " << call << ": " << s.n << "x" << s.in << " . " << s.out << (s.swiglu ? " swiglu" : "");
      }
    }
  }
}

// RMSNorm folded into the products that read it (rms_norm_matmul_group / _swiglu) against the
// CPU's rms_norm then matmul_group / matmul_swiglu: one row of up to 12032 values in bf16 takes
// the GEMV's norm mode (its normed rows are never written: xn stays NaN), other rows, wider ones
// (12288: exactly 48 KiB staged, more than a launch gets beside the kernel's static buffer) and
// f32 the fallback. Norm
// weights f32 and bf16; widths 8 to 4104 (pieces split over 1 to 8 warps); 1 to 4097 outputs in
// up to three matrices; a mean far from zero (the sum of squares must be over the whole row); 12
// and 16 rows (the GEMV's two x tiles read the bf16 copy the norm leaves).
TEST_P(CudaOps, RmsNormFoldedProductsMatchCpu) {
  const DType dt = GetParam();
  struct Shape { int64_t n, in; std::vector<int64_t> outs; };
  for (const Shape& s : {Shape{1, 64, {17, 97, 1}}, Shape{1, 4096, {4097}}, Shape{1, 8, {5, 3}},
                         Shape{1, 4104, {33, 1031}}, Shape{3, 256, {97, 17}}, Shape{1, 14336, {97}},
                         Shape{1, 12288, {97}}, Shape{1, 12032, {97}}, Shape{2, 4096, {4097, 17}}, Shape{2, 14336, {97}},
                         Shape{8, 14336, {97}}, Shape{5, 4104, {33, 1031, 1}}, Shape{2, 8, {5, 3}},
                         Shape{16, 4096, {4097, 17}}, Shape{12, 256, {97, 17, 1}}}) {
    for (DType gt : {DType::kF32, DType::kBF16}) {
      Tensor h = random_host({s.n, s.in}, 21), g = random_host({s.in}, 22, 0.5f);
      for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] += 3.f;
      // Multiples of 1/64 below 2: exact in bf16, so both backends scale by the same g.
      for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = std::clamp(std::round(g.f32()[i] * 64.f), -127.f, 127.f) / 64.f;
      Tensor hd = gpu->upload(h.view(), DType::kF32), gd = gpu->upload(g.view(), gt);
      Tensor xc = Tensor::empty(DType::kF32, {s.n, s.in});
      cpu->rms_norm(h.view(), g.view(), 1e-5f, xc.view());
      std::vector<Tensor> ws, wds, ycs, yds;
      for (size_t i = 0; i < s.outs.size(); ++i) {
        ws.push_back(random_host({s.outs[i], s.in}, 30 + static_cast<uint32_t>(i)));
        wds.push_back(gpu->upload(ws.back().view(), dt));
        ycs.push_back(Tensor::empty(DType::kF32, {s.n, s.outs[i]}));
        yds.push_back(gpu->upload(nan_host(s.n, s.outs[i]).view(), DType::kF32));
      }
      std::vector<Backend::MatmulOut> oc, od;
      for (size_t i = 0; i < s.outs.size(); ++i) {
        oc.push_back({&ws[i].view(), nullptr, &ycs[i].view()});
        od.push_back({&wds[i].view(), nullptr, &yds[i].view()});
      }
      cpu->matmul_group(xc.view(), oc);
      Tensor xn = gpu->upload(nan_host(s.n, s.in).view(), DType::kF32);
      gpu->rms_norm_matmul_group(hd.view(), gd.view(), 1e-5f, xn.view(), od);
      const bool folded = gpu->folds_rms_norm(s.n);
      // One or two rows: version 2's norm mode (two rows of up to 5888 values fit its staging;
      // wider ones take the RMSNorm kernel, as 2 x 14336 here).
      EXPECT_EQ(folded, dt == DType::kBF16 && s.n <= 2)
          << "which passes fold (LRAGENT_GEMV_V3_ROWS, LRAGENT_GEMV_NORM_ROWS unset)";
      const std::string what = std::to_string(s.n) + "x" + std::to_string(s.in) + (gt == DType::kBF16 ? " g bf16" : " g f32");
      for (size_t i = 0; i < s.outs.size(); ++i)
        EXPECT_LE(rel_l2(host_values(*gpu, yds[i].view()), host_values(*cpu, ycs[i].view())), tol(dt))
            << "rms_norm_matmul_group " << what << " out " << s.outs[i];
      // Norm mode: the normed rows (padded to 256 values) fit 48 KiB less the kernel's 256 static bytes.
      if (folded && s.n * ((s.in + 255) / 256 * 256) * 4 + 256 <= 48 * 1024) {
        const std::vector<float> xv = host_values(*gpu, xn.view());
        EXPECT_TRUE(std::all_of(xv.begin(), xv.end(), [](float v) { return std::isnan(v); }))
            << "the folded norm wrote its normed rows " << what;
      }
      // SwiGLU over the first output's height (gate = ws[0], up = a second matrix).
      const int64_t o = s.outs[0];
      Tensor wu = random_host({o, s.in}, 40), wud = gpu->upload(wu.view(), dt);
      Tensor gc = Tensor::empty(DType::kF32, {s.n, o}), uc = Tensor::empty(DType::kF32, {s.n, o});
      cpu->matmul_swiglu(xc.view(), ws[0].view(), wu.view(), gc.view(), uc.view());
      Tensor gdv = gpu->upload(nan_host(s.n, o).view(), DType::kF32), udv = gpu->alloc(DType::kF32, {s.n, o});
      gpu->rms_norm_matmul_swiglu(hd.view(), gd.view(), 1e-5f, xn.view(), wds[0].view(), wud.view(), gdv.view(),
                                  udv.view());
      EXPECT_LE(rel_l2(host_values(*gpu, gdv.view()), host_values(*cpu, gc.view())), tol(dt))
          << "rms_norm_matmul_swiglu " << what << " out " << o;
    }
  }
}

TEST_P(CudaOps, ElementwiseOpsMatchCpu) {
  const DType dt = GetParam();
  for (int64_t n : {1, 17, 97}) {
    const int64_t d = 96, heads = 3, hd = 32;
    Tensor x = random_host({n, d}, 5), w = random_host({d}, 6);
    Tensor xd = gpu->upload(x.view(), DType::kF32), wd = gpu->upload(w.view(), DType::kF32);
    Tensor yc = Tensor::empty(DType::kF32, {n, d}), yd = gpu->alloc(DType::kF32, {n, d});
    cpu->rms_norm(x.view(), w.view(), 1e-5f, yc.view());
    gpu->rms_norm(xd.view(), wd.view(), 1e-5f, yd.view());
    EXPECT_LE(rel_l2(host_values(*gpu, yd.view()), host_values(*cpu, yc.view())), 2e-6) << "rms_norm n=" << n;

    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 37 + 4000);
    std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
    for (int64_t i = 0; i < hd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.f, -2.f * i / hd);
    Tensor r = random_host({n, heads, hd}, 7);
    Tensor rd = gpu->upload(r.view(), DType::kF32);
    TensorView rv = r.view();
    cpu->rope(rv, pos.data(), inv_freq.data());
    gpu->rope(rd.view(), pos.data(), inv_freq.data());
    EXPECT_LE(rel_l2(host_values(*gpu, rd.view()), host_values(*cpu, rv)), 2e-6) << "rope n=" << n;

    // Qwen3's per-head q/k norm, in place over [n, heads, hd] (its own op: the f32 rows are kept
    // even while set_matmul_only_outputs is on).
    Tensor hn = random_host({n, heads, hd}, 11, 3.f), hw = random_host({hd}, 12);
    Tensor hnd = gpu->upload(hn.view(), DType::kF32), hwd = gpu->upload(hw.view(), DType::kF32);
    TensorView hv = hn.view();
    cpu->head_rms_norm(hv, hw.view(), 1e-6f);
    gpu->set_matmul_only_outputs(true);
    gpu->head_rms_norm(hnd.view(), hwd.view(), 1e-6f);
    gpu->set_matmul_only_outputs(false);
    EXPECT_LE(rel_l2(host_values(*gpu, hnd.view()), host_values(*cpu, hv)), 2e-6) << "head_rms_norm n=" << n;

    Tensor g = random_host({n, d}, 8), u = random_host({n, d}, 9);
    Tensor gd = gpu->upload(g.view(), DType::kF32), ud = gpu->upload(u.view(), DType::kF32);
    TensorView gv = g.view();
    cpu->silu_mul(g.view(), u.view(), gv);
    gpu->silu_mul(gd.view(), ud.view(), gd.view());
    EXPECT_LE(rel_l2(host_values(*gpu, gd.view()), host_values(*cpu, gv)), 2e-6) << "silu_mul n=" << n;
    TensorView uv = u.view();
    cpu->add(uv, g.view());
    gpu->add(ud.view(), gd.view());
    EXPECT_LE(rel_l2(host_values(*gpu, ud.view()), host_values(*cpu, uv)), 2e-6) << "add n=" << n;

    Tensor table = random_host({50, d}, 10);
    Tensor td = gpu->upload(table.view(), dt);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % 50);
    Tensor ec = Tensor::empty(DType::kF32, {n, d}), ed = gpu->alloc(DType::kF32, {n, d});
    cpu->embedding(table.view(), ids.data(), static_cast<int>(n), ec.view());
    gpu->embedding(td.view(), ids.data(), static_cast<int>(n), ed.view());
    EXPECT_LE(rel_l2(host_values(*gpu, ed.view()), host_values(*cpu, ec.view())), tol(dt) * 0.5) << "embedding";

    Tensor gc = Tensor::empty(DType::kF32, {n, d}), gdst = gpu->alloc(DType::kF32, {n, d});
    Tensor tdf = gpu->upload(table.view(), DType::kF32);
    cpu->gather_rows(table.view(), ids.data(), n, gc.view());
    gpu->gather_rows(tdf.view(), ids.data(), n, gdst.view());
    EXPECT_EQ(host_values(*gpu, gdst.view()), host_values(*cpu, gc.view())) << "gather_rows";
  }
}

// matmul_group past the grouped GEMV's segment limit (q/k/v and the LoRA shrinks x·A beside them:
// more matrices than one launch takes), and lora_expand (a stage's LoRA expands in one launch):
// in place, out of place (y = base + delta), copy-only jobs, ranks 1 to 64, more jobs than one
// launch takes, rows at the fused kernel's limit (16) and past it (cuBLASLt fallback), and y as rows
// in the middle of a larger tensor. Outputs that must be written everywhere start as NaN.
TEST_P(CudaOps, MatmulGroupAndLoraExpandMatchCpu) {
  const DType dt = GetParam();
  for (int64_t n : {1, 3, 8, 9, 16, 17}) {
    const int64_t in = 4096;
    const std::vector<int64_t> heights = {97, 16, 4, 1031, 1, 64, 8, 33, 5, 16, 17};
    Tensor x = random_host({n, in}, 21);
    Tensor xd = gpu->upload(x.view(), DType::kF32);
    std::vector<Tensor> w, wd, yc, yd;
    for (size_t i = 0; i < heights.size(); ++i) {
      w.push_back(random_host({heights[i], in}, static_cast<uint32_t>(30 + i)));
      wd.push_back(gpu->upload(w.back().view(), dt));
      yc.push_back(Tensor::empty(DType::kF32, {n, heights[i]}));
      yd.push_back(gpu->upload(nan_host(n, heights[i]).view(), DType::kF32));
    }
    std::vector<Backend::MatmulOut> oc, og;
    for (size_t i = 0; i < heights.size(); ++i) {
      oc.push_back({&w[i].view(), nullptr, &yc[i].view()});
      og.push_back({&wd[i].view(), nullptr, &yd[i].view()});
    }
    cpu->matmul_group(x.view(), oc);
    gpu->matmul_group(xd.view(), og);
    for (size_t i = 0; i < heights.size(); ++i)
      EXPECT_LE(rel_l2(host_values(*gpu, yd[i].view()), host_values(*cpu, yc[i].view())), tol(dt))
          << "matmul_group n=" << n << " output " << i << " (" << heights[i] << " rows)";
  }
  struct Job { int64_t rank, out; bool base, lora; };
  const std::vector<Job> shapes = {{16, 97, false, true}, {4, 1031, true, true}, {8, 33, true, false},
                                   {64, 4097, false, true}, {1, 17, true, true},  {16, 4096, true, true},
                                   {16, 1024, false, true}, {12, 5, true, true},   {8, 128, false, true},
                                   {16, 300, true, true}};
  for (int64_t rows : {1, 5, 8, 9, 16, 17}) {
    const int64_t pad = 2;  // y, base: rows [pad, pad + rows) of a [rows + 3, out] tensor
    std::vector<Tensor> xa, b, y0, base, xad, bd, yd, based;
    std::vector<Backend::LoraExpandJob> jc, jg;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Job& sh = shapes[i];
      const auto seed = static_cast<uint32_t>(100 * rows + 10 * i);
      xa.push_back(random_host({rows, sh.rank}, seed));
      b.push_back(random_host({sh.out, sh.rank}, seed + 1));
      y0.push_back(sh.base ? nan_host(rows + 3, sh.out) : random_host({rows + 3, sh.out}, seed + 2));
      base.push_back(random_host({rows + 3, sh.out}, seed + 3));
      xad.push_back(gpu->upload(xa.back().view(), DType::kF32));
      bd.push_back(gpu->upload(b.back().view(), dt));
      yd.push_back(gpu->upload(y0.back().view(), DType::kF32));
      based.push_back(gpu->upload(base.back().view(), DType::kF32));
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Job& sh = shapes[i];
      Backend::LoraExpandJob c, g;
      c.scale = g.scale = 0.25f * static_cast<float>(i + 1);
      if (sh.lora) {
        c.xa = xa[i].view();
        c.b = b[i].view();
        g.xa = xad[i].view();
        g.b = bd[i].view();
      }
      c.y = y0[i].view().rows(pad, pad + rows);
      g.y = yd[i].view().rows(pad, pad + rows);
      if (sh.base) {
        c.base = base[i].view().rows(pad, pad + rows);
        g.base = based[i].view().rows(pad, pad + rows);
      }
      jc.push_back(c);
      jg.push_back(g);
    }
    cpu->lora_expand(jc);
    gpu->lora_expand(jg);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const TensorView yc_rows = y0[i].view().rows(pad, pad + rows), yg_rows = yd[i].view().rows(pad, pad + rows);
      EXPECT_LE(rel_l2(host_values(*gpu, yg_rows), host_values(*cpu, yc_rows)), tol(dt))
          << "lora_expand rows=" << rows << " job " << i << " (rank " << shapes[i].rank << ", out " << shapes[i].out
          << (shapes[i].base ? ", base" : "") << (shapes[i].lora ? "" : ", copy only") << ")";
      // Rows outside the job keep what they held (NaN stays NaN there, so compare bit patterns).
      const auto all = host_values(*gpu, yd[i].view());
      const float* before = y0[i].f32();
      bool untouched = true;
      for (int64_t r : {int64_t{0}, int64_t{1}, pad + rows})
        for (int64_t o = 0; o < shapes[i].out; ++o) {
          const float a = all[static_cast<size_t>(r * shapes[i].out + o)];
          const float e = before[r * shapes[i].out + o];
          untouched = untouched && ((std::isnan(a) && std::isnan(e)) || a == e);
        }
      EXPECT_TRUE(untouched) << "lora_expand wrote outside job " << i << "'s rows (rows=" << rows << ")";
    }
  }
}

// rope_pair_lora: q's LoRA expands applied inside the RoPE kernel (decode-sized passes) against
// the CPU's lora_expand + rope_pair; batches where some tokens have no adapter, two adapters of
// different ranks, and a batch past the fused limit (the fallback: expand kernel, then RoPE).
TEST_P(CudaOps, RopePairLoraMatchesCpu) {
  const DType dt = GetParam();
  for (int64_t hd : {64, 128}) {
    for (int64_t n : {1, 3, 8, 9, 16, 17}) {
      const int64_t ha = 4, hb = 2, width = ha * hd;
      Tensor qa = random_host({n, ha, hd}, 41), kb = random_host({n, hb, hd}, 42);
      Tensor qad = gpu->upload(qa.view(), DType::kF32), kbd = gpu->upload(kb.view(), DType::kF32);
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 131 + 7);
      std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
      for (int64_t i = 0; i < hd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(500000.f, -2.f * i / hd);
      // Token 0: adapter 1 (rank 16); tokens [1, min(n, 3)): none; tokens [3, n): adapter 2 (rank 4).
      Tensor xa1 = random_host({1, 16}, 43), b1 = random_host({width, 16}, 44);
      const int64_t n2 = std::max<int64_t>(n - 3, 0);
      Tensor xa2 = random_host({std::max<int64_t>(n2, 1), 4}, 45), b2 = random_host({width, 4}, 46);
      Tensor xa1d = gpu->upload(xa1.view(), DType::kF32), b1d = gpu->upload(b1.view(), dt);
      Tensor xa2d = gpu->upload(xa2.view(), DType::kF32), b2d = gpu->upload(b2.view(), dt);
      TensorView q2c = qa.view(), q2g = qad.view();
      q2c.shape = q2g.shape = {n, width};
      q2c.strides.clear();
      q2g.strides.clear();
      std::vector<Backend::LoraExpandJob> jc, jg;
      Backend::LoraExpandJob c, g;
      c.xa = xa1.view();
      c.b = b1.view();
      g.xa = xa1d.view();
      g.b = b1d.view();
      c.scale = g.scale = 2.f;
      c.y = q2c.rows(0, 1);
      g.y = q2g.rows(0, 1);
      jc.push_back(c);
      jg.push_back(g);
      if (n2 > 0) {
        c.xa = xa2.view().rows(0, n2);
        c.b = b2.view();
        g.xa = xa2d.view().rows(0, n2);
        g.b = b2d.view();
        c.scale = g.scale = 0.5f;
        c.y = q2c.rows(3, n);
        g.y = q2g.rows(3, n);
        jc.push_back(c);
        jg.push_back(g);
      }
      TensorView qc = qa.view(), kc = kb.view();
      cpu->rope_pair_lora(qc, kc, pos.data(), inv_freq.data(), jc);
      gpu->rope_pair_lora(qad.view(), kbd.view(), pos.data(), inv_freq.data(), jg);
      EXPECT_LE(rel_l2(host_values(*gpu, qad.view()), host_values(*cpu, qc)), tol(dt))
          << "rope_pair_lora q, n=" << n << " hd=" << hd;
      EXPECT_LE(rel_l2(host_values(*gpu, kbd.view()), host_values(*cpu, kc)), 2e-6)
          << "rope_pair_lora k, n=" << n << " hd=" << hd;
    }
  }
}

// qk_rms_norm (Qwen3): q's LoRA expands and both per-head norms in one kernel for decode-sized
// batches, against the CPU's lora_expand + head_rms_norm; some tokens without an adapter, two
// ranks, head_dim 32 to 256, and batches past the fused limit (expands first, then the kernel).
TEST_P(CudaOps, QkRmsNormWithLoraMatchesCpu) {
  const DType dt = GetParam();
  for (int64_t hd : {32, 64, 128, 256}) {
    for (int64_t n : {1, 3, 8, 9, 16, 17}) {
      const int64_t hq = 4, hk = 2, width = hq * hd;
      Tensor q = random_host({n, hq, hd}, 51, 2.f), k = random_host({n, hk, hd}, 52, 0.5f);
      Tensor wq = random_host({hd}, 53), wk = random_host({hd}, 54);
      Tensor qd = gpu->upload(q.view(), DType::kF32), kd = gpu->upload(k.view(), DType::kF32);
      Tensor wqd = gpu->upload(wq.view(), DType::kF32), wkd = gpu->upload(wk.view(), DType::kF32);
      // Token 0: rank 16; tokens [1, min(n, 3)): none; tokens [3, n): rank 4.
      const int64_t n2 = std::max<int64_t>(n - 3, 0);
      Tensor xa1 = random_host({1, 16}, 55), b1 = random_host({width, 16}, 56);
      Tensor xa2 = random_host({std::max<int64_t>(n2, 1), 4}, 57), b2 = random_host({width, 4}, 58);
      Tensor xa1d = gpu->upload(xa1.view(), DType::kF32), b1d = gpu->upload(b1.view(), dt);
      Tensor xa2d = gpu->upload(xa2.view(), DType::kF32), b2d = gpu->upload(b2.view(), dt);
      TensorView q2c = q.view(), q2g = qd.view();
      q2c.shape = q2g.shape = {n, width};
      q2c.strides.clear();
      q2g.strides.clear();
      std::vector<Backend::LoraExpandJob> jc(1), jg(1);
      jc[0].xa = xa1.view();
      jc[0].b = b1.view();
      jg[0].xa = xa1d.view();
      jg[0].b = b1d.view();
      jc[0].scale = jg[0].scale = 2.f;
      jc[0].y = q2c.rows(0, 1);
      jg[0].y = q2g.rows(0, 1);
      if (n2 > 0) {
        jc.push_back({xa2.view().rows(0, n2), b2.view(), 0.5f, q2c.rows(3, n), {}});
        jg.push_back({xa2d.view().rows(0, n2), b2d.view(), 0.5f, q2g.rows(3, n), {}});
      }
      TensorView qc = q.view(), kc = k.view();
      cpu->qk_rms_norm(qc, wq.view(), kc, wk.view(), 1e-6f, jc);
      gpu->qk_rms_norm(qd.view(), wqd.view(), kd.view(), wkd.view(), 1e-6f, jg);
      EXPECT_LE(rel_l2(host_values(*gpu, qd.view()), host_values(*cpu, qc)), tol(dt))
          << "qk_rms_norm q, n=" << n << " hd=" << hd;
      EXPECT_LE(rel_l2(host_values(*gpu, kd.view()), host_values(*cpu, kc)), 2e-6)
          << "qk_rms_norm k, n=" << n << " hd=" << hd;
    }
  }
}

// Greedy sampling on the device: the same ids as the CPU backend (lowest index on ties, NaN
// never picked) at awkward widths, up to a Llama-3 vocabulary; rows of >= 8192 take one cluster
// of blocks each (their ties then span the blocks' slices), odd widths the scalar loads; row 2 is
// all NaN (index 0). sample_rows (temperature, top-k, top-p) has its own file:
// sampling_cuda_test.cpp.
TEST_P(CudaOps, ArgmaxRowsMatchesCpu) {
  for (int64_t cols : {1, 4, 17, 1025, 4100, 8191, 8192, 32004, 100003, 128256}) {
    for (int64_t rows : {1, 3, 8}) {
      Tensor x = random_host({rows, cols}, static_cast<uint32_t>(cols + rows));
      for (int64_t r = 0; r < rows; ++r) {  // ties: copy the row maximum to a later column
        float* row = x.f32() + r * cols;
        const int64_t m = std::max_element(row, row + cols) - row;
        if (cols > 1) row[(m + cols / 2) % cols] = row[m];
        if (cols > 2 && r == 1) row[(m + 1) % cols] = std::nanf("");
        if (r == 2) std::fill(row, row + cols, std::nanf(""));
      }
      std::vector<int32_t> want(static_cast<size_t>(rows)), got(static_cast<size_t>(rows));
      cpu->argmax_rows(x.view(), want.data());
      Tensor xd = gpu->upload(x.view(), DType::kF32);
      gpu->argmax_rows(xd.view(), got.data());
      EXPECT_EQ(got, want) << rows << " x " << cols;
    }
  }
}

TEST_P(CudaOps, FillRandomIsTheSameOnEveryBackend) {
  Tensor c = Tensor::empty(DType::kF32, {4097}), d = gpu->alloc(DType::kF32, {4097});
  cpu->fill_random(c.view(), 42, 0.02f);
  gpu->fill_random(d.view(), 42, 0.02f);
  const auto hv = host_values(*gpu, d.view());
  EXPECT_LE(rel_l2(hv, host_values(*cpu, c.view())), 1e-6);
  double mean = 0, var = 0;
  for (float v : hv) mean += v;
  mean /= hv.size();
  for (float v : hv) var += (v - mean) * (v - mean);
  EXPECT_NEAR(std::sqrt(var / hv.size()), 0.02, 0.002);
}

// A decode pass's RoPE and the K/V stores after it (rope_pair_lora, then a store batch: k's rows,
// V, LR rows), recorded as a decode pass: the CUDA backend launches them as one kernel
// (GraphStats::fused_rope_stores) whose block of a token and kv head stores the k rows it
// rotated. Checked against the CPU (rotated q and k, the cache rows) and, bit for bit, against the
// same ops run eagerly (two launches). Shapes: Llama-3 GQA at head_dim 128, and 6 q heads on 4 kv
// heads (q heads not a multiple of kv heads); 1, 3 and 8 tokens, page sizes 1 and 16, LoRA terms
// on q for some tokens. Before the RoPE, a LoRA expand onto a base (a private cache's v_full =
// v + s·(x·A)·B) whose output only a store of the batch reads: the recorded pass computes it in
// the store kernel (GraphStats::fused_lora_stores), which must leave the same values in v_full and
// in the cache as the expand's own launch. With norm (Qwen3), q's LoRA terms go to qk_rms_norm
// instead and the RoPE has none: the recorded pass holds the norm for the same launch
// (GraphStats::fused_qk_norms; head_dim 96 takes qk_norm's launch first, 256 the widest rows).
TEST_P(CudaOps, RopeWithStoresMatchesCpu) {
  const DType dt = GetParam();
  struct Case { int64_t ha, hb, hd; int page; };
  for (const bool norm : {false, true})
  for (const Case c : {Case{32, 8, 128, 16}, Case{6, 4, 64, 1}, Case{4, 2, 96, 16}, Case{4, 2, 256, 16}}) {
    for (int64_t n : {1, 3, 8, 16}) {
      const int64_t wk = c.hb * c.hd, wq = c.ha * c.hd, rank = 16, ctx = 40;
      Tensor qh = random_host({n, c.ha, c.hd}, 61), kh = random_host({n, c.hb, c.hd}, 62);
      Tensor vh = random_host({n, wk}, 63), lh = random_host({n, rank}, 64);
      Tensor xa = random_host({n, rank}, 65), bq = random_host({wq, rank}, 66, 0.3f);
      Tensor xav = random_host({n, rank}, 67), bv = random_host({wk, rank}, 68, 0.3f);
      Tensor wqn = random_host({c.hd}, 69), wkn = random_host({c.hd}, 70);  // q_norm, k_norm
      std::vector<int32_t> pos(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        pos[static_cast<size_t>(i)] = static_cast<int32_t>(ctx - n + i + 1000 * i);
        slots[static_cast<size_t>(i)] = static_cast<int32_t>((ctx - 1 - 3 * i + ctx) % ctx);  // distinct, unordered
      }
      std::vector<float> inv_freq(static_cast<size_t>(c.hd / 2));
      for (int64_t i = 0; i < c.hd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(500000.f, -2.f * i / c.hd);
      const int64_t blocks = (ctx + c.page - 1) / c.page;

      // [run] q, k after RoPE and the K / V / LR cache rows at `slots`, as f32: run 0 the CPU,
      // 1 the GPU recorded (fused), 2 the GPU eager.
      struct Out { std::vector<float> q, k, kc, vc, lc, vf, vfc; };
      Out outs[3];
      for (int run = 0; run < 3; ++run) {
        Backend& be = run == 0 ? *cpu : *gpu;
        const bool dev = run > 0;
        Backend* pb = pool_backend(be);
        auto pk = BlockPool::create("k", 1, c.page, wk, blocks, pb);
        auto pv = BlockPool::create("v", 1, c.page, wk, blocks, pb);
        auto pl = BlockPool::create("lr", 1, c.page, rank, blocks, pb);
        auto pf = BlockPool::create("vf", 1, c.page, wk, blocks, pb);
        ASSERT_TRUE(pk.ok() && pv.ok() && pl.ok() && pf.ok());
        std::vector<int32_t> tables[4];
        BlockPool* pools[4] = {pk->get(), pv->get(), pl->get(), pf->get()};
        for (int i = 0; i < 4; ++i) {
          for (int64_t b = 0; b < blocks; ++b) {
            auto id = pools[i]->allocate();
            ASSERT_TRUE(id.ok()) << id.error().message;
            tables[i].push_back(*id);
          }
          std::shuffle(tables[i].begin(), tables[i].end(), std::mt19937(static_cast<uint32_t>(3 + i)));
        }
        auto up = [&](const Tensor& t, DType d) { return dev ? be.upload(t.view(), d) : Tensor(); };
        Tensor qd = up(qh, DType::kF32), kd = up(kh, DType::kF32), vd = up(vh, DType::kF32), ld = up(lh, DType::kF32);
        Tensor xad = up(xa, DType::kF32), bqd = up(bq, be.weight_dtype());
        Tensor xavd = up(xav, DType::kF32), bvd = up(bv, be.weight_dtype());
        Tensor wqnd = up(wqn, be.weight_dtype()), wknd = up(wkn, be.weight_dtype());
        Tensor vf = dev ? be.alloc(DType::kF32, {n, wk}) : Tensor::empty(DType::kF32, {n, wk});  // v_full
        Tensor qc, kc;  // the CPU's operands (rotated in place)
        if (!dev) {
          qc = Tensor::empty(DType::kF32, {n, c.ha, c.hd});
          kc = Tensor::empty(DType::kF32, {n, c.hb, c.hd});
          std::copy_n(qh.f32(), qh.numel(), qc.f32());
          std::copy_n(kh.f32(), kh.numel(), kc.f32());
        }
        TensorView q = dev ? qd.view() : qc.view(), k = dev ? kd.view() : kc.view();
        // LoRA on q for tokens 0 and (when there) 2.
        std::vector<Backend::LoraExpandJob> jobs;
        TensorView q2 = q;
        q2.shape = {n, wq};
        q2.strides.clear();
        for (int64_t t : {int64_t{0}, int64_t{2}}) {
          if (t >= n) continue;
          Backend::LoraExpandJob j;
          j.xa = (dev ? xad.view() : xa.view()).rows(t, t + 1);
          j.b = dev ? bqd.view() : bq.view();
          j.scale = 1.5f;
          j.y = q2.rows(t, t + 1);
          jobs.push_back(j);
        }
        if (run == 1) be.begin_pass(n, n);  // recorded (a decode pass of n sequences): the fused launch
        const int64_t fused_before = be.graph_stats().fused_rope_stores;
        const int64_t lora_before = be.graph_stats().fused_lora_stores;
        const int64_t norms_before = be.graph_stats().fused_qk_norms;
        {
          Backend::LoraExpandJob vj;
          vj.xa = dev ? xavd.view() : xav.view();
          vj.b = dev ? bvd.view() : bv.view();
          vj.scale = 0.75f;
          vj.base = dev ? vd.view() : vh.view();
          vj.y = vf.view();
          be.lora_expand(std::span<const Backend::LoraExpandJob>(&vj, 1));
        }
        if (norm) {  // as Qwen3's layers: q's LoRA terms, the norms, then a RoPE without LoRA terms
          if (dev) {
            be.qk_rms_norm(q, wqnd.view(), k, wknd.view(), 1e-6f, jobs);
          } else {  // the CPU reads the weights as the GPU stores them
            Tensor wq16 = Tensor::empty(DType::kF32, {c.hd}), wk16 = Tensor::empty(DType::kF32, {c.hd});
            for (int64_t i = 0; i < c.hd; ++i) {
              wq16.f32()[i] = dt == DType::kF32 ? wqn.f32()[i] : bf16_to_f32(f32_to_bf16(wqn.f32()[i]));
              wk16.f32()[i] = dt == DType::kF32 ? wkn.f32()[i] : bf16_to_f32(f32_to_bf16(wkn.f32()[i]));
            }
            be.qk_rms_norm(q, wq16.view(), k, wk16.view(), 1e-6f, jobs);
          }
          be.rope_pair_lora(q, k, pos.data(), inv_freq.data(), {});
        } else {
          be.rope_pair_lora(q, k, pos.data(), inv_freq.data(), jobs);
        }
        be.begin_store_batch();
        TensorView k2 = k;
        k2.shape = {n, wk};
        k2.strides.clear();
        be.store_rows(k2, pk->get()->layer_view(0, tables[0].data()), slots.data());
        be.store_rows(dev ? vd.view() : vh.view(), pv->get()->layer_view(0, tables[1].data()), slots.data());
        be.store_rows(dev ? ld.view() : lh.view(), pl->get()->layer_view(0, tables[2].data()), slots.data());
        be.store_rows(vf.view(), pf->get()->layer_view(0, tables[3].data()), slots.data());
        be.end_store_batch();
        Out& o = outs[run];
        o.q = host_values(be, q);  // runs the recorded pass
        o.k = host_values(be, k);
        o.vf = host_values(be, vf.view());
        if (run > 0) {
          EXPECT_EQ(be.graph_stats().fused_rope_stores - fused_before, run == 1 ? 1 : 0)
              << (run == 1 ? "the recorded pass launches RoPE and stores as one kernel" : "eager: two launches");
          EXPECT_EQ(be.graph_stats().fused_lora_stores - lora_before, run == 1 ? 1 : 0)
              << (run == 1 ? "the recorded pass computes v_full in the store kernel" : "eager: the expand's launch");
          EXPECT_EQ(be.graph_stats().fused_qk_norms - norms_before, run == 1 && norm && c.hd != 96 ? 1 : 0)
              << "the recorded pass norms q and k in the RoPE-and-stores launch (head_dim 64, 128, 256)";
        }
        // Cache rows at the slots, as f32.
        auto rows_of = [&](BlockPool* pool, const int32_t* table, int64_t width) {
          const PagedView pv2 = pool->layer_view(0, table);
          std::vector<float> r;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t off = pv2.row_offset(slots[static_cast<size_t>(i)]);
            TensorView v;
            v.dtype = pv2.dtype;
            v.shape = {width};
            v.data = static_cast<char*>(pv2.data) + off * static_cast<int64_t>(dtype_size(pv2.dtype));
            Tensor h = dev ? be.to_host(v) : Tensor();
            const void* src = dev ? h.view().data : v.data;
            for (int64_t e = 0; e < width; ++e)
              r.push_back(pv2.dtype == DType::kF32 ? static_cast<const float*>(src)[e]
                                                    : bf16_to_f32(static_cast<const uint16_t*>(src)[e]));
          }
          return r;
        };
        o.kc = rows_of(pools[0], tables[0].data(), wk);
        o.vc = rows_of(pools[1], tables[1].data(), wk);
        o.lc = rows_of(pools[2], tables[2].data(), rank);
        o.vfc = rows_of(pools[3], tables[3].data(), wk);
        for (int i = 0; i < 4; ++i)
          for (int32_t b : tables[i]) pools[i]->release(b);
      }
      const std::string what = "ha " + std::to_string(c.ha) + " hb " + std::to_string(c.hb) + " hd " +
                               std::to_string(c.hd) + " n " + std::to_string(n) + (norm ? " normed" : "");
      const double tq = dt == DType::kF32 ? 2e-5 : 1e-2;  // q's LoRA term reads B in the weight dtype
      EXPECT_LE(rel_l2(outs[1].q, outs[0].q), tq) << "q, " << what;
      EXPECT_LE(rel_l2(outs[1].k, outs[0].k), 2e-6) << "k, " << what;
      EXPECT_LE(rel_l2(outs[1].kc, outs[0].kc), tol(dt)) << "K cache rows, " << what;
      EXPECT_LE(rel_l2(outs[1].vc, outs[0].vc), tol(dt)) << "V cache rows, " << what;
      EXPECT_LE(rel_l2(outs[1].lc, outs[0].lc), tol(dt)) << "LR cache rows, " << what;
      EXPECT_EQ(outs[1].q, outs[2].q) << "fused vs eager q, " << what;
      EXPECT_EQ(outs[1].k, outs[2].k) << "fused vs eager k, " << what;
      EXPECT_EQ(outs[1].kc, outs[2].kc) << "fused vs eager K cache, " << what;
      EXPECT_EQ(outs[1].vc, outs[2].vc) << "fused vs eager V cache, " << what;
      EXPECT_EQ(outs[1].lc, outs[2].lc) << "fused vs eager LR cache, " << what;
      EXPECT_LE(rel_l2(outs[1].vf, outs[0].vf), tq) << "v_full, " << what;
      EXPECT_LE(rel_l2(outs[1].vfc, outs[0].vfc), tol(dt)) << "v_full cache rows, " << what;
      EXPECT_EQ(outs[1].vf, outs[2].vf) << "fused vs eager v_full, " << what;
      EXPECT_EQ(outs[1].vfc, outs[2].vfc) << "fused vs eager v_full cache, " << what;
    }
  }
}

// Paged attention through the Backend interface: caches written with store_rows into pools of
// each backend, every combination of the LR terms, head dims that take the tuned kernels (64,
// 128 with bf16) and the generic one (8, 32), page sizes 1 and 16, GQA 1, 4 and 8. Prefill chunks
// of >= 1024 query rows (n_q x G; >= 512 over >= 16k keys) with a K term take it materialised in
// bf16 (GraphStats::materialized_k counts them; ranks 4, 8, 16, with and without the V term): those
// must match too.
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

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---------------------------------------------------------------- the engine on the GPU

struct ReplayRun {
  std::vector<int32_t> trajectory;
  std::vector<float> first_logits;
  std::vector<int32_t> outputs;             // [generated] every step's output tokens, in order
  std::vector<std::vector<float>> logits;   // [generated, vocab] the logits each was picked from
};

// droidspeak recomputes layer 0 (the CLI's default), its catch-up partial in depth unless
// `partial_catchup` is off (SharingOptions::partial_catchup).
ReplayRun run_on(Backend& be, const std::string& set, ShareMode mode, bool keep_logits = true,
                 bool partial_catchup = true) {
  ReplayRun out;
  auto model = LlamaModel::load(testing::tinystories_dir(), be);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return out;
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  EXPECT_TRUE(tok.ok());
  std::vector<std::unique_ptr<LoraAdapter>> owned;
  std::vector<const LoraAdapter*> ads;
  const std::vector<std::string> names = {"plan", "action", "reflect"};
  for (const std::string& role : names) {
    auto a = load_lora_adapter(role, testing::adapters_dir() + "/" + set + "/" + role, (*model)->config());
    EXPECT_TRUE(a.ok()) << a.error().message;
    EXPECT_TRUE(upload_adapter(**a, be).ok());
    owned.push_back(std::move(*a));
    ads.push_back(owned.back().get());
  }
  auto steps = parse_replay_script(testing::read_file(testing::source_dir() + "/examples/replay-hotpotqa.json"),
                                   "replay-hotpotqa.json");
  EXPECT_TRUE(steps.ok());
  ReplayOptions o;
  o.sharing.mode = mode;
  o.sharing.page_size = 16;
  o.sharing.max_tokens = 2048;
  if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {0};
  o.sharing.partial_catchup = partial_catchup;
  o.keep_logits = keep_logits;  // false: greedy picks on the device (forward_argmax)
  auto r = run_replay(**model, tok->get(), names, ads, *steps, o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  if (!r.ok()) return out;
  out.trajectory = r->trajectory;
  for (const StepResult& s : r->steps) {
    if (out.first_logits.empty() && !s.logits.empty()) out.first_logits = s.logits.front();
    out.outputs.insert(out.outputs.end(), s.output_tokens.begin(), s.output_tokens.end());
    out.logits.insert(out.logits.end(), s.logits.begin(), s.logits.end());
  }
  return out;
}

// Placing the weights on the GPU reports progress per tensor: increasing, ending at the total,
// which is the CPU's (every tensor's bytes, the tied embedding once).
TEST(CudaLoad, ReportsProgressPerTensor) {
  REQUIRE_GPU();
  int64_t cpu_total = -1;
  {
    auto cpu = make_cpu_backend(1);
    auto m = LlamaModel::load(testing::tinystories_dir(), *cpu, [&](int64_t, int64_t total) { cpu_total = total; });
    ASSERT_TRUE(m.ok()) << m.error().message;
  }
  auto g = cuda_backend(DType::kBF16);
  ASSERT_TRUE(g);
  std::vector<std::pair<int64_t, int64_t>> calls;
  auto m = LlamaModel::load(testing::tinystories_dir(), *g, [&](int64_t done, int64_t total) {
    calls.emplace_back(done, total);
  });
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(calls.size(), 20u);  // lm_head (= the embedding), 9 per layer, the final norm
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, cpu_total) << i;
    if (i > 0) EXPECT_GT(calls[i].first, calls[i - 1].first) << i;
  }
  EXPECT_EQ(calls.back().first, cpu_total);
}

class CudaEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngine, ReplayMatchesCpuInEveryMode) {
  REQUIRE_GPU();
  // With a GPU the fixtures are there (scripts/device-bundle.sh packs them): missing is a failure.
  ASSERT_TRUE(std::filesystem::exists(testing::tinystories_dir())) << testing::tinystories_dir() << " is missing";
  const std::string set = GetParam();
  std::vector<ShareMode> modes(std::begin(kAllShareModes), std::end(kAllShareModes));
  modes.push_back(ShareMode::kIcarus);  // two sequences a pass: the base model's rows and the decoder's
  for (ShareMode mode : modes) {
    if (mode == ShareMode::kBaseLr && set == "qv-indep-a-r8") continue;  // refused by design
    ReplayRun ref, f32, bf16;
    {
      auto cpu = make_cpu_backend(4);
      ref = run_on(*cpu, set, mode);
    }
    {
      auto g = cuda_backend(DType::kF32);
      ASSERT_TRUE(g);
      f32 = run_on(*g, set, mode);
    }
    {
      auto g = cuda_backend(DType::kBF16);
      ASSERT_TRUE(g);
      bf16 = run_on(*g, set, mode);
    }
    ASSERT_FALSE(ref.trajectory.empty());
    EXPECT_EQ(f32.trajectory, ref.trajectory) << set << " " << share_mode_name(mode) << ": f32 GPU tokens differ";
    {
      auto g = cuda_backend(DType::kF32);
      ASSERT_TRUE(g);
      const ReplayRun picked = run_on(*g, set, mode, /*keep_logits=*/false);
      EXPECT_EQ(picked.trajectory, ref.trajectory)
          << set << " " << share_mode_name(mode) << ": f32 GPU tokens picked on the device differ";
    }
    size_t same = 0;
    for (size_t i = 0; i < std::min(bf16.trajectory.size(), ref.trajectory.size()); ++i)
      same += bf16.trajectory[i] == ref.trajectory[i];
    const double agree = static_cast<double>(same) / static_cast<double>(ref.trajectory.size());
    const double e32 = rel_l2(f32.first_logits, ref.first_logits), e16 = rel_l2(bf16.first_logits, ref.first_logits);
    std::printf("  replay %s %-10s tokens %zu: f32 identical=%d logits rel_l2=%.1e | bf16 agreement=%.3f logits "
                "rel_l2=%.1e\n",
                set.c_str(), share_mode_name(mode), ref.trajectory.size(), f32.trajectory == ref.trajectory, e32, agree,
                e16);
    EXPECT_LE(e32, 1e-4);
    EXPECT_LE(e16, 5e-2);
    // bf16 picks the CPU's token at every position up to the first where they part, and there
    // the part must be a near-tie that bf16's own logit error explains: the CPU's top-2 margin at
    // most twice the largest |bf16 - CPU| logit of that row (both runs had the same context so far).
    ASSERT_EQ(ref.logits.size(), ref.outputs.size());
    ASSERT_EQ(bf16.logits.size(), bf16.outputs.size());
    size_t same_prefix = 0;
    for (; same_prefix < std::min(ref.outputs.size(), bf16.outputs.size()); ++same_prefix) {
      if (bf16.outputs[same_prefix] == ref.outputs[same_prefix]) continue;
      const std::vector<float>& c = ref.logits[same_prefix];
      const std::vector<float>& g = bf16.logits[same_prefix];
      ASSERT_EQ(c.size(), g.size());
      const float err = testing::max_abs_diff(c, g);
      std::vector<float> top(c);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      EXPECT_LE(top[0] - top[1], 2 * err) << set << " " << share_mode_name(mode) << ": bf16 output " << same_prefix
                                          << " differs where the CPU's margin " << top[0] - top[1]
                                          << " exceeds twice bf16's logit error " << err;
      std::printf("    bf16 parts from the CPU at generated token %zu of %zu: CPU margin %.4f, bf16 logit error %.4f\n",
                  same_prefix, ref.outputs.size(), top[0] - top[1], err);
      break;
    }
    if (same_prefix == ref.outputs.size()) EXPECT_EQ(bf16.outputs.size(), ref.outputs.size());
  }
}

// droidspeak's partial-depth catch-up (layer 0 only over positions the shared layer holds) on
// the GPU against the catch-up through every layer, on the same backend: f32 the same tokens and
// logits to rounding; bf16 the same tokens up to a near-tie that the two runs' own logit
// difference explains (their GEMMs see different row counts, so they round differently).
TEST_P(CudaEngine, DroidSpeakPartialCatchUpMatchesFullDepth) {
  REQUIRE_GPU();
  ASSERT_TRUE(std::filesystem::exists(testing::tinystories_dir())) << testing::tinystories_dir() << " is missing";
  const std::string set = GetParam();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    ReplayRun full, part;
    {
      auto g = cuda_backend(dt);
      ASSERT_TRUE(g);
      full = run_on(*g, set, ShareMode::kDroidSpeak, true, /*partial_catchup=*/false);
      part = run_on(*g, set, ShareMode::kDroidSpeak, true, /*partial_catchup=*/true);
    }
    const char* name = dt == DType::kF32 ? "f32" : "bf16";
    ASSERT_FALSE(full.outputs.empty());
    ASSERT_EQ(full.logits.size(), full.outputs.size());
    ASSERT_EQ(part.logits.size(), part.outputs.size());
    size_t same_prefix = 0;
    double worst = 0;  // largest |partial - full| logit over the rows with the same context
    for (; same_prefix < std::min(full.outputs.size(), part.outputs.size()); ++same_prefix) {
      const std::vector<float>& f = full.logits[same_prefix];
      const std::vector<float>& p = part.logits[same_prefix];
      ASSERT_EQ(f.size(), p.size());
      const float err = testing::max_abs_diff(f, p);
      worst = std::max(worst, static_cast<double>(err));
      if (part.outputs[same_prefix] == full.outputs[same_prefix]) continue;
      std::vector<float> top(f);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      EXPECT_LE(top[0] - top[1], 2 * err) << set << " " << name << ": output " << same_prefix
                                          << " differs where the full-depth margin " << top[0] - top[1]
                                          << " exceeds twice the runs' logit difference " << err;
      std::printf("    %s %s: partial parts from full depth at generated token %zu of %zu: margin %.4f, logit "
                  "difference %.4f\n",
                  set.c_str(), name, same_prefix, full.outputs.size(), top[0] - top[1], err);
      break;
    }
    std::printf("  droidspeak[0] %s %s: partial vs full-depth catch-up: %zu of %zu outputs before any parting, "
                "largest logit difference %.2e\n",
                set.c_str(), name, same_prefix, full.outputs.size(), worst);
    if (dt == DType::kF32) {
      EXPECT_EQ(part.trajectory, full.trajectory) << set << " f32";
      EXPECT_LE(worst, 1e-3) << set << " f32: logits differ beyond rounding";
    }
  }
}

// The synthetic Qwen3's adapter `name` (tests/fixtures/adapters/synthetic-qwen3; "": none, null)
// loaded for model and uploaded to be; null on failure, which it reports.
std::unique_ptr<LoraAdapter> load_qwen3_adapter(const std::string& name, LlamaModel& model, Backend& be) {
  if (name.empty()) return nullptr;
  auto a = load_lora_adapter(name, testing::fixtures_dir() + "/adapters/synthetic-qwen3/" + name, model.config());
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.error().message);
  if (!a.ok()) return nullptr;
  const Status up = upload_adapter(**a, be);
  EXPECT_TRUE(up.ok()) << (up.ok() ? "" : up.error().message);
  if (!up.ok()) return nullptr;
  return std::move(*a);
}

// Qwen3 (q_norm and k_norm before RoPE, head_dim 64 beside hidden 64, tied embeddings) on the
// GPU: generation against HF transformers + PEFT's goldens, and a replay in every sharing mode
// the adapter allows against the CPU's. f32: the goldens' tokens and the CPU's, exactly; bf16:
// agreement reported, first logits checked.
TEST(CudaQwen3, GenerateMatchesPeftAndReplayMatchesCpu) {
  REQUIRE_GPU();
  const std::string mdir = testing::fixtures_dir() + "/models/synthetic-qwen3";
  for (const std::string name : {"", "qv", "qkvo"}) {
    const auto golden = nlohmann::json::parse(testing::read_file(
        testing::fixtures_dir() + "/goldens/synthetic-qwen3" + (name.empty() ? "" : "-" + name) + ".json"));
    ASSERT_FALSE(golden["cases"].empty());
    std::vector<ReplayStep> steps(4);  // a prompt, a turn, a tool observation, a turn
    steps[0].kind = ReplayStep::Kind::kAppendTokens;
    for (int i = 0; i < 150; ++i) steps[0].tokens.push_back(3 + (i * 37) % 300);
    steps[1].kind = ReplayStep::Kind::kGenerate;
    steps[1].agent = "agent";
    steps[1].generate = 24;
    steps[2].kind = ReplayStep::Kind::kAppendTokens;
    for (int i = 0; i < 40; ++i) steps[2].tokens.push_back(5 + (i * 11) % 300);
    steps[3] = steps[1];
    std::vector<std::vector<int32_t>> cpu_traj;  // per mode
    for (int b = 0; b < 3; ++b) {
      std::unique_ptr<Backend> be = b == 0 ? make_cpu_backend(4) : cuda_backend(b == 1 ? DType::kF32 : DType::kBF16);
      ASSERT_TRUE(be);
      const char* bname = b == 0 ? "cpu" : (b == 1 ? "f32" : "bf16");
      auto model = LlamaModel::load(mdir, *be);
      ASSERT_TRUE(model.ok()) << model.error().message;
      std::unique_ptr<LoraAdapter> ad = load_qwen3_adapter(name, **model, *be);
      ASSERT_TRUE(name.empty() || ad);
      if (b > 0) {  // the goldens, as one batch of every case
        std::vector<GenerateRequest> reqs;
        for (const auto& c : golden["cases"]) {
          GenerateRequest r;
          r.prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
          r.max_tokens = static_cast<int>(c["output_tokens"].size());
          r.keep_first_logits = true;
          r.adapter = ad.get();
          reqs.push_back(std::move(r));
        }
        Generator gen(**model, EngineOptions{});
        auto res = gen.run(reqs);
        ASSERT_TRUE(res.ok()) << res.error().message;
        size_t same = 0, total = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
          const auto& c = golden["cases"][i];
          const auto want = c["output_tokens"].get<std::vector<int32_t>>();
          const double e = rel_l2((*res)[i].first_logits, c["last_logits"].get<std::vector<float>>());
          for (size_t t = 0; t < want.size() && t < (*res)[i].output.size(); ++t) same += (*res)[i].output[t] == want[t];
          total += want.size();
          if (b == 1) {
            EXPECT_EQ((*res)[i].output, want) << "qwen3 " << name << " f32 case " << i;
            EXPECT_LE(e, 1e-4) << "qwen3 " << name << " f32 case " << i;
          } else {
            EXPECT_LE(e, 5e-2) << "qwen3 " << name << " bf16 case " << i;
          }
        }
        std::printf("  qwen3 %-4s %s: %zu of %zu golden tokens\n", name.empty() ? "base" : name.c_str(), bname, same,
                    total);
      }
      int mi = 0;
      for (ShareMode mode : kAllShareModes) {
        if (name == "qkvo" && (mode == ShareMode::kBase || mode == ShareMode::kBaseLr)) continue;  // refused (k_norm)
        ReplayOptions o;
        o.sharing.mode = mode;
        o.sharing.max_tokens = 512;
        if (mode == ShareMode::kDroidSpeak) o.sharing.recompute_layers = {0};
        auto r = run_replay(**model, nullptr, {"agent"}, {ad.get()}, steps, o);
        ASSERT_TRUE(r.ok()) << bname << " " << share_mode_name(mode) << ": " << r.error().message;
        if (b == 0) {
          cpu_traj.push_back(r->trajectory);
        } else {
          const std::vector<int32_t>& ref = cpu_traj[static_cast<size_t>(mi)];
          size_t same = 0;
          for (size_t i = 0; i < std::min(ref.size(), r->trajectory.size()); ++i) same += ref[i] == r->trajectory[i];
          std::printf("  qwen3 %-4s %s replay %-10s: %zu of %zu trajectory tokens as the CPU's\n",
                      name.empty() ? "base" : name.c_str(), bname, share_mode_name(mode), same, ref.size());
          if (b == 1) EXPECT_EQ(r->trajectory, ref) << "qwen3 " << name << " f32 " << share_mode_name(mode);
        }
        ++mi;
      }
    }
  }
}

// A recorded bf16 decode step on Qwen3 holds its q/k norm for the kernel after it: the decode
// attention that rotates and stores (batch 1, no q LoRA term), or the RoPE-and-stores launch (a
// q/v adapter's q LoRA term added before the norm). Their bits are qk_norm's, so each golden
// prompt decoded alone gives the very same tokens as with the norm launched alone
// (LRAGENT_CUDA_FUSE_QK_NORM=0); the tiny random model's greedy margins (~1e-3) would turn a
// one-ulp difference into other tokens.
TEST(CudaQwen3, FusedDecodeNormsGiveTheTokensOfTheirOwnLaunches) {
  REQUIRE_GPU();
  const std::string mdir = testing::fixtures_dir() + "/models/synthetic-qwen3";
  for (const std::string name : {"", "qv"}) {
    const auto golden = nlohmann::json::parse(testing::read_file(
        testing::fixtures_dir() + "/goldens/synthetic-qwen3" + (name.empty() ? "" : "-" + name) + ".json"));
    ASSERT_FALSE(golden["cases"].empty());
    std::vector<std::vector<int32_t>> out[2];
    GraphStats stats[2];
    for (int fused = 0; fused < 2; ++fused) {
      if (fused == 0) setenv("LRAGENT_CUDA_FUSE_QK_NORM", "0", 1);
      std::unique_ptr<Backend> be = cuda_backend(DType::kBF16);
      unsetenv("LRAGENT_CUDA_FUSE_QK_NORM");  // read when the backend is made
      ASSERT_TRUE(be);
      auto model = LlamaModel::load(mdir, *be);
      ASSERT_TRUE(model.ok()) << model.error().message;
      std::unique_ptr<LoraAdapter> ad = load_qwen3_adapter(name, **model, *be);
      ASSERT_TRUE(name.empty() || ad);
      for (const auto& c : golden["cases"]) {
        GenerateRequest r;
        r.prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
        r.max_tokens = static_cast<int>(c["output_tokens"].size());
        r.adapter = ad.get();
        Generator gen(**model, EngineOptions{});
        auto res = gen.run({r});
        ASSERT_TRUE(res.ok()) << res.error().message;
        out[fused].push_back((*res)[0].output);
      }
      stats[fused] = be->graph_stats();
    }
    const std::string what = name.empty() ? "base" : name;
    EXPECT_EQ(stats[0].fused_qk_norms, 0) << what << ": with the fusion off every norm is a launch of its own";
    EXPECT_GE(stats[1].fused_qk_norms, 32) << what << ": recorded decode steps norm q and k in the kernel after them";
    if (name.empty()) EXPECT_GE(stats[1].fused_rope_attention, 32) << "batch-1 steps without LoRA: in the attention";
    std::printf("  qwen3 %s bf16 decode: %lld norms done by the kernel after them (%lld decode attentions did RoPE "
                "and stores)\n",
                what.c_str(), static_cast<long long>(stats[1].fused_qk_norms),
                static_cast<long long>(stats[1].fused_rope_attention));
    ASSERT_EQ(out[0].size(), out[1].size());
    for (size_t i = 0; i < out[0].size(); ++i) EXPECT_EQ(out[1][i], out[0][i]) << what << " golden prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, CudaEngine, ::testing::Values("qv-shared-a-r8", "qv-indep-a-r8", "qkvo-shared-a-r4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace lragent
