#pragma once
// RMSNorm over the last dimension (Zhang & Sennrich 2019): y = w * x / sqrt(mean(x^2) + eps),
// with a weight (init 1) and no bias or mean subtraction. HF: LlamaRMSNorm.
//
// It lives here rather than in models/nn/ while LLaMA is its only user (docs/adding_a_model.md:
// a layer moves to nn/ when a second family needs it).
#include <utility>

#include "models/nn/module.h"
#include "models/nn/tensor_parallel.h"

namespace strata::models::llama {

using autograd::Variable;

class RMSNorm : public nn::Module {
 public:
  explicit RMSNorm(int64_t dim, float eps = 1e-5f);

  const Variable& weight() const { return weight_; }
  float eps() const { return eps_; }
  void reset_parameters(uint64_t seed) override;
  // Note [Replicated parameters under sequence parallelism]: under sequence parallelism this
  // layer sees 1/tp of the tokens, and its parameters' gradients are summed over the group.
  void set_tensor_parallel(const nn::TensorParallel& tp) { tp_ = tp; }

  // s = x + r and y = this norm of s as one fused op (Note [Fused residual norm] in
  // tensor/ops.h), through the module's hooks like operator(). Returns {s, y}; with
  // keep_sum = false only y is wanted and s comes back undefined.
  std::pair<Variable, Variable> add_forward(const Variable& x, const Variable& r,
                                            bool keep_sum = true);

 protected:
  Variable forward(const Variable& x) override;

 private:
  float eps_;
  nn::TensorParallel tp_;
  Variable weight_;
};

}  // namespace strata::models::llama
