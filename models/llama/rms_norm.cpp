#include "models/llama/rms_norm.h"

#include "autograd/functions.h"
#include "models/nn/init.h"

namespace strata::models::llama {

RMSNorm::RMSNorm(int64_t dim, float eps) : eps_(eps) {
  weight_ = register_parameter("weight", tensor::Shape{dim});
}

void RMSNorm::reset_parameters(uint64_t) {
  nn::init::fill_(weight_, 1.f);
}

Variable RMSNorm::forward(const Variable& x) {
  return autograd::rmsnorm(x, weight_, eps_);
}

}  // namespace strata::models::llama
