#include "models/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/zoo.h"

namespace strata::models {

void ModelRegistry::add(ModelEntry entry) {
  STRATA_CHECK(!entry.name.empty() && entry.create && entry.shape,
               "incomplete model registration '{}'", entry.name);
  std::string name = entry.name;
  bool fresh = entries_.emplace(name, std::move(entry)).second;
  STRATA_CHECK(fresh, "model '{}' registered twice", name);
}

bool ModelRegistry::contains(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

const ModelEntry& ModelRegistry::get(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    user_error("unknown model '{}'; known models: {}", name, fmt::join(names(), ", "));
  return it->second;
}

std::unique_ptr<CausalLM> ModelRegistry::create(std::string_view name,
                                                const ModelOptions& options) const {
  return get(name).create(options);
}

ModelShape ModelRegistry::shape(std::string_view name, const ModelOptions& options) const {
  return get(name).shape(options);
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (auto& [n, e] : entries_) out.push_back(n);
  return out;
}

void ModelRegistry::add_hf_mapping(const HfMapping& mapping) {
  bool fresh = hf_mappings_.emplace(mapping.family(), &mapping).second;
  STRATA_CHECK(fresh, "a second Hugging Face mapping for family '{}'", mapping.family());
}

const HfMapping* ModelRegistry::find_hf_mapping(std::string_view family) const {
  auto it = hf_mappings_.find(family);
  return it == hf_mappings_.end() ? nullptr : it->second;
}

const HfMapping& ModelRegistry::hf_mapping(std::string_view family, const std::string& path) const {
  if (const HfMapping* m = find_hf_mapping(family)) return *m;
  std::vector<std::string> known;
  for (auto& [f, m] : hf_mappings_) known.push_back(f);
  user_error(
      "{}: model family '{}' has no Hugging Face mapping, so it cannot be loaded from or exported "
      "to a Hugging Face checkpoint (families with one: {}; docs/adding_a_model.md says how to add "
      "one)",
      path, family, fmt::join(known, ", "));
}

std::vector<const HfMapping*> ModelRegistry::hf_mappings() const {
  std::vector<const HfMapping*> out;
  for (auto& [f, m] : hf_mappings_) out.push_back(m);
  return out;
}

const ModelRegistry& ModelRegistry::global() {
  // Function-local static: thread-safe initialisation, and built only when first needed.
  static const ModelRegistry registry = [] {
    ModelRegistry r;
    register_zoo(r);
    return r;
  }();
  return registry;
}

}  // namespace strata::models
