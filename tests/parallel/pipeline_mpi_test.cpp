// Pipeline parallelism across ranks (mpirun -np 2, 4; alone too): GPipe and 1F1B reproduce the
// single-process loss trajectory for the same global batch and seed, GPT-2 (tied head) and
// LLaMA (untied, and tied), pp 2 and 4 (with dp 2 and ZeRO-1/2 where the world allows); the
// activation peak of each stage follows the schedules' formulas at m = 8, p = 4; the bubble is
// printed beside (p - 1) / (m + p - 1). The reference is computed on each rank alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "comm/process_groups.h"
#include "offload/memory_stats.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"

namespace strata::parallel {
namespace {

using strata::testing::Batch;
using strata::testing::make_batch;
using strata::testing::TrainSpec;

std::shared_ptr<comm::Communicator> world() {
  return strata::testing::test_world();
}

constexpr double kRel = 1e-5;  // per step, relative (the bound)

// Tiny models on the engine tests' data (vocabulary 64, sequences of 16): 4 layers, width 32.
models::ModelOptions model_options(const std::string& family, const TrainSpec& spec,
                                   models::StageLayers stage = {}) {
  models::ModelOptions o;
  o.seed = spec.seed;
  o.stage = stage;
  const std::string V = std::to_string(TrainSpec::kVocab), T = std::to_string(TrainSpec::kSeq);
  if (family == "gpt2") {
    o.overrides = {{"vocab_size", V}, {"padded_vocab_size", V}, {"n_positions", T},
                   {"n_embd", "32"},  {"n_head", "2"},          {"n_layer", "4"},
                   {"dropout", "0"}};
  } else {
    o.overrides = {{"vocab_size", V},
                   {"padded_vocab_size", V},
                   {"block_size", T},
                   {"hidden_size", "32"},
                   {"intermediate_size", "48"},
                   {"n_layer", "4"},
                   {"n_head", "4"},
                   {"n_kv_head", "2"},
                   {"tie_word_embeddings", family == "llama-tied" ? "true" : "false"}};
  }
  o.overrides["activation_checkpointing"] = spec.checkpointing ? "true" : "false";
  return o;
}

const char* preset(const std::string& family) {
  return family == "gpt2" ? "gpt2-tiny" : "llama-tiny";
}

std::unique_ptr<models::CausalLM> make_model(const std::string& family, const TrainSpec& spec,
                                             models::StageLayers stage = {}) {
  return models::ModelRegistry::global().create(preset(family), model_options(family, spec, stage));
}

// One process, the whole model: A * dp micro-batches of M per step, each loss scaled by
// 1 / (A * dp), clip, AdamW (engine_test_util.h's reference, for any family).
std::vector<double> reference_losses(const std::string& family, const TrainSpec& s, int dp) {
  TrainSpec whole = s;
  whole.checkpointing = false;  // the reference runs without recomputation
  std::unique_ptr<models::CausalLM> model = make_model(family, whole);
  optim::AdamW opt(unit_param_groups(*model), strata::testing::adamw_config());
  const int64_t micro_batches = s.accum * dp;
  const int64_t G = s.micro * micro_batches;
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step) {
    opt.zero_grad();
    double sum = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
      Batch b = make_batch(step * G + m * s.micro, s.micro);
      autograd::Variable loss = model->loss(b.ids, b.targets);
      sum += loss.item();
      autograd::scale(loss, 1.f / static_cast<float>(micro_batches)).backward();
    }
    if (s.max_norm > 0) optim::clip_grad_norm(opt.grads(), s.max_norm);
    opt.step(s.lr);
    losses.push_back(sum / static_cast<double>(micro_batches));
  }
  return losses;
}

constexpr int kInterleavedChunks = 2;

// This rank's stage of a pp x dp layout, its engine and schedule.
struct Pipeline {
  comm::ProcessGroups groups;
  StagePartition partition;
  std::unique_ptr<models::CausalLM> model;
  std::unique_ptr<Engine> engine;
  PipelineSchedule* schedule = nullptr;

