#pragma once
// The fused multi-tensor AdamW step on the GPU: one launch (or a few, for long lists) updates
// many flat buffers in place.
//
// Note [CUDA AdamW]
// Each element follows Note [AdamW arithmetic] (optim/adamw_kernel.h) operation by operation,
// written with __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn/__fsqrt_rn so that nvcc cannot contract a
// multiply and an add into an FMA: on the same f32 inputs the GPU gives the CPU scalar kernel's
// bits. Two additions to that note, both exact when unused:
//   - the gradient may be F32, BF16 or F16; it is widened to f32 (exactly) on load;
//   - g = f32(grad) * grad_scale, one rounded multiply, before anything else uses g (loss-scale
//     unscaling and clipping folded into the step; grad_scale = 1 leaves g unchanged).
// With weight decay off for a buffer, p is not multiplied by decay_factor (p * 1 = p, so this
// equals running the CPU kernel with weight_decay = 0). The optional model copy receives the
// updated p rounded to nearest even in BF16 or F16 (core/half.h's rounding for finite values).
// Every element is owned by one thread and no value is reduced, so the result is deterministic.
//
// This header is included by C++20 host code and by the C++17 .cu file, so it uses only plain
// types; dtypes are strata::DType numbers (F32 = 0, BF16 = 1, F16 = 2).
#include <cstdint>

namespace strata::optim::cuda {

// One flat buffer set; element i of every pointer is the same parameter element. Device pointers.
struct AdamWCudaTensor {
  float* param = nullptr;
  const void* grad = nullptr;
  int grad_dtype = 0;  // F32, BF16 or F16
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* model_copy = nullptr;  // nullable: the updated param rounded to copy_dtype
  int copy_dtype = 1;          // BF16 or F16 (F32 allowed: a plain copy)
  int64_t numel = 0;
  bool weight_decay = true;
};

// optim::AdamWScalars (already rounded to float, from adamw_scalars) plus grad_scale.
struct AdamWCudaScalars {
  float decay_factor = 1.f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float step_size = 0.f;
  float bias_correction2_sqrt = 1.f;
  float eps = 1e-8f;
  float grad_scale = 1.f;
};

// Enqueues the update of every tensor in list[0, count) on `stream` (a cudaStream_t; null is the
// legacy default stream) and returns at once. Returns 0 when every launch was enqueued, -1 when a
// dtype is not one listed above (nothing enqueued), otherwise the cudaError_t of the failed
// launch. Buffers of different tensors must not overlap.
int launch_adamw_multi_tensor(const AdamWCudaTensor* list, int count, const AdamWCudaScalars& s,
                              void* stream);

}  // namespace strata::optim::cuda
