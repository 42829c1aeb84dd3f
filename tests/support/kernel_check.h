#pragma once
// Helpers for testing backend kernels against double-precision references (tests only):
// random inputs, tensors from host vectors, tolerance checks that name the worst element,
// central differences in double, and running a kernel under a given OpenMP thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "tensor/tensor.h"

namespace strata::testing {

inline std::vector<float> random_normal(size_t n, uint64_t stream, float mean = 0.f,
                                        float stddev = 1.f) {
  std::vector<float> v(n);
  rng_normal(v.data(), n, {1234, stream}, mean, stddev);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// A contiguous F32 CPU tensor holding `v` (copied with memcpy: needs no backend op).
inline tensor::Tensor make_tensor(const std::vector<float>& v, const tensor::Shape& shape) {
  tensor::Tensor t = tensor::Tensor::empty(shape, DType::F32);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  if (!v.empty()) std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));  // no null
  return t;
}

// The values of an F32 CPU tensor in logical (row-major) order, read through its strides with
// no backend op (attention returns [B, T, H, D] buffers seen as [B, H, T, D]).
inline std::vector<float> values(const tensor::Tensor& t) {
  const float* p = t.data<float>();
  if (t.is_contiguous()) return std::vector<float>(p, p + t.numel());
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::vector<int64_t> idx(static_cast<size_t>(t.ndim()), 0);
  for (float& x : v) {
    int64_t off = 0;
    for (int d = 0; d < t.ndim(); ++d) off += idx[d] * t.stride(d);
    x = p[off];
    for (int d = t.ndim() - 1; d >= 0 && ++idx[d] == t.size(d); --d) idx[d] = 0;
  }
  return v;
}

// Passes when |got - want| <= atol + rtol |want| everywhere (NaN never passes); otherwise the
// message names the worst element relative to its tolerance.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<double>& want, double atol,
                                            double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = std::isnan(err) ? INFINITY : err / (atol + rtol * std::fabs(want[i]));
    if (ratio > worst) {
      worst = ratio;
      at = i;
    }
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << at << ": got " << got[at] << ", want " << want[at] << " (error "
         << std::fabs(got[at] - want[at]) << " is " << worst << "x the tolerance)";
}

// Central differences of a scalar function f(x) (x in double) for every element of x.
inline std::vector<double> finite_differences(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f(x);
    x[i] = saved - h;
    const double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Runs fn with OpenMP limited to `threads`, restoring the previous limit.
template <typename F>
auto with_threads(int threads, F fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  struct Restore {
    int n;
    ~Restore() { omp_set_num_threads(n); }
  } restore{saved};
  return fn();
}

// True when two float vectors are the same bits.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace strata::testing
