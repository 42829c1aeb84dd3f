#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace strata::optim {

std::string_view lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::Constant:
      return "constant";
    case LrScheduleKind::Cosine:
      return "cosine";
    case LrScheduleKind::Linear:
      return "linear";
  }
  return "?";
}

LrScheduleKind parse_lr_schedule(std::string_view name) {
  for (LrScheduleKind k :
       {LrScheduleKind::Constant, LrScheduleKind::Cosine, LrScheduleKind::Linear})
    if (name == lr_schedule_name(k)) return k;
  user_error("unknown learning-rate schedule '{}': use constant, cosine or linear", name);
}

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  const LrScheduleConfig& c = config_;
  if (!(c.lr >= 0) || !std::isfinite(c.lr))
    user_error("lr schedule: lr must be >= 0, got {}", c.lr);
  if (c.warmup_steps < 0)
    user_error("lr schedule: warmup_steps must be >= 0, got {}", c.warmup_steps);
  if (c.kind != LrScheduleKind::Constant) {
    if (!(c.min_lr >= 0 && c.min_lr <= c.lr))
      user_error("lr schedule: min_lr must be in [0, lr = {}], got {}", c.lr, c.min_lr);
    if (c.max_steps <= c.warmup_steps)
      user_error("lr schedule '{}': max_steps ({}) must be larger than warmup_steps ({})",
                 lr_schedule_name(c.kind), c.max_steps, c.warmup_steps);
  }
}

double LrSchedule::lr(int64_t step) const {
  STRATA_CHECK(step >= 0, "negative schedule step {}", step);
  const LrScheduleConfig& c = config_;
  if (step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.kind == LrScheduleKind::Constant) return c.lr;
  if (step >= c.max_steps) return c.min_lr;
  const double progress = static_cast<double>(step - c.warmup_steps) /
                          static_cast<double>(c.max_steps - c.warmup_steps);
  if (c.kind == LrScheduleKind::Cosine)
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
  return c.min_lr + (c.lr - c.min_lr) * (1.0 - progress);
}

}  // namespace strata::optim
