#include "runtime/train_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "models/registry.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

const fs::path kConfigs = fs::path(STRATA_SOURCE_DIR) / "configs";

// A small valid CPU config; bad configs below are variations of it.
const char* kTiny = R"(run:
  dir: runs/test
data:
  train: data/x/train_*.bin
  val: data/x/val_*.bin
batch:
  micro_batch_size: 4
  seq_len: 32
training:
  steps: 10
)";

class TrainConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / ("strata_train_config_test_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

  fs::path dir_;
};

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError raised";
  return "";
}

#define EXPECT_CONTAINS(text, part)                                                                \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" \
                                                             << (text)

TEST_F(TrainConfigTest, EveryShippedConfigLoads) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    TrainConfig c = load_train_config(entry.path().string());
    EXPECT_EQ(c.source, entry.path().string());
    EXPECT_EQ(c.batch.global_batch_size, c.batch.micro_batch_size * c.batch.grad_accum_steps);
    ++n;
  }
  EXPECT_GE(n, 6);  // default, gpt2-common and the four GPT-2 presets
}

// docs/design.md decision 7: bf16 on the GPU, fp32 on the CPU, unless run.dtype says otherwise.
TEST_F(TrainConfigTest, DtypeAutoIsBf16OnCudaAndFp32OnCpu) {
  const std::string path = write("tiny.yaml", kTiny);  // sets no dtype
  EXPECT_EQ(load_train_config(path, {"run.device=cuda"}).run.dtype, "bf16");
  EXPECT_EQ(load_train_config(path, {"run.device=cpu"}).run.dtype, "fp32");
  EXPECT_EQ(load_train_config(path, {"run.device=cuda", "run.dtype=fp32"}).run.dtype, "fp32");
  EXPECT_EQ(load_train_config(path, {"run.dtype=fp16"}).run.dtype, "fp16");
  // The resolved config names the precision, so a resumed run keeps it.
  const std::string yaml = to_yaml(load_train_config(path, {"run.device=cuda"}));
  EXPECT_NE(yaml.find("dtype: bf16"), std::string::npos) << yaml;
}

TEST_F(TrainConfigTest, DefaultConfigIsATinyCpuRun) {
  TrainConfig c = load_train_config((kConfigs / "default.yaml").string());
  EXPECT_EQ(c.run.device, "cpu");
  EXPECT_EQ(c.run.dtype, "fp32");
  EXPECT_EQ(c.model.name, "gpt2-tiny");
  EXPECT_EQ(c.data.tokenizer, "byte");
  EXPECT_EQ(c.data.train, "datasets/fortunes/train_*.bin");
  EXPECT_EQ(c.data.val, "datasets/fortunes/val_*.bin");
  EXPECT_EQ(c.batch.micro_batch_size, 16);
  EXPECT_EQ(c.batch.grad_accum_steps, 1);
  EXPECT_EQ(c.batch.global_batch_size, 16);
  EXPECT_EQ(c.batch.seq_len, 128);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.schedule.min_lr, 3e-4);
  EXPECT_EQ(c.schedule.warmup_steps, 50);
  EXPECT_EQ(c.training.steps, 600);
  models::ModelOptions options;
  options.overrides = c.model.config;
  models::ModelShape shape = models::ModelRegistry::global().shape(c.model.name, options);
  EXPECT_EQ(shape.vocab_size, 256);
  EXPECT_EQ(shape.max_seq_len, 128);
  EXPECT_GE(shape.num_parameters, 1'000'000);
  EXPECT_LE(shape.num_parameters, 3'000'000);
}

