#pragma once
// What copy_fill.cu and elementwise.cu share: the block size of their 1-D kernels, the grid-stride
// loop, the contiguity test of a kernel view and the grid of a contiguous (packed) kernel.
#include <cstdint>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

inline constexpr int kThreads = 256;

#define STRATA_GRID_LOOP(i, n)                                              \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// Row-major contiguous (size-1 dims may have any stride).
inline bool contiguous(const Strided& v) {
  int64_t expect = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    if (v.shape[d] != 1 && v.strides[d] != expect) return false;
    expect *= v.shape[d];
  }
  return true;
}

// Threads for a contiguous kernel over n elements, `vec` packs of N plus a scalar tail.
template <typename T>
inline int grid_for(int64_t n, bool vec) {
  constexpr int N = Pack<T>::kN;
  return blocks_for(vec ? n / N + n % N : n, kThreads);
}

}  // namespace strata::tensor::cuda
