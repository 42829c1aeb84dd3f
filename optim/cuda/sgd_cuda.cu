// The multi-tensor SGD kernel (Note [CUDA SGD] in sgd_cuda.h); the launch loop and the gradient
// and model-copy accessors are multi_tensor.cuh's.
#include "optim/cuda/multi_tensor.cuh"
#include "optim/cuda/sgd_cuda.h"

namespace strata::optim::cuda {

namespace {

struct TensorArgs {
  float* param;
  const void* grad;
  float* buf;
  void* copy;
  int64_t numel;
  int grad_dtype;
  int copy_dtype;
  int weight_decay;
};

// Note [CUDA SGD]: optim::Sgd's CPU loop, one IEEE operation per intrinsic, in its order. `b` is
// read and written only when the tensor has a momentum buffer.
__device__ __forceinline__ void sgd_element(float g_raw, float& p, float& b, bool has_buf,
                                            int weight_decay, const SgdCudaScalars& s) {
  float d = __fmul_rn(g_raw, s.grad_scale);
  // Like the CPU (and PyTorch), no decay term at all when it is zero (0 * inf would be NaN).
  if (weight_decay && s.weight_decay != 0.f) d = __fadd_rn(d, __fmul_rn(s.weight_decay, p));
  if (has_buf) {
    b = s.first ? d : __fadd_rn(__fmul_rn(s.momentum, b), __fmul_rn(s.one_minus_dampening, d));
    d = s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, b)) : b;
  }
  p = __fsub_rn(p, __fmul_rn(s.lr, d));
}

// Four elements per thread with 128-bit loads and stores of param and the momentum buffer (and
// 64- or 128-bit ones of grad and copy) when every pointer allows it; the arithmetic per element
// is sgd_element's either way, so the packed and scalar paths give the same bits.
__device__ __forceinline__ bool packable(const TensorArgs& t) {
  return aligned16(t.param) && aligned16(t.grad) && (t.buf == nullptr || aligned16(t.buf)) &&
         (t.copy == nullptr || aligned16(t.copy));
}

__global__ void sgd_kernel(LaunchArgs<TensorArgs> args, SgdCudaScalars s) {
  const TensorArgs& t = args.t[blockIdx.y];
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const bool has_buf = t.buf != nullptr;
  int64_t done = 0;
  if (packable(t)) {
    const int64_t quads = t.numel / 4;
    for (int64_t k = first; k < quads; k += stride) {
      const float4 g = load_grad4(t.grad, t.grad_dtype, k);
      float4 p = reinterpret_cast<const float4*>(t.param)[k];
      float4 b = has_buf ? reinterpret_cast<const float4*>(t.buf)[k] : make_float4(0, 0, 0, 0);
      sgd_element(g.x, p.x, b.x, has_buf, t.weight_decay, s);
      sgd_element(g.y, p.y, b.y, has_buf, t.weight_decay, s);
      sgd_element(g.z, p.z, b.z, has_buf, t.weight_decay, s);
      sgd_element(g.w, p.w, b.w, has_buf, t.weight_decay, s);
      reinterpret_cast<float4*>(t.param)[k] = p;
      if (has_buf) reinterpret_cast<float4*>(t.buf)[k] = b;
      if (t.copy != nullptr) store_copy4(t.copy, t.copy_dtype, k, p);
    }
    done = quads * 4;
  }
  for (int64_t i = done + first; i < t.numel; i += stride) {
    float p = t.param[i];
    float b = has_buf ? t.buf[i] : 0.f;
    sgd_element(load_grad(t.grad, t.grad_dtype, i), p, b, has_buf, t.weight_decay, s);
    t.param[i] = p;
    if (has_buf) t.buf[i] = b;
    if (t.copy != nullptr) store_copy(t.copy, t.copy_dtype, i, p);
  }
}

}  // namespace

int launch_sgd_multi_tensor(const SgdCudaTensor* list, int count, const SgdCudaScalars& s,
                            void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return launch_in_groups<TensorArgs>(
      list, count,
      [](const SgdCudaTensor& in) {
        return TensorArgs{in.param, in.grad,       in.momentum_buffer, in.model_copy,
                          in.numel, in.grad_dtype, in.copy_dtype,      in.weight_decay ? 1 : 0};
      },
      [&](dim3 grid, const LaunchArgs<TensorArgs>& args) {
        STRATA_LAUNCH(grid, kStepThreads, 0, st, sgd_kernel)(args, s);
      });
}

}  // namespace strata::optim::cuda
