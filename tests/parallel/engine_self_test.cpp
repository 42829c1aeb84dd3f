// The engine in a world of one (no launcher): every stage must reproduce the single-process step
// bit for bit (with one rank, every reduction is the identity and every partition the whole
// unit), and the hook machinery (bucket launches during backward, ZeRO-3 gather/release,
// transient gradients) is exercised without MPI. Multi-rank agreement: engine_mpi_test.cpp.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "tests/parallel/engine_test_util.h"

namespace strata::parallel {
namespace {

using strata::testing::TrainSpec;

std::shared_ptr<comm::Communicator> self() {
  return std::make_shared<comm::SelfCommunicator>("dp");
}

class EngineSelf : public ::testing::TestWithParam<int> {};

TEST_P(EngineSelf, MatchesTheSingleProcessStepBitwise) {
  TrainSpec s;
  s.steps = 6;
  s.accum = 2;
  s.max_norm = 0.5;  // small enough to clip
  ZeroConfig z;
  z.stage = GetParam();
  z.reduce_bucket_size = 1000;  // several buckets per block
  z.allgather_bucket_size = 1000;
  z.stage3_param_persistence_threshold = 0;  // partition every unit
  z.stage3_prefetch_bucket_size = 20000;
  const std::vector<double> expected = strata::testing::reference_losses(s, 1);
  const std::vector<double> actual = strata::testing::engine_losses(s, self(), z);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << "step " << i;
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineSelf, ::testing::Values(0, 1, 2, 3));

TEST(EngineSelfZero3, ActivationCheckpointingAndPersistenceMatchToo) {
  TrainSpec s;
  s.steps = 4;
  s.checkpointing = true;
  ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 1000;  // "head" (64 elements) stays whole
  const std::vector<double> expected = strata::testing::reference_losses(s, 1);
  const std::vector<double> actual = strata::testing::engine_losses(s, self(), z);
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << "step " << i;
}

// Note [Gradient buckets]: a bucket is launched as soon as its parameters' gradients are final,
// while backward goes on through earlier units.
TEST(EngineSelfBuckets, LaunchDuringBackward) {
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainSpec s;
    s.n_layer = 3;
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    ZeroConfig z;
    z.stage = stage;
    z.reduce_bucket_size = 4096;
    Engine engine(model, self(), z, strata::testing::adamw_factory());
    std::vector<std::string> log;
    engine.set_trace([&](const std::string& e) {
      if (e.rfind("reduce", 0) == 0) log.push_back(e);
    });
    // Installed after the engine's hooks, so these run after them for the same parameter.
    for (auto& u : model.flat_units())
      for (auto& v : u.variables)
        v.add_grad_ready_hook([&log, name = u.name](autograd::Variable&) {
          if (log.empty() || log.back() != "ready " + name) log.push_back("ready " + name);
        });
    strata::testing::engine_step(engine, s, 0);
    auto first = [&](const std::string& e) {
      return std::find_if(log.begin(), log.end(),
                          [&](const std::string& x) { return x.rfind(e, 0) == 0; }) -
             log.begin();
    };
    const auto n = static_cast<int64_t>(log.size());
    ASSERT_LT(first("reduce h.2"), n);
    // h.2's buckets go out before backward reaches h.1 and h.0, and h.1's before h.0's.
    EXPECT_LT(first("reduce h.2"), first("ready h.1"));
    EXPECT_LT(first("reduce h.1"), first("ready h.0"));
    EXPECT_LT(first("reduce head"), first("ready h.2"));
    EXPECT_LT(first("ready embeddings"), first("reduce embeddings"));
    // Several buckets per block (12704 elements in 4096-element buckets).
    EXPECT_GE(std::count_if(log.begin(), log.end(),
                            [](const std::string& x) { return x.rfind("reduce h.1 ", 0) == 0; }),
              4);
  }
}

// Note [ZeRO-3 gathering] and Note [Transient gradients] in a world of one.
TEST(EngineSelfZero3, UnitsAreGatheredOnlyWhileUsed) {
  TrainSpec s;
  s.n_layer = 3;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 0;
  z.stage3_prefetch_bucket_size = 13000;  // about one block ahead
  Engine engine(model, self(), z, strata::testing::adamw_factory());
  auto& units = model.flat_units();
  for (auto& u : units) {
    EXPECT_TRUE(u.params.storage()->is_released()) << u.name;
    EXPECT_TRUE(u.grads.storage()->is_released()) << u.name;
  }
  // A use outside the hooks fails clearly instead of reading freed memory.
  EXPECT_THROW(tensor::to_float_vector(model.wte().weight().data()), InternalError);

  std::vector<std::string> log;
  engine.set_trace([&](const std::string& e) { log.push_back(e); });
  strata::testing::engine_step(engine, s, 0);
  for (auto& u : units) {
    EXPECT_TRUE(u.params.storage()->is_released()) << u.name << " after the step";
    EXPECT_TRUE(u.grads.storage()->is_released()) << u.name << " after the step";
  }
  // The recorded order: forward (wte, wpe, blocks, ln_f, lm_head) then backward.
  std::vector<std::string> order;
  for (int u : engine.gather_order()) order.push_back(units[u].name);
  const std::vector<std::string> forward = {"embeddings", "embeddings", "h.0",       "h.1",
                                            "h.2",        "head",       "embeddings"};
  ASSERT_GE(order.size(), forward.size() + 5);
  EXPECT_TRUE(std::equal(forward.begin(), forward.end(), order.begin()));
  const std::vector<std::string> backward = {"embeddings", "head", "h.2", "h.1", "h.0"};
  EXPECT_TRUE(std::equal(backward.begin(), backward.end(), order.begin() + forward.size()))
      << "backward gathers in reverse";
  EXPECT_EQ(engine.prefetches(), 0) << "no prefetch before the order is known";
  EXPECT_EQ(std::count(log.begin(), log.end(), "prefetch h.1"), 0);

  // Step 2 uses the order: h.1 is prefetched (while h.0 computes) instead of gathered on demand.
  log.clear();
  engine.reset_gathered_peak();
  strata::testing::engine_step(engine, s, 1);
  EXPECT_GT(engine.prefetches(), 0);
  EXPECT_GE(std::count(log.begin(), log.end(), "prefetch h.1"), 1);
  const int64_t block_bytes = units[1].size() * 4;
  int64_t total = 0;
  for (auto& u : units) total += u.size() * 4;
  EXPECT_LE(engine.gathered_param_peak_bytes(), 2 * block_bytes + units[0].size() * 4 + 64 * 4);
  EXPECT_LT(engine.gathered_param_peak_bytes(), total);

  // Evaluation (no grad) gathers and releases through the same hooks.
  {
    autograd::NoGradGuard no_grad;
    auto b = strata::testing::make_batch(0, 1);
    float loss = model.loss(b.ids, b.targets).item();
    EXPECT_TRUE(std::isfinite(loss));
  }
  for (auto& u : units) EXPECT_TRUE(u.params.storage()->is_released()) << u.name;

  // Whole units on demand (a consolidated checkpoint), released again after.
  int seen = 0;
  engine.for_each_gathered_unit([&](const models::FlatUnit& u) {
    EXPECT_FALSE(u.params.storage()->is_released());
    EXPECT_TRUE(std::isfinite(tensor::to_float_vector(u.params)[0]));
    ++seen;
  });
  EXPECT_EQ(seen, static_cast<int>(units.size()));
  for (auto& u : units) EXPECT_TRUE(u.params.storage()->is_released()) << u.name;
}

// Note [Train step]: Engine::train_step runs each loss under a LossGradientScope (the fused
// cross-entropy gradient) and reads the losses after the last backward; the same steps through
// the low-level calls, with the unfused loss read as it is made, give the same bits: losses,
// parameters and fp32 masters, with accumulation, clipping and fp16's loss scale.
TEST(EngineSelfTrainStep, GivesTheBitsOfTheLowLevelCalls) {
  TrainSpec s;
  s.steps = 3;
  s.accum = 3;
  s.max_norm = 0.5;
  struct Run {
    std::vector<double> losses;
    std::vector<float> params, masters;
  };
  for (DType dtype : {DType::F32, DType::F16})
    for (int stage : {0, 3}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      auto run = [&](bool api) {
        models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
        ZeroConfig z;
        z.stage = stage;
        z.stage3_param_persistence_threshold = 0;
        Engine engine(model, self(), z, strata::testing::adamw_factory(), dtype);
        optim::LossScaler scaler;
        if (dtype == DType::F16) engine.set_loss_scaler(&scaler);
        Run r;
        for (int step = 0; step < s.steps; ++step) {
          if (api) {
            r.losses.push_back(strata::testing::engine_step(engine, s, step));
            continue;
          }
          double sum = 0;
          for (int64_t m = 0; m < s.accum; ++m) {
            engine.begin_micro_batch(m == s.accum - 1);
            const strata::testing::Batch b =
                strata::testing::make_batch((step * s.accum + m) * s.micro, s.micro);
            autograd::Variable loss = model.loss(b.ids, b.targets);
            sum += loss.item();
            engine.backward(autograd::scale(loss, 1.f / static_cast<float>(s.accum)));
          }
          engine.step(s.lr, s.max_norm);
          r.losses.push_back(sum / static_cast<double>(s.accum));
        }
        engine.for_each_gathered_unit([&](const models::FlatUnit& u) {
          const std::vector<float> v = tensor::to_float_vector(u.params.to(DType::F32));
          r.params.insert(r.params.end(), v.begin(), v.end());
        });
        for (const optim::ParamGroup& g : engine.optimizer().groups()) {
          const std::vector<float> v = tensor::to_float_vector(g.param);
          r.masters.insert(r.masters.end(), v.begin(), v.end());
        }
        return r;
      };
      const Run api = run(true), calls = run(false);
      EXPECT_EQ(api.losses, calls.losses);
      EXPECT_EQ(api.params, calls.params);
      EXPECT_EQ(api.masters, calls.masters);
      EXPECT_GT(api.params.size(), 0u);
    }
}

TEST(EngineSelf, RejectsBadConfigAndMisuse) {
  TrainSpec s;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  ZeroConfig z;
  z.stage = 4;
  EXPECT_THROW(Engine(model, self(), z, strata::testing::adamw_factory()), UserError);
  z.stage = 0;
  z.reduce_bucket_size = 0;
  EXPECT_THROW(Engine(model, self(), z, strata::testing::adamw_factory()), UserError);
  z.reduce_bucket_size = 100;
  Engine engine(model, self(), z, strata::testing::adamw_factory());
  auto b = strata::testing::make_batch(0, 1);
  EXPECT_THROW(engine.backward(model.loss(b.ids, b.targets)), UserError);  // no begin_micro_batch
  engine.begin_micro_batch(false);
  engine.backward(model.loss(b.ids, b.targets));
  EXPECT_THROW(engine.step(1e-3, 0), UserError);  // the last micro-batch was not announced
}

}  // namespace
}  // namespace strata::parallel

