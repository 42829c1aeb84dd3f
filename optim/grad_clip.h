#pragma once
// Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_ semantics.
//
// Note [Deterministic norm]
// The sum of squares is accumulated in double over fixed chunks whose partial sums are added in
// chunk order, so the norm is the same bits whatever the thread count (docs/design.md decision 9).
//
// Note [GPU gradients]
// Tensors on a GPU go through the op API instead: the sum of squares is tensor::sum_squares
// (the CUDA backend's fixed-order reduction, F32/BF16/F16, returned as double: deterministic,
// but not the CPU's bits, since its partial sums are grouped differently) and scaling is
// tensor::scale copied back (f32(x) * coef rounded once to x's dtype). CPU tensors keep the
// loops here, bit for bit. A list may mix devices; each tensor goes its own way.
#include <vector>

#include "tensor/tensor.h"

namespace strata::optim {

// sqrt of the sum of squares of every element of every tensor (F32, contiguous, CPU; any shape;
// or any float tensor on a GPU: Note [GPU gradients]).
double global_grad_norm(const std::vector<tensor::Tensor>& grads);

// The sum of squares behind global_grad_norm (Note [Deterministic norm]); a partitioned optimizer
// (ZeRO) adds these over ranks before the square root. BF16/F16 gradients are widened exactly
// (blocks of f32 workspace); the block boundaries are chunk boundaries, so the bits are those of
// the same values in f32 only when the tensor fits one block — deterministic either way.
double grad_sum_of_squares(const std::vector<tensor::Tensor>& grads);
// Multiplies every element by `coef` (the clipping step of clip_grad_norm).
void scale_grads(const std::vector<tensor::Tensor>& grads, float coef);
// The coefficient clip_grad_norm applies for a finite `norm`: max_norm / (norm + 1e-6) rounded
// to float, or 1 when that is not below 1.
float clip_coefficient(double norm, double max_norm);

// Computes the global norm and, when max_norm / (norm + 1e-6) < 1, multiplies every gradient by
// that coefficient (rounded to float). Returns the norm before clipping. A non-finite norm is
// returned as is and nothing is scaled: the caller should skip the step. max_norm must be > 0.
double clip_grad_norm(const std::vector<tensor::Tensor>& grads, double max_norm);

}  // namespace strata::optim
