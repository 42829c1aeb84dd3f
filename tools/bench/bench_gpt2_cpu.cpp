// GPT-2 forward + backward throughput on the CPU.
//
// Reports tokens/s and the achieved GFLOP/s of a training step's model math (6 flops per
// parameter per token for the matmuls, plus attention), against a reference measured in the same
// run: the GFLOP/s of one large GEMM of the model's own shape (x @ W^T for the MLP's c_fc) through
// the same matmul op. The ratio says how close the whole step runs to the machine's GEMM speed.
// tools/bench/run_gpt2_cpu.sh adds PyTorch's CPU time for the same shapes as a second reference.
//
// usage: bench_gpt2_cpu [model=gpt2] [B=1] [T=256] [steps=3]
#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/timer.h"
#include "models/registry.h"
#include "tensor/ops.h"
#include "tools/bench/bench_cli.h"
#include "tools/bench/bench_model_args.h"

using namespace strata;
int main(int argc, char** argv) {
  std::string model_name = "gpt2";
  int64_t B = 1;
  int64_t T = 256;
  int steps = 3;
  // Note [Bench command line]; positional, as tools/bench/run_gpt2_cpu.sh passes them.
  CLI::App app{"GPT-2 forward + backward tokens/s and GFLOP/s on the CPU against one large GEMM",
               "bench_gpt2_cpu"};
  bench::value_option(app, "model", model_name, "registry name")->check(bench::registry_model());
  bench::count_option(app, "B", B, "sequences per step");
  bench::count_option(app, "T", T, "tokens per sequence");
  bench::count_option(app, "steps", steps, "timed steps");
  if (const std::optional<int> status = bench::parse_args(app, argc, argv)) return *status;

  const auto& registry = models::ModelRegistry::global();
  models::ModelOptions opts;
  opts.seed = 1;
  auto model = registry.create(model_name, opts);
  models::ModelShape shape = registry.shape(model_name, opts);
  int64_t V = model->vocab_size();

  std::vector<int64_t> ids(static_cast<size_t>(B * T)), targets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7919 + 13) % static_cast<size_t>(V));
    targets[i] = static_cast<int64_t>((i * 104729 + 7) % static_cast<size_t>(V));
  }
  tensor::Tensor x = tensor::from_ints(ids, {B, T}, DType::I32);
  tensor::Tensor y = tensor::from_ints(targets, {B, T}, DType::I32);

  std::vector<double> times;
  float loss = 0.f;
  for (int s = 0; s < steps + 1; ++s) {  // first step is warm-up
    Stopwatch watch;
    model->zero_grad();
    autograd::Variable l = model->loss(x, y);
    l.backward();
    double dt = watch.seconds();
    loss = l.item();
    if (s > 0) times.push_back(dt);
  }
  double step_s = median(times);
  double tokens = static_cast<double>(B * T);
  // Training flops: 6 per parameter per token (embedding lookups excluded from N, the tied head
  // included through wte) + attention's QK^T and PV: 12 * L * T * C per token (fwd + bwd, causal
  // counted in full as is customary for MFU).
  double n_matmul = static_cast<double>(shape.num_parameters) -
                    static_cast<double>(shape.max_seq_len * shape.n_embd);
  double flops = 6.0 * n_matmul * tokens +
                 12.0 * static_cast<double>(shape.n_layer * T * shape.n_embd) * tokens;
  double achieved = flops / step_s / 1e9;

  // Reference in the same run: one GEMM of the model's MLP shape through the same op.
  int64_t M = B * T, K = shape.n_embd, N = 4 * shape.n_embd;
  tensor::Tensor a = tensor::randn({M, K}, {1, 1}), w = tensor::randn({N, K}, {1, 2});
  tensor::Tensor out = tensor::Tensor::empty({M, N});
  std::vector<double> gemm_times;
  for (int r = 0; r < 7; ++r) {
    Stopwatch watch;
    tensor::matmul_out(a, w, out, false, true);
    if (r > 1) gemm_times.push_back(watch.seconds());
  }
  double gemm_gflops = 2.0 * M * K * N / median(gemm_times) / 1e9;

  fmt::print(
      "| model | B | T | threads | CPU | step s | tokens/s | model GFLOP/s | GEMM GFLOP/s "
      "(same run) | ratio | loss |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
  fmt::print("| {} | {} | {} | {} | {} | {:.3f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.4f} |\n",
             model_name, B, T, num_threads(), cpu_features().summary(), step_s, tokens / step_s,
             achieved, gemm_gflops, achieved / gemm_gflops, loss);
  return 0;
}
