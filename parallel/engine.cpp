#include "parallel/engine.h"

#include "autograd/functions.h"
#include "autograd/grad_sink.h"
#include "offload/allocator.h"
#include "offload/memory_stats.h"
#include "parallel/device_placement.h"
#include "parallel/param_groups.h"
#include "parallel/rank_sum.h"
#include "tensor/ops.h"

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
  if (offload_optimizer.enabled && stage < 1)
    user_error(
        "zero_optimization.offload_optimizer needs zero_optimization.stage 1, 2 or 3, got {}",
        stage);
  if (offload_optimizer.delayed_param_update_start < 0)
    user_error(
        "zero_optimization.offload_optimizer.delayed_param_update_start must be >= 0, got {}",
        offload_optimizer.delayed_param_update_start);
  if (offload_param.enabled() && stage != 3)
    user_error(
        "zero_optimization.offload_param.device: {} offloads ZeRO-3's parameter partitions and "
        "needs zero_optimization.stage 3, got {}",
        offload_param_device_name(offload_param.device), stage);
  // The delayed update writes the partitions back during a later step, which the fence around
  // the write-back (Note [Write-back through the group fence]) is not tested against.
  if (offload_param.enabled() && offload_optimizer.enabled &&
      offload_optimizer.delayed_param_update)
    user_error(
        "zero_optimization.offload_optimizer.delayed_param_update does not run with "
        "zero_optimization.offload_param yet; set one of them off");
  if (offload_param.enabled() && offload_param.buffer_count < 1)
    user_error("zero_optimization.offload_param.buffer_count must be >= 1, got {}",
               offload_param.buffer_count);
  if (stage3_param_persistence_threshold < 0)
    user_error("zero_optimization.stage3_param_persistence_threshold must be >= 0, got {}",
               stage3_param_persistence_threshold);
}

