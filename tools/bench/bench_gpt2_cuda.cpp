// GPT-2 training throughput on one GPU: the step `train` runs (Note [Training on the GPU] in
// runtime/trainer.h), timed, for gpt2 / gpt2-medium / gpt2-large / gpt2-xl at T = 1024.
//
// Per model, as Trainer builds it: the registry makes the model on the host (seed 1337; the
// presets' dropout 0 and no activation checkpointing), models::move_flat_units puts its flat
// units on the GPU, and a parallel::Engine over a world of one (the self communicator, ZeRO
// stage 0) owns it with param_dtype BF16 (Note [Mixed precision] in parallel/engine.h: bf16
// parameters and gradients, fp32 masters and moments) or F32. One step is Trainer::train_step
// with one micro-batch (Engine::train_step): ids and targets copied from the host, the loss
// forward, engine.backward, the loss read, engine.step (global gradient norm, clipping to 1.0, the
// fused AdamW kernel with lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices). Tokens
// are random (fixed seed); targets are the ids shifted by one, as the data loader gives them.
//
// `--warmup` steps (cuBLASLt heuristics, cuDNN plans, the caching allocator's segments) are not
// timed. Each of the `--steps` timed steps ends with a device-to-host copy of one parameter
// element, which waits for the compute stream (AdamW runs there too), so a step's time covers all
// of its GPU work; the median is reported. MFU is training_flops_per_token (Note [MFU]), the
// count `train` logs, over --peak-tflops (default: the device's dense peak for --dtype, Note [GPU
// peaks] in runtime/device_peaks.h: 989.4 TFLOP/s bf16 on an H100 SXM; the table's header
// line names the peak and where it comes from). Peak GPU memory is
// MemoryStats' tier gpu peak during the timed steps: bytes handed out, like
// torch.cuda.max_memory_allocated (the allocator's cached segments are not counted).
//
// --fill finds the largest power-of-two micro-batch whose step fits, starting from --B or the
// model's default: doubled while a step fits, halved while it does not. An out-of-memory is the
// caching allocator's UserError (Note [GPU caching allocator]); after one the model and engine
// are dropped and built again, since the failed step may have stopped anywhere inside them.
//
// STRATA_FUSED_OPS=off (Note [Fused ops in models]) times the unfused compositions instead of the
// fused residual norms and GPT-2's fused MLP; the impl column then says strata-unfused.
// --recompute-gelu sets the GPT-2 config key recompute_gelu (Note [GELU recompute]): with --fill
// it shows what the freed activations buy (impl strata+recompute-gelu). --matmul-tune times
// cuBLASLt's candidate algorithms for each GEMM problem and keeps the fastest (Note [cuBLASLt
// tuning]; `train`'s run.matmul_tuning: on); the first (untimed) step pays for it, and the impl
// column says +tuned-matmuls. --tf32 (with --dtype fp32) runs the f32 matmuls on TF32 (Note
// [TF32] in tensor/cuda.h; `train`'s run.tf32: on): MFU counts against the TF32 peak, and the
// dtype column says fp32+tf32 (run_gpt2_cuda.sh --tf32 gives the PyTorch reference allow_tf32).
//
// In a STRATA_CUDA_EMULATION build run with STRATA_CUDA_EMU_DRY_RUN=1 (Note [Emulator dry run] in
// cuda_emu/control.h; tools/bench/run_host_overhead.sh) the device does no work, so a step's
// time is the host's side of it: the work the host does to enqueue the step, the emulated runtime
// calls included. The table then has other columns: host ms per step beside the GPU time the step
// would take at 50% MFU (its FLOPs over half of --peak-tflops), so host share above 100% would
// mean the host cannot keep that GPU busy; and per step the kernels launched, cuBLASLt matmuls,
// cuDNN graph executions and the host's waits for an idle device (the bench's own end-of-step copy
// is one of them). --fill and peak GPU memory work as on a GPU, against the emulated device's
// capacity (STRATA_CUDA_EMU_MEMORY_MIB).
//
// --profile N runs N more steps per model after the timed ones with the CUDA op profiler on
// (Note [CUDA op profiler] in tensor/cuda/profiler.cpp) and prints, after the main table, one
// table per model: each backend op's calls, device ms and share of the step, with TFLOP/s for the
// GEMMs and attention and GB/s for all, and each op's roofline bound (Note [Roofline bound] in
// runtime/op_profile.h) at --peak-tflops and --peak-gbps (default: the device's memory
// bandwidth); under the table the step's bound and the MFU it caps. The profiled steps are not
// the timed ones. In the dry run the bounds are what the step's kernels would need on an H100
// SXM at its peaks (the emulated device reports an H100 SXM's), without any GPU.
//
// --offload steps with ZeRO-Offload's host placement (Note [Offloaded step] in
// parallel/host_placement.h) at ZeRO-2: the GPU keeps the bf16 parameters, the host the
// gradients (streamed there during backward), the fp32 masters, the moments and the AdamW step;
// the engine takes the masters on the host before the model moves (Note [Offload construction] in
// parallel/engine.h). --dpu N adds the delayed parameter update after N plain updates. Peak GPU
// memory and --fill then show what leaving the optimizer states on the host buys.
//
// --device cpu runs the same program on the host (no --fill): a smoke test of it on a machine
// without a GPU, with a small model (--models gpt2-tiny --T 64); its numbers mean nothing.
//
// tools/bench/reference/gpt2_cuda.py runs the same step in PyTorch (eager and torch.compile) and
// prints the same columns; tools/bench/run_gpt2_cuda.sh runs both and prints the ratios.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "comm/world.h"
#include "core/error.h"
#include "core/timer.h"
#include "models/nn/fused_ops.h"
#include "models/registry.h"
#include "offload/gpu_allocator.h"
#include "offload/memory_stats.h"
#include "optim/adamw.h"
#include "parallel/engine.h"
#include "runtime/device_peaks.h"
#include "runtime/op_profile.h"
#include "runtime/trainer.h"
#include "tensor/cuda.h"
#include "tensor/storage.h"
#include "tools/bench/bench_cli.h"
#include "tools/bench/emulator_stats.h"

