#include "optim/loss_scaler.h"

#include <cmath>

#include "core/error.h"
#include "core/logging.h"
#include "tensor/ops.h"

namespace strata::optim {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  if (config.loss_scale < 0 || !std::isfinite(config.loss_scale))
    user_error("fp16.loss_scale is {}: use 0 for dynamic loss scaling or a positive static scale",
               config.loss_scale);
  if (config.initial_scale_power < 0 || config.initial_scale_power > 63)
    user_error("fp16.initial_scale_power is {}: it must be in [0, 63] (the scale is 2^power)",
               config.initial_scale_power);
  if (config.loss_scale_window < 1)
    user_error("fp16.loss_scale_window is {}: it must be at least 1 step",
               config.loss_scale_window);
  if (config.hysteresis < 1)
    user_error("fp16.hysteresis is {}: it must be at least 1", config.hysteresis);
  if (!(config.min_loss_scale > 0) || !std::isfinite(config.min_loss_scale))
    user_error("fp16.min_loss_scale is {}: it must be a positive number", config.min_loss_scale);
  state_.scale = dynamic() ? std::ldexp(1.0, config.initial_scale_power) : config.loss_scale;
  state_.hysteresis_left = config.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic()) {
    // A static scale never adapts; an overflowing step is still not applied.
    ++state_.iteration;
    if (overflow) {
      ++skipped_;
      log::warn("fp16: gradient overflow at step {}; skipping it (static loss scale {})",
                state_.iteration - 1, state_.scale);
    }
    return !overflow;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || state_.hysteresis_left == 1) {
      if (state_.scale <= config_.min_loss_scale && config_.raise_error_at_min_scale)
        user_error(
            "fp16: gradients overflow with the loss scale already at fp16.min_loss_scale ({}); "
            "training cannot continue. Lower the learning rate, lower min_loss_scale, or train "
            "in bf16 (dtype: bf16)",
            config_.min_loss_scale);
      state_.scale = std::max(state_.scale / 2, config_.min_loss_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow_iteration = state_.iteration;
    ++skipped_;
    log::warn("fp16: gradient overflow at step {}; skipping it, loss scale now {}",
              state_.iteration, state_.scale);
  } else {
    if (config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
    if ((state_.iteration - state_.last_overflow_iteration) % config_.loss_scale_window == 0) {
      if (!config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
      state_.scale *= 2;
    }
  }
  ++state_.iteration;
  return !overflow;
}

void LossScaler::load_state(const LossScalerState& state) {
  if (!(state.scale > 0) || state.hysteresis_left < 1 || state.iteration < 0)
    user_error(
        "checkpoint's loss scaler state is invalid (scale {}, hysteresis {}, iteration {}); the "
        "checkpoint is damaged or from another tool",
        state.scale, state.hysteresis_left, state.iteration);
  state_ = state;
}

bool has_inf_or_nan(const std::vector<tensor::Tensor>& grads) {
  // A sum of squares is inf or NaN exactly when some element is (or when finite values overflow
  // double, which fp32/fp16 gradients cannot: 2^128 squared is far below DBL_MAX).
  for (const tensor::Tensor& g : grads)
    if (g.defined() && g.numel() > 0 && !std::isfinite(tensor::sum_squares(g))) return true;
  return false;
}

}  // namespace strata::optim
