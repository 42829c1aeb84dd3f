// The op API's reductions (tensor/ops.h): sum_to, sum, mean, max, top_k, the sums of squares
// and L2 norms, and gradient clipping's scale_unless_equal_.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  STRATA_CHECK(broadcast_shapes(shape, x.shape()) == x.shape(),
               "sum_to: {} is not broadcastable to {}", shape.str(), x.shape().str());
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  be(x).sum_to(x, out);
  return out;
}

namespace {
Tensor reduce(ReduceOp op, const Tensor& x, int dim, bool keepdim, Tensor* indices) {
  dim = x.shape().normalize(dim);
  Shape s = x.shape();
  s[dim] = 1;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (indices) *indices = Tensor::empty(s, DType::I64, x.device());
  be(x).reduce(op, x, dim, out, indices);
  if (!keepdim) {
    out = out.squeeze(dim);
    if (indices) *indices = indices->squeeze(dim);
  }
  return out;
}
}  // namespace

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  return reduce(ReduceOp::Sum, x, dim, keepdim, nullptr);
}
Tensor mean(const Tensor& x, int dim, bool keepdim) {
  return reduce(ReduceOp::Mean, x, dim, keepdim, nullptr);
}
MaxResult max(const Tensor& x, int dim, bool keepdim) {
  // The maximum of no elements has no value (and no index): checked here, for every backend.
  STRATA_CHECK(x.size(x.shape().normalize(dim)) > 0, "max over dim {} of {}, which has size 0", dim,
               x.str());
  MaxResult r;
  r.values = reduce(ReduceOp::Max, x, dim, keepdim, &r.indices);
  return r;
}

TopKResult top_k(const Tensor& x, int64_t k) {
  STRATA_CHECK(x.ndim() >= 1 && is_floating(x.dtype()),
               "top_k of {}: needs a float tensor of at "
               "least one dim",
               x.str());
  const int64_t n = x.size(-1);
  STRATA_CHECK(k >= 0 && k <= n, "top_k: k = {} is outside [0, {}] for {}", k, n, x.str());
  Shape s = x.shape();
  s[x.ndim() - 1] = k;
  TopKResult r;
  r.values = Tensor::empty(s, x.dtype(), x.device());
  r.indices = Tensor::empty(s, DType::I64, x.device());
  if (r.values.numel() == 0) return r;
  // Rows of unit-stride elements, one stride apart: a 2-D view with a unit inner stride as it is
  // (a sampler's [rows, vocab] slice of padded logits), anything else as a contiguous copy.
  Tensor rows = x.ndim() == 2 && x.stride(1) == 1 ? x : x.contiguous().view({-1, n});
  Tensor v2 = r.values.view({-1, k}), i2 = r.indices.view({-1, k});
  be(x).top_k(rows, v2, i2);
  return r;
}

Tensor sum_all(const Tensor& x) {
  Tensor flat = x.reshape({x.numel()});
  Tensor out = Tensor::empty({1}, x.dtype(), x.device());
  be(x).reduce(ReduceOp::Sum, flat, 0, out, nullptr);
  return out.view(Shape{});
}

double sum_squares(const Tensor& x) {
  return be(x).sum_squares(x);
}
std::vector<double> sum_squares_many(const std::vector<Tensor>& xs) {
  if (xs.empty()) return {};
  for (const Tensor& x : xs) same_device(xs.front(), x, "sum_squares_many");
  return be(xs.front()).sum_squares_many(xs);
}
double l2_norm(const Tensor& x) {
  return std::sqrt(sum_squares(x));
}
double global_l2_norm(const std::vector<Tensor>& xs) {
  double s = 0;
  for (const Tensor& x : xs) s += sum_squares(x);
  return std::sqrt(s);
}

void scale_unless_equal_(Tensor& x, const Tensor& g, float expected) {
  same_device(x, g, "scale_unless_equal_");
  compute_dtype("scale_unless_equal_", {&x});
  require_f32(g, "scale_unless_equal_", "g");
  STRATA_CHECK(g.numel() == 1, "scale_unless_equal_: g {} is not one element", g.str());
  be(x).scale_unless_equal(x, g, expected);
}

}  // namespace strata::tensor
