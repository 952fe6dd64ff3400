// Dims: the shape (or strides) of a tensor, up to kMaxRank extents held inline. A TensorView is
// copied by value through every op's host code (the model builds views per layer, the backends
// record them per launch); with std::vector extents each copy was two heap allocations, half of
// the host time of a LoRA decode step's forward code (bench/host_overhead_bench.cpp).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <vector>

namespace lragent {

class Dims {
 public:
  // Ranks past this are refused where tensors come from files (safetensors.cpp); the models here
  // use at most 4.
  static constexpr size_t kMaxRank = 8;

  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  Dims(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }  // implicit: shapes are built as vectors too
  explicit Dims(size_t n, int64_t value = 0) { resize(n, value); }
  operator std::vector<int64_t>() const { return std::vector<int64_t>(begin(), end()); }

  template <class It>
  void assign(It b, It e) {
    n_ = 0;
    for (; b != e; ++b) push_back(*b);
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }
  // Past kMaxRank: an assertion in debug builds; release builds keep the first kMaxRank (never
  // writing past the inline storage). Inputs from files are checked before (safetensors.cpp).
  void push_back(int64_t v) {
    assert(n_ < kMaxRank && "Dims holds at most kMaxRank extents");
    if (n_ < kMaxRank) d_[n_++] = v;
  }
  void resize(size_t n, int64_t value = 0) {
    assert(n <= kMaxRank && "Dims holds at most kMaxRank extents");
    if (n > kMaxRank) n = kMaxRank;
    for (size_t i = n_; i < n; ++i) d_[i] = value;
    n_ = n;
  }
  int64_t& operator[](size_t i) {
    assert(i < n_ && "Dims index out of range");
    return d_[i];
  }
  const int64_t& operator[](size_t i) const {
    assert(i < n_ && "Dims index out of range");
    return d_[i];
  }
  int64_t at(size_t i) const {
    if (i >= n_) throw std::out_of_range("Dims::at: index past the rank");
    return d_[i];
  }
  int64_t& back() { return (*this)[n_ - 1]; }
  int64_t back() const { return (*this)[n_ - 1]; }
  int64_t front() const { return (*this)[0]; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }

  friend bool operator==(const Dims& a, const Dims& b) {
    if (a.n_ != b.n_) return false;
    for (size_t i = 0; i < a.n_; ++i)
      if (a.d_[i] != b.d_[i]) return false;
    return true;
  }

 private:
  int64_t d_[kMaxRank] = {};
  size_t n_ = 0;
};

}  // namespace lragent
