#pragma once
// LayerNorm over the last dimension, with an affine weight (init 1) and bias (init 0).
#include <utility>

#include "models/nn/module.h"
#include "models/nn/tensor_parallel.h"

namespace strata::models::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }
  float eps() const { return eps_; }
  void reset_parameters(uint64_t seed) override;
  // Note [Replicated parameters under sequence parallelism]: under sequence parallelism this
  // layer sees 1/tp of the tokens, and its parameters' gradients are summed over the group.
  void set_tensor_parallel(const TensorParallel& tp) { tp_ = tp; }

  // s = x + r and y = this norm of s as one fused op (Note [Fused residual norm] in
  // tensor/ops.h), through the module's hooks like operator(). Returns {s, y}; with
  // keep_sum = false only y is wanted and s comes back undefined.
  std::pair<Variable, Variable> add_forward(const Variable& x, const Variable& r,
                                            bool keep_sum = true);

 protected:
  Variable forward(const Variable& x) override;

 private:
  float eps_;
  TensorParallel tp_;
  Variable weight_, bias_;
};

}  // namespace strata::models::nn
