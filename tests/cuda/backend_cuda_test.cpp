// The CUDA backend against the CPU backend, op by op (ggml's test-backend-ops idea), at awkward
// sizes, in both CUDA dtypes: GEMM/GEMV, norms, elementwise ops, LoRA expands, RoPE, argmax,
// random fills, the stores. Attention: backend_cuda_attention_test.cpp; the whole engine
// (replay in every sharing mode, GPU vs CPU greedy tokens): engine_cuda_test.cpp.
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
using testing::host_values;
using testing::nan_host;
using testing::random_host;
using testing::rel_l2;
using testing::tol;

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
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace lragent