using namespace strata;

namespace {

using bench::device_counts;
using bench::DeviceCounts;
using bench::dry_run;
using bench::print_launches;
using bench::read_sites;
using bench::reset_sites;
using bench::SiteRow;

constexpr double kLr = 6e-4;
constexpr double kGradClip = 1.0;

struct Options {
  std::string dtype = "bf16";
  bool recompute_gelu = false;  // Note [GELU recompute]
  bool matmul_tune = false;     // Note [cuBLASLt tuning]
  bool tf32 = false;            // Note [TF32]: f32 matmuls on TF32 (--dtype fp32 only)
  // The dtype column: --dtype, or fp32+tf32.
  std::string dtype_label() const { return tf32 ? "fp32+tf32" : dtype; }
  double peak_tflops = 0.0;  // 0: the device's (Note [GPU peaks])
  double peak_gbps = 0.0;    // 0: the device's
  int warmup = 3;
  int steps = 10;
  std::vector<std::string> models = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
  int64_t batch = 0;  // 0: default_batch(model)
  int64_t seq_len = 1024;
  bool fill = false;
  uint64_t seed = 1337;
  bool on_cpu = false;    // --device cpu: a smoke test of this program where there is no GPU
  int profile = 0;        // --profile N: N more steps timed per op (Note [CUDA op profiler])
  bool launches = false;  // --launches: the emulator's launch sites of the timed steps
  bool offload =
      false;  // --offload: ZeRO-Offload (ZeRO-2 over one rank, the optimizer on the host)
  int64_t dpu_start = -1;  // --dpu N: with --offload, the delayed update after N plain updates

