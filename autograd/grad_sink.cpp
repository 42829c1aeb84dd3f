#include "autograd/grad_sink.h"

#include "core/env.h"
#include "core/error.h"
#include "tensor/storage.h"

namespace strata::autograd {

namespace tops = tensor;

namespace {
thread_local bool t_allowed = true;
}

GradIntoBufferGuard::GradIntoBufferGuard(bool allowed) : prev_(t_allowed) {
  t_allowed = allowed;
}

GradIntoBufferGuard::~GradIntoBufferGuard() {
  t_allowed = prev_;
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
  return g;
}

bool norm_gradient_sinks(const Variable& weight, const Variable& bias, DType dtype,
                         tops::NormGradsInto& into) {
  into.dweight = gradient_sink(weight, dtype);
  into.dbias = bias.defined() ? gradient_sink(bias, dtype) : Tensor();
  return into.dweight.defined() && (!bias.defined() || into.dbias.defined());
}

tops::LinearWeightGrads weight_gradients(const Variable& w, const Tensor& dy, const Tensor& x,
                                         bool with_bias) {
  Tensor sink = gradient_sink(w, dy.dtype());
  if (!sink.defined() || x.dtype() != dy.dtype())
    return tops::linear_backward_weight(dy, x, with_bias);
  tops::LinearWeightGrads g;
  g.dbias = tops::linear_backward_weight_into(dy, x, sink, with_bias);
  return g;
}

}  // namespace strata::autograd
