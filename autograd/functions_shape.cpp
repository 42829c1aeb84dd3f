// Reductions and shape functions: forward and backward side by side.
#include <numeric>

#include "autograd/functions.h"
#include "autograd/node.h"

namespace strata::autograd {

namespace tops = ::strata::tensor;

namespace {
// Gradient of a reduction over `dim`: broadcast g back to `shape`.
Tensor expand_back(const Tensor& g, const Shape& shape, int dim, bool keepdim) {
  Tensor gk = keepdim ? g : g.unsqueeze(dim);
  return gk.expand(shape).contiguous();
}
}  // namespace

Variable sum(const Variable& x, int dim, bool keepdim) {
  Shape s = x.shape();
  dim = s.normalize(dim);
  return make_output("Sum", tops::sum(x.data(), dim, keepdim), {x},
                     [=](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{expand_back(g[0], s, dim, keepdim)};
                     });
}

Variable mean(const Variable& x, int dim, bool keepdim) {
  Shape s = x.shape();
  dim = s.normalize(dim);
  float inv = 1.f / static_cast<float>(s[dim]);
  return make_output(
      "Mean", tops::mean(x.data(), dim, keepdim), {x}, [=](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{tops::scale(expand_back(g[0], s, dim, keepdim), inv)};
      });
}

Variable max(const Variable& x, int dim, bool keepdim) {
  Shape s = x.shape();
  dim = s.normalize(dim);
  tops::MaxResult r = tops::max(x.data(), dim, true);
  Tensor idx = r.indices;
  Tensor values = keepdim ? r.values : r.values.squeeze(dim);
  Device dev = x.device();
  DType dt = x.dtype();
  return make_output("Max", values, {x}, [=](const std::vector<Tensor>& g) {
    // Scatter to the argmax on the host: max is not on any hot path.
    Tensor gk = (keepdim ? g[0] : g[0].unsqueeze(dim)).contiguous();
    std::vector<float> gv = tops::to_float_vector(gk);
    std::vector<int64_t> iv = tops::to_int_vector(idx);
    std::vector<float> dx(static_cast<size_t>(s.numel()), 0.f);
    int64_t inner = 1;
    for (int d = dim + 1; d < s.ndim(); ++d) inner *= s[d];
    int64_t n = s[dim];
    for (size_t i = 0; i < gv.size(); ++i) {
      int64_t outer = static_cast<int64_t>(i) / inner, in = static_cast<int64_t>(i) % inner;
      dx[(outer * n + iv[i]) * inner + in] += gv[i];
    }
    return std::vector<Tensor>{tops::from_vector(dx, s, dt).to(dev)};
  });
}

Variable sum_all(const Variable& x) {
  Shape s = x.shape();
  return make_output("SumAll", tops::sum_all(x.data()), {x}, [s](const std::vector<Tensor>& g) {
    Shape ones;
    ones.resize(s.ndim(), 1);
    return std::vector<Tensor>{g[0].reshape(ones).expand(s).contiguous()};
  });
}

Variable mean_all(const Variable& x) {
  return scale(sum_all(x), 1.f / static_cast<float>(x.numel()));
}

Variable reshape(const Variable& x, const Shape& shape) {
  Shape s = x.shape();
  return make_output("Reshape", x.data().reshape(shape), {x}, [s](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].reshape(s)};
  });
}

Variable transpose(const Variable& x, int d0, int d1) {
  return make_output("Transpose", x.data().transpose(d0, d1), {x},
                     [d0, d1](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{g[0].transpose(d0, d1)};
                     });
}

Variable permute(const Variable& x, const std::vector<int>& dims) {
  std::vector<int> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[x.shape().normalize(dims[i])] = static_cast<int>(i);
  return make_output("Permute", x.data().permute(dims), {x},
                     [inverse](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{g[0].permute(inverse)};
                     });
}

Variable narrow(const Variable& x, int dim, int64_t start, int64_t length) {
  return slice(x, dim, start, start + length, 1);
}

Variable slice(const Variable& x, int dim, int64_t start, int64_t end, int64_t step) {
  Shape s = x.shape();
  dim = s.normalize(dim);
  DType dt = x.dtype();
  Device dev = x.device();
  return make_output("Slice", x.data().slice(dim, start, end, step), {x},
                     [=](const std::vector<Tensor>& g) {
                       Tensor dx = tops::zeros(s, dt, dev);
                       Tensor view = dx.slice(dim, start, end, step);
                       view.copy_(g[0]);
                       return std::vector<Tensor>{dx};
                     });
}

Variable to(const Variable& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  STRATA_CHECK(is_floating(dtype) && is_floating(x.dtype()),
               "autograd::to converts between float dtypes, not {} -> {}", x.data().str(),
               dtype_name(dtype));
  DType from = x.dtype();
  // The gradient goes back in the input's dtype (Note [Gradient dtypes]).
  return make_output("To", x.data().to(dtype), {x}, [from](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].to(from)};
  });
}

Variable contiguous(const Variable& x) {
  if (x.data().is_contiguous()) return x;
  return make_output("Contiguous", x.data().contiguous(), {x},
                     [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
}

Variable concat(const std::vector<Variable>& xs, int dim) {
  std::vector<Tensor> ts;
  std::vector<int64_t> sizes;
  for (const Variable& x : xs) {
    ts.push_back(x.data());
    sizes.push_back(x.size(dim));
  }
  return make_output(
      "Concat", tops::concat(ts, dim), xs,
      [sizes, dim](const std::vector<Tensor>& g) { return tops::split(g[0], sizes, dim); });
}

std::vector<Variable> split(const Variable& x, const std::vector<int64_t>& sizes, int dim) {
  dim = x.shape().normalize(dim);
  return make_outputs(
      "Split", tops::split(x.data(), sizes, dim), {x},
      [dim](const std::vector<Tensor>& g) { return std::vector<Tensor>{tops::concat(g, dim)}; });
}

}  // namespace strata::autograd
