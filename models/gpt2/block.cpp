#include "models/gpt2/block.h"

#include "autograd/checkpoint.h"
#include "autograd/functions.h"

namespace strata::models::gpt2 {

Block::Block(const GPT2Config& config) : checkpointing_(config.activation_checkpointing) {
  ln_1_ = &add_module<nn::LayerNorm>("ln_1", config.n_embd, config.layer_norm_epsilon);
  attn_ = &add_module<CausalSelfAttention>("attn", config);
  ln_2_ = &add_module<nn::LayerNorm>("ln_2", config.n_embd, config.layer_norm_epsilon);
  mlp_ = &add_module<MLP>("mlp", config);
}

Variable Block::compute(const Variable& x) {
  Variable h = autograd::add(x, (*attn_)((*ln_1_)(x)));
  return autograd::add(h, (*mlp_)((*ln_2_)(h)));
}

Variable Block::forward(const Variable& x) {
  // Without a graph to build there is nothing to save memory on.
  if (!checkpointing_ || !autograd::GradMode::is_enabled()) return compute(x);
  return autograd::checkpoint(
      [this](const std::vector<Variable>& in) { return std::vector<Variable>{compute(in[0])}; },
      {x})[0];
}

}  // namespace strata::models::gpt2
