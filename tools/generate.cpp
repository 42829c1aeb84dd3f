// generate: sample a continuation of a prompt from a checkpoint.
//
//   generate --checkpoint runs/tiny [--prompt "Once upon" | --prompt-file FILE]
//            [--max-new-tokens 128] [--temperature 0.8] [--top-k 40] [--top-p 1] [--seed 0]
//            [--device cpu|cuda] [--kv-cache on|off] [--num-samples 1]
//            [--dtype auto|fp32|bf16|fp16] [--tf32 auto|on|off]
//
// --checkpoint is a checkpoint directory (runs/x/checkpoints/step_00000200) or a run directory
// (then the checkpoint its `latest` names). The model, its overrides and the tokenizer come from
// the checkpoint's config.yaml; tokenizer paths in it are relative to the working directory
// (Note [Train config paths]). Prints the prompt followed by the continuation; sampling stops
// early at the tokenizer's end-of-text token. GPT-2 and LLaMA decode with a KV cache unless
// --kv-cache off (Note [Cached sampling] in sampling/sampler.h).
// --prompt-file FILE takes the prompt from the file's bytes, exactly (a final newline included);
// "-" reads standard input.
// --num-samples N draws N continuations in one batch (Note [Batched sampling]); each is printed
// after a line `--- sample i of N ---`, and sample 1 is the continuation --num-samples 1 prints.
// --device cuda: the model is built and loaded on the host, then its flat units move to the GPU
// (models::move_flat_units, as `train` does: Note [Training on the GPU]); the sampler copies the
// ids to where the parameters are and reads each step's logits back.
// --dtype: the parameters and compute dtype of sampling. auto (the default) is the checkpoint's
// run.dtype on the GPU (bf16 for a run trained there: the precision it trained in, half the
// memory and about half the time of a decode step, which reads every weight) and fp32 on the CPU.
// The checkpoint's weights are cast on the host before they move.
// --tf32: whether an fp32 model's GEMMs on the GPU round their inputs to TF32 and run on the
// tensor cores (Note [TF32] in tensor/cuda.h). auto (the default) follows the checkpoint's
// run.tf32 when sampling runs fp32 on cuda, as `train`'s own samples do, and is off otherwise;
// on asks for it and is an error anywhere else (the CPU, bf16/fp16, whose GEMMs it does not touch).
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/logging.h"
#include "models/registry.h"
#include "tensor/cuda.h"
#include "runtime/checkpoint.h"
#include "sampling/sampler.h"
#include "data/tokenizer.h"
#include "runtime/train_config.h"
#include "data/unicode.h"

