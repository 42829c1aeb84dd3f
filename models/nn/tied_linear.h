#pragma once
// TiedLinear: y = x @ weight^T with a weight owned by another module (a tied LM head reads the
// token embedding). It registers NO parameter, so parameter names, flat units and checkpoints are
// those of the untied-free model; it exists so that the use of the weight happens inside a module
// call, where strategies see it through the module hooks (docs/design.md decision 6): ZeRO-3
// gathers the owning unit before the call (UnitSpec::users, Note [ZeRO-3 gathering]).
#include "models/nn/module.h"

namespace strata::models::nn {

class TiedLinear : public Module {
 public:
  // `weight` [out_features, in_features] is shared, not copied: the same Variable handle, so it
  // follows the owner's rebinding (flat buffers, repadding).
  explicit TiedLinear(Variable weight) : weight_(std::move(weight)) {}

  const Variable& weight() const { return weight_; }

 protected:
  Variable forward(const Variable& x) override;

 private:
  Variable weight_;
};

}  // namespace strata::models::nn
