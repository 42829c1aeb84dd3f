#include "models/gpt2/block.h"

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "models/nn/fused_ops.h"

namespace strata::models::gpt2 {

Block::Block(const GPT2Config& config, const nn::TensorParallel& tp)
    : checkpointing_(config.activation_checkpointing) {
  ln_1_ = &add_module<nn::LayerNorm>("ln_1", config.n_embd, config.layer_norm_epsilon);
  attn_ = &add_module<CausalSelfAttention>("attn", config, tp);
  ln_2_ = &add_module<nn::LayerNorm>("ln_2", config.n_embd, config.layer_norm_epsilon);
  mlp_ = &add_module<MLP>("mlp", config, tp);
  ln_1_->set_tensor_parallel(tp);
  ln_2_->set_tensor_parallel(tp);
}

// in = {x} or {x, pending}. Returns {h, m}, or {h + m} when `complete`.
std::vector<Variable> Block::compute(const std::vector<Variable>& in, bool fused, bool complete) {
  if (!fused) {  // the unfused composition (Note [Fused ops in models])
    STRATA_CHECK(in.size() == 1, "an unfused block takes no pending branch");
    Variable h = autograd::add(in[0], (*attn_)((*ln_1_)(in[0])));
    return {autograd::add(h, (*mlp_)((*ln_2_)(h)))};
  }
  Variable x = in[0], y1;
  if (in.size() > 1) {
    std::tie(x, y1) = ln_1_->add_forward(in[0], in[1]);
  } else {
    y1 = (*ln_1_)(x);
  }
  auto [h, y2] = ln_2_->add_forward(x, (*attn_)(y1));
  Variable m = (*mlp_)(y2);
  if (complete) return {autograd::add(h, m)};
  return {h, m};
}

std::vector<Variable> Block::run(const std::vector<Variable>& in, bool fused, bool complete) {
  // Without a graph to build there is nothing to save memory on.
  if (!checkpointing_ || !autograd::GradMode::is_enabled()) return compute(in, fused, complete);
  // The mode is captured: the recompute in backward runs the same ops whatever the switch says
  // by then.
  return autograd::checkpoint(
      [this, fused, complete](const std::vector<Variable>& v) {
        return compute(v, fused, complete);
      },
      in);
}

Variable Block::forward(const Variable& x) {
  return run({x}, nn::fused_ops_enabled(), /*complete=*/true)[0];
}

std::pair<Variable, Variable> Block::forward_residual(const Variable& x, const Variable& pending) {
  const bool fused = nn::fused_ops_enabled();
  // A checkpointed block keeps its inputs: finishing its own add keeps one tensor, not two.
  const bool complete = !fused || (checkpointing_ && autograd::GradMode::is_enabled());
  std::vector<Variable> in{x};
  if (pending.defined()) {
    STRATA_CHECK(fused, "a pending branch for block '{}' with fused ops off", path());
    in.push_back(pending);
  }
  std::vector<Variable> out =
      call(in, [&](const std::vector<Variable>& v) { return run(v, fused, complete); });
  return {out[0], out.size() > 1 ? out[1] : Variable()};
}

}  // namespace strata::models::gpt2
