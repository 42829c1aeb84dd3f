#pragma once
// Hugging Face GPT-2 checkpoints (`GPT2LMHeadModel.save_pretrained` / the hub's model.safetensors)
// in and out of a Strata gpt2-family model.
//
// Note [HF GPT-2 layout]
// HF names are Strata's with an optional "transformer." prefix (Note [Module names]), but:
//  - attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D layers whose weight is
//    [in, out]; Strata's Linear is [out, in] (Note [Linear layout]), so those four weights are
//    transposed on the way in and out;
//  - wte has exactly vocab_size rows; Strata's may be padded (Note [Padded vocabulary]): load fills
//    the first vocab_size rows and zeroes the rest, export cuts the padding off;
//  - lm_head.weight is tied to wte: load accepts it when present (it must equal wte), export
//    leaves it out (tie_word_embeddings = true);
//  - the attn.bias / attn.masked_bias causal-mask buffers older versions saved are ignored.
// Loading validates the whole file (names, shapes, dtypes F32/F16/BF16) before writing anything,
// then copies into the parameters' existing storage (views into the flat buffers, Note [Flat
// parameters]), never rebinding them.
#include <string>

#include "models/causal_lm.h"

namespace strata::models {

// Loads `path` (a .safetensors file, or a directory holding model.safetensors) into a gpt2-family
// model. strata::user_error naming the file on: a model or file that is not GPT-2, a missing or
// unexpected tensor, a shape that does not match (with the config key that probably differs).
void load_hf_gpt2(CausalLM& model, const std::string& path);

// Writes out_dir/model.safetensors (HF layout, fp32, no prefix, no lm_head) and out_dir/config.json
// so that `transformers.GPT2LMHeadModel.from_pretrained(out_dir)` loads the model. Each file is
// written atomically (temporary name, fsync, rename); out_dir is created if needed.
void export_hf_gpt2(const CausalLM& model, const std::string& out_dir);

}  // namespace strata::models