  Device device() const { return on_cpu ? Device::cpu() : Device::cuda(0); }
};

// The micro-batch when neither --B nor --fill says otherwise: the earlier benchmark's choice,
// which leaves room on an 80 GB GPU for a step without activation checkpointing.
int64_t default_batch(const std::string& model) {
  if (model == "gpt2") return 16;
  if (model == "gpt2-medium") return 8;
  if (model == "gpt2-large") return 4;
  if (model == "gpt2-xl") return 2;
  return 8;
}

bool is_oom(const UserError& e) {
  return std::string(e.what()).find("out of GPU memory") != std::string::npos;
}

// Returns the caching allocator's free segments to the driver (after an OOM, between models).
void release_gpu_cache(Device device) {
  if (!device.is_cuda()) return;
  if (auto* a = dynamic_cast<offload::GpuCachingAllocator*>(&tensor::allocator_for(device)))
    a->release_cache();
}

// Host batches as the data loader makes them: I32 [B, T] ids and the next tokens as targets.
struct Tokens {
  tensor::Tensor ids, targets;
};

Tokens random_tokens(int64_t batch, int64_t seq_len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<int64_t> ids(static_cast<size_t>(batch * seq_len)), targets(ids.size());
  for (int64_t b = 0; b < batch; ++b) {
    int64_t prev = pick(rng);
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t next = pick(rng);
      ids[static_cast<size_t>(b * seq_len + t)] = prev;
      targets[static_cast<size_t>(b * seq_len + t)] = next;
      prev = next;
    }
  }
  return {tensor::from_ints(ids, {batch, seq_len}, DType::I32),
          tensor::from_ints(targets, {batch, seq_len}, DType::I32)};
}

// One model on the GPU inside its Engine, as Trainer's constructor builds it.
class Bench {
 public:
  Bench(const std::string& name, const Options& o, std::shared_ptr<comm::Communicator> world)
      : device_(o.device()) {
    models::ModelOptions mo;
    mo.seed = o.seed;
    if (o.recompute_gelu) mo.overrides["recompute_gelu"] = "true";
    model_ = models::ModelRegistry::global().create(name, mo);
    // With offload the Engine moves the units once the masters are on the host (Note [Offload
    // construction] in parallel/engine.h), as `train` does.
    if (!o.offload) models::move_flat_units(model_->flat_units(), device_);
    optim::AdamWConfig ac;
    ac.lr = kLr;
    ac.beta1 = 0.9;
    ac.beta2 = 0.95;
    ac.eps = 1e-8;
    ac.weight_decay = 0.1;
    parallel::ZeroConfig zero;
    if (o.offload) {
      // One rank owns everything: the step is stage 0's. Stage 2 streams the gradients to the
      // host during backward (Note [Gradients streamed to the host] in parallel/grad_buckets.h).
      zero.stage = 2;
      zero.offload_optimizer.enabled = true;
      zero.offload_optimizer.delayed_param_update = o.dpu_start >= 0;
      zero.offload_optimizer.delayed_param_update_start = std::max<int64_t>(o.dpu_start, 0);
    }
    engine_ = std::make_unique<parallel::Engine>(
        *model_, std::move(world), zero,
        [ac](std::vector<optim::ParamGroup> groups) {
          return std::make_unique<optim::AdamW>(std::move(groups), ac);
        },
        o.dtype == "bf16" ? DType::BF16 : DType::F32, device_);
  }

  int64_t vocab_size() const { return model_->vocab_size(); }

  // Trainer::train_step with one micro-batch and a constant learning rate (Note [Train step] in
  // parallel/engine.h): the loss's forward writes its gradient (Note [Fused cross-entropy
  // gradient] in autograd/functions_nn.cpp) and is read after the backward.
  float step(const Tokens& x) {
    parallel::TrainStepInputs in;
    in.batch = [&](int64_t) {
      return parallel::MicroBatch{x.ids.to(device_), x.targets.to(device_)};
    };
    in.lr = kLr;
    in.max_norm = kGradClip;
    return engine_->train_step(in).losses.front();
  }