Engine::Engine(models::CausalLM& model, std::shared_ptr<comm::Communicator> dp,
               const ZeroConfig& zero, OptimizerFactory make_optimizer, DType param_dtype,
               std::optional<Device> device)
    : model_(model), dp_(std::move(dp)), zero_(zero), param_dtype_(param_dtype) {
  STRATA_CHECK(dp_ != nullptr, "the engine needs a dp communicator");
  zero_.validate();
  std::vector<models::FlatUnit>& units = model_.flat_units();
  STRATA_USER_CHECK(!units.empty(), "model '{}' has no flat units (Note [Flat parameters])",
                    model_.family());
  STRATA_USER_CHECK(
      param_dtype_ == DType::F32 || param_dtype_ == DType::BF16 || param_dtype_ == DType::F16,
      "engine parameters must be fp32, bf16 or fp16, not {}", dtype_name(param_dtype_));
  for (const models::FlatUnit& u : units)
    STRATA_CHECK(u.params.dtype() == DType::F32, "unit '{}' is already {}", u.name,
                 dtype_name(u.params.dtype()));

  // Note [Unit-by-unit construction]: a model built deferred is initialised unit by unit below.
  const bool deferred = model_.built_deferred();
  if (deferred) {
    STRATA_USER_CHECK(zero_.stage == 3 && zero_.offload_param.enabled(),
                      "a model built with deferred initialisation is built unit by unit into "
                      "ZeRO-3's offloaded partitions; it needs zero_optimization.stage 3 with "
                      "offload_param, got stage {} and offload_param.device {}",
                      zero_.stage, offload_param_device_name(zero_.offload_param.device));
    // A tensor-parallel rank's init_unit draws each tensor by name and keeps its shard, the whole
    // build's bits (Note [Tensor-parallel shards]); a pipeline stage would be refused stage 3 by
    // set_pipeline.
    STRATA_USER_CHECK(model_.is_whole(),
                      "unit-by-unit construction builds a whole model's units into ZeRO-3 "
                      "partitions, and ZeRO-3 does not run on a pipeline stage; build the model "
                      "whole for this run");
  }

  // Note [Offload construction]
  device_ = device.value_or(units.front().params.device());
  const bool build_on_host =
      zero_.offload_optimizer.enabled && units.front().params.device() != device_;
  if (!build_on_host) models::move_flat_units(units, device_);

  // Note [Engine parts], in their order.
  partitioning_ = std::make_unique<Partitioning>(units, zero_.stage >= 1, dp_->size(), dp_->rank());
  // before anything is partitioned: every unit is whole here. A deferred model's values are
  // drawn on every rank alike from the seed (Note [Name-keyed init]): nothing to broadcast.
  if (!deferred) sync_params();
  // Note [Mixed precision]: fp32 masters of the owned slices, then the model goes low precision.
  // Under tensor parallelism either placement's norm counts the sharded parameters over the tp
  // group and the replicated ones once (Note [Tensor-parallel gradient norm]).
  if (zero_.offload_optimizer.enabled) {
    auto placement = std::make_unique<HostPlacement>(units, *partitioning_, param_dtype_, *dp_,
                                                     zero_.offload_optimizer, zero_.stage == 3,
                                                     zero_.offload_param.enabled());
    if (model_.tensor_parallel().enabled()) placement->count_shards_of(model_);
    placement_ = std::move(placement);
  } else {
    auto placement = std::make_unique<DevicePlacement>(units, *partitioning_, param_dtype_, *dp_);
    if (model_.tensor_parallel().enabled()) placement->count_shards_of(model_);
    placement_ = std::move(placement);
  }
  if (mixed_precision()) models::cast_flat_units(units, param_dtype_);
  if (build_on_host) models::move_flat_units(units, device_);
  // ZeRO-Offload at stage 2: the reduced buckets go to the host as backward produces them
  // (Note [Gradients streamed to the host] in parallel/grad_buckets.h).
  HostGradients host_grads;
  // Device nvme copies each sub-group's gradient range at the step instead (Note [Optimizer
  // states on NVMe]).
  host_grads.enabled =
      zero_.offload_optimizer.enabled && !zero_.offload_optimizer.nvme && zero_.stage == 2;
  host_grads.pinned = zero_.offload_optimizer.pin_memory;
  // ZeRO-Infinity at stage 3: each unit's reduced partition goes to the NVMe optimizer's store
  // (Note [Gradients on the NVMe tier] in parallel/grad_buckets.h).
  host_grads.nvme =
      zero_.offload_optimizer.enabled && zero_.offload_optimizer.nvme && zero_.stage == 3;
  reduction_ = std::make_unique<GradientReduction>(
      model_, *partitioning_, GradientReduction::for_stage(zero_.stage), *dp_,
      zero_.reduce_bucket_size, zero_.overlap_comm, host_grads);
  if (reduction_->grads_on_host() || reduction_->grads_on_nvme())
    static_cast<HostPlacement&>(*placement_).use_host_grads(*reduction_);
  ParamGatheringOptions gather;
  gather.partition_params = zero_.stage == 3;
  gather.persistence_threshold = zero_.stage3_param_persistence_threshold;
  gather.prefetch_size = zero_.stage3_prefetch_bucket_size;
  gather.allgather_bucket_size = zero_.allgather_bucket_size;
  gather.offload_param = zero_.offload_param;
  // stage3_prefetch_bucket_size 0 turns prefetching off: allgathers and NVMe reads alike.
  gather.offload_param.read_ahead = zero_.stage3_prefetch_bucket_size > 0;
  gathering_ = std::make_unique<ParamGathering>(model_, *partitioning_, *dp_, gather);
  std::vector<OwnedSlice> slices;
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    slices.push_back({unit_segments(units[u], partitioning_->owned(u)), gathering_->owned_params(u),
                      reduction_->owned_grad(u)});
  placement_->build(std::move(slices), make_optimizer);
  if (reduction_->grads_on_nvme())
    reduction_->use_nvme(*static_cast<HostPlacement&>(*placement_).nvme());
  // Note [Offloaded partitions]: the step loads, updates and stores one partition at a time.
  if (gathering_->tier() != nullptr)
    placement_->set_param_fence(
        [this](size_t g, bool before) { gathering_->step_fence(g, before); });
  schedule_ = std::make_unique<AccumulationSchedule>();
  if (deferred) build_units();
  // Note [Host cache trimming]: construction's copies are not asked for again.
  offload::HostAllocator::instance().release_cache();
}