TEST_F(TrainConfigTest, Gpt2PresetsShareTheLlmcRecipe) {
  const std::pair<const char*, const char*> presets[] = {{"gpt2-124m.yaml", "gpt2"},
                                                         {"gpt2-350m.yaml", "gpt2-medium"},
                                                         {"gpt2-774m.yaml", "gpt2-large"},
                                                         {"gpt2-1558m.yaml", "gpt2-xl"}};
  for (const auto& [file, model] : presets) {
    SCOPED_TRACE(file);
    TrainConfig c = load_train_config((kConfigs / file).string());
    EXPECT_EQ(c.model.name, model);
    EXPECT_EQ(c.data.tokenizer, "gpt2");
    EXPECT_EQ(c.batch.seq_len, 1024);
    EXPECT_EQ(c.batch.global_batch_size * c.batch.seq_len, 524288);  // 0.5M tokens per step
    EXPECT_EQ(c.batch.micro_batch_size * c.batch.grad_accum_steps, 512);
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 6e-4);
    EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
    EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
    EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
    EXPECT_EQ(c.schedule.warmup_steps, 700);
    EXPECT_EQ(c.run.device, "cuda");
  }
}

TEST_F(TrainConfigTest, SetOverridesApplyAfterBase) {
  TrainConfig c = load_train_config(
      (kConfigs / "gpt2-124m.yaml").string(),
      {"optimizer.betas=[0.8, 0.99]", "training.steps=50", "schedule.warmup_steps=5",
       "model.config.n_layer=2", "data.shuffle=true", "batch.micro_batch_size=64"});
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(c.training.steps, 50);
  EXPECT_EQ(c.model.config.at("n_layer"), "2");
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.batch.grad_accum_steps, 8);  // 512 / 64
}

TEST_F(TrainConfigTest, ToYamlRoundTrips) {
  for (const char* file : {"default.yaml", "gpt2-124m.yaml", "gpt2-1558m.yaml"}) {
    SCOPED_TRACE(file);
    TrainConfig c = load_train_config((kConfigs / file).string());
    std::string saved = write("saved.yaml", to_yaml(c));
    TrainConfig back = load_train_config(saved);
    back.source = c.source;
    EXPECT_EQ(back, c) << to_yaml(c);
    EXPECT_EQ(to_yaml(back), to_yaml(c));
  }
}

TEST_F(TrainConfigTest, ToYamlRoundTripsEveryField) {
  // Every field away from its default, with strings YAML would otherwise misread.
  TrainConfig c;
  c.source = "x.yaml";
  c.run = {"out dir/#1", 18446744073709551615ull, "cuda", "bf16", 3, "on", "on"};
  c.model.name = "gpt2-tiny";
  c.model.config = {{"n_layer", "3"}, {"dropout", "0.1"}};
  c.model.init_from = "weights: v1.safetensors";
  c.data = {"a/*.bin", "", "gpt2", "v.json", "m.txt", true};
  c.batch.micro_batch_size = 2;
  c.batch.grad_accum_steps = 3;
  c.batch.seq_len = 16;
  c.optimizer = {"sgd", 1.25e-5, 0.5, 0.75, 1e-6, 0.0, 0.8, true, 0.0};
  c.schedule = {"linear", 3, 1e-7};
  c.training = {7,       2, 0,    4, 3, 9,     "yes\nnull: \"x\"",
                0.0,     0, 0.25, 5, 0, false, "runs/a/step_1",
                "lines", 2, 3};
  c.resolve_batch(1);
  std::string saved = write("every.yaml", to_yaml(c));
  TrainConfig back = load_train_config(saved);
  back.source = c.source;
  EXPECT_EQ(back.run, c.run);
  EXPECT_EQ(back.model, c.model);
  EXPECT_EQ(back.data, c.data);
  EXPECT_EQ(back.batch, c.batch);
  EXPECT_EQ(back.optimizer, c.optimizer);
  EXPECT_EQ(back.schedule, c.schedule);
  EXPECT_EQ(back.training, c.training);
}

// ---------------------------------------------------------------------------------------------
// Batch arithmetic (Note [Batch arithmetic])

TrainConfig batch_config(int64_t micro, int64_t accum, int64_t global) {
  TrainConfig c;
  c.source = "b.yaml";
  c.batch.micro_batch_size = micro;
  c.batch.grad_accum_steps = accum;
  c.batch.global_batch_size = global;
  return c;
}

