#pragma once
// Variable: a tensor that takes part in reverse-mode differentiation.
//
// Note [Variables and leaves]
// A Variable is a shared handle: copies refer to the same data, grad and graph position. A leaf
// (no grad_fn) that requires grad — a parameter — owns one AccumulateGrad node (created lazily,
// held weakly so a graph keeps it alive only while it exists); all uses of the leaf in a graph
// feed that node, so its gradient is summed before it is accumulated into `grad`, and the
// grad-ready hooks fire exactly when it is final for this backward pass (Note [Grad-ready hooks]).
// `grad` may be bound to a view into a flat gradient buffer (models/flat_params.h); accumulation
// then writes straight into the buffer DP and the optimizer use.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace strata::autograd {

using tensor::Shape;
using tensor::Tensor;

class Node;
class Variable;

using GradReadyHook = std::function<void(Variable&)>;

struct VariableImpl {
  Tensor data;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_nr = 0;              // which output of grad_fn this is
  std::weak_ptr<Node> grad_accumulator;
  std::vector<GradReadyHook> grad_ready_hooks;
  std::string name;  // parameter name, for errors and debugging
};

class Variable {
 public:
  Variable() = default;
  explicit Variable(Tensor data, bool requires_grad = false);
  // A non-leaf: output `output_nr` of `grad_fn`.
  Variable(Tensor data, std::shared_ptr<Node> grad_fn, int output_nr);

  bool defined() const { return impl_ != nullptr; }
  // How many Variables share this one's node (1: no other handle on it).
  long use_count() const { return impl_.use_count(); }
  const Tensor& data() const { return impl_->data; }
  // Replaces the data (same shape), e.g. to rebind a parameter to a flat buffer view.
  void set_data(Tensor data);
  const Tensor& grad() const { return impl_->grad; }
  // Binds the gradient to a tensor (e.g. a view into a flat gradient buffer).
  void set_grad(Tensor grad) { impl_->grad = std::move(grad); }
  // Zeroes the gradient in place if bound, else leaves it undefined.
  void zero_grad();

  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  void set_requires_grad(bool r);
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  int output_nr() const { return impl_->output_nr; }
  const std::string& name() const { return impl_->name; }
  void set_name(std::string n) { impl_->name = std::move(n); }

  // Registers a hook that runs when this leaf's gradient is final in a backward pass.
  void add_grad_ready_hook(GradReadyHook hook);
  const std::vector<GradReadyHook>& grad_ready_hooks() const { return impl_->grad_ready_hooks; }

  // The AccumulateGrad node of a leaf that requires grad (created on first use).
  std::shared_ptr<Node> grad_accumulator() const;

  // Runs backward from this variable. `grad` defaults to 1 for a one-element variable.
  void backward(const Tensor& grad = {}) const;

  // Same data, no graph, no grad.
  Variable detach() const { return Variable(impl_->data, false); }

  // Shape helpers forwarding to data.
  const Shape& shape() const { return impl_->data.shape(); }
  int64_t size(int d) const { return impl_->data.size(d); }
  int ndim() const { return impl_->data.ndim(); }
  int64_t numel() const { return impl_->data.numel(); }
  DType dtype() const { return impl_->data.dtype(); }
  Device device() const { return impl_->data.device(); }
  float item() const { return impl_->data.item<float>(); }

  VariableImpl* impl() const { return impl_.get(); }
  bool is_same(const Variable& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<VariableImpl> impl_;
};

// Grad mode (thread-local). Under NoGradGuard, functions build no graph.
//
// Note [Replayed forwards]
// checkpoint's first run builds no graph, and backward runs the same function again with grad
// on (Note [Activation checkpointing]); that replay must compute the first run's bits. A function
// whose graph-less path differs from its graph-building one (mlp_gelu writes no GELU input, so
// its GEMM runs another cuBLASLt epilogue, which may mean another algorithm) therefore takes the
// graph-less path only when no graph is built now or later: `will_be_replayed` is set for the
// first run's duration.
class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
  static bool will_be_replayed();
  static void set_will_be_replayed(bool replayed);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace strata::autograd
