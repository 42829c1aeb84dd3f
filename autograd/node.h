#pragma once
// Graph nodes.
//
// Note [Forward and backward side by side]
// A differentiable function computes its outputs with plain tensor ops and hands `make_outputs`
// a lambda that maps output gradients to input gradients, capturing only what backward needs
// (flashlight's style). The lambda lives next to the forward code, in one function, so each op
// reads in one sitting; there is no central backward switch.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"

namespace strata::autograd {

struct Edge {
  std::shared_ptr<Node> node;  // null: the input needs no gradient
  int input_nr = 0;            // which gradient slot of `node` this feeds
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name, int num_outputs = 1);
  virtual ~Node() = default;

  // Maps gradients w.r.t. this node's outputs (one per output; the engine fills missing ones
  // with zeros) to gradients w.r.t. its inputs (one per next edge; undefined = none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;

  const std::string& name() const { return name_; }
  int num_outputs() const { return num_outputs_; }
  // Creation order; the engine runs ready nodes latest-created first (deterministic).
  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge> next_edges;
  // Shapes/dtypes/devices of the outputs, so missing output grads can be zero-filled
  // (only metadata: holding the outputs would keep every activation alive).
  struct OutputMeta {
    Shape shape;
    DType dtype;
    Device device;
  };
  std::vector<OutputMeta> output_meta;
  // Run right before apply (module backward pre-hooks, etc.).
  std::vector<std::function<void()>> pre_hooks;

 private:
  std::string name_;
  int num_outputs_;
  uint64_t sequence_nr_;
};

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, int num_outputs, BackwardFn fn)
      : Node(std::move(name), num_outputs), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  void release() { fn_ = nullptr; }  // drops captured tensors after use

 private:
  BackwardFn fn_;
};

// Sums incoming gradient into a leaf's grad, then runs its grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Variable leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  const Variable& variable() const { return leaf_; }

 private:
  Variable leaf_;  // Note: a strong ref to the impl; the impl holds this node weakly.
};

// Wraps forward results into Variables connected to `inputs` through a node running `backward`.
// With grad mode off or no input requiring grad, returns plain (non-graph) variables and drops
// `backward`. `backward` returns one tensor per input (undefined where none is needed).
// `always` builds the node (grad mode permitting) even if no input requires grad: for functions
// such as checkpoint whose parameters are not among `inputs`.
std::vector<Variable> make_outputs(std::string name, std::vector<Tensor> outputs,
                                   const std::vector<Variable>& inputs, BackwardFn backward,
                                   bool always = false);
Variable make_output(std::string name, Tensor output, const std::vector<Variable>& inputs,
                     BackwardFn backward);

}  // namespace strata::autograd
