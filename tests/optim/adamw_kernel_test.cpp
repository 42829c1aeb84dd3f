#include "optim/adamw_kernel.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/half.h"
#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::random_floats;
using testing::ulp_distance;

struct HostBuffers {
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> lp;
  AdamWBuffers view(DType lp_dtype, bool with_lp) {
    AdamWBuffers b;
    b.param = p.data();
    b.grad = g.data();
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.numel = static_cast<int64_t>(p.size());
    if (with_lp) {
      lp.assign(p.size(), 0);
      b.low_precision = lp.data();
      b.low_precision_dtype = lp_dtype;
    }
    return b;
  }
};

HostBuffers random_buffers(int64_t n, uint32_t seed) {
  HostBuffers h;
  h.p = random_floats(n, seed);
  h.g = random_floats(n, seed + 1, 0.1f);
  h.m = random_floats(n, seed + 2, 0.01f);
  h.v = random_floats(n, seed + 3, 1e-3f);
  for (float& x : h.v) x = x * x;  // second moments are non-negative
  return h;
}

// Runs three steps (bias corrections change every step) with `isa` and with the scalar kernel
// on the same data and requires bitwise-equal params, moments and model copies.
void expect_matches_scalar(Isa isa, int64_t n, DType lp_dtype, bool with_lp) {
  HostBuffers ref = random_buffers(n, 1234 + static_cast<uint32_t>(n));
  HostBuffers simd = ref;
  for (int64_t t = 1; t <= 3; ++t) {
    const AdamWScalars s = adamw_scalars(1e-3 * static_cast<double>(t), 0.9, 0.95, 1e-8, 0.1, t);
    // Fresh gradients per step, identical for both.
    ref.g = simd.g = random_floats(n, 99 + static_cast<uint32_t>(t), 0.1f);
    adamw_update(ref.view(lp_dtype, with_lp), s, Isa::Scalar);
    adamw_update(simd.view(lp_dtype, with_lp), s, isa);
  }
  int64_t worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max({worst, ulp_distance(ref.p[i], simd.p[i]), ulp_distance(ref.m[i], simd.m[i]),
                      ulp_distance(ref.v[i], simd.v[i])});
  }
  // The kernels are designed to be bitwise equal (Note [AdamW arithmetic]); the brief allows
  // 1 ulp but anything above 0 would mean the operation order diverged.
  EXPECT_EQ(worst, 0) << isa_name(isa) << " n=" << n;
  if (with_lp) {
    EXPECT_EQ(ref.lp, simd.lp) << isa_name(isa) << " n=" << n;
  }
}

const int64_t kSizes[] = {1, 7, 15, 17, 31, 33, 1000003};

void run_all_sizes(Isa isa) {
  for (int64_t n : kSizes) {
    expect_matches_scalar(isa, n, DType::BF16, false);
    expect_matches_scalar(isa, n, DType::BF16, true);
    expect_matches_scalar(isa, n, DType::F16, true);
  }
}

TEST(AdamWKernel, Avx2MatchesScalarBitwise) {
  if (!adamw_isa_available(Isa::Avx2)) GTEST_SKIP() << "CPU lacks AVX2/F16C";
  run_all_sizes(Isa::Avx2);
}

TEST(AdamWKernel, Avx512MatchesScalarBitwise) {
  if (!adamw_isa_available(Isa::Avx512)) GTEST_SKIP() << "CPU lacks AVX-512F";
  run_all_sizes(Isa::Avx512);
}

// Offsets into a buffer that are not vector-aligned (a segment can start anywhere).
TEST(AdamWKernel, UnalignedSubrangesMatchScalar) {
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!adamw_isa_available(isa)) continue;
    for (int64_t offset : {1, 3, 5}) {
      HostBuffers ref = random_buffers(100, 7);
      HostBuffers simd = ref;
      const AdamWScalars s = adamw_scalars(1e-2, 0.9, 0.999, 1e-8, 0.01, 2);
      AdamWBuffers a = ref.view(DType::BF16, true), b = simd.view(DType::BF16, true);
      for (AdamWBuffers* x : {&a, &b}) {
        x->param += offset;
        x->grad += offset;
        x->exp_avg += offset;
        x->exp_avg_sq += offset;
        x->low_precision = static_cast<uint16_t*>(x->low_precision) + offset;
        x->numel = 90 - offset;
      }
      adamw_update(a, s, Isa::Scalar);
      adamw_update(b, s, isa);
      EXPECT_EQ(ref.p, simd.p);
      EXPECT_EQ(ref.m, simd.m);
      EXPECT_EQ(ref.v, simd.v);
      EXPECT_EQ(ref.lp, simd.lp);
    }
  }
}

