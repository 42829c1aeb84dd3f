#pragma once
// Dynamic loss scaling for fp16 training, with DeepSpeed's semantics and config names.
//
// Note [Dynamic loss scaling]
// fp16 gradients underflow unless the loss is multiplied by a large scale before backward (and
// the gradients divided by it before the update). The scale starts at 2^initial_scale_power.
// A step whose gradients hold an inf or a NaN is skipped (the optimizer does not run) and, once
// `hysteresis` such steps have been seen, the scale is halved (never below min_loss_scale).
// After `loss_scale_window` steps without overflow since the last one, the scale doubles and the
// hysteresis budget is refilled. This is DeepSpeed's DynamicLossScaler step for step
// (deepspeed/runtime/fp16/loss_scaler.py, consecutive_hysteresis = false by default), so a
// DeepSpeed user's fp16 config behaves the same here. `loss_scale > 0` selects a static scale
// (DeepSpeed's `fp16.loss_scale`), which never changes and never skips. bf16 and fp32 runs need
// no scaler.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace strata::optim {

struct LossScalerConfig {
  double loss_scale = 0;  // > 0: static scale; 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
  bool consecutive_hysteresis = false;
  // DeepSpeed raises when an overflow arrives with the scale already at its minimum: training
  // cannot make progress. false keeps skipping instead.
  bool raise_error_at_min_scale = true;
};

// What a scaler must save so that a resumed run scales exactly as an uninterrupted one.
struct LossScalerState {
  double scale = 0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int hysteresis_left = 0;
};

class LossScaler {
 public:
  // Throws strata::user_error for settings out of range (the message names the fp16 key).
  explicit LossScaler(const LossScalerConfig& config = {});

  double scale() const { return state_.scale; }
  bool dynamic() const { return config_.loss_scale <= 0; }
  // Call once per optimizer step with whether the (unscaled) gradients overflowed. Returns true
  // when the step may be applied, false when it must be skipped (logged with the new scale).
  bool update(bool overflow);
  int64_t skipped_steps() const { return skipped_; }

  const LossScalerState& state() const { return state_; }
  void load_state(const LossScalerState& state);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
  int64_t skipped_ = 0;
};

// True when any element of any tensor is inf or NaN (any float dtype, any device): the overflow
// test of a fp16 step.
bool has_inf_or_nan(const std::vector<tensor::Tensor>& grads);

}  // namespace strata::optim
