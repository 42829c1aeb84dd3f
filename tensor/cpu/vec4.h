#pragma once
// 4-lane vector helpers for the softmax-shaped CPU kernels (softmax, attention, cross-entropy):
// a vectorised expf and the row reductions around it.
//
// Note [Vectorised exp]
// glibc's expf is an opaque call, so a loop calling it stays scalar, and a softmax over a 50k
// vocabulary or an attention score tile then spends most of its time in exp. Writing a
// branch-free exp and hoping GCC vectorises the loop does not work either: under the default
// -ftrapping-math a float compare may trap, so GCC will not if-convert the clamps. So exp4 works
// on GCC vector-extension values (4 lanes: SSE2/NEON width, so no ABI change on any x86-64),
// where compares are lane masks. It is Cephes' expf: Cody-Waite reduction by ln 2 and a degree-6
// polynomial, within 2 ulp of the true value.
// Each lane's result depends only on that lane's input, so tails (run through a padded vector)
// and every caller get identical bits for identical arguments. Forward and backward kernels use
// the same function, so probabilities recomputed in backward agree with the forward's to
// rounding.
// Arguments <= -88 (and -inf) give exactly 0, results that would be subnormal may flush to 0,
// and arguments above 88 are clamped (+inf gives a large finite value): callers pass
// max-subtracted, non-positive arguments. NaN stays NaN.
#include <cstdint>
#include <cstring>

namespace strata::tensor::cpu {

typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));

inline F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store4(float* p, F4 v) {
  std::memcpy(p, &v, sizeof(v));
}
inline F4 splat4(float x) {
  return F4{x, x, x, x};
}

__attribute__((always_inline)) inline F4 exp4(F4 x) {
  x = x > 88.0f ? splat4(88.0f) : x;
  // At -88 the exponent n below is -127, whose bit pattern (n + 127) << 23 is 0.0f.
  x = x < -88.0f ? splat4(-88.0f) : x;
  // n = floor(x / ln2 + 0.5); the +128 keeps the value positive so truncation floors.
  const I4 n = __builtin_convertvector(x * 1.44269504088896341f + 128.5f, I4) - 128;
  const F4 fn = __builtin_convertvector(n, F4);
  // r = x - n ln2, with ln2 split in two so that n * hi is exact.
  F4 r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  F4 p = splat4(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * reinterpret_cast<F4>((n + 127) << 23);
}

inline float exp_fast(float x) {
  return exp4(splat4(x))[0];
}

// y[i] = exp(a * x[i] - b) for i < n (x and y may be the same array).
inline void exp_affine(const float* x, float* y, int64_t n, float a, float b) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) store4(y + i, exp4(load4(x + i) * a - b));
  if (i < n) {
    float tmp[4] = {};
    std::memcpy(tmp, x + i, static_cast<size_t>(n - i) * sizeof(float));
    store4(tmp, exp4(load4(tmp) * a - b));
    std::memcpy(y + i, tmp, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// max_i x[i] (-inf for n = 0). Max is exact in any order, so lanes change no bits; written
// with vectors because GCC leaves `omp simd reduction(max)` over floats scalar.
inline float max_row(const float* x, int64_t n) {
  float m = -__builtin_inff();
  int64_t i = 0;
  if (n >= 4) {
    F4 acc = load4(x);
    for (i = 4; i + 4 <= n; i += 4) {
      const F4 v = load4(x + i);
      acc = v > acc ? v : acc;
    }
    for (int l = 0; l < 4; ++l) m = acc[l] > m ? acc[l] : m;
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum_i exp(x[i] - b), accumulated per lane in float over blocks of 256 and across blocks in
// double: a fixed order, and accurate enough for a 50k-wide softmax denominator.
inline double sum_exp_shifted(const float* x, int64_t n, float b) {
  double lanes[4] = {};
  int64_t i = 0;
  while (i + 4 <= n) {
    F4 acc{};
    const int64_t end = i + 256 < n ? i + 256 : n;
    for (; i + 4 <= end; i += 4) acc += exp4(load4(x + i) - b);
    for (int l = 0; l < 4; ++l) lanes[l] += acc[l];
  }
  if (i < n) {
    float tmp[4];
    exp_affine(x + i, tmp, n - i, 1.0f, b);
    for (int64_t l = 0; l < n - i; ++l) lanes[l] += tmp[l];
  }
  double s = 0;
  for (double v : lanes) s += v;
  return s;
}

}  // namespace strata::tensor::cpu
