#include "parallel/engine.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "autograd/functions.h"
#include "autograd/grad_sink.h"
#include "offload/memory_stats.h"
#include "optim/grad_clip.h"
#include "parallel/param_groups.h"

namespace strata::parallel {

void ZeroConfig::validate() const {
  if (stage < 0 || stage > 3)
    user_error("zero_optimization.stage must be 0, 1, 2 or 3, got {}", stage);
  if (reduce_bucket_size < 1)
    user_error("zero_optimization.reduce_bucket_size must be >= 1 element, got {}",
               reduce_bucket_size);
  if (allgather_bucket_size < 1)
    user_error("zero_optimization.allgather_bucket_size must be >= 1 element, got {}",
               allgather_bucket_size);
  if (stage3_prefetch_bucket_size < 0)
    user_error("zero_optimization.stage3_prefetch_bucket_size must be >= 0, got {}",
               stage3_prefetch_bucket_size);
  if (stage3_param_persistence_threshold < 0)
    user_error("zero_optimization.stage3_param_persistence_threshold must be >= 0, got {}",
               stage3_param_persistence_threshold);
}

Engine::Engine(models::CausalLM& model, std::shared_ptr<comm::Communicator> dp, const ZeroConfig& zero,
               OptimizerFactory make_optimizer, DType param_dtype)
    : model_(model), dp_(std::move(dp)), zero_(zero), param_dtype_(param_dtype) {
  STRATA_CHECK(dp_ != nullptr, "the engine needs a dp communicator");
  zero_.validate();
  std::vector<models::FlatUnit>& units = model_.flat_units();
  STRATA_USER_CHECK(!units.empty(), "model '{}' has no flat units (Note [Flat parameters])",
                    model_.family());
  const int nd = dp_->size();
  const int r = dp_->rank();
  const int n_units = static_cast<int>(units.size());

  // Note [ZeRO partitions]: checkpoints use the unpadded coordinates, recorded before repad.
  for (const models::FlatUnit& u : units)
    parts_.push_back(zero_.stage == 0 ? whole_unit(u.size()) : partition_unit(u.size(), nd));
  if (zero_.stage >= 1) models::repad_flat_units(units, static_cast<int64_t>(nd) * kPartitionAlign);
  sync_params();  // before anything is partitioned: every unit is whole here

  // Note [Mixed precision]: fp32 masters of the owned slices, then the model goes low precision.
  STRATA_USER_CHECK(
      param_dtype_ == DType::F32 || param_dtype_ == DType::BF16 || param_dtype_ == DType::F16,
      "engine parameters must be fp32, bf16 or fp16, not {}", dtype_name(param_dtype_));
  for (const models::FlatUnit& u : units)
    STRATA_CHECK(u.params.dtype() == DType::F32, "unit '{}' is already {}", u.name,
                 dtype_name(u.params.dtype()));
  if (mixed_precision()) {
    for (int u = 0; u < n_units; ++u) {
      const Range own = parts_[u].owned(zero_.stage == 0 ? 0 : r);
      tensor::Tensor m;
      {
        offload::CategoryScope scope(offload::Category::Optimizer);
        m = tensor::Tensor::empty({own.size()}, DType::F32, units[u].params.device());
      }
      m.copy_(units[u].params.narrow(0, own.begin, own.size()));
      masters_.push_back(std::move(m));
    }
    models::cast_flat_units(units, param_dtype_);
  }

  std::vector<UnitReduction> setup(units.size());
  std::vector<bool> managed(units.size(), false);
  partition_grads_.resize(units.size());
  for (int u = 0; u < n_units; ++u) {
    UnitReduction& s = setup[u];
    s.part = parts_[u];
    if (zero_.stage == 0) {
      s.kind = Reduction::Allreduce;
    } else if (zero_.stage == 1) {
      s.kind = Reduction::IntoOwnedSlice;
    } else {
      s.kind = Reduction::IntoPartition;
      {
        offload::CategoryScope scope(offload::Category::Grad);
        partition_grads_[u] = tensor::Tensor::empty({parts_[u].shard}, units[u].grads.dtype(),
                                                    units[u].grads.device());
      }
      partition_grads_[u].zero_();
      s.partition_grad = partition_grads_[u];
      units[u].grads.storage()->release();  // Note [Transient gradients]
    }
    kinds_.push_back(s.kind);
    managed[u] = zero_.stage == 3 && parts_[u].numel >= zero_.stage3_param_persistence_threshold;
  }
  if (zero_.stage == 3)
    gatherer_ = std::make_unique<ParamGatherer>(units, managed, parts_, *dp_,
                                                zero_.stage3_prefetch_bucket_size);
  reducer_ = std::make_unique<GradReducer>(units, std::move(setup), *dp_, zero_.reduce_bucket_size);
  reducer_->set_synchronous(!zero_.overlap_comm);

  std::vector<optim::ParamGroup> groups;
  for (int u = 0; u < n_units; ++u) {
    const Range own = parts_[u].owned(zero_.stage == 0 ? 0 : r);
    optim::ParamGroup g;
    g.segments = unit_segments(units[u], own);
    g.param =
        managed[u] ? gatherer_->partition(u) : units[u].params.narrow(0, own.begin, own.size());
    if (mixed_precision()) {
      g.low_precision_copy = g.param;
      g.param = masters_[u];
    }
    g.grad =
        zero_.stage >= 2 ? partition_grads_[u] : units[u].grads.narrow(0, own.begin, own.size());
    groups.push_back(std::move(g));
  }
  optimizer_ = make_optimizer(std::move(groups));
  STRATA_CHECK(optimizer_ != nullptr, "the optimizer factory returned nothing");
  install_hooks();
}

Engine::~Engine() {
  for (auto& [module, handle] : hooks_) module->remove_hook(handle);
}

// Note [ZeRO-3 gathering] and Note [Transient gradients]: hooks on every module that uses a
// unit — its prefixes and its users.
void Engine::install_hooks() {
  using models::nn::Module;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const bool transient = kinds_[u] == Reduction::IntoPartition;
    const bool managed = gatherer_ && gatherer_->managed(u);
    if (!transient && !managed) continue;
    std::vector<std::string> paths = units[u].prefixes;
    paths.insert(paths.end(), units[u].users.begin(), units[u].users.end());
    for (const std::string& path : paths) {
      STRATA_CHECK(!path.empty(), "unit '{}' has an empty module prefix", units[u].name);
      Module& m = model_.module(path);
      if (managed) {
        hooks_.emplace_back(&m, m.register_forward_pre_hook(
                                    [this, u](Module&, const auto&) { gatherer_->request(u); }));
        // A recompute (activation checkpointing) runs forward inside backward: keep the unit.
        hooks_.emplace_back(&m,
                            m.register_forward_hook([this, u](Module&, const auto&, const auto&) {
                              if (!in_backward_) gatherer_->release(u);
                            }));
        hooks_.emplace_back(
            &m, m.register_backward_hook([this, u](Module&) { gatherer_->release(u); }));
      }
      hooks_.emplace_back(&m, m.register_backward_pre_hook([this, u, managed](Module&) {
        reducer_->ensure_full_grads(u);
        if (managed) gatherer_->request(u);
      }));
    }
  }
}

