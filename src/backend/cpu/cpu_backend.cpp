// CPU backend: OpenBLAS for GEMM, a thread pool for everything else. f32 compute.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention.h"
#include "core/thread_pool.h"

namespace lragent {
namespace {

int64_t row_stride_of(const TensorView& t) { return t.strides.empty() ? t.dim(1) : t.strides[0]; }

// Writes n f32 values as `dtype` (f32/bf16/f16).
void store_f32(DType dtype, const float* src, void* dst, size_t n) {
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    default: assert(false && "store_f32: only f32/bf16/f16 destinations");
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, bool fold_norms)
      : pool_(n_threads > 0 ? n_threads : ThreadPool::default_threads()), fold_norms_(fold_norms) {
    openblas_set_num_threads(pool_.size());
  }
  std::string name() const override { return "cpu"; }
  bool folds_rms_norm(int64_t rows) const override {
    (void)rows;
    return fold_norms_;
  }
  Device device() const override { return Device::kCpu; }

  // Out of memory is a tensor without data, as on the GPU: the forward pass reports kOutOfMemory.
  Tensor alloc(DType t, Dims shape) override {
    try {
      return Tensor::empty(t, std::move(shape));
    } catch (const std::bad_alloc&) {
      return Tensor();
    }
  }

  Tensor upload(const TensorView& host, DType dtype) override {
    assert(host.rank() >= 1 && "upload takes a tensor of rank >= 1");
    const int64_t rows = host.dim(0), cols = host.numel() / std::max<int64_t>(rows, 1);
    const int64_t ld = host.rank() == 2 ? row_stride_of(host) : cols;
    Tensor out = Tensor::empty(dtype, host.shape);
    std::vector<float> row(static_cast<size_t>(cols));  // [cols]
    const size_t esz = dtype_size(host.dtype);
    for (int64_t r = 0; r < rows; ++r) {
      convert_to_f32(host.dtype, static_cast<const char*>(host.data) + static_cast<size_t>(r * ld) * esz, row.data(),
                     row.size());
      store_f32(dtype, row.data(), static_cast<char*>(out.view().data) + static_cast<size_t>(r * cols) * dtype_size(dtype),
                row.size());
    }
    return out;
  }

