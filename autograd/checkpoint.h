#pragma once
// Activation checkpointing.
//
// Note [Activation checkpointing]
// `checkpoint(fn, inputs)` runs fn without building a graph, keeping only `inputs`. In backward
// it re-runs fn with grad on (from detached copies of the inputs), back-propagates the incoming
// gradients through the fresh graph — parameters used inside accumulate their gradients as usual
// — and passes the inputs' gradients on. Random draws replay exactly: the thread's RNG generator
// (see rng_context.h) is rewound to where it was for the first run.
#include <functional>
#include <vector>

#include "autograd/variable.h"

namespace strata::autograd {

using CheckpointFn = std::function<std::vector<Variable>(const std::vector<Variable>&)>;

std::vector<Variable> checkpoint(const CheckpointFn& fn, const std::vector<Variable>& inputs);

}  // namespace strata::autograd
