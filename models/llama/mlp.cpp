#include "models/llama/mlp.h"

#include "autograd/functions.h"
#include "models/nn/fused_ops.h"

namespace strata::models::llama {

MLP::MLP(const LlamaConfig& config, const nn::TensorParallel& tp)
    : tp_(tp), recompute_swiglu_(config.recompute_swiglu) {
  const int64_t C = config.hidden_size, F = config.intermediate_size;
  gate_proj_ = &add_module<nn::ColumnParallelLinear>("gate_proj", C, F, /*bias=*/false, tp);
  up_proj_ = &add_module<nn::ColumnParallelLinear>("up_proj", C, F, /*bias=*/false, tp);
  down_proj_ = &add_module<nn::RowParallelLinear>("down_proj", F, C, /*bias=*/false, tp);
  gate_proj_->set_init_std(config.initializer_range);
  up_proj_->set_init_std(config.initializer_range);
  down_proj_->set_init_std(config.initializer_range);
}

Variable MLP::forward(const Variable& x_in) {
  // One region for both column-parallel projections (Note [Sequence-parallel saved input]).
  if (!nn::fused_ops_enabled()) {
    std::vector<Variable> gu = tp_.enter_columns(x_in, [&](const Variable& x) {
      Variable gate = autograd::silu((*gate_proj_)(x));
      return std::vector<Variable>{gate, (*up_proj_)(x)};
    });
    return (*down_proj_)(autograd::mul(gu[0], gu[1]));
  }
  // One node (Note [Fused ops in models], Note [SwiGLU recompute]): the child linears' own hooks
  // do not run.
  return down_proj_->reduce_output(tp_.enter_columns(x_in, [&](const Variable& x) {
    return autograd::mlp_swiglu(x, gate_proj_->weight(), up_proj_->weight(), down_proj_->weight(),
                                recompute_swiglu_);
  }));
}

}  // namespace strata::models::llama
