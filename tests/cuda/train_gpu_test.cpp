// Training on the GPU (issue 4's "Must show"): the model, the optimizer, the engine and `train`
// with their flat units on CUDA (Note [Training on the GPU] in runtime/trainer.h). Every
// test skips itself when no device is visible; there is no GPU in CI.
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
#include "comm/self_communicator.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/tool_test_util.h"
#include "sampling/sampler.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"

#if defined(STRATA_CUDA_EMULATION)
#include "cuda_emu/control.h"
#endif

namespace strata {
namespace {

using tensor::Tensor;
using testing::TrainSpec;
const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

// The bytes of a tensor, on the host.
std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return {p, p + h.nbytes()};
}

// A tiny GPT-2 built on the host and moved to the GPU, as `train` does.
std::unique_ptr<models::gpt2::GPT2> gpu_model(const TrainSpec& s) {
  auto model = std::make_unique<models::gpt2::GPT2>(testing::tiny_config(s), s.seed);
  models::move_flat_units(model->flat_units(), kGpu);
  return model;
}

// One engine step on the GPU: testing::engine_step with the batch copied to the device.
// `loss_factor` multiplies the loss that backward starts from (an infinite one forces an overflow).
double gpu_engine_step(parallel::Engine& engine, const TrainSpec& s, int step,
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
GpuRun gpu_engine_run(const TrainSpec& s, DType dtype, const parallel::ZeroConfig& zero = {},
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
void expect_gradients_match(models::CausalLM& cpu, models::CausalLM& gpu, const testing::Batch& b,
                            double tol) {
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

// Note [Weight gradients into their buffer]: the linear layers' and the tied head's GEMMs add their
// weight gradients into the flat buffers, the embedding scatters into its table's, the
// LayerNorms add their weight and bias gradients (Note [Norm gradients into their buffer]), and
// the linear layers' bias gradients are written over their zeroed buffers (Note [Bias gradients
// into their buffer]).
// Against the path that returns each gradient for AccumulateGrad to add
// (GradIntoBufferGuard(false)), every gradient has the same bits, except the tied embedding
// table's: its two uses are now rounded once, not twice (within 1e-6 of its largest gradient in
// f32, 1e-2 in bf16). A second backward without zeroing adds to the first (twice it, within the
// same bounds), so nothing overwrites; the norms' second gradients keep the returned path's bits
// there too (the biases add through AccumulateGrad then: the buffers are not zeroed). On the
// emulator, counting kernels: the fused path launches at least one fewer per weight matrix, one
// fewer per bias and two fewer per LayerNorm (the axpys it no longer needs).
TEST(TrainGpu, WeightGradientsGoIntoTheirBuffer) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  const testing::Batch b = testing::make_batch(0, s.micro);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double tol = dtype == DType::F32 ? 1e-6 : 1e-2;
    auto model = gpu_model(s);
    if (dtype != DType::F32) models::cast_flat_units(model->flat_units(), dtype);
    struct Grads {
      std::vector<std::vector<float>> values;  // per parameter, in unit order
      std::vector<std::string> names;
      uint64_t launches = 0;
    };
    auto backward = [&](bool into_buffer, bool zero_first) {
      if (zero_first)
        for (models::FlatUnit& u : model->flat_units()) u.grads.zero_();
      // Zeroed buffers: the linear biases' gradients may be written over them (Note [Bias
      // gradients into their buffer]).
      const autograd::GradIntoBufferGuard guard(into_buffer, /*zeroed=*/zero_first);
      Grads g;
#if defined(STRATA_CUDA_EMULATION)
      g.launches = cuda_emu::stats().launches;
#endif
      model->loss(b.ids.to(kGpu), b.targets.to(kGpu)).backward();
      for (const models::FlatUnit& u : model->flat_units())
        for (size_t k = 0; k < u.names.size(); ++k) {
          g.values.push_back(tensor::to_float_vector(u.variables[k].grad().to(Device::cpu())));
          g.names.push_back(u.names[k]);
        }
#if defined(STRATA_CUDA_EMULATION)
      g.launches = cuda_emu::stats().launches - g.launches;
#endif
      return g;
    };
    backward(true, true);  // warms what is built once (cuBLASLt algorithms, attention plans)
    const Grads returned = backward(false, true);
    const Grads into = backward(true, true);
    const Grads twice = backward(true, false);
    // The same two backwards on the returned path: the first's gradients (returned's bits), then
    // the second's added by AccumulateGrad.
    backward(false, true);
    const Grads twice_returned = backward(false, false);
    ASSERT_EQ(returned.values.size(), into.values.size());
    auto max_abs = [](const std::vector<float>& v, float scale, const std::vector<float>* minus) {
      double m = 0;
      for (size_t i = 0; i < v.size(); ++i)
        m = std::max(m, std::fabs(static_cast<double>(v[i]) * scale -
                                  (minus ? static_cast<double>((*minus)[i]) : 0.0)));
      return m;
    };
    int tied = 0, norms = 0;
    for (size_t p = 0; p < into.values.size(); ++p) {
      SCOPED_TRACE(into.names[p]);
      const double largest = max_abs(returned.values[p], 1.f, nullptr);
      EXPECT_GT(largest, 0.0);
      if (into.names[p] == "wte.weight") {
        ++tied;
        EXPECT_LE(max_abs(into.values[p], 1.f, &returned.values[p]), tol * largest);
      } else {
        EXPECT_EQ(into.values[p], returned.values[p]);
      }
      // The second backward added the same gradient again.
      EXPECT_LE(max_abs(into.values[p], 2.f, &twice.values[p]), 2 * tol * largest);
      // A norm adds into a buffer holding a gradient as AccumulateGrad's axpy_ does: the same
      // bits as the returned path after two backwards.
      if (into.names[p].find("ln_") != std::string::npos) {
        ++norms;
        EXPECT_EQ(twice.values[p], twice_returned.values[p]);
      }
    }
    EXPECT_EQ(tied, 1);
    EXPECT_EQ(norms, 2 * (2 * s.n_layer + 1));  // weight and bias of ln_1, ln_2 and ln_f
#if defined(STRATA_CUDA_EMULATION)
    // 4 weight matrices and 4 biases per block and the embedding; 2 parameters of each LayerNorm.
    EXPECT_GE(returned.launches,
              into.launches + static_cast<uint64_t>(8 * s.n_layer + 1 + 2 * (2 * s.n_layer + 1)))
        << returned.launches << " kernels returning the gradients, " << into.launches
        << " adding them into their buffers";
#endif
  }
}

// Note [Bias gradients into their buffer]: in a zeroed scope a bias's gradient is written over its
// buffer only at the first use backward reaches; later uses go through AccumulateGrad, which adds
// them after all. A bias shared by two linear layers and also added to their output gets all
// three gradients, as on the returned path (within f32 rounding: the three are summed in another
// order). Against the contract, the buffer holds 7s when the zeroed scope begins: the first use
// writes over them, which shows that the path ran. Outside a zeroed scope nothing is written over:
// the gradients are added to the 7s.
TEST(TrainGpu, ABiasUsedThriceTakesEveryGradient) {
  SKIP_WITHOUT_GPU();
  using autograd::Variable;
  uint64_t stream = 70;
  auto rnd = [&](const tensor::Shape& shape) {
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    rng_normal(v.data(), v.size(), {5, ++stream}, 0.f, 1.f);
    return tensor::from_vector(v, shape).to(kGpu);
  };
  const Tensor xd = rnd({6, 5}), w1d = rnd({5, 5}), w2d = rnd({5, 5}), bd = rnd({5});
  // The bias's buffer after one backward: `fill` in it first, under GradIntoBufferGuard(into,
  // zeroed).
  auto bias_grad = [&](bool into, bool zeroed, float fill) {
    Variable x(xd), w1(w1d, true), w2(w2d, true), b(bd, true);
    w1.set_grad(tensor::zeros({5, 5}, DType::F32, kGpu));
    w2.set_grad(tensor::zeros({5, 5}, DType::F32, kGpu));
    b.set_grad(tensor::full({5}, fill, DType::F32, kGpu));
    const autograd::GradIntoBufferGuard guard(into, zeroed);
    const Variable z = autograd::linear(autograd::linear(x, w1, b), w2, b);
    autograd::sum_all(autograd::mul(autograd::add(z, b), autograd::add(z, b))).backward();
    return tensor::to_float_vector(b.grad());
  };
  const std::vector<float> returned = bias_grad(false, false, 0.f);
  const std::vector<float> zeroed = bias_grad(true, true, 7.f);
  const std::vector<float> added = bias_grad(true, false, 7.f);
  ASSERT_EQ(returned.size(), 5u);
  for (size_t i = 0; i < returned.size(); ++i) {
    SCOPED_TRACE(i);
    const double tol = 1e-5 * std::max(1.0, std::fabs(static_cast<double>(returned[i])));
    EXPECT_NEAR(zeroed[i], returned[i], tol);
    EXPECT_NEAR(added[i], returned[i] + 7.0, tol);
  }
}

// Through an Engine (stage 0, one micro-batch: the buffers were zeroed by the last step), a GPT-2
// step leaves AccumulateGrad almost nothing to add: the weights' GEMMs and the embedding add into
// their buffers, the norms add theirs, the linear biases are written over their zeroed buffers.
// What is left is one axpy: the position embedding's gradient (a sum over the batch), where there
// were one per bias and two per LayerNorm before. Counted with the emulator's launch counters.
TEST(TrainGpu, AnEngineStepAddsAlmostNoGradientWithAnAxpy) {
  SKIP_WITHOUT_GPU();
#if !defined(STRATA_CUDA_EMULATION)
  GTEST_SKIP() << "counts kernel launches with the CUDA emulator's counters";
#else
  TrainSpec s;
  s.accum = 1;
  auto model = gpu_model(s);
  parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), {},
                          testing::adamw_factory(), DType::BF16);
  gpu_engine_step(engine, s, 0);  // builds what is built once
  const uint64_t before = cuda_emu::launches_of("axpy_kernel");
  gpu_engine_step(engine, s, 1);
  EXPECT_EQ(cuda_emu::launches_of("axpy_kernel") - before, 1u);
#endif
}

