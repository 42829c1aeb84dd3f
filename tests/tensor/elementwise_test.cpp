// Broadcasting binary ops against a naive reference, affine, axpy, unary ops and their backward
// against closed forms and finite differences, bias_add, dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/rng.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace strata::tensor {
namespace {

using testing::at;
using testing::make;
using testing::rand;
using testing::values;

float apply(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
  }
  return 0;
}

Tensor run(BinaryOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::Add:
      return add(a, b);
    case BinaryOp::Sub:
      return sub(a, b);
    case BinaryOp::Mul:
      return mul(a, b);
    case BinaryOp::Div:
      return div(a, b);
  }
  return {};
}

// Index of out's element `idx` in a broadcast operand t (right-aligned, size-1 dims pinned to 0).
std::vector<int64_t> bcast_index(const Tensor& t, const std::vector<int64_t>& idx) {
  std::vector<int64_t> r(t.ndim());
  const int lead = static_cast<int>(idx.size()) - t.ndim();
  for (int d = 0; d < t.ndim(); ++d) r[d] = t.size(d) == 1 ? 0 : idx[d + lead];
  return r;
}

// out must equal the naive float evaluation exactly: each element is one IEEE operation.
void expect_binary_matches(const Tensor& a, const Tensor& b) {
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
    Tensor out = run(op, a, b);
    ASSERT_EQ(out.shape(), broadcast_shapes(a.shape(), b.shape()));
    for (int64_t i = 0; i < out.numel(); ++i) {
      auto idx = testing::unravel(out.shape(), i);
      const float expect = apply(op, at(a, bcast_index(a, idx)), at(b, bcast_index(b, idx)));
      ASSERT_EQ(testing::bits(at(out, idx)), testing::bits(expect))
          << "op " << static_cast<int>(op) << " " << a.str() << " with " << b.str() << " at " << i;
    }
  }
}

TEST(Binary, BroadcastShapesAgainstNaive) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 5, 7}, {5, 1}},  {{3, 5, 7}, {7}},     {{3, 5, 7}, {3, 5, 7}},
      {{1}, {4, 3}},        {{}, {2, 3}},         {{4, 1, 3}, {1, 5, 1}},
      {{6, 1}, {1, 7}},     {{5, 1}, {3, 5, 7}},  {{2, 1, 4, 1}, {3, 1, 5}},
      {{64, 1024}, {1024}}, {{1024}, {64, 1024}}, {{300, 257}, {300, 1}}};
  uint64_t seed = 1;
  for (const auto& [sa, sb] : cases) {
    Tensor a = rand(sa, seed++);
    Tensor b = rand(sb, seed++, 0.5f, 2.f);  // away from zero for Div
    expect_binary_matches(a, b);
  }
}

TEST(Binary, NonContiguousAndZeroStrideInputs) {
  Tensor a = rand({7, 5, 3}, 1).permute({2, 1, 0});            // [3, 5, 7], permuted
  Tensor b = rand({5, 10}, 2, 0.5f, 2.f).slice(1, 0, 10, 10);  // [5, 1], stride 10
  expect_binary_matches(a, b);
  Tensor c = rand({7, 3}, 3, 0.5f, 2.f).transpose(0, 1);  // [3, 7]
  expect_binary_matches(a.narrow(1, 1, 1), c.unsqueeze(1));
  Tensor e = rand({1, 7}, 4).expand({5, 7});  // zero stride, same shape as out
  expect_binary_matches(a, e);
  Tensor big = rand({300, 200}, 5).transpose(0, 1);  // threaded strided path
  Tensor col = rand({200, 1}, 6, 0.5f, 2.f);
  expect_binary_matches(big, col);
}

TEST(Binary, ThreadCountDoesNotChangeBits) {
  Tensor a = rand({123, 457}, 1), b = rand({457}, 2, 0.5f, 2.f);
  Tensor ref = div(a, b);
  testing::for_thread_counts({1, 3}, [&](int) {
    EXPECT_TRUE(testing::same_bits(div(a, b), ref));
    EXPECT_TRUE(testing::same_bits(div(a.transpose(0, 1).contiguous().transpose(0, 1), b), ref));
  });
}

TEST(Affine, AnyLayout) {
  Tensor x = rand({40, 30}, 1);
  for (const Tensor& v : {x, x.transpose(0, 1), x.slice(0, 0, 40, 3)}) {
    Tensor y = affine(v, 1.5f, -0.25f);
    for (int64_t i = 0; i < v.numel(); ++i) {
      auto idx = testing::unravel(v.shape(), i);
      ASSERT_EQ(at(y, idx), 1.5f * at(v, idx) + -0.25f);
    }
  }
  Tensor s = scale(x, 3.f);
  EXPECT_EQ(at(s, {2, 3}), 3.f * at(x, {2, 3}));
}

