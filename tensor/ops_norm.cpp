// The op API's norms (layernorm, rmsnorm, also fused with the residual add) and softmax
// (tensor/ops.h).
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

namespace {

// Note [Norms over no features]: a norm or softmax over a last dim of size 0 has nothing to
// normalise. Its outputs are empty like the input, its weight gradients are [0], and its per-row
// statistics are those of no elements: the mean and variance of nothing are NaN (torch.mean of an
// empty tensor is NaN too), so mean and rstd are NaN. No kernel is called: they assume rows of at
// least one element.

// The shapes a norm backward reads: dy like x [..., C], weight [C], each per-row statistic [rows]
// (the kernels index them by x's rows and columns alone, so a smaller one would be read past its
// end).
void check_norm_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                         std::initializer_list<const Tensor*> stats) {
  same_devices(op, {&x, &dy, &weight});
  for (const Tensor* st : stats) same_device(x, *st, op);
  STRATA_CHECK(x.ndim() >= 1 && dy.shape() == x.shape(), "{}: dy {} for x {}", op, dy.str(),
               x.str());
  STRATA_CHECK(weight.shape() == Shape{x.size(-1)}, "{}: weight {} for x {}", op, weight.str(),
               x.str());
  for (const Tensor* st : stats)
    STRATA_CHECK(st->shape() == Shape{rows_of(x)}, "{}: statistics {} for x {} (one per row)", op,
                 st->str(), x.str());
}

// The parameter gradients of a norm backward: fresh tensors, or the caller's buffers `into`
// (Note [Norm gradients into their buffer]), checked. Returns whether the backend accumulates.
bool norm_param_grads(const char* op, const NormGradsInto* into, bool with_bias, int64_t c,
                      DType dt, const Tensor& x, Tensor& dweight, Tensor* dbias) {
  if (into == nullptr) {
    dweight = Tensor::empty({c}, dt, x.device());
    if (with_bias) *dbias = Tensor::empty({c}, dt, x.device());
    return false;
  }
  auto check = [&](const Tensor& t, const char* what) {
    STRATA_CHECK(t.defined() && t.dtype() == dt && t.is_contiguous() && t.shape() == Shape{c},
                 "{}: {} to add into must be a contiguous {} [{}], not {}", op, what,
                 dtype_name(dt), c, t.defined() ? t.str() : "undefined");
    same_device(x, t, op);
  };
  check(into->dweight, "dweight");
  dweight = into->dweight;
  if (with_bias) {
    check(into->dbias, "dbias");
    *dbias = into->dbias;
  } else {
    STRATA_CHECK(!into->dbias.defined(), "{}: a norm without bias takes no dbias to add into", op);
  }
  return true;
}
}  // namespace

NormResult layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  int64_t c = x.size(-1);
  STRATA_CHECK(weight.shape() == Shape{c} && bias.shape() == Shape{c},
               "layernorm: weight {} / bias {} must be [{}]", weight.str(), bias.str(), c);
  same_device(x, weight, "layernorm");
  same_device(x, bias, "layernorm");
  const DType dt = compute_dtype("layernorm", {&x, &weight, &bias});
  Tensor x2 = rows2d(x.contiguous());
  NormResult r;
  r.y = Tensor::empty(x.shape(), dt, x.device());
  r.mean = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  r.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    r.mean.fill_(std::nan(""));
    r.rstd.copy_(r.mean);
    return r;
  }
  Tensor y2 = rows2d(r.y);
  be(x).layernorm_forward(x2, weight.contiguous(), bias.contiguous(), eps, y2, r.mean, r.rstd);
  return r;
}

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd,
                                  const NormGradsInto* into) {
  int64_t c = x.size(-1);
  const DType dt = compute_dtype("layernorm_backward", {&dy, &x, &weight});
  require_f32(mean, "layernorm_backward", "mean");
  require_f32(rstd, "layernorm_backward", "rstd");
  check_norm_backward("layernorm_backward", dy, x, weight, {&mean, &rstd});
  Tensor x2 = rows2d(x.contiguous());
  Tensor dy2 = rows2d(dy.contiguous());
  LayerNormGrads g;
  g.dx = Tensor::empty(x.shape(), dt, x.device());
  const bool acc =
      norm_param_grads("layernorm_backward", into, true, c, dt, x, g.dweight, &g.dbias);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(x).layernorm_backward(dy2, x2, weight.contiguous(), mean, rstd, dx2, g.dweight, g.dbias, acc);
  return g;
}