// Same initialisation, same batch: every parameter's gradient on the GPU (fp32) against the CPU.
// Tolerance 1e-4 of each tensor's largest gradient: the two differ only in summation order
// (cuBLAS f32 with no TF32, the CUDA reductions), a few f32 ulps of the largest terms, which
// leaves room for that and for nothing like a wrong index or a missing term.
TEST(TrainGpu, Fp32GradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.n_layer = 2;
  s.micro = 4;
  models::gpt2::GPT2 cpu(testing::tiny_config(s), s.seed);
  auto gpu = gpu_model(s);
  expect_gradients_match(cpu, *gpu, testing::make_batch(0, s.micro), 1e-4);
}

// The LLaMA family on the GPU: RMSNorm (fused with the residual add), rotary embeddings, SwiGLU,
// grouped-query attention (4 query heads over 2 key/value heads), untied head. fp32 with the same
// tolerance as GPT-2; bf16 parameters (cuDNN or the tensor-core attention, the bf16 kernels) to
// 2e-2 of each tensor's largest gradient, against the same bf16 model on the CPU. The GPU model
// also runs with recompute_swiglu (Note [SwiGLU recompute]), against the CPU's kept product.
TEST(TrainGpu, LlamaGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (recompute ? " recompute_swiglu" : ""));
      models::ModelOptions o;
      o.seed = 11;
      const auto& registry = models::ModelRegistry::global();
      auto cpu = registry.create("llama-tiny", o);
      if (recompute) o.overrides["recompute_swiglu"] = "true";
      auto gpu = registry.create("llama-tiny", o);
      if (dtype != DType::F32) {
        models::cast_flat_units(cpu->flat_units(), dtype);
        models::cast_flat_units(gpu->flat_units(), dtype);
      }
      models::move_flat_units(gpu->flat_units(), kGpu);
      expect_gradients_match(*cpu, *gpu, testing::make_batch(3, 4),
                             dtype == DType::F32 ? 1e-4 : 2e-2);
    }
}

// One loss and backward of a registry model for activation checkpointing's test: dropout draws
// come from a fixed generator, so every run, on either device, draws the same masks (dropout is
// an exact op: the GPU's masks are the CPU's bits).
struct CheckpointRun {
  float loss = 0;
  std::vector<std::vector<uint8_t>> grads;  // every parameter's gradient, host bytes
  std::vector<std::vector<float>> values;   // the same, as floats
  int64_t kept = 0;  // activation bytes on the model's device held for backward when loss returns
};

CheckpointRun checkpoint_run(const std::string& preset, models::ModelOptions o, DType dtype,
                             bool checkpointing, Device device) {
  if (checkpointing) o.overrides["activation_checkpointing"] = "true";
  auto model = models::ModelRegistry::global().create(preset, o);
  if (dtype != DType::F32) models::cast_flat_units(model->flat_units(), dtype);
  if (device.is_cuda()) models::move_flat_units(model->flat_units(), device);
  const testing::Batch b = testing::make_batch(5, 2);
  Generator gen(23);
  autograd::GeneratorScope scope(gen);
  auto& stats = offload::MemoryStats::global();
  const offload::Tier tier = device.is_cuda() ? offload::Tier::Gpu : offload::Tier::Host;
  const auto activations = [&] { return stats.usage(tier, offload::Category::Activation).current; };
  const int64_t before = activations();
  autograd::Variable loss = model->loss(b.ids.to(device), b.targets.to(device));
  CheckpointRun r;
  r.kept = activations() - before;
  loss.backward();
  r.loss = loss.item();
  for (auto& p : model->parameters()) {
    r.grads.push_back(host_bytes(p.grad()));
    r.values.push_back(tensor::to_float_vector(p.grad().to(Device::cpu())));
  }
  return r;
}

// Note [Activation checkpointing] on the GPU (model.config.activation_checkpointing, which the
// 1558M preset's comment offers for a 40 GB card): GPT-2 with dropout 0.1 and LLaMA, f32 and
// bf16. The checkpointed blocks run their forward twice, the second time inside backward with the
// generator rewound, so the loss and every gradient are the plain model's bits; what the forward
// leaves for backward drops by at least every layer's MLP hidden activation (GPT-2's GELU input,
// B T 4C values; LLaMA's SwiGLU product, B T F), which only the block input replaces. And the
// checkpointed GPU model against the checkpointed CPU model, dropout masks included, to the
// tolerances of LlamaGradientsMatchTheCpu.
TEST(TrainGpu, ActivationCheckpointingKeepsTheBitsAndLessMemory) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* preset;
    std::map<std::string, std::string> overrides;
    int64_t hidden;  // the MLP's hidden width
  };
  const Case cases[] = {{"gpt2-tiny", {{"dropout", "0.1"}}, 4 * 64}, {"llama-tiny", {}, 176}};
  for (const Case& c : cases)
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(c.preset) + " " + std::string(dtype_name(dtype)));
      models::ModelOptions o;
      o.seed = 31;
      o.overrides = c.overrides;
      const CheckpointRun plain = checkpoint_run(c.preset, o, dtype, false, kGpu);
      const CheckpointRun ckpt = checkpoint_run(c.preset, o, dtype, true, kGpu);
      const CheckpointRun host = checkpoint_run(c.preset, o, dtype, true, Device::cpu());
      EXPECT_EQ(std::memcmp(&plain.loss, &ckpt.loss, sizeof(float)), 0)
          << plain.loss << " vs " << ckpt.loss;
      ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
      ASSERT_EQ(host.values.size(), ckpt.values.size());
      const double tol = dtype == DType::F32 ? 1e-4 : 2e-2;
      EXPECT_NEAR(ckpt.loss, host.loss, tol * std::fabs(host.loss));
      for (size_t i = 0; i < ckpt.grads.size(); ++i) {
        EXPECT_TRUE(plain.grads[i] == ckpt.grads[i]) << "gradient " << i;
        double max_ref = 0, max_diff = 0;
        for (size_t k = 0; k < host.values[i].size(); ++k) {
          max_ref = std::max(max_ref, std::fabs(static_cast<double>(host.values[i][k])));
          max_diff = std::max(
              max_diff, std::fabs(static_cast<double>(ckpt.values[i][k]) - host.values[i][k]));
        }
        EXPECT_GT(max_ref, 0.0) << "gradient " << i << " is zero on the CPU";
        EXPECT_LE(max_diff, tol * max_ref) << "gradient " << i;
      }
      const int64_t hidden_bytes = 2 * 2 * TrainSpec::kSeq * c.hidden *
                                   static_cast<int64_t>(dtype_size(dtype));  // 2 layers, B = 2
      EXPECT_GE(plain.kept - ckpt.kept, hidden_bytes)
          << plain.kept << " activation bytes kept, " << ckpt.kept << " checkpointed";
    }
}