TEST(Axpy, AccumulatesInPlace) {
  Tensor x = rand({1000, 70}, 1), y = rand({1000, 70}, 2);
  std::vector<float> y0 = values(y), xv = values(x);
  axpy_(0.75f, x, y);
  std::vector<float> y1 = values(y);
  for (size_t i = 0; i < y0.size(); ++i) ASSERT_EQ(y1[i], y0[i] + 0.75f * xv[i]);
  // Non-contiguous x is made contiguous by the op layer.
  Tensor z = zeros({70, 1000});
  axpy_(2.f, x.transpose(0, 1), z);
  EXPECT_EQ(at(z, {5, 9}), 2.f * at(x, {9, 5}));
}

// ---- unary ----

constexpr double kSqrt2OverPi = 0.79788456080286535588;

double ref_forward(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Gelu:
      return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
    case UnaryOp::Silu:
      return x / (1.0 + std::exp(-x));
    case UnaryOp::Relu:
      return x > 0 ? x : 0.0;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return std::log(x);
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Sqrt:
      return std::sqrt(x);
    case UnaryOp::Square:
      return x * x;
    case UnaryOp::Tanh:
      return std::tanh(x);
  }
  return 0;
}

double ref_grad(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Gelu: {
      const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
      const double sech2 = 1.0 / (std::cosh(u) * std::cosh(u));
      return 0.5 * (1 + std::tanh(u)) + 0.5 * x * sech2 * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
    }
    case UnaryOp::Silu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1 + x * (1 - s));
    }
    case UnaryOp::Relu:
      return x > 0 ? 1.0 : 0.0;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return 1.0 / x;
    case UnaryOp::Neg:
      return -1.0;
    case UnaryOp::Sqrt:
      return 0.5 / std::sqrt(x);
    case UnaryOp::Square:
      return 2 * x;
    case UnaryOp::Tanh:
      return 1.0 / (std::cosh(x) * std::cosh(x));
  }
  return 0;
}

constexpr UnaryOp kUnaryOps[] = {UnaryOp::Gelu, UnaryOp::Silu,   UnaryOp::Relu,
                                 UnaryOp::Exp,  UnaryOp::Log,    UnaryOp::Neg,
                                 UnaryOp::Sqrt, UnaryOp::Square, UnaryOp::Tanh};

bool positive_only(UnaryOp op) {
  return op == UnaryOp::Log || op == UnaryOp::Sqrt;
}

// Inputs on a fine grid, plus values near the branch points of the kernels.
std::vector<float> unary_inputs(UnaryOp op) {
  std::vector<float> v;
  const float lo = positive_only(op) ? 1e-3f : -12.f;
  for (int i = 0; i <= 24000; ++i) v.push_back(lo + (12.f - lo) * static_cast<float>(i) / 24000.f);
  for (float s : {0.625f, 0.6249999f, 0.6250001f, 1e-6f, 1e-30f, 40.f, 80.f}) {
    v.push_back(s);
    if (!positive_only(op)) v.push_back(-s);
  }
  return v;
}

// Forward: within a few ulp of the double reference (relative to the magnitude of the terms the
// formula adds, for GELU/SiLU whose results cancel for negative x).
TEST(Unary, ForwardAgainstDoubleReference) {
  for (UnaryOp op : kUnaryOps) {
    std::vector<float> in = unary_inputs(op);
    Tensor x = make(in, {static_cast<int64_t>(in.size())});
    std::vector<float> got = values(unary(op, x));
    double worst = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const double ref = ref_forward(op, in[i]);
      // Scale of the result's rounding: |result|, or for GELU the size of the terms it adds
      // (0.5 x + 0.5 x tanh(u) cancels for negative x, as it does in any f32 evaluation).
      double scale = std::fabs(ref);
      if (op == UnaryOp::Gelu) scale = std::max(scale, 0.5 * std::fabs(in[i]));
      const double err = std::fabs(got[i] - ref) / std::max(scale, 1e-37);
      worst = std::max(worst, err);
      ASSERT_LE(err, 3e-7) << "op " << static_cast<int>(op) << " x=" << in[i] << " got " << got[i]
                           << " want " << ref;
    }
    RecordProperty("worst_rel_err_op" + std::to_string(static_cast<int>(op)),
                   fmt::format("{:.3g}", worst));
  }
}

