#include "models/llama/decoder_layer.h"

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "models/nn/fused_ops.h"

namespace strata::models::llama {

DecoderLayer::DecoderLayer(const LlamaConfig& config, RotaryEmbedding& rope,
                           const nn::TensorParallel& tp)
    : checkpointing_(config.activation_checkpointing) {
  const int64_t C = config.hidden_size;
  input_layernorm_ = &add_module<RMSNorm>("input_layernorm", C, config.rms_norm_eps);
  self_attn_ = &add_module<Attention>("self_attn", config, rope, tp);
  post_attention_layernorm_ =
      &add_module<RMSNorm>("post_attention_layernorm", C, config.rms_norm_eps);
  mlp_ = &add_module<MLP>("mlp", config, tp);
  input_layernorm_->set_tensor_parallel(tp);
  post_attention_layernorm_->set_tensor_parallel(tp);
}

// in = {x} or {x, pending}. Returns {h, m}, or {h + m} when `complete`.
std::vector<Variable> DecoderLayer::compute(const std::vector<Variable>& in, bool fused,
                                            bool complete) {
  if (!fused) {  // the unfused composition (Note [Fused ops in models])
    STRATA_CHECK(in.size() == 1, "an unfused decoder layer takes no pending branch");
    Variable h = autograd::add(in[0], (*self_attn_)((*input_layernorm_)(in[0])));
    return {autograd::add(h, (*mlp_)((*post_attention_layernorm_)(h)))};
  }
  Variable x = in[0], y1;
  if (in.size() > 1) {
    std::tie(x, y1) = input_layernorm_->add_forward(in[0], in[1]);
  } else {
    y1 = (*input_layernorm_)(x);
  }
  auto [h, y2] = post_attention_layernorm_->add_forward(x, (*self_attn_)(y1));
  Variable m = (*mlp_)(y2);
  if (complete) return {autograd::add(h, m)};
  return {h, m};
}

std::vector<Variable> DecoderLayer::run(const std::vector<Variable>& in, bool fused,
                                        bool complete) {
  // Without a graph to build there is nothing to save memory on.
  if (!checkpointing_ || !autograd::GradMode::is_enabled()) return compute(in, fused, complete);
  // The mode is captured: the recompute runs the same ops whatever the switch says by then.
  return autograd::checkpoint(
      [this, fused, complete](const std::vector<Variable>& v) {
        return compute(v, fused, complete);
      },
      in);
}

Variable DecoderLayer::forward(const Variable& x) {
  return run({x}, nn::fused_ops_enabled(), /*complete=*/true)[0];
}

std::pair<Variable, Variable> DecoderLayer::forward_residual(const Variable& x,
                                                             const Variable& pending) {
  const bool fused = nn::fused_ops_enabled();
  // A checkpointed layer keeps its inputs: finishing its own add keeps one tensor, not two.
  const bool complete = !fused || (checkpointing_ && autograd::GradMode::is_enabled());
  std::vector<Variable> in{x};
  if (pending.defined()) {
    STRATA_CHECK(fused, "a pending branch for layer '{}' with fused ops off", path());
    in.push_back(pending);
  }
  std::vector<Variable> out =
      call(in, [&](const std::vector<Variable>& v) { return run(v, fused, complete); });
  return {out[0], out.size() > 1 ? out[1] : Variable()};
}

}  // namespace strata::models::llama