// Note [Unit-by-unit construction]
void Engine::build_units() {
  std::vector<models::FlatUnit>& units = model_.flat_units();
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    models::FlatUnit& unit = units[u];
    // A low-precision or GPU unit is initialised in an fp32 host buffer, as the whole build
    // initialises every unit; its own buffer (param_dtype, on the device) stays released.
    const bool staged = unit.params.dtype() != DType::F32 || !unit.params.device().is_cpu();
    tensor::Tensor own_buffer;
    if (staged) {
      tensor::Tensor host;
      {
        offload::CategoryScope scope(offload::Category::Param);
        host = tensor::Tensor::empty_released({unit.size()}, DType::F32, Device::cpu());
      }
      own_buffer = models::rebind_unit_params(unit, std::move(host));
    }
    model_.init_unit(u);
    const Range own = partitioning_->owned(u);
    const tensor::Tensor slice = unit.params.narrow(0, own.begin, own.size());
    // The fp32 master, before the cast (Note [Mixed precision]).
    placement_->set_initial_master(u, slice);
    if (!staged) {
      if (!gathering_->managed(u)) continue;  // stays whole (stage3_param_persistence_threshold)
      gathering_->set_partition(u, slice);
      unit.params.storage()->release();
      continue;
    }
    const tensor::Tensor fp32 = models::rebind_unit_params(unit, own_buffer);
    // The cast on the host, as models::cast_flat_units rounds (to nearest even, on every
    // backend), then the copy to the device.
    auto cast = [&](const tensor::Tensor& src) {
      if (src.dtype() == param_dtype_) return src;
      offload::CategoryScope scope(offload::Category::Param);
      tensor::Tensor low = tensor::Tensor::empty(src.shape(), param_dtype_, Device::cpu());
      low.copy_(src);
      return low;
    };
    if (!gathering_->managed(u)) {  // stays whole: the unit's own buffer takes it all
      unit.params.storage()->materialize(offload::Category::Param);
      unit.params.copy_(cast(fp32));
      continue;
    }
    gathering_->set_partition(u, cast(slice));
  }  // each fp32 unit and its cast copy are freed here
  gathering_->partitions_set();
  model_.set_unit_source({});  // model.init_from's files close
}

Engine::~Engine() = default;

void Engine::begin_micro_batch(bool last) {
  STRATA_CHECK(!in_backward_, "begin_micro_batch during backward");
  in_micro_batch_ = true;
  last_micro_batch_ = last;
  if (last && (reduction_->grads_on_host() || reduction_->grads_on_nvme()) && !mixed_precision())
    reduction_->set_last_pass_scales(fp32_last_pass_scales(dp_->size(), scaler_));
  reduction_->begin_pass(last);
  gathering_->begin_pass(last);
}

void Engine::begin_micro_batch(bool last, const std::vector<bool>& units) {
  STRATA_CHECK(!in_backward_, "begin_micro_batch during backward");
  STRATA_CHECK(zero_.stage <= 2, "a backward pass through some units only at ZeRO stage {}",
               zero_.stage);
  in_micro_batch_ = true;
  last_micro_batch_ = last;
  if (last && (reduction_->grads_on_host() || reduction_->grads_on_nvme()) && !mixed_precision())
    reduction_->set_last_pass_scales(fp32_last_pass_scales(dp_->size(), scaler_));
  reduction_->begin_pass(last, &units);
  gathering_->begin_pass(last);
}

void Engine::backward(const autograd::Variable& loss) {
  run_backward([&] {
    if (scaler_ != nullptr) {
      autograd::scale(loss, static_cast<float>(scaler_->scale())).backward();
    } else {
      loss.backward();
    }
  });
}

void Engine::backward(const autograd::Variable& output, const tensor::Tensor& grad) {
  STRATA_CHECK(grad.shape() == output.data().shape(), "gradient {} for output {}", grad.str(),
               output.data().str());
  run_backward([&] { output.backward(grad); });
}

void Engine::set_pipeline(std::unique_ptr<MicroBatchSchedule> schedule, PipelineSync sync) {
  STRATA_CHECK(schedule != nullptr, "set_pipeline without a schedule");
  STRATA_USER_CHECK(zero_.stage <= 2,
                    "zero_optimization.stage 3 does not work with pipeline parallelism: ZeRO-3 "
                    "gathers each unit around its use, recording the order from a step's first "
                    "micro-batch, and a pipeline schedule interleaves the micro-batches' "
                    "forwards and backwards; use stage 0, 1 or 2 (Note [Pipeline in the engine])");
  STRATA_CHECK(sync.tied == nullptr || !sync.tied_units.empty(), "a tied group without units");
  // The tied copies are summed after the reduction, but host gradients have left the device
  // with their norm terms and fp32 scales already taken (Note [Gradients streamed to the host]).
  STRATA_USER_CHECK(sync.tied == nullptr || !reduction_->grads_on_host(),
                    "zero_optimization.offload_optimizer at stage 2 does not run with a tied "
                    "embedding split across pipeline stages yet; use zero_optimization.stage 1 "
                    "with offload, or untie the embedding");
  const int n = static_cast<int>(model_.flat_units().size());
  std::vector<bool> counted(n, true);
  for (int u : sync.tied_units) {
    STRATA_CHECK(u >= 0 && u < n, "tied unit {} of {}", u, n);
    counted[u] = sync.count_tied_in_norm;
  }
  placement_->set_norm_across_stages(sync.pp.get(), std::move(counted));
  pipeline_ = std::move(sync);
  schedule_ = std::move(schedule);
}