void Engine::begin_micro_batch(bool last) {
  STRATA_CHECK(!in_backward_, "begin_micro_batch during backward");
  in_micro_batch_ = true;
  last_micro_batch_ = last;
  reducer_->begin_pass(last);
  if (gatherer_) gatherer_->begin_pass(/*record=*/true);
}

void Engine::backward(const autograd::Variable& loss) {
  STRATA_USER_CHECK(in_micro_batch_,
                    "Engine::backward without begin_micro_batch: call begin_micro_batch(last) "
                    "before each micro-batch's forward");
  in_backward_ = true;
  // Note [Weight gradients into their buffer]: GEMMs add into the buffers only while they hold
  // nothing from an earlier micro-batch, so accumulated gradients keep the bits of ZeRO stages 2
  // and 3, which add each micro-batch's rounded gradient into their partitions. Then the buffers
  // hold zeros, so bias gradients may be written over them (Note [Bias gradients into their
  // buffer]; ZeRO-2/3's transient buffers are zeroed as each unit's backward begins).
  const autograd::GradIntoBufferGuard into_buffer(grads_zero_, /*zeroed=*/grads_zero_);
  grads_zero_ = false;
  try {
    if (scaler_ != nullptr) {
      autograd::scale(loss, static_cast<float>(scaler_->scale())).backward();
    } else {
      loss.backward();
    }
  } catch (...) {
    in_backward_ = false;
    in_micro_batch_ = false;
    throw;
  }
  in_backward_ = false;
  in_micro_batch_ = false;
  reducer_->end_pass();
  if (gatherer_) gatherer_->end_pass();
}

