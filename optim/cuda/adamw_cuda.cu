// The fused multi-tensor AdamW kernel (Note [CUDA AdamW] in adamw_cuda.h).
//
// Tensors are packed into the kernel's parameter block kMaxTensors at a time (like PyTorch's
// multi_tensor_apply, without its chunk table): blockIdx.y picks the tensor, and the blocks along
// x walk its elements with a grid-stride loop. Short tensors leave some blocks idle; the step is
// memory-bound and one launch per ~kMaxTensors buffers is what matters.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "optim/cuda/adamw_cuda.h"
#include "tensor/cuda/launch.cuh"

namespace strata::optim::cuda {

namespace {

constexpr int kMaxTensors = 32;  // 32 * 64 bytes + scalars: well under the 4 KiB parameter limit
constexpr int kThreads = 256;
constexpr int kMaxBlocksX = 1024;

struct TensorArgs {
  float* param;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* copy;
  int64_t numel;
  int grad_dtype;
  int copy_dtype;
  int weight_decay;
};

struct LaunchArgs {
  TensorArgs t[kMaxTensors];
};

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

__global__ void adamw_kernel(LaunchArgs args, AdamWCudaScalars s) {
  const TensorArgs& t = args.t[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < t.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    // Note [AdamW arithmetic], one IEEE operation per intrinsic, in the CPU kernel's order.
    const float g = __fmul_rn(load_grad(t.grad, t.grad_dtype, i), s.grad_scale);
    float p = t.param[i];
    if (t.weight_decay) p = __fmul_rn(p, s.decay_factor);
    const float m = __fadd_rn(__fmul_rn(s.beta1, t.exp_avg[i]), __fmul_rn(s.one_minus_beta1, g));
    const float v = __fadd_rn(__fmul_rn(s.beta2, t.exp_avg_sq[i]),
                              __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
    t.param[i] = p;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    if (t.copy != nullptr) store_copy(t.copy, t.copy_dtype, i, p);
  }
}

bool valid_float_dtype(int d) {
  return d == 0 || d == 1 || d == 2;
}

}  // namespace

int launch_adamw_multi_tensor(const AdamWCudaTensor* list, int count, const AdamWCudaScalars& s,
                              void* stream) {
  for (int i = 0; i < count; ++i) {
    if (!valid_float_dtype(list[i].grad_dtype)) return -1;
    if (list[i].model_copy != nullptr && !valid_float_dtype(list[i].copy_dtype)) return -1;
  }
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  for (int first = 0; first < count; first += kMaxTensors) {
    const int n = std::min(kMaxTensors, count - first);
    LaunchArgs args{};
    int64_t longest = 0;
    for (int j = 0; j < n; ++j) {
      const AdamWCudaTensor& in = list[first + j];
      args.t[j] = {in.param, in.grad,       in.exp_avg,    in.exp_avg_sq,          in.model_copy,
                   in.numel, in.grad_dtype, in.copy_dtype, in.weight_decay ? 1 : 0};
      longest = std::max(longest, in.numel);
    }
    if (longest == 0) continue;
    const int64_t want = (longest + kThreads - 1) / kThreads;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(want, kMaxBlocksX)),
                    static_cast<unsigned>(n));
    STRATA_LAUNCH(grid, kThreads, 0, st, adamw_kernel)(args, s);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

}  // namespace strata::optim::cuda
