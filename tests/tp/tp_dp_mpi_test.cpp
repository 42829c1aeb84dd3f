// Tensor parallelism composed with data parallelism and ZeRO: tp = 2 when the world is even (so
// tp 2 x dp 2 under mpirun -np 4, tp 2 x dp 1 under -np 2), the GPT-2 of the engine tests, the
// Engine over the dp group (Note [Process group order]: tp fastest), against the single-process
// trajectory for the same global batch.
#include <gtest/gtest.h>

#include "comm/process_groups.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"

namespace strata::testing {
namespace {

comm::ProcessGroups groups() {
  const std::shared_ptr<comm::Communicator> world = test_world();
  return comm::make_process_groups(world, world->size() % 2 == 0 ? 2 : 1, 1);
}

// The loss per step; `norms` (if given) receives the engine's gradient norm per step.
std::vector<double> tp_engine_losses(const TrainSpec& s, const comm::ProcessGroups& g, int stage,
                                     bool sp, std::vector<double>* norms = nullptr) {
  models::gpt2::GPT2 model(tiny_config(s), s.seed, {g.tp, sp});
  parallel::ZeroConfig zero;
  zero.stage = stage;
  zero.reduce_bucket_size = 3000;  // several buckets per step
  zero.allgather_bucket_size = 3000;
  zero.stage3_param_persistence_threshold = 0;
  parallel::Engine engine(model, g.dp, zero, adamw_factory());
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step) {
    parallel::StepResult result;
    losses.push_back(engine.average(engine_step(engine, s, step, &result)));
    if (norms) norms->push_back(result.grad_norm);
  }
  return losses;
}

// The single-process gradient norm of the first step's global batch (reference_losses' step 0).
double reference_first_norm(const TrainSpec& s, int dp) {
  models::gpt2::GPT2 model(tiny_config(s), s.seed);
  const int64_t micro_batches = s.accum * dp;
  for (int64_t m = 0; m < micro_batches; ++m) {
    Batch b = make_batch(m * s.micro, s.micro);
    autograd::scale(model.loss(b.ids, b.targets), 1.f / static_cast<float>(micro_batches))
        .backward();
  }
  std::vector<tensor::Tensor> grads;
  for (const models::FlatUnit& u : model.flat_units()) grads.push_back(u.grads);
  return optim::global_grad_norm(grads);
}

class TpDp : public ::testing::TestWithParam<int> {};

TEST_P(TpDp, MatchesTheSingleProcessTrajectory) {
  const comm::ProcessGroups g = groups();
  const TrainSpec s;
  const std::vector<double> ref = reference_losses(s, g.dp_size);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    const std::vector<double> got = tp_engine_losses(s, g, GetParam(), sp);
    expect_trajectory(got, ref, 1e-5);
    if (test_world()->rank() == 0) {
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::fabs(ref[i]));
      std::printf("[tp %d x dp %d, ZeRO-%d%s] %d steps, worst relative loss delta %.3g\n",
                  g.tp_size, g.dp_size, GetParam(), sp ? ", sp" : "", s.steps, worst);
    }
  }
}

// Clipped: the engine's norm counts every shard once (Note [Tensor-parallel gradient norm]), so
// it is the single-process norm, and the trajectory follows the clipped one.
TEST_P(TpDp, ClipsByTheWholeModelsNorm) {
  const comm::ProcessGroups g = groups();
  TrainSpec s;
  s.steps = 8;
  s.max_norm = 0.5;
  const double want = reference_first_norm(s, g.dp_size);
  ASSERT_GT(want, s.max_norm) << "the test should clip";
  const std::vector<double> ref = reference_losses(s, g.dp_size);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    std::vector<double> norms;
    const std::vector<double> got = tp_engine_losses(s, g, GetParam(), sp, &norms);
    EXPECT_NEAR(norms.front(), want, 1e-5 * want);
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_LE(std::fabs(got[i] - ref[i]), 1e-5 * std::fabs(ref[i])) << "step " << i;
    if (test_world()->rank() == 0)
      std::printf("[tp %d x dp %d, ZeRO-%d%s, clip 0.5] step-0 norm %.7f (single process %.7f)\n",
                  g.tp_size, g.dp_size, GetParam(), sp ? ", sp" : "", norms.front(), want);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, TpDp, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace strata::testing
