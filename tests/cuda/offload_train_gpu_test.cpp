// ZeRO-Offload through the Engine with the model on the GPU (parallel/host_placement.h): the
// optimizer on the host, forward and backward on the device. Issue 54's "Must show" at dp 1
// (dp 2 is in tests/dist/gpu/offload_gpu_mpi_test.cpp): bitwise the run without offload at
// ZeRO-1 and ZeRO-2 in fp32, bf16 and fp16; the delayed update equal to a reference applying each
// update one step late; the GPU's model states down from 16 bytes per parameter to the bf16
// parameters, measured. Every test skips itself without a device.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/self_communicator.h"
#include "models/flat_params.h"
#include "offload/memory_stats.h"
#include "optim/loss_scaler.h"
#include "parallel/engine.h"
#include "tensor/cuda.h"
#include "tests/parallel/engine_test_util.h"

namespace strata::parallel {
namespace {

using strata::testing::TrainSpec;
using tensor::Tensor;
const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return {p, p + h.nbytes()};
}

std::unique_ptr<models::gpt2::GPT2> gpu_model(const TrainSpec& s) {
  auto model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
  models::move_flat_units(model->flat_units(), kGpu);
  return model;
}

ZeroConfig zero(int stage, bool offload) {
  ZeroConfig z;
  z.stage = stage;
  z.reduce_bucket_size = 1000;
  z.allgather_bucket_size = 1000;
  z.offload_optimizer.enabled = offload;
  return z;
}

double gpu_step(Engine& engine, const TrainSpec& s, int step) {
  const int64_t G = s.micro * s.accum;
  TrainStepInputs in;
  in.micro_batches = s.accum;
  in.batch = [&](int64_t m) {
    strata::testing::Batch b = strata::testing::make_batch(step * G + m * s.micro, s.micro);
    return MicroBatch{b.ids.to(kGpu), b.targets.to(kGpu)};
  };
  in.lr = s.lr;
  in.max_norm = s.max_norm;
  return engine.train_step(in).mean_loss;
}

struct GpuRun {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params, masters, states;
};

GpuRun gpu_run(const TrainSpec& s, const ZeroConfig& z, DType dtype) {
  auto model = gpu_model(s);
  Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                strata::testing::adamw_factory(), dtype);
  optim::LossScaler scaler;
  if (dtype == DType::F16) engine.set_loss_scaler(&scaler);
  EXPECT_EQ(engine.optimizer().device().is_cpu(), z.offload_optimizer.enabled);
  GpuRun r;
  for (int step = 0; step < s.steps; ++step) r.losses.push_back(gpu_step(engine, s, step));
  for (const models::FlatUnit& u : model->flat_units()) r.params.push_back(bytes(u.params));
  for (const optim::ParamGroup& g : engine.optimizer().groups())
    r.masters.push_back(bytes(g.param));
  for (const optim::NamedTensor& t : engine.optimizer().state_dict().tensors)
    r.states.push_back(bytes(t.tensor));
  return r;
}

TEST(OffloadGpu, WithoutTheDelayedUpdateGivesTheDeviceRunsBits) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  s.max_norm = 0.5;  // small enough to clip
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (int stage : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      const GpuRun ref = gpu_run(s, zero(stage, false), dtype);
      const GpuRun off = gpu_run(s, zero(stage, true), dtype);
      EXPECT_EQ(off.losses, ref.losses);
      EXPECT_EQ(off.params, ref.params);
      EXPECT_EQ(off.states, ref.states);
      if (dtype != DType::F32) EXPECT_EQ(off.masters, ref.masters);
      EXPECT_LT(ref.losses.back(), ref.losses.front());
    }
  }
}

