#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace strata::optim {
namespace {

LrScheduleConfig config(LrScheduleKind kind) {
  LrScheduleConfig c;
  c.kind = kind;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  c.max_steps = 110;
  return c;
}

TEST(LrSchedule, CosineAtKeySteps) {
  LrSchedule s(config(LrScheduleKind::Cosine));
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);  // the first update already moves (Note [Schedule steps])
  EXPECT_DOUBLE_EQ(s.lr(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_NEAR(s.lr(60), 0.55, 1e-12);
  EXPECT_NEAR(s.lr(109), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.99)), 1e-12);
  EXPECT_DOUBLE_EQ(s.lr(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(100000), 0.1);
  for (int64_t t = 11; t < 110; ++t) EXPECT_LT(s.lr(t), s.lr(t - 1));
}

TEST(LrSchedule, LinearAtKeySteps) {
  LrSchedule s(config(LrScheduleKind::Linear));
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(35), 0.775, 1e-12);
  EXPECT_NEAR(s.lr(60), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(s.lr(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(500), 0.1);
}

TEST(LrSchedule, ConstantWithAndWithoutWarmup) {
  LrScheduleConfig c;
  c.lr = 3e-4;
  LrSchedule plain(c);
  EXPECT_DOUBLE_EQ(plain.lr(0), 3e-4);
  EXPECT_DOUBLE_EQ(plain.lr(123456), 3e-4);
  c.warmup_steps = 4;
  LrSchedule warm(c);
  EXPECT_DOUBLE_EQ(warm.lr(1), 1.5e-4);
  EXPECT_DOUBLE_EQ(warm.lr(4), 3e-4);
  EXPECT_DOUBLE_EQ(warm.lr(1000), 3e-4);
}

TEST(LrSchedule, NoWarmupStartsAtPeak) {
  LrScheduleConfig c = config(LrScheduleKind::Cosine);
  c.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LrSchedule(c).lr(0), 1.0);
}

TEST(LrSchedule, ParsesNames) {
  EXPECT_EQ(parse_lr_schedule("constant"), LrScheduleKind::Constant);
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::Cosine);
  EXPECT_EQ(parse_lr_schedule("linear"), LrScheduleKind::Linear);
  EXPECT_THROW(parse_lr_schedule("cosine_with_restarts"), UserError);
  EXPECT_THROW(parse_lr_schedule(""), UserError);
  EXPECT_EQ(lr_schedule_name(LrScheduleKind::Linear), "linear");
}

TEST(LrSchedule, RejectsInconsistentConfig) {
  LrScheduleConfig c = config(LrScheduleKind::Cosine);
  c.max_steps = 10;  // not after warmup
  EXPECT_THROW(LrSchedule{c}, UserError);
  c = config(LrScheduleKind::Linear);
  c.min_lr = 2.0;  // above peak
  EXPECT_THROW(LrSchedule{c}, UserError);
  c = config(LrScheduleKind::Constant);
  c.warmup_steps = -1;
  EXPECT_THROW(LrSchedule{c}, UserError);
}

}  // namespace
}  // namespace strata::optim
