// The fused multi-tensor AdamW kernel (Note [CUDA AdamW] in adamw_cuda.h); the launch loop and
// the gradient and model-copy accessors are multi_tensor.cuh's.
#include "optim/cuda/adamw_cuda.h"
#include "optim/cuda/multi_tensor.cuh"

namespace strata::optim::cuda {

namespace {

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

// Four elements per thread with 128-bit loads and stores of param/exp_avg/exp_avg_sq (and 64- or
// 128-bit ones of grad and copy) when every pointer allows it; the arithmetic per element is
// adamw_element's either way, so the packed and scalar paths give the same bits.
__device__ __forceinline__ bool packable(const TensorArgs& t) {
  return aligned16(t.param) && aligned16(t.exp_avg) && aligned16(t.exp_avg_sq) &&
         aligned16(t.grad) && (t.copy == nullptr || aligned16(t.copy));
}

__global__ void adamw_kernel(LaunchArgs<TensorArgs> args, AdamWCudaScalars s) {
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

}  // namespace

int launch_adamw_multi_tensor(const AdamWCudaTensor* list, int count, const AdamWCudaScalars& s,
                              void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return launch_in_groups<TensorArgs>(
      list, count,
      [](const AdamWCudaTensor& in) {
        return TensorArgs{in.param,      in.grad,       in.exp_avg,
                          in.exp_avg_sq, in.model_copy, in.numel,
                          in.grad_dtype, in.copy_dtype, in.weight_decay ? 1 : 0};
      },
      [&](dim3 grid, const LaunchArgs<TensorArgs>& args) {
        STRATA_LAUNCH(grid, kStepThreads, 0, st, adamw_kernel)(args, s);
      });
}

}  // namespace strata::optim::cuda
