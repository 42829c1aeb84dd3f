#pragma once
// HfMapping: how one model family's parameters and configuration appear in a Hugging Face
// checkpoint (model.safetensors + config.json). Each family implements it next to its presets
// and models/zoo.cpp registers it with them; models/hf_interop.h loads (`model.init_from`) and
// exports (`convert --to-hf`) any family through it.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "tensor/tensor.h"

namespace strata::models {

class CausalLM;

// Note [HF mapping]
// For a model built from the registry, a family's mapping says:
//  - hf_name / strata_name: each parameter's name in the transformers *ForCausalLM state dict
//    (the one export writes), and which Strata name a file's tensor stands for (prefixes are
//    optional on load; buffers older transformers versions saved are ignored, std::nullopt);
//  - hf_tensor: the tensor's shape in the file and the layout transform each way (GPT-2's
//    Conv1D transpose, LLaMA's rotary row permutation); vocabulary-sized rows (vocab_rows) hold
//    vocab_size rows in the file and padded_vocab_size in Strata (Note [Padded vocabulary]): the
//    generic code zeroes the padding on load and cuts it on export;
//  - tied_head: the HF tensor a tied model has no parameter for (lm_head.weight) and the
//    parameter it equals; a file may carry it (it must then be equal), export leaves it out;
//  - config.json both ways: what transformers needs to build the model, and a check that a
//    checkpoint's config.json describes the model being built (a user error naming the file and
//    the field otherwise).
// The generic loader reads and validates the whole file before it writes anything, then copies
// into the parameters' existing storage (views into the flat buffers, Note [Flat parameters]).

// One parameter's tensor in an HF checkpoint (Note [HF mapping]).
struct HfTensor {
  tensor::Shape shape;  // in the file
  // File layout -> Strata layout, and back; empty means the same layout. from_hf gets the file's
  // tensor (any float dtype) and returns one of the parameter's shape (vocab_size rows when
  // vocab_rows); to_hf gets the parameter (cut to vocab_size rows when vocab_rows).
  std::function<tensor::Tensor(const tensor::Tensor&)> from_hf, to_hf;
  bool vocab_rows = false;
  std::string layout;  // how the file's layout differs, for error messages ("" when it does not)
};

// The LM head of a model that ties it to a parameter (Note [HF mapping]).
struct HfTiedHead {
  std::string hf_name;    // "lm_head.weight"
  std::string parameter;  // the Strata parameter it equals, "wte.weight"
  std::string fix;        // what to do when a file's head differs from it
};

class HfMapping {
 public:
  virtual ~HfMapping() = default;

  virtual std::string family() const = 0;        // the registry's family, "llama"
  virtual std::string display_name() const = 0;  // for messages, "LLaMA"
  virtual std::string architecture() const = 0;  // the transformers class, "LlamaForCausalLM"
  virtual std::string model_type() const = 0;    // config.json's model_type, "llama"
  // A parameter every model of the family has; a file without it is not this family's.
  virtual std::string marker() const = 0;

  // The canonical HF name of Strata parameter `name` (what export writes).
  virtual std::string hf_name(const std::string& name) const = 0;
  // The Strata name a file's tensor stands for; std::nullopt for a buffer to ignore.
  virtual std::optional<std::string> strata_name(const std::string& hf_name) const = 0;
  virtual HfTensor hf_tensor(const CausalLM& model, const std::string& name,
                             const tensor::Shape& shape) const = 0;
  virtual std::optional<HfTiedHead> tied_head(const CausalLM& model) const = 0;

  // For messages when the file's layer count differs from the model's: the config key, the
  // decoder layer a parameter belongs to, the model's count.
  virtual std::string layers_key() const = 0;
  virtual std::optional<int64_t> layer_index(const std::string& name) const = 0;
  virtual int64_t num_layers(const CausalLM& model) const = 0;
  // The config key a shape mismatch of parameter `name` most likely comes from.
  virtual std::string likely_key(const std::string& name, const tensor::Shape& file,
                                 const tensor::Shape& model) const = 0;

  // Said after "missing tensor 'x'" (in parentheses) and "unexpected tensor 'x': ..." (starting
  // "; "), when the family knows a likely cause (an untied head in a file of a tied model).
  virtual std::string missing_hint(const CausalLM&, const std::string&) const { return ""; }
  virtual std::string unexpected_hint(const CausalLM&, const std::string&) const { return ""; }

  // What transformers' from_pretrained needs (architectures, model_type, shapes, torch_dtype).
  virtual nlohmann::ordered_json config_json(const CausalLM& model) const = 0;
  // strata::user_error naming `path` and the field when `config` (a parsed config.json) does not
  // describe `model`. Fields it lacks take transformers' defaults. The generic loader has
  // checked model_type already.
  virtual void check_config_json(const CausalLM& model, const nlohmann::json& config,
                                 const std::string& path) const = 0;
};

// Reading config.json fields for check_config_json: strata::user_error naming `path` and `key`
// when `model_value` differs from the file's (or, when absent, from `hf_default`), or when the
// value has the wrong type. `model_key` is the model.config key that would fix it; "" when the
// model has no such setting (the value is fixed).
void check_config_int(const nlohmann::json& config, const std::string& path, const std::string& key,
                      int64_t model_value, int64_t hf_default, const std::string& model_key);
// Floats compare after rounding the file's value to the model's precision (config.json writes
// 1e-05 for 1e-5f).
void check_config_float(const nlohmann::json& config, const std::string& path,
                        const std::string& key, float model_value, float hf_default,
                        const std::string& model_key);
void check_config_double(const nlohmann::json& config, const std::string& path,
                         const std::string& key, double model_value, double hf_default,
                         const std::string& model_key);
void check_config_bool(const nlohmann::json& config, const std::string& path,
                       const std::string& key, bool model_value, bool hf_default,
                       const std::string& model_key);
// A string field that must be one of `allowed` (absent means `hf_default`); `what` says what
// Strata supports, e.g. "Strata's GPT-2 uses the tanh GELU".
void check_config_string(const nlohmann::json& config, const std::string& path,
                         const std::string& key, std::initializer_list<std::string_view> allowed,
                         std::string_view hf_default, std::string_view what);

// k for a name "<prefix><k>.<rest>" ("h.3.attn.c_attn.weight" with prefix "h."), else nullopt.
std::optional<int64_t> numbered_child(const std::string& name, std::string_view prefix);
// The shortest decimal that round-trips `f` as a double for config.json (1e-5f -> 1e-05, not
// 9.999999747378752e-06).
double json_float(float f);

}  // namespace strata::models
