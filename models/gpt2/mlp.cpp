#include "models/gpt2/mlp.h"

#include <cmath>

#include "autograd/functions.h"
#include "models/nn/fused_ops.h"

namespace strata::models::gpt2 {

MLP::MLP(const GPT2Config& config, const nn::TensorParallel& tp)
    : tp_(tp), recompute_gelu_(config.recompute_gelu) {
  c_fc_ = &add_module<nn::ColumnParallelLinear>("c_fc", config.n_embd, 4 * config.n_embd, true, tp);
  c_proj_ =
      &add_module<nn::RowParallelLinear>("c_proj", 4 * config.n_embd, config.n_embd, true, tp);
  // Residual projection: see CausalSelfAttention.
  c_proj_->set_init_std(0.02f / std::sqrt(2.f * static_cast<float>(config.n_layer)));
  dropout_ = &add_module<nn::Dropout>("dropout", config.dropout);
  c_fc_->set_tiles(config.tiling);  // Note [Tiled linear]
  c_proj_->set_tiles(config.tiling);
}

Variable MLP::forward(const Variable& x_in) {
  // Tiled linears are nodes of their own: the fused node would run each GEMM whole.
  if (!nn::fused_ops_enabled() || c_fc_->tiles() > 1) {
    Variable h = tp_.enter_columns(x_in, [&](const Variable& x) { return (*c_fc_)(x); });
    return (*dropout_)((*c_proj_)(autograd::gelu(h)));
  }
  // One node (Note [Fused ops in models]): the child linears' own hooks do not run. Under tensor
  // parallelism its output is c_proj's partial sum, reduced and biased after.
  const bool tp = tp_.enabled();
  Variable y = tp_.enter_columns(x_in, [&](const Variable& x) {
    return autograd::mlp_gelu(x, c_fc_->weight(), c_fc_->bias(), c_proj_->weight(),
                              tp ? Variable() : c_proj_->bias(), recompute_gelu_);
  });
  return (*dropout_)(c_proj_->reduce_output(y));
}

}  // namespace strata::models::gpt2
