// convert: checkpoint formats.
//
//   convert --checkpoint runs/tiny --to-hf out/tiny-hf
//
// Writes a Hugging Face GPT-2 directory (model.safetensors + config.json) that
// transformers.GPT2LMHeadModel.from_pretrained loads (models/gpt2/hf_interop.h). --checkpoint is
// a checkpoint directory or a run directory (then its latest checkpoint); the model and its
// overrides come from the checkpoint's config.yaml. Only gpt2-family models can be exported.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "models/gpt2/hf_interop.h"
#include "models/registry.h"
#include "tools/common/checkpoint.h"
#include "tools/common/train_config.h"

namespace strata::tools {
namespace {

int run(const std::string& checkpoint, const std::string& out_dir) {
  const std::string dir = resolve_checkpoint(checkpoint);
  const TrainConfig cfg = load_train_config(checkpoint_config_path(dir));
  models::ModelOptions options;
  options.seed = cfg.run.seed;
  options.overrides = cfg.model.config;
  std::unique_ptr<models::CausalLM> model =
      models::ModelRegistry::global().create(cfg.model.name, options);
  load_checkpoint(dir, *model, nullptr, cfg.model.name);
  models::export_hf_gpt2(*model, out_dir);
  std::cout << "convert: wrote " << out_dir << "/model.safetensors and " << out_dir
            << "/config.json from " << dir << std::endl;
  return 0;
}

}  // namespace
}  // namespace strata::tools

int main(int argc, char** argv) {
  std::string checkpoint, to_hf;
  CLI::App app{"Convert a Strata checkpoint to another format."};
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint directory, or run directory (then its latest checkpoint)")
      ->required();
  app.add_option("--to-hf", to_hf,
                 "write a Hugging Face GPT-2 directory (model.safetensors + config.json) here")
      ->required();
  CLI11_PARSE(app, argc, argv);
  try {
    return strata::tools::run(checkpoint, to_hf);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "convert: error: %s\n", e.what());
    return 1;
  }
}
