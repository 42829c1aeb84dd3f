// The trainer in-process: training learns, and a run stopped and resumed reproduces an
// uninterrupted one bitwise (Note [Training step] in runtime/trainer.h).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "data/token_shard.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"
#include "tests/support/tool_test_util.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

// Train/val shards of a learnable byte-valued pattern.
void make_data(const std::string& dir) {
  testing::write_raw_shard(dir + "/train_000000.bin", {testing::pattern_tokens(3000, 200, 1)});
  testing::write_raw_shard(dir + "/train_000001.bin", {testing::pattern_tokens(2000, 200, 2)});
  testing::write_raw_shard(dir + "/val_000000.bin", {testing::pattern_tokens(1000, 200, 3)});
}

std::string config_text(const std::string& data, const std::string& run, int64_t steps,
                        const std::string& extra = "") {
  return fmt::format(R"(run: {{dir: {run}, seed: 7}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 32, n_head: 2, n_positions: 32, dropout: 0.1}}
data: {{train: "{data}/train_*.bin", val: "{data}/val_*.bin", tokenizer: byte, shuffle: true}}
batch: {{micro_batch_size: 2, grad_accum_steps: 2, seq_len: 16}}
optimizer: {{name: adamw, lr: 1.0e-2, weight_decay: 0.1, grad_clip: 1.0}}
schedule: {{name: cosine, warmup_steps: 2, min_lr: 1.0e-3}}
training: {{steps: {steps}, eval_every: 3, eval_batches: 2, progress: lines}}
{extra}
)",
                     fmt::arg("run", run), fmt::arg("data", data), fmt::arg("steps", steps),
                     fmt::arg("extra", extra));
}

TrainConfig write_and_load(const std::string& path, const std::string& text) {
  testing::write_text(path, text);
  return load_train_config(path);
}

