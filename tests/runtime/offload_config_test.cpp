// zero_optimization.offload_optimizer and offload_param (runtime/train_config.h, docs/config.md):
// DeepSpeed's keys and the paper's delayed parameter update, read, written back by to_yaml, and
// every combination offload cannot run refused with an error naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/train_config.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

const char* kGpu = R"(run:
  dir: runs/test
  device: cuda
data:
  train: data/x/train_*.bin
batch:
  micro_batch_size: 4
  seq_len: 32
training:
  steps: 10
zero_optimization:
  stage: 2
)";

class OffloadConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_offload_config_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    path_ = (dir_ / "c.yaml").string();
    std::ofstream(path_) << kGpu;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string error(const std::vector<std::string>& sets) {
    try {
      load_train_config(path_, sets);
    } catch (const UserError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no UserError";
    return "";
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(OffloadConfig, DefaultsAreOffAndKeysRoundTrip) {
  const TrainConfig plain = load_train_config(path_);
  EXPECT_EQ(plain.zero.offload_optimizer.device, "none");
  EXPECT_FALSE(plain.zero.offload_optimizer.enabled());
  EXPECT_TRUE(plain.zero.offload_optimizer.pin_memory);
  EXPECT_FALSE(plain.zero.offload_optimizer.delayed_param_update);

  const TrainConfig c = load_train_config(
      path_, {"zero_optimization.offload_optimizer.device=cpu",
              "zero_optimization.offload_optimizer.pin_memory=false",
              "zero_optimization.offload_optimizer.delayed_param_update=true",
              "zero_optimization.offload_optimizer.delayed_param_update_start=3"});
  const OffloadOptimizerSection& o = c.zero.offload_optimizer;
  EXPECT_TRUE(o.enabled());
  EXPECT_FALSE(o.pin_memory);
  EXPECT_TRUE(o.delayed_param_update);
  EXPECT_EQ(o.delayed_param_update_start, 3);
  const std::string saved = (dir_ / "saved.yaml").string();
  std::ofstream(saved) << to_yaml(c);
  const TrainConfig back = load_train_config(saved);
  EXPECT_EQ(back.zero, c.zero) << to_yaml(c);
}

TEST_F(OffloadConfig, WhatOffloadCannotRunIsAnErrorNamingTheKey) {
  const std::string off = "zero_optimization.offload_optimizer.";
  struct Case {
    std::vector<std::string> sets;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{off + "device=nvme"},
       "zero_optimization.offload_optimizer.device: nvme keeps the optimizer states in a swap "
       "file, but nvme_path is empty"},
      {{off + "device=cpu", "run.device=cpu", "run.dtype=fp32"},
       "zero_optimization.offload_optimizer.device: cpu moves the optimizer from the GPU to the "
       "host, but run.device is 'cpu': there is nothing to offload from"},
      {{off + "device=cpu", "zero_optimization.stage=0"},
       "needs zero_optimization.stage 1, 2 or 3, got stage 0"},
      {{off + "device=nvme", off + "nvme_path=/x", "zero_optimization.stage=0"},
       "needs zero_optimization.stage 1, 2 or 3, got stage 0"},
      {{off + "device=nvme", off + "nvme_path=/x", off + "delayed_param_update=true"},
       "delayed_param_update: delays the CPU optimizer's update, which device nvme does not do"},
      {{off + "device=nvme", off + "nvme_path=/x", off + "buffer_count=0"},
       "zero_optimization.offload_optimizer.buffer_count: must be positive"},
      {{off + "device=nvme", off + "nvme_path=/x", "zero_optimization.sub_group_size=0"},
       "zero_optimization.sub_group_size: must be positive"},
      {{off + "device=cpu", "run.device=cuda", off + "delayed_param_update=true",
        "zero_optimization.stage=3", "zero_optimization.offload_param.device=cpu"},
       "zero_optimization.offload_optimizer.delayed_param_update: does not run with "
       "zero_optimization.offload_param yet (device cpu)"},
      {{"aio.block_size=1000"}, "aio.block_size: is 1000; it must be a multiple of 4096"},
      {{"aio.queue_depth=0"}, "aio.queue_depth: is 0; it must be between 1 and 4096"},
      {{"aio.thread_count=65"}, "aio.thread_count: is 65; it must be between 1 and 64"},
      {{"aio.queue_dept=4"}, "queue_depth"},
      {{off + "device=cpu", "optimizer.name=sgd"}, "optimizer.name is 'sgd'"},
      {{off + "delayed_param_update=true"},
       "zero_optimization.offload_optimizer.delayed_param_update: delays the CPU optimizer's "
       "update, but offload_optimizer.device is none"},
      {{off + "device=cpu", off + "delayed_param_update_start=-1"},
       "zero_optimization.offload_optimizer.delayed_param_update_start: must be >= 0"},
      {{off + "device=disk"}, "expected one of none, cpu, nvme, got 'disk'"},
      {{off + "pin_memry=true"}, "pin_memory"},
  };
  for (const Case& c : cases) {
    const std::string e = error(c.sets);
    EXPECT_NE(e.find(c.want), std::string::npos) << c.sets.front() << "\n  got: " << e;
    // Values from --set are located there (core/config.h), values in the file at file:line.
    EXPECT_EQ(e.rfind("--set: ", 0), 0u) << "names where the value came from: " << e;
  }
  std::ofstream(path_, std::ios::app)
      << "  offload_optimizer:\n    device: nvme\n    nvme_path: /x\n    buffer_count: 0\n";
  const std::string e = error({});
  EXPECT_NE(e.find("c.yaml:16:19: zero_optimization.offload_optimizer.buffer_count"),
            std::string::npos)
      << e;
}

TEST_F(OffloadConfig, OffloadParamKeysRoundTrip) {
  const TrainConfig plain = load_train_config(path_);
  const OffloadParamSection& d = plain.zero.offload_param;
  EXPECT_FALSE(d.enabled());
  EXPECT_TRUE(d.pin_memory);
  EXPECT_EQ(d.buffer_count, 5);
  EXPECT_EQ(d.buffer_size, 100'000'000);
  EXPECT_EQ(d.max_in_cpu, 0);
  const std::string p = "zero_optimization.offload_param.";
  const TrainConfig c = load_train_config(
      path_, {"zero_optimization.stage=3", p + "device=nvme", p + "nvme_path=/local/nvme",
              p + "pin_memory=false", p + "buffer_count=3", p + "buffer_size=4096",
              p + "max_in_cpu=1000"});
  const OffloadParamSection& o = c.zero.offload_param;
  EXPECT_EQ(o.device, "nvme");
  EXPECT_EQ(o.nvme_path, "/local/nvme");
  EXPECT_FALSE(o.pin_memory);
  EXPECT_EQ(o.buffer_count, 3);
  EXPECT_EQ(o.buffer_size, 4096);
  EXPECT_EQ(o.max_in_cpu, 1000);
  const std::string saved = (dir_ / "saved.yaml").string();
  std::ofstream(saved) << to_yaml(c);
  EXPECT_EQ(load_train_config(saved).zero, c.zero) << to_yaml(c);
  // The defaults, with an empty nvme_path, round-trip too.
  std::ofstream(saved) << to_yaml(plain);
  EXPECT_EQ(load_train_config(saved).zero, plain.zero) << to_yaml(plain);
}

TEST_F(OffloadConfig, WhatParamOffloadCannotRunIsAnErrorNamingTheKey) {
  const std::string p = "zero_optimization.offload_param.";
  struct Case {
    std::vector<std::string> sets;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{p + "device=cpu"},
       "zero_optimization.offload_param.device: cpu offloads the parameter partitions of ZeRO-3 "
       "and needs zero_optimization.stage 3, got stage 2"},
      {{"zero_optimization.stage=3", p + "device=nvme"},
       "zero_optimization.offload_param.nvme_path: is empty, but offload_param.device is nvme"},
      {{p + "buffer_count=0"}, "zero_optimization.offload_param.buffer_count: must be positive"},
      {{p + "buffer_size=0"}, "zero_optimization.offload_param.buffer_size: must be positive"},
      {{p + "max_in_cpu=-1"}, "zero_optimization.offload_param.max_in_cpu: must be >= 0"},
      {{p + "device=disk"}, "expected one of none, cpu, nvme, got 'disk'"},
  };
  for (const Case& c : cases) {
    const std::string e = error(c.sets);
    EXPECT_NE(e.find(c.want), std::string::npos) << c.sets.back() << "\n  got: " << e;
  }
}

