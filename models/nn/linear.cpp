#include "models/nn/linear.h"

#include "autograd/functions.h"
#include "models/nn/init.h"

namespace strata::models::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  weight_ = register_parameter("weight", Shape{out_features, in_features});
  if (bias) bias_ = register_parameter("bias", Shape{out_features});
}

void Linear::reset_parameters(uint64_t seed) {
  init::normal_(weight_, seed, 0.f, init_std_);
  if (bias_.defined()) init::fill_(bias_, 0.f);
}

Variable Linear::forward(const Variable& x) {
  return autograd::linear(x, weight_, bias_);
}

}  // namespace strata::models::nn
