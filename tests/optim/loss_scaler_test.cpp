#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "tensor/tensor.h"

namespace strata::optim {
namespace {

TEST(LossScaler, StartsAtTwoToThePower) {
  LossScaler s;
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);
  LossScalerConfig c;
  c.initial_scale_power = 3;
  EXPECT_EQ(LossScaler(c).scale(), 8.0);
}

TEST(LossScaler, DoublesAfterWindowCleanSteps) {
  LossScalerConfig c;
  c.initial_scale_power = 4;
  c.loss_scale_window = 3;
  LossScaler s(c);
  // DeepSpeed grows when (iter - last_overflow) % window == 0, last_overflow starting at -1:
  // after steps 0, 1, 2 (the third clean step).
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 32.0);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 64.0);
}

TEST(LossScaler, HysteresisDelaysTheFirstHalving) {
  LossScalerConfig c;
  c.initial_scale_power = 10;
  c.hysteresis = 2;
  LossScaler s(c);
  EXPECT_FALSE(s.update(true));  // first overflow spends the hysteresis budget
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_FALSE(s.update(true));  // second one halves
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_FALSE(s.update(true));  // budget stays at 1 until the scale grows again
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.skipped_steps(), 3);
}

TEST(LossScaler, CleanStepsAfterOverflowCountFromTheOverflow) {
  LossScalerConfig c;
  c.initial_scale_power = 5;
  c.hysteresis = 1;
  c.loss_scale_window = 4;
  LossScaler s(c);
  s.update(false);
  s.update(true);  // iteration 1 overflows: 32 -> 16
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // 2
  s.update(false);  // 3
  s.update(false);  // 4
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // 5: 5 - 1 = 4 = window
  EXPECT_EQ(s.scale(), 32.0);
}

TEST(LossScaler, GrowthRefillsHysteresis) {
  LossScalerConfig c;
  c.initial_scale_power = 6;
  c.hysteresis = 2;
  c.loss_scale_window = 2;
  LossScaler s(c);
  s.update(true);  // 0: budget 2 -> 1, scale 64
  EXPECT_EQ(s.state().hysteresis_left, 1);
  s.update(false);  // 1
  s.update(false);  // 2: (2 - 0) % 2 == 0 -> scale 128, budget 2
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  s.update(true);  // budget 1, no halving
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScalerConfig c;
  c.initial_scale_power = 6;
  c.hysteresis = 2;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  s.update(true);
  s.update(false);
  s.update(true);  // budget was refilled, so still no halving
  EXPECT_EQ(s.scale(), 64.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 32.0);
}

TEST(LossScaler, NeverBelowMinimumAndRaisesThere) {
  LossScalerConfig c;
  c.initial_scale_power = 2;
  c.hysteresis = 1;
  c.min_loss_scale = 2;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_THROW(s.update(true), UserError);
  c.raise_error_at_min_scale = false;
  LossScaler t(c);
  t.update(true);
  EXPECT_FALSE(t.update(true));
  EXPECT_EQ(t.scale(), 2.0);
}

TEST(LossScaler, StaticScaleNeverChangesButSkipsOverflow) {
  LossScalerConfig c;
  c.loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_FALSE(s.update(true));
  for (int i = 0; i < 2000; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, BadConfigNamesTheKey) {
  auto message = [](LossScalerConfig c) {
    try {
      LossScaler s(c);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LossScalerConfig c;
  c.loss_scale_window = 0;
  EXPECT_NE(message(c).find("loss_scale_window"), std::string::npos);
  c = {};
  c.hysteresis = 0;
  EXPECT_NE(message(c).find("hysteresis"), std::string::npos);
  c = {};
  c.min_loss_scale = 0;
  EXPECT_NE(message(c).find("min_loss_scale"), std::string::npos);
  c = {};
  c.initial_scale_power = 99;
  EXPECT_NE(message(c).find("initial_scale_power"), std::string::npos);
}

TEST(LossScaler, StateRoundTripsAndResumesIdentically) {
  LossScalerConfig c;
  c.initial_scale_power = 8;
  c.loss_scale_window = 3;
  LossScaler a(c);
  const bool pattern[] = {false, true, false, false, true, true, false, false, false, false};
  for (int i = 0; i < 5; ++i) a.update(pattern[i]);
  LossScaler b(c);
  b.load_state(a.state());
  for (int i = 5; i < 10; ++i) {
    EXPECT_EQ(a.update(pattern[i]), b.update(pattern[i]));
    EXPECT_EQ(a.scale(), b.scale());
  }
  LossScalerState bad = a.state();
  bad.scale = 0;
  EXPECT_THROW(b.load_state(bad), UserError);
}

TEST(LossScaler, DetectsInfAndNan) {
  using tensor::from_vector;
  EXPECT_FALSE(has_inf_or_nan({from_vector({1.f, -2.f}, {2}), from_vector({3e38f}, {1})}));
  EXPECT_TRUE(has_inf_or_nan(
      {from_vector({1.f}, {1}), from_vector({std::numeric_limits<float>::infinity()}, {1})}));
  EXPECT_TRUE(has_inf_or_nan({from_vector({std::nanf("")}, {1}, DType::F16)}));
  EXPECT_FALSE(has_inf_or_nan({from_vector({65504.f}, {1}, DType::F16)}));
}

}  // namespace
}  // namespace strata::optim