TEST(BatchArithmetic, DerivesTheMissingNumbers) {
  TrainConfig c = batch_config(8, 0, 0);
  c.resolve_batch(1);
  EXPECT_EQ(c.batch.grad_accum_steps, 1);
  EXPECT_EQ(c.batch.global_batch_size, 8);
  c.resolve_batch(4);  // derived values are derived again for the real dp
  EXPECT_EQ(c.batch.grad_accum_steps, 1);
  EXPECT_EQ(c.batch.global_batch_size, 32);

  c = batch_config(8, 3, 0);
  c.resolve_batch(2);
  EXPECT_EQ(c.batch.grad_accum_steps, 3);
  EXPECT_EQ(c.batch.global_batch_size, 48);

  c = batch_config(16, 0, 512);
  c.resolve_batch(1);
  EXPECT_EQ(c.batch.grad_accum_steps, 32);
  c.resolve_batch(4);
  EXPECT_EQ(c.batch.grad_accum_steps, 8);
  EXPECT_EQ(c.batch.global_batch_size, 512);
  c.resolve_batch(32);
  EXPECT_EQ(c.batch.grad_accum_steps, 1);

  c = batch_config(16, 4, 128);  // both given and consistent for dp = 2
  c.resolve_batch(2);
  EXPECT_EQ(c.batch.grad_accum_steps, 4);
  EXPECT_EQ(c.batch.global_batch_size, 128);
}

TEST(BatchArithmetic, NotDivisibleNamesTheNumbersAndFile) {
  TrainConfig c = batch_config(12, 0, 500);
  std::string msg = error_of([&] { c.resolve_batch(1); });
  EXPECT_CONTAINS(msg, "b.yaml");
  EXPECT_CONTAINS(msg, "global_batch_size 500 is not divisible by batch.micro_batch_size 12 x 1");

  c = batch_config(16, 0, 512);
  c.resolve_batch(1);
  msg = error_of([&] { c.resolve_batch(3); });  // 512 / (16 * 3) is not whole
  EXPECT_CONTAINS(msg, "global_batch_size 512 is not divisible by batch.micro_batch_size 16 x 3");

  c = batch_config(16, 0, 8);  // smaller than one micro-batch
  msg = error_of([&] { c.resolve_batch(1); });
  EXPECT_CONTAINS(msg, "global_batch_size 8 is not divisible");
}

TEST(BatchArithmetic, InconsistentTripleIsAnError) {
  TrainConfig c = batch_config(16, 4, 128);
  std::string msg = error_of([&] { c.resolve_batch(1); });
  EXPECT_CONTAINS(msg, "b.yaml");
  EXPECT_CONTAINS(msg,
                  "micro_batch_size 16 x batch.grad_accum_steps 4 x 1 data-parallel "
                  "rank(s) = 64, but batch.global_batch_size is 128");
}

TEST_F(TrainConfigTest, SavedConfigKeepsTheGlobalBatchAcrossDp) {
  // A saved config re-derives grad_accum_steps when resumed on another number of ranks.
  TrainConfig c = load_train_config((kConfigs / "gpt2-124m.yaml").string());
  EXPECT_EQ(c.batch.grad_accum_steps, 16);
  std::string text = to_yaml(c);
  EXPECT_CONTAINS(text, "grad_accum_steps: 0  # derived: 16");
  TrainConfig back = load_train_config(write("saved.yaml", text));
  back.resolve_batch(8);
  EXPECT_EQ(back.batch.grad_accum_steps, 2);
  EXPECT_EQ(back.batch.global_batch_size, 512);
}

// ---------------------------------------------------------------------------------------------
// Bad configs: each names the file, the place and the problem.

struct BadCase {
  const char* name;
  std::string yaml;  // written to bad.yaml
  std::vector<std::string> sets;
  std::string location;  // what follows the path at the start, e.g. ":12:3: "; "" = --set
  std::vector<std::string> expected;
};

std::string tiny_with(const std::string& extra) {
  return std::string(kTiny) + extra;
}

