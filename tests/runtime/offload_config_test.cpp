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
       "zero_optimization.offload_optimizer.device: nvme (ZeRO-Infinity: optimizer states on "
       "NVMe) is not available yet"},
      {{off + "device=cpu", "run.device=cpu", "run.dtype=fp32"},
       "zero_optimization.offload_optimizer.device: cpu moves the optimizer from the GPU to the "
       "host, but run.device is 'cpu': there is nothing to offload from"},
      {{off + "device=cpu", "zero_optimization.stage=0"}, "needs zero_optimization.stage 1 or 2"},
      {{off + "device=cpu", "zero_optimization.stage=3"}, "got stage 3"},
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
  std::ofstream(path_, std::ios::app) << "  offload_optimizer:\n    device: nvme\n";
  const std::string e = error({});
  EXPECT_NE(e.find("c.yaml:14:13: zero_optimization.offload_optimizer.device: nvme"),
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

}  // namespace
}  // namespace strata::runtime