  Pipeline(const std::string& family, const TrainSpec& s, int pp, PipelineScheduleKind kind,
           const ZeroConfig& zero, DType param_dtype = DType::F32, int tp = 1, bool sp = false) {
    check_pipeline_layout(world()->size(), tp, pp);
    groups = comm::make_process_groups(world(), tp, pp);
    const models::ModelShape shape =
        models::ModelRegistry::global().shape(preset(family), model_options(family, s));
    partition = balance_stages(shape, pp);
    // Note [Virtual pipeline stages]: interleaved, 2 chunks per stage.
    models::ModelOptions o =
        model_options(family, s,
                      kind == PipelineScheduleKind::Interleaved
                          ? interleaved_stage(shape.n_layer, pp, kInterleavedChunks, groups.pp_rank)
                          : partition.stage(groups.pp_rank));
    o.tp = {groups.tp, sp};
    model = models::ModelRegistry::global().create(preset(family), o);
    engine = std::make_unique<Engine>(*model, groups.dp, zero, strata::testing::adamw_factory());
    schedule = &install_pipeline(*engine, *model, groups.pp, kind);
  }

  // One step on this rank's dp share of the global batch; the global mean loss.
  double step(const TrainSpec& s, int step, StepResult* result = nullptr) {
    const int dp = groups.dp_size, r = groups.dp_rank;
    const int64_t G = s.micro * s.accum * dp;
    TrainStepInputs in;
    in.micro_batches = s.accum;
    in.batch = [&](int64_t m) {
      Batch b = make_batch(step * G + r * s.micro * s.accum + m * s.micro, s.micro);
      return MicroBatch{b.ids, b.targets};
    };
    in.lr = s.lr;
    in.max_norm = s.max_norm;
    const TrainStepOutput out = engine->train_step(in);
    if (result != nullptr) *result = out.result;
    return engine->average(out.mean_loss);
  }
};

struct PipeCase {
  const char* name;
  const char* family;
  int pp;
  PipelineScheduleKind kind;
  int64_t accum;  // micro-batches per step (per dp rank)
  int zero;
  double max_norm;
  bool checkpointing = false;  // activation checkpointing inside the stages
  bool offload = false;        // ZeRO-Offload: the optimizer on the host placement
};

class PipelineTrajectory : public ::testing::TestWithParam<PipeCase> {};

TEST_P(PipelineTrajectory, ReproducesTheSingleProcessLosses) {
  const PipeCase& c = GetParam();
  const int n = world()->size();
  if (c.pp > n || n % c.pp != 0) GTEST_SKIP() << "pp " << c.pp << " on " << n << " ranks";
  if (n == 8) GTEST_SKIP() << "8 ranks run the 3D layouts";
  TrainSpec s;
  s.steps = 20;
  s.accum = c.accum;
  s.max_norm = c.max_norm;
  s.checkpointing = c.checkpointing;
  ZeroConfig z;
  z.stage = c.zero;
  z.offload_optimizer.enabled = c.offload;
  Pipeline p(c.family, s, c.pp, c.kind, z);
  const std::vector<double> expected = reference_losses(c.family, s, p.groups.dp_size);
  std::vector<double> actual;
  for (int step = 0; step < s.steps; ++step) actual.push_back(p.step(s, step));
  strata::testing::expect_trajectory(actual, expected, kRel);
  if (world()->rank() == 0) {
    double worst = 0;
    for (size_t i = 0; i < actual.size(); ++i)
      worst = std::max(worst, std::fabs(actual[i] - expected[i]) / std::fabs(expected[i]));
    std::printf("[ %s pp=%d dp=%d m=%lld %s ] loss %.6f -> %.6f, worst relative difference %.3g\n",
                c.name, c.pp, p.groups.dp_size, static_cast<long long>(c.accum),
                pipeline_schedule_name(c.kind), expected.front(), expected.back(), worst);
  }
}

constexpr auto kGPipe = PipelineScheduleKind::GPipe;
constexpr auto k1F1B = PipelineScheduleKind::OneFOneB;
constexpr auto kInterleaved = PipelineScheduleKind::Interleaved;

