#include "tests/support/gradcheck.h"

#include <fmt/format.h>

#include <cmath>

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace strata::testing {

// Note [fp32 gradcheck tolerance]
// The kernels are fp32, so central differences carry a rounding error of about
// ulp(f) / eps ~ 1e-7 * |f| / 1e-3 = 1e-4 * |f| on top of the O(eps^2) truncation error. The
// objective is reduced in double so only the op's own rounding matters. atol 2e-3 / rtol 2e-2
// sits about an order of magnitude above that noise and far below the size of a real
// mistake (a wrong sign, factor, transpose or missing term changes gradients by O(1)).

namespace {

using autograd::Variable;
using tensor::Tensor;

float* element(const Tensor& t, int64_t flat) {
  int64_t off = 0;
  for (int d = t.ndim() - 1; d >= 0; --d) {
    int64_t i = flat % t.size(d);
    flat /= t.size(d);
    off += i * t.stride(d);
  }
  return t.data<float>() + off;
}

double objective(const GradFn& fn, const std::vector<Variable>& inputs,
                 const std::vector<float>& w) {
  autograd::NoGradGuard no_grad;
  std::vector<float> out = tensor::to_float_vector(fn(inputs).data());
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

}  // namespace

std::string gradcheck(const GradFn& fn, const std::vector<Variable>& inputs,
                      const GradcheckOptions& opts) {
  for (const Variable& v : inputs)
    if (v.requires_grad()) const_cast<Variable&>(v).set_grad(Tensor());
  Variable out = fn(inputs);
  std::vector<float> w(static_cast<size_t>(out.numel()));
  rng_uniform(w.data(), w.size(), {1234, 5678}, -1.f, 1.f);
  Variable wv(tensor::from_vector(w, out.shape()));
  Variable loss = autograd::sum_all(autograd::mul(out, wv));
  loss.backward();

  std::string worst;
  double worst_excess = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Variable& in = inputs[k];
    if (!in.requires_grad()) continue;
    if (!in.grad().defined()) return fmt::format("input {} received no gradient", k);
    std::vector<float> analytic = tensor::to_float_vector(in.grad());
    for (int64_t i = 0; i < in.numel(); ++i) {
      float* p = element(in.data(), i);
      const float orig = *p;
      *p = static_cast<float>(orig + opts.eps);
      double fp = objective(fn, inputs, w);
      *p = static_cast<float>(orig - opts.eps);
      double fm = objective(fn, inputs, w);
      *p = orig;
      double numeric = (fp - fm) / (2 * opts.eps);
      double a = analytic[static_cast<size_t>(i)];
      double excess = std::fabs(numeric - a) - (opts.atol + opts.rtol * std::fabs(numeric));
      if (!(excess <= 0) && (worst.empty() || excess > worst_excess || std::isnan(excess))) {
        worst_excess = excess;
        worst =
            fmt::format("input {} element {}: analytic {:.6g} vs numeric {:.6g}", k, i, a, numeric);
      }
    }
  }
  return worst;
}

}  // namespace strata::testing
