// The fused ops on the CPU (the reference backend):
// - add_layernorm / add_rmsnorm are bitwise add then the norm, forward and backward (with the
//   engine's ds + dx as the unfused graph does it), in f32, bf16 and f16 (Note [Fused residual
//   norm]), and deterministic across thread counts;
// - linear and its backward pieces against a double-precision naive reference, bitwise the
//   unfused kernels in f32, and one rounding of the f32 result in bf16/f16 (Note [Linear
//   epilogues]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor_test_util.h"

namespace strata::tensor {
namespace {

using testing::rand;

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

Tensor lp(const Shape& s, uint64_t seed, DType dt, float lo = -1.f, float hi = 1.f) {
  return rand(s, seed, lo, hi).to(dt);
}

// Shapes: odd widths, a single row, more rows than the reduction chunks (so chunks hold several
// rows and the last is short), and 3-D inputs (flattened to rows).
const Shape kNormShapes[] = {{5, 7}, {1, 3}, {131, 19}, {2, 9, 24}};

TEST(AddLayerNorm, IsBitwiseAddThenLayerNorm) {
  for (DType dt : kDtypes)
    for (const Shape& s : kNormShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.str());
      const int64_t c = s.back();
      // A mean far from 0 next to a small spread: the norm must read the rounded sum.
      const Tensor x = lp(s, 1, dt, 2.f, 4.f), r = lp(s, 2, dt), w = lp({c}, 3, dt),
                   b = lp({c}, 4, dt), dy = lp(s, 5, dt), ds = lp(s, 6, dt);
      AddNormResult f = add_layernorm(x, r, w, b, 1e-5f);
      const Tensor s_ref = add(x, r);
      NormResult u = layernorm(s_ref, w, b, 1e-5f);
      EXPECT_TRUE(same_bits(f.s, s_ref));
      EXPECT_TRUE(same_bits(f.y, u.y));
      EXPECT_TRUE(same_bits(f.mean, u.mean));
      EXPECT_TRUE(same_bits(f.rstd, u.rstd));
      LayerNormGrads g = layernorm_backward(dy, s_ref, w, u.mean, u.rstd);
      // The engine sums the two gradients of s as add() does (Note [Summing gradients in place]).
      LayerNormGrads fg = add_layernorm_backward(dy, ds, f.s, w, f.mean, f.rstd);
      EXPECT_TRUE(same_bits(fg.dx, add(ds, g.dx)));
      EXPECT_TRUE(same_bits(fg.dweight, g.dweight));
      EXPECT_TRUE(same_bits(fg.dbias, g.dbias));
      if (dt == DType::BF16 && s.numel() > 1000) {
        // The check can fail: one rounding of ds + dx in f32 gives other bits somewhere.
        const Tensor dx32 = layernorm_backward(dy.to(DType::F32), s_ref.to(DType::F32),
                                               w.to(DType::F32), u.mean, u.rstd)
                                .dx;
        EXPECT_FALSE(same_bits(fg.dx, add(ds.to(DType::F32), dx32).to(dt)));
      }
      // No gradient reached s: dsum is the norm's dx itself.
      LayerNormGrads f0 = add_layernorm_backward(dy, Tensor(), f.s, w, f.mean, f.rstd);
      EXPECT_TRUE(same_bits(f0.dx, g.dx));
      EXPECT_TRUE(same_bits(f0.dweight, g.dweight));
    }
}

TEST(AddRmsNorm, IsBitwiseAddThenRmsNorm) {
  for (DType dt : kDtypes)
    for (const Shape& s : kNormShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.str());
      const int64_t c = s.back();
      const Tensor x = lp(s, 11, dt), r = lp(s, 12, dt), w = lp({c}, 13, dt), dy = lp(s, 15, dt),
                   ds = lp(s, 16, dt);
      AddNormResult f = add_rmsnorm(x, r, w, 1e-6f);
      const Tensor s_ref = add(x, r);
      NormResult u = rmsnorm(s_ref, w, 1e-6f);
      EXPECT_TRUE(same_bits(f.s, s_ref));
      EXPECT_TRUE(same_bits(f.y, u.y));
      EXPECT_TRUE(same_bits(f.rstd, u.rstd));
      EXPECT_FALSE(f.mean.defined());
      RmsNormGrads g = rmsnorm_backward(dy, s_ref, w, u.rstd);
      RmsNormGrads fg = add_rmsnorm_backward(dy, ds, f.s, w, f.rstd);
      EXPECT_TRUE(same_bits(fg.dx, add(ds, g.dx)));
      EXPECT_TRUE(same_bits(fg.dweight, g.dweight));
      RmsNormGrads f0 = add_rmsnorm_backward(dy, Tensor(), f.s, w, f.rstd);
      EXPECT_TRUE(same_bits(f0.dx, g.dx));
    }
}

