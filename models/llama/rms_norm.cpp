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
  return autograd::rmsnorm(x, tp_.replicated(weight_), eps_);
}

std::pair<Variable, Variable> RMSNorm::add_forward(const Variable& x, const Variable& r,
                                                   bool keep_sum) {
  std::vector<Variable> out = call({x, r}, [&](const std::vector<Variable>& in) {
    auto [s, y] = autograd::add_rmsnorm(in[0], in[1], tp_.replicated(weight_), eps_, keep_sum);
    return keep_sum ? std::vector<Variable>{s, y} : std::vector<Variable>{y};
  });
  if (keep_sum) return {out[0], out[1]};
  return {Variable(), out[0]};
}

}  // namespace strata::models::llama
