#pragma once
// Helpers shared by the GPU optimizer tests (adamw_cuda_test.cpp, host_offload_cuda_test.cpp):
// random parameter-like inputs, a bitwise comparison (both promise the CPU's bits), and the skip
// of a test when no GPU is visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "tensor/cuda.h"
#include "tensor/ops.h"

namespace strata::optim::cuda_test {

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

// n values uniform in [lo, hi): stream `stream` of the generator seeded with `seed` (each test
// file passes its own, so its inputs do not depend on another file's).
inline tensor::Tensor rnd(uint64_t seed, int64_t n, uint64_t stream, float lo, float hi) {
  return tensor::uniform({n}, {seed, stream}, lo, hi);
}

inline bool same_bits(const tensor::Tensor& a, const tensor::Tensor& b) {
  const tensor::Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.dtype() == y.dtype() && x.numel() == y.numel() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace strata::optim::cuda_test