namespace strata::parallel {
namespace {

// fp16-style loss scaling through the engine: a power-of-two static scale is exact in fp32, so
// the run is still bitwise the reference; a dynamic scaler skips an overflowing step.
TEST(EngineSelfLossScale, StaticScaleIsExactAndOverflowSkips) {
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  s.max_norm = 0.5;
  const std::vector<double> expected = strata::testing::reference_losses(s, 1);
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    ZeroConfig z;
    z.stage = stage;
    z.stage3_param_persistence_threshold = 0;
    Engine engine(model, self(), z, strata::testing::adamw_factory());
    optim::LossScalerConfig sc;
    sc.loss_scale = 1024;
    optim::LossScaler scaler(sc);
    engine.set_loss_scaler(&scaler);
    for (int step = 0; step < s.steps; ++step)
      EXPECT_EQ(strata::testing::engine_step(engine, s, step), expected[step]);
  }
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  Engine engine(model, self(), ZeroConfig{}, strata::testing::adamw_factory());
  optim::LossScalerConfig dc;
  dc.hysteresis = 1;
  optim::LossScaler scaler(dc);
  engine.set_loss_scaler(&scaler);
  const double scale = scaler.scale();
  StepResult r;
  strata::testing::engine_step(engine, s, 0, &r, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(engine.optimizer().step_count(), 0);
  EXPECT_EQ(scaler.scale(), scale / 2);
  strata::testing::engine_step(engine, s, 1, &r);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(engine.optimizer().step_count(), 1);
}

}  // namespace
}  // namespace strata::parallel
