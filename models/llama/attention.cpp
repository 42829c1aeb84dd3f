#include "models/llama/attention.h"

#include <vector>

#include "autograd/functions.h"
#include "models/kv_cache.h"

namespace strata::models::llama {

Attention::Attention(const LlamaConfig& config, RotaryEmbedding& rope)
    : n_head_(config.num_attention_heads),
      n_kv_head_(config.num_key_value_heads),
      head_dim_(config.head_dim()),
      rope_(&rope) {
  const int64_t C = config.hidden_size, kv = n_kv_head_ * head_dim_;
  q_proj_ = &add_module<nn::Linear>("q_proj", C, n_head_ * head_dim_, /*bias=*/false);
  k_proj_ = &add_module<nn::Linear>("k_proj", C, kv, /*bias=*/false);
  v_proj_ = &add_module<nn::Linear>("v_proj", C, kv, /*bias=*/false);
  o_proj_ = &add_module<nn::Linear>("o_proj", n_head_ * head_dim_, C, /*bias=*/false);
  for (nn::Linear* l : {q_proj_, k_proj_, v_proj_, o_proj_})
    l->set_init_std(config.initializer_range);
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

Variable Attention::forward(const Variable& x) {
  const int64_t B = x.size(0), T = x.size(1), H = n_head_, KV = n_kv_head_, D = head_dim_;
  // Under a KV cache the tokens sit at positions [start, start + T) (Note [KV cache]).
  KvCache* cache = KvCache::active();
  auto [cos, sin] = rope_->tables(cache ? cache->start() : 0, T, x.device());
  // Rotary acts on [B, T, heads, D], the projections' own layout (a free view).
  Variable q = autograd::rotary(autograd::reshape((*q_proj_)(x), {B, T, H, D}), cos, sin);
  Variable k = autograd::rotary(autograd::reshape((*k_proj_)(x), {B, T, KV, D}), cos, sin);
  Variable v = autograd::reshape((*v_proj_)(x), {B, T, KV, D});
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
