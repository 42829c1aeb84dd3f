#pragma once
// The generator random layers (dropout) draw keys from: one per thread, set by the trainer for
// the step (Note [Deterministic RNG]); checkpointing rewinds it to replay draws.
#include "core/rng.h"

namespace strata::autograd {

Generator& current_generator();
// Makes `g` the thread's generator while in scope.
class GeneratorScope {
 public:
  explicit GeneratorScope(Generator& g);
  ~GeneratorScope();
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

 private:
  Generator* saved_;
};

}  // namespace strata::autograd
