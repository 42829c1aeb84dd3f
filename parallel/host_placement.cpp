#include "parallel/host_placement.h"

#include <cmath>

#include <fmt/format.h>

#include "offload/memory_stats.h"
#include "optim/grad_clip.h"
#include "parallel/gradient_reduction.h"
#include "parallel/rank_sum.h"
#include "parallel/tp_grad_norm.h"

namespace strata::parallel {

std::vector<float> fp32_last_pass_scales(int dp, const optim::LossScaler* scaler) {
  std::vector<float> f;
  if (dp > 1) f.push_back(1.f / static_cast<float>(dp));
  if (scaler != nullptr) f.push_back(static_cast<float>(1.0 / scaler->scale()));
  return f;
}

HostPlacement::HostPlacement(const std::vector<models::FlatUnit>& units, const Partitioning& parts,
                             DType param_dtype, comm::Communicator& dp,
                             const OffloadOptimizerConfig& config, bool units_released,
                             bool partitions_released)
    : param_dtype_(param_dtype),
      dp_(dp),
      sum_over_ranks_(parts.partitioned()),
      device_(units.front().grads.device()),
      config_(config) {
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    STRATA_CHECK(units[u].params.dtype() == DType::F32, "masters from a {} unit '{}'",
                 dtype_name(units[u].params.dtype()), units[u].name);
    const Range own = parts.owned(u);
    // Note [Unit-by-unit construction]: not initialised yet; set_initial_master() brings them.
    if (units[u].params.storage()->is_released()) {
      initial_masters_.emplace_back();
      continue;
    }
    if (config_.nvme && param_dtype == DType::F32 && !partitions_released) {
      // The owned fp32 parameters are the masters' start: NvmeAdamW takes them from the slices.
      initial_masters_.emplace_back();
      continue;
    }
    offload::CategoryScope scope(offload::Category::Optimizer);
    const tensor::Tensor slice = units[u].params.narrow(0, own.begin, own.size());
    tensor::Tensor m = slice.to(Device::cpu());  // host units: the same storage, no copy
    if (units_released && m.data_ptr() == slice.data_ptr()) {
      // ZeRO-3 releases the unit's storage before build(): the masters need their own.
      m = tensor::Tensor::empty({own.size()}, DType::F32);
      m.copy_(slice);
    }
    initial_masters_.push_back(std::move(m));
  }
}

void HostPlacement::count_shards_of(const models::CausalLM& model) {
  STRATA_CHECK(!offload_ && !nvme_, "count_shards_of after build()");
  tp_model_ = &model;
}

void HostPlacement::use_host_grads(GradientReduction& reduction) {
  STRATA_CHECK(!offload_, "use_host_grads after build()");
  STRATA_CHECK(reduction.grads_on_host() || (reduction.grads_on_nvme() && config_.nvme),
               "the reduction keeps its gradients on the device");
  host_grads_ = &reduction;
}

void HostPlacement::build(std::vector<OwnedSlice> slices, const OptimizerFactory& make) {
  STRATA_CHECK(!offload_ && !nvme_, "the optimizer placement is built once");
  STRATA_CHECK(slices.size() == initial_masters_.size(), "{} slices for {} masters", slices.size(),
               initial_masters_.size());
  // Built from host units, the engine moves them after this placement's constructor (Note
  // [Offload construction]): the norm's sums go over the device the parameters train on.
  if (!slices.empty()) device_ = slices.front().params.device();
  if (tp_model_ != nullptr) {
    // Note [Tensor-parallel gradient norm]: the norm's terms per segment, in order.
    for (size_t u = 0; u < slices.size(); ++u) {
      norm_segments_.push_back(slices[u].segments);
      segment_sharded_.push_back(sharded_segments(*tp_model_, slices[u].segments));
      if (host_grads_ == nullptr) continue;
      std::vector<Range> pieces;
      for (const optim::Segment& sg : slices[u].segments)
        pieces.push_back({sg.offset, sg.offset + sg.numel});
      host_grads_->set_norm_pieces(static_cast<int>(u), std::move(pieces));
    }
  }
  if (config_.nvme) {
    // The factory says which AdamW: asked for one over no groups, it allocates nothing.
    const std::unique_ptr<optim::Optimizer> probe = make({});
    const auto* adamw = dynamic_cast<const optim::AdamW*>(probe.get());
    STRATA_USER_CHECK(adamw != nullptr,
                      "offload_optimizer.device nvme steps AdamW; the optimizer is {} (set "
                      "optimizer.name: adamw)",
                      probe ? std::string(probe->name()) : std::string("none"));
    STRATA_USER_CHECK(!config_.delayed_param_update,
                      "offload_optimizer.delayed_param_update needs device cpu, not nvme");
    std::vector<optim::NvmeSlice> nv;
    for (size_t u = 0; u < slices.size(); ++u) {
      device_grads_.push_back(slices[u].grads);
      nv.push_back({slices[u].params, slices[u].grads, std::move(initial_masters_[u]),
                    std::move(slices[u].segments)});
    }
    initial_masters_.clear();
    optim::NvmeAdamWOptions options = config_.nvme_options;
    options.pin_memory = config_.pin_memory;
    // Note [Gradients on NVMe] (optim/nvme_adamw.h): the reduction writes them into the store.
    options.grads_on_nvme = host_grads_ != nullptr && host_grads_->grads_on_nvme();
    options.grad_dtype = param_dtype_;  // the units' gradients are cast with their parameters
    if (options.lock_tag.empty()) {
      // The ranks of a tp group share a dp rank: each needs a swap file of its own.
      options.lock_tag =
          tp_model_ != nullptr && tp_model_->tensor_parallel().enabled()
              ? fmt::format("optimizer-tp{}-dp{}", tp_model_->tensor_parallel().rank(), dp_.rank())
              : fmt::format("optimizer-dp{}", dp_.rank());
    }
    nvme_ = std::make_unique<optim::NvmeAdamW>(std::move(nv), adamw->config(), options);
    return;
  }
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
  optim::HostOffloadOptions options;
  options.pin_memory = config_.pin_memory;
  options.grads_on_host = host_grads_ != nullptr;
  options.copy_host_grads = options.grads_on_host && config_.delayed_param_update;
  offload_ = std::make_unique<optim::HostOffload>(std::move(host), make, options);
}

