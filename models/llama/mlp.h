#pragma once
// LLaMA feed-forward, SwiGLU (Shazeer 2020): down_proj(silu(gate_proj(x)) * up_proj(x)), all
// three projections bias-free, C -> F -> C with F = intermediate_size. HF: LlamaMLP. With fused
// ops on (Note [Fused ops in models]) the five ops run as one autograd::mlp_swiglu node with the
// unfused bits and less kept (Note [SwiGLU recompute]); the projections then hold the parameters
// but are not called, so hooks on them (rather than on the layer) do not run.
// config.recompute_swiglu makes the node recompute the product for down_proj's weight gradient.
#include "models/llama/config.h"
#include "models/nn/parallel_linear.h"

namespace strata::models::llama {

using autograd::Variable;

class MLP : public nn::Module {
 public:
  // Under tensor parallelism gate_proj and up_proj are column-parallel, down_proj row-parallel:
  // each rank runs intermediate_size / tp of the hidden units.
  explicit MLP(const LlamaConfig& config, const nn::TensorParallel& tp = {});

  nn::ColumnParallelLinear& gate_proj() { return *gate_proj_; }
  nn::ColumnParallelLinear& up_proj() { return *up_proj_; }
  nn::RowParallelLinear& down_proj() { return *down_proj_; }

 protected:
  Variable forward(const Variable& x) override;

 private:
  nn::TensorParallel tp_;
  nn::ColumnParallelLinear* gate_proj_;
  nn::ColumnParallelLinear* up_proj_;
  nn::RowParallelLinear* down_proj_;
  bool recompute_swiglu_;  // Note [SwiGLU recompute]
};

}  // namespace strata::models::llama
