// convert: checkpoint formats.
//
//   convert --checkpoint runs/tiny --to-hf out/tiny-hf
//   convert --checkpoint runs/zero3 --consolidate out/model.safetensors
//   convert --checkpoint runs/tiny --verify
//
// --verify checks every file of the checkpoint against the digests written with it (Note
// [Checkpoint digests]) without building the model, e.g. after copying a checkpoint to another
// machine; exit status 1 names the first damaged file. With --to-hf or --consolidate it runs
// first (those load through load_checkpoint, which checks the files it reads anyway).
//
// --to-hf writes a Hugging Face directory (model.safetensors + config.json) that transformers'
// from_pretrained loads with the family's architecture (GPT2LMHeadModel, LlamaForCausalLM): the
// family's registered mapping says how (Note [HF mapping] in models/hf_mapping.h); a family
// without one is an error. --consolidate writes every parameter by name into one safetensors file
// in Strata's layout (what model.safetensors of a one-process checkpoint holds), gathering the
// per-rank shards of a ZeRO-3 checkpoint (Note [Distributed checkpoints]). --checkpoint is a
// checkpoint directory or a run directory (then its latest checkpoint); the model and its
// overrides come from the checkpoint's config.yaml.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "models/hf_interop.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/train_config.h"
#include "tensor/safetensors.h"

namespace strata::tools {
using namespace strata::runtime;  // this binary's library
namespace {

int run(const std::string& checkpoint, const std::string& to_hf, const std::string& consolidate,
        bool verify) {
  const std::string dir = resolve_checkpoint(checkpoint);
  if (verify) {
    const CheckpointCheck c = verify_checkpoint(dir);
    if (c.digests)
      std::cout << fmt::format(
                       "convert: {}: {} files, {} tensors, {:.1f} MiB: every digest matches", dir,
                       c.files, c.tensors, static_cast<double>(c.bytes) / (1 << 20))
                << std::endl;
    else
      std::cout << fmt::format(
                       "convert: {}: {} files, {} tensors, {:.1f} MiB read; written before "
                       "checkpoint digests, so nothing could be checked beyond the files' "
                       "structure",
                       dir, c.files, c.tensors, static_cast<double>(c.bytes) / (1 << 20))
                << std::endl;
    if (to_hf.empty() && consolidate.empty()) return 0;
  }
  const TrainConfig cfg = load_train_config(checkpoint_config_path(dir));
  models::ModelOptions options;
  options.seed = cfg.run.seed;
  options.overrides = cfg.model.config;
  std::unique_ptr<models::CausalLM> model =
      models::ModelRegistry::global().create(cfg.model.name, options);
  load_checkpoint(dir, *model, nullptr, cfg.model.name);
  if (!to_hf.empty()) {
    models::export_hf(*model, to_hf);
    std::cout << "convert: wrote " << to_hf << "/model.safetensors and " << to_hf
              << "/config.json from " << dir << std::endl;
  }
  if (!consolidate.empty()) {
    std::vector<std::pair<std::string, tensor::Tensor>> params;
    for (const models::FlatUnit& u : model->flat_units())
      for (size_t k = 0; k < u.names.size(); ++k)
        params.emplace_back(u.names[k], u.variables[k].data());
    tensor::save_safetensors(consolidate, params,
                             {{"format", "strata"},
                              {"family", model->family()},
                              {"model_name", cfg.model.name},
                              {"layout",
                               "strata: Linear weights [out, in], padded vocabulary; not "
                               "an HF file"}});
    std::cout << "convert: wrote " << params.size() << " parameters of " << cfg.model.name << " to "
              << consolidate << " from " << dir << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace strata::tools

int main(int argc, char** argv) {
  std::string checkpoint, to_hf, consolidate;
  bool verify = false;
  CLI::App app{"Convert a Strata checkpoint to another format."};
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint directory, or run directory (then its latest checkpoint)")
      ->required();
  app.add_option("--to-hf", to_hf,
                 "write a Hugging Face directory (model.safetensors + config.json) here, for "
                 "transformers' GPT2LMHeadModel or LlamaForCausalLM");
  app.add_option("--consolidate", consolidate,
                 "write all parameters (ZeRO-3 shards gathered) into this one "
                 "safetensors file, in Strata's layout");
  app.add_flag("--verify", verify,
               "check every file against the digests written with it (Note [Checkpoint "
               "digests]), without building the model");
  CLI11_PARSE(app, argc, argv);
  if (to_hf.empty() && consolidate.empty() && !verify) {
    std::fprintf(stderr,
                 "convert: error: nothing to do; give --to-hf DIR, --consolidate FILE and/or "
                 "--verify\n");
    return 1;
  }
  try {
    return strata::tools::run(checkpoint, to_hf, consolidate, verify);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "convert: error: %s\n", e.what());
    return 1;
  }
}
