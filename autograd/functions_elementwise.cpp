// Elementwise differentiable functions: forward and backward side by side.
#include "autograd/functions.h"
#include "autograd/node.h"

namespace strata::autograd {

namespace tops = ::strata::tensor;

namespace {
bool needs(const Variable& v) {
  return v.defined() && v.requires_grad();
}

Variable unary_fn(const char* name, tensor::UnaryOp op, const Variable& x) {
  Tensor xd = x.data();
  return make_output(name, tops::unary(op, xd), {x}, [op, xd](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{tops::unary_backward(op, xd, g[0])};
  });
}
}  // namespace

Variable add(const Variable& a, const Variable& b) {
  Shape sa = a.shape(), sb = b.shape();
  bool na = needs(a), nb = needs(b);
  return make_output("Add", tops::add(a.data(), b.data()), {a, b},
                     [=](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{na ? tops::sum_to(g[0], sa) : Tensor(),
                                                  nb ? tops::sum_to(g[0], sb) : Tensor()};
                     });
}

Variable sub(const Variable& a, const Variable& b) {
  Shape sa = a.shape(), sb = b.shape();
  bool na = needs(a), nb = needs(b);
  return make_output(
      "Sub", tops::sub(a.data(), b.data()), {a, b}, [=](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{na ? tops::sum_to(g[0], sa) : Tensor(),
                                   nb ? tops::scale(tops::sum_to(g[0], sb), -1.f) : Tensor()};
      });
}

Variable mul(const Variable& a, const Variable& b) {
  Tensor ad = a.data(), bd = b.data();
  bool na = needs(a), nb = needs(b);
  return make_output("Mul", tops::mul(ad, bd), {a, b}, [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{na ? tops::sum_to(tops::mul(g[0], bd), ad.shape()) : Tensor(),
                               nb ? tops::sum_to(tops::mul(g[0], ad), bd.shape()) : Tensor()};
  });
}

Variable div(const Variable& a, const Variable& b) {
  Tensor ad = a.data(), bd = b.data();
  bool na = needs(a), nb = needs(b);
  Tensor out = tops::div(ad, bd);
  return make_output("Div", out, {a, b}, [=](const std::vector<Tensor>& g) {
    Tensor ga, gb;
    if (na) ga = tops::sum_to(tops::div(g[0], bd), ad.shape());
    // d(a/b)/db = -(a/b)/b
    if (nb) gb = tops::sum_to(tops::scale(tops::div(tops::mul(g[0], out), bd), -1.f), bd.shape());
    return std::vector<Tensor>{ga, gb};
  });
}

Variable scale(const Variable& x, float alpha) {
  return affine(x, alpha, 0.f);
}

Variable affine(const Variable& x, float alpha, float beta) {
  return make_output("Affine", tops::affine(x.data(), alpha, beta), {x},
                     [alpha](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{tops::scale(g[0], alpha)};
                     });
}

Variable gelu(const Variable& x) {
  return unary_fn("Gelu", tensor::UnaryOp::Gelu, x);
}
Variable silu(const Variable& x) {
  return unary_fn("Silu", tensor::UnaryOp::Silu, x);
}
Variable relu(const Variable& x) {
  return unary_fn("Relu", tensor::UnaryOp::Relu, x);
}
Variable exp(const Variable& x) {
  return unary_fn("Exp", tensor::UnaryOp::Exp, x);
}
Variable log(const Variable& x) {
  return unary_fn("Log", tensor::UnaryOp::Log, x);
}
Variable tanh(const Variable& x) {
  return unary_fn("Tanh", tensor::UnaryOp::Tanh, x);
}
Variable square(const Variable& x) {
  return unary_fn("Square", tensor::UnaryOp::Square, x);
}

Variable bias_add(const Variable& x, const Variable& bias) {
  Shape sb = bias.shape();
  bool nb = needs(bias);
  return make_output("BiasAdd", tops::bias_add(x.data(), bias.data()), {x, bias},
                     [=](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{g[0], nb ? tops::sum_to(g[0], sb) : Tensor()};
                     });
}

Variable dropout(const Variable& x, float p, RngKey key, bool training) {
  if (!training || p == 0.f) return x;
  // The mask is regenerated from the key in backward instead of being stored.
  return make_output("Dropout", tops::dropout(x.data(), p, key), {x},
                     [p, key](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{tops::dropout(g[0], p, key)};
                     });
}

}  // namespace strata::autograd
