#pragma once
// DevicePlacement: the optimizer placement with every state on the model's device (Note
// [Optimizer placement] in parallel/optimizer_placement.h), and under mixed precision the fp32
// masters of the owned slices (Note [Mixed precision] in parallel/engine.h).
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "models/flat_params.h"
#include "parallel/optimizer_placement.h"
#include "parallel/partitioning.h"

namespace strata::parallel {

class DevicePlacement final : public OptimizerPlacement {
 public:
  // Before the units are cast to `param_dtype`: takes fp32 masters of the owned slices when
  // param_dtype is low precision (Category::Optimizer); a unit whose buffer is released (Note
  // [Unit-by-unit construction] in parallel/engine.h) gets its master from set_initial_master().
  // `dp` for the 1/dp mean and, when `parts` is partitioned, the norm's allreduce.
  DevicePlacement(const std::vector<models::FlatUnit>& units, const Partitioning& parts,
                  DType param_dtype, comm::Communicator& dp);

  void build(std::vector<OwnedSlice> slices, const OptimizerFactory& make) override;
  optim::Optimizer& optimizer() override { return *optimizer_; }
  StepResult step(double lr, double max_norm, optim::LossScaler* scaler) override;
  void params_from_masters() override;
  void set_initial_master(int u, const tensor::Tensor& slice) override;
  bool has_masters() const override { return mixed_precision(); }
  // A tensor-parallel model: the norm counts its sharded parameters over the tp group and its
  // replicated ones once (Note [Tensor-parallel gradient norm] in parallel/tp_grad_norm.h). The
  // model must outlive the placement.
  void count_shards_of(const models::CausalLM& model) { tp_model_ = &model; }

 private:
  bool mixed_precision() const { return param_dtype_ != DType::F32; }
  double global_sum(double local) const;
  // The whole model's sum of squares of the owned gradients (every element once).
  double global_sum_of_squares(const std::vector<tensor::Tensor>& grads) const;

  DType param_dtype_;
  comm::Communicator& dp_;
  bool sum_over_ranks_;  // ranks own different slices
  Device device_;
  std::vector<tensor::Tensor> masters_;  // mixed precision: fp32, one per unit's owned slice
  std::vector<bool> masters_due_;        // per unit: set_initial_master() has yet to fill it
  std::unique_ptr<optim::Optimizer> optimizer_;
  const models::CausalLM* tp_model_ = nullptr;  // count_shards_of
};

}  // namespace strata::parallel
