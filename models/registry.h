#pragma once
// ModelRegistry: models constructible by name ("gpt2-medium", "gpt3-1.3b", ...).
//
// Note [Model registry]
// Each model family contributes named presets through one function, `register_presets`, and
// models/zoo.cpp lists those functions explicitly, one line per family. There is no
// self-registration from static initialisers: the linker drops unreferenced objects of a static
// library, and with them such registrations. The global registry is built on first use.
// A preset can be tweaked by key=value overrides (the YAML `model:` section), which its family
// parses into its typed config; unknown keys are user errors naming the known ones.
// A family may also register its Hugging Face mapping (Note [HF mapping] in models/hf_mapping.h)
// on the same line of models/zoo.cpp; model.init_from and convert --to-hf find it by family.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "models/causal_lm.h"
#include "models/hf_mapping.h"

namespace strata::models {

struct ModelOptions {
  uint64_t seed = 0;  // init seed (Note [Name-keyed init])
  // Config overrides, e.g. {"n_layer", "4"}, {"dropout", "0.1"},
  // {"activation_checkpointing", "true"}.
  std::map<std::string, std::string> overrides;
  // The pipeline stage to build (Note [Pipeline stages]); the whole model by default.
  StageLayers stage;
  // The tensor-parallel group and sequence parallelism (Note [Tensor-parallel shards]); a null
  // group (the default) builds the single-rank model.
  nn::TensorParallel tp;
};

// The shape of a model, computed without allocating it (for `estimate`, memory formulas).
struct ModelShape {
  std::string family;
  int64_t num_parameters = 0;  // exactly what construction would allocate
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;  // key/value heads (grouped-query attention); n_head when equal
  int64_t max_seq_len = 0;
  int64_t vocab_size = 0;
  int64_t padded_vocab_size = 0;
  // For balancing pipeline stages (Note [Pipeline stages]): the parameters of one layer, of the
  // first stage's embeddings, and of what the last stage holds beyond its layers (final norm,
  // head, and its copy of a tied embedding).
  int64_t layer_parameters = 0;
  int64_t embedding_parameters = 0;
  int64_t head_parameters = 0;
};

struct ModelEntry {
  std::string name;         // "gpt2-medium"
  std::string family;       // "gpt2"
  std::string description;  // one line for `--help`-style listings
  std::function<std::unique_ptr<CausalLM>(const ModelOptions&)> create;
  std::function<ModelShape(const ModelOptions&)> shape;
};

class ModelRegistry {
 public:
  // Internal error on a duplicate name.
  void add(ModelEntry entry);

  bool contains(std::string_view name) const;
  // strata::user_error listing the known names when `name` is unknown.
  const ModelEntry& get(std::string_view name) const;
  std::unique_ptr<CausalLM> create(std::string_view name, const ModelOptions& options = {}) const;
  ModelShape shape(std::string_view name, const ModelOptions& options = {}) const;
  std::vector<std::string> names() const;  // sorted

  // `mapping` outlives the registry (a family's static instance). Internal error on a second
  // mapping for one family.
  void add_hf_mapping(const HfMapping& mapping);
  // The mapping of `family`; strata::user_error naming `path` (the file being read or written)
  // when the family has none.
  const HfMapping& hf_mapping(std::string_view family, const std::string& path) const;
  const HfMapping* find_hf_mapping(std::string_view family) const;  // null when none
  std::vector<const HfMapping*> hf_mappings() const;                // by family

  // Every family of models/zoo.cpp, registered on first use.
  static const ModelRegistry& global();

 private:
  std::map<std::string, ModelEntry, std::less<>> entries_;
  std::map<std::string, const HfMapping*, std::less<>> hf_mappings_;
};

}  // namespace strata::models
