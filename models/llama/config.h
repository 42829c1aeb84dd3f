#pragma once
// LLaMA configuration and presets.
//
// Note [LLaMA presets]
// "llama-7b" .. "llama-65b" are LLaMA 1 (Touvron et al. 2023, table 2; Meta's params.json):
// context 2048, RMSNorm eps 1e-6, every head its own k/v (no grouped-query attention).
// "llama2-7b" .. "llama2-70b" are Llama 2: context 4096, eps 1e-5; 70B uses grouped-query
// attention with 8 k/v heads. All have a 32000-token vocabulary (already a multiple of 64, so
// no padding) and an untied LM head. Feed-forward widths are Meta's
// (multiple_of * ceil(ffn_dim_multiplier * 8/3 * dim / multiple_of)), written out as numbers.
// "llama-tiny" is for tests and CPU smoke runs (2 kv heads, so grouped-query attention is
// exercised).
//
// Field names are HF LlamaConfig's (config.json interoperates); with_overrides also takes the
// GPT-2 spellings n_embd, n_layer, n_head, n_kv_head and block_size, so a YAML `model:` section
// can switch families by changing only the name.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace strata::models::llama {

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t padded_vocab_size = 32000;       // >= vocab_size; rows beyond vocab_size are padding
  int64_t max_position_embeddings = 2048;  // the longest sequence (rotary tables are this long)
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;  // SwiGLU width
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // divides num_attention_heads (grouped-query attention)
  float rms_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;       // LM head = embed_tokens (no lm_head parameter)
  float initializer_range = 0.02f;        // std of the normal init of every matrix
  bool activation_checkpointing = false;  // recompute each decoder layer in backward
  bool recompute_swiglu = false;  // the fused MLP recomputes silu(g) * u (Note [SwiGLU recompute])

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // strata::user_error on an inconsistent config (e.g. heads not divisible by k/v heads).
  void validate() const;
};

// Note [LLaMA presets]. strata::user_error for unknown names.
LlamaConfig preset(std::string_view name);
std::vector<std::string> preset_names();

// Applies key=value overrides (keys are the field names, plus the aliases of
// Note [LLaMA presets]). Changing vocab_size without padded_vocab_size re-pads it to a multiple
// of 64. Unknown keys and malformed values are strata::user_errors naming the key.
LlamaConfig with_overrides(LlamaConfig config, const std::map<std::string, std::string>& overrides);

// Exactly the number of elements Llama allocates for `config`, computed without allocating:
// embed_tokens (padded_vocab x C) + lm_head (the same, unless tied) + per layer
// q/o (C x C each), k/v (C x kv_heads * head_dim each), gate/up/down (3 C x F) and two norms
// (2 C) + the final norm (C). llama-7b gives 6,738,415,616.
int64_t num_parameters(const LlamaConfig& config);

}  // namespace strata::models::llama
