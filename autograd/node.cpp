#include "autograd/node.h"

#include "tensor/ops.h"

namespace strata::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node(std::string name, int num_outputs)
    : name_(std::move(name)), num_outputs_(num_outputs), sequence_nr_(g_next_sequence_nr++) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  STRATA_CHECK(fn_ != nullptr,
               "backward through '{}' a second time: its saved tensors were released after the "
               "first backward",
               name());
  std::vector<Tensor> grads = fn_(grad_outputs);
  STRATA_CHECK(grads.size() == next_edges.size(), "'{}' backward returned {} grads for {} inputs",
               name(), grads.size(), next_edges.size());
  return grads;
}

AccumulateGrad::AccumulateGrad(Variable leaf) : Node("AccumulateGrad", 1), leaf_(std::move(leaf)) {
  output_meta.push_back({leaf_.data().shape(), leaf_.data().dtype(), leaf_.data().device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor& g = grad_outputs[0];
  VariableImpl* impl = leaf_.impl();
  if (g.defined()) {
    STRATA_CHECK(g.shape() == impl->data.shape(), "gradient {} for parameter '{}' of shape {}",
                 g.str(), impl->name, impl->data.shape().str());
    if (!impl->grad.defined()) {
      offload::CategoryScope scope(offload::Category::Grad);
      impl->grad = g.contiguous().clone();
    } else {
      tensor::axpy_(1.f, g, impl->grad);
    }
  }
  for (auto& hook : impl->grad_ready_hooks) hook(leaf_);
  return {};
}

std::vector<Variable> make_outputs(std::string name, std::vector<Tensor> outputs,
                                   const std::vector<Variable>& inputs, BackwardFn backward,
                                   bool always) {
  bool needs_grad = always && GradMode::is_enabled();
  if (GradMode::is_enabled())
    for (const Variable& v : inputs) needs_grad = needs_grad || (v.defined() && v.requires_grad());
  std::vector<Variable> result;
  result.reserve(outputs.size());
  if (!needs_grad) {
    for (Tensor& t : outputs) result.emplace_back(std::move(t), false);
    return result;
  }
  auto node = std::make_shared<FunctionNode>(std::move(name), static_cast<int>(outputs.size()),
                                             std::move(backward));
  node->next_edges.reserve(inputs.size());
  for (const Variable& v : inputs) {
    Edge e;
    if (v.defined() && v.requires_grad()) {
      if (v.is_leaf()) {
        e.node = v.grad_accumulator();
        e.input_nr = 0;
      } else {
        e.node = v.grad_fn();
        e.input_nr = v.output_nr();
      }
    }
    node->next_edges.push_back(std::move(e));
  }
  for (const Tensor& t : outputs) node->output_meta.push_back({t.shape(), t.dtype(), t.device()});
  for (size_t i = 0; i < outputs.size(); ++i)
    result.emplace_back(std::move(outputs[i]), node, static_cast<int>(i));
  return result;
}

Variable make_output(std::string name, Tensor output, const std::vector<Variable>& inputs,
                     BackwardFn backward) {
  std::vector<Tensor> outs;
  outs.push_back(std::move(output));
  return make_outputs(std::move(name), std::move(outs), inputs, std::move(backward))[0];
}

}  // namespace strata::autograd
