// bench_offload_dp: ZeRO-Offload's CPU step against the data-parallel degree, on CPU ranks.
//
//   mpirun -np P bench_offload_dp [--model gpt2-tiny] [--embd E] [--layers L] [--seq T]
//                                 [--micro B] [--steps S] [--dtype bf16|fp32]
//
// With ZeRO-2 and offload_optimizer each rank keeps and updates only its 1/dp partition of the
// fp32 masters and moments (Note [Offloaded step] in parallel/host_placement.h), so the step's
// host work (the CPU AdamW over the partition, the copies) falls as dp grows (issue 54). Here the
// "device" is the CPU too (the CPU tier: the copies are memcpy), so the numbers are the host side
// alone. Rank 0 first trains the model alone (dp 1) while the others wait; then the P ranks train
// it at dp P. For each the table gives the medians over S steps after one warm-up of the
// forward + backward, of Engine::step (norm, CPU AdamW, write-back, allgather) and of the CPU
// AdamW alone (the host optimizer's step over this rank's partition, called directly after the
// training steps), slowest rank, with the speed-ups against dp 1 beside the ideal P. Give every
// rank the same threads (OMP_NUM_THREADS) and cores of its own, or the numbers measure
// oversubscription.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "comm/world.h"
#include "core/error.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "parallel/engine.h"
#include "tools/bench/bench_cli.h"
#include "tools/bench/bench_model_args.h"

namespace {

using namespace strata;

struct Args : bench::ModelArgs {  // gpt2-tiny, 4 layers, 256 wide, 64 tokens, micro-batch 2
  int steps = 5;
  std::string dtype = "bf16";
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"ZeRO-Offload's CPU step against the data-parallel degree, on CPU ranks",
               "bench_offload_dp"};
  bench::add_model_options(app, a);
  bench::count_option(app, "--steps", a.steps, "timed steps per degree (median)");
  bench::value_option(app, "--dtype", a.dtype, "parameter and gradient dtype")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  return bench::parse_args(app, argc, argv);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double max_over(comm::Communicator& c, double x) {
  tensor::Tensor t = tensor::full({1}, x);
  c.allreduce(t, comm::ReduceOp::Max)->wait();
  return static_cast<double>(t.item<float>());
}

struct Times {
  double fwd_bwd = 0, step = 0, adamw = 0;
  int64_t params = 0;
};

// S + 1 steps of the manual protocol (Note [Engine step]) at dp = comm's size; the medians of
// the slowest rank's times after the first step.
Times run(const Args& a, const models::ModelOptions& options, std::shared_ptr<comm::Communicator> c,
          comm::Communicator* sync) {
  std::unique_ptr<models::CausalLM> model =
      models::ModelRegistry::global().create(a.model, options);
  parallel::ZeroConfig zero;
  zero.stage = 2;
  zero.offload_optimizer.enabled = true;
  parallel::Engine engine(
      *model, c, zero,
      [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamWConfig{});
      },
      a.dtype == "bf16" ? DType::BF16 : DType::F32);
  Times out;
  for (const models::FlatUnit& u : model->flat_units()) out.params += u.params.numel();
  const int64_t vocab = model->vocab_size();
  std::vector<double> fb, st;
  for (int s = 0; s <= a.steps; ++s) {
    std::mt19937_64 rng(static_cast<uint64_t>(s * 1000 + c->rank()));
    std::vector<int64_t> ids(static_cast<size_t>(a.micro * a.seq)), targets(ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      ids[k] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
      targets[k] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    }
    const tensor::Tensor x = tensor::from_ints(ids, {a.micro, a.seq});
    const tensor::Tensor y = tensor::from_ints(targets, {a.micro, a.seq});
    if (sync != nullptr) sync->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    engine.begin_micro_batch(/*last=*/true);
    autograd::Variable loss = model->loss(x, y);
    engine.backward(loss);
    const auto t1 = std::chrono::steady_clock::now();
    engine.step(1e-4, 1.0);
    const auto t2 = std::chrono::steady_clock::now();
    if (s == 0) continue;
    double f = std::chrono::duration<double>(t1 - t0).count();
    double g = std::chrono::duration<double>(t2 - t1).count();
    if (sync != nullptr) {
      f = max_over(*sync, f);
      g = max_over(*sync, g);
    }
    fb.push_back(f);
    st.push_back(g);
  }
  out.fwd_bwd = median(fb);
  out.step = median(st);
  // The host optimizer over this rank's partition: what falls as 1/dp.
  optim::Optimizer& opt = engine.optimizer();
  std::vector<double> ad;
  for (int s = 0; s <= a.steps; ++s) {
    if (sync != nullptr) sync->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    opt.step(1e-4);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sync != nullptr) t = max_over(*sync, t);
    if (s > 0) ad.push_back(t);
  }
  out.adamw = median(ad);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const std::optional<int> status = parse(argc, argv, args)) return *status;
  try {
    auto world = comm::init_world("mpi", Device::cpu(), std::chrono::minutes(5));
    const int p = world->size(), rank = world->rank();
    const models::ModelOptions options = bench::model_options(args);
    Times one;
    if (rank == 0)
      one = run(args, options, std::make_shared<comm::SelfCommunicator>("dp"), nullptr);
    world->barrier();
    const Times many = run(args, options, world, world.get());
    if (rank == 0) {
      std::printf(
          "bench_offload_dp: %s, n_embd %lld, %lld layers, %lld padded parameters, %s, ZeRO-2 with "
          "offload_optimizer on CPU ranks, micro-batch %lld x %lld tokens per rank, medians of %d "
          "steps (slowest rank)\n\n| dp | forward+backward ms | Engine::step ms | step speed-up | "
          "CPU AdamW ms | AdamW speed-up | ideal |\n|---:|---:|---:|---:|---:|---:|---:|\n",
          args.model.c_str(), static_cast<long long>(args.embd),
          static_cast<long long>(args.layers), static_cast<long long>(one.params),
          args.dtype.c_str(), static_cast<long long>(args.micro), static_cast<long long>(args.seq),
          args.steps);
      std::printf("| 1 | %.2f | %.2f | 1.00 | %.2f | 1.00 | 1.00 |\n", 1e3 * one.fwd_bwd,
                  1e3 * one.step, 1e3 * one.adamw);
      if (p > 1)
        std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %d.00 |\n", p, 1e3 * many.fwd_bwd,
                    1e3 * many.step, one.step / many.step, 1e3 * many.adamw, one.adamw / many.adamw,
                    p);
    }
    world.reset();
    comm::finalize_world();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_offload_dp: %s\n", e.what());
    comm::abort_world(1);
  }
}
