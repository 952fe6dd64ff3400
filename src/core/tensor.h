// Tensors: a dtype, a shape and strides (in elements) over memory owned elsewhere
// (TensorView) or by the tensor itself (Tensor). Row-major; strides allow slicing.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dims.h"
#include "core/dtype.h"

namespace lragent {

enum class Device : uint8_t { kCpu, kCuda };

struct TensorView {
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  Dims shape;
  Dims strides;  // in elements; empty means contiguous
  void* data = nullptr;

  TensorView() = default;
  TensorView(DType t, Dims s, void* d, Device dev = Device::kCpu);

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  Dims contiguous_strides() const;
  std::string shape_str() const;  // "[2, 3]"

  template <typename T> T* as() const { return static_cast<T*>(data); }
  float* f32() const {
    assert(dtype == DType::kF32 && "f32() on a tensor that is not F32");
    return static_cast<float*>(data);
  }
  // Rows [begin, end) of the first dimension; stays contiguous if this is.
  TensorView rows(int64_t begin, int64_t end) const;
};

// A tensor owning 64-byte aligned host memory.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType t, Dims shape);
  static Tensor zeros(DType t, Dims shape);
  static Tensor from_f32(const std::vector<float>& values, Dims shape);
  // Takes ownership of view.data, released with free_fn (device memory from a backend).
  using FreeFn = void (*)(void*);
  static Tensor adopt(TensorView view, FreeFn free_fn);

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  float* f32() const { return view_.f32(); }
  int64_t numel() const { return view_.numel(); }
  int64_t dim(int i) const { return view_.dim(i); }
  const Dims& shape() const { return view_.shape; }

 private:
  struct Free {
    Free() noexcept {}  // user-provided: GCC cannot use a nested NSDMI before the class is complete
    explicit Free(FreeFn f) noexcept : fn(f) {}
    FreeFn fn = nullptr;  // null: std::free (host memory from Tensor::empty)
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> storage_;
  TensorView view_;
};

}  // namespace lragent