// Each dimension covered at least once: pp {1, 2, 4}; m {1, 4, 8}; both schedules; GPT-2 (tied
// head), LLaMA untied and tied; ZeRO 0, 1 and 2 over dp 2 (np 4); clipping across stages;
// activation checkpointing inside the stages; ZeRO-Offload's host placement.
INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineTrajectory,
    ::testing::Values(
        PipeCase{"Gpt2Pp2GPipeM1", "gpt2", 2, kGPipe, 1, 0, 0},
        PipeCase{"Gpt2Pp2OneFOneBM4Clip", "gpt2", 2, k1F1B, 4, 0, 0.5},
        PipeCase{"Gpt2Pp4OneFOneBM8", "gpt2", 4, k1F1B, 8, 0, 0},
        PipeCase{"Gpt2Pp4GPipeM4Clip", "gpt2", 4, kGPipe, 4, 0, 0.5},
        PipeCase{"Gpt2Pp2Zero1OneFOneBM4", "gpt2", 2, k1F1B, 4, 1, 0.5},
        PipeCase{"LlamaPp2OneFOneBM8", "llama", 2, k1F1B, 8, 0, 0},
        PipeCase{"LlamaPp4GPipeM8Clip", "llama", 4, kGPipe, 8, 0, 0.5},
        PipeCase{"LlamaPp4OneFOneBM1", "llama", 4, k1F1B, 1, 0, 0},
        PipeCase{"LlamaPp2Zero2GPipeM4", "llama", 2, kGPipe, 4, 2, 0.5},
        PipeCase{"LlamaTiedPp2OneFOneBM4Clip", "llama-tied", 2, k1F1B, 4, 1, 0.5},
        PipeCase{"Gpt2Pp1OneFOneBM4", "gpt2", 1, k1F1B, 4, 1, 0},
        PipeCase{"Gpt2Pp2OneFOneBM4Recompute", "gpt2", 2, k1F1B, 4, 0, 0.5, true},
        PipeCase{"LlamaPp4GPipeM4Recompute", "llama", 4, kGPipe, 4, 0, 0, true},
        PipeCase{"Gpt2Pp2Zero1OffloadOneFOneBM4Clip", "gpt2", 2, k1F1B, 4, 1, 0.5, false, true},
        // Note [Interleaved schedule]: pp 2 x 2 chunks of one layer each.
        PipeCase{"Gpt2Pp2InterleavedM4Clip", "gpt2", 2, kInterleaved, 4, 0, 0.5},
        PipeCase{"LlamaPp2InterleavedZero1M6", "llama", 2, kInterleaved, 6, 1, 0},
        PipeCase{"LlamaTiedPp2InterleavedZero2M2Clip", "llama-tied", 2, kInterleaved, 2, 2, 0.5},
        PipeCase{"LlamaPp2InterleavedZero2OffloadM4Clip", "llama", 2, kInterleaved, 4, 2, 0.5,
                 false, true}),
    [](const ::testing::TestParamInfo<PipeCase>& info) { return std::string(info.param.name); });

// 3D: tp 2 x pp 2 x dp 2 on 8 ranks (Note [Process group order]), GPT-2 and LLaMA, with and
// without sequence parallelism, ZeRO-1, clipping.
TEST(Pipeline3D, TpTimesPpTimesDpReproducesTheSingleProcessLosses) {
  if (world()->size() != 8) GTEST_SKIP() << "needs 8 ranks";
  for (const char* family : {"gpt2", "llama"})
    for (bool sp : {false, true}) {
      SCOPED_TRACE(std::string(family) + (sp ? " sp" : ""));
      TrainSpec s;
      s.steps = 10;
      s.accum = 4;
      s.max_norm = 0.5;
      ZeroConfig z;
      z.stage = 1;
      Pipeline p(family, s, 2, k1F1B, z, DType::F32, 2, sp);
      ASSERT_EQ(p.groups.dp_size, 2);
      const std::vector<double> expected = reference_losses(family, s, p.groups.dp_size);
      std::vector<double> actual;
      for (int step = 0; step < s.steps; ++step) actual.push_back(p.step(s, step));
      strata::testing::expect_trajectory(actual, expected, kRel);
      if (world()->rank() == 0) {
        double worst = 0;
        for (size_t i = 0; i < actual.size(); ++i)
          worst = std::max(worst, std::fabs(actual[i] - expected[i]) / std::fabs(expected[i]));
        std::printf("[ 3D %s%s tp 2 x pp 2 x dp 2, 1f1b m=4, ZeRO-1 ] worst relative %.3g\n",
                    family, sp ? " sp" : "", worst);
      }
    }
}

