// ZeRO-Offload through `train` on two (emulated) GPUs under mpirun (label cuda; Note [Emulated
// NCCL]): each rank steps only its partition on the host. Without the delayed update the run is
// bitwise the run without offload at ZeRO-1 and ZeRO-2 (issue 54); an offloaded checkpoint
// resumes bitwise on two GPUs and continues on one; at ZeRO-3 with the states on the host or on
// NVMe (issue 55) the run is bitwise too, and so it is at tp 2, clipped. Each test skips without
// two GPUs.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../train_mpi_fixture.h"
#include "tensor/cuda.h"
#include "tensor/safetensors.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;
using testing::expect_close;

const std::string kBin = STRATA_BINARY_DIR;
const std::string kOffload = "zero_optimization.offload_optimizer.device=cpu";

class OffloadGpuMpi : public testing::TrainMpiFixture {
 protected:
  OffloadGpuMpi() : TrainMpiFixture(kBin, "cuda") {}
  void SetUp() override {
    TrainMpiFixture::SetUp();
    gpus_ = tensor::cuda_device_count();
  }
  // Every tensor of every model*.safetensors file of a checkpoint, by file and name.
  std::map<std::string, std::vector<uint8_t>> model_bytes(const std::string& run, int step) {
    std::map<std::string, std::vector<uint8_t>> out;
    const fs::path dir = tmp_ / fmt::format("{}/checkpoints/step_{:08d}", run, step);
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string file = e.path().filename().string();
      if (file.rfind("model", 0) != 0 || e.path().extension() != ".safetensors") continue;
      for (auto& [name, t] : tensor::load_safetensors(e.path().string())) {
        const auto* p = static_cast<const uint8_t*>(t.data_ptr());
        out[file + ":" + name].assign(p, p + t.nbytes());
      }
    }
    return out;
  }
  // The two checkpoints hold the same tensors with the same bits (names the first that differs).
  void expect_same_models(const std::string& a, const std::string& b, int step) {
    const auto x = model_bytes(a, step), y = model_bytes(b, step);
    ASSERT_FALSE(x.empty()) << a;
    ASSERT_EQ(x.size(), y.size()) << a << " vs " << b;
    for (const auto& [name, bytes] : x) {
      auto it = y.find(name);
      ASSERT_NE(it, y.end()) << name << " missing in " << b;
      EXPECT_TRUE(bytes == it->second) << name << " differs between " << a << " and " << b;
    }
  }
  int gpus_ = 0;
};

#define NEED_GPUS(n) \
  if (gpus_ < (n)) GTEST_SKIP() << "needs " << (n) << " visible GPU(s), this machine has " << gpus_

TEST_F(OffloadGpuMpi, TwoGpusGiveTheRunWithoutOffloadBitwise) {
  NEED_GPUS(2);
  const int kSteps = 4;
  struct Case {
    const char* dtype;
    int stage;
  };
  for (const Case c : {Case{"fp32", 1}, Case{"bf16", 2}, Case{"fp16", 2}}) {
    SCOPED_TRACE(fmt::format("{} stage {}", c.dtype, c.stage));
    const std::vector<std::string> sets = {fmt::format("run.dtype={}", c.dtype),
                                           fmt::format("zero_optimization.stage={}", c.stage)};
    const std::string plain = fmt::format("plain_{}_{}", c.dtype, c.stage);
    const std::string off = fmt::format("off_{}_{}", c.dtype, c.stage);
    CommandResult a = train(2, config(plain, kSteps), sets);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    std::vector<std::string> with = sets;
    with.push_back(kOffload);
    CommandResult b = train(2, config(off, kSteps), with);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("| cuda | 2 ranks (nccl)"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("ZeRO-Offload (rank 0): optimizer states on the host"), std::string::npos)
        << b.out;
    const std::vector<double> want = losses(plain), got = losses(off);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(got, want);
    EXPECT_LT(want.back(), want.front()) << "the run did not train";
    expect_same_models(off, plain, kSteps);
  }
}

