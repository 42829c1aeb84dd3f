// ZeRO-Infinity's parameter offload (zero_optimization.offload_param) through `train` on two
// (emulated) GPUs under mpirun (label cuda; Note [Emulated NCCL]): the partitions live on NVMe
// (bf16, the masters on the device) or in host memory (fp32), are loaded host -> device before
// each allgather and written back after the update, and the run is bitwise the in-memory ZeRO-3
// run over 20 steps (losses and checkpoint files). The offloaded runs build the model unit by
// unit (Note [Unit-by-unit construction]) and the in-memory ones whole, so the same comparison
// checks construction too. Skips without two GPUs.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../train_mpi_fixture.h"
#include "tensor/cuda.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;

const std::string kBin = STRATA_BINARY_DIR;

class OffloadParamGpuMpi : public testing::TrainMpiFixture {
 protected:
  OffloadParamGpuMpi() : TrainMpiFixture(kBin, "cuda") {}
};

TEST_F(OffloadParamGpuMpi, TwoGpusGiveTheInMemoryRunBitwise) {
  if (tensor::cuda_device_count() < 2) GTEST_SKIP() << "needs two visible GPUs";
  const int kSteps = 20;
  fs::create_directories(std::string(tmp_ / "nvme"));
  struct Case {
    const char* dtype;
    const char* device;
  };
  for (const Case c : {Case{"bf16", "nvme"}, Case{"fp32", "cpu"}}) {
    SCOPED_TRACE(fmt::format("{} {}", c.dtype, c.device));
    const std::vector<std::string> sets = {fmt::format("run.dtype={}", c.dtype),
                                           "zero_optimization.stage=3", "training.eval_every=0"};
    const std::string mem = fmt::format("mem_{}", c.dtype), off = fmt::format("off_{}", c.dtype);
    CommandResult a = train(2, config(mem, kSteps), sets);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    std::vector<std::string> with = sets;
    with.push_back(fmt::format("zero_optimization.offload_param.device={}", c.device));
    with.push_back("zero_optimization.offload_param.nvme_path=" + std::string(tmp_ / "nvme"));
    CommandResult b = train(2, config(off, kSteps), with);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find(std::string("ZeRO-Infinity parameters (rank 0): offload_param.device ") +
                         c.device),
              std::string::npos)
        << b.out;
    // Note [Unit-by-unit construction]: neither the host nor a GPU held the model whole.
    EXPECT_NE(b.out.find("built unit by unit, never whole in host memory or on the GPU"),
              std::string::npos)
        << b.out;
    const std::vector<double> want = losses(mem), got = losses(off);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(got, want);
    EXPECT_LT(want.back(), want.front()) << "the run did not train";
    const auto x = checkpoint_tensors(mem, kSteps), y = checkpoint_tensors(off, kSteps);
    ASSERT_FALSE(x.empty());
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [name, bytes] : x) {
      auto it = y.find(name);
      ASSERT_NE(it, y.end()) << name;
      EXPECT_TRUE(bytes == it->second) << name << " differs";
    }
  }
  EXPECT_TRUE(fs::is_empty(std::string(tmp_ / "nvme"))) << "swap files left behind";
}