// Note [Pipeline schedules]: a stage holds the activations of n micro-batches at once, n = A for
// GPipe and min(p - s, A) for 1F1B, so its activation peak is that of one micro-batch's forward
// and backward plus n - 1 micro-batches' kept activations:
//   peak(n) = peak(1) + (n - 1) x kept.
// Measured on each of p = 4 stages at A = 8: peak(1) from a step of one micro-batch, kept from a
// lone forward of this stage (its ids and targets and the received input included), the peaks
// from MemoryStats (Category::Activation on the host). The bubble of a second step is printed
// beside the formula (timing on oversubscribed ranks: printed, not asserted).
TEST(PipelineMemory, ActivationPeakPerStageFollowsTheSchedule) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (pp 4)";
  constexpr int kStages = 4;
  constexpr int64_t kA = 8;
  TrainSpec s;
  s.micro = 4;
  s.steps = 1;
  offload::MemoryStats& stats = offload::MemoryStats::global();
  auto activation = [&] { return stats.usage(offload::Tier::Host, offload::Category::Activation); };
  // One training step of A micro-batches under `kind`: the activation peak above what was held
  // before it.
  auto step_peak = [&](Pipeline& p, int64_t A, int step) {
    TrainSpec t = s;
    t.accum = A;
    const int64_t before = activation().current;
    stats.reset_peaks();
    p.step(t, step);
    return activation().peak - before;
  };
  for (PipelineScheduleKind kind : {kGPipe, k1F1B}) {
    Pipeline p("gpt2", s, kStages, kind, ZeroConfig{});
    const int stage = p.groups.pp_rank;
    // Warm-up: the optimizer's states are made in the first step.
    step_peak(p, 1, 0);
    const int64_t peak1 = step_peak(p, 1, 1);
    int64_t kept = 0;
    {
      const int64_t before = activation().current;
      const Batch b = make_batch(0, s.micro);  // held with the micro-batch, as in the schedule
      autograd::Variable input;
      if (!p.model->is_first_stage())
        input = autograd::Variable(
            tensor::Tensor::empty({s.micro, TrainSpec::kSeq, p.model->hidden_size()}, DType::F32,
                                  Device::cpu()),
            true);
      autograd::Variable out;
      if (p.model->is_last_stage()) {
        const autograd::LossGradientScope grad(p.engine->loss_gradient(1.f / kA));
        out = p.model->stage_loss(b.ids, input, b.targets);
      } else {
        out = p.model->forward_stage(b.ids, input);
      }
      kept = activation().current - before;
    }
    const int64_t peak = step_peak(p, kA, 2);
    const int64_t n = kind == kGPipe ? kA : std::min<int64_t>(kStages - stage, kA);
    EXPECT_EQ(p.schedule->last_step().max_in_flight, n);
    const int64_t formula = peak1 + (n - 1) * kept;
    step_peak(p, kA, 3);  // the bubble of a step whose buffers were made before
    std::printf(
        "[ %s stage %d ] activation peak %lld bytes, formula %lld = peak(1) %lld + %lld x kept "
        "%lld; bubble %.3f (formula %.3f, %.1f ms step)\n",
        pipeline_schedule_name(kind), stage, static_cast<long long>(peak),
        static_cast<long long>(formula), static_cast<long long>(peak1),
        static_cast<long long>(n - 1), static_cast<long long>(kept),
        p.schedule->last_step().bubble(), pipeline_bubble_formula(kStages, kA),
        1e3 * p.schedule->last_step().seconds);
    EXPECT_GT(kept, 0);
    EXPECT_NEAR(static_cast<double>(peak), static_cast<double>(formula), 0.01 * formula)
        << pipeline_schedule_name(kind) << " stage " << stage;
    EXPECT_GE(p.schedule->last_step().bubble(), 0.0);
    EXPECT_LT(p.schedule->last_step().bubble(), 1.0);
  }
}

