// Autograd in bf16/f16: gradients in each input's dtype, accumulation across dtypes, every
// function of the op table and a small composite model against f32 (Note [Gradient dtypes],
// Note [Low-precision ops]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "tensor/ops.h"
#include "tests/support/op_table.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;

// Uniform values already representable in `dt` (so f32 and low-precision runs start equal).
Tensor param_values(const Shape& s, uint64_t seed, DType dt, float lo = -1.f, float hi = 1.f) {
  return tops::uniform(s, RngKey{seed, 77}, lo, hi).to(dt).to(DType::F32);
}

double rel_l2(const Tensor& got, const Tensor& want) {
  const std::vector<float> g = tops::to_float_vector(got), w = tops::to_float_vector(want);
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
    den += static_cast<double>(w[i]) * w[i];
  }
  return std::sqrt(num / den);
}

struct Composite {
  std::vector<Variable> params;  // x, weight, bias, ln weight, ln bias
  Variable loss;
};

// linear -> gelu -> layernorm -> cross-entropy on values representable in `grid`, run with every
// tensor in `dt` (grid itself, or F32 for the reference).
Composite run_composite(DType grid, DType dt) {
  const std::vector<Tensor> values{
      param_values({12, 16}, 1, grid, -2.f, 2.f), param_values({24, 16}, 2, grid, -0.5f, 0.5f),
      param_values({24}, 3, grid), param_values({24}, 4, grid, 0.5f, 1.5f),
      param_values({24}, 5, grid)};
  Composite c;
  for (const Tensor& v : values) c.params.emplace_back(v.to(dt), true);
  const Tensor targets = tops::from_ints({0, 5, 23, 7, 7, 11, 2, 19, -100, 3, 14, 22}, {12});
  Variable h = gelu(linear(c.params[0], c.params[1], c.params[2]));
  c.loss = cross_entropy(layernorm(h, c.params[3], c.params[4], 1e-5f), targets);
  c.loss.backward();
  return c;
}

TEST(LowpAutograd, CompositeGradientsHaveTheParamDtypeAndMatchF32) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Composite got = run_composite(dt, dt), ref = run_composite(dt, DType::F32);
    EXPECT_EQ(got.loss.dtype(), DType::F32) << "cross-entropy's loss stays f32";
    EXPECT_NEAR(got.loss.item(), ref.loss.item(), 1e-2 * ref.loss.item());
    // bf16 keeps 8 significant bits (f16 11): each rounding costs up to 2^-9 (2^-12) relative,
    // and the errors of a few chained ops stay well under 1e-2 (2e-3) in L2.
    const double bound = dt == DType::BF16 ? 1e-2 : 2e-3;
    for (size_t i = 0; i < got.params.size(); ++i) {
      SCOPED_TRACE("param " + std::to_string(i));
      ASSERT_TRUE(got.params[i].grad().defined());
      EXPECT_EQ(got.params[i].grad().dtype(), dt);
      const double err = rel_l2(got.params[i].grad(), ref.params[i].grad());
      EXPECT_LT(err, bound);
      std::printf("[ composite %s ] param %zu: grad rel L2 error %.3g\n",
                  std::string(dtype_name(dt)).c_str(), i, err);
    }
  }
}

// Every gradcheck sample of the op table (tests/support/op_table.h) with its inputs in BF16 and
// F16: each input's gradient has the input's dtype, and is within `bound` (rel. L2) of the f32
// gradient at the same rounded inputs. The inputs are contiguous here (the f32 gradcheck covers
// the views). Each rounding to the compute dtype costs at most half an ulp, 2^-8 relative in bf16
// (8 significant bits) and 2^-11 in f16 (11); the longest path from an input to its gradient in
// the table (mlp_swiglu: five forward nodes and their backward, with the objective's weights
// rounded into the output dtype) rounds at most ten times, so the bound is ten half-ulps.
struct GradParam {
  std::string op;
  strata::testing::GradSample sample;
};

std::vector<GradParam> grad_params() {
  std::vector<GradParam> out;
  for (const strata::testing::OpInfo& e : strata::testing::op_table())
    for (const strata::testing::GradSample& s : e.gradcheck) out.push_back({e.name, s});
  return out;
}

void PrintTo(const GradParam& p, std::ostream* os) {
  *os << p.op << "/" << p.sample.name;
}

class LowpAutogradOps : public ::testing::TestWithParam<GradParam> {};

