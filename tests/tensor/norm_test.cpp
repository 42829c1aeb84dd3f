// CPU layernorm, rmsnorm and softmax: forward against double-precision references, backward
// against central differences of those references, and bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "tensor/ops.h"
#include "tests/support/kernel_check.h"
#include "tests/support/norm_into_check.h"

namespace strata::tensor {
namespace {

using strata::testing::all_close;
using strata::testing::dot;
using strata::testing::finite_differences;
using strata::testing::make_tensor;
using strata::testing::random_normal;
using strata::testing::same_bits;
using strata::testing::to_double;
using strata::testing::values;
using strata::testing::with_threads;

constexpr float kEps = 1e-5f;

Tensor rand_tensor(const Shape& s) {
  static uint64_t stream = 900;
  return make_tensor(random_normal(s.numel(), stream++), s);
}

struct LayerNormRef {
  std::vector<double> y, mean, rstd;
};

LayerNormRef layernorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>& b, int64_t n, int64_t c, double eps) {
  LayerNormRef r;
  r.y.resize(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += x[i * c + j];
    m /= c;
    for (int64_t j = 0; j < c; ++j) v += (x[i * c + j] - m) * (x[i * c + j] - m);
    const double s = 1.0 / std::sqrt(v / c + eps);
    for (int64_t j = 0; j < c; ++j) r.y[i * c + j] = (x[i * c + j] - m) * s * w[j] + b[j];
    r.mean.push_back(m);
    r.rstd.push_back(s);
  }
  return r;
}

std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                                int64_t n, int64_t c, double eps, std::vector<double>* rstd) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < c; ++j) ms += x[i * c + j] * x[i * c + j];
    const double s = 1.0 / std::sqrt(ms / c + eps);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = x[i * c + j] * s * w[j];
    if (rstd) rstd->push_back(s);
  }
  return y;
}

std::vector<double> softmax_ref(const std::vector<double>& x, int64_t n, int64_t c) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, x[i * c + j]);
    for (int64_t j = 0; j < c; ++j) s += std::exp(x[i * c + j] - mx);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = std::exp(x[i * c + j] - mx) / s;
  }
  return y;
}

// Shapes: tiny and odd; and one with more rows than reduction chunks, so chunks hold several
// rows and the last chunk is short.
struct Shape2 {
  int64_t n, c;
};
const Shape2 kShapes[] = {{5, 7}, {1, 3}, {131, 19}};

