// ZeRO-Infinity's optimizer states on NVMe through `train` (offload_optimizer.device nvme on
// run.device cpu: the host plays the device), one process and two or four ranks under mpirun: 20
// steps bitwise the in-memory run at ZeRO-1, 2 and 3 (losses, final parameters and moments), a
// checkpoint resumed bitwise with the states on NVMe and without, and the faults at start: a
// missing nvme_path, a full disk, a swap directory another live run holds; with the parameter
// partitions offloaded too (ZeRO-Infinity whole), 20 steps and a resume bitwise. At ZeRO-3 the
// gradients live on NVMe as well (one micro-batch per step, and several). Swap files and locks
// are gone after every run, failed or not.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "train_mpi_fixture.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;
using testing::read_text;

const std::string kBin = STRATA_BINARY_DIR;

class TrainNvmeMpi : public testing::TrainMpiFixture {
 protected:
  TrainNvmeMpi() : TrainMpiFixture(kBin, "") {}
  void SetUp() override {
    TrainMpiFixture::SetUp();
    fs::create_directories(swap());
  }
  std::string swap() const { return tmp_ / "swap"; }
  // The overrides that put the optimizer states on NVMe, in sub-groups of 3000 elements through
  // 3 buffers.
  std::vector<std::string> nvme(std::vector<std::string> sets) const {
    sets.push_back("zero_optimization.offload_optimizer.device=nvme");
    sets.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap());
    sets.push_back("zero_optimization.offload_optimizer.buffer_count=3");
    sets.push_back("zero_optimization.sub_group_size=3000");
    sets.push_back("aio.block_size=65536");
    return sets;
  }
  // nvme(sets) and the parameter partitions on `device` (cpu or nvme, in the same directory).
  std::vector<std::string> both(std::vector<std::string> sets, const std::string& device) const {
    sets = nvme(std::move(sets));
    sets.push_back("zero_optimization.offload_param.device=" + device);
    sets.push_back("zero_optimization.offload_param.nvme_path=" + swap());
    return sets;
  }
  void expect_swap_empty() {
    for (const auto& e : fs::directory_iterator(swap()))
      ADD_FAILURE() << e.path() << " left in the swap directory";
  }
};

TEST_F(TrainNvmeMpi, TwentyStepsBitwiseTheInMemoryRunAtEveryStageAndDp) {
  const int kSteps = 20;
  for (int np : {0, 2}) {
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(fmt::format("np {} stage {}", np, stage));
      const std::vector<std::string> sets = {fmt::format("zero_optimization.stage={}", stage)};
      const std::string plain = fmt::format("plain_{}_{}", np, stage);
      const std::string off = fmt::format("nvme_{}_{}", np, stage);
      CommandResult a = train(np, config(plain, kSteps), sets);
      ASSERT_EQ(a.exit_code, 0) << describe(a);
      CommandResult b = train(np, config(off, kSteps), nvme(sets));
      ASSERT_EQ(b.exit_code, 0) << describe(b);
      EXPECT_NE(b.out.find("ZeRO-Infinity (rank 0): optimizer states on NVMe in " + swap()),
                std::string::npos)
          << b.out;
      // The aio section reached the engine (block_size 65536 from nvme()).
      EXPECT_NE(b.out.find("buffers of 36.0 KiB; aio "), std::string::npos) << b.out;
      EXPECT_NE(b.out.find("(block_size 65536, queue_depth 8, thread_count 1"), std::string::npos)
          << b.out;
      const std::vector<double> want = losses(plain), got = losses(off);
      ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(got, want);
      EXPECT_LT(want.back(), want.front()) << "the run did not train";
      expect_same_states(off, plain, kSteps);
      expect_swap_empty();
    }
  }
}