std::vector<float> flat_params(models::CausalLM& model) {
  std::vector<float> out;
  for (const auto& u : model.flat_units()) {
    auto v = tensor::to_float_vector(u.params);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<std::string> metric_lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(testing::read_text(path));
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Note [Non-finite logits]: a run whose weights are not finite reports its sample as skipped,
// with the reason, instead of failing (or drawing garbage); a finite model's sample is text.
TEST(Trainer, SampleOfADivergedModelIsSkippedWithTheReason) {
  ScratchDir tmp;
  make_data(tmp / "data");
  TrainConfig c = write_and_load(tmp / "c.yaml", config_text(tmp / "data", tmp / "run", 4));
  Trainer trainer(c);
  const std::string fine = trainer.sample_event();
  EXPECT_EQ(fine.rfind("sample at step 0:\n", 0), 0u) << fine;
  trainer.model().flat_units().back().params.fill_(std::nan(""));
  const std::string skipped = trainer.sample_event();
  EXPECT_EQ(skipped.rfind("sample at step 0 skipped: sampling: the logits of sample 0", 0), 0u)
      << skipped;
  EXPECT_NE(skipped.find("not finite"), std::string::npos) << skipped;
}

TEST(Trainer, LossFalls) {
  ScratchDir tmp;
  make_data(tmp / "data");
  TrainConfig c = write_and_load(tmp / "c.yaml", config_text(tmp / "data", tmp / "run", 40));
  Trainer trainer(c);
  ASSERT_EQ(trainer.run(), Trainer::Outcome::Finished);
  const auto& h = trainer.history();
  ASSERT_EQ(h.size(), 40u);
  float first = (h[0].loss + h[1].loss) / 2, last = (h[38].loss + h[39].loss) / 2;
  // From ln(256) = 5.55 at init; the data's entropy floor is ~0.8 nats (one random token in 7).
  EXPECT_NEAR(first, std::log(256.0f), 0.1f);
  EXPECT_LT(last, first - 0.8f) << "first " << first << " last " << last;
  ASSERT_TRUE(h.back().val_loss.has_value());
  EXPECT_LT(*h.back().val_loss, h[0].loss - 0.8f);
  EXPECT_EQ(metric_lines(tmp / "run/metrics.jsonl").size(), 40u);
  EXPECT_TRUE(fs::exists(tmp / "run/config.yaml"));
  EXPECT_FALSE(trainer.last_checkpoint().empty());
}

// training.final_checkpoint: false leaves no checkpoint behind when the run ends (a periodic one
// still lands); true, the default, writes one after the last step.
TEST(Trainer, FinalCheckpointCanBeTurnedOff) {
  ScratchDir tmp;
  make_data(tmp / "data");
  TrainConfig off = write_and_load(tmp / "off.yaml", config_text(tmp / "data", tmp / "off", 3));
  off.training.final_checkpoint = false;
  Trainer a(off);
  ASSERT_EQ(a.run(), Trainer::Outcome::Finished);
  EXPECT_TRUE(a.last_checkpoint().empty());
  EXPECT_FALSE(fs::exists(tmp / "off/checkpoints"));

  TrainConfig periodic = write_and_load(tmp / "p.yaml", config_text(tmp / "data", tmp / "p", 3));
  periodic.training.final_checkpoint = false;
  periodic.training.checkpoint_every = 2;
  Trainer b(periodic);
  ASSERT_EQ(b.run(), Trainer::Outcome::Finished);
  EXPECT_NE(b.last_checkpoint().find("step_00000002"), std::string::npos) << b.last_checkpoint();
}

TEST(Trainer, ResumeIsBitwiseIdenticalToAnUninterruptedRun) {
  ScratchDir tmp;
  make_data(tmp / "data");
  TrainConfig ca = write_and_load(tmp / "a.yaml", config_text(tmp / "data", tmp / "run_a", 7));
  TrainConfig cb = write_and_load(tmp / "b.yaml", config_text(tmp / "data", tmp / "run_b", 7));

  Trainer a(ca);
  ASSERT_EQ(a.run(), Trainer::Outcome::Finished);
  {
    Trainer b(cb);
    ASSERT_EQ(b.run(/*stop_at=*/4), Trainer::Outcome::Interrupted);
    EXPECT_EQ(b.step(), 4);
  }
  Trainer b(cb);  // training.resume: auto (the default) picks the step-4 checkpoint
  EXPECT_EQ(b.step(), 4);
  ASSERT_EQ(b.run(), Trainer::Outcome::Finished);
  ASSERT_EQ(b.history().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const StepRecord& ra = a.history()[4 + i];
    const StepRecord& rb = b.history()[i];
    EXPECT_EQ(ra.step, rb.step);
    EXPECT_EQ(std::memcmp(&ra.loss, &rb.loss, sizeof(float)), 0)
        << "step " << ra.step << ": " << ra.loss << " vs " << rb.loss;
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    EXPECT_EQ(ra.lr, rb.lr);
    EXPECT_EQ(ra.val_loss.has_value(), rb.val_loss.has_value());
    if (ra.val_loss && rb.val_loss) {
      EXPECT_EQ(*ra.val_loss, *rb.val_loss);
    }
  }
  auto pa = flat_params(a.model()), pb = flat_params(b.model());
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);

  // The metrics files tell the same story: same seven losses, written identically.
  auto la = metric_lines(tmp / "run_a/metrics.jsonl"),
       lb = metric_lines(tmp / "run_b/metrics.jsonl");
  ASSERT_EQ(la.size(), 7u);
  ASSERT_EQ(lb.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    auto ja = nlohmann::json::parse(la[i]), jb = nlohmann::json::parse(lb[i]);
    EXPECT_EQ(ja["step"], jb["step"]);
    EXPECT_EQ(ja["loss"].get<double>(), jb["loss"].get<double>()) << "line " << i;
  }
}

// Note [Mixed precision] (parallel/engine.h) through the trainer: bf16 and fp16 (with dynamic
// loss scaling, its state in the checkpoint) resume bitwise, like fp32 above.
TEST(Trainer, MixedPrecisionResumeIsBitwise) {
  for (const char* dtype : {"bf16", "fp16"}) {
    SCOPED_TRACE(dtype);
    ScratchDir tmp;
    make_data(tmp / "data");
    // A small window so the fp16 scale grows during the run (the scaler's state must resume).
    const std::string extra = "fp16: {loss_scale_window: 3, initial_scale_power: 8}";
    TrainConfig ca =
        write_and_load(tmp / "a.yaml", config_text(tmp / "data", tmp / "run_a", 7, extra));
    TrainConfig cb =
        write_and_load(tmp / "b.yaml", config_text(tmp / "data", tmp / "run_b", 7, extra));
    ca.run.dtype = cb.run.dtype = dtype;
    Trainer a(ca);
    ASSERT_EQ(a.run(), Trainer::Outcome::Finished);
    for (const auto& u : a.model().flat_units())
      ASSERT_EQ(u.params.dtype(), std::string(dtype) == "bf16" ? DType::BF16 : DType::F16);
    {
      Trainer b(cb);
      ASSERT_EQ(b.run(/*stop_at=*/4), Trainer::Outcome::Interrupted);
    }
    if (std::string(dtype) == "fp16") {
      const auto st = nlohmann::json::parse(
          testing::read_text(tmp / "run_b/checkpoints/step_00000004/trainer_state.json"));
      EXPECT_EQ(st["loss_scale"].get<double>(), 512.0) << "2^8 doubled after 3 clean steps";
      EXPECT_EQ(st["loss_scale_iteration"].get<int64_t>(), 4);
    }
    Trainer b(cb);
    EXPECT_EQ(b.step(), 4);
    ASSERT_EQ(b.run(), Trainer::Outcome::Finished);
    ASSERT_EQ(b.history().size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const StepRecord& ra = a.history()[4 + i];
      const StepRecord& rb = b.history()[i];
      EXPECT_EQ(std::memcmp(&ra.loss, &rb.loss, sizeof(float)), 0)
          << "step " << ra.step << ": " << ra.loss << " vs " << rb.loss;
      EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    }
    EXPECT_EQ(flat_params(a.model()), flat_params(b.model()));
    EXPECT_LT(a.history().back().loss, a.history().front().loss);
  }
}

// Precision may change across a resume: an fp32 checkpoint continues in bf16 (the masters are
// its fp32 parameters, exactly), and that bf16 checkpoint continues in fp32 from its masters.
TEST(Trainer, ResumeAcrossPrecisions) {
  ScratchDir tmp;
  make_data(tmp / "data");
  TrainConfig c = write_and_load(tmp / "c.yaml", config_text(tmp / "data", tmp / "run", 3));
  std::vector<float> fp32_params;
  {
    Trainer t(c);
    ASSERT_EQ(t.run(), Trainer::Outcome::Finished);
    fp32_params = flat_params(t.model());
  }
  c.training.steps = 5;
  c.run.dtype = "bf16";
  std::vector<float> masters_as_bf16;
  {
    Trainer t(c);
    EXPECT_EQ(t.step(), 3);
    // The model holds the fp32 parameters rounded to bf16.
    std::vector<float> expect;
    for (float x : fp32_params) expect.push_back(x);
    auto rounded = tensor::to_float_vector(
        tensor::from_vector(expect, {static_cast<int64_t>(expect.size())}).to(DType::BF16));
    EXPECT_EQ(flat_params(t.model()), rounded);
    ASSERT_EQ(t.run(), Trainer::Outcome::Finished);
    masters_as_bf16 = flat_params(t.model());
  }
  const std::string ck = tmp / "run/checkpoints/step_00000005";
  ASSERT_TRUE(fs::exists(ck));
  c.training.steps = 6;
  c.run.dtype = "fp32";
  Trainer t(c);
  EXPECT_EQ(t.step(), 5);
  // fp32 parameters from the bf16 run's fp32 masters: not all bf16-representable.
  const auto p = flat_params(t.model());
  ASSERT_EQ(p.size(), masters_as_bf16.size());
  int64_t finer = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(p[i], masters_as_bf16[i], std::fabs(masters_as_bf16[i]) / 128 + 1e-30);
    finer += p[i] != masters_as_bf16[i];
  }
  EXPECT_GT(finer, 0) << "the fp32 run took the bf16 parameters, not the masters";
  ASSERT_EQ(t.run(), Trainer::Outcome::Finished);
}

TEST(Trainer, ResumeFromAnOlderCheckpointCutsTheMetricsBack) {
  ScratchDir tmp;
  make_data(tmp / "data");
  TrainConfig c =
      write_and_load(tmp / "c.yaml", config_text(tmp / "data", tmp / "run", 6, "") + "");
  c.training.checkpoint_every = 2;
  c.training.keep_checkpoints = 0;
  {
    Trainer t(c);
    ASSERT_EQ(t.run(), Trainer::Outcome::Finished);
  }
  TrainConfig r = c;
  r.training.resume = tmp / "run/checkpoints/step_00000002";
  Trainer t(r);
  EXPECT_EQ(t.step(), 2);
  EXPECT_EQ(metric_lines(tmp / "run/metrics.jsonl").size(), 2u);
  ASSERT_EQ(t.run(), Trainer::Outcome::Finished);
  EXPECT_EQ(metric_lines(tmp / "run/metrics.jsonl").size(), 6u);
}

}  // namespace
}  // namespace strata::runtime
