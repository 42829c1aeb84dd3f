#pragma once
// 4-lane vector math for the CPU kernels: exp, tanh and sigmoid (softmax, attention,
// cross-entropy, and the elementwise GELU/SiLU/exp/tanh with their backward), and the row
// reductions around a softmax.
//
// Note [Vectorised exp]
// glibc's expf/tanhf are opaque scalar calls (short of -ffast-math, which Strata does not use: it
// would let the compiler reorder sums), so a loop calling them stays scalar, and a softmax over a
// 50k vocabulary, an attention score tile or a GELU then spends most of its time there. A
// branch-free scalar exp left to the auto-vectoriser is fragile: under the default
// -ftrapping-math GCC will not if-convert float compares, so the selects must be integer masks,
// and even then GCC 12 vectorises the calling loop at -O3 but not at -O2 (RelWithDebInfo), with
// nothing to say when it stops. So the math works on GCC vector-extension values (4 lanes:
// SSE2/NEON width, so no ABI change on any x86-64), where compares are lane masks, and these are
// the only exp, tanh and sigmoid in the CPU backend.
//   exp4:  Cephes' expf: n = round(x / ln2), r = x - n ln2 (Cody-Waite: ln2 split in two so that
//          n * hi is exact), a degree-6 polynomial in r, times 2^n. Within 1 ulp wherever the
//          result is normal (checked over all floats); exactly 0 for x below about -87 (results
//          under 2^-125.5, ~1.7e-38, are flushed, so none is subnormal, and -inf gives 0); +inf
//          above ln(FLT_MAX); NaN stays NaN.
//   tanh4: Cephes' tanhf: an odd polynomial for |x| < 0.625, so relative accuracy holds near 0
//          (tiny x gives x itself) where 1 - 2/(e^2|x| + 1) would cancel; that form above.
//          Within 1.5 ulp. tanh4_sech2 also gives sech^2 = 1 - tanh^2, from q = 2/(e^2|x| + 1) as
//          q (2 - q) so it does not cancel for large |x|, for backward.
//   sigmoid4: 1 / (1 + exp4(-x)); 0, not NaN, for very negative x.
// Only IEEE +, -, *, / and integer ops are used, so the bits do not depend on the CPU as long as
// nothing is fused into FMAs: true for the baseline x86-64 target, while a build with FMA enabled
// (-march=native) also needs -ffp-contract=off, as optim/ uses. Each lane's result depends only
// on that lane's input: loops run tails through a zero-padded vector, so an element gets the same
// bits at every position, under every split across threads, and in every caller (forward and
// backward agree, so probabilities recomputed in backward match the forward's to rounding).
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

// Note [Vectorised exp].
__attribute__((always_inline)) inline F4 exp4(F4 x) {
  // The clamps only pick an n whose scale below is 0 (n = -126) or inf (n = 129). NaN passes
  // them and makes r, so the result, NaN (its n is meaningless but harmless).
  x = x > 89.5f ? splat4(89.5f) : x;
  x = x < -87.5f ? splat4(-87.5f) : x;
  // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer, which is then the low bits of t.
  constexpr float kRound = 12582912.0f;
  const F4 t = x * 1.44269504088896341f + kRound;
  const F4 fn = t - kRound;
  const I4 n = reinterpret_cast<I4>(t) - reinterpret_cast<I4>(splat4(kRound));
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
  // 2^n as 2 * 2^(n-1): the bit pattern of 2^(n-1) is 0.0f at n = -126 and +inf at n = 129,
  // and 2^127 reaches results up to FLT_MAX (n = 128). Both products are exact for finite
  // results: 2p lies in [1.41, 2.83] and 2^(n-1) >= 2^-126, so nothing passes through a subnormal.
  return p * 2.0f * reinterpret_cast<F4>((n + 126) << 23);
}

// tanh(u) and sech^2(u) = 1 - tanh^2(u) (Note [Vectorised exp]).
struct TanhSech2 {
  F4 t, s2;
};
__attribute__((always_inline)) inline TanhSech2 tanh4_sech2(F4 u) {
  const I4 sign = reinterpret_cast<I4>(u) & INT32_MIN;
  const F4 au = reinterpret_cast<F4>(reinterpret_cast<I4>(u) & 0x7fffffff);
  // |u| < 0.625: Cephes' polynomial in u^2.
  const F4 z = u * u;
  F4 p = splat4(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const F4 t_small = p * z * u + u;
  // Otherwise, with q = 2 / (e^{2|u|} + 1): tanh|u| = 1 - q and sech^2 = q (2 - q).
  const F4 q = 2.0f / (exp4(au + au) + 1.0f);
  const F4 t_big = reinterpret_cast<F4>(reinterpret_cast<I4>(1.0f - q) | sign);
  // NaN fails the compare and makes q NaN, so both results come out NaN.
  const I4 small = au < 0.625f;
  return {small ? t_small : t_big, small ? 1.0f - t_small * t_small : q * (2.0f - q)};
}

__attribute__((always_inline)) inline F4 tanh4(F4 u) {
  return tanh4_sech2(u).t;
}

__attribute__((always_inline)) inline F4 sigmoid4(F4 x) {
  return 1.0f / (1.0f + exp4(-x));
}

// exp4 of one value, for scalars next to vector loops (same bits as a lane of exp4).
inline float exp1(float x) {
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
