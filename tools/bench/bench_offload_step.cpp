// bench_offload_step: ZeRO-Infinity's optimizer step with the states on NVMe against ZeRO-Offload's
// step with them in host memory, in the same run, on the CPU (the host plays the device, as in a
// CPU-only `train` run).
//
//   bench_offload_step [--dir D] [--params N] [--sub-group S] [--buffers B] [--reps R]
//                      [--layers L] [--embd C] [--steps K] [--aio-threads T] [--queue-depth Q]
//
// Part 1, the optimizer step alone over N fp32 parameters (default 16M): the cpu step
// (optim::HostOffload: gradients copied to the host, the CPU AdamW over masters and moments in
// memory, parameters copied back) against optim::NvmeAdamW (masters and moments in a swap file
// under D, default /tmp, streamed in sub-groups of S elements through B buffers), with the
// sub-group pipeline on and off. The NVMe time includes waiting for the last writes, which a run
// overlaps with the next forward and backward. Interleaved rounds, medians. Prints seconds per
// step, the ratio to the cpu step, and the disk bandwidth reached (12 bytes per parameter read
// and 12 written per step). T and Q are the aio section's thread_count and queue_depth.
// Part 2, whole training steps of a GPT-2 (L layers, width C; K steps per round) through the
// Engine at ZeRO-1 on one rank: in memory, cpu offload, nvme pipelined, nvme unpipelined.
// What backs D matters: a tmpfs measures memory, not a disk (the bench prints the filesystem).
#include <fmt/format.h>
#include <sys/statfs.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/timer.h"
#include "models/gpt2/gpt2.h"
#include "optim/adamw.h"
#include "optim/host_offload.h"
#include "optim/nvme_adamw.h"
#include "parallel/engine.h"
#include "tensor/ops.h"
#include "tools/bench/bench_cli.h"
#include "tools/bench/bench_model_args.h"

using namespace strata;

namespace {

struct Args : bench::ModelArgs {  // part 2's GPT-2: layers and embd (4 x 256)
  std::string dir = "/tmp";
  int64_t params = 16 << 20;
  int64_t sub_group = 2 << 20;
  int buffers = 4;
  int reps = 5;
  int steps = 3;
  int aio_threads = 1;
  int queue_depth = 8;
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"ZeRO-Infinity's optimizer step with the states on NVMe against ZeRO-Offload's",
               "bench_offload_step"};
  bench::value_option(app, "--dir", a.dir, "directory of the swap file");
  bench::count_option(app, "--params", a.params, "fp32 parameters of the optimizer step (part 1)");
  bench::count_option(app, "--sub-group", a.sub_group, "sub_group_size, elements");
  bench::count_option(app, "--buffers", a.buffers, "offload_optimizer.buffer_count");
  bench::count_option(app, "--reps", a.reps, "rounds (medians reported)");
  bench::add_shape_options(app, a, " of part 2's GPT-2");
  bench::count_option(app, "--steps", a.steps, "training steps per round (part 2)");
  bench::value_option(app, "--aio-threads", a.aio_threads, "aio.thread_count");
  bench::value_option(app, "--queue-depth", a.queue_depth, "aio.queue_depth");
  return bench::parse_args(app, argc, argv);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fs_type(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0x01021994UL:
      return "tmpfs (memory, not a disk)";
    case 0xEF53UL:
      return "ext2/3/4";
    case 0x58465342UL:
      return "xfs";
    case 0x9123683EUL:
      return "btrfs";
    case 0x794C7630UL:
      return "overlayfs";
    default:
      return fmt::format("0x{:x}", static_cast<unsigned long>(s.f_type));
  }
}

optim::NvmeAdamWOptions nvme_options(const Args& a, bool pipeline) {
  optim::NvmeAdamWOptions o;
  o.nvme_path = a.dir;
  o.lock_tag = "bench-offload-step";
  o.sub_group_size = a.sub_group;
  o.buffer_count = a.buffers;
  o.pipeline_read = o.pipeline_write = pipeline;
  o.aio.intra_op_parallelism = a.aio_threads;
  o.aio.queue_depth = a.queue_depth;
  return o;
}

