#pragma once
// Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_ semantics.
//
// Note [Deterministic norm]
// The sum of squares is accumulated in double over fixed chunks whose partial sums are added in
// chunk order, so the norm is the same bits whatever the thread count (DESIGN.md decision 9).
#include <vector>

#include "tensor/tensor.h"

namespace strata::optim {

// sqrt of the sum of squares of every element of every tensor (F32, contiguous, CPU; any shape).
double global_grad_norm(const std::vector<tensor::Tensor>& grads);

// Computes the global norm and, when max_norm / (norm + 1e-6) < 1, multiplies every gradient by
// that coefficient (rounded to float). Returns the norm before clipping. A non-finite norm is
// returned as is and nothing is scaled: the caller should skip the step. max_norm must be > 0.
double clip_grad_norm(const std::vector<tensor::Tensor>& grads, double max_norm);

}  // namespace strata::optim