float Engine::loss_gradient(float weight) const {
  // backward() seeds 1, its scale node multiplies by the loss scale, the caller's by weight.
  return scaler_ != nullptr ? static_cast<float>(scaler_->scale()) * weight : weight;
}

std::vector<tensor::Tensor> Engine::owned_grads() const {
  std::vector<tensor::Tensor> out;
  for (const optim::ParamGroup& g : optimizer_->groups()) out.push_back(g.grad);
  return out;
}

// Doubles cannot travel as tensors (no f64 dtype): allgather their bits and add them up in rank
// order, so every rank computes the same sum from the same values (DESIGN.md decision 9). The
// tensors live on the model's device (what an nccl communicator serves).
double Engine::allreduce_sum(double x) {
  const int nd = dp_->size();
  if (nd == 1) return x;
  const Device device = model_.flat_units().front().grads.device();
  tensor::Tensor mine = tensor::Tensor::empty({1}, DType::I64);
  std::memcpy(mine.data_ptr(), &x, sizeof(double));
  tensor::Tensor all = tensor::Tensor::empty({nd}, DType::I64, device);
  dp_->allgather(mine.to(device), all)->wait();
  const tensor::Tensor host = all.to(Device::cpu());
  double sum = 0;
  for (int q = 0; q < nd; ++q) {
    double v;
    std::memcpy(&v, host.data<int64_t>() + q, sizeof(double));
    sum += v;
  }
  return sum;
}

double Engine::average(double x) {
  return allreduce_sum(x) / dp_->size();
}

StepResult Engine::step(double lr, double max_norm) {
  STRATA_USER_CHECK(last_micro_batch_,
                    "Engine::step before the last micro-batch: call begin_micro_batch(true) before "
                    "the step's last micro-batch so its gradients are reduced");
  STRATA_CHECK(!in_micro_batch_, "Engine::step between begin_micro_batch and backward");
  reducer_->wait_all();
  if (gatherer_) gatherer_->release_all();
  const std::vector<tensor::Tensor> grads = owned_grads();
  const int nd = dp_->size();
  StepResult result;
  if (mixed_precision()) {
    // Note [Mixed precision]: one f32 factor, applied after widening; nothing rescaled in place.
    double factor = 1.0 / nd;
    if (scaler_ != nullptr) factor /= scaler_->scale();
    double sum_sq = optim::grad_sum_of_squares(grads);
    if (zero_.stage >= 1) sum_sq = allreduce_sum(sum_sq);
    result.grad_norm = std::sqrt(sum_sq) * factor;
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler_ != nullptr ? scaler_->update(overflow) : !overflow;
    result.skipped = !apply;
    if (apply) {
      const float coef = max_norm > 0 ? optim::clip_coefficient(result.grad_norm, max_norm) : 1.f;
      optimizer_->set_grad_scale(static_cast<float>(factor * coef));
      optimizer_->step(lr);
      allgather_updated_params();
    }
  } else {
    // Exact for a power-of-two dp; the sum is in, so this is the mean over the global batch.
    if (nd > 1) optim::scale_grads(grads, 1.f / static_cast<float>(nd));
    if (scaler_ != nullptr) optim::scale_grads(grads, static_cast<float>(1.0 / scaler_->scale()));
    double sum_sq = optim::grad_sum_of_squares(grads);
    // At stage 0 every rank holds the same reduced gradients, hence the same sum.
    if (zero_.stage >= 1) sum_sq = allreduce_sum(sum_sq);
    result.grad_norm = std::sqrt(sum_sq);
    const bool overflow = !std::isfinite(result.grad_norm);
    const bool apply = scaler_ != nullptr ? scaler_->update(overflow) : !overflow;
    result.skipped = !apply;
    if (apply) {
      if (max_norm > 0) {
        const float coef = optim::clip_coefficient(result.grad_norm, max_norm);
        if (coef < 1.f) optim::scale_grads(grads, coef);
      }
      optimizer_->step(lr);
      allgather_updated_params();
    }
  }
  std::vector<models::FlatUnit>& units = model_.flat_units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (zero_.stage >= 2) {
      partition_grads_[u].zero_();
    } else {
      units[u].grads.zero_();
    }
  }
  grads_zero_ = true;
  last_micro_batch_ = false;
  return result;
}

