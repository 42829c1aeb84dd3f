#include "models/gpt2/attention.h"

#include <cmath>

#include "autograd/functions.h"
#include "models/kv_cache.h"
#include "tensor/ops.h"

namespace strata::models::gpt2 {

namespace {

// The composition attention_qkv replaces, kept as its reference (Note [GPT-2 attention layout]).
Variable unfused_attention(const Variable& qkv, int64_t n_head) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_head, D = C / H;
  std::vector<Variable> parts = autograd::split(qkv, {C, C, C}, -1);
  // [B, T, C] -> [B, T, H, D] -> [B, H, T, D]; the split views are strided, so reshape copies.
  auto heads = [&](const Variable& t) {
    return autograd::transpose(autograd::reshape(t, {B, T, H, D}), 1, 2);
  };
  Variable y = autograd::attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                   /*causal=*/true);
  return autograd::reshape(autograd::transpose(y, 1, 2), {B, T, C});  // heads back side by side
}

// Note [KV cache]: the new positions' q [B, T, H, D] against every held position's k and v.
Variable cached_attention(const Variable& qkv, int64_t n_head, KvCache& cache) {
  const tensor::Tensor& t = qkv.data();
  const int64_t B = t.size(0), T = t.size(1), C = t.size(2) / 3, H = n_head, D = C / H;
  auto heads = [&](int64_t i) { return t.narrow(2, i * C, C).view({B, T, H, D}); };
  auto [k, v] = cache.append(heads(1), heads(2));  // [B, H, L, D]
  tensor::Tensor y = tensor::attention(heads(0).transpose(1, 2), k, v, /*causal=*/true).out;
  return Variable(y.transpose(1, 2).reshape({B, T, C}));  // a view: out is [B, T, H, D]
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPT2Config& config, const nn::TensorParallel& tp)
    : n_embd_(config.n_embd), n_head_(config.n_head / tp.size()), tp_(tp) {
  STRATA_USER_CHECK(config.n_head % tp.size() == 0,
                    "n_head {} does not divide over tensor_parallel_size {}", config.n_head,
                    tp.size());
  c_attn_ = &add_module<nn::ColumnParallelLinear>("c_attn", n_embd_, 3 * n_embd_, true, tp,
                                                  /*blocks=*/3);
  c_proj_ = &add_module<nn::RowParallelLinear>("c_proj", n_embd_, n_embd_, true, tp);
  // GPT-2 paper: residual projections scaled by 1/sqrt(N) with N = 2 * n_layer residual adds.
  c_proj_->set_init_std(0.02f / std::sqrt(2.f * static_cast<float>(config.n_layer)));
  resid_dropout_ = &add_module<nn::Dropout>("resid_dropout", config.dropout);
  c_attn_->set_tiles(config.tiling);  // Note [Tiled linear]
  c_proj_->set_tiles(config.tiling);
}

Variable CausalSelfAttention::forward(const Variable& x) {
  // [B, T, 3C / tp]
  Variable qkv = tp_.enter_columns(x, [&](const Variable& in) { return (*c_attn_)(in); });
  Variable y;
  if (KvCache* cache = KvCache::active()) {
    y = cached_attention(qkv, n_head_, *cache);
  } else {
    y = fused_qkv_ ? autograd::attention_qkv(qkv, n_head_, /*causal=*/true)
                   : unfused_attention(qkv, n_head_);
  }
  return (*resid_dropout_)((*c_proj_)(y));
}

}  // namespace strata::models::gpt2