// Part 1.
void optimizer_step(const Args& a) {
  const int64_t n = a.params;
  tensor::Tensor params = tensor::randn({n}, RngKey{1, 0});
  tensor::Tensor grads = tensor::randn({n}, RngKey{2, 0}, 0.f, 0.01f);
  const std::vector<optim::Segment> segs = {{"w", 0, n, true}};
  optim::AdamWConfig ac;
  ac.weight_decay = 0.1;
  auto make = [&](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(g), ac);
  };
  optim::HostOffload cpu({{params, grads, tensor::Tensor(), segs}}, make, {true});
  std::map<std::string, std::unique_ptr<optim::NvmeAdamW>> nvme;
  for (bool pipeline : {true, false}) {
    optim::NvmeAdamWOptions o = nvme_options(a, pipeline);
    o.lock_tag += pipeline ? "-on" : "-off";
    nvme[pipeline ? "nvme, pipelined" : "nvme, no pipeline"] = std::make_unique<optim::NvmeAdamW>(
        std::vector<optim::NvmeSlice>{{params, grads, tensor::Tensor(), segs}}, ac, o);
  }
  std::map<std::string, std::vector<double>> t;
  for (int r = 0; r <= a.reps; ++r) {  // round 0 warms up
    Stopwatch w;
    cpu.fetch_grads();
    cpu.step(1e-4);
    if (r > 0) t["cpu (host memory)"].push_back(w.seconds());
    for (auto& [name, opt] : nvme) {
      Stopwatch x;
      opt->step(1e-4);
      opt->finish_writes();
      if (r > 0) t[name].push_back(x.seconds());
    }
  }
  const double base = median(t["cpu (host memory)"]);
  fmt::print(
      "optimizer step, {} fp32 parameters ({:.0f} MiB of masters and moments), sub-groups "
      "of {} through {} buffers, {} rounds\n",
      n, 12.0 * n / (1 << 20), a.sub_group, a.buffers, a.reps);
  fmt::print("| placement | s/step (median) | vs cpu | disk GB/s (24 B/param) | read waits |\n");
  fmt::print("|---|---|---|---|---|\n");
  fmt::print("| cpu (host memory) | {:.4f} | 1.00 | - | - |\n", base);
  for (auto& [name, opt] : nvme) {
    const double s = median(t[name]);
    fmt::print("| {} | {:.4f} | {:.2f} | {:.2f} | {} |\n", name, s, s / base, 24.0 * n / s / 1e9,
               opt->read_waits());
  }
}

// Part 2.
void train_steps(const Args& a) {
  models::gpt2::GPT2Config c;
  c.vocab_size = c.padded_vocab_size = 256;
  c.n_positions = 128;
  c.n_embd = a.embd;
  c.n_head = std::max<int64_t>(1, a.embd / 64);
  c.n_layer = a.layers;
  c.dropout = 0.f;
  const int64_t B = 4, T = 128;
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = (i * 7919 + 13) % 256;
    targets[i] = (i * 104729 + 7) % 256;
  }
  const tensor::Tensor x = tensor::from_ints(ids, {B, T}), y = tensor::from_ints(targets, {B, T});
  struct Case {
    std::string name;
    bool offload, nvme, pipeline;
  };
  const std::vector<Case> cases = {{"in memory", false, false, false},
                                   {"cpu offload", true, false, false},
                                   {"nvme, pipelined", true, true, true},
                                   {"nvme, no pipeline", true, true, false}};
  std::vector<std::unique_ptr<models::gpt2::GPT2>> models;
  std::vector<std::unique_ptr<parallel::Engine>> engines;
  int64_t n = 0;
  for (const Case& k : cases) {
    models.push_back(std::make_unique<models::gpt2::GPT2>(c, 1));
    parallel::ZeroConfig z;
    z.stage = 1;
    z.offload_optimizer.enabled = k.offload;
    z.offload_optimizer.nvme = k.nvme;
    z.offload_optimizer.nvme_options = nvme_options(a, k.pipeline);
    z.offload_optimizer.nvme_options.lock_tag = "bench-train-" + std::to_string(engines.size());
    engines.push_back(std::make_unique<parallel::Engine>(
        *models.back(), std::make_shared<comm::SelfCommunicator>("dp"), z,
        [](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::AdamW>(std::move(g));
        }));
    n = 0;
    for (const models::FlatUnit& u : models.back()->flat_units()) n += u.params.numel();
  }
  std::vector<std::vector<double>> t(cases.size());
  for (int r = 0; r <= a.reps; ++r) {
    for (size_t i = 0; i < cases.size(); ++i) {
      Stopwatch w;
      for (int s = 0; s < a.steps; ++s) {
        parallel::TrainStepInputs in;
        in.batch = [&](int64_t) { return parallel::MicroBatch{x, y}; };
        in.lr = 1e-4;
        engines[i]->train_step(in);
      }
      engines[i]->finish_pending_update();
      if (r > 0) t[i].push_back(w.seconds() / a.steps);
    }
  }
  fmt::print(
      "\ntraining step, GPT-2 {} layers x {} ({} parameters), batch {} x {} tokens, ZeRO-1, "
      "one rank on the CPU, {} steps x {} rounds\n",
      a.layers, a.embd, n, B, T, a.steps, a.reps);
  fmt::print("| placement | s/step (median) | vs in memory |\n|---|---|---|\n");
  const double base = median(t[0]);
  for (size_t i = 0; i < cases.size(); ++i)
    fmt::print("| {} | {:.4f} | {:.2f} |\n", cases[i].name, median(t[i]), median(t[i]) / base);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const std::optional<int> status = parse(argc, argv, a)) return *status;
  try {
    fmt::print("swap directory {} on {}\n", a.dir, fs_type(a.dir));
    optimizer_step(a);
    train_steps(a);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_offload_step: {}\n", e.what());
    return 1;
  }
}
