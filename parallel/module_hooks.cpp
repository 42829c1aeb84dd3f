#include "parallel/module_hooks.h"

#include "core/error.h"

namespace strata::parallel {

std::vector<models::nn::Module*> unit_modules(models::nn::Module& model,
                                              const models::FlatUnit& unit) {
  std::vector<std::string> paths = unit.prefixes;
  paths.insert(paths.end(), unit.users.begin(), unit.users.end());
  std::vector<models::nn::Module*> out;
  for (const std::string& path : paths) {
    STRATA_CHECK(!path.empty(), "unit '{}' has an empty module prefix", unit.name);
    out.push_back(&model.module(path));
  }
  return out;
}

}  // namespace strata::parallel
