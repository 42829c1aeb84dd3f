#pragma once
// exp, tanh and sigmoid written so a loop calling them vectorises (no libm calls, no branches).
//
// Note [Vectorisable math]
// glibc's expf/tanhf are scalar calls unless built with -ffast-math, which Strata does not use
// (it would let the compiler reorder sums and break Note [Backend contract]). These are the
// Cephes single-precision algorithms with their branches turned into selects:
//   exp_f:  exp(x) = 2^n * exp(r), n = round(x / ln2), |r| <= ln2/2, degree-6 polynomial;
//           max relative error ~2 ulp; 0 below ln(FLT_MIN) (no subnormal results), inf above
//           ln(FLT_MAX), NaN stays NaN.
//   tanh_f: odd polynomial for |x| < 0.625, 1 - 2/(exp(2|x|) + 1) above; ~2 ulp.
// Only IEEE +, -, *, / and integer ops are used, so the results are the same bits at every
// vector width (and on every x86 CPU), as long as nothing is fused into FMAs.
#include <bit>
#include <cstdint>
#include <limits>

namespace strata::tensor::cpu {

// c ? a : b with both sides computed. Written with integer masks because GCC (with the default
// -ftrapping-math) sinks the work of a float `?:` into a branch and then cannot vectorise it.
inline float select_f(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

inline float exp_f(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln2 split in two so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMax = 88.72283905206835f;   // ln(FLT_MAX)
  constexpr float kMin = -87.33654475055310f;  // ln(FLT_MIN)
  constexpr float kRound = 12582912.f;         // 1.5 * 2^23: adding it rounds to an integer
  const float xc = select_f(x < kMin, kMin, select_f(x > kMax, kMax, x));
  const float fn = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - fn * kLn2Hi) - fn * kLn2Lo;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = (p * z + r) + 1.0f;
  // 2^n as two factors: n reaches 128 at the top and -126 at the bottom of the range.
  const int32_t n = static_cast<int32_t>(fn);
  const int32_t n1 = n >> 1, n2 = n - n1;
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(n2 + 127) << 23);
  float res = (y * s1) * s2;
  res = select_f(x < kMin, 0.f, res);
  return select_f(x > kMax, std::numeric_limits<float>::infinity(), res);
}

// Sets t = tanh(u) and s2 = 1 - tanh(u)^2 (sech^2, computed without cancellation for large |u|).
inline void tanh_sech2_f(float u, float& t, float& s2) {
  const float au = std::bit_cast<float>(std::bit_cast<uint32_t>(u) & 0x7fffffffu);
  const uint32_t sign = std::bit_cast<uint32_t>(u) & 0x80000000u;
  // |u| < 0.625: Cephes tanhf polynomial.
  const float z = u * u;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float t_small = (p * z) * u + u;
  // Otherwise: with q = 2 / (e^{2|u|} + 1), tanh|u| = 1 - q and sech^2 = q (2 - q).
  const float q = 2.f / (exp_f(au + au) + 1.f);
  const float t_big = std::bit_cast<float>(std::bit_cast<uint32_t>(1.f - q) | sign);
  const bool small = au < 0.625f;
  t = select_f(small, t_small, t_big);
  s2 = select_f(small, 1.f - t_small * t_small, q * (2.f - q));
  // NaN: au < 0.625 is false and q is NaN, so both come out NaN.
}

inline float tanh_f(float u) {
  float t, s2;
  tanh_sech2_f(u, t, s2);
  return t;
}

inline float sigmoid_f(float x) {
  return 1.f / (1.f + exp_f(-x));
}

}  // namespace strata::tensor::cpu
