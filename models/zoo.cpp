// The model zoo: one line per model family (Note [Model registry]; docs/adding_a_model.md).
#include "models/zoo.h"

#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"

namespace strata::models {

namespace {
struct Family {
  const char* name;
  void (*register_presets)(ModelRegistry&);
};

constexpr Family kFamilies[] = {
    {"gpt2", &gpt2::register_presets},
    {"llama", &llama::register_presets},
};
}  // namespace

void register_zoo(ModelRegistry& registry) {
  for (const Family& f : kFamilies) f.register_presets(registry);
}

}  // namespace strata::models