// ZeRO-Infinity's optimizer side: device nvme with its keys, zero_optimization.sub_group_size and
// the aio section, read and written back; nvme runs on a CPU-only run and at ZeRO-3, as cpu
// offload does at ZeRO-3 on the GPU.
TEST_F(OffloadConfig, NvmeKeysAndTheAioSectionRoundTrip) {
  const std::string off = "zero_optimization.offload_optimizer.";
  const TrainConfig plain = load_train_config(path_);
  EXPECT_EQ(plain.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(plain.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(plain.aio.block_size, 1048576);
  EXPECT_EQ(plain.aio.queue_depth, 8);
  EXPECT_EQ(plain.aio.thread_count, 1);
  EXPECT_FALSE(plain.aio.single_submit);
  EXPECT_TRUE(plain.aio.overlap_events);
  const TrainConfig c = load_train_config(
      path_,
      {off + "device=nvme", off + "nvme_path=/mnt/nvme0", off + "buffer_count=6",
       off + "pipeline_read=false", off + "pipeline_write=false", "run.device=cpu",
       "run.dtype=fp32", "zero_optimization.stage=3", "zero_optimization.sub_group_size=5000",
       "aio.block_size=262144", "aio.queue_depth=32", "aio.thread_count=2",
       "aio.single_submit=true", "aio.overlap_events=false"});
  const OffloadOptimizerSection& o = c.zero.offload_optimizer;
  EXPECT_EQ(o.device, "nvme");
  EXPECT_EQ(o.nvme_path, "/mnt/nvme0");
  EXPECT_EQ(o.buffer_count, 6);
  EXPECT_FALSE(o.pipeline_read);
  EXPECT_FALSE(o.pipeline_write);
  EXPECT_EQ(c.zero.sub_group_size, 5000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  const std::string saved = (dir_ / "saved.yaml").string();
  std::ofstream(saved) << to_yaml(c);
  const TrainConfig back = load_train_config(saved);
  EXPECT_EQ(back.zero, c.zero) << to_yaml(c);
  EXPECT_EQ(back.aio, c.aio) << to_yaml(c);
  EXPECT_NO_THROW(load_train_config(path_, {off + "device=cpu", "zero_optimization.stage=3"}));
}

}  // namespace
}  // namespace strata::runtime
