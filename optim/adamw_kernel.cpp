#include "optim/adamw_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/cpu_features.h"
#include "core/error.h"

namespace strata::optim {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (name == isa_name(isa)) return isa;
  user_error("unknown AdamW kernel ISA '{}': use scalar, avx2 or avx512", name);
}

bool adamw_isa_available(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar:
      return true;
#if defined(STRATA_OPTIM_X86)
    case Isa::Avx2:
      return f.avx2 && f.f16c;
    case Isa::Avx512:
      return f.avx512f;
#else
    case Isa::Avx2:
    case Isa::Avx512:
      return false;
#endif
  }
  return false;
}

namespace {
Isa pick_default_isa() {
  if (const char* forced = std::getenv("STRATA_ADAMW_ISA"); forced != nullptr && *forced) {
    Isa isa = parse_isa(forced);
    if (!adamw_isa_available(isa))
      user_error(
          "STRATA_ADAMW_ISA={} but this CPU or build cannot run it (CPU has: {}); unset "
          "the variable or choose another",
          forced, cpu_features().summary());
    return isa;
  }
  if (adamw_isa_available(Isa::Avx512)) return Isa::Avx512;
  if (adamw_isa_available(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}
}  // namespace

Isa default_adamw_isa() {
  static const Isa isa = pick_default_isa();
  return isa;
}

AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                           int64_t step) {
  STRATA_CHECK(step >= 1, "AdamW step {} (the first update is step 1)", step);
  const double t = static_cast<double>(step);
  AdamWScalars s;
  s.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
  s.eps = static_cast<float>(eps);
  return s;
}

void adamw_update(const AdamWBuffers& b, const AdamWScalars& s, Isa isa) {
  STRATA_CHECK(adamw_isa_available(isa), "AdamW kernel {} is not available here", isa_name(isa));
  STRATA_CHECK(b.numel >= 0 && (b.numel == 0 || (b.param && b.grad && b.exp_avg && b.exp_avg_sq)));
  STRATA_CHECK(b.low_precision == nullptr || b.low_precision_dtype == DType::BF16 ||
                   b.low_precision_dtype == DType::F16,
               "AdamW model copy must be bf16 or f16, not {}", dtype_name(b.low_precision_dtype));
  using Range = void (*)(const AdamWBuffers&, const AdamWScalars&, int64_t, int64_t);
  Range range = &detail::adamw_range_scalar;
#if defined(STRATA_OPTIM_X86)
  if (isa == Isa::Avx2) range = &detail::adamw_range_avx2;
  if (isa == Isa::Avx512) range = &detail::adamw_range_avx512;
#endif
  const int64_t n = b.numel;
  if (n <= kAdamWChunk) {  // not worth waking the thread pool
    range(b, s, 0, n);
    return;
  }
  const int64_t chunks = (n + kAdamWChunk - 1) / kAdamWChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kAdamWChunk;
    range(b, s, begin, std::min(begin + kAdamWChunk, n));
  }
}

}  // namespace strata::optim
