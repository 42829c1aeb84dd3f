#pragma once
// ModuleHooks: the module hooks one Engine part installed, removed when the part goes (so a model
// outlives its engine with no hook calling into freed parts).
#include <utility>
#include <vector>

#include "models/flat_params.h"
#include "models/nn/module.h"

namespace strata::parallel {

class ModuleHooks {
 public:
  ModuleHooks() = default;
  ~ModuleHooks() {
    for (auto& [module, handle] : hooks_) module->remove_hook(handle);
  }
  ModuleHooks(const ModuleHooks&) = delete;
  ModuleHooks& operator=(const ModuleHooks&) = delete;

  void add(models::nn::Module& m, models::nn::HookHandle h) { hooks_.emplace_back(&m, h); }

 private:
  std::vector<std::pair<models::nn::Module*, models::nn::HookHandle>> hooks_;
};

// The modules that use unit `u`'s parameters: its prefixes and its users (UnitSpec::users: GPT-2's
// tied lm_head reads wte). The hooks of Note [ZeRO-3 gathering] and Note [Transient gradients]
// go on each of them.
std::vector<models::nn::Module*> unit_modules(models::nn::Module& model,
                                              const models::FlatUnit& unit);

}  // namespace strata::parallel
