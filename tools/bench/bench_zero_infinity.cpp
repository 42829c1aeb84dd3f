// bench_zero_infinity: the ZeRO-3 training step with the parameter partitions offloaded
// (zero_optimization.offload_param: host memory, NVMe with read-ahead, NVMe without), against
// the same step with the partitions in memory, measured in the same run, on one CPU process (the
// host plays the device).
//
//   bench_zero_infinity [--model gpt2-tiny] [--layers 8] [--embd 256] [--micro 4] [--seq 128]
//                       [--steps 4] [--rounds 5] [--nvme-path /tmp] [--buffer-count 5]
//
// Each placement builds the same model (same seed); its first step records the gather order the
// read-ahead follows and its second measures the parameters' resident peak. The table gives the
// median step time over every timed step, its ratio to the in-memory step (the faster of the
// in-memory rows with and without allgather prefetch), the median over rounds of that ratio taken
// within each round, how long each step waited for parameter reads, writes and buffers
// (param_wait, the tier's measurement), and the resident peak (Category::Param on the host and
// pinned tiers) beside the bytes on NVMe; a second table splits the NVMe rows' wait
// (ParamTier::waits(): reads still in flight, demand reads, stores waiting for a buffer) and
// counts their reads per step. On a CPU run set OMP_WAIT_POLICY=passive: OpenMP threads spinning
// between parallel regions take the cores the NVMe engine's threads need (docs/offload.md).
// Issue 55's target: NVMe with read-ahead at most 1.5x the in-memory step.
//
// Note [Interleaved placements]
// On a shared machine the step time moves by up to 2x as other work comes and goes, over
// seconds to minutes; placements measured one after the other (each built, stepped, destroyed)
// see different machines, and their ratio carries that noise. So every placement is built first
// and stays alive, and the rounds interleave them finely: in each round every placement takes
// one untimed step and then --steps timed ones (A B C D E A B C D E ...). The untimed step makes
// each placement's first timed step start as in training, right after a step, with that step's
// write-backs and read-ahead in flight, not after the pause in which the others ran (which would
// have let its reads land for free).
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
#include "tools/bench/build_stamp.h"

namespace {

using namespace strata;

struct Args : bench::ModelArgs {
  Args() {
    layers = 8;
    micro = 4;
    seq = 128;
  }
  int steps = 4;
  int rounds = 5;
  std::string nvme_path = "/tmp";
  int64_t buffer_count = 5;
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"ZeRO-3 step time with the parameter partitions in memory, on the host or on NVMe",
               "bench_zero_infinity"};
  bench::add_model_options(app, a);
  bench::count_option(app, "--steps", a.steps, "timed steps per placement and round");
  bench::count_option(app, "--rounds", a.rounds, "rounds over the placements (interleaved)");
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
  std::vector<double> times;  // every timed step, all rounds
  std::vector<double> round_medians;
  double wait_s = 0;                 // over the timed steps
  parallel::ParamTier::Waits waits;  // over the timed steps
  int64_t reads = 0;                 // NVMe reads over the timed steps
  int64_t resident = 0;              // Category::Param peak, host + pinned, of this placement
  int64_t nvme = 0;
};

// One placement's model and engine, alive for the whole run (Note [Interleaved placements]).
struct Live {
  std::unique_ptr<models::CausalLM> model;
  std::unique_ptr<parallel::Engine> engine;
  parallel::TrainStepInputs in;
};

int64_t param_bytes_now(const offload::MemoryStats& stats) {
  return stats.usage(offload::Tier::Host, offload::Category::Param).current +
         stats.usage(offload::Tier::Pinned, offload::Category::Param).current;
}

int64_t param_bytes_peak(const offload::MemoryStats& stats) {
  return stats.usage(offload::Tier::Host, offload::Category::Param).peak +
         stats.usage(offload::Tier::Pinned, offload::Category::Param).peak;
}

// Builds the placement and takes two steps: the first records the gather order the read-ahead
// follows, the second measures the placement's resident parameter bytes. The placements built
// before are at rest meanwhile, so their bytes are constant and are subtracted.
std::unique_ptr<Live> build(const Args& a, const Placement& p, const models::ModelOptions& options,
                            int64_t vocab_size, Result& r) {
  offload::MemoryStats& stats = offload::MemoryStats::global();
  const int64_t before = param_bytes_now(stats);
  const int64_t nvme_before = stats.usage(offload::Tier::Nvme, offload::Category::Param).current;
  auto live = std::make_unique<Live>();
  live->model = models::ModelRegistry::global().create(a.model, options);
  parallel::ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 1000;
  z.stage3_prefetch_bucket_size = p.prefetch ? 50'000'000 : 0;
  z.offload_param.device = p.device;
  z.offload_param.nvme_path = a.nvme_path;
  z.offload_param.buffer_count = a.buffer_count;
  live->engine = std::make_unique<parallel::Engine>(
      *live->model, std::make_shared<comm::SelfCommunicator>("dp"), z,
      [](std::vector<optim::ParamGroup> groups) {
        return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamWConfig{});
      });
  const int64_t vocab = vocab_size;
  parallel::TrainStepInputs& in = live->in;
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
  live->engine->train_step(in);  // records the gather order
  stats.reset_peaks();
  live->engine->train_step(in);
  r.resident = param_bytes_peak(stats) - before;
  r.nvme = stats.usage(offload::Tier::Nvme, offload::Category::Param).current - nvme_before;
  return live;
}

