// bench_zero_infinity: the ZeRO-3 training step with the parameter partitions offloaded
// (zero_optimization.offload_param: host memory, NVMe with read-ahead, NVMe without), against
// the same step with the partitions in memory, measured in the same run, on one CPU process (the
// host plays the device).
//
//   bench_zero_infinity [--model gpt2-tiny] [--layers 8] [--embd 256] [--micro 4] [--seq 128]
//                       [--steps 6] [--rounds 3] [--nvme-path /tmp] [--buffer-count 5]
//
// Each placement builds the same model (same seed) and takes --steps training steps after one
// warm-up step (the first records the gather order the read-ahead follows); the table gives the
// median step time, its ratio to the in-memory step (the faster of the in-memory rows with and
// without allgather prefetch), how long each step waited for parameter reads, writes and
// buffers (param_wait, the tier's measurement), and the parameters' resident peak (Category::Param
// on the host and pinned tiers) beside the bytes on NVMe; a second table splits the NVMe rows'
// wait (ParamTier::waits(): reads still in flight, demand reads, stores waiting for a buffer) and
// counts their reads per step. The placements run in turn, --rounds
// times (A B C D A B C D ...), and each keeps its fastest median, so a noisy neighbour hurts one
// placement less. On a CPU run set OMP_WAIT_POLICY=passive: OpenMP threads spinning between
// parallel regions take the cores the NVMe engine's threads need (docs/offload.md). Issue 55's
// target: NVMe with read-ahead at most 1.5x the in-memory step.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/timer.h"
#include "models/registry.h"
#include "offload/memory_stats.h"
#include "optim/adamw.h"
#include "parallel/engine.h"
#include "tools/bench/bench_cli.h"
#include "tools/bench/bench_model_args.h"

namespace {

using namespace strata;

struct Args : bench::ModelArgs {
  Args() {
    layers = 8;
    micro = 4;
    seq = 128;
  }
  int steps = 6;
  int rounds = 3;
  std::string nvme_path = "/tmp";
  int64_t buffer_count = 5;
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"ZeRO-3 step time with the parameter partitions in memory, on the host or on NVMe",
               "bench_zero_infinity"};
  bench::add_model_options(app, a);
  bench::count_option(app, "--steps", a.steps, "timed steps per placement (median)");
  bench::count_option(app, "--rounds", a.rounds, "rounds over the placements (fastest kept)");
  bench::value_option(app, "--nvme-path", a.nvme_path, "directory of the NVMe swap files");
  bench::count_option(app, "--buffer-count", a.buffer_count,
                      "offload_param.buffer_count (partitions resident at once)");
  return bench::parse_args(app, argc, argv);
}

struct Placement {
  const char* name;
  parallel::OffloadParamConfig::Device device;
  bool prefetch;
};

struct Result {
  double step_s = 1e30;
  double wait_ms = 0;
  parallel::ParamTier::Waits waits;  // over the timed steps
  double reads = 0;                  // NVMe reads per step
  int64_t resident = 0;              // Category::Param peak, host + pinned
  int64_t nvme = 0;
};