TEST(Unary, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  Tensor x = make({-inf, inf, nan, -100.f, 100.f, 0.f}, {6});
  auto v = [&](UnaryOp op) { return values(unary(op, x)); };
  auto e = v(UnaryOp::Exp);
  EXPECT_EQ(e[0], 0.f);
  EXPECT_EQ(e[1], inf);
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], 0.f);  // exp(-100) underflows (flushed: no subnormal results)
  EXPECT_EQ(e[4], inf);
  EXPECT_EQ(e[5], 1.f);
  auto t = v(UnaryOp::Tanh);
  EXPECT_EQ(t[0], -1.f);
  EXPECT_EQ(t[1], 1.f);
  EXPECT_TRUE(std::isnan(t[2]));
  EXPECT_EQ(t[5], 0.f);
  auto g = v(UnaryOp::Gelu);
  EXPECT_EQ(g[4], 100.f);
  EXPECT_EQ(g[3], 0.f);
  EXPECT_TRUE(std::isnan(g[2]));
  auto r = v(UnaryOp::Relu);
  EXPECT_EQ(r[0], 0.f);
  EXPECT_TRUE(std::isnan(r[2]));
  auto s = v(UnaryOp::Silu);
  EXPECT_EQ(s[4], 100.f);
  EXPECT_EQ(s[3], 0.f);
}

// Backward: dy * f'(x) within a few ulp-scale of the closed form in double.
TEST(Unary, BackwardAgainstClosedForm) {
  for (UnaryOp op : kUnaryOps) {
    std::vector<float> in = unary_inputs(op);
    const int64_t n = static_cast<int64_t>(in.size());
    Tensor x = make(in, {n});
    Tensor dy = rand({n}, 9, 0.5f, 1.5f);
    std::vector<float> got = values(unary_backward(op, x, dy)), g = values(dy);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double ref = g[i] * ref_grad(op, in[i]);
      // GELU's and tanh's 1 - t^2 and SiLU's s (1 + x (1 - s)) are evaluated from rounded
      // f32 pieces: allow 2e-6 of the largest term.
      double scale = std::fabs(ref);
      if (op == UnaryOp::Gelu || op == UnaryOp::Silu)
        scale = std::max(scale, g[i] * (1.0 + std::fabs(in[i])) * 0.1);
      const double err = std::fabs(got[i] - ref) / std::max(scale, 1e-30);
      worst = std::max(worst, err);
      ASSERT_LE(err, 2e-6) << "op " << static_cast<int>(op) << " x=" << in[i] << " got " << got[i]
                           << " want " << ref;
    }
    RecordProperty("worst_rel_err_op" + std::to_string(static_cast<int>(op)),
                   fmt::format("{:.3g}", worst));
  }
}

// Backward against central differences of the f32 forward kernel itself.
TEST(Unary, BackwardAgainstFiniteDifferences) {
  for (UnaryOp op : kUnaryOps) {
    std::vector<float> in;
    for (int i = 0; i < 200; ++i) {
      float v = -4.f + 8.f * (static_cast<float>(i) + 0.37f) / 200.f;
      if (positive_only(op)) v = 0.2f + std::fabs(v);
      if (op == UnaryOp::Relu && std::fabs(v) < 0.05f) v += 0.1f;  // keep off the kink
      in.push_back(v);
    }
    const int64_t n = static_cast<int64_t>(in.size());
    const float h = 1e-2f;
    std::vector<float> plus(in), minus(in);
    for (auto& v : plus) v += h;
    for (auto& v : minus) v -= h;
    std::vector<float> fp = values(unary(op, make(plus, {n}))),
                       fm = values(unary(op, make(minus, {n})));
    std::vector<float> grad = values(unary_backward(op, make(in, {n}), ones({n})));
    for (int64_t i = 0; i < n; ++i) {
      // Use the exact step between the rounded inputs.
      const double fd =
          (static_cast<double>(fp[i]) - fm[i]) / (static_cast<double>(plus[i]) - minus[i]);
      const double curv = std::fabs(ref_grad(op, in[i] + h) - ref_grad(op, in[i] - h));
      ASSERT_NEAR(grad[i], fd, 1e-4 * (1 + std::fabs(fd)) + curv)
          << "op " << static_cast<int>(op) << " x=" << in[i];
    }
  }
}

TEST(Unary, ThreadCountDoesNotChangeBits) {
  Tensor x = rand({1 << 18}, 3, -6.f, 6.f), dy = rand({1 << 18}, 4);
  Tensor f = gelu(x), b = unary_backward(UnaryOp::Gelu, x, dy);
  testing::for_thread_counts({1, 2, 3}, [&](int) {
    EXPECT_TRUE(testing::same_bits(gelu(x), f));
    EXPECT_TRUE(testing::same_bits(unary_backward(UnaryOp::Gelu, x, dy), b));
  });
}

