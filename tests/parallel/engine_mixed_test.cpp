// Note [Mixed precision] (parallel/engine.h) in a world of one: bf16/fp16 parameters and
// gradients, fp32 masters and moments. What must hold: the loss tracks the fp32 run's; the
// bf16/f16 parameters are always the masters rounded; memory is 2 + 2 + 12 bytes per
// (padded) parameter; runs repeat bit for bit; fp16 with dynamic loss scaling trains and skips
// an overflowing step. Multi-rank mixed precision: engine_mpi_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "offload/memory_stats.h"
#include "tests/parallel/engine_test_util.h"

namespace strata::parallel {
namespace {

using strata::testing::TrainSpec;

std::shared_ptr<comm::Communicator> self() {
  return std::make_shared<comm::SelfCommunicator>("dp");
}

ZeroConfig zero(int stage) {
  ZeroConfig z;
  z.stage = stage;
  z.reduce_bucket_size = 1000;
  z.allgather_bucket_size = 1000;
  z.stage3_param_persistence_threshold = 0;
  return z;
}

// The bar on the GPU (loss within 2% of fp32 over 200 steps), here on the CPU backend,
// whose bf16/f16 ops widen to f32 and round once (Note [Low-precision ops]).
TEST(EngineMixed, LossStaysWithinTwoPercentOfFp32Over200Steps) {
  TrainSpec s;
  s.steps = 200;
  s.max_norm = 1.0;
  s.lr = 1e-3;
  const std::vector<double> fp32 = strata::testing::engine_losses(s, self(), zero(0));
  for (DType d : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(d));
    optim::LossScaler scaler;  // fp16: dynamic, DeepSpeed's defaults
    const std::vector<double> mixed = strata::testing::engine_losses(
        s, self(), zero(d == DType::BF16 ? 0 : 2), d, d == DType::F16 ? &scaler : nullptr);
    double worst = 0;
    for (size_t i = 0; i < fp32.size(); ++i)
      worst = std::max(worst, std::fabs(mixed[i] - fp32[i]) / fp32[i]);
    std::printf(
        "[ mixed    ] %s: worst relative loss difference over %d steps %.4f; final "
        "%.4f vs fp32 %.4f\n",
        dtype_name(d).data(), s.steps, worst, mixed.back(), fp32.back());
    strata::testing::expect_trajectory(mixed, fp32, 0.02);
    if (d == DType::F16) {
      EXPECT_EQ(scaler.skipped_steps(), 0);
    }
  }
}

// The model's bf16 parameters are the masters rounded to nearest even, at every stage, after
// every step; gradients stay bf16; the optimizer groups step the masters.
TEST(EngineMixed, ParametersAreTheRoundedMasters) {
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    Engine engine(model, self(), zero(stage), strata::testing::adamw_factory(), DType::BF16);
    EXPECT_TRUE(engine.mixed_precision());
    for (const models::FlatUnit& u : model.flat_units()) {
      EXPECT_EQ(u.params.dtype(), DType::BF16) << u.name;
      EXPECT_EQ(u.grads.dtype(), DType::BF16) << u.name;
    }
    for (int step = 0; step < s.steps; ++step) {
      strata::testing::engine_step(engine, s, step);
      for (const optim::ParamGroup& g : engine.optimizer().groups()) {
        ASSERT_EQ(g.param.dtype(), DType::F32);
        ASSERT_EQ(g.low_precision_copy.dtype(), DType::BF16);
        EXPECT_EQ(tensor::to_float_vector(g.low_precision_copy),
                  tensor::to_float_vector(g.param.to(DType::BF16)));
      }
    }
    engine.for_each_gathered_unit([&](const models::FlatUnit& u) {
      for (const auto& v : u.variables) EXPECT_EQ(v.data().dtype(), DType::BF16);
    });
  }
}

// The masters start from the fp32 initialisation, not from its bf16 rounding.
TEST(EngineMixed, MastersKeepTheFullPrecisionInitialisation) {
  TrainSpec s;
  models::gpt2::GPT2 fp32(strata::testing::tiny_config(s), s.seed);
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  Engine engine(model, self(), zero(0), strata::testing::adamw_factory(), DType::BF16);
  const auto& groups = engine.optimizer().groups();
  ASSERT_EQ(groups.size(), fp32.flat_units().size());
  int64_t differ = 0;
  for (size_t u = 0; u < groups.size(); ++u) {
    EXPECT_EQ(tensor::to_float_vector(groups[u].param),
              tensor::to_float_vector(fp32.flat_units()[u].params));
    const auto rounded = tensor::to_float_vector(fp32.flat_units()[u].params.to(DType::BF16));
    const auto full = tensor::to_float_vector(fp32.flat_units()[u].params);
    for (size_t i = 0; i < full.size(); ++i) differ += rounded[i] != full[i];
  }
  EXPECT_GT(differ, 0) << "the init happened to be bf16-exact; the test proves nothing";
}

