// Note [CPU checkpointing] on the GPU (the CUDA emulator in CI-less runs, a real device where
// there is one): the checkpointed blocks' inputs wait for backward in pinned host memory, and
// the loss and every gradient keep the bits of plain activation checkpointing, in the model and
// through `train`. Every test skips itself when no device is visible.
#include "autograd/checkpoint.h"
#include "tests/cuda/train_gpu_test_util.h"

namespace strata {
namespace {

using namespace train_gpu_test;
using offload::Category;
using offload::Tier;

struct OffloadRun {
  float loss = 0;
  std::vector<std::vector<uint8_t>> grads;
  int64_t device_kept = 0;   // device activation bytes held for backward when the loss returns
  int64_t pinned_kept = 0;   // pinned activation bytes then
  int64_t pinned_after = 0;  // pinned activation bytes once backward is done
  int64_t device_peak = 0;   // device activation peak over forward and backward
};

OffloadRun offload_run(const models::ModelOptions& o, DType dtype, bool cpu_checkpointing) {
  autograd::CpuCheckpointingScope scope(cpu_checkpointing);
  auto model = models::ModelRegistry::global().create("gpt2-tiny", o);
  if (dtype != DType::F32) models::cast_flat_units(model->flat_units(), dtype);
  models::move_flat_units(model->flat_units(), kGpu);
  const testing::Batch b = testing::make_batch(5, 2);
  const Tensor ids = b.ids.to(kGpu), targets = b.targets.to(kGpu);
  Generator gen(23);
  autograd::GeneratorScope rng(gen);
  auto& stats = offload::MemoryStats::global();
  auto device = [&] { return stats.usage(Tier::Gpu, Category::Activation).current; };
  auto pinned = [&] { return stats.usage(Tier::Pinned, Category::Activation).current; };
  const int64_t device_before = device(), pinned_before = pinned();
  stats.reset_peaks();
  OffloadRun r;
  {
    autograd::Variable loss = model->loss(ids, targets);
    r.device_kept = device() - device_before;
    r.pinned_kept = pinned() - pinned_before;
    loss.backward();
    r.loss = loss.item();
  }
  r.pinned_after = pinned() - pinned_before;
  r.device_peak = stats.usage(Tier::Gpu, Category::Activation).peak - device_before;
  for (auto& p : model->parameters()) r.grads.push_back(host_bytes(p.grad()));
  return r;
}

// GPT-2 with dropout (the replay rewinds the generator), f32 and bf16: the same loss and
// gradient bits as checkpoints kept on the device; the pinned bytes held for backward are
// exactly the blocks' inputs (n_layer x B x T x C values), the device holds that much less, and
// backward gives all of it back.
TEST(CpuCheckpointing, SameBitsAndTheCheckpointsMoveToPinnedMemory) {
  SKIP_WITHOUT_GPU();
  models::ModelOptions o;
  o.seed = 31;
  o.overrides = {{"dropout", "0.1"}, {"activation_checkpointing", "true"}};
  const models::ModelShape shape = models::ModelRegistry::global().shape("gpt2-tiny", o);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const OffloadRun device = offload_run(o, dtype, false);
    const OffloadRun host = offload_run(o, dtype, true);
    EXPECT_EQ(std::memcmp(&device.loss, &host.loss, sizeof(float)), 0)
        << device.loss << " vs " << host.loss;
    ASSERT_EQ(device.grads.size(), host.grads.size());
    for (size_t i = 0; i < device.grads.size(); ++i)
      EXPECT_TRUE(device.grads[i] == host.grads[i]) << "gradient " << i;
    const int64_t checkpoints = shape.n_layer * 2 * TrainSpec::kSeq * shape.n_embd *
                                static_cast<int64_t>(dtype_size(dtype));
    EXPECT_EQ(device.pinned_kept, 0);
    EXPECT_EQ(host.pinned_kept, checkpoints);
    EXPECT_EQ(device.device_kept - host.device_kept, checkpoints)
        << device.device_kept << " device bytes kept without, " << host.device_kept << " with";
    EXPECT_EQ(host.pinned_after, 0);
    EXPECT_LT(host.device_peak, device.device_peak);
    std::printf(
        "cpu_checkpointing %s: checkpoints %lld B; device kept %lld -> %lld B, pinned "
        "kept 0 -> %lld B; device activation peak %lld -> %lld B\n",
        std::string(dtype_name(dtype)).c_str(), static_cast<long long>(checkpoints),
        static_cast<long long>(device.device_kept), static_cast<long long>(host.device_kept),
        static_cast<long long>(host.pinned_kept), static_cast<long long>(device.device_peak),
        static_cast<long long>(host.device_peak));
  }
}

// Through `train`: activation_checkpointing.cpu_checkpointing gives the losses of plain
// checkpointing bitwise, step by step.
TEST(CpuCheckpointing, TrainKeepsTheLossesOfPlainCheckpointing) {
  SKIP_WITHOUT_GPU();
  strata::testing::ScratchDir tmp;
  const std::string data = tmp / "data";
  strata::testing::write_raw_shard(data + "/train_000000.bin",
                                   {strata::testing::pattern_tokens(8000, 200, 1)});
  auto losses = [&](const std::string& name, bool cpu) {
    strata::testing::write_text(
        tmp / (name + ".yaml"),
        fmt::format(R"(run: {{dir: {run}, seed: 7, device: cuda, dtype: bf16}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 64, n_head: 2, n_positions: 32, dropout: 0.1,
           activation_checkpointing: true}}
data: {{train: "{data}/train_*.bin", tokenizer: byte}}
batch: {{micro_batch_size: 2, grad_accum_steps: 2, seq_len: 32}}
optimizer: {{name: adamw, lr: 1.0e-2, grad_clip: 1.0}}
schedule: {{name: constant}}
training: {{steps: 3, eval_every: 0, sample_every: 0, checkpoint_every: 0, progress: lines}}
activation_checkpointing: {{cpu_checkpointing: {cpu}}}
)",
                    fmt::arg("run", tmp / name), fmt::arg("data", data),
                    fmt::arg("cpu", cpu ? "true" : "false")));
    runtime::Trainer t(runtime::load_train_config(tmp / (name + ".yaml")));
    EXPECT_EQ(t.run(), runtime::Trainer::Outcome::Finished);
    EXPECT_EQ(autograd::cpu_checkpointing(), cpu) << "the Trainer sets it for its life";
    std::vector<float> out;
    for (const auto& r : t.history()) out.push_back(r.loss);
    return out;
  };
  const std::vector<float> device = losses("device", false);
  const std::vector<float> host = losses("host", true);
  ASSERT_EQ(device.size(), 3u);
  ASSERT_EQ(host.size(), 3u);
  for (size_t i = 0; i < device.size(); ++i)
    EXPECT_EQ(std::memcmp(&device[i], &host[i], sizeof(float)), 0)
        << "step " << i + 1 << ": " << device[i] << " vs " << host[i];
  EXPECT_FALSE(autograd::cpu_checkpointing()) << "restored when the Trainer is gone";
}

}  // namespace
}  // namespace strata
