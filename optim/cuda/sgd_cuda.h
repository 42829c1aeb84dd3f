#pragma once
// The multi-tensor SGD step on the GPU: one launch (or a few, for long lists) updates many flat
// buffers in place.
//
// Note [CUDA SGD]
// Each element follows optim::Sgd's CPU loop (optim/sgd.h, torch.optim.SGD's semantics)
// operation by operation, written with __fmul_rn/__fadd_rn/__fsub_rn (and built with
// --fmad=false) so that no multiply and add become an FMA: on the same inputs the GPU gives the
// CPU's bits.
//   g = f32(grad) * grad_scale                  (widening is exact; one rounded multiply)
//   d = g + weight_decay * p                    (only where the run decays and weight_decay != 0)
//   b = first ? d : momentum * b + one_minus_dampening * d     (when there is a momentum buffer)
//   d = nesterov ? d + momentum * b : b
//   p = p - lr * d
// The CPU multiplies by the scale only when it widens a BF16/F16 gradient or the scale is not 1;
// x * 1 is x, so always multiplying gives the same bits. The optional model copy receives the
// updated p rounded to nearest even in BF16 or F16 (F32: a plain copy). Every element is owned by
// one thread and nothing is reduced, so the result is deterministic.
//
// This header is included by C++20 host code and by the C++17 .cu file, so it uses only plain
// types; dtypes are strata::DType numbers (F32 = 0, BF16 = 1, F16 = 2).
#include <cstdint>

namespace strata::optim::cuda {

// One flat buffer set; element i of every pointer is the same parameter element. Device pointers.
struct SgdCudaTensor {
  float* param = nullptr;
  const void* grad = nullptr;
  int grad_dtype = 0;                // F32, BF16 or F16
  float* momentum_buffer = nullptr;  // nullable: no momentum
  void* model_copy = nullptr;        // nullable: the updated param rounded to copy_dtype
  int copy_dtype = 1;                // BF16 or F16 (F32 allowed: a plain copy)
  int64_t numel = 0;
  bool weight_decay = true;
};

// optim::Sgd's scalars, rounded to float as the CPU loop uses them, plus grad_scale.
struct SgdCudaScalars {
  float weight_decay = 0.f;
  float momentum = 0.f;
  float one_minus_dampening = 1.f;
  float lr = 0.f;
  float grad_scale = 1.f;
  bool first = false;  // the first step: the momentum buffer takes d
  bool nesterov = false;
};

// Enqueues the update of every tensor in list[0, count) on `stream` (a cudaStream_t; null is the
// legacy default stream) and returns at once. Returns 0 when every launch was enqueued, -1 when a
// dtype is not one listed above (nothing enqueued), otherwise the cudaError_t of the failed
// launch. Buffers of different tensors must not overlap.
int launch_sgd_multi_tensor(const SgdCudaTensor* list, int count, const SgdCudaScalars& s,
                            void* stream);

}  // namespace strata::optim::cuda