// ZeRO-Infinity whole: the optimizer offloaded too (device cpu: HostOffload writes each updated
// partition back between the group fence's calls; device nvme: NvmeAdamW does, per sub-group).
// bf16 on two GPUs, 20 steps: the in-memory run's losses, parameters and every optimizer tensor
// both runs' checkpoints hold.
TEST_F(OffloadParamGpuMpi, WithTheOptimizerOffloadedTooTheRunIsBitwiseTheInMemoryRun) {
  if (tensor::cuda_device_count() < 2) GTEST_SKIP() << "needs two visible GPUs";
  const int kSteps = 20;
  const std::string swap = std::string(tmp_ / "nvme");
  fs::create_directories(swap);
  const std::vector<std::string> sets = {"run.dtype=bf16", "zero_optimization.stage=3",
                                         "training.eval_every=0"};
  CommandResult a = train(2, config("mem", kSteps), sets);
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  const std::vector<double> want = losses("mem");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(want.back(), want.front()) << "the run did not train";
  const auto x = checkpoint_tensors("mem", kSteps);
  struct Case {
    const char* param;
    const char* optimizer;
  };
  for (const Case c : {Case{"nvme", "cpu"}, Case{"cpu", "nvme"}}) {
    SCOPED_TRACE(fmt::format("offload_param {} offload_optimizer {}", c.param, c.optimizer));
    const std::string off = fmt::format("off_{}_{}", c.param, c.optimizer);
    std::vector<std::string> with = sets;
    with.push_back(fmt::format("zero_optimization.offload_param.device={}", c.param));
    with.push_back("zero_optimization.offload_param.nvme_path=" + swap);
    with.push_back(fmt::format("zero_optimization.offload_optimizer.device={}", c.optimizer));
    with.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap);
    with.push_back("zero_optimization.sub_group_size=3000");
    CommandResult b = train(2, config(off, kSteps), with);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find(std::string("ZeRO-Infinity parameters (rank 0): offload_param.device ") +
                         c.param),
              std::string::npos)
        << b.out;
    EXPECT_NE(b.out.find("built unit by unit, never whole in host memory or on the GPU"),
              std::string::npos)
        << b.out;
    EXPECT_EQ(losses(off), want);
    const auto y = checkpoint_tensors(off, kSteps);
    int model = 0, optimizer = 0;
    for (const auto& [name, bytes] : x) {
      auto it = y.find(name);
      if (it == y.end()) continue;
      ++(name.rfind("model", 0) == 0 ? model : optimizer);
      EXPECT_TRUE(bytes == it->second) << name << " differs";
    }
    EXPECT_GT(model, 0) << "no parameters compared";
    EXPECT_GT(optimizer, 0) << "no optimizer tensors compared";
  }
  EXPECT_TRUE(fs::is_empty(swap)) << "swap files left behind";
}

// Note [Unit-by-unit construction] under tensor parallelism on two GPUs (tp 2, dp 1): each GPU's
// rank initialises its shards of one unit at a time on the host, keeps the fp32 master on the
// device and stores the bf16 partition on NVMe; bitwise the in-memory tp 2 ZeRO-3 run built whole.
TEST_F(OffloadParamGpuMpi, TensorParallelBuiltUnitByUnitIsBitwiseTheInMemoryRun) {
  if (tensor::cuda_device_count() < 2) GTEST_SKIP() << "needs two visible GPUs";
  const int kSteps = 6;
  const std::string swap = std::string(tmp_ / "nvme");
  fs::create_directories(swap);
  const std::vector<std::string> sets = {"run.dtype=bf16", "zero_optimization.stage=3",
                                         "parallelism.tensor_parallel_size=2",
                                         "training.eval_every=0"};
  CommandResult a = train(2, config("mem", kSteps), sets);
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  EXPECT_EQ(a.out.find("built unit by unit"), std::string::npos) << a.out;
  std::vector<std::string> with = sets;
  with.push_back("zero_optimization.offload_param.device=nvme");
  with.push_back("zero_optimization.offload_param.nvme_path=" + swap);
  CommandResult b = train(2, config("off", kSteps), with);
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_NE(b.out.find("built unit by unit, never whole in host memory or on the GPU"),
            std::string::npos)
      << b.out;
  const std::vector<double> want = losses("mem");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(losses("off"), want);
  const auto x = checkpoint_tensors("mem", kSteps), y = checkpoint_tensors("off", kSteps);
  ASSERT_FALSE(x.empty());
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, bytes] : x) {
    auto it = y.find(name);
    ASSERT_NE(it, y.end()) << name;
    EXPECT_TRUE(bytes == it->second) << name << " differs";
  }
  EXPECT_TRUE(fs::is_empty(swap)) << "swap files left behind";
}

}  // namespace
}  // namespace strata::tools
