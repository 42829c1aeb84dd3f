#pragma once
// HostPlacement: the optimizer placement of ZeRO-Offload (Ren et al., 2021; Note [Optimizer
// placement] in parallel/optimizer_placement.h). The fp32 masters and the optimizer's states
// of this rank's owned slices live on the host and the step runs on the CPU (optim/host_offload.h,
// Note [Host offload]); the parameters and gradients forward and backward use stay on the device.
//
// Note [Offloaded step]
// The step's arithmetic is DevicePlacement's, on the device, in the same order: the 1/dp mean,
// the global norm (an allreduce when ranks own different slices), the overflow skip, the clip
// coefficient (fp32: applied to the device gradients in place; mixed precision: folded with
// 1/dp and 1/loss-scale into one f32 factor the optimizer applies after widening). Only the
// update moves: the owned gradients go to pinned host memory on the copy stream, the CPU AdamW
// steps the host masters and moments, and the updated slices come back in the model's dtype.
// The fused GPU AdamW and the CPU kernel give the same bits (Note [CUDA AdamW]), so without the
// delayed update an offloaded run is bitwise the run without offload. The masters are kept at
// every precision (in fp32 they are the optimizer's parameters, the device's a copy), so
// checkpoints carry them as key "master" (has_masters()).
// With delayed_param_update, once delayed_param_update_start updates are taken (a count a
// checkpoint restores) each further update runs on a host
// thread while the device computes the next step (Note [Delayed parameter update]). The pending
// update lands in the next applied step, before its own (a skipped step leaves it pending, so
// that every rank's slices are allgathered together), or in finish_pending(). optimizer()
// finishes a pending update first, so whoever reads the states sees them whole.
// At stage 2 the gradient reduction streams the owned gradients to pinned host partitions during
// backward (Note [Gradients streamed to the host] in parallel/grad_buckets.h; use_host_grads()):
// the norm's per-unit terms are then the device sums the reduction took before the copies, fp32's
// 1/dp and 1/loss-scale were applied on the device there (fp32_last_pass_scales), and the clip
// coefficient multiplies the host gradients (a single f32 product per element, the bits the
// device would give).
// With device nvme (ZeRO-Infinity) the masters and moments live in an NVMe swap file instead
// (optim/nvme_adamw.h, Note [Optimizer states on NVMe]): the same arithmetic up to the update,
// which streams the states sub-group by sub-group; no delayed update.
// At stage 3 the owned gradients live on NVMe too (Note [Gradients on the NVMe tier] in
// parallel/grad_buckets.h): the norm's terms and fp32's scales as with host gradients, and the
// fp32 clip coefficient folded into the optimizer's gradient scale (one f32 product per element,
// as scale_grads gives). In fp32 the masters start
// from the owned parameters themselves when build() makes the optimizer; under mixed precision
// from a host copy of the fp32 owned slices taken before the cast, dropped once on NVMe.
// With ZeRO-Infinity's parameter offload as well (`partitions_released`) the masters always start
// from a host copy, and set_param_fence() makes both optimizers write each owned slice between
// the fence's calls (Note [Write-back through the group fence] in optim/host_offload.h; NvmeAdamW
// per slice), which load the partition from its tier and store it back.
// Under tensor parallelism (count_shards_of) the norm is DevicePlacement's too: the sums of
// squares split by sharded and replicated parameters (Note [Tensor-parallel gradient norm] in
// parallel/tp_grad_norm.h), each owned slice's segments taken alone in order, from the owned
// gradients or, when the reduction takes the sums, from its per-segment sums (norm pieces).
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "models/flat_params.h"
#include "optim/host_offload.h"
#include "optim/nvme_adamw.h"
#include "parallel/optimizer_placement.h"
#include "parallel/partitioning.h"

