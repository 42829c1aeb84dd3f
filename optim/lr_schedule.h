#pragma once
// Learning-rate schedules: constant, linear warmup + cosine decay, linear warmup + linear decay.
//
// Note [Schedule steps]
// lr(step) is the rate for the update made after `step` updates (0-based). Warmup rises
// linearly as lr * (step + 1) / warmup_steps, reaching `lr` at step warmup_steps - 1 (the
// llm.c / nanoGPT convention: unlike Hugging Face's, whose first update has rate 0, no update
// is wasted); cosine/linear then fall from `lr` to `min_lr` at step max_steps and stay
// at min_lr afterwards. "constant" also honours warmup_steps and ignores max_steps and min_lr.
#include <cstdint>
#include <string_view>

namespace strata::optim {

enum class LrScheduleKind : uint8_t { Constant, Cosine, Linear };

std::string_view lr_schedule_name(LrScheduleKind kind);
// "constant", "cosine", "linear"; strata::user_error otherwise.
LrScheduleKind parse_lr_schedule(std::string_view name);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::Constant;
  double lr = 3e-4;     // peak rate
  double min_lr = 0.0;  // final rate of cosine/linear
  int64_t warmup_steps = 0;
  int64_t max_steps = 0;  // cosine/linear: step at which min_lr is reached (> warmup_steps)
};

class LrSchedule {
 public:
  // strata::user_error on an inconsistent config (negative rates, min_lr > lr, max_steps not
  // after warmup for a decaying schedule).
  explicit LrSchedule(const LrScheduleConfig& config);

  // Note [Schedule steps].
  double lr(int64_t step) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  LrScheduleConfig config_;
};

}  // namespace strata::optim
