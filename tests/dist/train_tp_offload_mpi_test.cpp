// ZeRO-Infinity's optimizer states under tensor parallelism, through `train` on CPU ranks: at tp 2
// (and tp 2 x dp 2, tp 2 x pp 2) the optimizer in an NVMe swap file (offload_optimizer.device
// nvme) gives the in-memory tp 2 run's losses, norms, parameters and moments bitwise, at ZeRO-1, 2
// and 3, in fp32 and bf16, with the parameter partitions offloaded too (ZeRO-3), with a max_norm
// that clips every step (Note [Tensor-parallel gradient norm]: replicated parameters count once,
// not once per tp rank); a run stopped and resumed from its checkpoint gives the uninterrupted
// run's bits. (`train` refuses device cpu on a CPU run, which has no device to offload from:
// tests/tp/tp_offload_mpi_test.cpp runs the host placement at tp 2 through the Engine.)
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train_mpi_fixture.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;

// Below the tiny model's gradient norm at every step of these runs (checked): clipping is on.
constexpr double kMaxNorm = 0.05;

class TrainTpOffloadMpi : public testing::TrainMpiFixture {
 protected:
  TrainTpOffloadMpi() : TrainMpiFixture(STRATA_BINARY_DIR, "") {}
  void SetUp() override {
    TrainMpiFixture::SetUp();
    fs::create_directories(swap());
  }
  std::string swap() const { return tmp_ / "swap"; }

  // tp 2 at `stage` in `dtype`, clipping at kMaxNorm, optimizer states on NVMe with `nvme`.
  std::vector<std::string> sets(int stage, const std::string& dtype, bool nvme) const {
    std::vector<std::string> s = {
        "parallelism.tensor_parallel_size=2", fmt::format("zero_optimization.stage={}", stage),
        "run.dtype=" + dtype, fmt::format("optimizer.grad_clip={}", kMaxNorm)};
    if (nvme) {
      s.push_back("zero_optimization.offload_optimizer.device=nvme");
      s.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap());
      s.push_back("zero_optimization.offload_optimizer.buffer_count=3");
      s.push_back("zero_optimization.sub_group_size=3000");
      s.push_back("aio.block_size=65536");
    }
    return s;
  }

  // The gradient norms run `name` logged (before clipping).
  std::vector<double> grad_norms(const std::string& name) {
    std::vector<double> out;
    for (const nlohmann::json& j : records(name)) out.push_back(j["grad_norm"].get<double>());
    return out;
  }

  // The in-memory run and the nvme run at `np` ranks: equal losses, norms, parameters and
  // moments; every step clipped; the swap directory empty afterwards.
  // `pp`: that many pipeline stages too. `param_device` (cpu, nvme): ZeRO-Infinity's parameter
  // partitions offloaded as well (stage 3).
  void expect_offload_bitwise(int np, int stage, const std::string& dtype, int steps, int pp = 1,
                              const std::string& param_device = "") {
    const std::string tag = fmt::format("np{}_pp{}_z{}_{}_{}", np, pp, stage, dtype, param_device);
    const std::string plain = "plain_" + tag;
    auto with_pp = [pp](std::vector<std::string> s) {
      if (pp > 1) s.push_back(fmt::format("parallelism.pipeline_parallel_size={}", pp));
      return s;
    };
    CommandResult a = train(np, config(plain, steps), with_pp(sets(stage, dtype, false)));
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    EXPECT_NE(a.out.find("tp 2 x dp"), std::string::npos) << a.out;
    const std::vector<double> want = losses(plain), want_norms = grad_norms(plain);
    ASSERT_EQ(want.size(), static_cast<size_t>(steps));
    EXPECT_LT(want.back(), want.front()) << "the run did not train";
    for (double n : want_norms) EXPECT_GT(n, kMaxNorm) << "a step did not clip";
    const std::string off = "nvme_" + tag;
    std::vector<std::string> offloaded = with_pp(sets(stage, dtype, true));
    if (!param_device.empty()) {
      offloaded.push_back("zero_optimization.offload_param.device=" + param_device);
      offloaded.push_back("zero_optimization.offload_param.nvme_path=" + swap());
    }
    CommandResult b = train(np, config(off, steps), offloaded);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("tp 2 x dp"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("ZeRO-Infinity (rank 0): optimizer states on NVMe in " + swap()),
              std::string::npos)
        << b.out;
    EXPECT_EQ(losses(off), want);
    EXPECT_EQ(grad_norms(off), want_norms);
    expect_same_states(off, plain, steps);
    for (const auto& e : fs::directory_iterator(swap()))
      ADD_FAILURE() << e.path() << " left in the swap directory";
  }
};

TEST_F(TrainTpOffloadMpi, TpTwoOffloadedIsBitwiseTheInMemoryTpRunAtEveryStage) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    ASSERT_NO_FATAL_FAILURE(expect_offload_bitwise(2, stage, "fp32", 6));
  }
}

TEST_F(TrainTpOffloadMpi, TpTwoOffloadedIsBitwiseTheInMemoryTpRunInBf16) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    ASSERT_NO_FATAL_FAILURE(expect_offload_bitwise(2, stage, "bf16", 4));
  }
}

TEST_F(TrainTpOffloadMpi, TpTwoTimesDpTwoOffloadedIsBitwiseTheInMemoryRun) {
  ASSERT_NO_FATAL_FAILURE(expect_offload_bitwise(4, 2, "fp32", 4));
}

// ZeRO-Infinity whole at tp 2: the parameter partitions on the host or on NVMe too.
TEST_F(TrainTpOffloadMpi, TpTwoWithTheParametersOffloadedTooIsBitwiseTheInMemoryRun) {
  for (const char* device : {"cpu", "nvme"}) {
    SCOPED_TRACE(device);
    ASSERT_NO_FATAL_FAILURE(expect_offload_bitwise(2, 3, "fp32", 4, 1, device));
  }
}

// tp 2 x pp 2 (Note [Norm across stages]: the stages' sums add, the tied copy counted once).
TEST_F(TrainTpOffloadMpi, TpTwoTimesPpTwoOffloadedIsBitwiseTheInMemoryRun) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    ASSERT_NO_FATAL_FAILURE(expect_offload_bitwise(4, stage, "fp32", 4, 2));
  }
}

// Stopped at step 3 and resumed, a tp 2 run with its states on NVMe gives the uninterrupted
// run's bits (Note [Tensor-parallel checkpoints]), at ZeRO-1, at ZeRO-3, and at ZeRO-3 with the
// parameter partitions on NVMe too.
TEST_F(TrainTpOffloadMpi, CheckpointResumesBitwiseWithTheStatesOnNvme) {
  for (const auto& [stage, params] : {std::pair{1, false}, {3, false}, {3, true}}) {
    const std::string tag = fmt::format("z{}{}", stage, params ? "_params" : "");
    SCOPED_TRACE(tag);
    std::vector<std::string> s = sets(stage, "fp32", true);
    if (params) {
      s.push_back("zero_optimization.offload_param.device=nvme");
      s.push_back("zero_optimization.offload_param.nvme_path=" + swap());
    }
    const std::string full = "full_" + tag, parts = "parts_" + tag;
    ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, s, 6, 3, full, parts));
    const std::vector<double> x = losses(full);
    ASSERT_EQ(x.size(), 6u);
    EXPECT_EQ(losses(parts), x);
    expect_same_states(parts, full, 6);
    for (const auto& e : fs::directory_iterator(swap()))
      ADD_FAILURE() << e.path() << " left in the swap directory";
  }
}

}  // namespace
}  // namespace strata::tools
