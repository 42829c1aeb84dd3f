#include "optim/grad_clip.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::make_tensor;
using testing::random_floats;
using testing::to_vector;

TEST(GradClip, NoScalingBelowMax) {
  std::vector<tensor::Tensor> g = {make_tensor({3.f, 4.f}), make_tensor({12.f})};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 26.0), 13.0);
  EXPECT_EQ(to_vector(g[0]), (std::vector<float>{3.f, 4.f}));
  EXPECT_EQ(to_vector(g[1]), std::vector<float>{12.f});
}

TEST(GradClip, ScalesToMaxNorm) {
  std::vector<tensor::Tensor> g = {make_tensor({3.f, 4.f}), make_tensor({12.f})};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 6.5), 13.0);
  const float coef = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_EQ(to_vector(g[0]), (std::vector<float>{3.f * coef, 4.f * coef}));
  EXPECT_EQ(to_vector(g[1]), std::vector<float>{12.f * coef});
  EXPECT_NEAR(global_grad_norm(g), 6.5, 1e-5);
}

TEST(GradClip, NonFiniteNormIsReturnedAndNothingScaled) {
  for (float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<tensor::Tensor> g = {make_tensor({3.f, 4.f}), make_tensor({bad})};
    const double norm = clip_grad_norm(g, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(to_vector(g[0]), (std::vector<float>{3.f, 4.f}));
  }
}

TEST(GradClip, NormOfLargeBuffersIsExactAndThreadCountIndependent) {
  std::vector<float> a = random_floats(1000003, 1), b = random_floats(4097, 2);
  double ref = 0;
  for (float x : a) ref += static_cast<double>(x) * x;
  for (float x : b) ref += static_cast<double>(x) * x;
  std::vector<tensor::Tensor> g = {make_tensor(a), make_tensor(b)};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = global_grad_norm(g);
  omp_set_num_threads(std::max(2, saved));
  const double many = global_grad_norm(g);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, many);
  EXPECT_NEAR(one, std::sqrt(ref), 1e-9 * std::sqrt(ref));
}

TEST(GradClip, RejectsBadArguments) {
  std::vector<tensor::Tensor> g = {make_tensor({1.f})};
  EXPECT_THROW(clip_grad_norm(g, 0.0), UserError);
  std::vector<tensor::Tensor> ints = {tensor::Tensor::empty({2}, DType::I32)};
  EXPECT_THROW(global_grad_norm(ints), UserError);
}

TEST(GradClip, LowPrecisionGradientsAreWidenedExactly) {
  // Values exact in bf16 and f16: the norm is that of the same f32 values.
  std::vector<float> v = {3.f, -4.f, 0.5f, 12.f, -0.25f};
  const double expect = std::sqrt(9.0 + 16.0 + 0.25 + 144.0 + 0.0625);
  for (DType d : {DType::BF16, DType::F16}) {
    std::vector<tensor::Tensor> g = {make_tensor(v).to(d), make_tensor({2.f}).to(d)};
    EXPECT_DOUBLE_EQ(global_grad_norm(g), std::sqrt(expect * expect + 4.0)) << dtype_name(d);
  }
  // An inf in an f16 gradient (overflow under loss scaling) makes the norm non-finite.
  std::vector<tensor::Tensor> inf = {make_tensor({1.f, 70000.f}).to(DType::F16)};
  EXPECT_FALSE(std::isfinite(global_grad_norm(inf)));
}

}  // namespace
}  // namespace strata::optim
