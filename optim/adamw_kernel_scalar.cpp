// The reference (portable) AdamW kernel. Compiled with -ffp-contract=off so no multiply-add is
// fused: Note [AdamW arithmetic] fixes every rounding, and the SIMD kernels reproduce them bit
// for bit. The compiler may vectorise it for the baseline ISA, which rounds the same.
#include <cmath>

#include "core/half.h"
#include "optim/adamw_kernel.h"

namespace strata::optim::detail {

namespace {

template <DType kOut>
void run(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end) {
  // The buffers never alias (they are distinct tensors); saying so lets the loop vectorise.
  float* __restrict param = b.param;
  const float* __restrict grad = b.grad;
  float* __restrict exp_avg = b.exp_avg;
  float* __restrict exp_avg_sq = b.exp_avg_sq;
  uint16_t* __restrict lp = static_cast<uint16_t*>(b.low_precision);
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i];
    float p = param[i] * s.decay_factor;
    const float m = s.beta1 * exp_avg[i] + s.one_minus_beta1 * g;
    const float v = s.beta2 * exp_avg_sq[i] + (s.one_minus_beta2 * g) * g;
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    p = p - (s.step_size * m) / denom;
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (kOut == DType::BF16) lp[i] = BFloat16::from_float(p);
    if constexpr (kOut == DType::F16) lp[i] = Float16::from_float(p);
  }
}

}  // namespace

void adamw_range_scalar(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end) {
  if (b.low_precision == nullptr) return run<DType::F32>(b, s, begin, end);
  if (b.low_precision_dtype == DType::BF16) return run<DType::BF16>(b, s, begin, end);
  return run<DType::F16>(b, s, begin, end);
}

}  // namespace strata::optim::detail
