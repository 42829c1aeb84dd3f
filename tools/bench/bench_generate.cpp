// bench_generate: decoding speed of the sampler `generate` and `train`'s samples use, with the KV
// cache (Note [Cached sampling] in sampling/sampler.h) against the same sampler running the
// whole window for every token (kv_cache off), the reference, measured in the same run on the
// same model.
//
//   bench_generate [--models gpt2-tiny,gpt2] [--device cpu|cuda] [--dtype f32|bf16]
//                  [--batch 1] [--prompt 32] [--new 32] [--reps 3]
//                  [--temperature 0] [--top-k 0] [--top-p 1]
//
// Per model: the registry builds it on the host (seed 1337, random weights: speed does not depend
// on them), cast to --dtype and moved to --device as `generate --device cuda` does. A prompt of
// --prompt random tokens is continued by --new tokens (greedily by default; --temperature, --top-k
// and --top-p draw instead, which adds the host's draw per row and token, Note [Sampling cost]
// in sampling/sampler.h), once untimed
// (warm-up: the GPU's cuBLASLt heuristics and cuDNN plans, the caching allocator's segments) and
// then --reps times per mode, alternating; the median is reported. sample() reads every token's
// logits back to the host, so a run's time covers its GPU work. Tokens/s counts the new tokens
// only, of every row: --batch B (a comma-separated list gives a row each) draws B samples in one
// batch (Note [Batched sampling]), B x --new tokens per run. The table's last column says whether
// both modes produced the same tokens (they draw from logits equal up to rounding, Note [KV
// cache]). The cache saves the recomputation of every earlier position: per token the uncached
// sampler runs prompt + i positions, the cached one a single position, so the ratio grows with the
// sequence length; it is one position's attention over the held keys instead of the whole
// causal attention, and one row's matmuls instead of prompt + i rows'.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "models/registry.h"
#include "sampling/sampler.h"
#include "tensor/cuda.h"
#include "tools/bench/bench_cli.h"

namespace strata {
namespace {

struct Options {
  std::string models = "gpt2-tiny";
  std::string device = "cpu";
  std::string dtype = "f32";
  std::string batch = "1";
  int64_t prompt = 32;
  int64_t new_tokens = 32;
  int reps = 3;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Options& o) {
  const Device device = o.device == "cuda" ? Device::cuda(0) : Device::cpu();
  if (device.is_cuda()) tensor::init_cuda(0);  // no GPU: a UserError saying so, up front
  const DType dtype = o.dtype == "bf16" ? DType::BF16 : DType::F32;
  STRATA_USER_CHECK(o.prompt >= 1 && o.new_tokens >= 1 && o.reps >= 1,
                    "--prompt, --new and --reps must be at least 1");
  std::vector<int64_t> batches;
  std::stringstream blist(o.batch);
  for (std::string b; std::getline(blist, b, ',');) {
    char* end = nullptr;
    const long long v = std::strtoll(b.c_str(), &end, 10);
    STRATA_USER_CHECK(!b.empty() && *end == '\0' && v >= 1,
                      "--batch takes positive integers separated by commas, got '{}'", o.batch);
    batches.push_back(v);
  }
  STRATA_USER_CHECK(!batches.empty(), "--batch needs at least one size");
  if (o.temperature == 0.0)
    fmt::print("Sampling: greedy.\n\n");
  else
    fmt::print("Sampling: temperature {}, top-k {}, top-p {}.\n\n", o.temperature, o.top_k,
               o.top_p);
  fmt::print(
      "| model | device | dtype | batch | prompt | new | cached tok/s | uncached tok/s | speedup | "
      "same tokens |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::stringstream list(o.models);
  for (std::string name; std::getline(list, name, ',');) {
    models::ModelOptions mo;
    mo.seed = 1337;
    std::unique_ptr<models::CausalLM> model = models::ModelRegistry::global().create(name, mo);
    STRATA_USER_CHECK(o.prompt + o.new_tokens <= model->max_seq_len(),
                      "--prompt {} + --new {} pass {}'s context of {} positions", o.prompt,
                      o.new_tokens, name, model->max_seq_len());
    if (dtype != DType::F32) models::cast_flat_units(model->flat_units(), dtype);
    if (device.is_cuda()) models::move_flat_units(model->flat_units(), device);
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < o.prompt; ++i)
      prompt.push_back(static_cast<int32_t>(philox4x32({7, 0}, static_cast<uint64_t>(i))[0] %
                                            static_cast<uint32_t>(model->vocab_size())));
    sampling::SampleOptions so;
    so.max_new_tokens = o.new_tokens;
    so.temperature = o.temperature;
    so.top_k = o.top_k;
    so.top_p = o.top_p;
    for (const int64_t batch : batches) {
      using Samples = std::vector<std::vector<int32_t>>;
      auto timed = [&](bool cached, Samples* tokens) {
        sampling::SampleOptions s = so;
        s.kv_cache = cached;
        const auto t0 = std::chrono::steady_clock::now();
        *tokens = sampling::sample_batch(*model, prompt, s, batch);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      Samples with, without;
      timed(true, &with);  // warm-up
      timed(false, &without);
      std::vector<double> tc, tu;
      for (int r = 0; r < o.reps; ++r) {
        tc.push_back(timed(true, &with));
        tu.push_back(timed(false, &without));
      }
      const auto tokens = static_cast<double>(batch * o.new_tokens);
      const double c = tokens / median(tc);
      const double u = tokens / median(tu);
      fmt::print("| {} | {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {:.2f}x | {} |\n", name,
                 device.str(), o.dtype, batch, o.prompt, o.new_tokens, c, u, c / u,
                 with == without ? "yes" : "no");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::Options o;
  CLI::App app{"KV-cached sampling against whole-window sampling, tokens per second.",
               "bench_generate"};
  app.add_option("--models", o.models, "comma-separated registry names")->capture_default_str();
  app.add_option("--device", o.device, "where the model runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "parameter dtype")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "samples per run, drawn in one batch (comma-separated: each)")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt tokens")->capture_default_str();
  app.add_option("--new", o.new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--reps", o.reps, "timed runs per mode (median)")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", o.top_k, "0 = no cut")->capture_default_str();
  app.add_option("--top-p", o.top_p, "1 = no cut")->capture_default_str();
  if (const std::optional<int> status = strata::bench::parse_args(app, argc, argv)) return *status;
  try {
    return strata::run(o);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "bench_generate: error: %s\n", e.what());
    return 1;
  }
}
