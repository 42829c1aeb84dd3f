#include "parallel/device_placement.h"

#include <cmath>

#include "offload/memory_stats.h"
#include "optim/grad_clip.h"
#include "parallel/rank_sum.h"
#include "parallel/tp_grad_norm.h"

namespace strata::parallel {

DevicePlacement::DevicePlacement(const std::vector<models::FlatUnit>& units,
                                 const Partitioning& parts, DType param_dtype,
                                 comm::Communicator& dp)
    : param_dtype_(param_dtype),
      dp_(dp),
      sum_over_ranks_(parts.partitioned()),
      device_(units.front().grads.device()) {
  if (!mixed_precision()) return;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    STRATA_CHECK(units[u].params.dtype() == DType::F32, "masters from a {} unit '{}'",
                 dtype_name(units[u].params.dtype()), units[u].name);
    const Range own = parts.owned(u);
    tensor::Tensor m;
    {
      offload::CategoryScope scope(offload::Category::Optimizer);
      m = tensor::Tensor::empty({own.size()}, DType::F32, units[u].params.device());
    }
    // Note [Unit-by-unit construction]: not initialised yet; set_initial_master() brings it.
    const bool later = units[u].params.storage()->is_released();
    if (!later) m.copy_(units[u].params.narrow(0, own.begin, own.size()));
    masters_.push_back(std::move(m));
    masters_due_.push_back(later);
  }
}

void DevicePlacement::set_initial_master(int u, const tensor::Tensor& slice) {
  if (!mixed_precision()) return;  // the optimizer steps the owned parameters themselves
  STRATA_CHECK(u >= 0 && u < static_cast<int>(masters_.size()) && masters_due_[u],
               "unit {} has its initial master", u);
  STRATA_CHECK(slice.dtype() == DType::F32 && slice.numel() == masters_[u].numel(),
               "unit {}: masters start from an f32 tensor of {} elements, got {}", u,
               masters_[u].numel(), slice.str());
  masters_[u].copy_(slice);  // host to device when the unit was initialised on the host
  masters_due_[u] = false;
}

void DevicePlacement::build(std::vector<OwnedSlice> slices, const OptimizerFactory& make) {
  STRATA_CHECK(!optimizer_, "the optimizer placement is built once");
  STRATA_CHECK(!mixed_precision() || slices.size() == masters_.size(), "{} slices for {} masters",
               slices.size(), masters_.size());
  std::vector<optim::ParamGroup> groups;
  for (size_t u = 0; u < slices.size(); ++u) {
    optim::ParamGroup g;
    g.segments = std::move(slices[u].segments);
    g.param = slices[u].params;
    if (mixed_precision()) {
      g.low_precision_copy = g.param;
      g.param = masters_[u];
    }
    g.grad = slices[u].grads;
    groups.push_back(std::move(g));
  }
  optimizer_ = make(std::move(groups));
  STRATA_CHECK(optimizer_ != nullptr, "the optimizer factory returned nothing");
}

// With whole units every rank holds the same reduced gradients, hence the same sum. Then the
// sum over pipeline stages (Note [Norm across stages]).
double DevicePlacement::global_sum(double local) const {
  return sum_over_stages(sum_over_ranks_ ? sum_over_ranks(dp_, local, device_) : local, device_);
}

// Note [Norm across stages]: a tied copy another stage counts is left out; global_sum also sums
// over the stages, so the sharded and replicated sums are each the pipeline's.
double DevicePlacement::global_sum_of_squares(const std::vector<tensor::Tensor>& grads) const {
  if (tp_model_ == nullptr) return global_sum(optim::grad_sum_of_squares(norm_grads(grads)));
  std::vector<optim::ParamGroup> counted;
  const std::vector<optim::ParamGroup>& groups = optimizer_->groups();
  for (size_t u = 0; u < groups.size(); ++u)
    if (norm_counted_.empty() || norm_counted_[u]) counted.push_back(groups[u]);
  return tp_sum_of_squares(*tp_model_, split_sum_of_squares(*tp_model_, counted),
                           [this](double x) { return global_sum(x); });
}

StepResult DevicePlacement::step(double lr, double max_norm, optim::LossScaler* scaler) {
  std::vector<tensor::Tensor> grads;
  for (const optim::ParamGroup& g : optimizer_->groups()) grads.push_back(g.grad);
  const int nd = dp_.size();
  StepResult result;
  if (mixed_precision()) {
    // Note [Mixed precision]: one f32 factor, applied after widening; nothing rescaled in place.
    double factor = 1.0 / nd;
    if (scaler != nullptr) factor /= scaler->scale();
    result.grad_norm = std::sqrt(global_sum_of_squares(grads)) * factor;
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler != nullptr ? scaler->update(overflow) : !overflow;
    result.skipped = !apply;
    if (apply) {
      const float coef = max_norm > 0 ? optim::clip_coefficient(result.grad_norm, max_norm) : 1.f;
      optimizer_->set_grad_scale(static_cast<float>(factor * coef));
      optimizer_->step(lr);
    }
    return result;
  }
  // Exact for a power-of-two dp; the sum is in, so this is the mean over the global batch.
  if (nd > 1) optim::scale_grads(grads, 1.f / static_cast<float>(nd));
  if (scaler != nullptr) optim::scale_grads(grads, static_cast<float>(1.0 / scaler->scale()));
  result.grad_norm = std::sqrt(global_sum_of_squares(grads));
  const bool overflow = !std::isfinite(result.grad_norm);
  const bool apply = scaler != nullptr ? scaler->update(overflow) : !overflow;
  result.skipped = !apply;
  if (apply) {
    if (max_norm > 0) {
      const float coef = optim::clip_coefficient(result.grad_norm, max_norm);
      if (coef < 1.f) optim::scale_grads(grads, coef);
    }
    optimizer_->step(lr);
  }
  return result;
}

void DevicePlacement::params_from_masters() {
  if (!mixed_precision()) return;
  for (const optim::ParamGroup& g : optimizer_->groups())
    tensor::Tensor(g.low_precision_copy).copy_(g.param);  // a handle to the same storage
}

}  // namespace strata::parallel
