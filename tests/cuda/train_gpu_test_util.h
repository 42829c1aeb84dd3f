#pragma once
// Helpers shared by the GPU training tests (train_gpu_test.cpp, train_gpu_sampling_test.cpp,
// train_gpu_steps_test.cpp, train_gpu_trainer_test.cpp): a tiny GPT-2 moved to the GPU, engine
// steps with the batch on the device, and gradients held to the CPU's. Every test skips itself
// when no device is visible (SKIP_WITHOUT_GPU).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "autograd/grad_sink.h"
#include "autograd/rng_context.h"
#include "comm/self_communicator.h"
#include "core/rng.h"
#include "models/flat_params.h"
#include "models/registry.h"
#include "offload/memory_stats.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/sgd.h"
#include "parallel/engine.h"
#include "parallel/param_groups.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"
#include "sampling/sampler.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/tool_test_util.h"

#if defined(STRATA_CUDA_EMULATION)
#include "cuda_emu/control.h"
#endif

namespace strata::train_gpu_test {

using tensor::Tensor;
using testing::TrainSpec;
inline const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

// The bytes of a tensor, on the host.
inline std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return {p, p + h.nbytes()};
}

// A tiny GPT-2 built on the host and moved to the GPU, as `train` does.
inline std::unique_ptr<models::gpt2::GPT2> gpu_model(const TrainSpec& s) {
  auto model = std::make_unique<models::gpt2::GPT2>(testing::tiny_config(s), s.seed);
  models::move_flat_units(model->flat_units(), kGpu);
  return model;
}

// One engine step on the GPU: testing::engine_step with the batch copied to the device.
// `loss_factor` multiplies the loss that backward starts from (an infinite one forces an overflow).
inline double gpu_engine_step(parallel::Engine& engine, const TrainSpec& s, int step,
                              parallel::StepResult* result = nullptr, float loss_factor = 1.f) {
  const int64_t G = s.micro * s.accum;
  parallel::TrainStepInputs in;
  in.micro_batches = s.accum;
  in.batch = [&](int64_t m) {
    testing::Batch b = testing::make_batch(step * G + m * s.micro, s.micro);
    return parallel::MicroBatch{b.ids.to(kGpu), b.targets.to(kGpu)};
  };
  in.lr = s.lr;
  in.max_norm = s.max_norm;
  in.loss_factor = loss_factor;
  const parallel::TrainStepOutput out = engine.train_step(in);  // Note [Train step]
  if (result) *result = out.result;
  return out.mean_loss;
}

struct GpuRun {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;   // the model's flat buffers (bf16 or f32)
  std::vector<std::vector<uint8_t>> masters;  // the optimizer's fp32 params
};

// `steps` engine steps over the self communicator with the model on the GPU.
inline GpuRun gpu_engine_run(const TrainSpec& s, DType dtype, const parallel::ZeroConfig& zero = {},
                             optim::LossScaler* scaler = nullptr) {
  auto model = gpu_model(s);
  parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), zero,
                          testing::adamw_factory(), dtype);
  engine.set_loss_scaler(scaler);
  EXPECT_TRUE(engine.optimizer().device().is_cuda());
  GpuRun run;
  for (int step = 0; step < s.steps; ++step) run.losses.push_back(gpu_engine_step(engine, s, step));
  // Whole parameters at every stage (stage 3 gathers each unit for the call).
  engine.for_each_gathered_unit(
      [&](const models::FlatUnit& u) { run.params.push_back(host_bytes(u.params)); });
  for (const optim::ParamGroup& g : engine.optimizer().groups())
    run.masters.push_back(host_bytes(g.param));
  return run;
}

// Every parameter's gradient of `gpu` against `cpu` (same initialisation) for one batch. Per
// parameter tensor: max |g_gpu - g_cpu| <= tol * max |g_cpu|.
inline void expect_gradients_match(models::CausalLM& cpu, models::CausalLM& gpu,
                                   const testing::Batch& b, double tol) {
  cpu.loss(b.ids, b.targets).backward();
  gpu.loss(b.ids.to(kGpu), b.targets.to(kGpu)).backward();
  const auto& cu = cpu.flat_units();
  const auto& gu = gpu.flat_units();
  ASSERT_EQ(cu.size(), gu.size());
  int checked = 0;
  for (size_t u = 0; u < cu.size(); ++u) {
    EXPECT_TRUE(gu[u].grads.device().is_cuda());
    for (size_t k = 0; k < cu[u].names.size(); ++k) {
      const std::vector<float> want = tensor::to_float_vector(cu[u].variables[k].grad());
      const std::vector<float> got =
          tensor::to_float_vector(gu[u].variables[k].grad().to(Device::cpu()));
      ASSERT_EQ(want.size(), got.size()) << cu[u].names[k];
      double max_ref = 0, max_diff = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      }
      EXPECT_GT(max_ref, 0.0) << cu[u].names[k] << " has no gradient on the CPU";
      EXPECT_LE(max_diff, tol * max_ref)
          << cu[u].names[k] << ": max |gpu - cpu| " << max_diff << ", max |cpu| " << max_ref;
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(cpu.named_parameters().size()));
}

}  // namespace strata::train_gpu_test
