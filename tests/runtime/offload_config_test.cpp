// zero_optimization.offload_optimizer (runtime/train_config.h, docs/config.md): DeepSpeed's keys
// and the paper's delayed parameter update, read, written back by to_yaml, and every combination
// offload cannot run refused with an error naming the key.
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

}  // namespace
}  // namespace strata::runtime
