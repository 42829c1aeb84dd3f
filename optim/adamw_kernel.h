#pragma once
// The AdamW update over flat fp32 buffers: one scalar and two SIMD implementations with
// identical rounding, picked at run time.
//
// Note [AdamW arithmetic]
// The update follows torch.optim.AdamW (foreach=False, capturable=False) operation by operation,
// so every element sees the same float roundings in the same order:
//   p = p * decay_factor                       decay_factor = 1 - lr * weight_decay   (double)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + ((1 - beta2) * g) * g      addcmul's order
//   denom = sqrt(v) / bias_correction2_sqrt + eps
//   p = p - (step_size * m) / denom             step_size = lr / (1 - beta1^t)           (double)
// with bias_correction2_sqrt = sqrt(1 - beta2^t). The per-step scalars are computed once in
// double, like PyTorch computes them in Python floats, then rounded to float (AdamWScalars) and
// shared by every implementation. Element-wise, each step is an IEEE float multiply, add, divide
// or square root, which SSE/AVX/AVX-512 round exactly like scalar code; no step is fused into an
// FMA anywhere (-ffp-contract=off on the kernel files, separate mul/add intrinsics), so the
// SIMD kernels are bitwise equal to the scalar one. (Current PyTorch writes the m update as
// lerp(m, g, 1 - beta1) = m + (1 - beta1) * (g - m); the two forms can differ in the last bit
// of m. We keep the textbook form above.)
//
// Note [ISA-specific translation units]
// adamw_kernel_avx2.cpp and adamw_kernel_avx512.cpp are compiled with -mavx2 / -mavx512f and
// everything else with baseline x86-64 flags. Any inline function or template that such a file
// instantiates out of line (std::min, a header's inline helper) is a COMDAT symbol the linker may
// pick for *all* callers, which would then execute AVX-512 code on a CPU without it. So those
// files use only intrinsics, builtins and functions with internal linkage, and expose exactly one
// extern entry point each, reached only after a CPUID check (adamw_isa_available).
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace strata::optim {

enum class Isa : uint8_t { Scalar, Avx2, Avx512 };

std::string_view isa_name(Isa isa);
// "scalar", "avx2", "avx512"; strata::user_error on anything else.
Isa parse_isa(std::string_view name);
// Whether this build has the kernel and this CPU (and OS) can run it.
bool adamw_isa_available(Isa isa);
// The widest available ISA, unless the environment variable STRATA_ADAMW_ISA names one (for
// tests and benchmarks); a forced ISA the CPU lacks is a user_error. Read once per process.
Isa default_adamw_isa();

// One buffer set: element i of every pointer belongs to the same parameter element.
struct AdamWBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // Optional "model copy": the updated param rounded to low_precision_dtype (BF16 or F16,
  // round-to-nearest-even as core/half.h) and written here. Null for none.
  void* low_precision = nullptr;
  DType low_precision_dtype = DType::BF16;
  int64_t numel = 0;
};

// The per-step scalars of Note [AdamW arithmetic], already rounded to float.
struct AdamWScalars {
  float decay_factor = 1.f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float step_size = 0.f;
  float bias_correction2_sqrt = 1.f;
  float eps = 1e-8f;
};

// `step` is 1 for the first update (PyTorch increments before computing bias corrections).
AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                           int64_t step);

// Updates all `b.numel` elements in place with `isa` (which must be available), in parallel
// over fixed chunks of kAdamWChunk elements (OpenMP). The result does not depend on the thread
// count.
void adamw_update(const AdamWBuffers& b, const AdamWScalars& s, Isa isa);
inline constexpr int64_t kAdamWChunk = int64_t{1} << 15;

namespace detail {
// Per-ISA kernels over [begin, end) (see Note [ISA-specific translation units]).
void adamw_range_scalar(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end);
void adamw_range_avx2(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end);
void adamw_range_avx512(const AdamWBuffers& b, const AdamWScalars& s, int64_t begin, int64_t end);
}  // namespace detail

}  // namespace strata::optim
