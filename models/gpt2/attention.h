#pragma once
// GPT-2 causal self-attention: one fused projection to q, k, v, scaled-dot-product attention
// with a causal mask over H heads, an output projection and residual dropout.
#include "models/gpt2/config.h"
#include "models/nn/dropout.h"
#include "models/nn/linear.h"

namespace strata::models::gpt2 {

using autograd::Variable;

class CausalSelfAttention : public nn::Module {
 public:
  explicit CausalSelfAttention(const GPT2Config& config);

  nn::Linear& c_attn() { return *c_attn_; }
  nn::Linear& c_proj() { return *c_proj_; }

 protected:
  // x [B, T, C] -> [B, T, C].
  Variable forward(const Variable& x) override;

 private:
  int64_t n_embd_, n_head_;
  nn::Linear* c_attn_;
  nn::Linear* c_proj_;
  // HF's resid_dropout. Dropout on the attention probabilities (HF attn_dropout) is not applied:
  // the fused attention op has no dropout, and GPT-2 training recipes set it to 0 anyway.
  nn::Dropout* resid_dropout_;
};

}  // namespace strata::models::gpt2
