#pragma once
// The model-shape flags the training benchmarks share (Note [Bench command line] in
// tools/bench/bench_cli.h): the registry model, its depth, width and sequence length, the
// micro-batch, and the registry options they give.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/registry.h"
#include "tools/bench/bench_cli.h"

namespace strata::bench {

// Each benchmark sets its own defaults before adding the flags (--help shows them).
struct ModelArgs {
  std::string model = "gpt2-tiny";
  int64_t layers = 4;
  int64_t embd = 256;
  int64_t seq = 64;
  int64_t micro = 2;
};

// A name the model registry knows; any other is a bad argument that names the flag and lists
// the registry's models.
inline CLI::Validator registry_model() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const models::ModelRegistry& registry = models::ModelRegistry::global();
        if (registry.contains(value)) return {};
        return fmt::format("must be a model of the registry ({}), got '{}'",
                           fmt::join(registry.names(), ", "), value);
      },
      "MODEL");
}

// --layers and --embd into `a`; `of` ends their help ("of part 2's GPT-2").
inline void add_shape_options(CLI::App& app, ModelArgs& a, const std::string& of = "") {
  count_option(app, "--layers", a.layers, "transformer blocks (n_layer)" + of);
  count_option(app, "--embd", a.embd, "width (n_embd)" + of);
}

// --model, --layers, --embd, --seq and --micro into `a`.
inline void add_model_options(CLI::App& app, ModelArgs& a) {
  value_option(app, "--model", a.model, "registry name")->check(registry_model());
  add_shape_options(app, a);
  count_option(app, "--seq", a.seq, "tokens per sequence (n_positions)");
  count_option(app, "--micro", a.micro, "sequences per micro-batch");
}

// The registry options of the flags: n_layer, n_embd and n_positions overridden.
inline models::ModelOptions model_options(const ModelArgs& a) {
  models::ModelOptions o;
  o.overrides["n_layer"] = std::to_string(a.layers);
  o.overrides["n_embd"] = std::to_string(a.embd);
  o.overrides["n_positions"] = std::to_string(a.seq);
  return o;
}

}  // namespace strata::bench