// One round of a placement: a step untimed, so the timed ones start where a step of training
// left the tier (its write-backs and read-ahead in flight), then `steps` timed ones.
void take_steps(const Args& a, Live& live, Result& r) {
  live.engine->train_step(live.in);
  const parallel::ParamTier* tier = live.engine->param_tier();
  const double wait0 = tier ? tier->wait_seconds() : 0.0;
  const parallel::ParamTier::Waits waits0 = tier ? tier->waits() : parallel::ParamTier::Waits{};
  const int64_t reads0 = tier ? tier->reads() : 0;
  std::vector<double> times;
  for (int s = 0; s < a.steps; ++s) {
    Stopwatch w;
    live.engine->train_step(live.in);
    times.push_back(w.seconds());
  }
  r.times.insert(r.times.end(), times.begin(), times.end());
  r.round_medians.push_back(median(times));
  if (tier == nullptr) return;
  const parallel::ParamTier::Waits& w = tier->waits();
  r.wait_s += tier->wait_seconds() - wait0;
  r.waits.late_s += w.late_s - waits0.late_s;
  r.waits.miss_s += w.miss_s - waits0.miss_s;
  r.waits.store_s += w.store_s - waits0.store_s;
  r.waits.late += w.late - waits0.late;
  r.waits.misses += w.misses - waits0.misses;
  r.reads += tier->reads() - reads0;
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
        "%lld tokens, ZeRO-3 on one CPU process, NVMe under %s, %lld buffers; %d timed steps "
        "in each of %d interleaved rounds; built from %s\n",
        a.model.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.embd),
        static_cast<double>(shape.num_parameters) / 1e6, static_cast<long long>(a.micro),
        static_cast<long long>(a.seq), a.nvme_path.c_str(), static_cast<long long>(a.buffer_count),
        a.steps, a.rounds, bench::build_commit());
    using Device = parallel::OffloadParamConfig::Device;
    const std::vector<Placement> placements = {{"in memory", Device::None, true},
                                               {"in memory, no prefetch", Device::None, false},
                                               {"cpu", Device::Cpu, true},
                                               {"nvme, read-ahead", Device::Nvme, true},
                                               {"nvme, no read-ahead", Device::Nvme, false}};
    // Note [Interleaved placements]
    std::vector<Result> res(placements.size());
    std::vector<std::unique_ptr<Live>> live;
    for (size_t i = 0; i < placements.size(); ++i)
      live.push_back(build(a, placements[i], options, shape.vocab_size, res[i]));
    for (int round = 0; round < a.rounds; ++round)
      for (size_t i = 0; i < placements.size(); ++i) {
        take_steps(a, *live[i], res[i]);
        // Every round's median on stderr: how much the machine's noise moves them.
        std::fprintf(stderr, "round %d: %s %.1f ms\n", round, placements[i].name,
                     res[i].round_medians.back() * 1e3);
      }
    const double n = static_cast<double>(a.steps) * a.rounds;  // timed steps per placement
    std::vector<double> step(placements.size());
    for (size_t i = 0; i < placements.size(); ++i) step[i] = median(res[i].times);
    // The reference: the faster in-memory row (prefetching buys nothing on one rank).
    const double ref = std::min(step[0], step[1]);
    // The same ratio taken round by round (each placement against the in-memory rows of its
    // own round), then its median: what a slow phase of the machine moves least.
    auto round_ratio = [&](size_t i) {
      std::vector<double> q;
      for (int k = 0; k < a.rounds; ++k)
        q.push_back(res[i].round_medians[k] /
                    std::min(res[0].round_medians[k], res[1].round_medians[k]));
      return median(q);
    };
    std::printf(
        "\n| params | step ms | vs in memory | per round | param_wait ms/step | resident params | "
        "on nvme |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < placements.size(); ++i)
      std::printf("| %s | %.1f | %.2fx | %.2fx | %.1f | %.1f KiB | %.1f KiB |\n",
                  placements[i].name, step[i] * 1e3, step[i] / ref, round_ratio(i),
                  res[i].wait_s * 1e3 / n, static_cast<double>(res[i].resident) / 1024.0,
                  static_cast<double>(res[i].nvme) / 1024.0);
    // Where param_wait went (Note [Parameter read-ahead]), per step of the rows above.
    std::printf(
        "\n| params | NVMe reads/step | late reads: loads, ms | misses: loads, ms | stores "
        "waiting ms |\n");
    std::printf("|---|---|---|---|---|\n");
    for (size_t i = 0; i < placements.size(); ++i) {
      if (placements[i].device != Device::Nvme) continue;
      const parallel::ParamTier::Waits& w = res[i].waits;
      std::printf("| %s | %.1f | %.1f, %.1f | %.1f, %.1f | %.1f |\n", placements[i].name,
                  static_cast<double>(res[i].reads) / n, static_cast<double>(w.late) / n,
                  w.late_s * 1e3 / n, static_cast<double>(w.misses) / n, w.miss_s * 1e3 / n,
                  w.store_s * 1e3 / n);
    }
    return 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
