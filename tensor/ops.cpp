// The op API (tensor/ops.h): concat, split and the comparisons. The other ops are in files by
// family, as the backends' are: ops_elementwise.cpp, ops_reduce.cpp, ops_linear.cpp, ops_norm.cpp,
// ops_attention.cpp, ops_embedding_loss.cpp; ops_util.h holds the checks they share.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  STRATA_CHECK(!xs.empty(), "concat of no tensors");
  dim = xs[0].shape().normalize(dim);
  Shape s = xs[0].shape();
  s[dim] = 0;
  for (const Tensor& x : xs) {
    same_device(xs[0], x, "concat");
    STRATA_CHECK(x.ndim() == s.ndim() && x.dtype() == xs[0].dtype(), "concat: {} vs {}", x.str(),
                 xs[0].str());
    for (int i = 0; i < s.ndim(); ++i)
      if (i != dim)
        STRATA_CHECK(x.size(i) == xs[0].size(i), "concat: {} vs {} off dim {}", x.str(),
                     xs[0].str(), dim);
    s[dim] += x.size(dim);
  }
  Tensor out = Tensor::empty(s, xs[0].dtype(), xs[0].device());
  be(out).concat(xs, dim, out);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  dim = x.shape().normalize(dim);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(dim, start, s));
    start += s;
  }
  STRATA_CHECK(start == x.size(dim), "split sizes add up to {}, dim has {}", start, x.size(dim));
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.shape() == b.shape(), "max_abs_diff: {} vs {}", a.str(), b.str());
  std::vector<float> va = to_float_vector(a), vb = to_float_vector(b);
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double d = std::fabs(static_cast<double>(va[i]) - vb[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (!(a.shape() == b.shape())) return false;
  std::vector<float> va = to_float_vector(a), vb = to_float_vector(b);
  for (size_t i = 0; i < va.size(); ++i) {
    double d = std::fabs(static_cast<double>(va[i]) - vb[i]);
    if (!(d <= atol + rtol * std::fabs(static_cast<double>(vb[i])))) return false;
  }
  return true;
}

}  // namespace strata::tensor
