// bench_pipeline: the pipeline bubble and speed-up of GPipe, 1F1B and interleaved 1F1B on CPU
// ranks, against the whole model trained by one process in the same run.
//
//   mpirun -np P bench_pipeline [--model gpt2-tiny] [--layers L] [--micro M] [--seq T]
//                               [--steps S] [--virtual V]
//                               (defaults: gpt2-tiny, 2P layers, M 4, T 64, 5 steps, V 2)
//
// For each micro-batch count m, rank 0 first trains the whole model alone while the others wait
// (the reference T1(m), no communication), then the P ranks train it as a P-stage pipeline
// (balanced by parameter count). Per m and schedule the table gives the training step's time,
// optimizer step included (median over S steps after one warm-up, slowest rank), the speed-up
// T1 / Tpp against the ideal m P / (m + P - 1) of equal stages and free communication, and the
// measured bubble (time waiting in receives over the step, mean over stages) beside
// (P - 1) / (m + P - 1). The interleaved rows (V chunks per stage: Note [Interleaved schedule]
// in parallel/pipeline_schedule.h; only where m is a multiple of P and P x V divides L) have
// the ideal m P V / (V m + P - 1) and the bubble (P - 1) / (V m + P - 1). Ranks must have cores
// of their own for the numbers to mean anything.
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
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "parallel/rank_sum.h"
#include "tools/bench/bench_cli.h"

namespace {

using namespace strata;

struct Args {
  std::string model = "gpt2-tiny";
  int64_t layers = 0;  // 0: 2 per stage
  int64_t micro = 4;
  int64_t seq = 64;
  int steps = 5;
  int64_t virtual_stages = 2;  // chunks per stage of the interleaved rows
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "GPipe's, 1F1B's and interleaved 1F1B's bubble and speed-up on CPU ranks "
      "against one process",
      "bench_pipeline"};
  bench::value_option(app, "--model", a.model, "registry name");
  bench::value_option(app, "--layers", a.layers, "transformer blocks (n_layer); 0: 2 per stage")
      ->check(bench::at_least(0));
  bench::count_option(app, "--micro", a.micro, "sequences per micro-batch");
  bench::count_option(app, "--seq", a.seq, "tokens per sequence (n_positions)");
  bench::count_option(app, "--steps", a.steps, "timed steps (median)");
  bench::count_option(app, "--virtual", a.virtual_stages,
                      "chunks per stage of the interleaved schedule's rows");
  return bench::parse_args(app, argc, argv);
}

parallel::Engine::OptimizerFactory adamw() {
  return [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamWConfig{});
  };
}

parallel::TrainStepInputs inputs(const Args& a, int64_t m, int64_t vocab) {
  parallel::TrainStepInputs in;
  in.micro_batches = m;
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
  return in;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The largest of x over the ranks (as f32: enough for times).
double max_over(comm::Communicator& c, double x) {
  tensor::Tensor t = tensor::full({1}, x);
  c.allreduce(t, comm::ReduceOp::Max)->wait();
  return static_cast<double>(t.item<float>());
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const std::optional<int> status = parse(argc, argv, args)) return *status;
  try {
    auto world = comm::init_world("mpi", Device::cpu(), std::chrono::minutes(5));
    const int p = world->size(), rank = world->rank();
    models::ModelOptions options;
    options.overrides["n_layer"] = std::to_string(args.layers > 0 ? args.layers : 2 * p);
    options.overrides["n_positions"] = std::to_string(args.seq);
    const models::ModelRegistry& registry = models::ModelRegistry::global();
    const models::ModelShape shape = registry.shape(args.model, options);
    const parallel::StagePartition partition = parallel::balance_stages(shape, p);
    if (rank == 0)
      std::printf(
          "bench_pipeline: %s, %lld layers, %d stages (%s), micro-batch %lld x %lld tokens, "
          "median of %d steps\n\n| m | schedule | step ms | speed-up | ideal | bubble | formula "
          "|\n|---:|---|---:|---:|---:|---:|---:|\n",
          args.model.c_str(), static_cast<long long>(shape.n_layer), p,
          partition.describe(shape).c_str(), static_cast<long long>(args.micro),
          static_cast<long long>(args.seq), args.steps);
    for (int64_t m : {1, 2, 4, 8, 16}) {
      // The reference: the whole model on rank 0 alone, the other ranks idle at a barrier.
      std::vector<double> whole{0.0};
      if (rank == 0) {
        whole.clear();
        std::unique_ptr<models::CausalLM> model = registry.create(args.model, options);
        parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"),
                                parallel::ZeroConfig{}, adamw());
        const parallel::TrainStepInputs in = inputs(args, m, model->vocab_size());
        for (int s = 0; s <= args.steps; ++s) {
          const auto start = std::chrono::steady_clock::now();
          engine.train_step(in);
          const double t =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (s > 0) whole.push_back(t);
        }
      }
      world->barrier();
      const double t1 = median(whole);
      for (auto kind :
           {parallel::PipelineScheduleKind::GPipe, parallel::PipelineScheduleKind::OneFOneB,
            parallel::PipelineScheduleKind::Interleaved}) {
        const bool interleaved = kind == parallel::PipelineScheduleKind::Interleaved;
        const int v = interleaved ? static_cast<int>(args.virtual_stages) : 1;
        if (interleaved && (p < 2 || v < 2 || m % p != 0 || shape.n_layer % (p * v) != 0)) continue;
        models::ModelOptions stage_options = options;
        stage_options.stage = interleaved ? parallel::interleaved_stage(shape.n_layer, p, v, rank)
                                          : partition.stage(rank);
        std::unique_ptr<models::CausalLM> model = registry.create(args.model, stage_options);
        parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"),
                                parallel::ZeroConfig{}, adamw());
        parallel::PipelineSchedule& schedule =
            parallel::install_pipeline(engine, *model, world, kind);
        const parallel::TrainStepInputs in = inputs(args, m, model->vocab_size());
        std::vector<double> times, bubbles;
        for (int s = 0; s <= args.steps; ++s) {
          world->barrier();
          const auto start = std::chrono::steady_clock::now();
          engine.train_step(in);
          const double t =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (s == 0) continue;
          times.push_back(max_over(*world, t));
          bubbles.push_back(
              parallel::sum_over_ranks(*world, schedule.last_step().bubble(), Device::cpu()) / p);
        }
        const double tp = median(times);
        if (rank == 0)
          std::printf("| %lld | %s | %.2f | %.2f | %.2f | %.3f | %.3f |\n",
                      static_cast<long long>(m), parallel::pipeline_schedule_name(kind), 1e3 * tp,
                      t1 / tp, static_cast<double>(m * p * v) / static_cast<double>(v * m + p - 1),
                      median(bubbles), parallel::pipeline_bubble_formula(p, m, v));
      }
    }
    world.reset();
    comm::finalize_world();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    comm::abort_world(1);
  }
}
