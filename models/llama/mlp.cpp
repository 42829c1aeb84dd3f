#include "models/llama/mlp.h"

#include "autograd/functions.h"
#include "models/nn/fused_ops.h"

namespace strata::models::llama {

MLP::MLP(const LlamaConfig& config) : recompute_swiglu_(config.recompute_swiglu) {
  const int64_t C = config.hidden_size, F = config.intermediate_size;
  gate_proj_ = &add_module<nn::Linear>("gate_proj", C, F, /*bias=*/false);
  up_proj_ = &add_module<nn::Linear>("up_proj", C, F, /*bias=*/false);
  down_proj_ = &add_module<nn::Linear>("down_proj", F, C, /*bias=*/false);
  for (nn::Linear* l : {gate_proj_, up_proj_, down_proj_})
    l->set_init_std(config.initializer_range);
}

Variable MLP::forward(const Variable& x) {
  if (!nn::fused_ops_enabled()) {
    Variable gate = autograd::silu((*gate_proj_)(x));
    return (*down_proj_)(autograd::mul(gate, (*up_proj_)(x)));
  }
  // One node (Note [Fused ops in models], Note [SwiGLU recompute]): the child linears' own hooks
  // do not run.
  return autograd::mlp_swiglu(x, gate_proj_->weight(), up_proj_->weight(), down_proj_->weight(),
                              recompute_swiglu_);
}

}  // namespace strata::models::llama