TEST(LayerNorm, ForwardMatchesReference) {
  for (auto [n, c] : kShapes) {
    // A large mean next to a small spread checks the variance does not cancel.
    auto x = random_normal(n * c, 1, 3.f, 0.5f), w = random_normal(c, 2), b = random_normal(c, 3);
    NormResult r =
        layernorm(make_tensor(x, {n, c}), make_tensor(w, {c}), make_tensor(b, {c}), kEps);
    LayerNormRef ref = layernorm_ref(to_double(x), to_double(w), to_double(b), n, c, kEps);
    EXPECT_TRUE(all_close(values(r.y), ref.y, 2e-6, 2e-6)) << n << "x" << c;
    EXPECT_TRUE(all_close(values(r.mean), ref.mean, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(values(r.rstd), ref.rstd, 0, 2e-6));
  }
}

TEST(LayerNorm, ForwardKeepsLeadingDims) {
  auto x = random_normal(2 * 3 * 5, 4), w = random_normal(5, 5), b = random_normal(5, 6);
  NormResult r =
      layernorm(make_tensor(x, {2, 3, 5}), make_tensor(w, {5}), make_tensor(b, {5}), kEps);
  EXPECT_EQ(r.y.shape(), Shape({2, 3, 5}));
  EXPECT_EQ(r.rstd.shape(), Shape({6}));
  EXPECT_TRUE(all_close(values(r.y),
                        layernorm_ref(to_double(x), to_double(w), to_double(b), 6, 5, kEps).y, 2e-6,
                        2e-6));
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  for (auto [n, c] : kShapes) {
    auto x = random_normal(n * c, 10, 0.5f, 1.5f), w = random_normal(c, 11),
         b = random_normal(c, 12), g = random_normal(n * c, 13);
    const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), gd = to_double(g);
    Tensor xt = make_tensor(x, {n, c}), wt = make_tensor(w, {c});
    NormResult f = layernorm(xt, wt, make_tensor(b, {c}), kEps);
    LayerNormGrads grads = layernorm_backward(make_tensor(g, {n, c}), xt, wt, f.mean, f.rstd);

    auto loss_x = [&](const std::vector<double>& v) {
      return dot(layernorm_ref(v, wd, bd, n, c, kEps).y, gd);
    };
    auto loss_w = [&](const std::vector<double>& v) {
      return dot(layernorm_ref(xd, v, bd, n, c, kEps).y, gd);
    };
    auto loss_b = [&](const std::vector<double>& v) {
      return dot(layernorm_ref(xd, wd, v, n, c, kEps).y, gd);
    };
    EXPECT_TRUE(all_close(values(grads.dx), finite_differences(loss_x, xd), 1e-5, 1e-5))
        << n << "x" << c;
    EXPECT_TRUE(all_close(values(grads.dweight), finite_differences(loss_w, wd), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(values(grads.dbias), finite_differences(loss_b, bd), 1e-5, 1e-5));
  }
}

TEST(RmsNorm, ForwardMatchesReference) {
  for (auto [n, c] : kShapes) {
    auto x = random_normal(n * c, 20, 0.3f, 2.f), w = random_normal(c, 21);
    NormResult r = rmsnorm(make_tensor(x, {n, c}), make_tensor(w, {c}), kEps);
    std::vector<double> rstd;
    auto y = rmsnorm_ref(to_double(x), to_double(w), n, c, kEps, &rstd);
    EXPECT_TRUE(all_close(values(r.y), y, 2e-6, 2e-6)) << n << "x" << c;
    EXPECT_TRUE(all_close(values(r.rstd), rstd, 0, 2e-6));
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  for (auto [n, c] : kShapes) {
    auto x = random_normal(n * c, 30, 0.2f, 1.f), w = random_normal(c, 31),
         g = random_normal(n * c, 32);
    const auto xd = to_double(x), wd = to_double(w), gd = to_double(g);
    Tensor xt = make_tensor(x, {n, c}), wt = make_tensor(w, {c});
    NormResult f = rmsnorm(xt, wt, kEps);
    RmsNormGrads grads = rmsnorm_backward(make_tensor(g, {n, c}), xt, wt, f.rstd);
    auto loss_x = [&](const std::vector<double>& v) {
      return dot(rmsnorm_ref(v, wd, n, c, kEps, nullptr), gd);
    };
    auto loss_w = [&](const std::vector<double>& v) {
      return dot(rmsnorm_ref(xd, v, n, c, kEps, nullptr), gd);
    };
    EXPECT_TRUE(all_close(values(grads.dx), finite_differences(loss_x, xd), 1e-5, 1e-5))
        << n << "x" << c;
    EXPECT_TRUE(all_close(values(grads.dweight), finite_differences(loss_w, wd), 1e-5, 1e-5));
  }
}

TEST(Softmax, ForwardMatchesReferenceAndIsStable) {
  for (auto [n, c] : kShapes) {
    // Offsets of +-1000 would overflow a naive exp.
    auto x = random_normal(n * c, 40, 0.f, 3.f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) x[i * c + j] += (i % 2 ? 1000.f : -1000.f);
    Tensor y = softmax(make_tensor(x, {n, c}));
    EXPECT_TRUE(all_close(values(y), softmax_ref(to_double(x), n, c), 1e-7, 2e-5)) << n << "x" << c;
  }
}

TEST(Softmax, FullyMaskedRowGivesZerosNotNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -inf, -inf, 0.f, -inf, 1.f};
  auto y = values(softmax(make_tensor(x, {2, 3})));
  EXPECT_TRUE(all_close(
      y, {0, 0, 0, 1 / (1 + std::exp(1.0)), 0, std::exp(1.0) / (1 + std::exp(1.0))}, 1e-7, 1e-6));
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  for (auto [n, c] : kShapes) {
    auto x = random_normal(n * c, 50, 0.f, 2.f), g = random_normal(n * c, 51);
    const auto xd = to_double(x), gd = to_double(g);
    Tensor y = softmax(make_tensor(x, {n, c}));
    Tensor dx = softmax_backward(y, make_tensor(g, {n, c}));
    auto loss = [&](const std::vector<double>& v) { return dot(softmax_ref(v, n, c), gd); };
    EXPECT_TRUE(all_close(values(dx), finite_differences(loss, xd), 1e-6, 1e-5)) << n << "x" << c;
  }
}

// Note [Norms over no features] in tensor/ops_norm.cpp: nothing to normalise, so empty outputs, [0]
// weight gradients and the statistics of no elements (NaN), for every norm and softmax.
TEST(Norms, OverNoFeaturesGiveEmptyOutputsAndNanStatistics) {
  const Tensor x = zeros({2, 3, 0}), w = zeros({0});
  const auto nan_rows = [](const Tensor& t) {
    EXPECT_EQ(t.shape(), Shape({6}));
    for (float v : values(t)) EXPECT_TRUE(std::isnan(v));
  };
  NormResult ln = layernorm(x, w, w, kEps);
  EXPECT_EQ(ln.y.shape(), x.shape());
  nan_rows(ln.mean);
  nan_rows(ln.rstd);
  LayerNormGrads lg = layernorm_backward(x, x, w, ln.mean, ln.rstd);
  EXPECT_EQ(lg.dx.shape(), x.shape());
  EXPECT_EQ(lg.dweight.shape(), Shape({0}));
  EXPECT_EQ(lg.dbias.shape(), Shape({0}));
  NormResult rn = rmsnorm(x, w, kEps);
  EXPECT_EQ(rn.y.shape(), x.shape());
  nan_rows(rn.rstd);
  RmsNormGrads rg = rmsnorm_backward(x, x, w, rn.rstd);
  EXPECT_EQ(rg.dx.shape(), x.shape());
  EXPECT_EQ(rg.dweight.shape(), Shape({0}));
  AddNormResult al = add_layernorm(x, x, w, w, kEps);
  EXPECT_EQ(al.s.shape(), x.shape());
  nan_rows(al.mean);
  EXPECT_EQ(add_layernorm_backward(x, x, al.s, w, al.mean, al.rstd).dbias.shape(), Shape({0}));
  AddNormResult ar = add_rmsnorm(x, x, w, kEps);
  nan_rows(ar.rstd);
  EXPECT_EQ(add_rmsnorm_backward(x, Tensor(), ar.s, w, ar.rstd).dx.shape(), x.shape());
  const Tensor sm = softmax(x);
  EXPECT_EQ(sm.shape(), x.shape());
  EXPECT_EQ(softmax_backward(sm, x).shape(), x.shape());
}

// A backward reads dy, the weight and the statistics by x's rows and columns: operands of other
// shapes are refused, not read past their ends.
TEST(Norms, BackwardRefusesOperandsOfOtherShapes) {
  const Tensor x = rand_tensor({4, 8}), w = rand_tensor({8}), b = rand_tensor({8});
  NormResult ln = layernorm(x, w, b, kEps);
  NormResult rn = rmsnorm(x, w, kEps);
  const Tensor short_dy = rand_tensor({2, 8}), short_stats = ln.mean.narrow(0, 0, 3);
  EXPECT_THROW(layernorm_backward(short_dy, x, w, ln.mean, ln.rstd), InternalError);
  EXPECT_THROW(layernorm_backward(x, x, w, short_stats, ln.rstd), InternalError);
  EXPECT_THROW(layernorm_backward(x, x, w, ln.mean, short_stats), InternalError);
  EXPECT_THROW(layernorm_backward(x, x, rand_tensor({4}), ln.mean, ln.rstd), InternalError);
  EXPECT_THROW(rmsnorm_backward(short_dy, x, w, rn.rstd), InternalError);
  EXPECT_THROW(rmsnorm_backward(x, x, w, short_stats), InternalError);
  AddNormResult al = add_layernorm(x, x, w, b, kEps);
  EXPECT_THROW(add_layernorm_backward(x, Tensor(), al.s, w, short_stats, al.rstd), InternalError);
  AddNormResult ar = add_rmsnorm(x, x, w, kEps);
  EXPECT_THROW(add_rmsnorm_backward(x, Tensor(), ar.s, rand_tensor({9}), ar.rstd), InternalError);
  EXPECT_THROW(softmax_backward(softmax(x), short_dy), InternalError);
  // The right shapes still run.
  EXPECT_EQ(layernorm_backward(x, x, w, ln.mean, ln.rstd).dx.shape(), x.shape());
  EXPECT_EQ(add_rmsnorm_backward(x, Tensor(), ar.s, w, ar.rstd).dweight.shape(), w.shape());
}

// Note [Norm gradients into their buffer]: given buffers, every norm backward adds its parameter
// gradients into them with the bits of AccumulateGrad's axpy of the returned ones, in every dtype.
TEST(Norms, GradientsAddIntoGivenBuffersWithTheAxpysBits) {
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    strata::testing::expect_norm_grads_added_into(Device::cpu(), dt);
  }
}

