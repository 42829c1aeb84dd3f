// AVX2 AdamW kernel (compiled with -mavx2 -mf16c -ffp-contract=off). Same float operations in the
// same order as adamw_kernel_scalar.cpp (Note [AdamW arithmetic]); explicit mul then add, never
// FMA. Only intrinsics and internal-linkage functions here (Note [ISA-specific translation
// units]).
#include <immintrin.h>

#include "optim/adamw_kernel.h"

namespace strata::optim::detail {

namespace {

constexpr int kWidth = 8;

struct Consts {
  __m256 decay, beta1, omb1, beta2, omb2, step_size, bc2_sqrt, eps;
};

// Round-to-nearest-even to bf16 with BFloat16::from_float's NaN rule (set the quiet bit),
// leaving each result in the low half of its 32-bit lane.
inline __m256i to_bf16_lanes(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

inline __m128i to_bf16(__m256 x) {
  const __m256i lanes = to_bf16_lanes(x);
  // Results are <= 0xffff, so unsigned saturation packs them unchanged.
  return _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
}

// F16C rounds to nearest even like Float16::from_float, which however drops NaN payloads:
// canonicalise NaNs first so both give sign | 0x7e00.
inline __m128i to_f16(__m256 x) {
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 sign = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x80000000u)));
  const __m256 qnan = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_cvtps_ph(_mm256_blendv_ps(x, qnan, is_nan),
                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <DType kOut>
inline void step8(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, uint16_t* lp,
                  const Consts& c) {
  const __m256 g = _mm256_loadu_ps(grad);
  __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param), c.decay);
  const __m256 m =
      _mm256_add_ps(_mm256_mul_ps(c.beta1, _mm256_loadu_ps(exp_avg)), _mm256_mul_ps(c.omb1, g));
  const __m256 v = _mm256_add_ps(_mm256_mul_ps(c.beta2, _mm256_loadu_ps(exp_avg_sq)),
                                 _mm256_mul_ps(_mm256_mul_ps(c.omb2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.bc2_sqrt), c.eps);
  p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(c.step_size, m), denom));
  _mm256_storeu_ps(param, p);
  _mm256_storeu_ps(exp_avg, m);
  _mm256_storeu_ps(exp_avg_sq, v);
  if constexpr (kOut == DType::BF16) _mm_storeu_si128(reinterpret_cast<__m128i*>(lp), to_bf16(p));
  if constexpr (kOut == DType::F16) _mm_storeu_si128(reinterpret_cast<__m128i*>(lp), to_f16(p));
}

template <DType kOut>
void run(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end) {
  const Consts c{_mm256_set1_ps(s.decay_factor),          _mm256_set1_ps(s.beta1),
                 _mm256_set1_ps(s.one_minus_beta1),       _mm256_set1_ps(s.beta2),
                 _mm256_set1_ps(s.one_minus_beta2),       _mm256_set1_ps(s.step_size),
                 _mm256_set1_ps(s.bias_correction2_sqrt), _mm256_set1_ps(s.eps)};
  auto* lp = static_cast<uint16_t*>(b.low_precision);
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    step8<kOut>(b.param + i, b.grad + i, b.exp_avg + i, b.exp_avg_sq + i,
                lp == nullptr ? nullptr : lp + i, c);
  }
  if (i == end) return;
  // Tail: run the same vector code on zero-padded copies, then copy back the live elements.
  const int64_t k = end - i;
  alignas(32) float p[kWidth] = {}, g[kWidth] = {}, m[kWidth] = {}, v[kWidth] = {};
  alignas(16) uint16_t out[kWidth] = {};
  const size_t bytes = static_cast<size_t>(k) * sizeof(float);
  __builtin_memcpy(p, b.param + i, bytes);
  __builtin_memcpy(g, b.grad + i, bytes);
  __builtin_memcpy(m, b.exp_avg + i, bytes);
  __builtin_memcpy(v, b.exp_avg_sq + i, bytes);
  step8<kOut>(p, g, m, v, out, c);
  __builtin_memcpy(b.param + i, p, bytes);
  __builtin_memcpy(b.exp_avg + i, m, bytes);
  __builtin_memcpy(b.exp_avg_sq + i, v, bytes);
  if (lp != nullptr) __builtin_memcpy(lp + i, out, static_cast<size_t>(k) * sizeof(uint16_t));
}

}  // namespace

void adamw_range_avx2(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end) {
  if (b.low_precision == nullptr) return run<DType::F32>(b, s, begin, end);
  if (b.low_precision_dtype == DType::BF16) return run<DType::BF16>(b, s, begin, end);
  return run<DType::F16>(b, s, begin, end);
}

}  // namespace strata::optim::detail
