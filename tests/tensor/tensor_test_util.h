#pragma once
// Helpers for the tensor tests: reference element access that does not go through the code under
// test (no backend copy), random inputs, and running a function at several thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace strata::tensor::testing {

// Element offset (in elements, from data_ptr) of a logical index.
inline int64_t offset_of(const Tensor& t, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (int d = 0; d < t.ndim(); ++d) off += idx[d] * t.stride(d);
  return off;
}

// Logical index of the i-th element in row-major order.
inline std::vector<int64_t> unravel(const Shape& shape, int64_t i) {
  std::vector<int64_t> idx(shape.ndim());
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

// Reads element idx of an F32 tensor straight from memory.
inline float at(const Tensor& t, const std::vector<int64_t>& idx) {
  return static_cast<const float*>(t.data_ptr())[offset_of(t, idx)];
}

// All elements of an F32 tensor in logical order, read straight from memory.
inline std::vector<float> values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = at(t, unravel(t.shape(), i));
  return v;
}

// A contiguous F32 tensor holding `v`, written straight to memory.
inline Tensor make(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
  return t;
}

// Uniform values in [lo, hi), a pure function of seed.
inline Tensor rand(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  return uniform(shape, RngKey{seed, 0x7e57}, lo, hi);
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// True when the two tensors hold the same bits in logical order (F32).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape())) return false;
  std::vector<float> va = values(a), vb = values(b);
  return std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0;
}

// Runs f with OpenMP limited to each of `counts` threads, restoring the old limit after.
inline void for_thread_counts(const std::vector<int>& counts, const std::function<void(int)>& f) {
  const int old = omp_get_max_threads();
  for (int n : counts) {
    omp_set_num_threads(n);
    f(n);
  }
  omp_set_num_threads(old);
}

// Units in the last place of float x.
inline double ulp(float x) {
  const float a = std::fabs(x);
  return static_cast<double>(std::nextafter(a, INFINITY) - a);
}

}  // namespace strata::tensor::testing
