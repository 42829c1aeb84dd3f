// The trainer in-process: training learns, and a run stopped and resumed reproduces an
// uninterrupted one bitwise (Note [Training step] in tools/common/trainer.h).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tool_test_util.h"
#include "tools/common/token_shard.h"
#include "tools/common/train_config.h"
#include "tools/common/trainer.h"

namespace strata::tools {
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
    if (ra.val_loss) EXPECT_EQ(*ra.val_loss, *rb.val_loss);
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
}  // namespace strata::tools