TEST(AddNorm, TakesNonContiguousInputs) {
  const Tensor x = rand({7, 12}, 21).transpose(0, 1), r = rand({12, 7}, 22), w = rand({7}, 23),
               b = rand({7}, 24);
  AddNormResult f = add_layernorm(x, r, w, b, 1e-5f);
  EXPECT_TRUE(same_bits(f.y, layernorm(add(x, r), w, b, 1e-5f).y));
  AddNormResult g = add_rmsnorm(x, r, w, 1e-5f);
  EXPECT_TRUE(same_bits(g.y, rmsnorm(add(x, r), w, 1e-5f).y));
}

TEST(AddNorm, DeterministicAcrossThreadCounts) {
  // Large enough that every loop takes its parallel path.
  const int64_t n = 997, c = 263;
  const Tensor x = rand({n, c}, 31), r = rand({n, c}, 32), w = rand({c}, 33), b = rand({c}, 34),
               dy = rand({n, c}, 35), ds = rand({n, c}, 36);
  auto run = [&] {
    AddNormResult l = add_layernorm(x, r, w, b, 1e-5f);
    LayerNormGrads lg = add_layernorm_backward(dy, ds, l.s, w, l.mean, l.rstd);
    AddNormResult m = add_rmsnorm(x, r, w, 1e-5f);
    RmsNormGrads mg = add_rmsnorm_backward(dy, ds, m.s, w, m.rstd);
    return std::vector<Tensor>{l.s,      l.y, l.rstd, lg.dx,     lg.dweight,
                               lg.dbias, m.y, mg.dx,  mg.dweight};
  };
  std::vector<Tensor> one;
  testing::for_thread_counts({1, 2, 3}, [&](int threads) {
    std::vector<Tensor> got = run();
    if (one.empty()) {
      one = got;
      return;
    }
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(same_bits(got[i], one[i])) << "output " << i << " with " << threads << " threads";
  });
}

TEST(AddNorm, MismatchedOperandsAreUserErrors) {
  const Tensor x = rand({3, 4}, 41), w = rand({4}, 42);
  EXPECT_THROW(add_layernorm(x, rand({1, 4}, 43), w, w, 1e-5f), UserError);  // no broadcasting
  EXPECT_THROW(add_rmsnorm(x, x.to(DType::BF16), w, 1e-5f), UserError);
}

// ---- linear ----

double gelu_ref(double v) {
  return 0.5 * v *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
}

double gelu_grad_ref(double v) {
  const double k = std::sqrt(2.0 / std::numbers::pi), t = std::tanh(k * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<float> f = to_float_vector(t);
  return std::vector<double>(f.begin(), f.end());
}

// |got - want| <= rtol |want| + atol for every element, naming the worst one.
::testing::AssertionResult near(const Tensor& got, const std::vector<double>& want, double rtol,
                                double atol) {
  std::vector<float> g = to_float_vector(got);
  if (g.size() != want.size()) return ::testing::AssertionFailure() << "size " << g.size();
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - want[i]) <= rtol * std::fabs(want[i]) + atol))
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << want[i];
  return ::testing::AssertionSuccess();
}

// f64 x [m, k] @ w[n, k]^T + b: the naive reference.
std::vector<double> affine_ref(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b.empty() ? 0.0 : b[j];
      for (int64_t p = 0; p < k; ++p) s += x[i * k + p] * w[j * k + p];
      y[i * n + j] = s;
    }
  return y;
}

// Relative tolerance of one rounding to dt, plus the f32 accumulation noise.
double tol(DType dt) {
  return dt == DType::BF16 ? std::ldexp(1.0, -8) : dt == DType::F16 ? std::ldexp(1.0, -11) : 2e-6;
}

TEST(Linear, MatchesANaiveReference) {
  const int64_t m = 13, k = 37, n = 20;
  for (DType dt : kDtypes)
    for (bool with_bias : {true, false})
      for (Activation act : {Activation::None, Activation::Gelu}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (with_bias ? " bias" : " no bias") +
                     (act == Activation::Gelu ? " gelu" : ""));
        const Tensor x = lp({m, k}, 51, dt), w = lp({n, k}, 52, dt);
        const Tensor b = with_bias ? lp({n}, 53, dt) : Tensor();
        LinearResult r = linear(x, w, b, act, act == Activation::Gelu);
        std::vector<double> pre = affine_ref(
            doubles(x), doubles(w), with_bias ? doubles(b) : std::vector<double>{}, m, k, n);
        std::vector<double> y = pre;
        if (act == Activation::Gelu)
          for (double& v : y) v = gelu_ref(v);
        EXPECT_EQ(r.y.dtype(), dt);
        EXPECT_TRUE(near(r.y, y, tol(dt), 1e-5));
        if (act == Activation::Gelu) {
          EXPECT_TRUE(near(r.pre, pre, tol(dt), 1e-5));
        }
      }
}

