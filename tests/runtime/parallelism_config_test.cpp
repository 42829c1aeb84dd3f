// The `parallelism` section of the train config: defaults, round trip, and the layouts a model
// cannot split, each an error naming the key and the numbers.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "runtime/train_config.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

std::string tiny(const std::string& model, const std::string& parallelism, int64_t seq_len = 32,
                 const std::string& training = "") {
  return "model:\n  name: " + model +
         "\ndata:\n  train: d/train_*.bin\nbatch:\n"
         "  micro_batch_size: 4\n  seq_len: " +
         std::to_string(seq_len) + "\ntraining:\n  steps: 10\n" + training +
         (parallelism.empty() ? "" : "parallelism:\n" + parallelism);
}

class ParallelismConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_parallelism_config_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& text) {
    const fs::path p = dir_ / "c.yaml";
    std::ofstream(p) << text;
    return p.string();
  }
  std::string error_of(const std::string& text) {
    try {
      load_train_config(write(text));
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(ParallelismConfig, DefaultsAndRoundTrip) {
  const TrainConfig c = load_train_config(write(tiny("gpt2-tiny", "")));
  EXPECT_EQ(c.parallelism.tensor_parallel_size, 1);
  EXPECT_FALSE(c.parallelism.sequence_parallel);
  EXPECT_EQ(c.parallelism.pipeline_parallel_size, 1);
  TrainConfig sp = load_train_config(
      write(tiny("gpt2-tiny", "  tensor_parallel_size: 1\n  sequence_parallel: true\n")));
  EXPECT_TRUE(sp.parallelism.sequence_parallel);
  const std::string yaml = to_yaml(sp);
  EXPECT_NE(yaml.find("parallelism:"), std::string::npos) << yaml;
  EXPECT_EQ(load_train_config(write(yaml)).parallelism, sp.parallelism);
  EXPECT_EQ(c.parallelism.pipeline_schedule, "1f1b");
  EXPECT_TRUE(c.parallelism.pipeline_partition.empty());
  // A pipeline layout and its explicit partition survive the round trip too.
  TrainConfig pp =
      load_train_config(write(tiny("gpt2-tiny",
                                   "  pipeline_parallel_size: 2\n  pipeline_schedule: gpipe\n"
                                   "  pipeline_partition: [1, 1]\n")));
  EXPECT_EQ(pp.parallelism.pipeline_parallel_size, 2);
  EXPECT_EQ(pp.parallelism.pipeline_schedule, "gpipe");
  EXPECT_EQ(pp.parallelism.pipeline_partition, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(load_train_config(write(to_yaml(pp))).parallelism, pp.parallelism);
  EXPECT_EQ(load_train_config(write(to_yaml(c))).parallelism, c.parallelism);
  EXPECT_EQ(c.parallelism.virtual_pipeline_stages, 1);
  // The interleaved schedule with its chunks per stage: 4 layers, 2 stages x 2 chunks.
  std::string text = tiny("gpt2-tiny",
                          "  pipeline_parallel_size: 2\n  pipeline_schedule: interleaved\n"
                          "  virtual_pipeline_stages: 2\n");
  text.replace(text.find("gpt2-tiny"), 9, "gpt2-tiny\n  config:\n    n_layer: 4");
  TrainConfig il = load_train_config(write(text));
  EXPECT_EQ(il.parallelism.pipeline_schedule, "interleaved");
  EXPECT_EQ(il.parallelism.virtual_pipeline_stages, 2);
  const std::string il_yaml = to_yaml(il);
  EXPECT_NE(il_yaml.find("virtual_pipeline_stages: 2"), std::string::npos) << il_yaml;
  EXPECT_EQ(load_train_config(write(il_yaml)).parallelism, il.parallelism);
}

TEST_F(ParallelismConfig, SplittableLayoutLoads) {
  const TrainConfig c = load_train_config(
      write(tiny("gpt2-tiny", "  tensor_parallel_size: 4\n  sequence_parallel: true\n")));
  EXPECT_EQ(c.parallelism.tensor_parallel_size, 4);
  EXPECT_TRUE(c.parallelism.sequence_parallel);
}

TEST_F(ParallelismConfig, ImpossibleLayoutsNameTheKeyAndNumbers) {
  struct Case {
    std::string yaml;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      // gpt2-tiny: 4 heads.
      {tiny("gpt2-tiny", "  tensor_parallel_size: 3\n"),
       {"parallelism.tensor_parallel_size", "3 does not divide the 4 attention heads"}},
      // llama-tiny: 4 heads, 2 key/value heads.
      {tiny("llama-tiny", "  tensor_parallel_size: 4\n"),
       {"parallelism.tensor_parallel_size", "4 does not divide the 2 key/value heads"}},
      {tiny("gpt2-tiny", "  tensor_parallel_size: 4\n  sequence_parallel: true\n", 30),
       {"parallelism.sequence_parallel", "batch.seq_len 30"}},
      // gpt2-tiny: 2 layers.
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 3\n"),
       {"parallelism.pipeline_parallel_size", "is 3 but model 'gpt2-tiny' has 2 layers"}},
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 2\n  pipeline_partition: [1]\n"),
       {"parallelism.pipeline_partition", "lists 1 stages but pipeline_parallel_size is 2"}},
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 2\n  pipeline_partition: [0, 2]\n"),
       {"parallelism.pipeline_partition", "gives stage 0 0 layers"}},
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 2\n  pipeline_partition: [2, 2]\n"),
       {"parallelism.pipeline_partition",
        "[2, 2] adds up to 4 layers but model 'gpt2-tiny' has 2"}},
      {tiny("gpt2-tiny", "  pipeline_schedule: zigzag\n"), {"parallelism.pipeline_schedule"}},
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 2\n") + "zero_optimization:\n  stage: 3\n",
       {"parallelism.pipeline_parallel_size", "zero_optimization.stage is 3"}},
      // The interleaved schedule (Note [Virtual pipeline stages]): v > 1 exactly with it.
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 2\n  virtual_pipeline_stages: 2\n"),
       {"parallelism.pipeline_schedule", "is '1f1b' but virtual_pipeline_stages is 2"}},
      {tiny("gpt2-tiny",
            "  pipeline_parallel_size: 2\n  pipeline_schedule: gpipe\n"
            "  virtual_pipeline_stages: 2\n"),
       {"parallelism.pipeline_schedule", "is 'gpipe' but virtual_pipeline_stages is 2"}},
      {tiny("gpt2-tiny", "  pipeline_parallel_size: 2\n  pipeline_schedule: interleaved\n"),
       {"parallelism.virtual_pipeline_stages", "is 1 but pipeline_schedule is interleaved"}},
      {tiny("gpt2-tiny", "  pipeline_schedule: interleaved\n  virtual_pipeline_stages: 2\n"),
       {"parallelism.virtual_pipeline_stages", "pipeline_parallel_size is 1"}},
      {tiny("gpt2-tiny",
            "  pipeline_parallel_size: 2\n  pipeline_schedule: interleaved\n"
            "  virtual_pipeline_stages: 2\n"),
       {"parallelism.virtual_pipeline_stages",
        "2 x pipeline_parallel_size 2 = 4 chunks do not divide model 'gpt2-tiny''s 2 layers"}},
      {tiny("gpt2-tiny",
            "  pipeline_parallel_size: 2\n  pipeline_schedule: interleaved\n"
            "  virtual_pipeline_stages: 2\n  pipeline_partition: [1, 1]\n"),
       {"parallelism.pipeline_partition", "is given but pipeline_schedule is interleaved"}},
      {tiny("gpt2-tiny", "  virtual_pipeline_stages: 0\n"),
       {"parallelism.virtual_pipeline_stages"}},
      {tiny("gpt2-tiny", "  tensor_parallel_size: 0\n"), {"parallelism.tensor_parallel_size"}},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.yaml);
    for (const std::string& part : c.expected) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

// Sampling during training runs at every layout (Note [Sampling over ranks] in
// sampling/sampler.h): sample_every is taken with tp > 1, pp > 1 (interleaved too) and sequence
// parallelism.
TEST_F(ParallelismConfig, SamplingAtEveryLayout) {
  const std::string every = "  sample_every: 5\n";
  for (const std::string& layout :
       {std::string("  tensor_parallel_size: 2\n"),
        std::string("  tensor_parallel_size: 2\n  sequence_parallel: true\n"),
        std::string("  pipeline_parallel_size: 2\n"),
        std::string("  pipeline_parallel_size: 2\n  tensor_parallel_size: 2\n"),
        std::string("  pipeline_parallel_size: 2\n  pipeline_schedule: interleaved\n"
                    "  virtual_pipeline_stages: 2\n")}) {
    std::string yaml = tiny("gpt2-tiny", layout, 32, every);
    // Two chunks on each of two stages need 4 layers.
    if (layout.find("virtual") != std::string::npos)
      yaml.replace(yaml.find("gpt2-tiny"), 9, "gpt2-tiny\n  config:\n    n_layer: 4");
    EXPECT_EQ(error_of(yaml), "(no error)") << yaml;
  }
}

}  // namespace
}  // namespace strata::runtime
