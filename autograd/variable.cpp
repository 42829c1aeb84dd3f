#include "autograd/variable.h"

#include "autograd/engine.h"
#include "autograd/node.h"
#include "tensor/ops.h"

namespace strata::autograd {

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->data = std::move(data);
  set_requires_grad(requires_grad);
}

Variable::Variable(Tensor data, std::shared_ptr<Node> grad_fn, int output_nr)
    : impl_(std::make_shared<VariableImpl>()) {
  impl_->data = std::move(data);
  impl_->requires_grad = true;
  impl_->grad_fn = std::move(grad_fn);
  impl_->output_nr = output_nr;
}

void Variable::set_data(Tensor data) {
  STRATA_CHECK(!impl_->data.defined() || data.shape() == impl_->data.shape(),
               "set_data of {} changes shape {} -> {}", impl_->name, impl_->data.shape().str(),
               data.shape().str());
  impl_->data = std::move(data);
}

void Variable::zero_grad() {
  if (impl_->grad.defined()) impl_->grad.zero_();
}

void Variable::set_requires_grad(bool r) {
  STRATA_CHECK(!r || is_floating(impl_->data.dtype()) || !impl_->data.defined(),
               "only float tensors can require grad ({})", impl_->data.str());
  STRATA_CHECK(impl_->grad_fn == nullptr, "requires_grad can only be set on leaves");
  impl_->requires_grad = r;
}

void Variable::add_grad_ready_hook(GradReadyHook hook) {
  STRATA_CHECK(is_leaf() && requires_grad(), "grad-ready hooks go on leaves that require grad");
  impl_->grad_ready_hooks.push_back(std::move(hook));
}

std::shared_ptr<Node> Variable::grad_accumulator() const {
  STRATA_CHECK(is_leaf() && requires_grad(), "grad_accumulator of a non-leaf or no-grad variable");
  std::shared_ptr<Node> node = impl_->grad_accumulator.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(*this);
    impl_->grad_accumulator = node;
  }
  return node;
}

void Variable::backward(const Tensor& grad) const {
  autograd::backward({*this}, {grad});
}

namespace {
thread_local bool tl_grad_enabled = true;
thread_local bool tl_will_be_replayed = false;
}  // namespace

bool GradMode::is_enabled() {
  return tl_grad_enabled;
}
void GradMode::set_enabled(bool enabled) {
  tl_grad_enabled = enabled;
}
bool GradMode::will_be_replayed() {
  return tl_will_be_replayed;
}
void GradMode::set_will_be_replayed(bool replayed) {
  tl_will_be_replayed = replayed;
}

}  // namespace strata::autograd
