#pragma once
// Finite-difference gradient checking for autograd functions (tests only).
#include <functional>
#include <string>
#include <vector>

#include "autograd/variable.h"

namespace strata::testing {

struct GradcheckOptions {
  double eps = 1e-3;   // central-difference step
  double atol = 2e-3;  // see Note [fp32 gradcheck tolerance] in gradcheck.cpp
  double rtol = 2e-2;
};

using GradFn = std::function<autograd::Variable(const std::vector<autograd::Variable>&)>;

// Checks d(sum(w * f(inputs)))/d(input) from backward against central differences, for every
// element of every input that requires grad (w: fixed random weights). Inputs may be
// non-contiguous views; they are perturbed in place through their strides. Returns an empty
// string on success, else a description of the worst mismatch.
std::string gradcheck(const GradFn& fn, const std::vector<autograd::Variable>& inputs,
                      const GradcheckOptions& opts = {});

}  // namespace strata::testing
