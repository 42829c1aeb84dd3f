// `train` on the GPU, in process: runs that checkpoint and resume bitwise (AdamW, SGD, fp16,
// TF32, LLaMA with checkpointed layers, tuned matmuls), the recomputed GELU, the host waits of a
// step and the step profile. Every test skips itself when no device is visible; there is no GPU
// in CI.
#include "tests/cuda/train_gpu_test_util.h"

namespace strata {
namespace {

using namespace train_gpu_test;

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