optim::Optimizer& HostPlacement::optimizer() {
  if (nvme_) return *nvme_;
  offload_->finish();
  return offload_->optimizer();
}

tensor::Tensor HostPlacement::master(int u) {
  if (nvme_) return nvme_->master(static_cast<size_t>(u));
  return optimizer().groups()[u].param;
}

void HostPlacement::set_param_fence(optim::Optimizer::GroupFence fence) {
  if (nvme_) {
    nvme_->set_group_fence(std::move(fence));
    return;
  }
  // The host optimizer steps host masters only; the fence goes around the write-back.
  offload_->finish();
  offload_->set_param_fence(std::move(fence));
}

bool HostPlacement::finish_pending() {
  if (nvme_) {  // no delayed update; the last step's writes land
    nvme_->finish_writes();
    return false;
  }
  const bool pending = offload_->pending();
  offload_->finish();
  return pending;
}

// Then the sum over pipeline stages (Note [Norm across stages]).
double HostPlacement::global_sum(double local) const {
  return sum_over_stages(sum_over_ranks_ ? sum_over_ranks(dp_, local, device_) : local, device_);
}

// This rank's sum of squares over the units the norm counts, added in unit order as
// grad_sum_of_squares adds its tensors' (Note [Norm across stages]).
double HostPlacement::local_sum_of_squares() const {
  if (host_grads_ == nullptr) return optim::grad_sum_of_squares(norm_grads(device_grads_));
  double total = 0;
  for (int u = 0; u < static_cast<int>(device_grads_.size()); ++u)
    if (norm_counted_.empty() || norm_counted_[static_cast<size_t>(u)])
      total += host_grads_->owned_sum_of_squares(u);
  return total;
}

double HostPlacement::global_sum_of_squares() const {
  if (tp_model_ == nullptr) return global_sum(local_sum_of_squares());
  // DevicePlacement::global_sum_of_squares's split, term by term (Note [Norm across stages]).
  auto counted = [&](size_t u) { return norm_counted_.empty() || norm_counted_[u]; };
  SplitSumOfSquares split;
  if (host_grads_ == nullptr) {
    std::vector<optim::ParamGroup> groups;
    for (size_t u = 0; u < device_grads_.size(); ++u) {
      if (!counted(u)) continue;
      optim::ParamGroup g;
      g.grad = device_grads_[u];
      g.segments = norm_segments_[u];
      groups.push_back(std::move(g));
    }
    split = split_sum_of_squares(*tp_model_, groups);
  } else {
    for (size_t u = 0; u < device_grads_.size(); ++u)
      if (counted(u))
        add_segment_sums(split, host_grads_->owned_piece_sums(static_cast<int>(u)),
                         segment_sharded_[u]);
  }
  return tp_sum_of_squares(*tp_model_, split, [this](double x) { return global_sum(x); });
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
    result.grad_norm = std::sqrt(global_sum_of_squares()) * factor;
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler != nullptr ? scaler->update(overflow) : !overflow;
    result.skipped = !apply;
    if (!apply) return result;  // a pending delayed update stays pending (Note [Offloaded step])
    const float coef = max_norm > 0 ? optim::clip_coefficient(result.grad_norm, max_norm) : 1.f;
    scale = static_cast<float>(factor * coef);
  } else {
    // With host gradients the reduction applied these on the device (fp32_last_pass_scales).
    if (host_grads_ == nullptr)
      for (float f : fp32_last_pass_scales(nd, scaler)) optim::scale_grads(grads, f);
    result.grad_norm = std::sqrt(global_sum_of_squares());
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler != nullptr ? scaler->update(overflow) : !overflow;
    result.skipped = !apply;
    if (!apply) return result;
    if (max_norm > 0) {
      const float coef = optim::clip_coefficient(result.grad_norm, max_norm);
      // On NVMe the optimizer multiplies each read sub-group by it: the same f32 product.
      if (coef < 1.f) {
        if (nvme_ && nvme_->grads_on_nvme()) {
          scale = coef;
        } else {
          optim::scale_grads(grads, coef);
        }
      }
    }
  }
  if (nvme_) {  // Note [Optimizer states on NVMe]: the gradients are read sub-group by sub-group
    nvme_->set_grad_scale(scale);
    nvme_->step(lr);
    return result;
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

void HostPlacement::set_initial_master(int u, const tensor::Tensor& slice) {
  if (nvme_) {
    nvme_->set_initial_master(static_cast<size_t>(u), slice);
  } else {
    offload_->set_initial_master(static_cast<size_t>(u), slice);
  }
}

void HostPlacement::params_from_masters() {
  if (nvme_) {
    nvme_->commit_staged();
    return;
  }
  offload_->params_from_masters();
}

}  // namespace strata::parallel
