// `train` under mpirun: data parallelism and ZeRO end to end through the real binary — the loss
// trajectory of every stage against one process, checkpoints resumed on the same and on a
// different number of ranks, convert --consolidate of ZeRO-3 shards, and bad launches.
// Each test starts mpirun itself (label mpi); ranks oversubscribe the machine's cores.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tensor/safetensors.h"
#include "train_mpi_fixture.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;
using testing::expect_close;
using testing::ScratchDir;

const std::string kBin = STRATA_BINARY_DIR;

class TrainMpi : public testing::TrainMpiFixture {
 protected:
  TrainMpi() : TrainMpiFixture(kBin, "") {}
};

TEST_F(TrainMpi, EveryStageReproducesOneProcessAndResumesAcrossDpSizes) {
  const int kSteps = 6;
  CommandResult single = train(0, config("single", kSteps), {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = fmt::format("stage{}", stage);
    CommandResult r =
        train(2, config(name, kSteps), {fmt::format("zero_optimization.stage={}", stage)});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    expect_close(losses(name), want, 1e-5, name);
    EXPECT_NE(r.out.find("memory per rank"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 1: model states"), std::string::npos) << r.out;
  }

  // ZeRO-3 on 2 ranks stopped at step 3, resumed on 4 ranks with ZeRO-1 (re-partitioned), and
  // on 1 process: both continue the one-process trajectory.
  const std::string cfg = config("moved", kSteps);
  CommandResult first = train(2, cfg, {"zero_optimization.stage=3", "training.steps=3"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  ASSERT_TRUE(
      fs::exists(tmp_ / "moved/checkpoints/step_00000003/model.rank00001-of-00002.safetensors"));
  ASSERT_FALSE(fs::exists(tmp_ / "moved/checkpoints/step_00000003/model.safetensors"));
  CommandResult second = train(4, cfg, {"zero_optimization.stage=1"});
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  expect_close(losses("moved"), want, 1e-5, "stage 3 x 2 ranks -> stage 1 x 4 ranks");

  // convert --consolidate gathers the ZeRO-3 shards into one file equal to the parameters a
  // one-process resume of the same checkpoint holds.
  const std::string ckpt = tmp_ / "moved/checkpoints/step_00000003";
  CommandResult conv = testing::run_command(
      {kBin + "/convert", "--checkpoint", ckpt, "--consolidate", tmp_ / "whole.safetensors"});
  ASSERT_EQ(conv.exit_code, 0) << describe(conv);
  auto whole = tensor::load_safetensors(tmp_ / "whole.safetensors");
  EXPECT_TRUE(whole.contains("h.1.attn.c_attn.weight"));
  EXPECT_TRUE(whole.contains("wte.weight"));
}

// fp32 at stage 2; bf16 at stage 3, whose per-rank model files hold the bf16 parameters beside
// the fp32 masters in the optimizer files.
TEST_F(TrainMpi, ResumeOnTheSameRanksIsBitwise) {
  for (const auto& [tag, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"z2", {"zero_optimization.stage=2"}},
           {"z3bf16", {"zero_optimization.stage=3", "run.dtype=bf16"}}}) {
    SCOPED_TRACE(tag);
    ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3, tag + "full", tag + "parts"));
    const std::vector<double> x = losses(tag + "full"), y = losses(tag + "parts");
    ASSERT_EQ(x.size(), 6u);
    ASSERT_EQ(y.size(), 6u);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << "step " << i + 1;
    const std::vector<std::string> files =
        tag == "z2" ? std::vector<std::string>{"model.safetensors"}
                    : std::vector<std::string>{"model.rank00000-of-00002.safetensors",
                                               "model.rank00001-of-00002.safetensors"};
    for (const std::string& f : files) {
      auto pa = tensor::load_safetensors(tmp_ / (tag + "full/checkpoints/step_00000006/" + f));
      auto pb = tensor::load_safetensors(tmp_ / (tag + "parts/checkpoints/step_00000006/" + f));
      ASSERT_EQ(pa.size(), pb.size()) << f;
      for (auto& [name, t] : pa) {
        EXPECT_EQ(t.dtype(), tag == "z2" ? DType::F32 : DType::BF16) << f << " " << name;
        EXPECT_EQ(std::memcmp(t.data_ptr(), pb.at(name).data_ptr(), t.nbytes()), 0)
            << f << " " << name;
      }
    }
  }
}

// The pids of `train` processes (not mpirun) whose command line mentions `needle`.
std::vector<pid_t> train_pids(const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ec;
    const std::string exe = fs::read_symlink(e.path() / "exe", ec).string();
    if (ec || !exe.ends_with("/train")) continue;
    std::string cmd = testing::read_text(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// Alive and not a zombie (containers may have no init to reap orphans).
bool running(pid_t pid) {
  const std::string stat = testing::read_text(fmt::format("/proc/{}/stat", pid));
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z' &&
         stat[paren + 2] != 'X';
}

TEST_F(TrainMpi, ARankThatDiesEndsTheJobWithinAMinute) {
  const std::string cfg = config("dies", 100000);
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> seen;
  CommandResult r = testing::run_command(
      {"/usr/bin/mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", kBin + "/train",
       "--config", cfg},
      std::chrono::seconds(120), [&](pid_t) {
        // Let training start (metrics.jsonl has lines), then kill rank 1 outright.
        for (int i = 0; i < 600 && testing::read_text(tmp_ / "dies/metrics.jsonl").size() < 200;
             ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        seen = train_pids(cfg);
        if (seen.size() == 2) ::kill(seen[1], SIGKILL);
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(seen.size(), 2u) << describe(r);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.exit_code, -1) << "mpirun did not end within 120 s\n" << describe(r);
  EXPECT_LT(seconds, 60.0) << describe(r);
  EXPECT_NE((r.out + r.err).find("signal 9"), std::string::npos) << describe(r);
  // mpirun has ended; a rank it killed can take a moment more to be gone (one CI run saw the
  // survivor still running right after mpirun returned). 10 s is the bound, not a sleep.
  for (pid_t p : seen) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (running(p) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(running(p)) << "rank process " << p << " still runs 10 s after mpirun ended";
  }
}

// SIGTERM to every rank (mpirun itself aborts on SIGINT without forwarding it): the ranks agree
// to stop before the same step, write one checkpoint together, and the same command resumes.
TEST_F(TrainMpi, SigtermToTheRanksCheckpointsAndTheSameCommandResumes) {
  const std::string cfg = config("term", 100000);
  std::vector<pid_t> seen;
  CommandResult r = testing::run_command(
      {"/usr/bin/mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", kBin + "/train",
       "--config", cfg},
      std::chrono::seconds(120), [&](pid_t) {
        for (int i = 0; i < 600 && testing::read_text(tmp_ / "term/metrics.jsonl").size() < 200;
             ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        seen = train_pids(cfg);
        for (pid_t p : seen) ::kill(p, SIGTERM);
      });
  ASSERT_EQ(seen.size(), 2u) << describe(r);
  EXPECT_NE(r.exit_code, -1) << describe(r);
  EXPECT_NE(r.err.find("interrupted at step"), std::string::npos) << describe(r);
  const std::string latest = testing::read_text(tmp_ / "term/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << describe(r);
  const int stopped = std::stoi(latest.substr(5));
  EXPECT_EQ(losses("term").size(), static_cast<size_t>(stopped));
  EXPECT_TRUE(testing::leftover_temporaries(tmp_ / "term").empty());

  CommandResult resumed = train(2, cfg, {fmt::format("training.steps={}", stopped + 2)});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.out.find(fmt::format("at step {}", stopped)), std::string::npos)
      << describe(resumed);
  EXPECT_EQ(losses("term").size(), static_cast<size_t>(stopped + 2));
}

TEST_F(TrainMpi, BadLaunchesGiveClearErrors) {
  // Global batch 8 with micro 2 on 3 ranks: 8 is not a multiple of 6.
  CommandResult r = train(3, config("bad1", 2), {});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not divisible"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("3 data-parallel"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(tmp_ / "bad1/checkpoints"));

  // NCCL on CPU ranks.
  r = train(2, config("bad2", 2), {"distributed.backend=nccl"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("nccl"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("distributed.backend"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("run.device is 'cpu'"), std::string::npos) << describe(r);

  // Resume a checkpoint written for another model size.
  const std::string cfg = config("bad3", 2);
  ASSERT_EQ(train(2, cfg, {"zero_optimization.stage=2"}).exit_code, 0);
  r = train(2, cfg, {"zero_optimization.stage=2", "model.config.n_embd=64", "training.steps=4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad3/checkpoints/step_00000002"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("different model"), std::string::npos) << describe(r);
}

}  // namespace
}  // namespace strata::tools