// Note [KV cache] on the GPU, as `generate --device cuda` and `train`'s samples use it: tokens fed
// in chunks (a 20-token prompt, single tokens, longer runs, up to the whole 64-position context)
// through forward_cached give the rows of the full GPU forward at those positions, in f32 (to
// 1e-5) and bf16 (to 2e-2 of the largest logit), for GPT-2 with head dims 16 and 64 (the SIMT
// and the tensor-core attention, queries fewer than keys) and LLaMA with grouped k/v heads, and
// so does each chunk's last position alone (last_only, in a second cache); the f32 GPU cache
// agrees with the CPU's cached forward to 1e-4 of the largest logit. The cache lives on the GPU,
// charged to its activations, and is freed with the cache.
TEST(GpuKvCache, CachedLogitsMatchTheFullForward) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* preset;
    std::map<std::string, std::string> overrides;
    int64_t kv_width;  // k/v heads x head dim
  };
  const std::vector<Case> cases{
      {"gpt2-tiny", {}, 64}, {"gpt2-tiny", {{"n_head", "1"}}, 64}, {"llama-tiny", {}, 32}};
  const std::vector<int64_t> chunks{20, 1, 1, 17, 1, 24};
  const int64_t B = 2, T = 64;
  std::vector<int64_t> v;
  for (int64_t i = 0; i < B * T; ++i) v.push_back((i * 37 + i / 5) % 256);
  const Tensor ids = tensor::from_ints(v, {B, T}, DType::I32);
  autograd::NoGradGuard no_grad;
  auto& stats = offload::MemoryStats::global();
  const auto gpu_activations = [&] {
    return stats.usage(offload::Tier::Gpu, offload::Category::Activation).current;
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(fmt::format("{} {} {}", c.preset, c.overrides.empty() ? "" : "n_head 1",
                               dtype_name(dtype)));
      models::ModelOptions o;
      o.seed = 3;
      o.overrides = c.overrides;
      auto cpu = models::ModelRegistry::global().create(c.preset, o);
      auto gpu = models::ModelRegistry::global().create(c.preset, o);
      if (dtype != DType::F32) models::cast_flat_units(gpu->flat_units(), dtype);
      models::move_flat_units(gpu->flat_units(), kGpu);
      cpu->eval();
      gpu->eval();
      const std::vector<float> full =
          tensor::to_float_vector(gpu->forward(ids.to(kGpu)).data().to(Device::cpu()));
      double largest = 0;
      for (float x : full) largest = std::max(largest, std::fabs(static_cast<double>(x)));
      ASSERT_GT(largest, 0.0);
      const int64_t before = gpu_activations();
      {
        models::KvCache gpu_cache, cpu_cache, last_cache;
        const int64_t Vp = gpu->padded_vocab_size();
        int64_t at = 0;
        double worst = 0, worst_cpu = 0;
        for (int64_t n : chunks) {
          const Tensor chunk = ids.narrow(1, at, n).contiguous();
          const std::vector<float> got = tensor::to_float_vector(
              gpu->forward_cached(chunk.to(kGpu), gpu_cache).data().to(Device::cpu()));
          // The last position alone (Note [Last-position logits]): the norm and head on a
          // strided [B, 1, C] view of the hidden states.
          const Tensor last =
              gpu->forward_cached(chunk.to(kGpu), last_cache, /*last_only=*/true).data();
          ASSERT_EQ(last.shape(), tensor::Shape({B, 1, Vp}));
          const std::vector<float> last_v = tensor::to_float_vector(last.to(Device::cpu()));
          for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < Vp; ++j)
              worst = std::max(
                  worst, std::fabs(static_cast<double>(last_v[static_cast<size_t>(b * Vp + j)]) -
                                   full[static_cast<size_t>((b * T + at + n - 1) * Vp + j)]));
          const std::vector<float> on_cpu =
              tensor::to_float_vector(cpu->forward_cached(chunk, cpu_cache).data());
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < n; ++t)
              for (int64_t j = 0; j < Vp; ++j) {
                const double g = got[static_cast<size_t>((b * n + t) * Vp + j)];
                const double f = full[static_cast<size_t>((b * T + at + t) * Vp + j)];
                worst = std::max(worst, std::fabs(g - f));
                worst_cpu = std::max(
                    worst_cpu, std::fabs(g - on_cpu[static_cast<size_t>((b * n + t) * Vp + j)]));
              }
          at += n;
        }
        EXPECT_EQ(gpu_cache.length(), T);
        if (dtype == DType::F32) {
          EXPECT_LE(worst, 1e-5 * std::max(1.0, largest));
          EXPECT_LE(worst_cpu, 1e-4 * largest);
        } else {
          EXPECT_LE(worst, 2e-2 * largest);
        }
        fmt::print(
            "{} {}: largest logit {:.3g}, |cached - full| <= {:.3g}, |gpu - cpu| <= {:.3g}\n",
            c.preset, dtype_name(dtype), largest, worst, worst_cpu);
        // Two [B, T, heads, D] buffers per layer, k and v, on the GPU.
        const int64_t layers = gpu_cache.layers();
        EXPECT_EQ(layers, 2);
        EXPECT_GE(gpu_activations() - before,
                  layers * 2 * B * T * c.kv_width * static_cast<int64_t>(dtype_size(dtype)));
      }
      EXPECT_EQ(gpu_activations(), before) << "the cache's buffers outlived it";
    }
}

// Batched sampling on the GPU (Note [Batched sampling]): each row's logits are read from a
// strided [B, vocab] view of the device's logits, the KV cache holds B rows. In f32 the GPU's
// samples are the CPU's, cached and not, for both families, past the context too; the rows differ.
TEST(GpuSampler, ABatchDrawsTheCpusSamples) {
  SKIP_WITHOUT_GPU();
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    models::ModelOptions o;
    o.seed = 6;
    // A short context so 4 + 12 tokens pass it; LLaMA's init raised so its draws spread.
    o.overrides = std::string(preset) == "gpt2-tiny"
                      ? std::map<std::string, std::string>{{"n_positions", "10"}}
                      : std::map<std::string, std::string>{{"max_position_embeddings", "10"},
                                                           {"initializer_range", "0.2"}};
    auto cpu = models::ModelRegistry::global().create(preset, o);
    auto gpu = models::ModelRegistry::global().create(preset, o);
    models::move_flat_units(gpu->flat_units(), kGpu);
    sampling::SampleOptions so;
    so.max_new_tokens = 12;
    so.temperature = 1.0;
    so.top_k = 0;
    so.seed = 9;
    const std::vector<int32_t> prompt{3, 1, 4, 1};
    const auto want = sampling::sample_batch(*cpu, prompt, so, 3);
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
    so.kv_cache = false;
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
    EXPECT_NE(want[0], want[1]);
    EXPECT_NE(want[1], want[2]);
    // A row that stops leaves the batch, its cache rows dropped on the device (Note [Dropping
    // cache rows]); the others go on drawing the CPU's tokens.
    so.stop_token = want[1][2];
    so.kv_cache = true;
    const auto want_stopped = sampling::sample_batch(*cpu, prompt, so, 3);
    EXPECT_LE(want_stopped[1].size(), 3u);
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want_stopped);
    so.kv_cache = false;
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want_stopped);
  }
}