std::vector<BadCase> bad_cases() {
  return {
      {"misspelt_section",
       tiny_with("optimiser:\n  lr: 1.0e-3\n"),
       {},
       ":11:1: ",
       {"unknown key 'optimiser' in section 'root'; did you mean 'optimizer'?"}},
      {"misspelt_key",
       tiny_with("schedule:\n  warmup: 5\n"),
       {},
       ":12:3: ",
       {"unknown key 'warmup' in section 'schedule'; did you mean 'warmup_steps'?"}},
      {"number_is_text",
       tiny_with("optimizer:\n  lr: fast\n"),
       {},
       ":12:7: ",
       {"optimizer.lr: expected a number, got 'fast'"}},
      {"integer_is_fraction",
       "data:\n  train: x\nbatch:\n  micro_batch_size: 2.5\n",
       {},
       ":4:21: ",
       {"batch.micro_batch_size: expected an integer, got '2.5'"}},
      {"bool_is_text",
       "data:\n  train: x\n  shuffle: maybe\nbatch:\n  seq_len: 8\n",
       {},
       ":3:12: ",
       {"data.shuffle: expected true or false, got 'maybe'"}},
      {"missing_train", "batch:\n  seq_len: 32\n", {}, ": ", {"missing required key 'data.train'"}},
      {"section_is_scalar",
       "data:\n  train: x\nbatch: 16\n",
       {},
       ":3:8: ",
       {"batch: expected a section (a map of keys), got '16'"}},
      {"unknown_model",
       tiny_with("model:\n  name: gpt-2\n"),
       {},
       ":12:9: ",
       {"model.name: unknown model 'gpt-2' (did you mean 'gpt2'?)"}},
      {"bad_model_config",
       tiny_with("model:\n  config:\n    n_layers: 4\n"),
       {},
       ":13:5: ",
       {"model.config: model 'gpt2-tiny' rejects this configuration",
        "unknown GPT-2 config key 'n_layers'"}},
      {"unknown_device",
       kTiny,
       {"run.device=gpu"},
       "",
       {"run.device: expected one of cpu, cuda, got 'gpu'"}},
      {"fp16_hysteresis_zero",
       kTiny,
       {"run.dtype=fp16", "fp16.hysteresis=0"},
       "",
       {"fp16.hysteresis", "must be positive"}},
      {"fp16_unknown_key",
       kTiny,
       {"fp16.loss_scale_windw=10"},
       "",
       {"loss_scale_windw", "loss_scale_window"}},
      {"gpt2_without_vocab",
       tiny_with("  eval_every: 0\n"),
       {"data.tokenizer=gpt2"},
       ": ",
       {"data.vocab: tokenizer gpt2 needs data.vocab (vocab.json) and data.merges"}},
      {"betas_out_of_range",
       tiny_with("optimizer:\n  betas: [0.9, 1.0]\n"),
       {},
       ":12:10: ",
       {"optimizer.betas: must be in [0, 1), got 1"}},
      {"betas_wrong_length",
       tiny_with("optimizer:\n  betas: [0.9]\n"),
       {},
       ":12:10: ",
       {"optimizer.betas: expected two numbers [beta1, beta2], got 1"}},
      {"negative_lr",
       tiny_with("optimizer:\n  lr: -1e-3\n"),
       {},
       ":12:7: ",
       {"optimizer.lr: must be >= 0, got -0.001"}},
      {"warmup_past_steps",
       tiny_with("schedule:\n  warmup_steps: 10\n"),
       {},
       ":12:17: ",
       {"schedule.warmup_steps: 10 leaves no steps to decay over (training.steps is 10)"}},
      {"min_lr_above_lr",
       tiny_with("schedule:\n  min_lr: 1.0\n"),
       {},
       ":12:11: ",
       {"schedule.min_lr: 1 is above optimizer.lr 0.0006"}},
      {"seq_len_past_context",
       tiny_with("  eval_every: 0\n"),
       {"batch.seq_len=65"},
       "",
       {"batch.seq_len: 65 is longer than the context of model 'gpt2-tiny' (64 positions)"}},
      {"zero_micro_batch",
       "data:\n  train: x\nbatch:\n  micro_batch_size: 0\n  seq_len: 8\n",
       {},
       ":4:21: ",
       {"batch.micro_batch_size: must be positive, got 0"}},
      {"global_not_divisible",
       kTiny,
       {"batch.global_batch_size=6"},
       ": ",
       {"batch.global_batch_size 6 is not divisible by batch.micro_batch_size 4 x 1"}},
      {"eval_without_val",
       "data:\n  train: x\nbatch:\n  seq_len: 8\ntraining:\n  eval_every: 5\n",
       {},
       ":6:15: ",
       {"training.eval_every: is 5 but data.val is not set"}},
      {"top_p_zero",
       tiny_with("  top_p: 0\n"),
       {},
       ":11:10: ",
       {"training.top_p: must be in (0, 1] (1 = no nucleus cut), got 0"}},
      {"top_p_above_one",
       kTiny,
       {"training.top_p=1.5"},
       "",
       {"training.top_p: must be in (0, 1] (1 = no nucleus cut), got 1.5"}},
      {"progress_unknown",
       tiny_with("  progress: fancy\n"),
       {},
       ":11:13: ",
       {"training.progress: expected one of auto, bar, lines, got 'fancy'"}},
      {"profile_on_the_cpu",
       tiny_with("  profile_steps: 3\n"),
       {},
       ":11:18: ",
       {"training.profile_steps: is 3 but times GPU ops; set run.device: cuda or "
        "profile_steps: 0"}},
      {"matmul_tuning_on_the_cpu",
       kTiny,
       {"run.matmul_tuning=on"},
       "",
       {"run.matmul_tuning: is on, but it times cuBLASLt's GPU algorithms and run.device is "
        "'cpu'; set run.device: cuda or matmul_tuning: off"}},
      {"matmul_tuning_unknown",
       kTiny,
       {"run.matmul_tuning=fast"},
       "",
       {"run.matmul_tuning: expected one of off, on, got 'fast'"}},
      {"tf32_on_the_cpu",
       kTiny,
       {"run.tf32=on"},
       "",
       {"run.tf32: is on, but TF32 is the GPU tensor cores' format and run.device is 'cpu' (the "
        "CPU computes fp32 matmuls in full f32); set run.device: cuda or tf32: off"}},
      {"tf32_unknown",
       kTiny,
       {"run.tf32=true"},
       "",
       {"run.tf32: expected one of off, on, got 'true'"}},
      {"profile_past_the_last_step",
       kTiny,
       {"run.device=cuda", "training.profile_steps=8"},
       "",
       {"training.profile_steps: profiles steps 5 to 12, past training.steps (10)"}},
      {"profile_start_zero",
       kTiny,
       {"training.profile_start=0"},
       "",
       {"training.profile_start: must be positive, got 0"}},
      {"syntax_error", tiny_with("  steps: [1, 2\n"), {}, ":", {"invalid YAML"}},
      {"byte_vocab_too_small",
       tiny_with("model:\n  config:\n    vocab_size: 100\n"),
       {},
       ": ",
       {"data.tokenizer: the byte tokenizer has 256 tokens but model 'gpt2-tiny' has "
        "vocab_size 100"}},
      {"set_wrong_type",
       kTiny,
       {"training.steps=many"},
       "",
       {"--set: training.steps: expected an integer, got 'many'"}},
      {"negative_seed",
       kTiny,
       {"run.seed=-5"},
       "",
       {"run.seed: expected a non-negative integer, got '-5'"}},
  };
}

TEST_F(TrainConfigTest, BadConfigsNameFilePlaceAndProblem) {
  for (const BadCase& bad : bad_cases()) {
    SCOPED_TRACE(bad.name);
    std::string path = write("bad.yaml", bad.yaml);
    std::string msg = error_of([&] { load_train_config(path, bad.sets); });
    // A --set value is reported against --set, everything else against the file.
    if (bad.location.empty())
      EXPECT_EQ(msg.rfind("--set: ", 0), 0u) << msg;
    else
      EXPECT_EQ(msg.rfind(path + bad.location, 0), 0u) << msg;
    for (const std::string& part : bad.expected) EXPECT_CONTAINS(msg, part);
  }
}

}  // namespace
}  // namespace strata::runtime