Result run(const Args& a, const Placement& p, const models::ModelOptions& options,
           int64_t vocab_size) {
  std::unique_ptr<models::CausalLM> model =
      models::ModelRegistry::global().create(a.model, options);
  parallel::ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 1000;
  z.stage3_prefetch_bucket_size = p.prefetch ? 50'000'000 : 0;
  z.offload_param.device = p.device;
  z.offload_param.nvme_path = a.nvme_path;
  z.offload_param.buffer_count = a.buffer_count;
  parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                          [](std::vector<optim::ParamGroup> groups) {
                            return std::make_unique<optim::AdamW>(std::move(groups),
                                                                  optim::AdamWConfig{});
                          });
  const int64_t vocab = vocab_size;
  parallel::TrainStepInputs in;
  in.micro_batches = 1;
  in.lr = 1e-4;
  in.batch = [&a, vocab](int64_t i) {
    std::mt19937_64 rng(static_cast<uint64_t>(i));
    std::vector<int64_t> ids(static_cast<size_t>(a.micro * a.seq)), targets(ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      ids[k] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
      targets[k] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    }
    return parallel::MicroBatch{tensor::from_ints(ids, {a.micro, a.seq}),
                                tensor::from_ints(targets, {a.micro, a.seq})};
  };
  engine.train_step(in);  // records the gather order
  offload::MemoryStats& stats = offload::MemoryStats::global();
  stats.reset_peaks();
  const parallel::ParamTier* tier = engine.param_tier();
  const double wait0 = tier ? tier->wait_seconds() : 0.0;
  const parallel::ParamTier::Waits waits0 = tier ? tier->waits() : parallel::ParamTier::Waits{};
  const int64_t reads0 = tier ? tier->reads() : 0;
  std::vector<double> times;
  for (int s = 0; s < a.steps; ++s) {
    Stopwatch w;
    engine.train_step(in);
    times.push_back(w.seconds());
  }
  Result r;
  r.step_s = median(times);
  r.wait_ms = tier ? (tier->wait_seconds() - wait0) * 1e3 / a.steps : 0.0;
  if (tier != nullptr) {
    const parallel::ParamTier::Waits& w = tier->waits();
    r.waits.late_s = (w.late_s - waits0.late_s) / a.steps;
    r.waits.miss_s = (w.miss_s - waits0.miss_s) / a.steps;
    r.waits.store_s = (w.store_s - waits0.store_s) / a.steps;
    r.waits.late = (w.late - waits0.late) / a.steps;
    r.waits.misses = (w.misses - waits0.misses) / a.steps;
    r.reads = static_cast<double>(tier->reads() - reads0) / a.steps;
  }
  r.resident = stats.usage(offload::Tier::Host, offload::Category::Param).peak +
               stats.usage(offload::Tier::Pinned, offload::Category::Param).peak;
  r.nvme = stats.usage(offload::Tier::Nvme, offload::Category::Param).peak;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const std::optional<int> status = parse(argc, argv, a)) return *status;
  try {
    const models::ModelOptions options = bench::model_options(a);
    const models::ModelShape shape = models::ModelRegistry::global().shape(a.model, options);
    std::printf(
        "bench_zero_infinity: %s, %lld layers x %lld wide, %.1fM parameters, micro-batch %lld x "
        "%lld tokens, ZeRO-3 on one CPU process, NVMe under %s, %lld buffers; median of %d "
        "steps, the fastest of %d rounds\n",
        a.model.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.embd),
        static_cast<double>(shape.num_parameters) / 1e6, static_cast<long long>(a.micro),
        static_cast<long long>(a.seq), a.nvme_path.c_str(), static_cast<long long>(a.buffer_count),
        a.steps, a.rounds);
    using Device = parallel::OffloadParamConfig::Device;
    const std::vector<Placement> placements = {{"in memory", Device::None, true},
                                               {"in memory, no prefetch", Device::None, false},
                                               {"cpu", Device::Cpu, true},
                                               {"nvme, read-ahead", Device::Nvme, true},
                                               {"nvme, no read-ahead", Device::Nvme, false}};
    std::vector<Result> best(placements.size());
    for (int round = 0; round < a.rounds; ++round)
      for (size_t i = 0; i < placements.size(); ++i) {
        const Result r = run(a, placements[i], options, shape.vocab_size);
        // Every round's median on stderr: how much the machine's noise moves them.
        std::fprintf(stderr, "round %d: %s %.1f ms\n", round, placements[i].name, r.step_s * 1e3);
        if (r.step_s < best[i].step_s) best[i] = r;
      }
    // The reference: the faster in-memory row (prefetching buys nothing on one rank).
    const double ref = std::min(best[0].step_s, best[1].step_s);
    std::printf(
        "\n| params | step ms | vs in memory | param_wait ms/step | resident params | on nvme |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < placements.size(); ++i)
      std::printf("| %s | %.1f | %.2fx | %.1f | %.1f KiB | %.1f KiB |\n", placements[i].name,
                  best[i].step_s * 1e3, best[i].step_s / ref, best[i].wait_ms,
                  static_cast<double>(best[i].resident) / 1024.0,
                  static_cast<double>(best[i].nvme) / 1024.0);
    // Where param_wait went (Note [Parameter read-ahead]), per step of the rows above.
    std::printf(
        "\n| params | NVMe reads/step | late reads: loads, ms | misses: loads, ms | stores "
        "waiting ms |\n");
    std::printf("|---|---|---|---|---|\n");
    for (size_t i = 0; i < placements.size(); ++i) {
      if (placements[i].device != Device::Nvme) continue;
      const parallel::ParamTier::Waits& w = best[i].waits;
      std::printf("| %s | %.1f | %lld, %.1f | %lld, %.1f | %.1f |\n", placements[i].name,
                  best[i].reads, static_cast<long long>(w.late), w.late_s * 1e3,
                  static_cast<long long>(w.misses), w.miss_s * 1e3, w.store_s * 1e3);
    }
    return 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