// Scalar kernel against the formula evaluated in double for several steps.
TEST(AdamWKernel, ScalarMatchesDoubleReference) {
  const int64_t n = 257;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  HostBuffers h;
  h.p = random_floats(n, 5);
  h.m.assign(n, 0.f);
  h.v.assign(n, 0.f);
  std::vector<double> p(h.p.begin(), h.p.end()), m(n, 0.0), v(n, 0.0);
  for (int64_t t = 1; t <= 6; ++t) {
    h.g = random_floats(n, 50 + static_cast<uint32_t>(t), 0.5f);
    adamw_update(h.view(DType::BF16, false), adamw_scalars(lr, b1, b2, eps, wd, t), Isa::Scalar);
    for (int64_t i = 0; i < n; ++i) {
      const double g = h.g[i];
      p[i] -= lr * wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(h.p[i], p[i], 1e-6 * std::max(1.0, std::abs(p[i]))) << i;
    // m and v are sums of terms of either sign / many sizes: bound the error by the terms' scale
    // (|g| ~ 0.5), not by the (possibly cancelled) result.
    EXPECT_NEAR(h.m[i], m[i], 1e-7 + 1e-6 * std::abs(m[i])) << i;
    EXPECT_NEAR(h.v[i], v[i], 1e-9 + 1e-6 * std::abs(v[i])) << i;
  }
}

// With bias correction, Adam's first step moves each weight by lr * sign(g) (|g| >> eps).
TEST(AdamWKernel, FirstStepIsSignOfGradient) {
  HostBuffers h;
  h.p = {1.f, 1.f, 1.f};
  h.g = {0.3f, -2.f, 1e-3f};
  h.m.assign(3, 0.f);
  h.v.assign(3, 0.f);
  adamw_update(h.view(DType::BF16, false), adamw_scalars(0.01, 0.9, 0.999, 1e-8, 0.0, 1),
               Isa::Scalar);
  EXPECT_NEAR(h.p[0], 0.99f, 1e-6);
  EXPECT_NEAR(h.p[1], 1.01f, 1e-6);
  EXPECT_NEAR(h.p[2], 0.99f, 1e-5);
}

// The model copy is exactly core/half.h's rounding of the fp32 result, special values included.
// lr = 0 and zero gradients make the update the identity, so the copy sees chosen inputs.
TEST(AdamWKernel, LowPrecisionCopyIsRoundedParam) {
  std::vector<float> specials = {0.f,
                                 -0.f,
                                 1.f,
                                 -1.f,
                                 65504.f,
                                 65519.f,
                                 65520.f,
                                 -65520.f,
                                 1e-8f,
                                 -3e-7f,
                                 6e-5f,
                                 6.1035156e-05f,
                                 1e-40f,
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(),
                                 -std::numeric_limits<float>::quiet_NaN(),
                                 std::bit_cast<float>(0x7f812345u),  // NaN with payload
                                 std::bit_cast<float>(0x3f808000u),  // bf16 tie, round to even
                                 std::bit_cast<float>(0x3f818000u),  // bf16 tie, round up
                                 std::bit_cast<float>(0x3f801000u),  // f16 tie
                                 std::numeric_limits<float>::max()};
  // Plus a sweep of bit patterns across the whole float range.
  for (uint32_t u = 0; u < 0xffffffffu - 40009u; u += 40009u)
    specials.push_back(std::bit_cast<float>(u));
  const int64_t n = static_cast<int64_t>(specials.size());
  for (DType dt : {DType::BF16, DType::F16}) {
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (!adamw_isa_available(isa)) continue;
      HostBuffers h;
      h.p = specials;
      h.g.assign(n, 0.f);
      h.m.assign(n, 0.f);
      h.v.assign(n, 0.f);
      adamw_update(h.view(dt, true), adamw_scalars(0.0, 0.9, 0.999, 1e-8, 0.0, 1), isa);
      for (int64_t i = 0; i < n; ++i) {
        const float p = h.p[i];
        if (!std::isnan(specials[i])) {
          ASSERT_EQ(std::bit_cast<uint32_t>(p), std::bit_cast<uint32_t>(specials[i])) << i;
        }
        const uint16_t want = dt == DType::BF16 ? BFloat16::from_float(p) : Float16::from_float(p);
        ASSERT_EQ(h.lp[i], want) << isa_name(isa) << " " << dtype_name(dt) << " input 0x"
                                 << std::hex << std::bit_cast<uint32_t>(specials[i]);
      }
    }
  }
}

TEST(AdamWKernel, IsaNames) {
  EXPECT_EQ(parse_isa("scalar"), Isa::Scalar);
  EXPECT_EQ(parse_isa("avx2"), Isa::Avx2);
  EXPECT_EQ(parse_isa("avx512"), Isa::Avx512);
  EXPECT_THROW(parse_isa("sse9"), UserError);
  EXPECT_TRUE(adamw_isa_available(Isa::Scalar));
  EXPECT_TRUE(adamw_isa_available(default_adamw_isa()));
}

TEST(AdamWKernel, ScalarsFollowPyTorch) {
  const AdamWScalars s = adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 3);
  EXPECT_EQ(s.decay_factor, static_cast<float>(1.0 - 1e-3 * 0.1));
  EXPECT_EQ(s.step_size, static_cast<float>(1e-3 / (1.0 - std::pow(0.9, 3))));
  EXPECT_EQ(s.bias_correction2_sqrt, static_cast<float>(std::sqrt(1.0 - std::pow(0.999, 3))));
  EXPECT_EQ(s.one_minus_beta2, static_cast<float>(1.0 - 0.999));
}

}  // namespace
}  // namespace strata::optim
