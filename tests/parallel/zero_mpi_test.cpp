// ZeRO across ranks: measured model-state memory against the formulas (docs/design.md decision 5),
// ZeRO-3's gathered-parameter peak and prefetch, and checkpoint shards that re-partition onto
// another dp layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "comm/self_communicator.h"
#include "offload/memory_stats.h"
#include "parallel/zero_memory.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"

namespace strata::parallel {
namespace {

using strata::testing::TrainSpec;

std::shared_ptr<comm::Communicator> world() {
  return strata::testing::test_world();
}

Engine::ModelStateBytes host_model_state_now() {
  const auto& st = offload::MemoryStats::global();
  Engine::ModelStateBytes b;
  b.params = st.usage(offload::Tier::Host, offload::Category::Param).current;
  b.grads = st.usage(offload::Tier::Host, offload::Category::Grad).current;
  b.optimizer = st.usage(offload::Tier::Host, offload::Category::Optimizer).current;
  return b;
}

// Note [ZeRO memory model], fp32 + AdamW: 16Ψ, 8Ψ + 8Ψ/Nd, 4Ψ + 12Ψ/Nd, 16Ψ/Nd, with Ψ the
// padded parameter count (Note [ZeRO padding]: each unit rounded up to Nd * 16 elements at
// stages 1-3; at stage 0 the model's own 16-element alignment inside units).
TEST(ZeroModelStates, MeasuredBytesEqualTheFormula) {
  const int dp = world()->size();
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainSpec s;
    s.n_layer = 4;
    // The MPI worker drops a finished op (and the tensors it holds) just after wait() returns;
    // the barrier, queued behind it, makes sure the previous stage's buffers are really gone.
    world()->barrier();
    const Engine::ModelStateBytes baseline = host_model_state_now();
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    const std::vector<UnitSize> sizes = unit_sizes(model);
    ZeroConfig z;
    z.stage = stage;
    z.stage3_param_persistence_threshold = 0;
    Engine engine(model, world(), z, strata::testing::adamw_factory());
    strata::testing::engine_step(engine, s, 0);
    world()->barrier();
    Engine::ModelStateBytes m = engine.model_state_bytes();
    m.params -= baseline.params;
    m.grads -= baseline.grads;
    m.optimizer -= baseline.optimizer;

    ZeroMemoryConfig cfg;
    cfg.stage = stage;
    cfg.dp = dp;
    cfg.precision = StatePrecision::FP32;
    cfg.optimizer = StateOptimizer::AdamW;
    // Exactly the formula of the padded Ψ.
    const int64_t psi_padded = padded_num_parameters(sizes, stage, dp);
    const ModelStateMemory f = model_state_memory(cfg, static_cast<double>(psi_padded));
    EXPECT_EQ(m.params, static_cast<int64_t>(f.params));
    EXPECT_EQ(m.grads, static_cast<int64_t>(f.grads));
    EXPECT_EQ(m.optimizer, static_cast<int64_t>(f.optimizer));
    const ModelStateBytes exact = padded_model_state_bytes(cfg, sizes, 0);
    EXPECT_EQ(m.params + m.grads + m.optimizer, exact.total());
    // And within the padding of the formula of the true parameter count.
    const double psi = static_cast<double>(model.num_parameters());
    const ModelStateMemory ideal = model_state_memory(cfg, psi);
    const double total = static_cast<double>(m.params + m.grads + m.optimizer);
    EXPECT_GE(total, ideal.total());
    EXPECT_LE(total - ideal.total(), 16.0 * (static_cast<double>(psi_padded) - psi));
    if (world()->rank() == 0)
      std::printf(
          "[ stage %d dp=%d ] %s: measured params %lld + grads %lld + optimizer %lld = %lld B; "
          "formula(Psi_padded=%lld) %.0f B; formula(Psi=%.0f) %.0f B\n",
          stage, dp, formula(cfg).c_str(), static_cast<long long>(m.params),
          static_cast<long long>(m.grads), static_cast<long long>(m.optimizer),
          static_cast<long long>(m.params + m.grads + m.optimizer),
          static_cast<long long>(psi_padded), f.total(), psi, ideal.total());
  }
}

// Note [ZeRO-3 gathering]: gathered parameters stay within about two units plus the prefetch,
// far below the whole model; the recorded order drives prefetches from the second step on.
TEST(Zero3Gathering, PeakStaysNearTwoUnitsPlusPrefetch) {
  TrainSpec s;
  s.n_layer = 8;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 0;
  z.stage3_prefetch_bucket_size = 13000;  // about one block (12704 elements + dp padding)
  Engine engine(model, world(), z, strata::testing::adamw_factory());
  int64_t largest = 0, total = 0;
  for (const auto& u : model.flat_units()) {
    largest = std::max<int64_t>(largest, u.size() * 4);
    total += u.size() * 4;
  }
  strata::testing::engine_step(engine, s, 0);
  const size_t recorded = engine.gather_order().size();
  EXPECT_GE(recorded, 2 * (static_cast<size_t>(s.n_layer) + 2)) << "forward and backward gathers";
  EXPECT_EQ(engine.prefetches(), 0);
  engine.reset_gathered_peak();
  strata::testing::engine_step(engine, s, 1);
  strata::testing::engine_step(engine, s, 2);
  const int64_t peak = engine.gathered_param_peak_bytes();
  EXPECT_GT(engine.prefetches(), 0);
  EXPECT_EQ(engine.gather_order().size(), recorded) << "recorded once";
  EXPECT_LE(peak, 2 * largest + z.stage3_prefetch_bucket_size * 4);
  EXPECT_LT(peak, total / 2);
  if (world()->rank() == 0)
    std::printf(
        "[ zero3 dp=%d ] gathered peak %lld B; largest unit %lld B; prefetch %lld B; model %lld "
        "B; %lld prefetches\n",
        world()->size(), static_cast<long long>(peak), static_cast<long long>(largest),
        static_cast<long long>(z.stage3_prefetch_bucket_size * 4), static_cast<long long>(total),
        static_cast<long long>(engine.prefetches()));
}

// Note [Transient gradients]: at stage 2 a unit's full gradient exists only while the unit is in
// backward, and reduce staging is bounded, so the communication bytes of a step stay far below
// the model's full gradients (which stage 0/1 keep).
TEST(Zero2Memory, TransientGradientsStayBounded) {
  TrainSpec s;
  s.n_layer = 8;
  s.accum = 2;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  ZeroConfig z;
  z.stage = 2;
  z.reduce_bucket_size = 4096;
  Engine engine(model, world(), z, strata::testing::adamw_factory());
  int64_t full_grads = 0, largest = 0;
  for (const auto& u : model.flat_units()) {
    full_grads += u.size() * 4;
    largest = std::max<int64_t>(largest, u.size() * 4);
  }
  const int64_t embeddings = model.flat_units().front().size() * 4;
  strata::testing::engine_step(engine, s, 0);
  world()->barrier();
  auto& stats = offload::MemoryStats::global();
  stats.reset_peaks();
  strata::testing::engine_step(engine, s, 1);
  const int64_t peak = stats.usage(offload::Tier::Host, offload::Category::Comm).peak;
  // The embeddings' gradient (from the tied head to the end of backward), one block's, and at
  // most about three buckets of staging.
  EXPECT_LE(peak, embeddings + largest + 3 * z.reduce_bucket_size * 4);
  EXPECT_LT(peak, full_grads / 2);
  if (world()->rank() == 0)
    std::printf("[ zero2 dp=%d ] Comm peak in a step %lld B; full gradients %lld B\n",
                world()->size(), static_cast<long long>(peak), static_cast<long long>(full_grads));
}

// Engine::shards in flat coordinates re-partition: states saved from dp ranks at stage 2 or 3
// load into a one-rank engine at stage 1 (another layout), which then continues exactly as the
// dp run does for the same global batch.
TEST(ZeroShards, ResumeOnAnotherDpLayout) {
  const int dp = world()->size();
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainSpec s;
    s.steps = 3;
    s.accum = 1;
    ZeroConfig z;
    z.stage = stage;
    z.stage3_param_persistence_threshold = 1000;  // head whole at stage 3
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    Engine engine(model, world(), z, strata::testing::adamw_factory());
    for (int step = 0; step < s.steps; ++step) strata::testing::engine_step(engine, s, step);

    // What files would hold: every (unit, key) assembled in flat coordinates from all ranks.
    std::map<std::pair<std::string, std::string>, tensor::Tensor> files;
    std::vector<Engine::Shard> mine = engine.shards();
    std::map<std::string, int64_t> numel;
    for (const auto& u : model.flat_units())
      numel[u.name] = engine.partition(static_cast<int>(&u - model.flat_units().data())).numel;
    for (const char* key : {"exp_avg", "exp_avg_sq", "param"})
      for (const auto& [unit, n] : numel) files[{unit, key}] = tensor::zeros({n});
    for (const Engine::Shard& sh : mine) {
      EXPECT_EQ(sh.unit_numel, numel[sh.unit]);
      files.at({sh.unit, sh.key}).narrow(0, sh.begin, sh.data.numel()).copy_(sh.data);
    }
    if (stage < 3) {
      for (const auto& u : model.flat_units())
        files[{u.name, "param"}].copy_(u.params.narrow(0, 0, numel[u.name]));
    } else {
      for (auto& [k, t] : files) world()->allreduce(t)->wait();  // each element from one rank
    }
    if (stage < 3)
      for (auto& [k, t] : files)
        if (k.second != "param") world()->allreduce(t)->wait();

    // A one-rank engine (dp 1, stage 1) resumes from them.
    TrainSpec s1 = s;
    s1.accum = s.accum * dp;  // the same global batch, the same samples in the same order
    models::gpt2::GPT2 model1(strata::testing::tiny_config(s1), s1.seed + 1);  // other init
    for (auto& u : model1.flat_units())
      u.params.narrow(0, 0, numel[u.name]).copy_(files.at({u.name, "param"}));
    ZeroConfig z1;
    z1.stage = 1;
    Engine engine1(model1, std::make_shared<comm::SelfCommunicator>("dp"), z1,
                   strata::testing::adamw_factory());
    engine1.sync_params();
    int filled = 0;
    engine1.load_shards(
        [&](const std::string& unit, const std::string& key, int64_t begin, tensor::Tensor dst) {
          dst.copy_(files.at({unit, key}).narrow(0, begin, dst.numel()));
          ++filled;
        });
    EXPECT_EQ(filled, 2 * static_cast<int>(numel.size()));
    optim::OptimizerState st = engine1.optimizer().state_dict();
    st.step = engine.optimizer().step_count();
    engine1.optimizer().load_state_dict(st);

    for (int step = s.steps; step < s.steps + 3; ++step) {
      const double a = engine.average(strata::testing::engine_step(engine, s, step));
      const double b = strata::testing::engine_step(engine1, s1, step);
      EXPECT_LE(std::fabs(a - b), 1e-5 * std::fabs(b)) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace strata::parallel
