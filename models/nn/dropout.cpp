#include "models/nn/dropout.h"

#include "autograd/functions.h"
#include "autograd/rng_context.h"

namespace strata::models::nn {

Dropout::Dropout(float p) : p_(p) {
  STRATA_USER_CHECK(p >= 0.f && p < 1.f, "dropout probability {} must be in [0, 1)", p);
}

Variable Dropout::forward(const Variable& x) {
  if (!is_training() || p_ == 0.f) return x;
  return autograd::dropout(x, p_, autograd::current_generator().next_key(), true);
}

}  // namespace strata::models::nn