// Note [ZeRO memory model] with mixed precision: 2 bytes of parameter, 2 of gradient and 12 of
// optimizer (fp32 master + two moments) per padded parameter — the ZeRO paper's 16 Psi.
TEST(EngineMixed, ModelStateBytesAreTwoTwoTwelve) {
  TrainSpec s;
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    const auto& stats = offload::MemoryStats::global();
    const int64_t p0 = stats.usage(offload::Tier::Host, offload::Category::Param).current;
    const int64_t g0 = stats.usage(offload::Tier::Host, offload::Category::Grad).current;
    const int64_t o0 = stats.usage(offload::Tier::Host, offload::Category::Optimizer).current;
    int64_t numel = 0;
    for (const models::FlatUnit& u : model.flat_units()) numel += u.size();
    {
      Engine engine(model, self(), zero(stage), strata::testing::adamw_factory(), DType::BF16);
      int64_t padded = 0;
      for (const models::FlatUnit& u : model.flat_units()) padded += u.size();
      const int64_t p1 = stats.usage(offload::Tier::Host, offload::Category::Param).current;
      const int64_t g1 = stats.usage(offload::Tier::Host, offload::Category::Grad).current;
      const int64_t o1 = stats.usage(offload::Tier::Host, offload::Category::Optimizer).current;
      EXPECT_EQ(p1 - p0, 2 * padded - 4 * numel);  // fp32 buffers replaced by bf16 ones
      // Stage 2 releases the unit gradients and keeps a bf16 partition (all of it, one rank).
      EXPECT_EQ(g1 - g0, 2 * padded - 4 * numel);
      EXPECT_EQ(o1 - o0, 12 * padded);
    }
  }
}

TEST(EngineMixed, TwoRunsAreBitwiseEqual) {
  TrainSpec s;
  s.steps = 5;
  s.accum = 2;
  s.max_norm = 0.5;
  for (int stage : {1, 3}) {
    const auto a = strata::testing::engine_losses(s, self(), zero(stage), DType::BF16);
    const auto b = strata::testing::engine_losses(s, self(), zero(stage), DType::BF16);
    EXPECT_EQ(a, b) << "stage " << stage;
  }
}

// fp16: an overflowing gradient (inf) skips the step and, with hysteresis 1, halves the scale;
// the next step applies. Gradients are unscaled in f32 after widening (never in place).
TEST(EngineMixed, Fp16OverflowSkipsAndHalvesTheScale) {
  TrainSpec s;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  Engine engine(model, self(), zero(2), strata::testing::adamw_factory(), DType::F16);
  optim::LossScalerConfig dc;
  dc.hysteresis = 1;
  optim::LossScaler scaler(dc);
  engine.set_loss_scaler(&scaler);
  const double scale = scaler.scale();
  EXPECT_EQ(scale, 65536.0);
  const auto masters_before = tensor::to_float_vector(engine.optimizer().groups()[0].param);
  StepResult r;
  strata::testing::engine_step(engine, s, 0, &r, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(engine.optimizer().step_count(), 0);
  EXPECT_EQ(scaler.scale(), scale / 2);
  EXPECT_EQ(tensor::to_float_vector(engine.optimizer().groups()[0].param), masters_before);
  strata::testing::engine_step(engine, s, 1, &r);
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(std::isfinite(r.grad_norm));
  EXPECT_EQ(engine.optimizer().step_count(), 1);
}

// Note [Fused cross-entropy gradient]: Engine::loss_gradient(w) is the float product backward()
// makes for a loss scaled by w: the fp16 loss scale times w (w alone without a scaler). With it
// as the LossGradientScope, fp16 steps with 3 accumulated micro-batches keep the bits of steps
// without a scope; a scope off by 1.5 rescales every gradient and changes them (so the fused
// path did run).
TEST(EngineMixed, TheLossGradientIsWhatBackwardHandsTheLoss) {
  TrainSpec s;
  s.accum = 3;
  s.steps = 2;
  const float w = 1.f / 3.f;
  auto run = [&](std::optional<float> off) {
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    Engine engine(model, self(), zero(0), strata::testing::adamw_factory(), DType::F16);
    optim::LossScaler scaler;
    engine.set_loss_scaler(&scaler);
    EXPECT_EQ(engine.loss_gradient(w), static_cast<float>(scaler.scale()) * w);
    for (int step = 0; step < s.steps; ++step) {
      for (int64_t m = 0; m < s.accum; ++m) {
        engine.begin_micro_batch(m == s.accum - 1);
        const strata::testing::Batch b =
            strata::testing::make_batch((step * s.accum + m) * s.micro, s.micro);
        autograd::Variable loss;
        {
          std::optional<autograd::LossGradientScope> scope;
          if (off) scope.emplace(engine.loss_gradient(w) * *off);
          loss = model.loss(b.ids, b.targets);
        }
        engine.backward(autograd::scale(loss, w));
      }
      engine.step(s.lr, s.max_norm);
    }
    return tensor::to_float_vector(engine.optimizer().groups()[0].param);
  };
  const std::vector<float> plain = run(std::nullopt);
  EXPECT_EQ(run(1.f), plain);
  EXPECT_NE(run(1.5f), plain);
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  Engine engine(model, self(), zero(0), strata::testing::adamw_factory(), DType::F16);
  EXPECT_EQ(engine.loss_gradient(w), w);
}

TEST(EngineMixed, RejectsANonFloatParameterDtype) {
  TrainSpec s;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  EXPECT_THROW(Engine(model, self(), zero(0), strata::testing::adamw_factory(), DType::I32),
               UserError);
}

}  // namespace
}  // namespace strata::parallel