  void fill_random(TensorView& t, uint64_t seed, float stddev) override {
    const int64_t n = t.numel();
    pool_.parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float v = stddev * random_normal_at(seed, static_cast<uint64_t>(i));
        store_f32(t.dtype, &v, static_cast<char*>(t.data) + static_cast<size_t>(i) * dtype_size(t.dtype), 1);
      }
    });
  }

  void fill(TensorView& t, float value) override {
    for (int64_t i = 0; i < t.numel(); ++i)
      store_f32(t.dtype, &value, static_cast<char*>(t.data) + static_cast<size_t>(i) * dtype_size(t.dtype), 1);
  }

  void copy(const TensorView& src, TensorView& dst) override {
    assert(src.is_contiguous() && dst.is_contiguous() && src.nbytes() == dst.nbytes() && "copy: shapes differ");
    std::memcpy(dst.data, src.data, src.nbytes());
  }

  void gather_rows(const TensorView& src, const int32_t* rows, int64_t n, TensorView& dst) override {
    const size_t row_bytes = static_cast<size_t>(src.numel() / std::max<int64_t>(src.dim(0), 1)) * dtype_size(src.dtype);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(dst.data) + static_cast<size_t>(i) * row_bytes,
                  static_cast<const char*>(src.data) + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  }

  Tensor to_host(const TensorView& src) override {
    Tensor out = Tensor::empty(src.dtype, src.shape);
    std::memcpy(out.view().data, src.data, src.nbytes());
    return out;
  }

  void matmul(const TensorView& x, const TensorView& w, const TensorView* bias, TensorView& y, float alpha,
              float beta) override {
    assert(x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && "matmul takes 2-D tensors");
    const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
    assert(w.dim(1) == in && y.dim(0) == n && y.dim(1) == out && "matmul shape mismatch");
    if (n == 0 || out == 0) return;
    const int64_t ldx = row_stride_of(x), ldy = row_stride_of(y), ldw = row_stride_of(w);
    if (w.dtype == DType::kF32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                  static_cast<int>(in), alpha, x.f32(), static_cast<int>(ldx), w.as<const float>(),
                  static_cast<int>(ldw), beta, y.f32(), static_cast<int>(ldy));
    } else {
      // Weights stay in their file dtype; convert a panel of rows at a time to f32.
      constexpr int64_t kPanel = 256;
      std::vector<float> panel(static_cast<size_t>(std::min(out, kPanel) * in));  // [kPanel, in]
      const size_t esz = dtype_size(w.dtype);
      for (int64_t r0 = 0; r0 < out; r0 += kPanel) {
        const int64_t rows = std::min(kPanel, out - r0);
        pool_.parallel_for(rows, 16, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r)
            convert_to_f32(w.dtype, static_cast<const char*>(w.data) + static_cast<size_t>((r0 + r) * ldw) * esz,
                           panel.data() + r * in, static_cast<size_t>(in));
        });
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
                    static_cast<int>(in), alpha, x.f32(), static_cast<int>(ldx), panel.data(),
                    static_cast<int>(in), beta, y.f32() + r0, static_cast<int>(ldy));
      }
    }
    if (bias) {
      std::vector<float> b(static_cast<size_t>(out));  // [out]
      convert_to_f32(bias->dtype, bias->data, b.data(), b.size());
      for (int64_t i = 0; i < n; ++i) {
        float* yr = y.f32() + i * ldy;
        for (int64_t j = 0; j < out; ++j) yr[j] += b[static_cast<size_t>(j)];
      }
    }
  }

  void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView& y) override {
    const int64_t n = x.dim(0), d = x.dim(1);
    std::vector<float> w(static_cast<size_t>(d));  // [d]
    convert_to_f32(weight.dtype, weight.data, w.data(), w.size());
    pool_.parallel_for(n, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float* xr = x.f32() + i * row_stride_of(x);
        float* yr = y.f32() + i * row_stride_of(y);
        float ss = 0.f;
        for (int64_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
        for (int64_t j = 0; j < d; ++j) yr[j] = w[static_cast<size_t>(j)] * (xr[j] * inv);
      }
    });
  }

  void rope(TensorView& x, const int32_t* positions, const float* inv_freq) override {
    assert(x.rank() == 3 && x.is_contiguous() && "rope takes contiguous [n, heads, head_dim]");
    const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2);
    pool_.parallel_for(n, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) cpu_rope_rows(x.f32() + i * heads * hd, heads, hd, positions[i], inv_freq);
    });
  }

  void silu_mul(const TensorView& gate, const TensorView& up, TensorView& out) override {
    const int64_t total = gate.numel();
    const float* g = gate.f32();
    const float* u = up.f32();
    float* o = out.f32();
    pool_.parallel_for(total, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
  }

  void add(TensorView& y, const TensorView& x) override {
    const int64_t total = y.numel();
    float* yp = y.f32();
    const float* xp = x.f32();
    for (int64_t i = 0; i < total; ++i) yp[i] += xp[i];
  }

  void embedding(const TensorView& table, const int32_t* ids, int n, TensorView& out) override {
    const int64_t d = table.dim(1);
    const size_t esz = dtype_size(table.dtype);
    for (int i = 0; i < n; ++i) {
      assert(ids[i] >= 0 && ids[i] < table.dim(0) && "token id out of vocabulary (validate before forward)");
      convert_to_f32(table.dtype, static_cast<const char*>(table.data) + static_cast<size_t>(ids[i] * d) * esz,
                     out.f32() + i * d, static_cast<size_t>(d));
    }
  }

  void store_rows(const TensorView& rows, const PagedView& dst, const int32_t* slots) override {
    const int64_t n = rows.dim(0), width = rows.numel() / std::max<int64_t>(n, 1);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dst.row(slots[i]), rows.f32() + i * width, static_cast<size_t>(width) * 4);  // f32 caches only
  }

  void attention(const AttentionParams& p) override { cpu_attention(p, pool_); }

 private:
  ThreadPool pool_;
  bool fold_norms_ = false;  // folds_rms_norm for every pass (make_cpu_backend)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool fold_norms) {
  return std::make_unique<CpuBackend>(n_threads, fold_norms);
}

}  // namespace lragent