// Note [Interleaved schedule]: a rank holds at most its warm-up count + 1 chunk activations, so
// the activation peak does not grow with the micro-batches once they pass the warm-up.
TEST(PipelineMemory, InterleavedHoldsAtMostWarmupPlusOneChunks) {
  if (world()->size() % 2 != 0) GTEST_SKIP() << "needs pp 2";
  TrainSpec s;
  s.steps = 1;
  offload::MemoryStats& stats = offload::MemoryStats::global();
  auto activation = [&] { return stats.usage(offload::Tier::Host, offload::Category::Activation); };
  Pipeline p("gpt2", s, 2, kInterleaved, ZeroConfig{});
  const int stage = p.groups.pp_rank;
  auto step_peak = [&](int64_t A, int step) {
    TrainSpec t = s;
    t.accum = A;
    const int64_t before = activation().current;
    stats.reset_peaks();
    p.step(t, step);
    return activation().peak - before;
  };
  step_peak(2, 0);  // the optimizer's states are made in the first step
  std::vector<int64_t> peaks;
  for (int64_t A : {8, 16}) {
    peaks.push_back(step_peak(A, static_cast<int>(peaks.size()) + 1));
    const int64_t warmup = pipeline_warmup(kInterleaved, 2, kInterleavedChunks, A, stage);
    EXPECT_EQ(p.schedule->last_step().max_in_flight, warmup + 1) << "stage " << stage << " m " << A;
    std::printf(
        "[ interleaved stage %d m %lld ] %d chunk activations held (warm-up %lld), "
        "activation peak %lld bytes; bubble %.3f (formula %.3f)\n",
        stage, static_cast<long long>(A), p.schedule->last_step().max_in_flight,
        static_cast<long long>(warmup), static_cast<long long>(peaks.back()),
        p.schedule->last_step().bubble(), pipeline_bubble_formula(2, A, kInterleavedChunks));
  }
  EXPECT_GT(peaks[0], 0);
  EXPECT_NEAR(static_cast<double>(peaks[1]), static_cast<double>(peaks[0]), 0.01 * peaks[0])
      << "stage " << stage;
}

// Note [Partial passes]: interleaved, each backward reduces its own chunk's units only: at ZeRO 1
// every unit once per step (in its chunk's last backward), at ZeRO 2 once per micro-batch of
// its chunk — m times ZeRO 1's launches, not m v.
TEST(PipelineEngine, InterleavedReducesEachChunkInItsOwnPasses) {
  if (world()->size() % 2 != 0) GTEST_SKIP() << "needs pp 2";
  TrainSpec s;
  s.accum = 4;
  std::map<std::string, int> launches[2];
  for (int zero : {1, 2}) {
    ZeroConfig z;
    z.stage = zero;
    Pipeline p("gpt2", s, 2, kInterleaved, z);
    std::map<std::string, int>& count = launches[zero - 1];
    p.engine->set_trace([&](const std::string& line) {
      if (line.rfind("reduce ", 0) == 0) ++count[line.substr(7, line.find(' ', 7) - 7)];
    });
    p.step(s, 0);
  }
  ASSERT_FALSE(launches[0].empty());
  EXPECT_EQ(launches[0].size(), launches[1].size());
  for (const auto& [unit, n] : launches[0]) {
    EXPECT_GT(n, 0) << unit;
    EXPECT_EQ(launches[1][unit], s.accum * n) << unit;
  }
}

