#pragma once
// Shape: a small inline vector of dimensions (no heap), also used for strides.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata::tensor {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  // Negative indices count from the back, like Python.
  int64_t at(int i) const { return d_[normalize(i)]; }
  int normalize(int i) const {
    int j = i < 0 ? i + ndim_ : i;
    STRATA_CHECK(j >= 0 && j < ndim_, "dim {} out of range for {}-d shape {}", i, ndim_, str());
    return j;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= d_[i];
    return n;
  }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + ndim_; }
  int64_t back() const { return d_[ndim_ - 1]; }

  void push_back(int64_t v) {
    STRATA_CHECK(ndim_ < kMaxDims, "more than {} dims", kMaxDims);
    d_[ndim_++] = v;
  }
  void insert(int pos, int64_t v);
  void erase(int pos);
  void resize(int n, int64_t fill = 0) {
    STRATA_CHECK(n >= 0 && n <= kMaxDims, "more than {} dims", kMaxDims);
    for (int i = ndim_; i < n; ++i) d_[i] = fill;
    ndim_ = static_cast<int8_t>(n);
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;

  bool operator==(const Shape& o) const {
    if (ndim_ != o.ndim_) return false;
    for (int i = 0; i < ndim_; ++i)
      if (d_[i] != o.d_[i]) return false;
    return true;
  }

  // Row-major (C-order) strides for this shape.
  Shape contiguous_strides() const;

 private:
  template <typename It>
  void assign(It b, It e) {
    ndim_ = 0;
    for (; b != e; ++b) push_back(*b);
  }
  std::array<int64_t, kMaxDims> d_{};
  int8_t ndim_ = 0;
};

// Broadcast two shapes NumPy-style; throws UserError when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace strata::tensor
