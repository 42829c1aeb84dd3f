#pragma once
// The backward engine.
//
// Note [Grad-ready hooks]
// The engine counts, for each node reachable from the roots, how many gradients will arrive, and
// runs a node once all have arrived and been summed. For a leaf this is its AccumulateGrad node,
// so when that node runs the leaf's gradient for this pass is final: its grad-ready hooks fire
// right then, while the rest of backward continues. DP starts a bucket's all-reduce from there.
// Ready nodes run in decreasing creation order, which makes the order (and so every floating
// point sum) the same on every run.
#include <vector>

#include "autograd/node.h"

namespace strata::autograd {

// Backpropagates `grads` (one per root; undefined = ones for one-element roots) from `roots`,
// accumulating into every reachable leaf's grad.
void backward(const std::vector<Variable>& roots, const std::vector<Tensor>& grads = {});

}  // namespace strata::autograd