// A non-finite gradient on the last stage alone (a NaN in its final norm's gradient) makes the
// norm, summed over the stages, non-finite on every stage: every rank skips the step and keeps
// its parameters, and the next step trains again.
TEST(PipelineEngine, NonFiniteGradientOnOneStageSkipsTheStepEverywhere) {
  const int n = world()->size();
  const int pp = n >= 2 ? 2 : 1;
  if (n % pp != 0) GTEST_SKIP();
  TrainSpec s;
  s.accum = 4;
  ZeroConfig z;
  z.stage = 1;
  Pipeline p("gpt2", s, pp, k1F1B, z);
  bool inject = false;
  if (p.model->is_last_stage()) {
    const models::FlatUnit& head = p.model->flat_units().back();
    ASSERT_EQ(head.name, "head");
    autograd::Variable v = head.variables.front();
    v.add_grad_ready_hook([&](autograd::Variable& g) {
      if (inject) g.grad().narrow(0, 0, 1).fill_(std::numeric_limits<float>::quiet_NaN());
    });
  }
  StepResult r;
  p.step(s, 0, &r);
  ASSERT_FALSE(r.skipped);
  auto params = [&] {
    std::vector<std::vector<float>> out;
    for (const models::FlatUnit& u : p.model->flat_units())
      out.push_back(tensor::to_float_vector(u.params));
    return out;
  };
  const std::vector<std::vector<float>> before = params();
  const int64_t steps_before = p.engine->optimizer().step_count();
  inject = true;
  p.step(s, 1, &r);
  inject = false;
  EXPECT_TRUE(r.skipped) << "stage " << p.groups.pp_rank;
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(p.engine->optimizer().step_count(), steps_before);
  EXPECT_EQ(params(), before) << "parameters changed on stage " << p.groups.pp_rank;
  p.step(s, 2, &r);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(p.engine->optimizer().step_count(), steps_before + 1);
}

// Mixed precision (bf16 parameters and activations): a pipeline of 2 stages against the plain
// engine (one stage, dp over every rank) on the same global batch (twice the micro-batches per
// rank for half the dp ranks).
TEST(PipelineEngine, Bf16FollowsTheOneStageEngine) {
  const int n = world()->size();
  if (n % 2 != 0) GTEST_SKIP();
  TrainSpec s;
  s.steps = 10;
  std::vector<double> expected, actual;
  for (int pp : {1, 2}) {
    s.accum = 2 * pp;
    Pipeline p("llama", s, pp, k1F1B, ZeroConfig{}, DType::BF16);
    std::vector<double>& out = pp == 1 ? expected : actual;
    for (int step = 0; step < s.steps; ++step) out.push_back(p.step(s, step));
  }
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i)
    worst = std::max(worst, std::fabs(actual[i] - expected[i]) / std::fabs(expected[i]));
  if (world()->rank() == 0)
    std::printf("[ bf16 pp=2 ] loss %.6f -> %.6f, worst relative difference to pp=1 %.3g\n",
                expected.front(), expected.back(), worst);
  strata::testing::expect_trajectory(actual, expected, kRel);
}

TEST(PipelineEngine, RefusesZero3) {
  const int n = world()->size();
  TrainSpec s;
  ZeroConfig z;
  z.stage = 3;
  EXPECT_THROW(Pipeline("gpt2", s, n >= 2 ? 2 : 1, k1F1B, z), UserError);
}

// Stage-2 offload streams the gradients to the host during backward (Note [Gradients streamed
// to the host]), before the tied embedding's copies would be summed across the stages: refused,
// naming the keys. Stage 1 with offload runs it (Gpt2Pp2Zero1OffloadOneFOneBM4Clip).
TEST(PipelineEngine, RefusesStageTwoOffloadWithATiedEmbeddingAcrossStages) {
  if (world()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  TrainSpec s;
  ZeroConfig z;
  z.stage = 2;
  z.offload_optimizer.enabled = true;
  try {
    Pipeline p("gpt2", s, 2, k1F1B, z);
    ADD_FAILURE() << "the layout was accepted";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zero_optimization.offload_optimizer"), std::string::npos) << what;
    EXPECT_NE(what.find("tied embedding"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace strata::parallel