// An offloaded bf16 ZeRO-2 run of two GPU ranks stopped at step 3 and resumed gives the bits of
// the uninterrupted run; its step-3 checkpoint continues bitwise on two GPUs without offload, and
// on one GPU with offload (resharded to dp 1: the sums over ranks come in another order, so close,
// not equal).
TEST_F(OffloadGpuMpi, CheckpointResumesBitwiseWithOrWithoutOffloadAndContinuesOnOneGpu) {
  NEED_GPUS(2);
  const std::vector<std::string> sets = {"zero_optimization.stage=2", kOffload};
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3));
  const std::vector<double> x = losses("full"), y = losses("parts");
  ASSERT_EQ(x.size(), 6u);
  EXPECT_EQ(x, y);
  expect_same_models("full", "parts", 6);

  const std::string ckpt3 = tmp_ / "parts/checkpoints/step_00000003";
  // The same checkpoint continued without offload: the masters and moments under the device
  // placement's names, and the same bits, since offload changes none.
  CommandResult plain =
      train(2, config("plain", 6), {"zero_optimization.stage=2", "training.resume=" + ckpt3});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  EXPECT_NE(plain.out.find("resumed from"), std::string::npos) << plain.out;
  EXPECT_EQ(losses("plain"), std::vector<double>(x.begin() + 3, x.end()));
  CommandResult one = train(0, config("one", 6),
                            {"zero_optimization.stage=1", kOffload, "training.resume=" + ckpt3});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  EXPECT_NE(one.out.find("resumed from"), std::string::npos) << one.out;
  expect_close(losses("one"), std::vector<double>(x.begin() + 3, x.end()), 1e-3, "one GPU");
}

// The delayed update (DPU) on two GPU ranks through `train`: it trains, leaves the undelayed
// losses once it starts, and a checkpoint lands the pending update on both ranks, so a run saved
// and resumed at step 3 gives the bits of one that saved at step 3 and went on.
TEST_F(OffloadGpuMpi, DelayedUpdateTrainsAndResumesBitwiseOnTwoGpus) {
  NEED_GPUS(2);
  const std::vector<std::string> sets = {
      "zero_optimization.stage=2", kOffload,
      "zero_optimization.offload_optimizer.delayed_param_update=true",
      "zero_optimization.offload_optimizer.delayed_param_update_start=1",
      "training.checkpoint_every=3"};
  CommandResult plain = train(2, config("undelayed", 6), {"zero_optimization.stage=2", kOffload});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3, "dpu", "dpu_parts"));
  const std::vector<double> u = losses("undelayed"), x = losses("dpu");
  ASSERT_EQ(x.size(), 6u);
  EXPECT_EQ(x[0], u[0]);
  EXPECT_EQ(x[1], u[1]);  // step 2 still sees step 1's update
  EXPECT_NE(x[2], u[2]);  // step 3 does not see step 2's
  EXPECT_LT(x.back(), x.front()) << "the delayed run did not train";
  EXPECT_EQ(losses("dpu_parts"), x);
  expect_same_models("dpu_parts", "dpu", 6);
}

