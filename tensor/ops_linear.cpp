// The op API's matmul and linear with its backward pieces (tensor/ops.h, Note [Linear
// epilogues]).
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  STRATA_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "matmul needs at least 2-d inputs: {} and {}",
               a.str(), b.str());
  Shape s = a.shape();
  int64_t m = trans_a ? a.size(-1) : a.size(-2);
  int64_t n = trans_b ? b.size(-2) : b.size(-1);
  s[s.ndim() - 2] = m;
  s[s.ndim() - 1] = n;
  // Note [Low-precision ops]: bf16 @ bf16 -> bf16 (f32 accumulation inside).
  Tensor out = Tensor::empty(s, compute_dtype("matmul", {&a, &b}), a.device());
  matmul_out(a, b, out, trans_a, trans_b, 1.f, 0.f);
  return out;
}

void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                float alpha, float beta) {
  same_device(a, b, "matmul");
  same_device(a, out, "matmul");
  const DType dt = compute_dtype("matmul", {&a, &b});
  // Note [Low-precision ops]: out has the inputs' dtype, or is F32 (mixed output).
  if (out.dtype() != dt && out.dtype() != DType::F32)
    user_error("matmul: output {} must be {} or f32 for {} @ {} (Note [Low-precision ops])",
               out.str(), dtype_name(dt), a.str(), b.str());
  int64_t k_a = trans_a ? a.size(-2) : a.size(-1);
  int64_t k_b = trans_b ? b.size(-1) : b.size(-2);
  int64_t m = trans_a ? a.size(-1) : a.size(-2);
  int64_t n = trans_b ? b.size(-2) : b.size(-1);
  STRATA_CHECK(k_a == k_b, "matmul: inner dims differ: {}{} @ {}{}", a.str(), trans_a ? "^T" : "",
               b.str(), trans_b ? "^T" : "");
  STRATA_CHECK(
      out.ndim() == a.ndim() && out.size(-2) == m && out.size(-1) == n && out.is_contiguous(),
      "matmul: output {} does not fit {} @ {}", out.str(), a.str(), b.str());
  for (int i = 0; i + 2 < a.ndim(); ++i)
    STRATA_CHECK(out.size(i) == a.size(i), "matmul batch dims");
  if (b.ndim() > 2) {
    STRATA_CHECK(b.ndim() == a.ndim(), "matmul: batched b {} must match a {}", b.str(), a.str());
    for (int i = 0; i + 2 < a.ndim(); ++i)
      STRATA_CHECK(b.size(i) == a.size(i), "matmul: batch dims differ: {} and {}", a.str(),
                   b.str());
  }
  be(a).matmul(a.contiguous(), b.contiguous(), out, trans_a, trans_b, alpha, beta);
}

LinearResult linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                    bool save_pre) {
  STRATA_CHECK(x.ndim() >= 1 && weight.ndim() == 2 && weight.size(1) == x.size(-1),
               "linear: weight {} for input {}", weight.str(), x.str());
  const int64_t n = weight.size(0);
  same_device(x, weight, "linear");
  DType dt;
  if (bias.defined()) {
    STRATA_CHECK(bias.shape() == Shape{n}, "linear: bias {} for weight {}", bias.str(),
                 weight.str());
    same_device(x, bias, "linear");
    dt = compute_dtype("linear", {&x, &weight, &bias});
  } else {
    dt = compute_dtype("linear", {&x, &weight});
  }
  STRATA_CHECK(!save_pre || act != Activation::None, "linear: pre is kept only for an activation");
  Shape ys = x.shape();
  ys[ys.ndim() - 1] = n;
  Tensor x2 = rows2d(x.contiguous());
  LinearResult r;
  r.y = Tensor::empty(ys, dt, x.device());
  if (save_pre) r.pre = Tensor::empty(ys, dt, x.device());
  Tensor y2 = rows2d(r.y), pre2 = save_pre ? rows2d(r.pre) : Tensor();
  be(x).linear_forward(x2, weight.contiguous(), bias.defined() ? bias.contiguous() : Tensor(), act,
                       y2, pre2);
  return r;
}

