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
  return autograd::layernorm(x, tp_.replicated(weight_), tp_.replicated(bias_), eps_);
}

std::pair<Variable, Variable> LayerNorm::add_forward(const Variable& x, const Variable& r,
                                                     bool keep_sum) {
  std::vector<Variable> out = call({x, r}, [&](const std::vector<Variable>& in) {
    auto [s, y] = autograd::add_layernorm(in[0], in[1], tp_.replicated(weight_),
                                          tp_.replicated(bias_), eps_, keep_sum);
    return keep_sum ? std::vector<Variable>{s, y} : std::vector<Variable>{y};
  });
  if (keep_sum) return {out[0], out[1]};
  return {Variable(), out[0]};
}

}  // namespace strata::models::nn