namespace strata::tools {
using namespace strata::data;  // this binary's library
using namespace strata::runtime;  // this binary's library
using namespace strata::sampling;  // this binary's library
namespace {

struct Args {
  std::string checkpoint;
  std::string prompt;
  std::string prompt_file;
  SampleOptions sample;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string tf32 = "auto";
  int64_t num_samples = 1;
};

int run(Args args) {
  if (!args.prompt_file.empty()) args.prompt = read_whole_file(args.prompt_file);
  if (args.device == "cuda") tensor::init_cuda(0);  // no GPU: a UserError saying so, up front
  const std::string dir = resolve_checkpoint(args.checkpoint);
  const TrainConfig cfg = load_train_config(checkpoint_config_path(dir));
  models::ModelOptions options;
  options.seed = cfg.run.seed;
  options.overrides = cfg.model.config;
  std::unique_ptr<models::CausalLM> model =
      models::ModelRegistry::global().create(cfg.model.name, options);
  load_checkpoint(dir, *model, nullptr, cfg.model.name);
  const std::string dtype = args.dtype != "auto"    ? args.dtype
                            : args.device == "cuda" ? cfg.run.dtype
                                                    : "fp32";
  const bool fp32_on_gpu = args.device == "cuda" && dtype == "fp32";
  if (args.tf32 == "on" && !fp32_on_gpu)
    user_error(
        "--tf32 on: TF32 is the GPU tensor cores' format for fp32 GEMMs, but sampling runs {} on "
        "{}; use --device cuda with --dtype fp32 (or auto on an fp32 run), or --tf32 off",
        dtype, args.device);
  const bool tf32 =
      fp32_on_gpu && (args.tf32 == "on" || (args.tf32 == "auto" && cfg.run.tf32 == "on"));
  if (args.device == "cuda") tensor::set_cuda_tf32(tf32);  // the log below reads it back
  if (dtype == "bf16" || dtype == "fp16")
    models::cast_flat_units(model->flat_units(), dtype == "bf16" ? DType::BF16 : DType::F16);
  if (args.device == "cuda") models::move_flat_units(model->flat_units(), Device::cuda(0));
  int64_t parameters = 0;
  for (const models::FlatUnit& u : model->flat_units()) parameters += u.params.numel();
  log::info("{} ({} parameters, {}{}) on {}", cfg.model.name, parameters,
            dtype_name(model->flat_units().front().params.dtype()),
            args.device == "cuda" && tensor::cuda_tf32() ? ", TF32 GEMMs" : "",
            model->flat_units().front().params.device().str());

  std::unique_ptr<Tokenizer> tok =
      make_tokenizer(cfg.data.tokenizer, cfg.data.vocab, cfg.data.merges);
  if (tok->vocab_size() > model->vocab_size())
    user_error(
        "{}: tokenizer '{}' has {} tokens but the model only {}; data.tokenizer and "
        "model.config.vocab_size disagree",
        checkpoint_config_path(dir), tok->name(), tok->vocab_size(), model->vocab_size());
  std::vector<int32_t> ids = tok->encode(args.prompt);
  if (ids.empty()) {
    if (tok->eot_token() < 0)
      user_error(
          "the '{}' tokenizer has no end-of-text token to start from: give a non-empty --prompt",
          tok->name());
    ids.push_back(tok->eot_token());  // GPT-2's convention for unconditional samples
  }
  SampleOptions o = args.sample;
  o.stop_token = tok->eot_token();
  const std::vector<std::vector<int32_t>> out = sample_batch(*model, ids, o, args.num_samples);
  // The exact bytes into a pipe or file; on a terminal, malformed bytes and control characters as
  // U+FFFD (unicode::printable), so a byte-level model's stray bytes cannot garble it.
  const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  for (size_t s = 0; s < out.size(); ++s) {
    if (out.size() > 1) std::cout << "--- sample " << s + 1 << " of " << out.size() << " ---\n";
    const std::string text = args.prompt + tok->decode(out[s]);
    std::cout << (terminal ? unicode::printable(text) : text) << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace strata::tools

int main(int argc, char** argv) {
  strata::tools::Args args;
  CLI::App app{"Sample a continuation of a prompt from a Strata checkpoint."};
  app.add_option("--checkpoint", args.checkpoint,
                 "checkpoint directory, or run directory (then its latest checkpoint)")
      ->required();
  CLI::Option* prompt =
      app.add_option("--prompt", args.prompt, "text to continue (default: start from end-of-text)");
  app.add_option("--prompt-file", args.prompt_file,
                 "read the prompt from this file's bytes ('-': standard input)")
      ->excludes(prompt);
  app.add_option("--max-new-tokens", args.sample.max_new_tokens, "tokens to generate")
      ->capture_default_str();
  app.add_option("--temperature", args.sample.temperature, "softmax temperature; 0 = greedy")
      ->capture_default_str();
  app.add_option("--top-k", args.sample.top_k, "sample among the k most likely tokens; 0 = all")
      ->capture_default_str();
  app.add_option("--top-p", args.sample.top_p,
                 "then among the fewest best tokens holding this much probability; 1 = all")
      ->capture_default_str();
  app.add_option("--seed", args.sample.seed, "sampling seed")->capture_default_str();
  app.add_option("--device", args.device, "where the model runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--dtype", args.dtype,
                 "parameter and compute dtype; auto: the run's on cuda, fp32 on the cpu")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--tf32", args.tf32,
                 "fp32 GEMMs on the GPU's tensor cores; auto: the run's run.tf32 when sampling "
                 "fp32 on cuda")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  std::string kv_cache = "on";
  app.add_option("--kv-cache", kv_cache,
                 "keep each position's keys and values (off: run the whole window every token)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--num-samples", args.num_samples, "continuations to draw, in one batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  args.sample.kv_cache = kv_cache == "on";
  try {
    return strata::tools::run(args);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "generate: error: %s\n", e.what());
    return 1;
  }
}
