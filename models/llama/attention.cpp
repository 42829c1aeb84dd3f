#include "models/llama/attention.h"

#include <vector>

#include "autograd/functions.h"
#include "models/kv_cache.h"

namespace strata::models::llama {

Attention::Attention(const LlamaConfig& config, RotaryEmbedding& rope, const nn::TensorParallel& tp)
    : n_head_(config.num_attention_heads / tp.size()),
      n_kv_head_(config.num_key_value_heads / tp.size()),
      head_dim_(config.head_dim()),
      tp_(tp),
      rope_(&rope) {
  STRATA_USER_CHECK(
      config.num_attention_heads % tp.size() == 0 && config.num_key_value_heads % tp.size() == 0,
      "num_attention_heads {} and num_key_value_heads {} must both divide over "
      "tensor_parallel_size {}",
      config.num_attention_heads, config.num_key_value_heads, tp.size());
  const int64_t C = config.hidden_size, D = head_dim_;
  const int64_t q_out = config.num_attention_heads * D, kv_out = config.num_key_value_heads * D;
  q_proj_ = &add_module<nn::ColumnParallelLinear>("q_proj", C, q_out, /*bias=*/false, tp);
  k_proj_ = &add_module<nn::ColumnParallelLinear>("k_proj", C, kv_out, /*bias=*/false, tp);
  v_proj_ = &add_module<nn::ColumnParallelLinear>("v_proj", C, kv_out, /*bias=*/false, tp);
  o_proj_ = &add_module<nn::RowParallelLinear>("o_proj", q_out, C, /*bias=*/false, tp);
  q_proj_->set_init_std(config.initializer_range);
  k_proj_->set_init_std(config.initializer_range);
  v_proj_->set_init_std(config.initializer_range);
  o_proj_->set_init_std(config.initializer_range);
}

namespace {
// [B, T, KV, D] -> [B, T, KV * rep, D], each k/v head repeated `rep` times in place
// (Note [Grouped-query attention]).
Variable repeat_heads(const Variable& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t B = x.size(0), T = x.size(1), KV = x.size(2), D = x.size(3);
  Variable x5 = autograd::reshape(x, {B, T, KV, 1, D});
  Variable r = autograd::concat(std::vector<Variable>(static_cast<size_t>(rep), x5), 3);
  return autograd::reshape(r, {B, T, KV * rep, D});
}
}  // namespace

Variable Attention::forward(const Variable& x_in) {
  const int64_t H = n_head_, KV = n_kv_head_, D = head_dim_;
  // Under a KV cache the tokens sit at positions [start, start + T) (Note [KV cache]).
  KvCache* cache = KvCache::active();
  // One region for the three column-parallel projections (Note [Sequence-parallel saved input]).
  std::vector<Variable> qkv = tp_.enter_columns(x_in, [&](const Variable& x) {
    const int64_t B = x.size(0), T = x.size(1);
    auto [cos, sin] = rope_->tables(cache ? cache->start() : 0, T, x.device());
    // Rotary acts on [B, T, heads, D], the projections' own layout (a free view).
    return std::vector<Variable>{
        autograd::rotary(autograd::reshape((*q_proj_)(x), {B, T, H, D}), cos, sin),
        autograd::rotary(autograd::reshape((*k_proj_)(x), {B, T, KV, D}), cos, sin),
        autograd::reshape((*v_proj_)(x), {B, T, KV, D})};
  });
  Variable q = qkv[0], k = qkv[1], v = qkv[2];
  const int64_t B = q.size(0), T = q.size(1);
  if (cache) {
    // The cache holds the KV heads; every held position's k and v, [B, L, KV, D].
    auto [kc, vc] = cache->append(k.data(), v.data());
    k = Variable(kc.transpose(1, 2));
    v = Variable(vc.transpose(1, 2));
  }
  k = repeat_heads(k, H / KV);
  v = repeat_heads(v, H / KV);
  Variable y = autograd::attention(autograd::transpose(q, 1, 2), autograd::transpose(k, 1, 2),
                                   autograd::transpose(v, 1, 2), /*causal=*/true);
  y = autograd::reshape(autograd::transpose(y, 1, 2), {B, T, H * D});  // heads back side by side
  return (*o_proj_)(y);
}

}  // namespace strata::models::llama
