#include "autograd/grad_sink.h"

#include "core/env.h"
#include "core/error.h"
#include "tensor/storage.h"

namespace strata::autograd {

namespace tops = tensor;

namespace {
thread_local bool t_allowed = true;
thread_local bool t_zeroed = false;
thread_local std::unordered_set<const void*>* t_handed = nullptr;  // the zeroed scope's buffers
}  // namespace

GradIntoBufferGuard::GradIntoBufferGuard(bool allowed, bool zeroed)
    : prev_(t_allowed), prev_zeroed_(t_zeroed), prev_handed_(t_handed) {
  t_allowed = allowed;
  t_zeroed = allowed && zeroed;
  t_handed = t_zeroed ? &handed_ : nullptr;
}

GradIntoBufferGuard::~GradIntoBufferGuard() {
  t_allowed = prev_;
  t_zeroed = prev_zeroed_;
  t_handed = prev_handed_;
}

bool grad_into_buffer_enabled() {
  static const bool on =
      env_choice("STRATA_GRAD_INTO_BUFFER",
                 {{"on", "GPU weight gradients are added into their buffer by the GEMM"},
                  {"off",
                   "every gradient returned and added by AccumulateGrad, Note [Weight gradients "
                   "into their buffer]"}}) == 0;
  return on;
}

Tensor gradient_sink(const Variable& w, DType dtype) {
  if (!t_allowed || !w.defined() || !w.requires_grad() || !w.is_leaf()) return {};
  const Tensor& g = w.grad();
  if (!g.defined() || !g.device().is_cuda() || g.dtype() != dtype || !g.is_contiguous() ||
      g.shape() != w.data().shape() || g.storage()->is_released())
    return {};
  if (!grad_into_buffer_enabled()) return {};
  if (t_handed != nullptr) t_handed->insert(g.data_ptr());  // written from now on
  return g;
}

Tensor fresh_gradient_sink(const Variable& b, DType dtype) {
  if (!t_zeroed || t_handed == nullptr || !b.defined()) return {};
  const void* p = b.grad().defined() ? b.grad().data_ptr() : nullptr;
  if (p == nullptr || t_handed->count(p) != 0) return {};
  return gradient_sink(b, dtype);  // records p
}

bool norm_gradient_sinks(const Variable& weight, const Variable& bias, DType dtype,
                         tops::NormGradsInto& into) {
  into.dweight = gradient_sink(weight, dtype);
  into.dbias = bias.defined() ? gradient_sink(bias, dtype) : Tensor();
  return into.dweight.defined() && (!bias.defined() || into.dbias.defined());
}

tops::LinearWeightGrads weight_gradients(const Variable& w, const Tensor& dy, const Tensor& x,
                                         bool with_bias, const Variable& bias) {
  // Note [Bias gradients into their buffer]: written over the bias's zeroed buffer when allowed.
  Tensor bias_sink =
      with_bias && x.dtype() == dy.dtype() ? fresh_gradient_sink(bias, dy.dtype()) : Tensor();
  Tensor* bias_into = bias_sink.defined() ? &bias_sink : nullptr;
  Tensor sink = gradient_sink(w, dy.dtype());
  tops::LinearWeightGrads g;
  if (!sink.defined() || x.dtype() != dy.dtype()) {
    g = tops::linear_backward_weight(dy, x, with_bias, bias_into);
  } else {
    g.dbias = tops::linear_backward_weight_into(dy, x, sink, with_bias, bias_into);
  }
  if (bias_into != nullptr) g.dbias = Tensor();
  return g;
}

}  // namespace strata::autograd