// As OffloadEngine.DelayedUpdateEqualsAReferenceThatAppliesEachUpdateOneStepLate on the CPU
// tier, here with the copy stream and the host thread beside the device's compute stream.
double manual_step(Engine& engine, models::CausalLM& model, const TrainSpec& s, int step,
                   const std::vector<Tensor>* forward_params) {
  std::vector<models::FlatUnit>& units = model.flat_units();
  std::vector<Tensor> current;
  if (forward_params != nullptr) {
    for (size_t u = 0; u < units.size(); ++u) {
      current.push_back(units[u].params.clone());
      units[u].params.copy_((*forward_params)[u]);
    }
  }
  const strata::testing::Batch b = strata::testing::make_batch(step * s.micro, s.micro);
  engine.begin_micro_batch(/*last=*/true);
  autograd::Variable loss = model.loss(b.ids.to(kGpu), b.targets.to(kGpu));
  engine.backward(loss);
  const double value = loss.item();
  for (size_t u = 0; u < current.size(); ++u) units[u].params.copy_(current[u]);
  engine.step(s.lr, s.max_norm);
  return value;
}

TEST(OffloadGpu, DelayedUpdateEqualsAReferenceThatAppliesEachUpdateOneStepLate) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 6;
  s.max_norm = 0.5;
  const int kStart = 2;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    ZeroConfig z = zero(2, true);
    z.offload_optimizer.delayed_param_update = true;
    z.offload_optimizer.delayed_param_update_start = kStart;
    std::vector<double> delayed, late;
    std::vector<std::vector<uint8_t>> delayed_params, late_params;
    {
      auto model = gpu_model(s);
      Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                    strata::testing::adamw_factory(), dtype);
      for (int step = 0; step < s.steps; ++step)
        delayed.push_back(manual_step(engine, *model, s, step, nullptr));
      engine.finish_pending_update();  // lands the last delayed update
      for (const models::FlatUnit& u : model->flat_units())
        delayed_params.push_back(bytes(u.params));
    }
    {
      auto model = gpu_model(s);
      Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), zero(2, false),
                    strata::testing::adamw_factory(), dtype);
      std::vector<Tensor> previous;
      for (int step = 0; step < s.steps; ++step) {
        std::vector<Tensor> start;
        for (const models::FlatUnit& u : model->flat_units()) start.push_back(u.params.clone());
        late.push_back(manual_step(engine, *model, s, step, step > kStart ? &previous : nullptr));
        previous = std::move(start);
      }
      for (const models::FlatUnit& u : model->flat_units()) late_params.push_back(bytes(u.params));
    }
    EXPECT_EQ(delayed, late);
    EXPECT_EQ(delayed_params, late_params);
  }
}