TEST(Linear, KeepsLeadingDims) {
  const Tensor x = rand({2, 3, 5}, 61), w = rand({4, 5}, 62), b = rand({4}, 63);
  LinearResult r = linear(x, w, b, Activation::Gelu, true);
  EXPECT_EQ(r.y.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(r.pre.shape(), Shape({2, 3, 4}));
  EXPECT_TRUE(same_bits(r.y, linear(x.reshape({6, 5}), w, b, Activation::Gelu).y.view({2, 3, 4})));
}

// No input features (K = 0) or no outputs (N = 0), as matmul takes them: the empty sum is 0, so
// y = act(bias) and the weight gradient over no features is [N, 0]; rows still pair up.
TEST(Linear, TakesNoFeaturesAndNoOutputs) {
  const Tensor x = zeros({2, 3, 0}, DType::F32), w = zeros({4, 0}, DType::F32), b = rand({4}, 64);
  LinearResult r = linear(x, w, b, Activation::Gelu, true);
  EXPECT_EQ(r.y.shape(), Shape({2, 3, 4}));
  const Tensor want = gelu(b);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(r.y.data<float>()[i * 4 + j], want.data<float>()[j]);
      EXPECT_EQ(r.pre.data<float>()[i * 4 + j], b.data<float>()[j]);
    }
  EXPECT_EQ(linear(rand({3, 5}, 65), zeros({0, 5}, DType::F32), zeros({0}, DType::F32)).y.shape(),
            Shape({3, 0}));
  const Tensor dy = rand({2, 3, 4}, 66);
  LinearWeightGrads g = linear_backward_weight(dy, x, true);
  EXPECT_EQ(g.dweight.shape(), Shape({4, 0}));
  EXPECT_TRUE(same_bits(g.dbias, sum_to(dy.reshape({6, 4}), {4})));
  LinearGeluGrads gg = linear_backward_gelu(dy, w, zeros({2, 3, 0}, DType::F32), true);
  EXPECT_EQ(gg.dpre.shape(), Shape({2, 3, 0}));
  EXPECT_EQ(gg.dbias.shape(), Shape({0}));
  // Rows are counted without the feature dim: 6 rows of dy against 5 of x is still a mismatch.
  EXPECT_THROW(linear_backward_weight(dy, zeros({5, 0}, DType::F32), true), InternalError);
}

// In f32 the CPU runs the unfused kernels themselves: the same bits (Note [Linear epilogues]).
TEST(Linear, F32IsBitwiseTheUnfusedOps) {
  const int64_t m = 29, k = 48, n = 40, p = 24;
  const Tensor x = rand({m, k}, 71), w = rand({n, k}, 72), b = rand({n}, 73), dy = rand({m, n}, 74);
  const Tensor w2 = rand({p, n}, 75), dz = rand({m, p}, 76);
  const Tensor pre = bias_add(matmul(x, w, false, true), b);
  LinearResult r = linear(x, w, b, Activation::Gelu, true);
  EXPECT_TRUE(same_bits(r.pre, pre));
  EXPECT_TRUE(same_bits(r.y, gelu(pre)));
  EXPECT_TRUE(same_bits(linear(x, w, b).y, pre));
  LinearWeightGrads g = linear_backward_weight(dy, x, true);
  EXPECT_TRUE(same_bits(g.dweight, matmul(dy, x, true, false)));
  EXPECT_TRUE(same_bits(g.dbias, sum_to(dy, {n})));
  // Into a buffer (Note [Weight gradients into their buffer]): old + product, one rounding; into
  // zeros, the returned gradient's bits.
  const Tensor old = rand({n, k}, 77);
  Tensor into = old.clone(), into_zero = zeros({n, k}, DType::F32);
  EXPECT_TRUE(same_bits(linear_backward_weight_into(dy, x, into, true), g.dbias));
  EXPECT_TRUE(same_bits(into, add(old, g.dweight)));
  EXPECT_FALSE(linear_backward_weight_into(dy, x, into_zero, false).defined());
  EXPECT_TRUE(same_bits(into_zero, g.dweight));
  LinearGeluGrads d = linear_backward_gelu(dz, w2, pre, true);
  const Tensor dpre = unary_backward(UnaryOp::Gelu, pre, matmul(dz, w2));
  EXPECT_TRUE(same_bits(d.dpre, dpre));
  EXPECT_TRUE(same_bits(d.dbias, sum_to(dpre, {n})));
}