NormResult rmsnorm(const Tensor& x, const Tensor& weight, float eps) {
  int64_t c = x.size(-1);
  STRATA_CHECK(weight.shape() == Shape{c}, "rmsnorm: weight {} must be [{}]", weight.str(), c);
  same_device(x, weight, "rmsnorm");
  const DType dt = compute_dtype("rmsnorm", {&x, &weight});
  Tensor x2 = rows2d(x.contiguous());
  NormResult r;
  r.y = Tensor::empty(x.shape(), dt, x.device());
  r.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    r.rstd.fill_(std::nan(""));
    return r;
  }
  Tensor y2 = rows2d(r.y);
  be(x).rmsnorm_forward(x2, weight.contiguous(), eps, y2, r.rstd);
  return r;
}

RmsNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& rstd, const NormGradsInto* into) {
  int64_t c = x.size(-1);
  const DType dt = compute_dtype("rmsnorm_backward", {&dy, &x, &weight});
  require_f32(rstd, "rmsnorm_backward", "rstd");
  check_norm_backward("rmsnorm_backward", dy, x, weight, {&rstd});
  Tensor x2 = rows2d(x.contiguous());
  Tensor dy2 = rows2d(dy.contiguous());
  RmsNormGrads g;
  g.dx = Tensor::empty(x.shape(), dt, x.device());
  const bool acc = norm_param_grads("rmsnorm_backward", into, false, c, dt, x, g.dweight, nullptr);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(x).rmsnorm_backward(dy2, x2, weight.contiguous(), rstd, dx2, g.dweight, acc);
  return g;
}

namespace {
// The checks add_layernorm and add_rmsnorm share: x and r of one shape, on one device.
void check_add_norm(const Tensor& x, const Tensor& r, const Tensor& weight, const char* op) {
  if (!(x.shape() == r.shape()))
    user_error("{}: x {} and r {} must have the same shape (the fused add does not broadcast)", op,
               x.str(), r.str());
  same_device(x, r, op);
  same_device(x, weight, op);
  STRATA_CHECK(x.ndim() >= 1 && weight.shape() == Shape{x.size(-1)}, "{}: weight {} for {}", op,
               weight.str(), x.str());
}

// ds for a fused norm backward: contiguous [N, C] like s, or undefined.
Tensor rows_or_none(const Tensor& ds, const Tensor& s, const char* op) {
  if (!ds.defined()) return ds;
  STRATA_CHECK(ds.shape() == s.shape() && ds.dtype() == s.dtype(), "{}: ds {} for s {}", op,
               ds.str(), s.str());
  same_device(ds, s, op);
  return rows2d(ds.contiguous());
}
}  // namespace

AddNormResult add_layernorm(const Tensor& x, const Tensor& r, const Tensor& weight,
                            const Tensor& bias, float eps) {
  check_add_norm(x, r, weight, "add_layernorm");
  const int64_t c = x.size(-1);
  STRATA_CHECK(bias.shape() == Shape{c}, "add_layernorm: bias {} must be [{}]", bias.str(), c);
  same_device(x, bias, "add_layernorm");
  const DType dt = compute_dtype("add_layernorm", {&x, &r, &weight, &bias});
  Tensor x2 = rows2d(x.contiguous()), r2 = rows2d(r.contiguous());
  AddNormResult out;
  out.s = Tensor::empty(x.shape(), dt, x.device());
  out.y = Tensor::empty(x.shape(), dt, x.device());
  out.mean = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  out.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    out.mean.fill_(std::nan(""));
    out.rstd.copy_(out.mean);
    return out;
  }
  Tensor s2 = rows2d(out.s), y2 = rows2d(out.y);
  be(x).add_layernorm_forward(x2, r2, weight.contiguous(), bias.contiguous(), eps, s2, y2, out.mean,
                              out.rstd);
  return out;
}

