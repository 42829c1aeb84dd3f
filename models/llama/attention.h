#pragma once
// LLaMA self-attention: bias-free q/k/v/o projections, rotary embedding on q and k
// (Note [LLaMA rotary convention]), causal scaled-dot-product attention, grouped-query attention
// when num_key_value_heads < num_attention_heads. HF: LlamaAttention.
//
// Note [Grouped-query attention]
// With H query heads and KV k/v heads (KV divides H), query head h reads k/v head h / (H / KV):
// consecutive query heads share a k/v head, as HF's repeat_kv and Meta's repeat_kv lay them out.
// The fused attention op wants k and v with H heads, so each k/v head is repeated H / KV times
// with autograd::concat; concat's backward splits the gradient and the engine sums the copies'
// gradients back into the one k/v head. This costs H / KV times the k/v memory for the attention
// call itself (the projections stay small); an attention kernel that indexes k/v heads directly
// would avoid the copy.
#include "models/llama/config.h"
#include "models/llama/rotary.h"
#include "models/nn/parallel_linear.h"

namespace strata::models::llama {

using autograd::Variable;

//
// Under tensor parallelism each rank runs num_attention_heads / tp query heads and
// num_key_value_heads / tp k/v heads (both must divide by tp): q/k/v_proj are column-parallel,
// o_proj row-parallel. Query head h and its k/v head h / (H / KV) land on the same rank, since
// both are cut into tp consecutive ranges.
class Attention : public nn::Module {
 public:
  // `rope` is the model's shared table; it must outlive this module.
  Attention(const LlamaConfig& config, RotaryEmbedding& rope, const nn::TensorParallel& tp = {});

  nn::ColumnParallelLinear& q_proj() { return *q_proj_; }
  nn::ColumnParallelLinear& k_proj() { return *k_proj_; }
  nn::ColumnParallelLinear& v_proj() { return *v_proj_; }
  nn::RowParallelLinear& o_proj() { return *o_proj_; }

 protected:
  // x [B, T, C] -> [B, T, C].
  Variable forward(const Variable& x) override;

 private:
  int64_t n_head_, n_kv_head_, head_dim_;  // this rank's heads
  nn::TensorParallel tp_;
  RotaryEmbedding* rope_;
  nn::ColumnParallelLinear* q_proj_;
  nn::ColumnParallelLinear* k_proj_;
  nn::ColumnParallelLinear* v_proj_;
  nn::RowParallelLinear* o_proj_;
};

}  // namespace strata::models::llama
