#include "models/llama/decoder_layer.h"

#include "autograd/checkpoint.h"
#include "autograd/functions.h"

namespace strata::models::llama {

DecoderLayer::DecoderLayer(const LlamaConfig& config, RotaryEmbedding& rope)
    : checkpointing_(config.activation_checkpointing) {
  const int64_t C = config.hidden_size;
  input_layernorm_ = &add_module<RMSNorm>("input_layernorm", C, config.rms_norm_eps);
  self_attn_ = &add_module<Attention>("self_attn", config, rope);
  post_attention_layernorm_ =
      &add_module<RMSNorm>("post_attention_layernorm", C, config.rms_norm_eps);
  mlp_ = &add_module<MLP>("mlp", config);
}

Variable DecoderLayer::compute(const Variable& x) {
  Variable h = autograd::add(x, (*self_attn_)((*input_layernorm_)(x)));
  return autograd::add(h, (*mlp_)((*post_attention_layernorm_)(h)));
}

Variable DecoderLayer::forward(const Variable& x) {
  // Without a graph to build there is nothing to save memory on.
  if (!checkpointing_ || !autograd::GradMode::is_enabled()) return compute(x);
  return autograd::checkpoint(
      [this](const std::vector<Variable>& in) { return std::vector<Variable>{compute(in[0])}; },
      {x})[0];
}

}  // namespace strata::models::llama
