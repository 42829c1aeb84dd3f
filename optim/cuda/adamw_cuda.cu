// The fused multi-tensor AdamW kernel (Note [CUDA AdamW] in adamw_cuda.h).
//
// Tensors are packed into the kernel's parameter block kMaxTensors at a time (like PyTorch's
// multi_tensor_apply, without its chunk table): blockIdx.y picks the tensor, and the blocks along
// x walk its elements with a grid-stride loop. Short tensors leave some blocks idle; the step is
// memory-bound and one launch per ~kMaxTensors buffers is what matters. A thread updates four
// consecutive elements with vector loads when the buffers are 16-byte aligned (always, for the
// engine's flat buffers), else one element at a time.
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

// Note [AdamW arithmetic], one IEEE operation per intrinsic, in the CPU kernel's order.
__device__ __forceinline__ void adamw_element(float g_raw, float& p, float& m, float& v,
                                              int weight_decay, const AdamWCudaScalars& s) {
  const float g = __fmul_rn(g_raw, s.grad_scale);
  if (weight_decay) p = __fmul_rn(p, s.decay_factor);
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Four elements per thread with 128-bit loads and stores of param/exp_avg/exp_avg_sq (and 64- or
// 128-bit ones of grad and copy) when every pointer allows it; the arithmetic per element is
// adamw_element's either way, so the packed and scalar paths give the same bits.
__device__ __forceinline__ bool packable(const TensorArgs& t) {
  return aligned16(t.param) && aligned16(t.exp_avg) && aligned16(t.exp_avg_sq) &&
         aligned16(t.grad) && (t.copy == nullptr || aligned16(t.copy));
}

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

__global__ void adamw_kernel(LaunchArgs args, AdamWCudaScalars s) {
  const TensorArgs& t = args.t[blockIdx.y];
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t done = 0;
  if (packable(t)) {
    const int64_t quads = t.numel / 4;
    for (int64_t k = first; k < quads; k += stride) {
      const float4 g = load_grad4(t.grad, t.grad_dtype, k);
      float4 p = reinterpret_cast<const float4*>(t.param)[k];
      float4 m = reinterpret_cast<const float4*>(t.exp_avg)[k];
      float4 v = reinterpret_cast<const float4*>(t.exp_avg_sq)[k];
      adamw_element(g.x, p.x, m.x, v.x, t.weight_decay, s);
      adamw_element(g.y, p.y, m.y, v.y, t.weight_decay, s);
      adamw_element(g.z, p.z, m.z, v.z, t.weight_decay, s);
      adamw_element(g.w, p.w, m.w, v.w, t.weight_decay, s);
      reinterpret_cast<float4*>(t.param)[k] = p;
      reinterpret_cast<float4*>(t.exp_avg)[k] = m;
      reinterpret_cast<float4*>(t.exp_avg_sq)[k] = v;
      if (t.copy != nullptr) store_copy4(t.copy, t.copy_dtype, k, p);
    }
    done = quads * 4;
  }
  for (int64_t i = done + first; i < t.numel; i += stride) {
    float p = t.param[i], m = t.exp_avg[i], v = t.exp_avg_sq[i];
    adamw_element(load_grad(t.grad, t.grad_dtype, i), p, m, v, t.weight_decay, s);
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
    const int64_t want = ((longest + 3) / 4 + kThreads - 1) / kThreads;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(want, kMaxBlocksX)),
                    static_cast<unsigned>(n));
    STRATA_LAUNCH(grid, kThreads, 0, st, adamw_kernel)(args, s);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

}  // namespace strata::optim::cuda
