#pragma once
// LayerNorm over the last dimension, with an affine weight (init 1) and bias (init 0).
#include "models/nn/module.h"

namespace strata::models::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }
  float eps() const { return eps_; }
  void reset_parameters(uint64_t seed) override;

 protected:
  Variable forward(const Variable& x) override;

 private:
  float eps_;
  Variable weight_, bias_;
};

}  // namespace strata::models::nn
