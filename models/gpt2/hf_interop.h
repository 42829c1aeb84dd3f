#pragma once
// GPT-2's Hugging Face mapping (Note [HF mapping]): `GPT2LMHeadModel.save_pretrained` / the hub's
// model.safetensors and config.json in and out of a Strata gpt2-family model.
#include "models/hf_mapping.h"

namespace strata::models::gpt2 {

// Note [HF GPT-2 layout]
// HF names are Strata's with an optional "transformer." prefix (Note [Module names]); export
// writes them without it, as GPT-2's hub files are. But:
//  - attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D layers whose weight is
//    [in, out]; Strata's Linear is [out, in] (Note [Linear layout]), so those four weights are
//    transposed on the way in and out;
//  - wte has exactly vocab_size rows; Strata's may be padded (Note [Padded vocabulary]);
//  - lm_head.weight is tied to wte: load accepts it when present (it must equal wte), export
//    leaves it out (tie_word_embeddings = true);
//  - the attn.bias / attn.masked_bias causal-mask buffers older versions saved are ignored.
// config.json: n_embd, n_layer, n_head, n_positions, vocab_size, layer_norm_epsilon, a tanh
// GELU (gelu_new), n_inner 4 * n_embd and tied embeddings must match the model being loaded.

// The family's static instance, registered by models/zoo.cpp.
const HfMapping& hf_mapping();

}  // namespace strata::models::gpt2