  // A copy to the host waits for everything queued on the compute stream (Note [CUDA streams]).
  void synchronize() const {
    model_->flat_units().front().params.narrow(0, 0, 1).to(Device::cpu());
  }

 private:
  Device device_;
  std::unique_ptr<models::CausalLM> model_;  // declared first: the engine goes first
  std::unique_ptr<parallel::Engine> engine_;
};

struct Row {
  int64_t batch = 0;
  double step_s = 0.0;
  float loss = 0.f;
  int64_t peak_bytes = 0;
  DeviceCounts per_step;  // over the timed steps, divided by their number (emulator only)
  std::vector<tensor::CudaOpTime> ops;  // --profile: totals over the profiled steps
  std::vector<SiteRow> sites;           // --launches: totals over the timed steps
  double profiled_s = 0.0;              // their wall time (host clock), all together
};

Row measure(Bench& bench, int64_t batch, const Options& o) {
  const Tokens x = random_tokens(batch, o.seq_len, bench.vocab_size(), o.seed);
  for (int i = 0; i < o.warmup; ++i) bench.step(x);
  bench.synchronize();
  auto& stats = offload::MemoryStats::global();
  stats.reset_peaks();
  std::vector<double> times;
  Row row;
  row.batch = batch;
  const DeviceCounts before = device_counts();
  reset_sites();
  for (int i = 0; i < o.steps; ++i) {
    Stopwatch watch;
    row.loss = bench.step(x);
    bench.synchronize();
    times.push_back(watch.seconds());
  }
  const DeviceCounts after = device_counts();
  if (o.launches) row.sites = read_sites();
  const auto steps = static_cast<uint64_t>(o.steps);
  row.per_step = {(after.launches - before.launches) / steps,
                  (after.matmuls - before.matmuls) / steps,
                  (after.graph_runs - before.graph_runs) / steps,
                  (after.idle_waits - before.idle_waits) / steps};
  row.step_s = median(times);
  row.peak_bytes = stats.tier_usage(o.on_cpu ? offload::Tier::Host : offload::Tier::Gpu).peak;
  if (o.profile > 0) {
    // Separate steps, so the profiler's events and its occasional waits touch no timed step.
    tensor::cuda_profile_start();
    Stopwatch watch;
    for (int i = 0; i < o.profile; ++i) bench.step(x);
    bench.synchronize();
    row.profiled_s = watch.seconds();
    row.ops = tensor::cuda_profile_stop();
  }
  return row;
}

// --fill: true when one step at `batch` fits. After an OOM `bench` is rebuilt.
bool step_fits(std::unique_ptr<Bench>& bench, int64_t batch, const std::string& name,
               const Options& o, const std::shared_ptr<comm::Communicator>& world) {
  try {
    bench->step(random_tokens(batch, o.seq_len, bench->vocab_size(), o.seed));
    bench->synchronize();
    fmt::print(stderr, "{}: B = {} fits\n", name, batch);
    return true;
  } catch (const UserError& e) {
    if (!is_oom(e)) throw;
    fmt::print(stderr, "{}: B = {} does not fit ({})\n", name, batch, e.what());
  }
  bench.reset();
  release_gpu_cache(o.device());
  bench = std::make_unique<Bench>(name, o, world);
  return false;
}

Row run_model(const std::string& name, const Options& o,
              const std::shared_ptr<comm::Communicator>& world) {
  auto bench = std::make_unique<Bench>(name, o, world);
  int64_t batch = o.batch > 0 ? o.batch : default_batch(name);
  if (o.fill) {
    constexpr int64_t kMaxBatch = 4096;
    int64_t fits = 0, fails = 0;  // the largest B known to fit, the smallest known not to
    for (;;) {
      if (step_fits(bench, batch, name, o, world))
        fits = batch;
      else
        fails = batch;
      if (fits > 0 && ((fails > 0 && fits * 2 >= fails) || fits >= kMaxBatch)) break;
      if (fits == 0 && fails == 1)
        user_error("out of GPU memory: {} does not fit even at B = 1", name);
      batch = fits > 0 ? fits * 2 : fails / 2;
    }
    batch = fits;
  }
  return measure(*bench, batch, o);
}

