#pragma once
// LLaMA's Hugging Face mapping (Note [HF mapping]): transformers' LlamaForCausalLM checkpoints
// (model.safetensors + config.json) in and out of a Strata llama-family model.
#include <cstdint>

#include "models/hf_mapping.h"
#include "tensor/tensor.h"

namespace strata::models::llama {

// Note [HF LLaMA layout]
// HF names are Strata's with the "model." prefix (optional on load, written on export), except
// lm_head.weight, which has none. Linear weights are [out, in] on both sides. But:
//  - q_proj.weight and k_proj.weight rows are in HF's rotate_half order, Strata's in Meta's
//    interleaved order (Note [LLaMA rotary convention]): load applies rotary_rows_from_hf (per
//    head h, HF row h*D + j*D/2 + i becomes Strata row h*D + 2i + j, for i < D/2, j in {0, 1}),
//    export its inverse rotary_rows_to_hf; q_proj has num_attention_heads heads, k_proj
//    num_key_value_heads (grouped-query attention);
//  - embed_tokens and an untied lm_head have exactly vocab_size rows; Strata's may be padded
//    (Note [Padded vocabulary]);
//  - with tie_word_embeddings the model has no lm_head parameter: load accepts lm_head.weight
//    when it equals embed_tokens, export leaves it out (as save_pretrained does);
//  - the self_attn.rotary_emb.inv_freq buffers older transformers versions saved are ignored.
// config.json: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, vocab_size, rms_norm_eps, rope_theta and tie_word_embeddings must match
// the model; hidden_act must be silu, without biases or rope_scaling. max_position_embeddings is
// not checked: it sizes no parameter, and a model may be built for a shorter or longer context.

// The family's static instance, registered by models/zoo.cpp.
const HfMapping& hf_mapping();

// Note [HF LLaMA layout]: a q_proj/k_proj weight [n_heads * D, C] from HF's row order to
// Strata's, and back. Fresh contiguous tensors of w's dtype.
tensor::Tensor rotary_rows_from_hf(const tensor::Tensor& w, int64_t n_heads);
tensor::Tensor rotary_rows_to_hf(const tensor::Tensor& w, int64_t n_heads);

}  // namespace strata::models::llama
