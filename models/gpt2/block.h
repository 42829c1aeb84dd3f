#pragma once
// A pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
//
// With config.activation_checkpointing the block keeps only its input in forward and recomputes
// itself in backward (Note [Activation checkpointing]); dropout masks replay exactly, so the
// gradients equal those of the plain block.
#include "models/gpt2/attention.h"
#include "models/gpt2/mlp.h"
#include "models/nn/layer_norm.h"

namespace strata::models::gpt2 {

class Block : public nn::Module {
 public:
  explicit Block(const GPT2Config& config);

  bool activation_checkpointing() const { return checkpointing_; }
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

 protected:
  Variable forward(const Variable& x) override;

 private:
  Variable compute(const Variable& x);

  bool checkpointing_;
  nn::LayerNorm* ln_1_;
  CausalSelfAttention* attn_;
  nn::LayerNorm* ln_2_;
  MLP* mlp_;
};

}  // namespace strata::models::gpt2