// ZeRO-Infinity's optimizer side on two (emulated) GPUs: ZeRO-3 in bf16 with the cpu offload
// and with the masters and moments on NVMe (sub-groups of 3000 elements through 3 pinned
// buffers, the gradients there too), each bitwise the run without offload; the swap files are
// gone afterwards.
TEST_F(OffloadGpuMpi, ZeroThreeWithTheStatesOnTheHostOrOnNvmeIsBitwiseOnTwoGpus) {
  NEED_GPUS(2);
  const int kSteps = 4;
  const fs::path swap = tmp_ / "swap";
  fs::create_directories(swap);
  const std::vector<std::string> sets = {"run.dtype=bf16", "zero_optimization.stage=3"};
  CommandResult a = train(2, config("plain3", kSteps), sets);
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  std::vector<std::string> cpu = sets;
  cpu.push_back(kOffload);
  CommandResult b = train(2, config("cpu3", kSteps), cpu);
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  std::vector<std::string> nvme = sets;
  for (const char* s : {"zero_optimization.offload_optimizer.device=nvme",
                        "zero_optimization.offload_optimizer.buffer_count=3",
                        "zero_optimization.sub_group_size=3000"})
    nvme.push_back(s);
  nvme.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap.string());
  CommandResult c = train(2, config("nvme3", kSteps), nvme);
  ASSERT_EQ(c.exit_code, 0) << describe(c);
  EXPECT_NE(c.out.find("ZeRO-Infinity (rank 0): optimizer states on NVMe"), std::string::npos)
      << c.out;
  // At ZeRO-3 the gradients too (Note [Gradients on the NVMe tier] in parallel/grad_buckets.h):
  // through pinned staging from the device, read back for the second micro-batch.
  EXPECT_NE(c.out.find("ZeRO-Infinity gradients (rank 0): reduced partitions on NVMe"),
            std::string::npos)
      << c.out;
  const std::vector<double> want = losses("plain3");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(losses("cpu3"), want);
  EXPECT_EQ(losses("nvme3"), want);
  EXPECT_LT(want.back(), want.front()) << "the run did not train";
  expect_same_models("cpu3", "plain3", kSteps);
  expect_same_models("nvme3", "plain3", kSteps);
  EXPECT_TRUE(fs::is_empty(swap)) << "swap files or locks left behind";
}

// Under tensor parallelism (tp 2 on the two GPUs), clipping every step: the offloaded norm counts
// each replicated parameter once (Note [Tensor-parallel gradient norm]), from the device
// gradients at ZeRO-1, from the reduction's per-segment device sums at ZeRO-2 (host partitions)
// and ZeRO-3 on NVMe, so the run is bitwise the in-memory tp 2 run.
TEST_F(OffloadGpuMpi, TensorParallelOffloadIsBitwiseTheInMemoryTpRunOnTwoGpus) {
  NEED_GPUS(2);
  const int kSteps = 4;
  const fs::path swap = tmp_ / "swap";
  fs::create_directories(swap);
  struct Case {
    const char* dtype;
    int stage;
    bool nvme;
  };
  for (const Case c : {Case{"fp32", 1, false}, Case{"bf16", 2, false}, Case{"bf16", 3, true}}) {
    SCOPED_TRACE(fmt::format("{} stage {}{}", c.dtype, c.stage, c.nvme ? " nvme" : ""));
    const std::vector<std::string> sets = {
        "parallelism.tensor_parallel_size=2", fmt::format("run.dtype={}", c.dtype),
        fmt::format("zero_optimization.stage={}", c.stage), "optimizer.grad_clip=0.05"};
    const std::string plain = fmt::format("tp_plain_{}_{}", c.dtype, c.stage);
    const std::string off = fmt::format("tp_off_{}_{}", c.dtype, c.stage);
    CommandResult a = train(2, config(plain, kSteps), sets);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    std::vector<std::string> with = sets;
    if (c.nvme) {
      with.push_back("zero_optimization.offload_optimizer.device=nvme");
      with.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap.string());
      with.push_back("zero_optimization.sub_group_size=3000");
    } else {
      with.push_back(kOffload);
    }
    CommandResult b = train(2, config(off, kSteps), with);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("tp 2 x dp 1"), std::string::npos) << b.out;
    const std::vector<double> want = losses(plain);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(losses(off), want);
    EXPECT_LT(want.back(), want.front()) << "the run did not train";
    expect_same_models(off, plain, kSteps);
  }
  EXPECT_TRUE(fs::is_empty(swap)) << "swap files or locks left behind";
}

}  // namespace
}  // namespace strata::tools