// Note [Gradients on the NVMe tier]: at ZeRO-3 the reduced gradient partitions go to NVMe as
// each unit's reduction completes, and the step reads them back from there. With one
// micro-batch per step (nothing is read back), at dp 1 and 2, 20 steps give the in-memory ZeRO-3
// run's bits; the runs above at stage 3 accumulate four micro-batches at dp 1 and two at dp 2
// (each later micro-batch adds to what it reads back). The memory report and the metrics show
// the gradients on NVMe and only the gradient buffers resident.
TEST_F(TrainNvmeMpi, GradientsOnNvmeAtZeroThreeAreBitwiseTheInMemoryRunWithOneMicroBatch) {
  const int kSteps = 20;
  for (int np : {0, 2}) {
    SCOPED_TRACE(fmt::format("np {}", np));
    {
      // micro_batch_size 2 x dp: one micro-batch per step.
      const std::vector<std::string> sets = {
          "zero_optimization.stage=3",
          fmt::format("batch.global_batch_size={}", 2 * (np == 0 ? 1 : np))};
      const std::string plain = fmt::format("plain_{}", np);
      const std::string off = fmt::format("grads_{}", np);
      CommandResult a = train(np, config(plain, kSteps), sets);
      ASSERT_EQ(a.exit_code, 0) << describe(a);
      CommandResult b = train(np, config(off, kSteps), nvme(sets));
      ASSERT_EQ(b.exit_code, 0) << describe(b);
      EXPECT_NE(b.out.find("ZeRO-Infinity gradients (rank 0): reduced partitions on NVMe "),
                std::string::npos)
          << b.out;
      // Resident: the three gradient buffers of 3000 f32 elements (sub_group_size), not the
      // model's gradients.
      EXPECT_NE(b.out.find("grads 0 B, optimizer"), std::string::npos) << b.out;
      const std::vector<double> want = losses(plain);
      ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
      EXPECT_LT(want.back(), want.front()) << "the run did not train";
      EXPECT_EQ(losses(off), want);
      expect_same_states(off, plain, kSteps);
      std::istringstream lines(read_text(tmp_ / (off + "/metrics.jsonl")));
      std::string line, last_line;
      while (std::getline(lines, line))
        if (!line.empty()) last_line = line;
      const nlohmann::json last = nlohmann::json::parse(last_line);
      ASSERT_TRUE(last.contains("grad_peak_bytes")) << last.dump();
      int64_t resident = 0;
      for (const auto& [tier, bytes] : last["grad_peak_bytes"].items())
        if (tier != "nvme") resident += bytes.get<int64_t>();
      EXPECT_GT(resident, 0) << last.dump();
      EXPECT_LE(resident, 3 * 3000 * 4) << last.dump();
      EXPECT_GT(last["grad_peak_bytes"].value("nvme", int64_t{0}), 0) << last.dump();
      expect_swap_empty();
    }
  }
}

// Four ranks at ZeRO-3: every rank streams its quarter of the states through its own swap lock.
TEST_F(TrainNvmeMpi, FourRanksAtZeroThreeAreBitwiseTheInMemoryRun) {
  const int kSteps = 20;
  const std::vector<std::string> sets = {"zero_optimization.stage=3"};
  CommandResult a = train(4, config("plain4", kSteps), sets);
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  CommandResult b = train(4, config("nvme4", kSteps), nvme(sets));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  const std::vector<double> want = losses("plain4");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(losses("nvme4"), want);
  expect_same_states("nvme4", "plain4", kSteps);
  expect_swap_empty();
}

// Stopped at step 3 and resumed, a two-rank ZeRO-3 run with its states on NVMe gives the
// uninterrupted run's bits; the same checkpoint continues bitwise without offload.
TEST_F(TrainNvmeMpi, CheckpointResumesBitwiseWithTheStatesOnNvmeOrInMemory) {
  const std::vector<std::string> sets = nvme({"zero_optimization.stage=3"});
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3));
  const std::vector<double> x = losses("full");
  ASSERT_EQ(x.size(), 6u);
  EXPECT_EQ(losses("parts"), x);
  expect_same_states("parts", "full", 6);
  const std::string ckpt3 = tmp_ / "parts/checkpoints/step_00000003";
  CommandResult plain =
      train(2, config("plain", 6), {"zero_optimization.stage=3", "training.resume=" + ckpt3});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  EXPECT_EQ(losses("plain"), std::vector<double>(x.begin() + 3, x.end()));
  expect_swap_empty();
}

// ZeRO-Infinity whole: the parameter partitions on NVMe (or in host memory) as well as the
// states, in the same swap directory. The optimizer writes each owned partition between the
// group fence's calls (Note [Group fence] in optim/optimizer.h), several sub-groups of 3000 per
// partition: 20 steps bitwise the in-memory ZeRO-3 run at dp 1, 2 and 4.
TEST_F(TrainNvmeMpi, ParametersAndStatesOffloadedTogetherAreBitwiseTheInMemoryRun) {
  const int kSteps = 20;
  for (int np : {0, 2, 4}) {
    const std::vector<std::string> sets = {"zero_optimization.stage=3"};
    const std::string plain = fmt::format("plain_{}", np);
    CommandResult a = train(np, config(plain, kSteps), sets);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    const std::vector<double> want = losses(plain);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
    EXPECT_LT(want.back(), want.front()) << "the run did not train";
    for (const std::string device : {"nvme", "cpu"}) {
      if (np > 0 && device == "cpu") continue;  // dp 2 and 4 on NVMe cover the partitioned fence
      SCOPED_TRACE(fmt::format("np {} offload_param {}", np, device));
      const std::string off = fmt::format("both_{}_{}", np, device);
      CommandResult b = train(np, config(off, kSteps), both(sets, device));
      ASSERT_EQ(b.exit_code, 0) << describe(b);
      EXPECT_NE(b.out.find("ZeRO-Infinity (rank 0): optimizer states on NVMe in " + swap()),
                std::string::npos)
          << b.out;
      EXPECT_NE(b.out.find("ZeRO-Infinity parameters (rank 0): offload_param.device " + device),
                std::string::npos)
          << b.out;
      EXPECT_EQ(losses(off), want);
      expect_same_states(off, plain, kSteps);
      expect_swap_empty();
    }
  }
}