// In bf16/f16 each output is the f32 computation on the same inputs rounded once: not the
// composition of rounded ops.
TEST(Linear, LowPrecisionRoundsOnce) {
  const int64_t m = 17, k = 40, n = 24, p = 16;
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = lp({m, k}, 81, dt), w = lp({n, k}, 82, dt), b = lp({n}, 83, dt);
    const Tensor dy = lp({m, n}, 84, dt), w2 = lp({p, n}, 85, dt), dz = lp({m, p}, 86, dt);
    // The product in f32 from the low-precision inputs (the same GEMM the CPU runs), then bias
    // and GELU on f32 values.
    Tensor acc = zeros({m, n}, DType::F32);
    matmul_out(x, w, acc, false, true);
    const Tensor pre32 = bias_add(acc, b.to(DType::F32));
    LinearResult r = linear(x, w, b, Activation::Gelu, true);
    EXPECT_TRUE(same_bits(r.pre, pre32.to(dt)));
    EXPECT_TRUE(same_bits(r.y, gelu(pre32).to(dt)));
    // The bias gradient sums the rounded dy (the input), in f32 or wider, rounded once.
    LinearWeightGrads g = linear_backward_weight(dy, x, true);
    EXPECT_TRUE(same_bits(g.dbias, sum_to(dy.to(DType::F32), {n}).to(dt)));
    // Into a buffer: the old value added to the f32 product, one rounding.
    const Tensor old = lp({n, k}, 87, dt);
    Tensor prod = zeros({n, k}, DType::F32);
    matmul_out(dy, x, prod, true, false);
    Tensor into = old.clone();
    linear_backward_weight_into(dy, x, into, false);
    EXPECT_TRUE(same_bits(into, add(old.to(DType::F32), prod).to(dt)));
    // A buffer of another dtype or shape is refused.
    Tensor wrong = zeros({n, k}, DType::F32);
    EXPECT_THROW(linear_backward_weight_into(dy, x, wrong, false), Error);
    // dgelu on the f32 product, one rounding; the bias gradient from the unrounded dpre.
    Tensor dh = zeros({m, n}, DType::F32);
    matmul_out(dz, w2, dh, false, false);
    const Tensor dpre32 = unary_backward(UnaryOp::Gelu, r.pre.to(DType::F32), dh);
    LinearGeluGrads d = linear_backward_gelu(dz, w2, r.pre, true);
    EXPECT_TRUE(same_bits(d.dpre, dpre32.to(dt)));
    EXPECT_TRUE(same_bits(d.dbias, sum_to(dpre32, {n}).to(dt)));
  }
}

TEST(Linear, BackwardPiecesMatchANaiveReference) {
  const int64_t m = 19, k = 11, n = 16, p = 9;
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = lp({m, k}, 91, dt), dy = lp({m, n}, 92, dt), w2 = lp({p, n}, 93, dt),
                 dz = lp({m, p}, 94, dt), pre = lp({m, n}, 95, dt, -3.f, 3.f);
    const std::vector<double> xv = doubles(x), dyv = doubles(dy), w2v = doubles(w2),
                              dzv = doubles(dz), prev = doubles(pre);
    std::vector<double> dw(static_cast<size_t>(n * k), 0.0), db(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        db[j] += dyv[i * n + j];
        for (int64_t q = 0; q < k; ++q) dw[j * k + q] += dyv[i * n + j] * xv[i * k + q];
      }
    LinearWeightGrads g = linear_backward_weight(dy, x, true);
    EXPECT_TRUE(near(g.dweight, dw, tol(dt), 1e-5));
    EXPECT_TRUE(near(g.dbias, db, tol(dt), 1e-5));
    std::vector<double> dpre(static_cast<size_t>(m * n)), db1(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < p; ++q) s += dzv[i * p + q] * w2v[q * n + j];
        dpre[i * n + j] = s * gelu_grad_ref(prev[i * n + j]);
        db1[j] += dpre[i * n + j];
      }
    LinearGeluGrads d = linear_backward_gelu(dz, w2, pre, true);
    EXPECT_TRUE(near(d.dpre, dpre, tol(dt), 1e-5));
    EXPECT_TRUE(near(d.dbias, db1, tol(dt), 1e-5));
    EXPECT_FALSE(linear_backward_gelu(dz, w2, pre, false).dbias.defined());
  }
}

TEST(Linear, MismatchedDtypesAreUserErrors) {
  const Tensor x = rand({3, 4}, 101), w = rand({5, 4}, 102);
  EXPECT_THROW(linear(x, w.to(DType::BF16), Tensor()), UserError);
  EXPECT_THROW(linear(x, w, rand({5}, 103).to(DType::F16)), UserError);
}

}  // namespace
}  // namespace strata::tensor
