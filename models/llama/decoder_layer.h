#pragma once
// A LLaMA decoder layer (pre-norm): h = x + self_attn(input_layernorm(x)), then
// h + mlp(post_attention_layernorm(h)). HF: LlamaDecoderLayer.
//
// With config.activation_checkpointing the layer keeps only its input in forward and recomputes
// itself in backward (Note [Activation checkpointing]); there is no dropout, so the recompute is
// the same computation and the gradients equal the plain layer's bitwise.
#include "models/llama/attention.h"
#include "models/llama/mlp.h"
#include "models/llama/rms_norm.h"

namespace strata::models::llama {

class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const LlamaConfig& config, RotaryEmbedding& rope);

  bool activation_checkpointing() const { return checkpointing_; }
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

  Attention& self_attn() { return *self_attn_; }
  MLP& mlp() { return *mlp_; }

 protected:
  Variable forward(const Variable& x) override;

 private:
  Variable compute(const Variable& x);

  bool checkpointing_;
  RMSNorm* input_layernorm_;
  Attention* self_attn_;
  RMSNorm* post_attention_layernorm_;
  MLP* mlp_;
};

}  // namespace strata::models::llama