void print_header() {
  if (dry_run()) {
    fmt::print(
        "| impl | model | params | B | T | dtype | host ms/step | GPU ms/step at 50% MFU | host "
        "share | kernels/step | cuBLASLt/step | cuDNN/step | idle waits/step | peak GPU mem |\n");
    fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    return;
  }
  fmt::print(
      "| impl | model | params | B | T | dtype | tokens/s | step ms | MFU | peak GPU mem | "
      "loss |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
}

// --profile: where a step's device time goes, one table per model (Note [CUDA op profiler]).
void print_profile(const std::string& name, const Row& r, const Options& o,
                   double model_flops_per_step) {
  fmt::print("\nDevice time per op, {} at B = {}, T = {}, {}: {} profiled steps{}\n\n", name,
             r.batch, o.seq_len, o.dtype_label(), o.profile,
             dry_run() ? " (dry run: the times mean nothing, the calls, sizes and bounds do)" : "");
  const runtime::PeakRates peaks{o.peak_tflops, o.peak_gbps};
  fmt::print("{}", runtime::op_time_table(r.ops, o.profile, r.profiled_s * 1e3 / o.profile, peaks));
  const double bound = runtime::bound_ms(r.ops, o.profile, peaks);
  if (bound > 0)
    fmt::print(
        "\nBound (Note [Roofline bound]): at {:.1f} TFLOP/s and {:.0f} GB/s these ops need at "
        "least {:.4g} ms per step, which caps MFU at {:.1f}%.\n",
        o.peak_tflops, o.peak_gbps, bound,
        100.0 * model_flops_per_step / (bound * 1e-3 * o.peak_tflops * 1e12));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Times the GPU training step of `train` (registry model, Engine, bf16 mixed precision, "
      "fused AdamW, grad clipping) for GPT-2 124M-1558M and prints a markdown table.",
      "bench_gpt2_cuda"};
  app.add_option("--dtype", o.dtype, "bf16 (bf16 params/grads, fp32 masters) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--models", o.models, "registry names, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--B", o.batch, "micro-batch (default: 16/8/4/2 for 124M/350M/774M/1558M)");
  app.add_flag("--fill", o.fill,
               "use the largest power-of-two micro-batch that fits (starting from --B or the "
               "default)");
  app.add_flag("--recompute-gelu", o.recompute_gelu,
               "the GPT-2 config key recompute_gelu: the MLP keeps only the GELU input (less "
               "activation memory, one more pass in backward); impl says strata+recompute-gelu");
  app.add_flag("--matmul-tune", o.matmul_tune,
               "time cuBLASLt's candidate algorithms per GEMM problem in the first step and keep "
               "the fastest (run.matmul_tuning: on); impl says +tuned-matmuls");
  app.add_flag(
      "--tf32", o.tf32,
      "with --dtype fp32: the f32 matmuls round their inputs to TF32 and run on the "
      "tensor cores (run.tf32: on); MFU against the TF32 peak; the dtype column says fp32+tf32");
  app.add_flag("--offload", o.offload,
               "ZeRO-Offload (zero_optimization.offload_optimizer.device: cpu): fp32 masters, "
               "moments and the AdamW step on the host; impl says +offload");
  app.add_option("--dpu", o.dpu_start,
                 "with --offload: the delayed parameter update after this many plain updates "
                 "(delayed_param_update_start); impl says +offload+dpu");
  app.add_option("--T", o.seq_len, "sequence length")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps (median reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops,
                 "dense peak for MFU and the profile's bound; 0: the device's for --dtype "
                 "(989.4 on an H100 SXM in bf16)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--peak-gbps", o.peak_gbps,
                 "memory bandwidth for the profile's bound, GB/s; 0: the device's (3352 on an "
                 "H100 SXM)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "model init and token seed")->capture_default_str();
  app.add_option("--profile", o.profile,
                 "after the timed steps, N more with every op's device time recorded; prints "
                 "one table per model of time, TFLOP/s and GB/s by op")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_flag("--launches", o.launches,
               "emulator builds only (tools/bench/run_host_overhead.sh): after each model, the "
               "timed steps' kernel launches by site with their blocks and threads");
  std::string device = "cuda";
  app.add_option("--device", device,
                 "cpu only smoke-tests this program where there is no GPU (e.g. --models "
                 "gpt2-tiny --T 64 --B 2)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  if (const std::optional<int> status = strata::bench::parse_args(app, argc, argv)) return *status;
  o.on_cpu = device == "cpu";

  try {
    const auto& registry = models::ModelRegistry::global();
    std::vector<models::ModelShape> shapes;
    for (const std::string& name : o.models) {
      shapes.push_back(registry.shape(name));  // unknown names: a UserError listing the known
      if (o.seq_len < 1 || o.seq_len > shapes.back().max_seq_len)
        user_error("--T {} is outside [1, {}], the context of model '{}'", o.seq_len,
                   shapes.back().max_seq_len, name);
    }
    if (o.batch < 0) user_error("--B must be positive, got {}", o.batch);
    if (o.fill && o.on_cpu) user_error("--fill needs the GPU (it probes for out-of-memory)");
    if (o.dpu_start >= 0 && !o.offload) user_error("--dpu {} needs --offload", o.dpu_start);
    if (o.profile > 0 && o.on_cpu) user_error("--profile times GPU ops; it needs --device cuda");
#if !defined(STRATA_CUDA_EMULATION)
    if (o.launches)
      user_error(
          "--launches reads the CUDA emulator's launch counts: use a build with "
          "-DSTRATA_CUDA_EMULATION=ON (tools/bench/run_host_overhead.sh)");
#endif
    if (o.launches && o.on_cpu) user_error("--launches counts GPU kernels; it needs --device cuda");
    if (o.matmul_tune && o.on_cpu) user_error("--matmul-tune times GPU GEMMs; it needs the GPU");
    if (o.tf32 && o.dtype != "fp32")
      user_error("--tf32 changes fp32 matmuls only; add --dtype fp32 (this run's are {})", o.dtype);
    if (o.tf32 && o.on_cpu) user_error("--tf32 is the GPU tensor cores' format; it needs the GPU");
    if (!o.on_cpu) {
      tensor::init_cuda(0);  // no GPU or no CUDA build: a UserError saying so
      // Note [GPU peaks]: what MFU and the profile's bound count against.
      const runtime::DevicePeaks peaks = runtime::device_peaks(tensor::cuda_device_facts(0));
      const bool own_flops = o.peak_tflops == 0;
      if (own_flops)
        o.peak_tflops = peaks.tflops_for(o.dtype == "bf16" ? DType::BF16 : DType::F32, o.tf32);
      if (o.peak_gbps == 0) o.peak_gbps = peaks.memory_gbps;
      if (o.peak_tflops == 0)
        user_error("this GPU's peak FLOP/s is {}; give --peak-tflops", peaks.source);
      // A list item before the table (run_gpt2_cuda.sh hands the FLOP/s to the reference).
      fmt::print("- peaks: {:.1f} TFLOP/s {} ({}), {:.0f} GB/s\n\n", o.peak_tflops, o.dtype_label(),
                 own_flops ? peaks.source : "--peak-tflops", o.peak_gbps);
      if (o.matmul_tune) tensor::set_cuda_matmul_tuning(true);
      tensor::set_cuda_tf32(o.tf32);
    }
    auto world = comm::init_world("self", o.device(), std::chrono::seconds(60));
    // Note [Fused ops in models]: STRATA_FUSED_OPS=off measures the unfused compositions.
    const std::string impl =
        std::string(models::nn::fused_ops_enabled() ? "strata" : "strata-unfused") +
        (o.recompute_gelu ? "+recompute-gelu" : "") + (o.matmul_tune ? "+tuned-matmuls" : "") +
        (o.offload ? (o.dpu_start >= 0 ? "+offload+dpu" : "+offload") : "") +
        (dry_run() ? " (dry run)" : "");
    if (dry_run())
      fmt::print(stderr,
                 "bench_gpt2_cuda: the emulator's dry run: the device does no work, so step "
                 "times are the host's alone and losses are meaningless\n");
    print_header();
    std::vector<std::pair<std::string, Row>> profiled;
    for (size_t i = 0; i < o.models.size(); ++i) {
      const std::string& name = o.models[i];
      const double params = static_cast<double>(shapes[i].num_parameters) / 1e6;
      try {
        const Row r = run_model(name, o, world);
        if (o.profile > 0 || o.launches) profiled.emplace_back(name, r);
        const double tokens_s = static_cast<double>(r.batch * o.seq_len) / r.step_s;
        const double flops_per_token = runtime::training_flops_per_token(shapes[i], o.seq_len);
        // --device cpu has no peak unless --peak-tflops gives one: MFU "-".
        const std::string mfu = o.peak_tflops > 0
                                    ? fmt::format("{:.1f}%", 100.0 * flops_per_token * tokens_s /
                                                                 (o.peak_tflops * 1e12))
                                    : std::string("-");
        const double gib = static_cast<double>(r.peak_bytes) / (1024.0 * 1024.0 * 1024.0);
        if (dry_run()) {
          const double gpu_s = flops_per_token * static_cast<double>(r.batch * o.seq_len) /
                               (0.5 * o.peak_tflops * 1e12);
          fmt::print(
              "| {} | {} | {:.0f}M | {} | {} | {} | {:.2f} | {:.1f} | {:.2f}% | {} | {} | {} | {} "
              "| {:.1f} GiB |\n",
              impl, name, params, r.batch, o.seq_len, o.dtype_label(), r.step_s * 1e3, gpu_s * 1e3,
              100.0 * r.step_s / gpu_s, r.per_step.launches, r.per_step.matmuls,
              r.per_step.graph_runs, r.per_step.idle_waits, gib);
        } else {
          fmt::print(
              "| {} | {} | {:.0f}M | {} | {} | {} | {:.0f} | {:.1f} | {} | {:.1f} GiB "
              "| {:.4f} |\n",
              impl, name, params, r.batch, o.seq_len, o.dtype_label(), tokens_s, r.step_s * 1e3,
              mfu, gib, r.loss);
        }
      } catch (const UserError& e) {
        if (!is_oom(e)) throw;
        fmt::print(stderr, "{}: {}\n", name, e.what());
        fmt::print("| {} | {} | {:.0f}M | {} | {} | {} | OOM |{}\n", impl, name, params,
                   o.batch > 0 ? o.batch : default_batch(name), o.seq_len, o.dtype_label(),
                   dry_run() ? " - | - | - | - | - | - | - |" : " - | - | - | - |");
      }
      std::fflush(stdout);
      release_gpu_cache(o.device());
    }
    for (const auto& [name, r] : profiled) {
      const auto& shape = registry.shape(name);
      if (o.profile > 0)
        print_profile(name, r, o,
                      runtime::training_flops_per_token(shape, o.seq_len) *
                          static_cast<double>(r.batch * o.seq_len));
      if (o.launches) print_launches(name, r.sites, r.batch, o.seq_len, o.dtype_label(), o.steps);
    }
    comm::finalize_world();
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpt2_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