// Note [Device candidates]: greedy and top-k draws on the GPU bring each row's top candidates to
// the host (the top-k kernel, Note [CUDA top-k]) instead of its whole logits, and draw the CPU's
// tokens, in f32, for both families, with the nucleus too, cached and not.
TEST(GpuSampler, DrawsFromTheDevicesCandidatesTheCpusTokens) {
  SKIP_WITHOUT_GPU();
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    models::ModelOptions o;
    o.seed = 7;
    if (std::string(preset) == "llama-tiny") o.overrides = {{"initializer_range", "0.2"}};
    auto cpu = models::ModelRegistry::global().create(preset, o);
    auto gpu = models::ModelRegistry::global().create(preset, o);
    models::move_flat_units(gpu->flat_units(), kGpu);
    const std::vector<int32_t> prompt{2, 7, 1, 8};
    struct Draw {
      double temperature;
      int64_t top_k;
      double top_p;
    };
    for (const Draw& d : {Draw{0.0, 0, 1.0}, Draw{1.0, 5, 1.0}, Draw{1.5, 9, 0.8}}) {
      SCOPED_TRACE(::testing::Message()
                   << "T " << d.temperature << " top_k " << d.top_k << " top_p " << d.top_p);
      sampling::SampleOptions so;
      so.max_new_tokens = 10;
      so.temperature = d.temperature;
      so.top_k = d.top_k;
      so.top_p = d.top_p;
      so.seed = 3;
      ASSERT_GT(sampling::detail::device_candidates(so, gpu->vocab_size(), kGpu), 0);
      const auto want = sampling::sample_batch(*cpu, prompt, so, 3);
#if defined(STRATA_CUDA_EMULATION)
      // Greedy draws take the one-pass kernel (Note [CUDA top-k]).
      const std::string kernel = d.top_k == 0 ? "top_1_kernel" : "top_k_kernel";
      const uint64_t before = cuda_emu::launches_of(kernel);
#endif
      EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
#if defined(STRATA_CUDA_EMULATION)
      EXPECT_EQ(cuda_emu::launches_of(kernel) - before,
                10u);  // one per step, every row in one launch
#endif
      so.kv_cache = false;
      EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
      if (d.temperature > 0) {
        EXPECT_NE(want[0], want[1]);
      }
    }
    // Note [Non-finite logits]: NaN weights make NaN logits, which rank first among the device's
    // candidates: a UserError, as on the CPU.
    gpu->flat_units().back().params.fill_(std::nan(""));
    for (double temperature : {0.0, 1.0}) {
      sampling::SampleOptions so;
      so.max_new_tokens = 2;
      so.temperature = temperature;
      so.top_k = 5;
      EXPECT_THROW(sampling::sample_batch(*gpu, prompt, so, 2), UserError);
    }
  }
}

// Both families on model shapes drawn at random (fixed seeds): any head count and head dim
// (the tensor-core attention's 64 and the SIMT kernel's others), LLaMA's grouped key/value heads
// and any FFN width, vocabularies padded or not, sequences of 1 to 48 tokens, micro-batches of 1 to
// 3. Each parameter's gradient on the GPU against the CPU's for one batch, fp32 and bf16, to the
// tolerances of the tests above.
TEST(TrainGpu, RandomModelShapesGiveTheCpuGradients) {
  SKIP_WITHOUT_GPU();
  const auto& registry = models::ModelRegistry::global();
  const char* more = std::getenv("STRATA_RANDOM_SHAPES_DRAWS");  // as in random_shapes_cuda_test
  const int draws = more ? std::atoi(more) : 8;
  for (int draw = 0; draw < draws; ++draw) {
    std::mt19937_64 rng(4000 + static_cast<uint64_t>(draw));
    const auto size = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    const bool llama = draw % 2 == 1;
    const int64_t heads = size(1, 4),
                  head_dim = std::vector<int64_t>{8, 16, 24, 32, 64}[size(0, 4)];
    const int64_t vocab = size(2, 300), T = size(1, 48), micro = size(1, 3);
    models::ModelOptions o;
    o.seed = static_cast<uint64_t>(50 + draw);
    o.overrides = {{"n_layer", std::to_string(size(1, 2))},
                   {"n_head", std::to_string(heads)},
                   {"n_embd", std::to_string(heads * head_dim)},
                   {"vocab_size", std::to_string(vocab)},
                   {"block_size", "64"}};
    if (size(0, 1) == 1) o.overrides["padded_vocab_size"] = std::to_string(vocab);
    if (llama) {
      std::vector<int64_t> divisors;
      for (int64_t k = 1; k <= heads; ++k)
        if (heads % k == 0) divisors.push_back(k);
      o.overrides["n_kv_head"] = std::to_string(divisors[size(0, divisors.size() - 1)]);
      o.overrides["intermediate_size"] = std::to_string(size(8, 200));
    }
    std::vector<int64_t> ids(static_cast<size_t>(micro * T)), targets(ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = size(0, vocab - 1), targets[i] = size(0, vocab - 1);
    const testing::Batch b{tensor::from_ints(ids, {micro, T}),
                           tensor::from_ints(targets, {micro, T})};
    std::string what = llama ? "llama-tiny" : "gpt2-tiny";
    for (const auto& [k, v] : o.overrides) what += " " + k + "=" + v;
    what += " T=" + std::to_string(T) + " B=" + std::to_string(micro);
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(what + " " + std::string(dtype_name(dtype)));
      auto cpu = registry.create(what.substr(0, what.find(' ')), o);
      auto gpu = registry.create(what.substr(0, what.find(' ')), o);
      if (dtype != DType::F32) {
        models::cast_flat_units(cpu->flat_units(), dtype);
        models::cast_flat_units(gpu->flat_units(), dtype);
      }
      models::move_flat_units(gpu->flat_units(), kGpu);
      expect_gradients_match(*cpu, *gpu, b, dtype == DType::F32 ? 1e-4 : 2e-2);
    }
  }
}

// ZeRO-3 with activation checkpointing on the GPU: every unit's parameters are released after its
// forward and gathered again for the checkpointed blocks' replay inside backward (then released
// again), in the order recorded in the first step. Five steps with two micro-batches give stage
// 0's bits, and stage 0 checkpointed gives the plain model's (Note [Activation checkpointing]).
TEST(TrainGpu, ZeroThreeWithActivationCheckpointingGivesStageZerosBits) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 5;
  s.accum = 2;
  s.max_norm = 0.5;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const GpuRun plain = gpu_engine_run(s, dtype);
    s.checkpointing = true;
    const GpuRun ref = gpu_engine_run(s, dtype);
    parallel::ZeroConfig z;
    z.stage = 3;
    z.reduce_bucket_size = 1000;
    z.allgather_bucket_size = 1000;
    z.stage3_param_persistence_threshold = 0;  // partition every unit
    z.stage3_prefetch_bucket_size = 20000;
    const GpuRun run = gpu_engine_run(s, dtype, z);
    s.checkpointing = false;
    ASSERT_EQ(run.losses.size(), ref.losses.size());
    ASSERT_EQ(plain.losses.size(), ref.losses.size());
    for (size_t i = 0; i < run.losses.size(); ++i) {
      EXPECT_EQ(run.losses[i], ref.losses[i]) << "step " << i;
      EXPECT_EQ(plain.losses[i], ref.losses[i]) << "step " << i;
    }
    EXPECT_EQ(run.params, ref.params);
    EXPECT_EQ(plain.params, ref.params);
  }
}

// DESIGN.md decision 7 on the GPU: bf16 params and grads with fp32 masters track fp32 training.
TEST(TrainGpu, Bf16LossStaysWithinTwoPercentOfFp32For200Steps) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 200;
  s.micro = 4;
  s.max_norm = 1.0;
  const GpuRun fp32 = gpu_engine_run(s, DType::F32);
  const GpuRun bf16 = gpu_engine_run(s, DType::BF16);
  ASSERT_EQ(fp32.losses.size(), 200u);
  ASSERT_EQ(bf16.losses.size(), 200u);
  for (size_t i = 0; i < fp32.losses.size(); ++i)
    EXPECT_LE(std::fabs(bf16.losses[i] - fp32.losses[i]), 0.02 * fp32.losses[i])
        << "step " << i << ": bf16 " << bf16.losses[i] << " vs fp32 " << fp32.losses[i];
  // It must train, or agreement would prove little.
  EXPECT_LT(fp32.losses.back(), fp32.losses.front() - 0.5);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.5);
}

