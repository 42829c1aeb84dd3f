#pragma once
// Inverted dropout. Each call in training mode with p > 0 takes one key from the thread's
// generator (autograd::current_generator(), Note [Deterministic RNG]), so masks are reproducible
// and activation checkpointing replays them. In eval mode or with p == 0 it is the identity and
// draws nothing.
#include "models/nn/module.h"

namespace strata::models::nn {

class Dropout : public Module {
 public:
  explicit Dropout(float p);
  float p() const { return p_; }

 protected:
  Variable forward(const Variable& x) override;

 private:
  float p_;
};

}  // namespace strata::models::nn