// An element gets the same bits wherever it sits: inside the 4-lane loop or in its padded tail,
// at any offset from a vector boundary, on either side of a thread split (Note [Vectorised exp]).
TEST(Unary, BitsDoNotDependOnPosition) {
  const int64_t n = 3 * 4096 + 7;  // threads split it (above the grain), not a multiple of 4
  for (UnaryOp op : kUnaryOps) {
    Tensor x = positive_only(op) ? rand({n}, 5, 0.01f, 10.f) : rand({n}, 5, -10.f, 10.f);
    Tensor dy = rand({n}, 6);
    std::vector<float> f = values(unary(op, x)), b = values(unary_backward(op, x, dy));
    for (int64_t start : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4097}, n - 6}) {
      for (int64_t len : {1, 2, 3, 5, 6}) {
        std::vector<float> fs = values(unary(op, x.narrow(0, start, len)));
        std::vector<float> bs =
            values(unary_backward(op, x.narrow(0, start, len), dy.narrow(0, start, len)));
        for (int64_t i = 0; i < len; ++i) {
          ASSERT_EQ(testing::bits(fs[i]), testing::bits(f[start + i]))
              << "op " << static_cast<int>(op) << " forward at " << start + i << " len " << len;
          ASSERT_EQ(testing::bits(bs[i]), testing::bits(b[start + i]))
              << "op " << static_cast<int>(op) << " backward at " << start + i << " len " << len;
        }
      }
    }
    const Tensor fref = unary(op, x), bref = unary_backward(op, x, dy);
    testing::for_thread_counts({1, 2, 3}, [&](int) {
      EXPECT_TRUE(testing::same_bits(unary(op, x), fref)) << "op " << static_cast<int>(op);
      EXPECT_TRUE(testing::same_bits(unary_backward(op, x, dy), bref))
          << "op " << static_cast<int>(op);
    });
  }
}

TEST(BiasAdd, AddsOverTheLastDim) {
  for (const Shape& s : {Shape{5, 7}, Shape{3, 4, 9}, Shape{1000, 768}, Shape{11}}) {
    Tensor x = rand(s, 1), bias = rand({s.back()}, 2);
    Tensor y = bias_add(x, bias);
    for (int64_t i = 0; i < x.numel(); ++i) {
      auto idx = testing::unravel(s, i);
      ASSERT_EQ(at(y, idx), at(x, idx) + at(bias, {idx.back()}));
    }
  }
  // A non-contiguous x.
  Tensor xt = rand({6, 5}, 3).transpose(0, 1);
  Tensor bias = rand({6}, 4);
  Tensor y = bias_add(xt, bias);
  EXPECT_EQ(at(y, {4, 5}), at(xt, {4, 5}) + at(bias, {5}));
}

TEST(Dropout, MaskMatchesRngBernoulliAndScales) {
  const int64_t n = 1000003;
  const float p = 0.1f;
  const RngKey key{77, rng_stream(4, 5, 6)};
  Tensor x = rand({n}, 1, 0.5f, 1.5f);  // never 0, so dropped == (out == 0)
  Tensor y = dropout(x, p, key);
  std::vector<uint8_t> mask(n);
  rng_bernoulli(mask.data(), mask.size(), key, 1.f - p);
  std::vector<float> xv = values(x), yv = values(y);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float expect = mask[i] ? xv[i] * 1.f / (1.f - p) : 0.f;
    ASSERT_EQ(yv[i], expect) << i;
    kept += mask[i];
  }
  // Rate: 1e6 draws, stddev of the kept fraction 3e-4.
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.9, 1.5e-3);
  // Same key, same mask (this is how backward runs); different key, different mask.
  Tensor dy = rand({n}, 2, 0.5f, 1.5f);
  std::vector<float> dx = values(dropout(dy, p, key));
  for (int64_t i = 0; i < n; i += 7) ASSERT_EQ(dx[i] == 0.f, yv[i] == 0.f);
  std::vector<float> other = values(dropout(x, p, RngKey{77, rng_stream(4, 5, 7)}));
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (other[i] == 0.f) != (yv[i] == 0.f);
  EXPECT_GT(differ, n / 10);
  // Thread count does not change the mask.
  testing::for_thread_counts({1, 3},
                             [&](int) { EXPECT_TRUE(testing::same_bits(dropout(x, p, key), y)); });
}

TEST(Dropout, ZeroProbabilityIsIdentityAndMeanIsPreserved) {
  Tensor x = rand({4097}, 3);
  EXPECT_TRUE(testing::same_bits(dropout(x, 0.f, {1, 2}), x));
  Tensor ones_in = ones({1 << 20});
  std::vector<float> y = values(dropout(ones_in, 0.5f, {9, 9}));
  double mean = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.f || v == 2.f);
    mean += v;
  }
  EXPECT_NEAR(mean / y.size(), 1.0, 3e-3);
}

}  // namespace
}  // namespace strata::tensor
