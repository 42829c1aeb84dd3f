#pragma once
// A LLaMA decoder layer (pre-norm): h = x + self_attn(input_layernorm(x)), then
// h + mlp(post_attention_layernorm(h)). HF: LlamaDecoderLayer.
//
// The residual adds are fused into the RMSNorms after them as in GPT-2's Block (Note [Fused ops
// in models] in models/nn/fused_ops.h): forward_residual takes the stream and the previous
// layer's pending MLP output and hands its own on; the model adds the last one inside `norm`.
//
// With config.activation_checkpointing the layer keeps only its input in forward and recomputes
// itself in backward (Note [Activation checkpointing]); there is no dropout, so the recompute is
// the same computation and the gradients equal the plain layer's bitwise.
#include <utility>

#include "models/llama/attention.h"
#include "models/llama/mlp.h"
#include "models/llama/rms_norm.h"

namespace strata::models::llama {

class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const LlamaConfig& config, RotaryEmbedding& rope, const nn::TensorParallel& tp = {});

  bool activation_checkpointing() const { return checkpointing_; }
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

  Attention& self_attn() { return *self_attn_; }
  MLP& mlp() { return *mlp_; }

  // The layer on the residual stream x plus `pending` (undefined: nothing pending), through the
  // module's hooks. Returns {h, m}, whose sum is the layer's output; with fused ops off, or under
  // activation checkpointing, {h + m, undefined}.
  std::pair<Variable, Variable> forward_residual(const Variable& x, const Variable& pending);

 protected:
  // The layer's whole output.
  Variable forward(const Variable& x) override;

 private:
  std::vector<Variable> run(const std::vector<Variable>& in, bool fused, bool complete);
  std::vector<Variable> compute(const std::vector<Variable>& in, bool fused, bool complete);

  bool checkpointing_;
  RMSNorm* input_layernorm_;
  Attention* self_attn_;
  RMSNorm* post_attention_layernorm_;
  MLP* mlp_;
};

}  // namespace strata::models::llama
