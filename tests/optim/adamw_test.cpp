#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/half.h"
#include "offload/memory_stats.h"
#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::make_group;
using testing::make_tensor;
using testing::random_floats;
using testing::set_values;
using testing::to_vector;

TEST(AdamW, MatchesDoubleReferenceOverSteps) {
  const int64_t n = 1000;
  AdamWConfig cfg;
  cfg.beta2 = 0.95;
  cfg.weight_decay = 0.1;
  std::vector<float> p0 = random_floats(n, 1);
  AdamW opt({make_group(p0, std::vector<float>(n, 0.f))}, cfg);
  std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
  for (int t = 1; t <= 5; ++t) {
    const double lr = 1e-3 * t;
    std::vector<float> g = random_floats(n, 100 + t, 0.2f);
    set_values(opt.groups()[0].grad, g);
    opt.step(lr);
    for (int64_t i = 0; i < n; ++i) {
      p[i] *= 1 - lr * cfg.weight_decay;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i] / (1 - std::pow(cfg.beta2, t))) + cfg.eps;
      p[i] -= lr / (1 - std::pow(cfg.beta1, t)) * m[i] / denom;
    }
  }
  EXPECT_EQ(opt.step_count(), 5);
  std::vector<float> got = to_vector(opt.groups()[0].param);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], p[i], 1e-6 * std::max(1.0, std::abs(p[i])));
}

TEST(AdamW, WeightDecayOnlyOnDecaySegments) {
  // [0,4) "w" decays, [4,6) "b" does not, [6,8) is padding (no segment), [8,10) "w2" decays.
  std::vector<float> p0 = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ParamGroup g;
  g.param = make_tensor(p0);
  g.grad = make_tensor(std::vector<float>(10, 0.f));
  g.segments = {{"w2", 8, 2, true}, {"w", 0, 4, true}, {"b", 4, 2, false}};
  AdamWConfig cfg;
  cfg.weight_decay = 0.5;
  AdamW opt({g}, cfg);
  opt.step(0.1);
  // Zero gradients: the Adam part is exactly 0, leaving p * (1 - lr * wd) on decaying elements.
  const float f = static_cast<float>(1.0 - 0.1 * 0.5);
  std::vector<float> want = {1 * f, 2 * f, 3 * f, 4 * f, 5, 6, 7, 8, 9 * f, 10 * f};
  EXPECT_EQ(to_vector(opt.groups()[0].param), want);
}

TEST(AdamW, RejectsMalformedGroups) {
  auto group = [] { return make_group(std::vector<float>(8, 1.f), std::vector<float>(8, 0.f)); };
  {
    ParamGroup g = group();
    g.segments = {{"a", 0, 5, true}, {"b", 4, 4, false}};
    EXPECT_THROW(AdamW({g}), UserError);  // overlap
  }
  {
    ParamGroup g = group();
    g.segments = {{"a", 4, 5, true}};
    EXPECT_THROW(AdamW({g}), UserError);  // out of bounds
  }
  {
    ParamGroup g = group();
    g.grad = make_tensor(std::vector<float>(7, 0.f));
    EXPECT_THROW(AdamW({g}), UserError);  // size mismatch
  }
  {
    ParamGroup g = group();
    g.low_precision_copy = tensor::Tensor::empty({8}, DType::F32);
    EXPECT_THROW(AdamW({g}), UserError);  // copy must be bf16/f16
  }
  AdamWConfig bad;
  bad.beta2 = 1.0;
  EXPECT_THROW(AdamW({group()}, bad), UserError);
}

TEST(AdamW, StateIsZeroedAndChargedToOptimizer) {
  const int64_t n = 4096;
  auto& stats = offload::MemoryStats::global();
  const int64_t before = stats.usage(offload::Tier::Host, offload::Category::Optimizer).current;
  {
    AdamW opt({make_group(std::vector<float>(n, 1.f), std::vector<float>(n, 0.f))});
    const int64_t during = stats.usage(offload::Tier::Host, offload::Category::Optimizer).current;
    EXPECT_GE(during - before, 2 * n * 4);
    EXPECT_EQ(to_vector(opt.exp_avg(0)), std::vector<float>(n, 0.f));
    EXPECT_EQ(to_vector(opt.exp_avg_sq(0)), std::vector<float>(n, 0.f));
  }
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Optimizer).current, before);
}

TEST(AdamW, LowPrecisionCopyIsRoundedResult) {
  const int64_t n = 1001;
  for (DType dt : {DType::BF16, DType::F16}) {
    ParamGroup g = make_group(random_floats(n, 3), random_floats(n, 4));
    g.low_precision_copy = tensor::Tensor::empty({n}, dt);
    AdamW opt({g});
    opt.step(1e-2);
    opt.step(1e-2);
    const float* p = opt.groups()[0].param.data<float>();
    const auto* lp = static_cast<const uint16_t*>(opt.groups()[0].low_precision_copy.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want =
          dt == DType::BF16 ? BFloat16::from_float(p[i]) : Float16::from_float(p[i]);
      ASSERT_EQ(lp[i], want) << dtype_name(dt) << " " << i;
    }
  }
}