TEST_P(LowpAutogradOps, GradientsHaveTheInputDtypeAndMatchF32) {
  const strata::testing::GradSample& c = GetParam().sample;
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::vector<Variable> lowp, ref;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor v = strata::testing::make_grad_input(c.inputs[i], i + 1).data().to(dt);
      lowp.emplace_back(v.clone(), true);
      ref.emplace_back(v.to(DType::F32), true);
    }
    const Variable out_lp = c.fn(lowp), out_ref = c.fn(ref);
    const Tensor w = tops::uniform(out_ref.shape(), RngKey{31, 7}, -1.f, 1.f);
    sum_all(mul(to(out_lp, DType::F32), Variable(w))).backward();
    sum_all(mul(to(out_ref, DType::F32), Variable(w))).backward();
    const double bound = 10 * (dt == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11));
    for (size_t i = 0; i < lowp.size(); ++i) {
      SCOPED_TRACE("input " + std::to_string(i));
      ASSERT_TRUE(lowp[i].grad().defined());
      EXPECT_EQ(lowp[i].grad().dtype(), dt);
      EXPECT_EQ(lowp[i].grad().shape(), lowp[i].shape());
      EXPECT_LT(rel_l2(lowp[i].grad(), ref[i].grad()), bound);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, LowpAutogradOps, ::testing::ValuesIn(grad_params()),
                         [](const ::testing::TestParamInfo<GradParam>& info) {
                           return info.param.sample.name;
                         });

TEST(LowpAutograd, SharedLeafSumsItsLowPrecisionGradientsInPlace) {
  for (DType dt : {DType::BF16, DType::F16}) {
    // w feeds two products: its gradient slot receives two bf16 tensors and sums them.
    Variable w(tops::from_vector({1, 2, 3}, {3}, dt), true);
    Variable a(tops::from_vector({0.5f, 0.25f, 2.f}, {3}, dt));
    Variable b(tops::from_vector({3.f, 1.f, -1.f}, {3}, dt));
    sum_all(add(mul(w, a), mul(w, b))).backward();
    ASSERT_EQ(w.grad().dtype(), dt);
    EXPECT_EQ(tops::to_float_vector(w.grad()), (std::vector<float>{3.5f, 1.25f, 1.f}));
  }
}

TEST(LowpAutograd, LowPrecisionGradientAccumulatesIntoABoundF32Grad) {
  // Mixed precision: a bf16 parameter whose grad is bound to f32 storage (a master buffer).
  Tensor flat = tops::zeros({6});
  Variable w(tops::from_vector({1, 2, 3, 4}, {4}, DType::BF16), true);
  w.set_grad(flat.narrow(0, 1, 4));
  for (int i = 0; i < 3; ++i) sum_all(scale(w, 0.1f)).backward();
  // Each step adds bf16(0.1) = 0.10009765625 exactly into the f32 buffer (axpy_, mixed).
  const float step = static_cast<float>(BFloat16(0.1f));
  const float three = step + step + step;
  EXPECT_EQ(tops::to_float_vector(flat), (std::vector<float>{0, three, three, three, three, 0}));
  EXPECT_EQ(w.grad().dtype(), DType::F32);
}

TEST(LowpAutograd, CastSendsTheGradientBackInTheInputDtype) {
  Variable w(tops::from_vector({0.5f, -1.5f, 2.f, 3.f}, {4}), true);
  Variable y = to(w, DType::BF16);
  EXPECT_EQ(y.dtype(), DType::BF16);
  sum_all(mul(y, y)).backward();
  ASSERT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_EQ(tops::to_float_vector(w.grad()), (std::vector<float>{1.f, -3.f, 4.f, 6.f}));
  EXPECT_TRUE(to(w, DType::F32).is_same(w)) << "a cast to its own dtype is the identity";
}

TEST(LowpAutograd, ReductionsAndShapeFunctionsKeepTheDtype) {
  for (DType dt : {DType::BF16, DType::F16}) {
    Variable x(tops::uniform({4, 6}, RngKey{9, 1}).to(dt), true);
    Variable y = add(add(sum_all(max(x, 1)), sum_all(mean(x, 0))),
                     sum_all(slice(transpose(x, 0, 1), 0, 1, 4)));
    ASSERT_EQ(y.dtype(), dt);
    y.backward();
    EXPECT_EQ(x.grad().dtype(), dt);
    EXPECT_EQ(x.grad().shape(), x.shape());
  }
}

TEST(LowpAutograd, ABackwardReturningTheWrongDtypeIsCaught) {
  Variable w(tops::from_vector({1, 2}, {2}, DType::BF16), true);
  Variable y = make_output("BadCast", w.data().clone(), {w}, [](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].to(DType::F32)};  // wrong: w is bf16
  });
  try {
    sum_all(y).backward();
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("BadCast"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::autograd
