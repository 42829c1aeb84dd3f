#pragma once
// Hugging Face checkpoints in and out of any model family that registers an HfMapping
// (Note [HF mapping] in models/hf_mapping.h): `model.init_from` and `convert --to-hf`.
#include <functional>
#include <string>

#include "models/causal_lm.h"
#include "models/hf_mapping.h"

namespace strata::models {

class ModelRegistry;

// Loads `path` into `model` through its family's mapping in `registry` (ModelRegistry::global()
// when null). `path` is a .safetensors file, a model.safetensors.index.json naming shard files
// beside it (its "weight_map", as save_pretrained writes for large models), or a directory
// holding either (model.safetensors first). A config.json beside them is checked against the
// model first (HfMapping::check_config_json). Validates every file (names, shapes, F32/F16/BF16
// dtypes, a tied head equal to its parameter, digests where Strata wrote them) before writing
// anything. strata::user_error naming the file on: a family without a mapping, a file of
// another family (named when another registered mapping recognises it), a missing or unexpected
// tensor, a shape that does not match (with the config key that probably differs).
void load_hf(CausalLM& model, const std::string& path, const ModelRegistry* registry = nullptr);
// load_hf for a model built deferred (Note [Deferred initialisation] in models/nn/module.h):
// validates everything as load_hf does, now, and returns the filler CausalLM::set_unit_source
// takes, which writes one unit's parameters from the files (keeping them open).
std::function<void(const FlatUnit&)> hf_unit_loader(CausalLM& model, const std::string& path,
                                                    const ModelRegistry* registry = nullptr);
// Fills dst (F32, contiguous, host, the slice's size) with rank `rank`'s slice (nn::shard_of's,
// `spec`; the whole tensor when replicated) of parameter `name` as load_hf would write it.
using HfShardReader = std::function<void(const std::string& name, const nn::ShardSpec& spec,
                                         int rank, int size, tensor::Tensor dst)>;
// load_hf a slice at a time, for a model whose parameters are held elsewhere (a tensor- or
// pipeline-parallel run reads its slices through the whole model's layout, built deferred):
// validates everything as load_hf does, now, and returns the reader (keeping the files open). A
// tensor stored in the parameter's layout is read a slice at a time (nn::read_shard); one the
// mapping transforms (GPT-2's Conv1D transpose, LLaMA's rotary permutation) or pads (the
// vocabulary rows) is read and converted whole, then cut.
HfShardReader hf_shard_reader(CausalLM& model, const std::string& path,
                              const ModelRegistry* registry = nullptr);

// Writes out_dir/model.safetensors (fp32, the family's HF names and layouts, no tied head and
// no vocabulary padding) and out_dir/config.json, so that transformers' from_pretrained(out_dir)
// with the family's architecture loads the model. Each file is written atomically (temporary
// name, fsync, rename); out_dir is created if needed.
void export_hf(const CausalLM& model, const std::string& out_dir,
               const ModelRegistry* registry = nullptr);

}  // namespace strata::models
