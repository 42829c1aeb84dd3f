// The model zoo: one line per model family (Note [Model registry]; docs/adding_a_model.md).
#include "models/zoo.h"

#include "core/error.h"
#include "models/gpt2/gpt2.h"
#include "models/gpt2/hf_interop.h"
#include "models/llama/hf_interop.h"
#include "models/llama/llama.h"

namespace strata::models {

namespace {
struct Family {
  const char* name;
  void (*register_presets)(ModelRegistry&);
  // The family's Hugging Face mapping (Note [HF mapping]), or null when it has none.
  const HfMapping& (*hf_mapping)();
};

constexpr Family kFamilies[] = {
    {"gpt2", &gpt2::register_presets, &gpt2::hf_mapping},
    {"llama", &llama::register_presets, &llama::hf_mapping},
};
}  // namespace

void register_zoo(ModelRegistry& registry) {
  for (const Family& f : kFamilies) {
    f.register_presets(registry);
    if (f.hf_mapping != nullptr) {
      const HfMapping& m = f.hf_mapping();
      STRATA_CHECK(m.family() == f.name, "family '{}' registers the HF mapping of '{}'", f.name,
                   m.family());
      registry.add_hf_mapping(m);
    }
  }
}

}  // namespace strata::models
