#pragma once
// What the GPU optimizer steps share (Note [CUDA AdamW] in adamw_cuda.h, Note [CUDA SGD] in
// sgd_cuda.h): gradients widened from F32/BF16/F16 on load, the updated parameter rounded into
// an optional BF16/F16 (or F32) model copy, both one element or four at a time, and the launch
// loop that packs up to kMaxTensors buffers into one kernel's parameter block.
//
// Tensors are packed into the kernel's parameters kMaxTensors at a time (like PyTorch's
// multi_tensor_apply, without its chunk table): blockIdx.y picks the tensor, and the blocks along
// x walk its elements with a grid-stride loop. Short tensors leave some blocks idle; the step is
// memory-bound and one launch per ~kMaxTensors buffers is what matters. A thread updates four
// consecutive elements with vector loads when the buffers are 16-byte aligned (always, for the
// engine's flat buffers), else one element at a time. Dtypes are strata::DType numbers
// (F32 = 0, BF16 = 1, F16 = 2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cuda/launch.cuh"

namespace strata::optim::cuda {

// kMaxTensors * 64 bytes + scalars: well under the 4 KiB limit on a kernel's parameters.
constexpr int kMaxTensors = 32;
constexpr int kStepThreads = 256;
constexpr int kMaxStepBlocksX = 1024;

__device__ __forceinline__ float load_grad(const void* p, int dtype, int64_t i) {
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dtype == 2) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store_copy(void* p, int dtype, int64_t i, float v) {
  if (dtype == 1) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else if (dtype == 2) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Elements 4k .. 4k+3 of a gradient: one 128-bit load in F32, one 64-bit load in BF16/F16.
__device__ __forceinline__ float4 load_grad4(const void* p, int dtype, int64_t k) {
  if (dtype == 0) return static_cast<const float4*>(p)[k];
  const uint2 raw = static_cast<const uint2*>(p)[k];  // four 16-bit values
  const uint16_t h[4] = {static_cast<uint16_t>(raw.x), static_cast<uint16_t>(raw.x >> 16),
                         static_cast<uint16_t>(raw.y), static_cast<uint16_t>(raw.y >> 16)};
  float f[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (dtype == 1) {
      __nv_bfloat16_raw r;
      r.x = h[e];
      f[e] = __bfloat162float(__nv_bfloat16(r));
    } else {
      __half_raw r;
      r.x = h[e];
      f[e] = __half2float(__half(r));
    }
  }
  return make_float4(f[0], f[1], f[2], f[3]);
}

// Elements 4k .. 4k+3 of a model copy, each rounded to nearest even, in one store.
__device__ __forceinline__ void store_copy4(void* p, int dtype, int64_t k, float4 v) {
  if (dtype == 0) {
    static_cast<float4*>(p)[k] = v;
    return;
  }
  const float f[4] = {v.x, v.y, v.z, v.w};
  uint16_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (dtype == 1) {
      const __nv_bfloat16_raw r = __float2bfloat16_rn(f[e]);
      h[e] = r.x;
    } else {
      const __half_raw r = __float2half_rn(f[e]);
      h[e] = r.x;
    }
  }
  static_cast<uint2*>(p)[k] =
      make_uint2(static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16),
                 static_cast<uint32_t>(h[2]) | (static_cast<uint32_t>(h[3]) << 16));
}

inline bool valid_float_dtype(int d) {
  return d == 0 || d == 1 || d == 2;
}

// The tensors' kernel arguments, kMaxTensors of them per launch.
template <typename TensorArgs>
struct LaunchArgs {
  TensorArgs t[kMaxTensors];
};

// Fills LaunchArgs<TensorArgs> from list[first, first + n) with to_args(in) and calls
// launch(grid, args) once per group of kMaxTensors (skipping groups with no elements), the grid
// wide enough for the longest tensor at four elements per thread. Returns 0, -1 when a gradient
// or model-copy dtype is not F32/BF16/F16 (nothing enqueued), or the cudaError_t of the first
// failed launch. `In` has numel, grad_dtype, model_copy and copy_dtype.
template <typename TensorArgs, typename In, typename ToArgs, typename Launch>
int launch_in_groups(const In* list, int count, ToArgs to_args, Launch launch) {
  for (int i = 0; i < count; ++i) {
    if (!valid_float_dtype(list[i].grad_dtype)) return -1;
    if (list[i].model_copy != nullptr && !valid_float_dtype(list[i].copy_dtype)) return -1;
  }
  for (int first = 0; first < count; first += kMaxTensors) {
    const int n = std::min(kMaxTensors, count - first);
    LaunchArgs<TensorArgs> args{};
    int64_t longest = 0;
    for (int j = 0; j < n; ++j) {
      args.t[j] = to_args(list[first + j]);
      longest = std::max(longest, list[first + j].numel);
    }
    if (longest == 0) continue;
    const int64_t want = ((longest + 3) / 4 + kStepThreads - 1) / kStepThreads;
    launch(dim3(static_cast<unsigned>(std::min<int64_t>(want, kMaxStepBlocksX)),
                static_cast<unsigned>(n)),
           args);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

}  // namespace strata::optim::cuda