namespace {

// A bias gradient's tensor: a new one, or `into` (written over) once checked.
Tensor bias_grad_out(const char* op, Tensor* into, int64_t n, DType dt, const Tensor& x) {
  if (into == nullptr) return Tensor::empty({n}, dt, x.device());
  STRATA_CHECK(
      into->defined() && into->dtype() == dt && into->is_contiguous() && into->shape() == Shape{n},
      "{}: dbias to write must be a contiguous {} [{}], not {}", op, dtype_name(dt), n,
      into->defined() ? into->str() : "undefined");
  same_device(x, *into, op);
  return *into;
}

// linear_backward_weight and linear_backward_weight_into: dweight given (accumulated into) or
// made.
LinearWeightGrads weight_grads(const Tensor& dy, const Tensor& x, bool with_bias,
                               Tensor* accumulate_into, Tensor* dbias_into) {
  const char* op = accumulate_into ? "linear_backward_weight_into" : "linear_backward_weight";
  STRATA_CHECK(dy.ndim() >= 1 && x.ndim() >= 1 && rows_of(dy) == rows_of(x),
               "{}: dy {} and x {} differ in rows", op, dy.str(), x.str());
  same_device(dy, x, op);
  const DType dt = compute_dtype(op, {&dy, &x});
  const int64_t n = dy.size(-1), k = x.size(-1);
  LinearWeightGrads g;
  if (accumulate_into) {
    Tensor& w = *accumulate_into;
    same_device(w, x, op);
    STRATA_CHECK(
        w.dtype() == dt && w.is_contiguous() && w.ndim() == 2 && w.size(0) == n && w.size(1) == k,
        "{}: dweight {} is not a contiguous {} [{}, {}]", op, w.str(), dtype_name(dt), n, k);
    g.dweight = w;  // a handle to the caller's buffer
  } else {
    g.dweight = Tensor::empty({n, k}, dt, x.device());
  }
  if (with_bias) g.dbias = bias_grad_out(op, dbias_into, n, dt, x);
  be(x).linear_backward_weight(rows2d(dy.contiguous()), rows2d(x.contiguous()), g.dweight, g.dbias,
                               accumulate_into != nullptr);
  return g;
}

}  // namespace

LinearWeightGrads linear_backward_weight(const Tensor& dy, const Tensor& x, bool with_bias,
                                         Tensor* dbias_into) {
  return weight_grads(dy, x, with_bias, nullptr, dbias_into);
}

Tensor linear_backward_weight_into(const Tensor& dy, const Tensor& x, Tensor& dweight,
                                   bool with_bias, Tensor* dbias_into) {
  return weight_grads(dy, x, with_bias, &dweight, dbias_into).dbias;
}

LinearGeluGrads linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre,
                                     bool with_bias, Tensor* dbias_into) {
  STRATA_CHECK(weight.ndim() == 2 && dz.ndim() >= 1 && dz.size(-1) == weight.size(0) &&
                   pre.ndim() >= 1 && pre.size(-1) == weight.size(1) && rows_of(dz) == rows_of(pre),
               "linear_backward_gelu: dz {} @ weight {} for pre {}", dz.str(), weight.str(),
               pre.str());
  same_device(dz, weight, "linear_backward_gelu");
  same_device(dz, pre, "linear_backward_gelu");
  const DType dt = compute_dtype("linear_backward_gelu", {&dz, &weight, &pre});
  const int64_t n = pre.size(-1);
  LinearGeluGrads g;
  g.dpre = Tensor::empty(pre.shape(), dt, pre.device());
  if (with_bias) g.dbias = bias_grad_out("linear_backward_gelu", dbias_into, n, dt, pre);
  Tensor dpre2 = rows2d(g.dpre);
  be(pre).linear_backward_gelu(rows2d(dz.contiguous()), weight.contiguous(),
                               rows2d(pre.contiguous()), dpre2, g.dbias);
  return g;
}

}  // namespace strata::tensor