// Note [TF32]: fp32 training with its GEMMs on TF32 tracks the f32 GEMMs' run within the bf16
// bar of 2% (TF32 keeps 10 fraction bits of each GEMM input where bf16 keeps 7 of every value),
// and its losses leave the f32 run's bits. (On the emulator the bias gradients' fallback under
// TF32 alone would change the bits too; CudaTf32.* in tests/cuda/tf32_test.cpp pin the rounding.)
TEST(TrainGpu, Tf32LossStaysWithinTwoPercentOfFp32) {
  SKIP_WITHOUT_GPU();
  struct Off {
    ~Off() { tensor::set_cuda_tf32(false); }
  } off;
  TrainSpec s;
  s.steps = 60;
  s.micro = 4;
  s.max_norm = 1.0;
  const GpuRun fp32 = gpu_engine_run(s, DType::F32);
  tensor::set_cuda_tf32(true);
  const GpuRun tf32 = gpu_engine_run(s, DType::F32);
  ASSERT_EQ(fp32.losses.size(), 60u);
  ASSERT_EQ(tf32.losses.size(), 60u);
  int differ = 0;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    EXPECT_LE(std::fabs(tf32.losses[i] - fp32.losses[i]), 0.02 * fp32.losses[i])
        << "step " << i << ": tf32 " << tf32.losses[i] << " vs fp32 " << fp32.losses[i];
    differ += tf32.losses[i] != fp32.losses[i] ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "TF32 GEMMs round their inputs: the losses cannot all keep f32's bits";
  EXPECT_LT(tf32.losses.back(), tf32.losses.front() - 0.5);
}

// DESIGN.md decision 9 on the GPU: deterministic kernels, so the same seed gives the same bits.
TEST(TrainGpu, SameSeedRunsAreBitwiseIdentical) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 20;
  s.accum = 2;
  s.max_norm = 1.0;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const GpuRun a = gpu_engine_run(s, dtype);
    const GpuRun b = gpu_engine_run(s, dtype);
    ASSERT_EQ(a.losses.size(), b.losses.size());
    for (size_t i = 0; i < a.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0)
          << "step " << i << ": " << a.losses[i] << " vs " << b.losses[i];
    EXPECT_EQ(a.params, b.params);
    EXPECT_EQ(a.masters, b.masters);
  }
}

// GPT-2 with 64-wide heads (n_embd 128, 2 heads) in bf16 trains on Strata's tensor-core attention
// (Note [CUDA tensor-core attention]; STRATA_ATTENTION=own keeps cuDNN out) and tracks the fp32
// run (whose attention is the SIMT kernel) within the bf16 bar of 2%.
TEST(TrainGpu, Bf16OnTheTensorCoreAttentionTracksFp32) {
  SKIP_WITHOUT_GPU();
  const char* old = std::getenv("STRATA_ATTENTION");
  const std::string saved = old ? old : "";
  setenv("STRATA_ATTENTION", "own", 1);
  TrainSpec s;
  s.steps = 60;
  s.micro = 4;
  s.max_norm = 1.0;
  auto run = [&](DType dtype) {
    models::gpt2::GPT2Config c = testing::tiny_config(s);
    c.n_embd = 128;
    c.n_head = 2;
    models::gpt2::GPT2 model(c, s.seed);
    models::move_flat_units(model.flat_units(), kGpu);
    parallel::Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"),
                            parallel::ZeroConfig{}, testing::adamw_factory(), dtype);
    std::vector<double> losses;
    for (int step = 0; step < s.steps; ++step) losses.push_back(gpu_engine_step(engine, s, step));
    return losses;
  };
  const std::vector<double> fp32 = run(DType::F32);
  const std::vector<double> bf16 = run(DType::BF16);
  EXPECT_EQ(tensor::cuda::last_attention_path(), tensor::cuda::AttentionPath::OwnTensorCore);
  if (old)
    setenv("STRATA_ATTENTION", saved.c_str(), 1);
  else
    unsetenv("STRATA_ATTENTION");
  testing::expect_trajectory(bf16, fp32, 0.02);
}

// Note [GPU caching allocator]: once the first steps have sized the cache, a training step is
// served from memory the allocator holds, with no cudaMalloc (which would synchronize the
// device), in fp32 and bf16, at stage 0 and at stage 3 (which releases and re-materialises every
// unit's parameters each step).
TEST(TrainGpu, NoDeviceAllocationAfterTheFirstSteps) {
  SKIP_WITHOUT_GPU();
  offload::GpuCachingAllocator& alloc =
      dynamic_cast<tensor::cuda::CudaBackend&>(tensor::backend_for(kGpu)).allocator();
  TrainSpec s;
  s.accum = 2;
  s.max_norm = 1.0;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int stage : {0, 3}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      parallel::ZeroConfig z;
      z.stage = stage;
      z.stage3_param_persistence_threshold = 0;
      auto model = gpu_model(s);
      parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                              testing::adamw_factory(), dtype);
      for (int step = 0; step < 2; ++step) gpu_engine_step(engine, s, step);
      const int64_t warm = alloc.counters().raw_mallocs;
      const int64_t hits = alloc.counters().cache_hits;
      for (int step = 2; step < 6; ++step) gpu_engine_step(engine, s, step);
      EXPECT_EQ(alloc.counters().raw_mallocs, warm) << "cudaMalloc in a steady-state step";
      EXPECT_GT(alloc.counters().cache_hits, hits);  // the steps did allocate, from the cache
    }
  }
}

// ZeRO 1-3 with GPU memory, in a world of one: partitioned optimizer state, reduce-scattered
// gradients, stage 3's per-unit gather and release through module hooks (storage released and
// materialised on the device) must give stage 0's bits, as they do on the CPU
// (EngineSelf.MatchesTheSingleProcessStepBitwise). Small buckets: several per unit.
TEST(TrainGpu, EveryZeroStageGivesStageZerosBits) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 5;
  s.accum = 2;
  s.max_norm = 0.5;  // small enough to clip
  for (DType dtype : {DType::F32, DType::BF16}) {
    const GpuRun ref = gpu_engine_run(s, dtype);
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      parallel::ZeroConfig z;
      z.stage = stage;
      z.reduce_bucket_size = 1000;
      z.allgather_bucket_size = 1000;
      z.stage3_param_persistence_threshold = 0;  // partition every unit
      z.stage3_prefetch_bucket_size = 20000;
      const GpuRun run = gpu_engine_run(s, dtype, z);
      ASSERT_EQ(run.losses.size(), ref.losses.size());
      for (size_t i = 0; i < run.losses.size(); ++i)
        EXPECT_EQ(run.losses[i], ref.losses[i]) << "step " << i;
      EXPECT_EQ(run.params, ref.params);
    }
  }
}

// fp16 on the GPU with DeepSpeed's dynamic loss scaling (initial scale 2^16): the gradients are
// computed scaled in f16, unscaled in f32 by the optimizer, and the run tracks fp32 within the
// bf16 bar (2%) with no overflow at these magnitudes.
TEST(TrainGpu, Fp16WithDynamicLossScalingTracksFp32) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  s.steps = 100;
  s.micro = 4;
  s.max_norm = 1.0;
  const GpuRun fp32 = gpu_engine_run(s, DType::F32);
  optim::LossScaler scaler;
  const GpuRun fp16 = gpu_engine_run(s, DType::F16, {}, &scaler);
  testing::expect_trajectory(fp16.losses, fp32.losses, 0.02);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

