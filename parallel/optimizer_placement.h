#pragma once
// OptimizerPlacement: the Engine part that holds the optimizer over what this rank owns and does
// the step's arithmetic on the reduced gradients — the 1/dp mean, the global norm, the overflow
// skip, clipping, the update (Note [Engine step] steps 1-5 in parallel/engine.h).
//
// Note [Optimizer placement]
// Where the optimizer's state lives and where its update runs is the placement's one decision.
// The Engine makes the placement before the model's parameters go low precision, so it can take
// fp32 masters from the initialisation (Note [Mixed precision]), and hands it, once the other
// parts have laid the units out, one OwnedSlice per unit (build): the owned parameter slice
// (which the update must write, in the model's dtype), the owned reduced gradient (a sum over dp
// ranks) and the slice's segments. step() leaves the updated slice in OwnedSlice::params; making
// units whole again is the parameter gathering's job, zeroing the gradients the reduction's.
//
// DevicePlacement is the implementation today: states on the model's device, the optimizer's
// own kernels (fused CUDA AdamW on the GPU). HostPlacement is ZeRO-Offload's (Note [Offloaded
// step] in parallel/host_placement.h): masters in pinned host memory, moments in host memory,
// each owned gradient slice copied to the host on a copy stream, the CPU AdamW stepping there,
// the updated slice copied back into OwnedSlice::params; with offload_optimizer.device nvme
// (ZeRO-Infinity) the same placement keeps masters and moments in an NVMe swap file and streams
// them through pinned buffers (Note [Optimizer states on NVMe] in optim/nvme_adamw.h). The Engine,
// the gradient reduction and the parameter gathering are the same for every placement.
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "parallel/rank_sum.h"

namespace strata::optim {
class NvmeAdamW;
}

namespace strata::parallel {

using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

struct StepResult {
  double grad_norm = 0;
  bool skipped = false;
};

// One unit's part of the optimizer's work on this rank.
struct OwnedSlice {
  std::vector<optim::Segment> segments;  // offsets relative to the slice
  tensor::Tensor params;                 // the model's dtype; the update writes it
  tensor::Tensor grads;                  // the reduced gradient: the sum over dp ranks
};

class OptimizerPlacement {
 public:
  virtual ~OptimizerPlacement() = default;

  // Once, in unit order: builds the optimizer (through `make`) over the slices.
  virtual void build(std::vector<OwnedSlice> slices, const OptimizerFactory& make) = 0;
  virtual optim::Optimizer& optimizer() = 0;
  // After the reductions are in: mean over dp, global norm (an allreduce when ranks own
  // different slices), overflow skip (on every rank alike; with a scaler, it decides), clipping
  // to max_norm (> 0), the update with `lr`. `scaler` may be null.
  virtual StepResult step(double lr, double max_norm, optim::LossScaler* scaler) = 0;
  // After a checkpoint load filled the optimizer's states: rewrites the owned parameter slices
  // from the fp32 masters (mixed precision; nothing to do otherwise).
  virtual void params_from_masters() = 0;
  // Whether fp32 masters are kept apart from the owned parameters: then checkpoints carry them
  // (key "master"), and a load fills them and calls params_from_masters().
  virtual bool has_masters() const = 0;
  // Unit u's fp32 master slice, for checkpoints (with has_masters()); a view a load may fill.
  virtual tensor::Tensor master(int u) { return optimizer().groups()[u].param; }
  // Note [Unit-by-unit construction] (parallel/engine.h): after build(), unit u's owned slice of
  // fp32 parameters as initialised, for masters that could not be taken at construction (the
  // units' buffers were released then). A placement whose optimizer steps the owned parameters
  // themselves (fp32 on the device) has nothing to take.
  virtual void set_initial_master(int u, const tensor::Tensor& slice) {
    (void)u;
    (void)slice;
  }
  // The optimizer when its states live on NVMe (ZeRO-Infinity): checkpoints stream them (Note
  // [Streamed states] in optim/nvme_adamw.h) instead of reading state_dict() and master().
  virtual optim::NvmeAdamW* nvme() { return nullptr; }
  // Completes an update still running (ZeRO-Offload's delayed update) and writes the owned
  // slices; true when there was one, and then the caller makes the units whole again.
  virtual bool finish_pending() { return false; }
  // After build(): the fence around each owned slice's parameter writes (Note [Group fence] in
  // optim/optimizer.h), for parameter partitions that are resident only while in use.
  virtual void set_param_fence(optim::Optimizer::GroupFence fence) {
    optimizer().set_group_fence(std::move(fence));
  }

  // Note [Norm across stages]
  // Under pipeline parallelism each stage holds some units, so the global norm also sums the
  // squares over the stages (`pp`), and a unit whose gradient another stage holds too (the last
  // stage's copy of a tied embedding) is left out here (`counted[u]` false), so every parameter
  // counts once. Set before the first step; pp null: one stage.
  //
  // Note [Overflow across stages]
  // The overflow test of a step (fp16's skip, and the skip of any non-finite norm) is
  // !isfinite(norm) on the norm summed over dp, tp and these stages, never on a stage's own
  // squares: an inf or NaN in any stage's gradients makes every stage's sum inf or NaN (the terms
  // are squares, so no inf - inf), so all stages skip the step together, and with a LossScaler
  // each stage's scaler sees the same overflow sequence and keeps the same scale. The loss is
  // multiplied by the scale once, in the last stage's Engine::backward(loss); the earlier stages'
  // gradients carry it through the received activation gradients, and every stage divides its
  // own gradients by the same scale. TrainPpFp16Mpi (tests/dist) fails if the sum over stages is
  // left out of the overflow test.
  void set_norm_across_stages(comm::Communicator* pp, std::vector<bool> counted) {
    norm_pp_ = pp;
    norm_counted_ = std::move(counted);
  }

 protected:
  // For the placements' norm (Note [Norm across stages]): the per-unit gradients it counts, and
  // the sum of a stage's sum of squares over the stages.
  std::vector<tensor::Tensor> norm_grads(const std::vector<tensor::Tensor>& grads) const {
    if (norm_counted_.empty()) return grads;
    STRATA_CHECK(norm_counted_.size() == grads.size(), "{} norm flags for {} units",
                 norm_counted_.size(), grads.size());
    std::vector<tensor::Tensor> out;
    for (size_t u = 0; u < grads.size(); ++u)
      if (norm_counted_[u]) out.push_back(grads[u]);
    return out;
  }
  double sum_over_stages(double x, Device device) const {
    return norm_pp_ != nullptr ? sum_over_ranks(*norm_pp_, x, device) : x;
  }

  comm::Communicator* norm_pp_ = nullptr;
  std::vector<bool> norm_counted_;  // empty: every unit
};

}  // namespace strata::parallel
