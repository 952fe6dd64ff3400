#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace lragent {

TensorView::TensorView(DType t, Dims s, void* d, Device dev) : dtype(t), device(dev), shape(s), data(d) {}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Dims TensorView::contiguous_strides() const {
  Dims st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

bool TensorView::is_contiguous() const { return strides.empty() || strides == contiguous_strides(); }

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
  assert(rank() >= 1 && begin >= 0 && begin <= end && end <= shape[0] && "rows() out of range");
  TensorView v = *this;
  v.shape[0] = end - begin;
  const int64_t row_stride = strides.empty() ? numel() / (shape[0] ? shape[0] : 1) : strides[0];
  v.data = static_cast<char*>(data) + static_cast<size_t>(begin * row_stride) * dtype_size(dtype);
  return v;
}

void Tensor::Free::operator()(void* p) const {
  if (fn) {
    fn(p);
  } else {
    std::free(p);
  }
}

Tensor Tensor::adopt(TensorView view, FreeFn free_fn) {
  Tensor out;
  out.storage_ = std::unique_ptr<void, Free>(view.data, Free{free_fn});
  out.view_ = std::move(view);
  return out;
}

Tensor Tensor::empty(DType t, Dims shape) {
  Tensor out;
  out.view_ = TensorView(t, std::move(shape), nullptr);
  size_t bytes = out.view_.nbytes();
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  out.storage_.reset(p);
  out.view_.data = p;
  return out;
}

Tensor Tensor::zeros(DType t, Dims shape) {
  Tensor out = empty(t, std::move(shape));
  std::memset(out.view_.data, 0, out.view_.nbytes());
  return out;
}

Tensor Tensor::from_f32(const std::vector<float>& values, Dims shape) {
  Tensor out = empty(DType::kF32, std::move(shape));
  assert(static_cast<size_t>(out.numel()) == values.size() && "from_f32: shape does not match values");
  std::memcpy(out.view_.data, values.data(), values.size() * 4);
  return out;
}

}  // namespace lragent