// An infinite gradient on the GPU: the step is skipped, the masters keep their bits, the scale
// halves (hysteresis 1), and the next step applies.
TEST(TrainGpu, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  auto model = gpu_model(s);
  parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"),
                          parallel::ZeroConfig{}, testing::adamw_factory(), DType::F16);
  optim::LossScalerConfig c;
  c.hysteresis = 1;
  optim::LossScaler scaler(c);
  engine.set_loss_scaler(&scaler);
  const double scale = scaler.scale();
  const std::vector<uint8_t> before = host_bytes(engine.optimizer().groups()[0].param);
  parallel::StepResult r;
  gpu_engine_step(engine, s, 0, &r, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(engine.optimizer().step_count(), 0);
  EXPECT_EQ(scaler.scale(), scale / 2);
  EXPECT_EQ(host_bytes(engine.optimizer().groups()[0].param), before);
  gpu_engine_step(engine, s, 1, &r);
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(std::isfinite(r.grad_norm));
  EXPECT_EQ(engine.optimizer().step_count(), 1);
  EXPECT_NE(host_bytes(engine.optimizer().groups()[0].param), before);
}

// Note [CUDA AdamW]: the optimizer's GPU path gives the CPU path's bits on the same groups.
TEST(TrainGpu, AdamWOnGpuGroupsMatchesTheCpuBitwise) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  models::gpt2::GPT2 cpu(testing::tiny_config(s), s.seed);
  auto gpu = gpu_model(s);
  const testing::Batch b = testing::make_batch(0, s.micro);
  cpu.loss(b.ids, b.targets).backward();
  // The same gradients on both sides, so only the optimizers are compared.
  for (size_t u = 0; u < cpu.flat_units().size(); ++u)
    gpu->flat_units()[u].grads.copy_(cpu.flat_units()[u].grads);
  optim::AdamW cpu_opt(parallel::unit_param_groups(cpu), testing::adamw_config());
  optim::AdamW gpu_opt(parallel::unit_param_groups(*gpu), testing::adamw_config());
  ASSERT_TRUE(gpu_opt.device().is_cuda());
  for (int i = 0; i < 3; ++i) {
    cpu_opt.set_grad_scale(0.5f);
    gpu_opt.set_grad_scale(0.5f);
    cpu_opt.step(1e-2);
    gpu_opt.step(1e-2);
  }
  for (size_t u = 0; u < cpu.flat_units().size(); ++u) {
    EXPECT_EQ(host_bytes(cpu.flat_units()[u].params), host_bytes(gpu->flat_units()[u].params))
        << cpu.flat_units()[u].name;
    EXPECT_EQ(host_bytes(cpu_opt.exp_avg_sq(u)), host_bytes(gpu_opt.exp_avg_sq(u)));
  }
  // State round trip across devices: the host copy loads back into the GPU buffers.
  optim::OptimizerState host = cpu_opt.state_dict();
  gpu_opt.load_state_dict(host);
  EXPECT_EQ(host_bytes(gpu_opt.exp_avg(0)), host_bytes(cpu_opt.exp_avg(0)));
}

TEST(TrainGpu, OptimizerRejectsMixedDevices) {
  SKIP_WITHOUT_GPU();
  optim::ParamGroup g;
  g.param = tensor::zeros({32}, DType::F32, kGpu);
  g.grad = tensor::zeros({32});  // on the host
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0) {
        optim::AdamW opt({g});
      } else {
        optim::Sgd opt({g});
      }
      ADD_FAILURE() << "a group with its grad on the host was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos) << e.what();
    }
  }
}

TEST(TrainGpu, GradClipOnTheGpuAgreesWithTheCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor host = tensor::uniform({100'000}, {5, 6}, -1.f, 1.f);
  const Tensor dev = host.to(kGpu);
  const double want = optim::global_grad_norm({host});
  EXPECT_NEAR(optim::global_grad_norm({dev}), want, 1e-9 * want);
  EXPECT_NEAR(optim::global_grad_norm({dev.to(DType::BF16)}),
              optim::global_grad_norm({host.to(DType::BF16)}), 1e-9 * want);
  optim::scale_grads({host}, 0.375f);
  optim::scale_grads({dev}, 0.375f);
  EXPECT_EQ(host_bytes(host), host_bytes(dev));  // one rounded multiply either way
}

// `train` on the GPU, in process: a tiny bf16 config trains, checkpoints, and a run stopped and
// resumed reproduces the uninterrupted one bitwise (dropout on: the RNG state resumes too).
constexpr const char* kAdamW = "{name: adamw, lr: 1.0e-2, weight_decay: 0.1, grad_clip: 1.0}";

// What the `train` runs below vary.
struct GpuTrainSpec {
  std::string optimizer = kAdamW;  // YAML flow maps
  std::string model =
      "{name: gpt2-tiny, config: {n_layer: 2, n_embd: 64, n_head: 2, n_positions: 32, "
      "dropout: 0.1}}";
  std::string dtype = "bf16";
  std::string extra;  // more top-level sections
  bool matmul_tuning = false;
  bool tf32 = false;  // run.tf32 (Note [TF32] in tensor/cuda.h)
};

std::string gpu_config(const std::string& data, const std::string& run, int64_t steps,
                       const GpuTrainSpec& spec) {
  return fmt::format(
      R"(run: {{dir: {run}, seed: 7, device: cuda, dtype: {dtype}, matmul_tuning: {tune},
      tf32: {tf32}}}
model: {model}
data: {{train: "{data}/train_*.bin", val: "{data}/val_*.bin", tokenizer: byte, shuffle: true}}
batch: {{micro_batch_size: 4, grad_accum_steps: 2, seq_len: 32}}
optimizer: {optimizer}
schedule: {{name: cosine, warmup_steps: 2, min_lr: 1.0e-3}}
training: {{steps: {steps}, eval_every: 3, eval_batches: 2, sample_every: 4, sample_tokens: 8,
           checkpoint_every: 2, progress: lines}}
{extra}
)",
      fmt::arg("run", run), fmt::arg("data", data), fmt::arg("steps", steps),
      fmt::arg("dtype", spec.dtype), fmt::arg("tune", spec.matmul_tuning ? "on" : "off"),
      fmt::arg("tf32", spec.tf32 ? "on" : "off"), fmt::arg("optimizer", spec.optimizer),
      fmt::arg("model", spec.model), fmt::arg("extra", spec.extra));
}

// gpu_config's run `name` (run.dir tmp/run_<name>) over shards in tmp/data, written once.
runtime::TrainConfig two_runs(const strata::testing::ScratchDir& tmp, const std::string& name,
                            int64_t steps, const GpuTrainSpec& spec = {}) {
  const std::string data = tmp / "data";
  if (!strata::testing::fs::exists(data)) {
    strata::testing::write_raw_shard(data + "/train_000000.bin",
                                    {strata::testing::pattern_tokens(8000, 200, 1)});
    strata::testing::write_raw_shard(data + "/val_000000.bin",
                                    {strata::testing::pattern_tokens(2000, 200, 3)});
  }
  const std::string file = tmp / (name + ".yaml");
  strata::testing::write_text(file, gpu_config(data, tmp / ("run_" + name), steps, spec));
  return runtime::load_train_config(file);
}

