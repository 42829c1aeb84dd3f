#pragma once
// The list of model families (Note [Model registry]).
#include "models/registry.h"

namespace strata::models {

// Registers every family's presets into `registry`.
void register_zoo(ModelRegistry& registry);

}  // namespace strata::models