// Two groups, decay and no-decay segments, a model copy: the state names and the shape of a run.
std::vector<ParamGroup> two_groups(uint32_t seed) {
  ParamGroup a = make_group(random_floats(300, seed), std::vector<float>(300, 0.f));
  a.segments = {{"h.0.w", 0, 200, true}, {"h.0.b", 200, 100, false}};
  a.low_precision_copy = tensor::Tensor::empty({300}, DType::BF16);
  ParamGroup b = make_group(random_floats(77, seed + 1), std::vector<float>(77, 0.f));
  return {a, b};
}

void run_steps(AdamW& opt, int from, int to) {
  for (int t = from; t < to; ++t) {
    for (size_t gi = 0; gi < opt.groups().size(); ++gi) {
      const tensor::Tensor& grad = opt.groups()[gi].grad;
      set_values(grad,
                 random_floats(grad.numel(), 1000 * (t + 1) + static_cast<uint32_t>(gi), 0.3f));
    }
    opt.step(1e-2 / (1 + t));
  }
}

TEST(AdamW, StateRoundTripResumesBitwise) {
  AdamWConfig cfg;
  cfg.weight_decay = 0.05;
  AdamW uninterrupted(two_groups(11), cfg);
  run_steps(uninterrupted, 0, 7);

  AdamW first(two_groups(11), cfg);
  run_steps(first, 0, 3);
  OptimizerState state = first.state_dict();
  EXPECT_EQ(state.step, 3);
  ASSERT_EQ(state.tensors.size(), 4u);
  EXPECT_EQ(state.tensors[0].name, "group0.exp_avg");
  EXPECT_EQ(state.tensors[1].name, "group0.exp_avg_sq");
  EXPECT_EQ(state.tensors[3].name, "group1.exp_avg_sq");

  // A fresh optimizer over copies of the weights (as a checkpoint load would give).
  std::vector<ParamGroup> groups = two_groups(0);
  for (size_t gi = 0; gi < groups.size(); ++gi)
    set_values(groups[gi].param, to_vector(first.groups()[gi].param));
  AdamW resumed(groups, cfg);
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.step_count(), 3);
  run_steps(resumed, 3, 7);

  for (size_t gi = 0; gi < 2; ++gi) {
    EXPECT_EQ(to_vector(resumed.groups()[gi].param), to_vector(uninterrupted.groups()[gi].param));
    EXPECT_EQ(to_vector(resumed.exp_avg(gi)), to_vector(uninterrupted.exp_avg(gi)));
    EXPECT_EQ(to_vector(resumed.exp_avg_sq(gi)), to_vector(uninterrupted.exp_avg_sq(gi)));
  }
  const tensor::Tensor& lp_a = resumed.groups()[0].low_precision_copy;
  const tensor::Tensor& lp_b = uninterrupted.groups()[0].low_precision_copy;
  EXPECT_EQ(std::memcmp(lp_a.data_ptr(), lp_b.data_ptr(), lp_a.nbytes()), 0);
}

TEST(AdamW, LoadStateRejectsMismatches) {
  AdamW src(two_groups(1));
  run_steps(src, 0, 1);
  AdamW dst(two_groups(2));
  const std::vector<float> m_before = to_vector(dst.exp_avg(0));

  OptimizerState wrong_shape = src.state_dict();
  wrong_shape.tensors[3].tensor = make_tensor(std::vector<float>(76, 0.f));
  EXPECT_THROW(dst.load_state_dict(wrong_shape), UserError);

  OptimizerState missing = src.state_dict();
  missing.tensors.pop_back();
  EXPECT_THROW(dst.load_state_dict(missing), UserError);

  OptimizerState extra = src.state_dict();
  extra.tensors.push_back({"group2.exp_avg", make_tensor({1.f})});
  EXPECT_THROW(dst.load_state_dict(extra), UserError);

  OptimizerState wrong_dtype = src.state_dict();
  wrong_dtype.tensors[0].tensor = tensor::Tensor::empty({300}, DType::BF16);
  EXPECT_THROW(dst.load_state_dict(wrong_dtype), UserError);

  // Nothing was half-loaded.
  EXPECT_EQ(to_vector(dst.exp_avg(0)), m_before);
  EXPECT_EQ(dst.step_count(), 0);
}

// Every kernel gives the same bits through the optimizer too (segments split the buffer into
// runs of odd lengths).
TEST(AdamW, IsasAgreeThroughOptimizer) {
  AdamW ref(two_groups(5));
  ref.set_isa(Isa::Scalar);
  run_steps(ref, 0, 3);
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!adamw_isa_available(isa)) {
      EXPECT_THROW(ref.set_isa(isa), UserError);
      continue;
    }
    AdamW opt(two_groups(5));
    opt.set_isa(isa);
    run_steps(opt, 0, 3);
    for (size_t gi = 0; gi < 2; ++gi)
      EXPECT_EQ(to_vector(opt.groups()[gi].param), to_vector(ref.groups()[gi].param));
  }
}

}  // namespace
}  // namespace strata::optim
