#include "autograd/rng_context.h"

namespace strata::autograd {

namespace {
thread_local Generator tl_default_generator{0};
thread_local Generator* tl_generator = nullptr;
}  // namespace

Generator& current_generator() {
  return tl_generator ? *tl_generator : tl_default_generator;
}

GeneratorScope::GeneratorScope(Generator& g) : saved_(tl_generator) {
  tl_generator = &g;
}
GeneratorScope::~GeneratorScope() {
  tl_generator = saved_;
}

}  // namespace strata::autograd