// Large enough that every kernel takes its parallel path.
TEST(Norms, DeterministicAcrossThreadCounts) {
  const int64_t n = 997, c = 263;
  auto x = random_normal(n * c, 60, 1.f, 2.f), w = random_normal(c, 61), b = random_normal(c, 62),
       g = random_normal(n * c, 63);
  Tensor xt = make_tensor(x, {n, c}), wt = make_tensor(w, {c}), bt = make_tensor(b, {c}),
         gt = make_tensor(g, {n, c});
  auto run = [&] {
    std::vector<std::vector<float>> out;
    NormResult ln = layernorm(xt, wt, bt, kEps);
    LayerNormGrads lg = layernorm_backward(gt, xt, wt, ln.mean, ln.rstd);
    NormResult rn = rmsnorm(xt, wt, kEps);
    RmsNormGrads rg = rmsnorm_backward(gt, xt, wt, rn.rstd);
    Tensor sm = softmax(xt);
    for (const Tensor& t : {ln.y, ln.mean, ln.rstd, lg.dx, lg.dweight, lg.dbias, rn.y, rn.rstd,
                            rg.dx, rg.dweight, sm, softmax_backward(sm, gt)})
      out.push_back(values(t));
    return out;
  };
  auto one = with_threads(1, run);
  for (int threads : {2, 3, 4}) {
    auto many = with_threads(threads, run);
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(same_bits(one[i], many[i]))
          << "output " << i << " with " << threads << " threads";
  }
}

}  // namespace
}  // namespace strata::tensor