// `train` on the GPU as `spec` says: 7 steps, and the same run stopped after step 4 and resumed
// from its checkpoint, which must end with the uninterrupted run's bits.
void trains_checkpoints_and_resumes_bitwise(const GpuTrainSpec& spec) {
  strata::testing::ScratchDir tmp;
  const runtime::TrainConfig ca = two_runs(tmp, "a", 7, spec), cb = two_runs(tmp, "b", 7, spec);

  runtime::Trainer a(ca);
  EXPECT_TRUE(a.model().flat_units().front().params.device().is_cuda());
  EXPECT_EQ(a.model().flat_units().front().params.dtype(), spec.dtype == "fp16"   ? DType::F16
                                                           : spec.dtype == "fp32" ? DType::F32
                                                                                  : DType::BF16);
  EXPECT_EQ(tensor::cuda_tf32(), spec.tf32) << "run.tf32 decides";
  EXPECT_TRUE(a.engine().optimizer().device().is_cuda());
  ASSERT_EQ(a.run(), runtime::Trainer::Outcome::Finished);
  ASSERT_EQ(a.history().size(), 7u);
  for (const runtime::StepRecord& r : a.history()) EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_LT(a.history().back().loss, a.history().front().loss);
  EXPECT_TRUE(strata::testing::fs::exists(tmp / "run_a/checkpoints"));
  {
    runtime::Trainer b(cb);
    ASSERT_EQ(b.run(/*stop_at=*/4), runtime::Trainer::Outcome::Interrupted);
  }
  runtime::Trainer b(cb);  // resume: auto picks the step-4 checkpoint
  ASSERT_EQ(b.step(), 4);
  ASSERT_EQ(b.run(), runtime::Trainer::Outcome::Finished);
  ASSERT_EQ(b.history().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const runtime::StepRecord& ra = a.history()[4 + i];
    const runtime::StepRecord& rb = b.history()[i];
    EXPECT_EQ(std::memcmp(&ra.loss, &rb.loss, sizeof(float)), 0)
        << "step " << ra.step << ": " << ra.loss << " vs " << rb.loss;
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    EXPECT_EQ(ra.val_loss.has_value(), rb.val_loss.has_value());
    if (ra.val_loss && rb.val_loss) {
      EXPECT_EQ(*ra.val_loss, *rb.val_loss);
    }
  }
  const auto& ua = a.model().flat_units();
  const auto& ub = b.model().flat_units();
  ASSERT_EQ(ua.size(), ub.size());
  for (size_t u = 0; u < ua.size(); ++u) {
    EXPECT_EQ(host_bytes(ua[u].params), host_bytes(ub[u].params)) << ua[u].name;
    EXPECT_EQ(host_bytes(a.engine().optimizer().groups()[u].param),
              host_bytes(b.engine().optimizer().groups()[u].param))
        << ua[u].name << " master";
  }
  EXPECT_FALSE(a.sample_text().empty());
}

TEST(TrainGpu, TrainerRunsCheckpointsAndResumesBitwise) {
  SKIP_WITHOUT_GPU();
  trains_checkpoints_and_resumes_bitwise({});
}

// run.tf32: on through `train`: fp32 parameters, the switch on for the run, and a resume from the
// step-4 checkpoint reproduces the uninterrupted run bitwise (TF32 GEMMs are deterministic).
TEST(TrainGpu, Tf32RunTrainsAndResumesBitwise) {
  SKIP_WITHOUT_GPU();
  struct Off {
    ~Off() { tensor::set_cuda_tf32(false); }
  } off;
  GpuTrainSpec spec;
  spec.dtype = "fp32";
  spec.tf32 = true;
  trains_checkpoints_and_resumes_bitwise(spec);
}

// Note [CUDA SGD]: SGD's momentum buffers live on the GPU, go into the checkpoint and come back.
TEST(TrainGpu, SgdWithNesterovMomentumTrainsAndResumesBitwise) {
  SKIP_WITHOUT_GPU();
  GpuTrainSpec spec;
  spec.optimizer =
      "{name: sgd, lr: 5.0e-2, momentum: 0.9, nesterov: true, weight_decay: 0.01, grad_clip: 1.0}";
  trains_checkpoints_and_resumes_bitwise(spec);
}

// fp16 through `train` on the GPU (DeepSpeed's dynamic loss scaling, Note [Mixed precision]): the
// scale doubles after every 3 steps without overflow, so at the step-4 checkpoint the scaler is
// partway through its window, and the resumed run must take the scale, the count of good steps and
// the hysteresis from the checkpoint to reproduce the uninterrupted one (the scale changes which
// fp16 gradients round how).
TEST(TrainGpu, Fp16WithDynamicLossScalingResumesBitwise) {
  SKIP_WITHOUT_GPU();
  GpuTrainSpec spec;
  spec.dtype = "fp16";
  spec.extra = "fp16: {initial_scale_power: 12, loss_scale_window: 3}";
  trains_checkpoints_and_resumes_bitwise(spec);
}

// LLaMA through `train` on the GPU (RMSNorm fused with the residual, rotary embeddings, grouped
// key/value heads, SwiGLU, untied head) with checkpointed layers and recompute_swiglu, in bf16:
// it trains, and a resume from step 4 reproduces the uninterrupted run bitwise.
TEST(TrainGpu, LlamaWithCheckpointedLayersTrainsAndResumesBitwise) {
  SKIP_WITHOUT_GPU();
  GpuTrainSpec spec;
  spec.model =
      "{name: llama-tiny, config: {max_position_embeddings: 32, activation_checkpointing: true, "
      "recompute_swiglu: true}}";
  trains_checkpoints_and_resumes_bitwise(spec);
}

// Note [cuBLASLt tuning] in train: run.matmul_tuning: on keeps each rank's choices in run.dir, and
// a resume takes them from there, so it reproduces the uninterrupted run bitwise. On the emulator
// the candidates sum in different orders and the resumed process is made to find another one
// fastest (STRATA_CUDA_EMU_CUBLASLT_FASTEST): only the file keeps its algorithms, and its bits.
TEST(TrainGpu, TunedMatmulsResumeBitwiseFromTheirFile) {
  SKIP_WITHOUT_GPU();
  auto fastest = [](const char* i) {
#if defined(STRATA_CUDA_EMULATION)
    setenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST", i, 1);
#else
    (void)i;
#endif
  };
  struct Restore {
    ~Restore() {
      unsetenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST");
      tensor::set_cuda_matmul_tuning(false);
    }
  } restore;
  strata::testing::ScratchDir tmp;
  GpuTrainSpec with_tuning;
  with_tuning.matmul_tuning = true;
  const runtime::TrainConfig ca = two_runs(tmp, "a", 6, with_tuning),
                           cb = two_runs(tmp, "b", 6, with_tuning);

  fastest("2");
  runtime::Trainer a(ca);
  ASSERT_EQ(a.run(), runtime::Trainer::Outcome::Finished);
  const std::vector<tensor::CudaMatmulChoice> tuned = tensor::cuda_matmul_choices();
  ASSERT_FALSE(tuned.empty());
  for (const tensor::CudaMatmulChoice& c : tuned) {
    EXPECT_FALSE(c.from_file) << c.problem;
    // Training and evaluation GEMMs only: their m, n and k are rows (4 x 32), C, 3C or 4C
    // (C = 64). Sampling, whose lengths grow a token at a time, is not tuned.
    int64_t m = 0, n = 0, k = 0;
    ASSERT_EQ(std::sscanf(c.problem.c_str(), "m=%ld n=%ld k=%ld", &m, &n, &k), 3) << c.problem;
    EXPECT_TRUE(m % 32 == 0 && n % 32 == 0 && k % 32 == 0) << c.problem;
  }
  const std::string file = tmp / "run_a/matmul_tuning.rank0.tsv";
  ASSERT_TRUE(strata::testing::fs::exists(file));
  {
    runtime::Trainer b(cb);
    ASSERT_EQ(b.run(/*stop_at=*/4), runtime::Trainer::Outcome::Interrupted);
  }
  fastest("1");
  runtime::Trainer b(cb);  // resume: auto picks the step-4 checkpoint
  ASSERT_EQ(b.step(), 4);
  ASSERT_EQ(b.run(), runtime::Trainer::Outcome::Finished);
  const std::vector<tensor::CudaMatmulChoice> reread = tensor::cuda_matmul_choices();
  ASSERT_FALSE(reread.empty());
  for (const tensor::CudaMatmulChoice& c : reread) EXPECT_TRUE(c.from_file) << c.problem;
  ASSERT_EQ(b.history().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const runtime::StepRecord& ra = a.history()[4 + i];
    const runtime::StepRecord& rb = b.history()[i];
    EXPECT_EQ(std::memcmp(&ra.loss, &rb.loss, sizeof(float)), 0)
        << "step " << ra.step << ": " << ra.loss << " vs " << rb.loss;
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
  }
  const auto& ua = a.model().flat_units();
  const auto& ub = b.model().flat_units();
  ASSERT_EQ(ua.size(), ub.size());
  for (size_t u = 0; u < ua.size(); ++u)
    EXPECT_EQ(host_bytes(ua[u].params), host_bytes(ub[u].params)) << ua[u].name;
}

