// AVX-512F AdamW kernel (compiled with -mavx512f -ffp-contract=off). Same float operations in the
// same order as adamw_kernel_scalar.cpp (Note [AdamW arithmetic]); explicit mul then add, never
// FMA; the tail is masked. Only intrinsics and internal-linkage functions here (Note
// [ISA-specific translation units]). Uses AVX-512F only (no BW/DQ/BF16): vcvtneps2bf16 would
// flush subnormals, so bf16 rounding is done with integer ops like BFloat16::from_float.
#include <immintrin.h>

#include "optim/adamw_kernel.h"

namespace strata::optim::detail {

namespace {

constexpr int kWidth = 16;

struct Consts {
  __m512 decay, beta1, omb1, beta2, omb2, step_size, bc2_sqrt, eps;
};

// bf16 bits (RNE, NaN -> quiet) in the low half of each 32-bit lane.
inline __m512i to_bf16_lanes(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(is_nan, rounded, nan);
}

// f16 bits in the low half of each 32-bit lane. NaNs are canonicalised first so the result is
// sign | 0x7e00, as Float16::from_float gives.
inline __m512i to_f16_lanes(__m512 x) {
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i qnan = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(0x80000000u)),
                                       _mm512_set1_epi32(0x7fc00000));
  const __m512 clean = _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_nan, u, qnan));
  return _mm512_cvtepu16_epi32(
      _mm512_cvtps_ph(clean, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Full vectors (kMasked false) load and store without a mask: AVX-512 masked stores are slow on
// some cores (AMD Zen 4), and the narrowing store of the model copy as a masked VPMOVDW to memory
// even more so, so it is narrowed in a register and stored as 256 bits. The tail uses masks. The
// arithmetic is the same either way.
template <DType kOut, bool kMasked>
inline void step16(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, uint16_t* lp,
                   __mmask16 mask, const Consts& c) {
  auto load = [mask](const float* x) {
    return kMasked ? _mm512_maskz_loadu_ps(mask, x) : _mm512_loadu_ps(x);
  };
  auto store = [mask](float* x, __m512 y) {
    if constexpr (kMasked) {
      _mm512_mask_storeu_ps(x, mask, y);
    } else {
      _mm512_storeu_ps(x, y);
    }
  };
  auto store_low = [mask](uint16_t* x, __m512i lanes) {
    if constexpr (kMasked) {
      _mm512_mask_cvtepi32_storeu_epi16(x, mask, lanes);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtepi32_epi16(lanes));
    }
  };
  const __m512 g = load(grad);
  __m512 p = _mm512_mul_ps(load(param), c.decay);
  const __m512 m = _mm512_add_ps(_mm512_mul_ps(c.beta1, load(exp_avg)), _mm512_mul_ps(c.omb1, g));
  const __m512 v = _mm512_add_ps(_mm512_mul_ps(c.beta2, load(exp_avg_sq)),
                                 _mm512_mul_ps(_mm512_mul_ps(c.omb2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bc2_sqrt), c.eps);
  p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(c.step_size, m), denom));
  store(param, p);
  store(exp_avg, m);
  store(exp_avg_sq, v);
  if constexpr (kOut == DType::BF16) store_low(lp, to_bf16_lanes(p));
  if constexpr (kOut == DType::F16) store_low(lp, to_f16_lanes(p));
}

template <DType kOut>
void run(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end) {
  const Consts c{_mm512_set1_ps(s.decay_factor),          _mm512_set1_ps(s.beta1),
                 _mm512_set1_ps(s.one_minus_beta1),       _mm512_set1_ps(s.beta2),
                 _mm512_set1_ps(s.one_minus_beta2),       _mm512_set1_ps(s.step_size),
                 _mm512_set1_ps(s.bias_correction2_sqrt), _mm512_set1_ps(s.eps)};
  auto* lp = static_cast<uint16_t*>(b.low_precision);
  auto at = [lp](int64_t i) { return lp == nullptr ? nullptr : lp + i; };
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth)
    step16<kOut, false>(b.param + i, b.grad + i, b.exp_avg + i, b.exp_avg_sq + i, at(i),
                        __mmask16(0xffff), c);
  if (i < end) {
    const __mmask16 mask = __mmask16((1u << (end - i)) - 1u);
    step16<kOut, true>(b.param + i, b.grad + i, b.exp_avg + i, b.exp_avg_sq + i, at(i), mask, c);
  }
}

}  // namespace

void adamw_range_avx512(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end) {
  if (b.low_precision == nullptr) return run<DType::F32>(b, s, begin, end);
  if (b.low_precision_dtype == DType::BF16) return run<DType::BF16>(b, s, begin, end);
  return run<DType::F16>(b, s, begin, end);
}

}  // namespace strata::optim::detail