// Note [Every byte is accounted]: bf16 at ZeRO-2, dp 1. Without offload the GPU holds 2 + 2 + 12
// bytes per (padded) parameter; with it 2 (the bf16 parameters): the gradient partition is on
// the host, streamed there bucket by bucket during backward (Note [Gradients streamed to the
// host]), and so are the 12 (the fp32 masters pinned, the moments in host memory) beside the
// pinned bf16 staging for parameters. What the GPU holds of gradients is transient (Comm): the
// unit in backward, the buckets' staging and a unit's partition while its buckets reduce.
TEST(OffloadGpu, ModelStatesOnTheGpuDropFromSixteenToTwoBytesPerParameter) {
  SKIP_WITHOUT_GPU();
  using offload::Category;
  using offload::Tier;
  offload::MemoryStats& stats = offload::MemoryStats::global();
  auto now = [&](Tier t, Category c) { return stats.usage(t, c).current; };
  TrainSpec s;
  s.accum = 2;  // the second micro-batch brings the partition's buckets back from the host
  int64_t comm_peak_on_gpu = 0;
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload" : "on the GPU");
    const int64_t pinned_opt = now(Tier::Pinned, Category::Optimizer);
    const int64_t pinned_grad = now(Tier::Pinned, Category::Grad);
    const int64_t pinned_param = now(Tier::Pinned, Category::Param);
    const int64_t host_opt = now(Tier::Host, Category::Optimizer);
    auto model = gpu_model(s);
    Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), zero(2, offload),
                  strata::testing::adamw_factory(), DType::BF16);
    gpu_step(engine, s, 0);
    stats.reset_peaks();
    gpu_step(engine, s, 1);
    int64_t padded = 0, largest_shard = 0;
    for (const models::FlatUnit& u : model->flat_units()) {
      padded += u.params.numel();
      largest_shard = std::max(largest_shard, u.params.numel());  // dp 1: the shard is the unit
    }
    const Engine::ModelStateBytes b = engine.model_state_bytes();  // the GPU tier
    EXPECT_EQ(b.params, 2 * padded);
    EXPECT_EQ(b.grads, offload ? 0 : 2 * padded);
    EXPECT_EQ(stats.usage(Tier::Gpu, Category::Grad).peak, offload ? 0 : 2 * padded);
    EXPECT_EQ(b.optimizer, offload ? 0 : 12 * padded);
    EXPECT_EQ(now(Tier::Pinned, Category::Optimizer) - pinned_opt, offload ? 4 * padded : 0);
    EXPECT_EQ(now(Tier::Host, Category::Optimizer) - host_opt, offload ? 8 * padded : 0);
    EXPECT_EQ(now(Tier::Pinned, Category::Grad) - pinned_grad, offload ? 2 * padded : 0);
    EXPECT_EQ(now(Tier::Pinned, Category::Param) - pinned_param, offload ? 2 * padded : 0);
    // The transient gradient bytes grow by at most one unit's bf16 partition in flight.
    const int64_t comm_peak = stats.usage(Tier::Gpu, Category::Comm).peak;
    if (offload) {
      EXPECT_LE(comm_peak, comm_peak_on_gpu + 2 * largest_shard);
    } else {
      comm_peak_on_gpu = comm_peak;
    }
    std::printf(
        "bf16 ZeRO-2 dp 1%s: GPU model states %.2f bytes/parameter (%lld parameters), transient "
        "gradient and communication peak %lld bytes\n",
        offload ? " with ZeRO-Offload" : "",
        static_cast<double>(b.params + b.grads + b.optimizer) / padded,
        static_cast<long long>(padded), static_cast<long long>(comm_peak));
  }
}

// Note [Offload construction]: an engine given host units and the GPU takes the masters on the
// host and moves only the bf16 units, so the GPU's peak while it is built is the bf16 parameters
// and gradients (2 + 2 bytes per padded parameter), not the fp32 model's 8; it then trains with
// the bits of an engine built from units moved first.
TEST(OffloadGpu, BuildingFromHostUnitsKeepsTheFp32ModelOffTheGpu) {
  SKIP_WITHOUT_GPU();
  offload::MemoryStats& stats = offload::MemoryStats::global();
  TrainSpec s;
  s.steps = 2;
  s.max_norm = 0.5;
  std::vector<std::vector<uint8_t>> params[2];
  std::vector<double> losses[2];
  for (int from_host = 0; from_host < 2; ++from_host) {
    SCOPED_TRACE(from_host ? "from the host" : "moved first");
    std::unique_ptr<models::gpt2::GPT2> model;
    if (from_host) {
      model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
    }
    const int64_t gpu_before = stats.tier_usage(offload::Tier::Gpu).current;
    stats.reset_peaks();
    if (!from_host) model = gpu_model(s);
    Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), zero(2, true),
                  strata::testing::adamw_factory(), DType::BF16, kGpu);
    const int64_t peak = stats.tier_usage(offload::Tier::Gpu).peak - gpu_before;
    int64_t padded = 0;
    for (const models::FlatUnit& u : model->flat_units()) {
      padded += u.params.numel();
      EXPECT_TRUE(u.params.device().is_cuda());
      EXPECT_EQ(u.params.dtype(), DType::BF16);
    }
    if (from_host) {
      EXPECT_LE(peak, 4 * padded);
    } else {
      EXPECT_GE(peak, 8 * padded);  // the fp32 parameters and gradients
    }
    std::printf("GPU peak while the engine is built (%s): %.2f bytes/parameter\n",
                from_host ? "host units" : "units moved first", static_cast<double>(peak) / padded);
    for (int step = 0; step < s.steps; ++step)
      losses[from_host].push_back(gpu_step(engine, s, step));
    for (const models::FlatUnit& u : model->flat_units())
      params[from_host].push_back(bytes(u.params));
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(params[1], params[0]);
}

}  // namespace
}  // namespace strata::parallel
