#pragma once
// Backward-time callbacks on activations, the building block of module backward hooks.
#include <functional>
#include <vector>

#include "autograd/variable.h"

namespace strata::autograd {

// Identity on `xs`. In backward, `callback` runs once, when the first gradient reaches any of the
// returned variables' node (i.e. before gradients flow on to the inputs). Inputs that do not
// require grad pass through untouched.
std::vector<Variable> on_backward(const std::vector<Variable>& xs, std::function<void()> callback);

}  // namespace strata::autograd
