#pragma once
// GPT-2 causal self-attention: one fused projection to q, k, v, scaled-dot-product attention
// with a causal mask over H heads, an output projection and residual dropout.
//
// Note [GPT-2 attention layout]
// c_attn's output qkv [B, T, 3C] goes to autograd::attention_qkv, which hands the backend q, k, v
// as strided [B, H, T, D] views of it and gets y back already as [B, T, C]; backward writes dq,
// dk, dv into one dqkv [B, T, 3C]. So no layout copy happens around attention in either
// direction (the split / reshape / transpose composition it replaces made 4 copies of a [B, T, C]
// tensor in forward, 3 in attention's own .contiguous() calls, and 3 + 1 + a 3C-wide concat in
// backward). set_fused_qkv(false) runs that composition instead: the reference the fused path is
// tested against bit for bit, and a way to measure what it saves.
#include "models/gpt2/config.h"
#include "models/nn/dropout.h"
#include "models/nn/parallel_linear.h"

namespace strata::models::gpt2 {

using autograd::Variable;

// Under tensor parallelism (Note [Tensor-parallel shards]) each rank runs n_head / tp heads:
// c_attn is column-parallel over its three blocks q, k, v (rank r's rows are its heads' rows of
// each), so its local output is [q_r, k_r, v_r], the packed layout attention_qkv reads for
// n_head / tp heads; c_proj is row-parallel.
class CausalSelfAttention : public nn::Module {
 public:
  explicit CausalSelfAttention(const GPT2Config& config, const nn::TensorParallel& tp = {});

  nn::ColumnParallelLinear& c_attn() { return *c_attn_; }
  nn::RowParallelLinear& c_proj() { return *c_proj_; }
  // Note [GPT-2 attention layout]; on by default.
  bool fused_qkv() const { return fused_qkv_; }
  void set_fused_qkv(bool on) { fused_qkv_ = on; }

 protected:
  // x [B, T, C] -> [B, T, C] (under sequence parallelism this rank's tokens of each).
  Variable forward(const Variable& x) override;

 private:
  int64_t n_embd_, n_head_;  // n_head_: this rank's heads
  nn::TensorParallel tp_;
  bool fused_qkv_ = true;
  nn::ColumnParallelLinear* c_attn_;
  nn::RowParallelLinear* c_proj_;
  // HF's resid_dropout. Dropout on the attention probabilities (HF attn_dropout) is not applied:
  // the fused attention op has no dropout, and GPT-2 training recipes set it to 0 anyway.
  nn::Dropout* resid_dropout_;
};

}  // namespace strata::models::gpt2
