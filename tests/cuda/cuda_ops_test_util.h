#pragma once
// Helpers shared by the CUDA-against-CPU op tests (cuda_ops_test.cpp,
// cuda_ops_reduce_norm_test.cpp, cuda_ops_embedding_loss_test.cpp): random inputs, the
// low-precision tolerances, dtype names in messages, and inputs whose rows are not 16-byte aligned
// on the device. Every test skips itself when no GPU is visible (SKIP_WITHOUT_GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tests/support/norm_into_check.h"
#include "tests/support/op_table.h"

#if defined(STRATA_CUDA_EMULATION)
#include "cuda_emu/control.h"
#endif

namespace strata::tensor::cuda_ops_test {

inline const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

inline Tensor rnd(const Shape& s, uint64_t stream, float lo = -2.f, float hi = 2.f) {
  return uniform(s, {42, stream}, lo, hi);
}

// The tolerance of a BF16/F16 output against the CPU backend's BF16/F16 output on the same
// inputs: both round the f32 result once, so they differ by at most one ulp of the output dtype
// (rel 2^-7 for bf16, 2^-10 for f16) plus the f32 rounding noise of a different summation order,
// which only shows near 0 (atol).
struct Tol {
  double rtol, atol;
};
inline Tol lowp_tol(DType dt) {
  return dt == DType::BF16 ? Tol{1.0 / 128, 1e-3} : Tol{1.0 / 1024, 1e-4};
}

inline std::string dtype_tag(DType dt) {
  return dt == DType::F32 ? "f32" : dt == DType::BF16 ? "bf16" : "f16";
}

inline constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// The same values one element into a GPU buffer, in t's shape: every stride as in a contiguous
// tensor, but the start (and so every row) not 16-byte aligned.
inline Tensor shifted_on_gpu(const Tensor& t) {
  const Tensor flat = t.reshape({t.numel()});
  Tensor v =
      concat({flat.narrow(0, 0, 1), flat}, 0).to(kGpu).narrow(0, 1, t.numel()).view(t.shape());
  EXPECT_NE(reinterpret_cast<uintptr_t>(v.data_ptr()) % 16, 0u);
  return v;
}

}  // namespace strata::tensor::cuda_ops_test
