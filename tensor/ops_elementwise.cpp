// The op API's elementwise ops (tensor/ops.h): binary, affine, axpy, unary and its backward,
// bias_add, dropout.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

namespace {

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  same_device(a, b, name);
  const DType dt = compute_dtype(name, {&a, &b});
  Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape()), dt, a.device());
  be(a).binary(op, a, b, out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Add, a, b, "add");
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Sub, a, b, "sub");
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Mul, a, b, "mul");
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Div, a, b, "div");
}

Tensor scale(const Tensor& x, float alpha) {
  return affine(x, alpha, 0.f);
}

Tensor affine(const Tensor& x, float alpha, float beta) {
  const DType dt = compute_dtype("affine", {&x});
  Tensor out = Tensor::empty(x.shape(), dt, x.device());
  be(x).affine(x, alpha, beta, out);
  return out;
}

void axpy_(float alpha, const Tensor& x, Tensor& y) {
  same_device(x, y, "axpy");
  STRATA_CHECK(x.shape() == y.shape(), "axpy: {} vs {}", x.str(), y.str());
  STRATA_CHECK(y.is_contiguous(), "axpy: destination must be contiguous");
  // x and y may differ in dtype (Note [Low-precision ops]): gradient accumulation.
  require_float(x, "axpy");
  require_float(y, "axpy");
  be(y).axpy(alpha, x.contiguous(), y);
}

Tensor unary(UnaryOp op, const Tensor& x) {
  compute_dtype("unary", {&x});
  Tensor xc = x.contiguous();
  Tensor out = like(xc);
  be(x).unary(op, xc, out);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy) {
  STRATA_CHECK(x.shape() == dy.shape(), "unary_backward: {} vs {}", x.str(), dy.str());
  same_device(x, dy, "unary_backward");
  compute_dtype("unary_backward", {&x, &dy});
  Tensor xc = x.contiguous(), dyc = dy.contiguous();
  Tensor dx = like(xc);
  be(x).unary_backward(op, xc, dyc, dx);
  return dx;
}

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  same_device(x, bias, "bias_add");
  STRATA_CHECK(bias.ndim() == 1 && x.ndim() >= 1 && bias.size(0) == x.size(-1),
               "bias_add: bias {} does not match the last dim of {}", bias.str(), x.str());
  compute_dtype("bias_add", {&x, &bias});
  Tensor xc = x.contiguous(), bc = bias.contiguous();
  Tensor out = like(xc);
  be(x).bias_add(xc, bc, out);
  return out;
}

Tensor dropout(const Tensor& x, float p, RngKey key) {
  STRATA_CHECK(p >= 0.f && p < 1.f, "dropout probability {} must be in [0, 1)", p);
  compute_dtype("dropout", {&x});
  Tensor xc = x.contiguous();
  Tensor out = like(xc);
  be(x).dropout(xc, p, key, out);
  return out;
}

}  // namespace strata::tensor
