// Training on the GPU (issue 4's "Must show"): the model, the optimizer, the engine and `train`
// with their flat units on CUDA (Note [Training on the GPU] in runtime/trainer.h). This file: each
// parameter's gradient against the CPU's (also at random model shapes), gradients into their
// flat buffers, and activation checkpointing. Engine steps are in train_gpu_steps_test.cpp,
// `train` in train_gpu_trainer_test.cpp, the KV cache and sampling in
// train_gpu_sampling_test.cpp. Every test skips itself when no device is visible; there is no
// GPU in CI.
#include "tests/cuda/train_gpu_test_util.h"

namespace strata {
namespace {

using namespace train_gpu_test;

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

}  // namespace
}  // namespace strata
