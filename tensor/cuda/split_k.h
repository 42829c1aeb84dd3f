#pragma once
// Which split-K reductions Strata's GEMMs accept from cuBLASLt (Note [Split-K reductions]): the
// preference mask matmul.cpp gives the heuristic, and the check (matmul_tuning.cpp) of an
// algorithm read back from a tuning file. Host code only.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>

namespace strata::tensor::cuda {

// Note [Split-K reductions]
// A split-K algorithm sums k in slices and then adds the slices' partial products. In place
// (CUBLASLT_REDUCTION_SCHEME_INPLACE) the slices meet in D with atomics, in an order that
// changes from run to run; with OUTPUT_TYPE they are stored in D's type first, so a bf16 or f16
// output is rounded once per slice and again after the sum, two and more ulps off the one
// rounding the op promises (Note [Low-precision ops]; what the H100's bf16 weight gradients and
// biased linears of small problems showed, docs/perf/2026-11-26-h100.md). Only COMPUTE_TYPE (f32
// partials in the workspace, added in a fixed order, rounded once) and no split at all are
// allowed, for the heuristic and for algorithms read from a tuning file.
inline constexpr uint32_t kReductionSchemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;

// Whether `algo` sums split-K slices only in a way Note [Split-K reductions] allows.
inline bool reduction_allowed(const cublasLtMatmulAlgo_t& algo) {
  uint32_t scheme = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme), &written) != CUBLAS_STATUS_SUCCESS)
    return false;
  return (scheme & ~kReductionSchemes) == 0;
}

}  // namespace strata::tensor::cuda
