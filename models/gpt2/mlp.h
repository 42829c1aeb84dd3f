#pragma once
// GPT-2 feed-forward: c_fc (C -> 4C), GELU (tanh approximation), c_proj (4C -> C), dropout.
// With fused ops on (Note [Fused ops in models]) the three run as one autograd::mlp_gelu node
// with the GELU and the biases in the GEMMs' epilogues; c_fc and c_proj then hold the parameters
// but are not called, so hooks on them (rather than on the block) do not run. config.recompute_gelu
// makes that node keep the GELU input alone (Note [GELU recompute]).
#include "models/gpt2/config.h"
#include "models/nn/dropout.h"
#include "models/nn/parallel_linear.h"

namespace strata::models::gpt2 {

using autograd::Variable;

// Under tensor parallelism c_fc is column-parallel and c_proj row-parallel: each rank runs 4C / tp
// of the hidden units, and c_proj's bias is added once after the reduction.
class MLP : public nn::Module {
 public:
  explicit MLP(const GPT2Config& config, const nn::TensorParallel& tp = {});

  nn::ColumnParallelLinear& c_fc() { return *c_fc_; }
  nn::RowParallelLinear& c_proj() { return *c_proj_; }

 protected:
  Variable forward(const Variable& x) override;

 private:
  nn::TensorParallel tp_;
  nn::ColumnParallelLinear* c_fc_;
  nn::RowParallelLinear* c_proj_;
  nn::Dropout* dropout_;
  bool recompute_gelu_;  // Note [GELU recompute]
};

}  // namespace strata::models::gpt2
