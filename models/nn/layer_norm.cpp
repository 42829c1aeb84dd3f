#include "models/nn/layer_norm.h"

#include "autograd/functions.h"
#include "models/nn/init.h"

namespace strata::models::nn {

LayerNorm::LayerNorm(int64_t dim, float eps) : eps_(eps) {
  weight_ = register_parameter("weight", Shape{dim});
  bias_ = register_parameter("bias", Shape{dim});
}

void LayerNorm::reset_parameters(uint64_t) {
  init::fill_(weight_, 1.f);
  init::fill_(bias_, 0.f);
}

Variable LayerNorm::forward(const Variable& x) {
  return autograd::layernorm(x, weight_, bias_, eps_);
}

}  // namespace strata::models::nn