namespace strata::parallel {

struct OffloadOptimizerConfig {  // zero_optimization.offload_optimizer (DeepSpeed's names)
  bool enabled = false;          // device: cpu
  bool pin_memory = true;
  bool delayed_param_update = false;        // the paper's DPU
  int64_t delayed_param_update_start = 10;  // plain updates before the delayed ones
  // device: nvme (with enabled): ZeRO-Infinity's states in an NVMe swap file. nvme_path,
  // buffer_count, pipeline_read/write, zero_optimization.sub_group_size and the aio section;
  // nvme.lock_tag empty: "optimizer-dp<rank>" ("optimizer-tp<rank>-dp<rank>" tensor-parallel).
  bool nvme = false;
  optim::NvmeAdamWOptions nvme_options;
};

class GradientReduction;

// fp32 under offload with host gradients: the factors DevicePlacement::step applies in place
// before the norm (1/dp when dp > 1, then 1/loss-scale with a scaler), for the reduction to apply
// on the device before the copies.
std::vector<float> fp32_last_pass_scales(int dp, const optim::LossScaler* scaler);

class HostPlacement final : public OptimizerPlacement {
 public:
  // Before the units are cast to `param_dtype`: copies the fp32 owned slices to the host, where
  // build() makes them the masters.
  // `units_released`: the parameter gathering releases the units' storage before build()
  // (ZeRO-3), so masters that would share it are copied. `partitions_released`: the owned
  // partitions too are released before build() (offload_param), so NVMe's fp32 masters cannot
  // start from them and are copied as well.
  HostPlacement(const std::vector<models::FlatUnit>& units, const Partitioning& parts,
                DType param_dtype, comm::Communicator& dp, const OffloadOptimizerConfig& config,
                bool units_released, bool partitions_released = false);

  // Before build(), when `reduction` streams the owned gradients to the host
  // (reduction.grads_on_host()) or, with device nvme, to NVMe (reduction.grads_on_nvme(): the
  // NvmeAdamW reads them from its store, the clip coefficient is folded into its gradient scale);
  // it must outlive this placement.
  void use_host_grads(GradientReduction& reduction);
  // Before build(): a tensor-parallel model's norm counts its sharded parameters over the tp
  // group and its replicated ones once (Note [Tensor-parallel gradient norm]). The model must
  // outlive the placement.
  void count_shards_of(const models::CausalLM& model);
  void build(std::vector<OwnedSlice> slices, const OptimizerFactory& make) override;
  optim::Optimizer& optimizer() override;
  StepResult step(double lr, double max_norm, optim::LossScaler* scaler) override;
  void params_from_masters() override;
  void set_initial_master(int u, const tensor::Tensor& slice) override;
  bool has_masters() const override { return true; }
  tensor::Tensor master(int u) override;

  bool finish_pending() override;
  void set_param_fence(optim::Optimizer::GroupFence fence) override;
  int64_t delayed_steps() const { return delayed_steps_; }
  // The NVMe optimizer with device nvme, else null.
  optim::NvmeAdamW* nvme() override { return nvme_.get(); }

 private:
  bool mixed_precision() const { return param_dtype_ != DType::F32; }
  double global_sum(double local) const;
  double local_sum_of_squares() const;
  // The whole model's sum of squares of the gradients, every element once (collective).
  double global_sum_of_squares() const;

  DType param_dtype_;
  comm::Communicator& dp_;
  bool sum_over_ranks_;
  Device device_;
  OffloadOptimizerConfig config_;
  std::vector<tensor::Tensor> initial_masters_;  // host fp32, until build()
  std::vector<tensor::Tensor> device_grads_;     // the owned reduced gradients (or host ones)
  GradientReduction* host_grads_ = nullptr;      // when they are host partitions
  const models::CausalLM* tp_model_ = nullptr;   // count_shards_of
  // count_shards_of: per unit, the owned slice's segments and which are sharded.
  std::vector<std::vector<optim::Segment>> norm_segments_;
  std::vector<std::vector<bool>> segment_sharded_;
  std::unique_ptr<optim::HostOffload> offload_;  // device cpu
  std::unique_ptr<optim::NvmeAdamW> nvme_;       // device nvme
  int64_t delayed_steps_ = 0;
};

}  // namespace strata::parallel