// Both offloaded, two ranks stopped at step 3 and resumed: the uninterrupted run's bits. The
// checkpoint is written and read a sub-group and a unit at a time (Note [Streamed shards] in
// parallel/engine.h). One process resumes it too, both on NVMe: re-partitioned, so each of its
// sub-groups reads parts of the two ranks' pieces (each checked against its digest first).
TEST_F(TrainNvmeMpi, ParametersAndStatesOffloadedTogetherResumeBitwise) {
  const std::vector<std::string> sets = both({"zero_optimization.stage=3"}, "nvme");
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3));
  const std::vector<double> x = losses("full");
  ASSERT_EQ(x.size(), 6u);
  EXPECT_EQ(losses("parts"), x);
  expect_same_states("parts", "full", 6);
  expect_swap_empty();

  std::vector<std::string> one = sets;
  one.push_back("training.resume=" + tmp_ / "parts/checkpoints/step_00000003");
  CommandResult r = train(0, config("one", 6), one);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  testing::expect_close(losses("one"), std::vector<double>(x.begin() + 3, x.end()), 1e-5,
                        "2 ranks -> 1 process, both on NVMe");
  expect_swap_empty();
}

TEST_F(TrainNvmeMpi, AMissingOrFullOrHeldSwapDirectoryIsAClearErrorAtStart) {
  const std::vector<std::string> base = {"zero_optimization.stage=2"};
  {
    std::vector<std::string> sets = base;
    sets.push_back("zero_optimization.offload_optimizer.device=nvme");
    sets.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap() + "/missing");
    CommandResult r = train(0, config("missing", 2), sets);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(swap() + "/missing' does not exist"), std::string::npos) << describe(r);
  }
  {
    // A full disk, made by a file-size limit (SIGXFSZ ignored, so growth fails with EFBIG the
    // way a full disk fails with ENOSPC; the disposition survives exec).
    void (*old)(int) = ::signal(SIGXFSZ, SIG_IGN);
    CommandResult r = testing::run_command(
        [&] {
          std::vector<std::string> argv = {"/bin/bash",
                                           "-c",
                                           "ulimit -f 256; exec \"$@\"",
                                           "bash",
                                           kBin + "/train",
                                           "--config",
                                           config("full", 2)};
          for (const std::string& s : nvme(base)) {
            argv.push_back("--set");
            argv.push_back(s);
          }
          return argv;
        }(),
        std::chrono::seconds(120));
    ::signal(SIGXFSZ, old);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("full"), std::string::npos) << describe(r);
    EXPECT_NE(r.err.find(swap() + "/strata-swap-"), std::string::npos) << describe(r);
    expect_swap_empty();  // removed on the error path too
  }
  {
    // Held: a live process's lock on rank 0's optimizer swap.
    const pid_t holder = ::fork();
    if (holder == 0) {
      ::pause();
      ::_exit(0);
    }
    const std::string lock = swap() + "/strata-optimizer-rank0.lock";
    std::ofstream(lock) << holder << "\n";
    CommandResult r = train(0, config("held", 2), nvme(base));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("in use by another run (process " + std::to_string(holder)),
              std::string::npos)
        << describe(r);
    EXPECT_NE(r.err.find(lock), std::string::npos) << describe(r);
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    // The holder is gone: its stale lock is taken over.
    CommandResult ok = train(0, config("after", 2), nvme(base));
    EXPECT_EQ(ok.exit_code, 0) << describe(ok);
    expect_swap_empty();
  }
}

// Note [NVMe space plan]: optimizer states larger than the swap directory's disk (an 805B-parameter
// model: 12 bytes per parameter on NVMe, terabytes) are refused at start, by the real free space
// (statvfs), before the model is built or the run directory created.
TEST_F(TrainNvmeMpi, StatesLargerThanTheSwapDiskAreRefusedAtStart) {
  std::vector<std::string> sets = nvme({"zero_optimization.stage=2", "model.config.n_layer=1000",
                                        "model.config.n_embd=8192", "run.host_memory_budget=none"});
  CommandResult r = train(0, config("huge", 2), sets);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("NVMe swap space"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("'" + swap() + "'"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("optimizer states"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find(" free"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(tmp_ / "huge")) << "no run directory for a run that cannot start";
  expect_swap_empty();
}

}  // namespace
}  // namespace strata::tools
