#pragma once
// A pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
//
// The residual adds are fused into the norms after them (Note [Fused ops in models] in
// models/nn/fused_ops.h): forward_residual takes the residual stream and the previous block's
// MLP output that is still to be added to it, adds them inside ln_1, and hands its own MLP output
// on the same way; the model adds the last one inside ln_f.
//
// With config.activation_checkpointing the block keeps only its input in forward and recomputes
// itself in backward (Note [Activation checkpointing]); dropout masks replay exactly, so the
// gradients equal those of the plain block.
#include <utility>

#include "models/gpt2/attention.h"
#include "models/gpt2/mlp.h"
#include "models/nn/layer_norm.h"

namespace strata::models::gpt2 {

class Block : public nn::Module {
 public:
  explicit Block(const GPT2Config& config, const nn::TensorParallel& tp = {});

  bool activation_checkpointing() const { return checkpointing_; }
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

  // The block on the residual stream x plus `pending` (undefined: nothing pending), through the
  // module's hooks. Returns {h, m}: the stream after attention and this block's MLP output, whose
  // sum is the block's output. With fused ops off, or under activation checkpointing, the block
  // adds them itself: {output, undefined}.
  std::pair<Variable, Variable> forward_residual(const Variable& x, const Variable& pending);

 protected:
  // The block's whole output, x (+ nothing pending) in, h + m out.
  Variable forward(const Variable& x) override;

 private:
  std::vector<Variable> run(const std::vector<Variable>& in, bool fused, bool complete);
  std::vector<Variable> compute(const std::vector<Variable>& in, bool fused, bool complete);

  bool checkpointing_;
  nn::LayerNorm* ln_1_;
  CausalSelfAttention* attn_;
  nn::LayerNorm* ln_2_;
  MLP* mlp_;
};

}  // namespace strata::models::gpt2
