// CPU linear with bias/GELU epilogues and its backward pieces: the reference semantics of
// Note [Linear epilogues] (tensor/ops.h), composed from the CPU backend's own kernels on f32
// values with one rounding per output at the end. In f32 the composition is the unfused one
// kernel for kernel (matmul, bias_add, gelu, unary_backward, sum_to on the same values), so an f32
// model gives the same bits whether it calls linear or the ops it replaces; in bf16/f16 the
// intermediate values stay f32 where the unfused ops would round them.
#include <optional>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/widen.h"

namespace strata::tensor::cpu {

namespace {

Tensor f32_workspace(const Shape& shape) {
  offload::CategoryScope scope(offload::Category::Workspace);
  return Tensor::empty(shape, DType::F32);
}

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                Activation act, Tensor& y, Tensor& pre) {
  // Nothing to add: the GEMM itself, rounding once into y.
  if (act == Activation::None && !bias.defined())
    return matmul(x, weight, y, false, true, 1.f, 0.f);
  F32Out oy(y);
  std::optional<F32Out> opre;
  if (pre.defined()) opre.emplace(pre);
  // The f32 pre-activation: y itself without an activation, else pre (or scratch when pre is
  // not kept).
  Tensor acc = act == Activation::None ? oy.get() : opre ? opre->get() : f32_workspace(y.shape());
  // bf16/f16 inputs with an f32 output: the product is not rounded (Note [Low-precision ops]).
  matmul(x, weight, acc, false, true, 1.f, 0.f);
  if (bias.defined()) bias_add(acc, widened(bias), acc);
  if (act == Activation::Gelu) unary(UnaryOp::Gelu, acc, oy.get());
  if (opre) opre->commit();
  oy.commit();
}

void CpuBackend::linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dweight,
                                        Tensor& dbias, bool accumulate) {
  // f32 accumulation (the old value included when accumulating), one rounding.
  matmul(dy, x, dweight, true, false, 1.f, accumulate ? 1.f : 0.f);
  if (dbias.defined()) sum_to(dy, dbias);  // double sums, one rounding
}

void CpuBackend::linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre,
                                      Tensor& dpre, Tensor& dbias) {
  Tensor dh = f32_workspace(dpre.shape());
  matmul(dz, weight, dh, false, false, 1.f, 0.f);
  F32Out od(dpre);
  unary_backward(UnaryOp::Gelu, widened(pre), dh, od.get());
  // The bias gradient sums the f32 dpre, before its rounding.
  if (dbias.defined()) {
    F32Out odb(dbias);
    sum_to(od.get(), odb.get());
    odb.commit();
  }
  od.commit();
}

}  // namespace strata::tensor::cpu
