#include "autograd/hooks.h"

#include "autograd/node.h"

namespace strata::autograd {

std::vector<Variable> on_backward(const std::vector<Variable>& xs, std::function<void()> callback) {
  std::vector<Tensor> outs;
  outs.reserve(xs.size());
  for (const Variable& x : xs) outs.push_back(x.data());
  auto fired = std::make_shared<bool>(false);
  std::vector<Variable> result =
      make_outputs("OnBackward", std::move(outs), xs,
                   [callback = std::move(callback), fired](const std::vector<Tensor>& g) {
                     if (!*fired) {
                       *fired = true;
                       callback();
                     }
                     return g;
                   });
  // Inputs that did not need grad come back as plain variables; hand back the originals so
  // their identity (and leaf status) is kept.
  for (size_t i = 0; i < xs.size(); ++i)
    if (!xs[i].requires_grad()) result[i] = xs[i];
  return result;
}

}  // namespace strata::autograd