void Engine::run_backward(const std::function<void()>& fn) {
  STRATA_USER_CHECK(in_micro_batch_,
                    "Engine::backward without begin_micro_batch: call begin_micro_batch(last) "
                    "before each micro-batch's forward");
  in_backward_ = true;
  gathering_->set_in_backward(true);
  // Note [Weight gradients into their buffer]: GEMMs add into the buffers only while they hold
  // nothing from an earlier micro-batch, so accumulated gradients keep the bits of ZeRO stages 2
  // and 3, which add each micro-batch's rounded gradient into their partitions. Then the buffers
  // hold zeros, so bias gradients may be written over them (Note [Bias gradients into their
  // buffer]; ZeRO-2/3's transient buffers are zeroed as each unit's backward begins).
  const autograd::GradIntoBufferGuard into_buffer(grads_zero_, /*zeroed=*/grads_zero_);
  grads_zero_ = false;
  auto leave = [&] {
    in_backward_ = false;
    in_micro_batch_ = false;
    gathering_->set_in_backward(false);
  };
  try {
    fn();
  } catch (...) {
    leave();
    throw;
  }
  leave();
  reduction_->end_pass();
  gathering_->end_pass();
}

float Engine::loss_gradient(float weight) const {
  // backward() seeds 1, its scale node multiplies by the loss scale, the caller's by weight.
  return scaler_ != nullptr ? static_cast<float>(scaler_->scale()) * weight : weight;
}

double Engine::average(double x) {
  return sum_over_ranks(*dp_, x, model_.flat_units().front().grads.device()) / dp_->size();
}

void Engine::finish_pending_update() {
  // Every rank runs the same schedule of delayed updates, so all of them allgather or none.
  if (placement_->finish_pending()) gathering_->allgather_updated();
}

StepResult Engine::step(double lr, double max_norm) {
  STRATA_USER_CHECK(last_micro_batch_,
                    "Engine::step before the last micro-batch: call begin_micro_batch(true) before "
                    "the step's last micro-batch so its gradients are reduced");
  STRATA_CHECK(!in_micro_batch_, "Engine::step between begin_micro_batch and backward");
  reduction_->wait_all();
  // Note [Pipeline in the engine]: the tied copies' gradients summed between first and last stage.
  if (pipeline_.tied != nullptr)
    for (int u : pipeline_.tied_units) pipeline_.tied->allreduce(reduction_->owned_grad(u))->wait();
  gathering_->release_all();
  const StepResult result = placement_->step(lr, max_norm, scaler_);
  if (!result.skipped) gathering_->allgather_updated();
  reduction_->zero_grads();
  grads_zero_ = true;
  last_micro_batch_ = false;
  offload::HostAllocator::instance().trim();  // Note [Host cache trimming]
  return result;
}

TrainStepOutput Engine::train_step(const TrainStepInputs& in) {
  STRATA_CHECK(in.micro_batches >= 1, "a training step needs at least one micro-batch, got {}",
               in.micro_batches);
  STRATA_CHECK(in.batch != nullptr, "TrainStepInputs::batch is not set");
  const std::vector<tensor::Tensor> losses = schedule_->run(*this, model_, in);
  STRATA_CHECK(static_cast<int64_t>(losses.size()) == in.micro_batches,
               "the schedule returned {} losses for {} micro-batches", losses.size(),
               in.micro_batches);
  // Note [Training on the GPU]: one device-to-host copy, after the last backward.
  const tensor::Tensor host =
      (losses.size() == 1 ? losses.front() : tensor::concat(losses, 0)).to(Device::cpu());
  TrainStepOutput out;
  out.losses.assign(host.data<float>(), host.data<float>() + in.micro_batches);
  double sum = 0.0;
  for (float l : out.losses) sum += static_cast<double>(l);
  out.mean_loss = sum / static_cast<double>(in.micro_batches);
  out.result = step(in.lr, in.max_norm);
  return out;
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

bool Engine::grads_on_nvme() const {
  return reduction_->grads_on_nvme();
}

void Engine::set_trace(std::function<void(const std::string&)> fn) {
  reduction_->set_trace(fn);
  gathering_->set_trace(std::move(fn));
}

}  // namespace strata::parallel