// Note [GELU recompute] on the GPU: the same loss bits, the gradients within f32 noise (cuBLASLt's
// GELU epilogue made the forward's h, Strata's gelu kernel the recomputed one), and the GPU's
// activation peak lower by at least every layer's GELU output (B T 4C f32 values).
TEST(TrainGpu, RecomputedGeluKeepsTheLossAndFreesTheGeluOutputs) {
  SKIP_WITHOUT_GPU();
  TrainSpec s;
  struct Run {
    float loss = 0;
    std::vector<Tensor> grads;
    int64_t peak = 0;
  };
  auto run = [&](bool recompute) {
    models::gpt2::GPT2Config c = testing::tiny_config(s);
    c.recompute_gelu = recompute;
    models::gpt2::GPT2 model(c, s.seed);
    models::move_flat_units(model.flat_units(), kGpu);
    const testing::Batch b = testing::make_batch(0, s.micro);
    auto& stats = offload::MemoryStats::global();
    const auto activations = [&] {
      return stats.usage(offload::Tier::Gpu, offload::Category::Activation);
    };
    const int64_t before = activations().current;
    stats.reset_peaks();
    autograd::Variable loss = model.loss(b.ids.to(kGpu), b.targets.to(kGpu));
    loss.backward();
    Run r;
    r.loss = loss.item();
    r.peak = activations().peak - before;
    for (auto& p : model.parameters()) r.grads.push_back(p.grad().to(Device::cpu()));
    return r;
  };
  const Run kept = run(false), recomputed = run(true);
  EXPECT_EQ(std::memcmp(&kept.loss, &recomputed.loss, sizeof(float)), 0)
      << kept.loss << " vs " << recomputed.loss;
  ASSERT_EQ(kept.grads.size(), recomputed.grads.size());
  for (size_t i = 0; i < kept.grads.size(); ++i) {
    const double scale = std::max(tensor::l2_norm(kept.grads[i]), 1e-12);
    EXPECT_LT(tensor::l2_norm(tensor::sub(recomputed.grads[i], kept.grads[i])) / scale, 1e-5)
        << "gradient " << i;
  }
  const int64_t h_bytes = s.micro * TrainSpec::kSeq * 4 * 32 * int64_t{4};
  EXPECT_GE(kept.peak - recomputed.peak, s.n_layer * h_bytes)
      << kept.peak << " bytes kept, " << recomputed.peak << " recomputed";
}

// Note [Training on the GPU]: a steady-state `train` step lets the device run dry twice, when the
// host waits for its micro-batches' losses (read together) and for the gradient norm, however
// many micro-batches it has. Nothing in a forward or backward waits for the device: not the id
// and target checks (Note [Deferred device checks]), the loss's mean or the embedding backward
// (Note [CUDA embedding backward]). Counted by the CUDA emulator: Stats::idle_waits are the host
// waits after which no work was left queued (the pinned staging ring's waits for copies a few
// micro-batches old only pace the host). A run of 6 steps minus a run of 2 leaves 4
// steady-state steps; setup, the final evaluation and checkpoint are the same in both, and a
// first run warms what is built once per process (cuBLASLt and cuDNN plans).
TEST(TrainGpu, ATrainStepWaitsForTheDeviceTwice) {
  SKIP_WITHOUT_GPU();
#if !defined(STRATA_CUDA_EMULATION)
  GTEST_SKIP() << "counts the host's waits with the CUDA emulator's counters";
#else
  strata::testing::ScratchDir tmp;
  const std::string data = tmp / "data";
  strata::testing::write_raw_shard(data + "/train_000000.bin",
                                  {strata::testing::pattern_tokens(8000, 200, 1)});
  for (int accum : {1, 4}) {
    SCOPED_TRACE(fmt::format("grad_accum_steps {}", accum));
    int runs = 0;
    auto waits_of_a_run = [&](int64_t steps) {
      const std::string name = fmt::format("w{}_{}", accum, runs++);  // a fresh run directory
      strata::testing::write_text(
          tmp / (name + ".yaml"),
          fmt::format(R"(run: {{dir: {run}, seed: 7, device: cuda, dtype: bf16}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 64, n_head: 2, n_positions: 32}}
data: {{train: "{data}/train_*.bin", tokenizer: byte}}
batch: {{micro_batch_size: 2, grad_accum_steps: {accum}, seq_len: 32}}
optimizer: {{name: adamw, lr: 1.0e-3, grad_clip: 1.0}}
training: {{steps: {steps}, eval_every: 0, sample_every: 0, checkpoint_every: 0, progress: lines}}
)",
                      fmt::arg("run", tmp / name), fmt::arg("data", data), fmt::arg("accum", accum),
                      fmt::arg("steps", steps)));
      const uint64_t before = cuda_emu::stats().idle_waits;
      runtime::Trainer t(runtime::load_train_config(tmp / (name + ".yaml")));
      EXPECT_EQ(t.run(), runtime::Trainer::Outcome::Finished);
      return cuda_emu::stats().idle_waits - before;
    };
    waits_of_a_run(2);
    const uint64_t short_run = waits_of_a_run(2), long_run = waits_of_a_run(6);
    EXPECT_EQ(long_run - short_run, 4u * 2u)
        << short_run << " idle waits in 2 steps, " << long_run << " in 6";
  }
#endif
}

// training.profile_steps (Note [CUDA op profiler]): `train` times every op of the window and
// writes the table to the log and to run.dir/profile.md; steps outside the window are not in it.
TEST(TrainGpu, TrainProfilesTheStepsItIsAskedTo) {
  SKIP_WITHOUT_GPU();
  strata::testing::ScratchDir tmp;
  const std::string data = tmp / "data";
  strata::testing::write_raw_shard(data + "/train_000000.bin",
                                  {strata::testing::pattern_tokens(8000, 200, 1)});
  strata::testing::write_text(tmp / "p.yaml",
                             fmt::format(R"(run: {{dir: {run}, seed: 7, device: cuda, dtype: bf16}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 64, n_head: 2, n_positions: 32}}
data: {{train: "{data}/train_*.bin", tokenizer: byte}}
batch: {{micro_batch_size: 2, grad_accum_steps: 2, seq_len: 32}}
optimizer: {{name: adamw, lr: 1.0e-3, grad_clip: 1.0}}
training: {{steps: 5, eval_every: 0, sample_every: 0, checkpoint_every: 0, progress: lines,
           profile_steps: 3, profile_start: 2}}
)",
                                         fmt::arg("run", tmp / "run"), fmt::arg("data", data)));
  const runtime::TrainConfig config = runtime::load_train_config(tmp / "p.yaml");
  runtime::Trainer t(config);
  EXPECT_EQ(t.run(), runtime::Trainer::Outcome::Finished);
  const std::string table = strata::testing::read_text(tmp / "run/profile.md");
  EXPECT_NE(table.find("GPU time per op over steps 2 to 4"), std::string::npos) << table;
  // Once per step: AdamW and the gradient norm; per micro-batch (2 a step): the loss, forward
  // and backward in one kernel (Note [Fused cross-entropy gradient]: train knows the loss's
  // gradient before the forward), so no separate backward.
  EXPECT_NE(table.find("| adamw | 1 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| sum_squares | 1 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| cross_entropy_fused | 2 |"), std::string::npos) << table;
  EXPECT_EQ(table.find("| cross_entropy_backward |"), std::string::npos) << table;
  EXPECT_NE(table.find("| step (host clock) |"), std::string::npos) << table;
  // Note [Roofline bound]: the device's peaks are known (the emulator reports an H100 SXM's), so
  // every op has its bound.
  EXPECT_NE(table.find("| GB/step | bound ms/step | % of bound |"), std::string::npos) << table;
  // Note [GPU peaks]: MFU on the GPU counts against the bf16 datasheet peak of an H100 SXM.
  models::ModelOptions mo;
  mo.overrides = config.model.config;
  const models::ModelShape shape = models::ModelRegistry::global().shape(config.model.name, mo);
  const double flops_per_token = runtime::training_flops_per_token(shape, 32);
  ASSERT_EQ(t.history().size(), 5u);
  for (const runtime::StepRecord& r : t.history()) {
    EXPECT_GT(r.mfu, 0.0) << "step " << r.step;
    EXPECT_NEAR(r.mfu, flops_per_token * r.tokens_per_s / 989.4e12, 1e-9 * r.mfu)
        << "step " << r.step;
  }
}

}  // namespace
}  // namespace strata
