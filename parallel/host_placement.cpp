#include "parallel/host_placement.h"

#include <cmath>

#include "offload/memory_stats.h"
#include "optim/grad_clip.h"
#include "parallel/rank_sum.h"

namespace strata::parallel {

HostPlacement::HostPlacement(const std::vector<models::FlatUnit>& units, const Partitioning& parts,
                             DType param_dtype, comm::Communicator& dp,
                             const OffloadOptimizerConfig& config)
    : param_dtype_(param_dtype),
      dp_(dp),
      sum_over_ranks_(parts.partitioned()),
      device_(units.front().grads.device()),
      config_(config) {
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    STRATA_CHECK(units[u].params.dtype() == DType::F32, "masters from a {} unit '{}'",
                 dtype_name(units[u].params.dtype()), units[u].name);
    const Range own = parts.owned(u);
    offload::CategoryScope scope(offload::Category::Optimizer);
    initial_masters_.push_back(units[u].params.narrow(0, own.begin, own.size()).to(Device::cpu()));
  }
}

void HostPlacement::build(std::vector<OwnedSlice> slices, const OptimizerFactory& make) {
  STRATA_CHECK(!offload_, "the optimizer placement is built once");
  STRATA_CHECK(slices.size() == initial_masters_.size(), "{} slices for {} masters", slices.size(),
               initial_masters_.size());
  std::vector<optim::OffloadSlice> host;
  for (size_t u = 0; u < slices.size(); ++u) {
    optim::OffloadSlice s;
    s.params = slices[u].params;
    s.grads = slices[u].grads;
    s.master = std::move(initial_masters_[u]);
    s.segments = std::move(slices[u].segments);
    device_grads_.push_back(s.grads);
    host.push_back(std::move(s));
  }
  initial_masters_.clear();
  offload_ = std::make_unique<optim::HostOffload>(std::move(host), make,
                                                  optim::HostOffloadOptions{config_.pin_memory});
}

optim::Optimizer& HostPlacement::optimizer() {
  offload_->finish();
  return offload_->optimizer();
}

bool HostPlacement::finish_pending() {
  const bool pending = offload_->pending();
  offload_->finish();
  return pending;
}

// Then the sum over pipeline stages (Note [Norm across stages]).
double HostPlacement::global_sum(double local) const {
  return sum_over_stages(sum_over_ranks_ ? sum_over_ranks(dp_, local, device_) : local, device_);
}

// Note [Offloaded step]: DevicePlacement::step's arithmetic; the update on the host.
StepResult HostPlacement::step(double lr, double max_norm, optim::LossScaler* scaler) {
  const std::vector<tensor::Tensor>& grads = device_grads_;
  const int nd = dp_.size();
  StepResult result;
  float scale = 1.f;
  if (mixed_precision()) {
    double factor = 1.0 / nd;
    if (scaler != nullptr) factor /= scaler->scale();
    result.grad_norm =
        std::sqrt(global_sum(optim::grad_sum_of_squares(norm_grads(grads)))) * factor;
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler != nullptr ? scaler->update(overflow) : !overflow;
    result.skipped = !apply;
    if (!apply) return result;  // a pending delayed update stays pending (Note [Offloaded step])
    const float coef = max_norm > 0 ? optim::clip_coefficient(result.grad_norm, max_norm) : 1.f;
    scale = static_cast<float>(factor * coef);
  } else {
    if (nd > 1) optim::scale_grads(grads, 1.f / static_cast<float>(nd));
    if (scaler != nullptr) optim::scale_grads(grads, static_cast<float>(1.0 / scaler->scale()));
    result.grad_norm = std::sqrt(global_sum(optim::grad_sum_of_squares(norm_grads(grads))));
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler != nullptr ? scaler->update(overflow) : !overflow;
    result.skipped = !apply;
    if (!apply) return result;
    if (max_norm > 0) {
      const float coef = optim::clip_coefficient(result.grad_norm, max_norm);
      if (coef < 1.f) optim::scale_grads(grads, coef);
    }
  }
  offload_->fetch_grads();  // finishes a pending delayed update first
  // Counted in updates taken, which a checkpoint restores, so a resumed run delays the same
  // steps as the uninterrupted one.
  const bool delayed = config_.delayed_param_update &&
                       offload_->optimizer().step_count() >= config_.delayed_param_update_start;
  if (delayed) {
    offload_->step_async(lr, scale);
    ++delayed_steps_;
  } else {
    offload_->step(lr, scale);
  }
  return result;
}

void HostPlacement::params_from_masters() {
  offload_->params_from_masters();
}

}  // namespace strata::parallel