// Stages 1/2 and stage 3's whole units: every rank updated its slice; make the units whole again.
// In place when a bucket is a whole slice (input = chunk rank() of the output), else through a
// staging buffer, at most two buckets in flight.
void Engine::allgather_updated_params() {
  const int nd = dp_->size();
  if (zero_.stage == 0 || nd == 1) return;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  struct Pending {
    int unit;
    Range per_rank;
    tensor::Tensor staging;
    comm::WorkHandle work;
  };
  std::vector<Pending> pending;
  auto complete = [&](Pending& p) {
    p.work->wait();
    if (!p.staging.defined()) return;
    const int64_t n = p.per_rank.size();
    for (int q = 0; q < nd; ++q)
      units[p.unit]
          .params.narrow(0, q * parts_[p.unit].shard + p.per_rank.begin, n)
          .copy_(p.staging.narrow(0, q * n, n));
  };
  const int64_t per_rank_max = std::max<int64_t>(1, zero_.allgather_bucket_size / nd);
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (gatherer_ && gatherer_->managed(u)) continue;
    const UnitPartition& p = parts_[u];
    const Range own = p.owned(dp_->rank());
    for (Range c : split_range(p.shard, per_rank_max)) {
      if (trace_) trace_(fmt::format("allgather {} [{}, {})", units[u].name, c.begin, c.end));
      Pending next{u, c, {}, {}};
      tensor::Tensor input = units[u].params.narrow(0, own.begin + c.begin, c.size());
      if (c.size() == p.shard) {
        next.work = dp_->allgather(input, units[u].params);
      } else {
        offload::CategoryScope scope(offload::Category::Comm);
        next.staging = tensor::Tensor::empty({c.size() * nd}, input.dtype(), input.device());
        next.work = dp_->allgather(input, next.staging);
      }
      pending.push_back(std::move(next));
      if (pending.size() > 2) {
        complete(pending.front());
        pending.erase(pending.begin());
      }
    }
  }
  for (Pending& p : pending) complete(p);
}

Engine::ModelStateBytes Engine::model_state_bytes() const {
  const Device device = model_.flat_units().front().grads.device();
  const offload::Tier tier = device.is_cpu() ? offload::Tier::Host : offload::Tier::Gpu;
  const offload::MemoryStats& stats = offload::MemoryStats::global();
  ModelStateBytes b;
  b.params = stats.usage(tier, offload::Category::Param).current;
  b.grads = stats.usage(tier, offload::Category::Grad).current;
  b.optimizer = stats.usage(tier, offload::Category::Optimizer).current;
  return b;
}

int64_t Engine::gathered_param_peak_bytes() const {
  return gatherer_ ? gatherer_->gathered_peak_bytes() : 0;
}

void Engine::reset_gathered_peak() {
  if (gatherer_) gatherer_->reset_gathered_peak();
}

const std::vector<int>& Engine::gather_order() const {
  static const std::vector<int> kNone;
  return gatherer_ ? gatherer_->order() : kNone;
}

int64_t Engine::prefetches() const {
  return gatherer_ ? gatherer_->prefetches() : 0;
}

void Engine::set_trace(std::function<void(const std::string&)> fn) {
  trace_ = fn;
  reducer_->set_trace(fn);
  if (gatherer_) gatherer_->set_trace(fn);
}

}  // namespace strata::parallel