LayerNormGrads add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const NormGradsInto* into) {
  const int64_t c = s.size(-1);
  STRATA_CHECK(dy.shape() == s.shape(), "add_layernorm_backward: dy {} for s {}", dy.str(),
               s.str());
  const DType dt = compute_dtype("add_layernorm_backward", {&dy, &s, &weight});
  require_f32(mean, "add_layernorm_backward", "mean");
  require_f32(rstd, "add_layernorm_backward", "rstd");
  check_norm_backward("add_layernorm_backward", dy, s, weight, {&mean, &rstd});
  Tensor s2 = rows2d(s.contiguous()), dy2 = rows2d(dy.contiguous());
  Tensor ds2 = rows_or_none(ds, s, "add_layernorm_backward");
  LayerNormGrads g;
  g.dx = Tensor::empty(s.shape(), dt, s.device());
  const bool acc =
      norm_param_grads("add_layernorm_backward", into, true, c, dt, s, g.dweight, &g.dbias);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(s).add_layernorm_backward(dy2, ds2, s2, weight.contiguous(), mean, rstd, dx2, g.dweight,
                               g.dbias, acc);
  return g;
}

AddNormResult add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps) {
  check_add_norm(x, r, weight, "add_rmsnorm");
  const int64_t c = x.size(-1);
  const DType dt = compute_dtype("add_rmsnorm", {&x, &r, &weight});
  Tensor x2 = rows2d(x.contiguous()), r2 = rows2d(r.contiguous());
  AddNormResult out;
  out.s = Tensor::empty(x.shape(), dt, x.device());
  out.y = Tensor::empty(x.shape(), dt, x.device());
  out.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    out.rstd.fill_(std::nan(""));
    return out;
  }
  Tensor s2 = rows2d(out.s), y2 = rows2d(out.y);
  be(x).add_rmsnorm_forward(x2, r2, weight.contiguous(), eps, s2, y2, out.rstd);
  return out;
}

RmsNormGrads add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& rstd,
                                  const NormGradsInto* into) {
  const int64_t c = s.size(-1);
  STRATA_CHECK(dy.shape() == s.shape(), "add_rmsnorm_backward: dy {} for s {}", dy.str(), s.str());
  const DType dt = compute_dtype("add_rmsnorm_backward", {&dy, &s, &weight});
  require_f32(rstd, "add_rmsnorm_backward", "rstd");
  check_norm_backward("add_rmsnorm_backward", dy, s, weight, {&rstd});
  Tensor s2 = rows2d(s.contiguous()), dy2 = rows2d(dy.contiguous());
  Tensor ds2 = rows_or_none(ds, s, "add_rmsnorm_backward");
  RmsNormGrads g;
  g.dx = Tensor::empty(s.shape(), dt, s.device());
  const bool acc =
      norm_param_grads("add_rmsnorm_backward", into, false, c, dt, s, g.dweight, nullptr);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(s).add_rmsnorm_backward(dy2, ds2, s2, weight.contiguous(), rstd, dx2, g.dweight, acc);
  return g;
}

Tensor softmax(const Tensor& x) {
  const DType dt = compute_dtype("softmax", {&x});
  int64_t c = x.size(-1);
  Tensor x2 = rows2d(x.contiguous());
  Tensor y = Tensor::empty(x.shape(), dt, x.device());
  if (c == 0) return y;  // Note [Norms over no features]
  Tensor y2 = rows2d(y);
  be(x).softmax_forward(x2, y2);
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  int64_t c = y.size(-1);
  same_device(y, dy, "softmax_backward");
  const DType dt = compute_dtype("softmax_backward", {&y, &dy});
  STRATA_CHECK(y.ndim() >= 1 && dy.shape() == y.shape(), "softmax_backward: dy {} for y {}",
               dy.str(), y.str());
  Tensor y2 = rows2d(y.contiguous());
  Tensor dy2 = rows2d(dy.contiguous());
  Tensor dx = Tensor::empty(y.shape(), dt, y.device());
  if (c == 0) return dx;  // Note [Norms over no features]
  Tensor dx2 = rows2d(dx);
  be(y).softmax_backward(y2, dy2, dx2);
  return dx;
}

}  // namespace strata::tensor
